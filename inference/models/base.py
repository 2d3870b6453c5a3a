"""Shared math for every architecture: args base, norms, RoPE, activations, the KV cache, attention,
and the model skeleton (embedding → layers in chunks → final norm → LM head).

Architecture files supply the layer forward and the checkpoint name table; everything here is generic.
Activations are float32 [T, H] numpy arrays; weights are `QTensor`s multiplied through `kernels.linear`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..backends import CPU
from ..kernels import attention as kernel_attention
from ..kernels import configured, embed_rows, get_activations, get_threads, linear
from ..quant import QTensor


@dataclass
class BaseArgs:
    """Fields every architecture has. Subclasses add theirs; unknown config keys are ignored."""

    hidden_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    vocab_size: int = 0
    rms_norm_eps: float = 1e-6
    head_dim: int | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False

    @classmethod
    def from_dict(cls, cfg: dict):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads


# --- elementwise math ------------------------------------------------------------------------
def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float, plus_one: bool = False) -> np.ndarray:
    """RMSNorm over the last axis; `plus_one` for checkpoints that store (weight − 1)."""
    y = x * (1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)).astype(np.float32)
    if weight is None:
        return y
    return y * (weight + 1.0 if plus_one else weight)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x * x * x)))


ACTIVATIONS = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh, "gelu_tanh": gelu_tanh}


def softcap(x: np.ndarray, cap: float | None) -> np.ndarray:
    return x if not cap else np.tanh(x / cap) * cap


# --- RoPE ------------------------------------------------------------------------------------
def rope_inv_freq(
    head_dim: int, theta: float, partial: float = 1.0, proportional: bool = False, factor: float = 1.0
) -> np.ndarray:
    """Inverse frequencies for rotate-half RoPE over `head_dim`.

    Default RoPE rotates the first `partial × head_dim` dims with exponents over that width;
    `proportional` (Gemma 4 full layers) keeps exponents over the whole head and zeroes the
    frequencies of the dims it does not rotate, so those pass through unchanged.
    """
    if proportional:
        n_rot = int(partial * head_dim // 2)
        inv = 1.0 / theta ** (np.arange(0, 2 * n_rot, 2, dtype=np.float64) / head_dim)
        inv = np.concatenate([inv, np.zeros(head_dim // 2 - n_rot)])
    else:
        rot = int(head_dim * partial)
        inv = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    return (inv / factor).astype(np.float32)


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # [T, R/2]
    return np.cos(freqs), np.sin(freqs)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, D]; rotates the first 2 × len(cos[0]) dims in rotate-half order."""
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    out[..., :half] = x1 * c - x2 * s
    out[..., half : 2 * half] = x2 * c + x1 * s
    return out


# --- KV cache --------------------------------------------------------------------------------
KV_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}


