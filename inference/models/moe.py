"""The MoE switch shared by every MoE architecture: routing helpers and the expert mixture.

Routers differ per architecture (they live in the architecture files); what happens after the
top-k choice is the same: each chosen expert runs once on all the rows that chose it, and the
weighted outputs are combined in top-k slot order, a fixed order, so the result does not depend
on which experts happened to be loaded first.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..kernels import linear
from ..quant import QTensor


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the k largest entries per row, largest first (ties: lower index)."""
    idx = np.argsort(-scores, axis=-1, kind="stable")[:, :k]  # [T, K]
    return idx, np.take_along_axis(scores, idx, axis=-1)


def expert_mlp(x: np.ndarray, w: dict[str, QTensor], act: Callable) -> np.ndarray:
    """One gated MLP: down(act(gate(x)) × up(x)). x [n, H] → [n, H]."""
    return linear(act(linear(x, w["gate"])) * linear(x, w["up"]), w["down"])


class ExpertSource:
    """Where expert weights come from. This one reads the store's memory-mapped layer files
    (all experts resident); the streaming cache provides the same `get` over a few slots."""

    def __init__(self, store):
        self.store = store

    def get(self, layer: int, expert: int) -> dict[str, QTensor]:
        return self.store.expert(layer, expert)


def mixture(x: np.ndarray, idx: np.ndarray, weights: np.ndarray, layer: int, source: ExpertSource,
            act: Callable) -> np.ndarray:
    """Σ_k weights[t, k] · expert_{idx[t, k]}(x[t]) for every row t.

    x [T, H], idx [T, K] int, weights [T, K] float32 → [T, H].
    """
    T, K = idx.shape
    y = np.zeros((T, K, x.shape[1]), np.float32)  # [T, K, H]
    for e in np.unique(idx):
        rows, slots = np.nonzero(idx == e)
        y[rows, slots] = expert_mlp(x[rows], source.get(layer, int(e)), act)
    y *= weights[:, :, None].astype(np.float32)
    out = y[:, 0].copy()
    for k in range(1, K):
        out += y[:, k]
    return out
