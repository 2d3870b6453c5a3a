"""Fused dequantize-and-multiply kernels (compiled C in rkkernels.c, loaded by _lib.py).

Every weight kind of `inference.quant` is multiplied in its stored form: each block of weights is
dequantized into registers and applied to up to 6 activation rows, never to a dense copy. Activations
are float32 ("f32", the exact path), or for q4, q4_0, q4_1 and q8_0 weights quantized to int8 per block
of 32 and multiplied by integer dot products ("q8", as llama.cpp does), or int8 only in the grouped
calls of MoE experts ("experts"), or there and in a generated token's dense products (`llama_decode`,
the attention and dense matrices of `moe_decode_layer`, Gemma 4's q/k/v/o, dense MLP and LM head calls;
routers stay float; "decode", the default: prompts, even one row, stay on the float path;
`set_activations`).
Results are deterministic in every mode: the same inputs give bit-identical outputs whatever the thread
count and whatever other rows share the batch (`llama_decode` is its own computation: see rkdecode.c).

The library is loaded once per process, as `_lib.KernelOptions` says (read from the environment at the
first import: `RKMOJO_KERNELS` picks the build, `RKMOJO_ACTIVATIONS` the starting activation mode).

Raises:
    ImportError: at import, when the compiled library has not been built (`pip install -e .`).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..quant import QTensor, dequantize
from ._lib import (
    ACTIVATIONS,
    EXPERT_ACTIVATIONS,
    MOE_EXPERT_FIELDS,
    KernelLib,
    KernelOptions,
    load_build,
)

__all__ = [
    "ACTIVATIONS",
    "BACKEND",
    "DOT",
    "EXPERT_ACTIVATIONS",
    "fields",
    "MOE_EXPERT_FIELDS",
    "attention",
    "embed_rows",
    "get_activations",
    "get_threads",
    "linear",
    "configured",
    "linear_grouped",
    "linear_many",
    "llama_decode",
    "llama_decode_batch",
    "matrix_fields",
    "moe_combine",
    "repack_q4",
    "activation_flags",
    "gemma4_attn",
    "gemma4_ffn_out",
    "gemma4_route",
    "moe_decode_flags",
    "moe_decode_layer",
    "moe_decode_layer_batch",
    "moe_experts",
    "pool_stats",
    "set_activations",
    "set_threads",
]

LOADED = KernelOptions.from_env()  # what this process's library was loaded with
_LIB = KernelLib(*load_build(LOADED.kernels))
_LIB.set_threads(os.cpu_count() or 1)
_LIB.set_activations(LOADED.activations)

BACKEND = _LIB.backend  # "avx512", "avx2", "neon" or "scalar": the instruction set the library was built for
DOT = _LIB.dot  # the int8 dot product of the "q8" activations: "vnni", "maddubs", "sdot", "smull", "scalar"


def linear(x: np.ndarray, w: QTensor) -> np.ndarray:
    """y = x @ W.T in float32.

    Args:
        x: activations [T, in] (or [..., in]); converted to float32 if needed.
        w: weight [out, in] of any kind in `inference.quant.KINDS`, parts C-contiguous (memmap views
           are fine; nothing is copied).

    Returns:
        A new float32 array [T, out] (or [..., out]).

    Raises:
        ValueError: shapes do not match, or the weight's parts are not laid out as its kind says.
    """
    return _LIB.linear(x, w)


def linear_many(x: np.ndarray, ws) -> list[np.ndarray]:
    """[x @ W.T for W in ws] in float32, as one call: the matrices share one split over the threads
    and one preparation of x. For matrices fed the same activations, e.g. q/k/v or gate/up; each
    result is bit-identical to `linear(x, W)`.

    Args:
        x: activations [T, in] (or [..., in]); converted to float32 if needed.
        ws: 1 to 16 weights [out_j, in] of any kinds in `inference.quant.KINDS`.

    Returns:
        A list of new float32 arrays [T, out_j] (or [..., out_j]), in the order of `ws`.

    Raises:
        ValueError: shapes do not match, or a weight's parts are not laid out as its kind says.
    """
    return _LIB.linear_many(x, ws)


def linear_grouped(pairs) -> list[np.ndarray]:
    """[x_j @ W_j.T for (x_j, W_j) in pairs] in float32 as one job: every matrix with its own
    activations, e.g. all experts of an MoE block. Each result is bit-identical to `linear(x_j, W_j)`.

    Args:
        pairs: (x_j [T_j, in], W_j [out_j, in]) of any kinds, all with the same `in`; matrices with more
            than 128 rows run as calls of their own, more than 64 matrices as several jobs.

    Returns:
        A list of new float32 arrays [T_j, out_j], in the order of `pairs`.

    Raises:
        ValueError: shapes do not match, or a weight's parts are not laid out as its kind says.
    """
    return _LIB.linear_grouped(pairs)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, kpos: np.ndarray, qpos: np.ndarray, window: int | None, scale: float
) -> np.ndarray:
    """Causal, optionally windowed, grouped-query attention in float32.

    Args:
        q: queries [T, H, D] at absolute positions `qpos` [T].
        k, v: the held keys [KV, S, D] and values [KV, S, Dv], both float32 or both float16 (H a multiple
           of KV; query head h reads KV head h // (H / KV)); rows contiguous, heads may be strided views
           of a larger cache.
        kpos: [S] the position each held row stands for, −1 for an empty row.
        window: a sliding window (a row is seen while qpos − kpos < window), or None.
        scale: multiplies q·k before the softmax.

    Returns:
        [T, H, Dv]. Each query row sees the rows with 0 ≤ kpos ≤ its position (within the window),
        and must see at least one.

    Raises:
        ValueError: shapes or layouts do not fit.
    """
    return _LIB.attention(q, k, v, kpos, qpos, window, scale)


def llama_decode(model: np.ndarray) -> None:
    """One token through every layer of a Llama-style model in one call (rkdecode.c): the T = 1 case of
    `inference.models.llama`'s layer code, in this thread's activation mode and thread count.

    Args:
        model: the int64 descriptor: the "decode.header" fields (`fields`), then per layer the
            "decode.layer" fields and the "decode.matrices"' `matrix_fields`. Its `h` array is updated in place, as are the layers' K/V
            rows and key positions at `pos`.

    Raises:
        ValueError: the kernel rejected a shape or kind, or ran out of memory.
    """
    _LIB.llama_decode(model)


def llama_decode_batch(models: list[np.ndarray]) -> None:
    """`llama_decode` of several sequences of one model at once (rkdecode.c): each descriptor its own h,
    position, RoPE rows and K/V cache, the weights read once for all their rows; each sequence gets the
    bits `llama_decode` gives it alone.

    Raises:
        ValueError: the kernel rejected a shape or kind, descriptors of different models, or ran out of memory.
    """
    _LIB.llama_decode_batch(models)


def moe_decode_layer_batch(models: list[np.ndarray], layer: int) -> None:
    """`moe_decode_layer` of several sequences of one model at once (rkmoedecode.c; call `moe_decode_flags`
    on each descriptor first): the dense matrices and the router read once for all their rows; each
    sequence gets the bits of the one-sequence call.

    Raises:
        ValueError: the kernel rejected a shape, kind or layer, descriptors of different models, or ran out
            of memory.
    """
    _LIB.moe_decode_layer_batch(models, layer)


def moe_decode_flags(model: np.ndarray) -> int:
    """Sets an MoE decode descriptor's activation flags (rkmoedecode.c) for this thread's activation mode:
    q/k/v/o as `llama_decode`'s, the router as `linear`'s. Returns the experts' flag for `moe_experts`
    (int8 unless "f32", as `linear_grouped`)."""
    return _LIB.moe_decode_flags(model)


def gemma4_attn(model: np.ndarray, layer: int) -> None:
    """Gemma 4's attention half of one layer for one token (rkgemma4.c): the T = 1 case of
    `inference.models.gemma4.Model.attn_half`.

    Args:
        model: the int64 descriptor: the "gemma4.header" fields (`fields`), then per layer the
            "gemma4.layer" fields and the "gemma4.matrices"' `matrix_fields`. Its `h` is updated in place (h + the normed attention), as
            are the layer's K/V rows (a sliding layer's ring row pos % cap, a full layer's row pos).
        layer: the layer's index.

    Raises:
        ValueError: the kernel rejected a shape or layer, or ran out of memory.
    """
    _LIB.gemma4_attn(model, layer)


def gemma4_route(model: np.ndarray, layer: int) -> None:
    """Gemma 4's router of one layer on the descriptor's `h` (rkgemma4.c), as `gemma4.Model.route` for
    one row: writes the descriptor's `ids` and `wts` (top-k, largest first; weights renormalised and
    scaled per expert).

    Raises:
        ValueError: the kernel rejected a shape or layer, or ran out of memory.
    """
    _LIB.gemma4_route(model, layer)


def moe_decode_layer(model: np.ndarray, layer: int) -> None:
    """The attention half of one MoE layer for one token (rkmoedecode.c): the T = 1 case of
    `inference.models.qwen3_moe`'s layer up to the routing, or a dense layer whole.

    Args:
        model: the int64 descriptor: the "moe.header" fields (`fields`), then per layer the "moe.layer"
            fields and the "moe.matrices"' `matrix_fields`. Its `h` is updated in place (h + attention; a dense layer's
            output), as are the layer's K/V rows at `pos`; a routed layer writes its `x` (the normed MLP
            input), `ids` and `wts` (the top-k experts and their weights).
        layer: the layer's index.

    Raises:
        ValueError: the kernel rejected a shape, kind or layer, or ran out of memory.
    """
    _LIB.moe_decode_layer(model, layer)


def moe_experts(
    desc: np.ndarray, hidden: int, inter: int, flag: int, x: np.ndarray, y: np.ndarray, act: str = "silu"
) -> None:
    """y[slot] = down(act(gate(x)) × up(x)) for the experts of `desc` [n, MOE_EXPERT_FIELDS] (the row
    of y, then `matrix_fields` of gate, up, down), as `moe.experts_mlp` in two grouped calls; each row
    has the same bits whichever experts share the call. x [hidden], y [K, hidden], float32, contiguous;
    `act` "silu" or "gelu_tanh" (Gemma 4's experts and dense MLP).

    Raises:
        ValueError: the kernel rejected a shape or kind, or ran out of memory; an unknown `act`.
    """
    _LIB.moe_experts(desc, hidden, inter, flag, x, y, act)


def activation_flags() -> tuple[int, int, int]:
    """This thread's kind-code flags for its activation mode: (`linear` and `linear_many`'s,
    `linear_grouped`'s, `llama_decode`'s), each RK_Q8A (int8) or 0."""
    return _LIB.activation_flags()


def gemma4_ffn_out(model: np.ndarray, layer: int) -> None:
    """The end of one Gemma 4 layer for one token (rkgemma4.c), as `gemma4.Model.ffn_half` after its dense
    MLP and experts: from the descriptor's `mlp` (the dense MLP's output), `y` and `wts` (the experts'
    outputs by slot and their weights), h = (h + the normed mixture) × layer_scalar, in place.

    Raises:
        ValueError: the kernel rejected a shape or layer, or ran out of memory.
    """
    _LIB.gemma4_ffn_out(model, layer)


def moe_combine(y: np.ndarray, w: np.ndarray, h: np.ndarray) -> None:
    """h += Σ_k w[k] · y[k], the products added in slot order as `moe.mixture` does (y [K, H], w [K],
    h [H]: float32, contiguous; h in place)."""
    _LIB.moe_combine(y, w, h)


def repack_q4(t: QTensor, in_place: bool = False) -> QTensor:
    """`t` (q4, rows a multiple of 16) repacked (q4r) by the compiled copy of `quant.repack_q4`, fast enough
    for weights that land at run time (an expert read into a cache slot); `in_place` rewrites `t`'s memory.

    Raises:
        ValueError: not such a matrix, or read-only parts with `in_place`.
    """
    return _LIB.repack_q4(t, in_place)


def matrix_fields(w: QTensor) -> tuple[int, int, int, int]:
    """The kind code and part addresses of `w` for a `llama_decode` descriptor (w must stay alive).

    Raises:
        ValueError: a part's dtype, size or contiguity is not what the kind needs.
    """
    return _LIB.matrix_fields(w)


def embed_rows(w: QTensor, ids) -> np.ndarray:
    """Rows `ids` of the embedding matrix `w` as float32 [T, H] (only those rows are dequantized)."""
    return dequantize(w.rows(np.asarray(ids).reshape(-1)))


def set_activations(mode: str) -> None:
    """The activations of every following call: "f32" (exact float path), "q8" (int8), "experts"
    (int8 in `linear_grouped` only) or "decode" (and in `llama_decode`); see above.

    Raises:
        ValueError: an unknown mode.
    """
    _LIB.set_activations(mode)


def fields() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The compiled steps' descriptor layouts, as the library declares them (`inference.steps.descriptor`)."""
    return _LIB.fields


