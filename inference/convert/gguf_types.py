"""GGUF tensor types → QTensor kinds: each GGUF type is kept, re-laid out, re-quantized or refused.

The kinds are the ones the kernels run (`inference.quant.KINDS`); no type gets a kind of its own.

- kept byte for byte: F32, F16, Q8_0, Q4_0, Q4_1 (kinds f32, f16, q8_0, q4_0, q4_1).
- Q4_K → q4_1, re-laid out: a Q4_K super-block is 8 sub-blocks of 32 values `d·sc_j·q − dmin·m_j` with
  q in 0..15, which is q4_1's block (`q·d' + m'`) with d' = d·sc_j and m' = −dmin·m_j. The nibbles are
  kept; only d' and m' are rounded to f16 (they are a product of an f16 and a 6-bit integer).
- Q5_K, Q6_K → q8_0: no kernel kind holds 5 or 6 bits, so the values are dequantized
  (`gguf.quants.dequantize`, llama.cpp's reference) and re-quantized per block of 32.
- BF16, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS → q8 (per row), likewise dequantized first.
- anything else is refused by name (`unsupported`).

A 1-D tensor (norm, scale) of any supported type becomes f32.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K
from gguf.quants import dequantize as gguf_dequantize

from ..quant import QTensor, quantize

# GGUF type → the QTensor kind a matrix of it is stored as
KEPT = {T.F32: "f32", T.F16: "f16", T.Q8_0: "q8_0", T.Q4_0: "q4_0", T.Q4_1: "q4_1"}
RELAID = {T.Q4_K: "q4_1"}
REQUANT = {
    T.Q5_K: "q8_0",
    T.Q6_K: "q8_0",
    T.BF16: "q8",
    T.Q5_0: "q8",
    T.Q5_1: "q8",
    T.Q2_K: "q8",
    T.Q3_K: "q8",
    T.IQ4_NL: "q8",
    T.IQ4_XS: "q8",
}
SUPPORTED = {**KEPT, **RELAID, **REQUANT}
# values dequantized at once when re-laying out or re-quantizing (bounds the float32 scratch to ~64 MB)
CHUNK_VALUES = 16 * 1024 * 1024
QK_K, Q4_K_BYTES = 256, 144


def storage_kind(ty: T) -> str | None:
    """The kind a matrix of GGUF type `ty` is stored as; None when the type is not supported."""
    return SUPPORTED.get(ty)


def unsupported(src: str, name: str, ty) -> str:
    """The message refusing tensor `name` of type `ty`."""
    tname = ty.name if isinstance(ty, T) else str(ty)
    return (
        f"{src}: tensor {name} has GGUF type {tname}, which rkmojo does not convert; supported types: "
        f"{', '.join(t.name for t in SUPPORTED)}; re-quantize the model to one of them (e.g. Q4_K_M)"
    )


def to_qtensor(data: np.ndarray, ty: T, shape: tuple[int, ...], perm: np.ndarray | None = None) -> QTensor:
    """One GGUF matrix (or vector) as a QTensor of logical `shape`.

    Args:
        data: the tensor as GGUFReader maps it: values `[out, in]`, or for block types bytes `[out, row bytes]`.
        ty: its GGUF type (one of `SUPPORTED`).
        shape: the logical shape, `(out, in)` or `(n,)`.
        perm: a row order to apply (`stored = file[perm]`), or None.
    Raises:
        ValueError: a Q4_K scale that does not fit in f16.
    """
    kind = SUPPORTED[ty]
    if len(shape) == 1:
        vals = data if ty in (T.F32, T.F16) else gguf_dequantize(data, ty)
        return quantize(np.asarray(vals, np.float32).reshape(shape), "f32")
    arr = data.reshape(shape[0], -1)  # [out, in] values or [out, row bytes]
    if perm is not None:
        arr = arr[perm]  # whole block rows move: exact for every type, and per-row re-quantization commutes
    if ty in KEPT:
        return QTensor(kind, shape, {"w" if kind in ("f32", "f16") else "blocks": arr})
    step = max(1, CHUNK_VALUES // shape[1])
    if ty in RELAID:
        blocks = np.concatenate([q4_k_as_q4_1(arr[r : r + step]) for r in range(0, shape[0], step)])
        return QTensor(kind, shape, {"blocks": blocks})
    chunks = [
        quantize(gguf_dequantize(arr[r : r + step], ty).reshape(-1, shape[1]), kind) for r in range(0, shape[0], step)
    ]
    return QTensor(kind, shape, {p: np.concatenate([c.parts[p] for c in chunks]) for p in chunks[0].parts})


def q4_k_as_q4_1(raw: np.ndarray) -> np.ndarray:
    """Q4_K rows `[rows, n/256 × 144]` as q4_1 blocks `[rows, n/32 × 20]` (see the module docstring).

    Raises:
        ValueError: a sub-block's d·sc or dmin·m overflows f16.
    """
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, Q4_K_BYTES)  # [rows, super-blocks, 144]
    nb = b.shape[1]
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)  # [rows, nb, 1]
    dmin = b[..., 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(-1, 12))
    sc = sc.reshape(rows, nb, 8).astype(np.float32)
    mn = mn.reshape(rows, nb, 8).astype(np.float32)
    with np.errstate(over="ignore"):
        scale = (d * sc).astype(np.float16)  # [rows, nb, 8]
        bias = (-(dmin * mn)).astype(np.float16)
    if not (np.isfinite(scale).all() and np.isfinite(bias).all()):
        raise ValueError("a Q4_K sub-block scale overflows f16")
    # 4 chunks of 32 bytes per super-block: sub-block 2k in the low nibbles of chunk k, 2k+1 in the high ones
    qs = b[..., 16:].reshape(rows, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 0x0F).reshape(rows, nb, 8, 32)
    packed = q[..., :16] | (q[..., 16:] << 4)  # q4_1: value j low nibble, value j + 16 high nibble
    blocks = np.concatenate(
        [
            np.ascontiguousarray(scale[..., None]).view(np.uint8),
            np.ascontiguousarray(bias[..., None]).view(np.uint8),
            packed,
        ],
        axis=-1,
    )  # [rows, nb, 8, 20]
    return np.ascontiguousarray(blocks.reshape(rows, -1))
