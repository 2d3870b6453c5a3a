"""OLMoE: Qwen3-MoE's routing (softmax → top-k, renormalised only when `norm_topk_prob`, off by
default) with q/k RMSNorm over the whole projection rather than per head, and optional clip_qkv."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import qwen3_moe
from .base import KVCache, apply_rope, attention, rms_norm

HF_NAMES = qwen3_moe.HF_NAMES


@dataclass
class Args(qwen3_moe.Args):
    norm_topk_prob: bool = False
    clip_qkv: float | None = None

    def __post_init__(self):
        super().__post_init__()
        # OLMoE's experts use `intermediate_size`; it has no dense MLP layers
        self.moe_intermediate_size = self.moe_intermediate_size or self.intermediate_size


def expected_shapes(a: Args) -> dict[str, tuple]:
    shapes = qwen3_moe.expected_shapes(a)
    for i in range(a.num_hidden_layers):
        shapes[f"layers.{i}.attn.q_norm"] = (a.num_attention_heads * a.head_dim,)
        shapes[f"layers.{i}.attn.k_norm"] = (a.num_key_value_heads * a.head_dim,)
    return shapes


class Model(qwen3_moe.Model):
    qk_norm_whole = True

    def attn(self, i: int, x: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        """Self-attention with q/k RMSNorm over the whole projection and optional clipping → [T, Hq·D],
        before the o projection (`o`)."""
        a, Lw = self.args, self.layers[i]
        T, D = x.shape[0], a.head_dim
        q, k, v = self.qkv(i, x)
        q = rms_norm(q, Lw["q_norm"], a.rms_norm_eps)  # [T, Hq·D]
        k = rms_norm(k, Lw["k_norm"], a.rms_norm_eps)  # [T, Hkv·D]
        if a.clip_qkv is not None:
            q, k, v = (np.clip(t, -a.clip_qkv, a.clip_qkv) for t in (q, k, v))
        cos, sin = self.rope(positions, self.inv_freq)
        q, k = apply_rope(q.reshape(T, -1, D), cos, sin), apply_rope(k.reshape(T, -1, D), cos, sin)
        cache.layers[i].append(k, v.reshape(T, -1, D), positions)
        return attention(q, cache.layers[i], positions, D**-0.5).reshape(T, -1)