def get_activations() -> str:
    """The mode set by `set_activations` (or, before any, `LOADED.activations`)."""
    return _LIB.get_activations()


def set_threads(n: int) -> None:
    """Threads the kernels split output rows over (default: os.cpu_count()).

    Raises:
        ValueError: `n` is not a positive integer.
    """
    _LIB.set_threads(n)


@contextlib.contextmanager
def configured(threads: int | None = None, activations: str | None = None):
    """Run the block with this thread's kernel calls split over `threads` and in the `activations` mode
    (None: the process's default), as they were after. The settings are the calling thread's own: an
    engine applies its own to its own compute, and two engines on two threads do not see each other's.

    Raises:
        ValueError: a thread count that is not positive, or an unknown mode.
    """
    before = _LIB.use(threads, activations)
    try:
        yield
    finally:
        _LIB.use(*before)


def get_threads() -> int:
    """The thread count set by `set_threads`."""
    return _LIB.get_threads()


def pool_stats() -> dict[str, int]:
    """How multi-threaded calls went since import (for benchmarks on busy machines).

    Returns:
        Counters: jobs `shared` with helper threads; jobs run `solo` by the caller alone (for a while
        after frequent stalls, or while helpers seldom got a core); `stalls` (a preempted helper kept
        the caller waiting) and the `stall_ns` they cost; the `tasks` of shared jobs and the
        `helper_tasks` of them helpers ran.
    """
    return _LIB.pool_stats()