class LayerKV:
    """Keys and values of one attention layer.

    Full layers keep every position (grown in steps); sliding layers are a ring of
    `window + chunk` rows, enough for any chunk of ≤ `chunk` new rows to see its whole window.
    Stored as float32 or float16 (`dtype`; keys and values are rounded to it as they are appended).
    """

    def __init__(
        self, n_kv: int, head_dim: int, window: int | None, chunk: int, v_dim: int | None = None, dtype=np.float32
    ):
        self.window = window
        self.cap = window + chunk if window else max(chunk, 256)
        self.k = np.zeros((n_kv, self.cap, head_dim), dtype)
        self.v = np.zeros((n_kv, self.cap, v_dim or head_dim), dtype)
        self.pos = np.full(self.cap, -1, np.int64)  # position held by each row (−1: empty)

    def append(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> None:
        """k, v [T, n_kv, D] at absolute `positions`."""
        if self.window:
            rows = positions % self.cap
        else:
            self.reserve(int(positions[-1]) + 1)
            rows = positions
        self.k[:, rows] = k.transpose(1, 0, 2)
        self.v[:, rows] = v.transpose(1, 0, 2)
        self.pos[rows] = positions

    def reserve(self, n: int) -> None:
        """Make a full layer hold rows for positions < n (growing in doubling steps)."""
        if not self.window and n > self.cap:
            self._grow(max(n, self.cap * 2))

    def _grow(self, cap: int) -> None:
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.zeros((old.shape[0], cap, old.shape[2]), old.dtype)
            new[:, : self.cap] = old
            setattr(self, name, new)
        self.pos = np.concatenate([self.pos, np.full(cap - self.cap, -1, np.int64)])
        self.cap = cap

    def can_truncate(self, n: int) -> bool:
        """False when a ring has already overwritten rows that position n would still attend to."""
        if not self.window or n == 0:
            return True
        held = self.pos[(self.pos >= 0) & (self.pos < n)]
        return held.size > 0 and held.min() <= max(0, n - self.window + 1)

    def truncate(self, n: int) -> None:
        """Drop positions ≥ n."""
        self.pos[self.pos >= n] = -1

    def view(self, last_pos: int):
        """(k, v, key positions) of the rows that may be attended to up to `last_pos`."""
        if self.window:
            return self.k, self.v, self.pos
        n = last_pos + 1
        return self.k[:, :n], self.v[:, :n], self.pos[:n]


class KVCache:
    """The per-layer KV state of one sequence, plus how many positions it holds."""

    def __init__(self, layers: list[LayerKV]):
        self.layers = layers
        self.offset = 0

    def can_truncate(self, n: int) -> bool:
        """Whether `truncate(n)` would succeed: n ≤ the positions held, and no ring has overwritten rows that
        position n would still attend to."""
        return n <= self.offset and all(l.can_truncate(n) for l in self.layers)

    def truncate(self, n: int) -> bool:
        """Keep only the first n positions; False (cache unchanged) when that is impossible."""
        if not self.can_truncate(n):
            return False
        for l in self.layers:
            l.truncate(n)
        self.offset = n
        return True


def attention(q: np.ndarray, kv: LayerKV, positions: np.ndarray, scale: float) -> np.ndarray:
    """Causal (and, for sliding layers, windowed) grouped-query attention.

    q [T, H, D] for absolute `positions`, after this chunk's k/v were appended to `kv`.
    Returns [T, H, Dv]. Computed by the kernels (`inference.kernels.attention`).
    """
    k, v, kpos = kv.view(int(positions[-1]))
    return kernel_attention(q, k, v, kpos, positions, kv.window, scale)


# --- the model skeleton ----------------------------------------------------------------------
class Transformer:
    """Embedding → decoder layers (in prefill chunks) → final norm → LM head.

    Subclasses set `args`, implement `layer(i, h, cache, positions)` and `cache_for`, and may
    override `embed_scale`, `final_softcap`, `norm_plus_one`.
    """

    embed_scale: float = 1.0
    final_softcap: float | None = None
    norm_plus_one: bool = False
    # a generated token's attention and dense MLP products take int8 activations in the "decode" mode
    # whether or not a compiled step runs them (Gemma 4's), with the dense matmuls on the CPU; see `int8_decode`
    int8_dense_decode: bool = False
    # the compiled path of a generated token (`inference.steps`): its class, which the loader sets
    # (`inference.model.load_model`, from `steps.for_model`); None: every token through `layer`
    step_class = None

    @property
    def int8_decode(self) -> bool:
        """Whether, in the "decode" activation mode, a generated token's dense products and LM head take
        int8 activations on matrices repacked at load (`repack_model`): in a compiled decode step
        (`fused_decode`: llama_decode, moe_decode_layer) or in the layers' own calls (`int8_dense_decode`,
        on the CPU backend: an NPU backend's matrices stay in the store's layout, where int8 is no faster)."""
        return bool(getattr(self, "fused_decode", False) or (self.int8_dense_decode and self.ops is CPU))

    def __init__(self, args, store, *, chunk: int = 128, kv_dtype: str = "f32", prefill_pass: int = 1024):
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"KV precision {kv_dtype!r}: choose one of {', '.join(KV_DTYPES)}")
        self.args = args
        self.store = store
        self.chunk = chunk
        self.prefill_pass = max(chunk, prefill_pass // chunk * chunk)  # whole chunks
        self.kv_dtype = KV_DTYPES[kv_dtype]
        self.embed = store.dense("embed")
        self.lm_head = store.dense("lm_head") if store.has("lm_head") else self.embed
        self.norm = self.vec("norm")
        self.ops = CPU  # the backend of the dense matmuls that an NPU can take (Engine sets it)
        self._rope_memo: dict = {}
        # a prompt goes layer by layer (`pass_forward`) with resident experts too: `rkmojo bench` times the
        # all-resident bound of a streamed prompt in the streamed prompt's order as well
        self.layer_by_layer = False
        self._step = None  # `decode_step`'s, built at the first generated token

    def decode_step(self):
        """The compiled step of a generated token (`step_class` on this model), built at its first use: after
        the engine's repack at load (`kernels.repack`), as the step points at the weights. None without one."""
        if self._step is None and self.step_class is not None:
            self._step = self.step_class(self)
        return self._step

    def rope(self, positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin for this chunk's positions, computed once per chunk and frequency table."""
        key = id(inv_freq)
        if key not in self._rope_memo:
            self._rope_memo[key] = rope_cos_sin(positions, inv_freq)
        return self._rope_memo[key]

    def vec(self, name: str) -> np.ndarray:
        """A small resident vector (norm weight, scale) as float32."""
        return np.asarray(self.store.dense(name).parts["w"], dtype=np.float32)

    def w(self, name: str) -> QTensor:
        return self.store.dense(name)

    def new_cache(self) -> KVCache:
        return self.cache_for(self.args, self.chunk, self.kv_dtype)

    @staticmethod
    def cache_for(args, chunk: int, dtype: np.dtype) -> KVCache:
        """An empty KV cache for `args` (known before the model is built: the engine sizes its expert slots
        by it, so the model is built with the expert provider it will use)."""
        raise NotImplementedError

    def layer(self, i: int, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def layers_forward(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, prompt: bool) -> np.ndarray:
        """h [T, H] through every layer. An architecture may run generated tokens (not `prompt`) another way:
        a prompt's rows are computed alike however it is chunked, a last lone row included."""
        for i in range(self.args.num_hidden_layers):
            h = self.layer(i, h, cache, positions)
        return h

    def hidden(self, ids: np.ndarray, cache: KVCache, *, progress=None, prompt: bool = False) -> np.ndarray:
        """Final-normed hidden states [T, H] for `ids`, appended to `cache`, chunk by chunk;
        `progress(rows done, rows)` after each chunk when given; `prompt`: see `layers_forward`.

        Where the routed experts stream from disk, a prompt of several chunks goes layer by layer over
        passes of up to `prefill_pass` rows (`pass_forward`), so each layer's experts are read once per
        pass, not once per chunk."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if (
            len(ids) > self.chunk
            and self.prefill_pass > self.chunk
            and (self.layer_by_layer or getattr(getattr(self, "experts", None), "streams", False))
        ):
            return self.pass_forward(ids, cache, progress)
        outs = []
        for s in range(0, len(ids), self.chunk):
            part = ids[s : s + self.chunk]
            positions = np.arange(cache.offset, cache.offset + len(part))
            self._rope_memo = {}
            h = self.embed_ids(part)
            h = self.layers_forward(h, cache, positions, prompt)
            cache.offset += len(part)
            outs.append(rms_norm(h, self.norm, self.args.rms_norm_eps, self.norm_plus_one))
            if progress is not None:
                progress(s + len(part), len(ids))
        return np.concatenate(outs) if len(outs) > 1 else outs[0]

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        h = embed_rows(self.embed, ids)
        return h * np.float32(self.embed_scale) if self.embed_scale != 1.0 else h

    def pass_forward(self, ids: np.ndarray, cache: KVCache, progress=None) -> np.ndarray:
        """`hidden` for a prompt, layer by layer: in each pass of up to `prefill_pass` rows, every layer's
        attention half runs chunk by chunk (a chunk's rows attend to the earlier chunks' K/V, as they
        would chunk by chunk), then its MLP / MoE half (`ffn_half`) runs on all the pass's rows at once.
        Every row's arithmetic is that of the chunked order, so the results are the same bits."""
        n, L, outs = len(ids), self.args.num_hidden_layers, []
        for p0 in range(0, n, self.prefill_pass):
            part = ids[p0 : p0 + self.prefill_pass]
            bounds = [(s, min(s + self.chunk, len(part))) for s in range(0, len(part), self.chunk)]
            positions = [np.arange(cache.offset + s, cache.offset + e) for s, e in bounds]
            memos = [{} for _ in bounds]  # each chunk's RoPE tables, computed at its first layer
            h = self.embed_ids(part)
            for i in range(L):
                rows = []
                for (s, e), pos, memo in zip(bounds, positions, memos):
                    self._rope_memo = memo
                    rows.append(self.attn_half(i, h[s:e], cache, pos))
                h = self.ffn_half(i, np.concatenate(rows))
                if progress is not None:
                    progress(p0 + len(part) * (i + 1) // L, n)
            cache.offset += len(part)
            outs.append(rms_norm(h, self.norm, self.args.rms_norm_eps, self.norm_plus_one))
        self._rope_memo = {}
        return np.concatenate(outs) if len(outs) > 1 else outs[0]

    def compiled_decode(self) -> bool:
        """Whether a generated token runs through the compiled step (`step_class`); architectures with one
        say when."""
        return False

    def decode_batch(self, ids: list[int], caches: list[KVCache], steps: list) -> np.ndarray:
        """Logits [M, vocab] of M sequences' next tokens: `ids[s]` appended to `caches[s]`, each sequence
        with a compiled step of its own (`steps[s]`, a `step_class` instance; None where there is none).

        Row s has the bits `forward([ids[s]], caches[s], last_only=True)` gives alone. Where the step
        batches (`step_class.batch`; one sequence too, so its step counts its experts), each weight matrix is
        read once per step for all M rows; elsewhere the sequences run one after another."""
        batched = self.compiled_decode() and hasattr(self.step_class, "batch") and None not in steps
        if not batched:
            return np.concatenate([self.forward(np.array([t]), c, last_only=True) for t, c in zip(ids, caches)])
        h = self.embed_ids(np.asarray(ids, np.int64))
        h = self.step_class.batch(steps, h, caches)
        for c in caches:
            c.offset += 1
        eps = self.args.rms_norm_eps
        h = np.concatenate([rms_norm(h[s : s + 1], self.norm, eps, self.norm_plus_one) for s in range(len(ids))])
        if self.int8_decode and get_activations() == "decode":
            with configured(get_threads(), "q8"):  # as `forward` for a generated token
                return self.logits(h)
        return self.logits(h)

    def logits(self, h: np.ndarray) -> np.ndarray:
        return softcap(linear(h, self.lm_head), self.final_softcap)

    def forward(
        self, ids, cache: KVCache, *, last_only: bool = False, progress=None, prompt: bool = False
    ) -> np.ndarray:
        """Logits [T, vocab] (or [1, vocab] with `last_only`) for the new token ids `ids` (`progress`,
        `prompt`: as `hidden`)."""
        h = self.hidden(ids, cache, progress=progress, prompt=prompt)
        one = not prompt and len(h) == 1  # a generated token (as `layers_forward` tells them)
        h = h[-1:] if last_only else h
        if one and self.int8_decode and get_activations() == "decode":
            # a generated token whose dense products take int8 (`int8_decode`): its LM head does too
            with configured(get_threads(), "q8"):
                return self.logits(h)
        return self.logits(h)
