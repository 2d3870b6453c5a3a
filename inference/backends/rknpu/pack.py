"""How a weight becomes a matmul context's B, and activations its A, and C float32 again.

One place for the arithmetic of both precisions, shared by the dense weights (`_Weight`) and the
routed experts (`experts.py`):
- fp16: B = Wᵀ rounded to fp16, A = the rows rounded to fp16, C float32 as the runtime returns it;
- int8: B = the weight's int8 values (q8 as stored; other kinds quantized per output channel here),
  A = the rows quantized per row (`quantize_rows`); C = raw int32 products × row scale × channel scale,
  applied here on the CPU. The runtime's quantization parameters are never used (docs/npu.md).
"""

from __future__ import annotations

import numpy as np

from ...quant import QTensor, quantize
from .matmul import Matmul, quantize_rows


def b_block(w: QTensor, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Wᵀ [K, N] for a context of `kind`, and (int8) the per-channel scales [N]; fp16: no scales."""
    if kind == "fp16":
        return w.dense().T.astype(np.float16), None
    q8 = w if w.kind == "q8" else quantize(w.dense(), "q8")
    return np.asarray(q8.parts["q"]).T, np.asarray(q8.parts["scales"], np.float32)


def run(mm: Matmul, x: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    """x [T ≤ M, k ≤ K] float32 → C [T, N] float32; rows and columns past x's are zero padding.

    `scales` [N] (int8 only): the channel scales of B's columns, zero in its padding.
    """
    T, k = x.shape
    M, K = mm.info.M, mm.info.K
    if mm.kind == "fp16":
        a = np.zeros((M, K), np.float16)
        a[:T, :k] = x
        return mm.run(a)[:T]
    q, row_scale = quantize_rows(x)
    a = np.zeros((M, K), np.int8)
    a[:T, :k] = q
    raw = mm.run(a)[:T]  # [T, N] int32: exact integer products
    return raw.astype(np.float32) * row_scale[:, None] * scales[None, :]
