"""Fused dequantize-and-multiply kernels.

TEMPORARY numpy implementation while the compiled kernels are written (replaced by rkkernels.c).
"""
from __future__ import annotations

import numpy as np

from ..quant import QTensor, dequantize


def linear(x: np.ndarray, w: QTensor) -> np.ndarray:
    """y[T, out] = x[T, in] @ W[out, in].T in float32."""
    return np.ascontiguousarray(x, dtype=np.float32) @ dequantize(w).T


def embed_rows(w: QTensor, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the embedding matrix `w` as float32 [T, H]."""
    return dequantize(w.rows(np.asarray(ids)))
