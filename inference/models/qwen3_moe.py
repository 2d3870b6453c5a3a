"""Qwen3-MoE (Qwen3-30B-A3B and friends): Llama-style attention with per-head q/k RMSNorm, and a
sparse MoE block routed by softmax → top-k → (renormalise when `norm_topk_prob`).

A generated token (decode) on the CPU runs each layer's attention half and routing as one compiled call,
then its routed experts through the expert source (`inference.steps.moe`); `layer` stays the reference
and runs prompts, as in llama.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends import dense_on_cpu
from ..kernels import linear
from . import llama
from .base import KVCache, LayerKV, Transformer, apply_rope, attention, rms_norm, rope_inv_freq, silu
from ..experts import ResidentExperts
from .moe import expert_mlp, lookahead, mixture, softmax, top_k

L = r"model\.layers\.(\d+)\."
HF_NAMES = llama.HF_NAMES + [
    (L + r"self_attn\.q_norm\.weight", "layers.{0}.attn.q_norm", "norm"),
    (L + r"self_attn\.k_norm\.weight", "layers.{0}.attn.k_norm", "norm"),
    (L + r"mlp\.gate\.weight", "layers.{0}.router", "router"),
    (L + r"mlp\.experts\.(\d+)\.gate_proj\.weight", "experts:{0}:{1}:gate", "expert"),
    (L + r"mlp\.experts\.(\d+)\.up_proj\.weight", "experts:{0}:{1}:up", "expert"),
    (L + r"mlp\.experts\.(\d+)\.down_proj\.weight", "experts:{0}:{1}:down", "expert"),
    (L + r"mlp\.experts\.gate_up_proj", "experts:{0}:*:gate_up", "experts_fused"),
    (L + r"mlp\.experts\.down_proj", "experts:{0}:*:down", "experts_fused"),
]


@dataclass
class Args(llama.Args):
    num_experts: int = 0
    num_local_experts: int = 0
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)
    use_sliding_window: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.num_experts = self.num_experts or self.num_local_experts
        if self.use_sliding_window:
            raise ValueError("qwen3_moe: use_sliding_window=True is not supported")

    def is_moe(self, i: int) -> bool:
        return i not in self.mlp_only_layers and self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe(i)]

    def expert_shapes(self) -> dict[str, tuple[int, int]]:
        I, H = self.moe_intermediate_size, self.hidden_size
        return {"gate": (I, H), "up": (I, H), "down": (H, I)}


def expected_shapes(a: Args) -> dict[str, tuple]:
    shapes = llama.expected_shapes(a)
    for i in range(a.num_hidden_layers):
        shapes[f"layers.{i}.attn.q_norm"] = shapes[f"layers.{i}.attn.k_norm"] = (a.head_dim,)
        if a.is_moe(i):
            shapes[f"layers.{i}.router"] = (a.num_experts, a.hidden_size)
            for n in ("gate", "up", "down"):
                del shapes[f"layers.{i}.mlp.{n}"]
    return shapes


class Model(Transformer):
    # one-token chunks on the CPU through the compiled step (`decode_step`); False: through `layer` (the reference)
    fused_decode: bool = True
    qk_norm_whole: bool = False  # q/k RMSNorm over the whole projection (OLMoE), not per head

    def __init__(self, args: Args, store, *, experts=None, **kw):
        super().__init__(args, store, **kw)
        self.experts = experts or ResidentExperts(store)
        self.inv_freq = rope_inv_freq(args.head_dim, args.rope_theta)
        self.layers = [self._load_layer(i) for i in range(args.num_hidden_layers)]

    def compiled_decode(self) -> bool:
        """Whether a generated token runs through the compiled step (`decode_step`)."""
        npu_experts = self.ops.expert_min_rows is not None and self.ops.expert_min_rows <= 1
        return self.fused_decode and dense_on_cpu(self.ops, 1) and not npu_experts

    def layers_forward(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, prompt: bool) -> np.ndarray:
        one = not prompt and len(positions) == 1 and self.compiled_decode()
        step = self.decode_step() if one else None
        if step is None:
            return super().layers_forward(h, cache, positions, prompt)
        return step(h, cache, positions)

    def _load_layer(self, i: int) -> dict:
        p = f"layers.{i}."
        d = {
            "attn_norm": self.vec(p + "attn_norm"),
            "mlp_norm": self.vec(p + "mlp_norm"),
            "q_norm": self.vec(p + "attn.q_norm"),
            "k_norm": self.vec(p + "attn.k_norm"),
            **{n: self.w(p + "attn." + n) for n in ("q", "k", "v", "o")},
        }
        if self.args.is_moe(i):
            d["router"] = self.w(p + "router")
        else:
            d["mlp"] = {n: self.w(p + "mlp." + n) for n in ("gate", "up", "down")}
        return d

    @staticmethod
    def cache_for(a: Args, chunk: int, dtype) -> KVCache:
        return KVCache(
            [LayerKV(a.num_key_value_heads, a.head_dim, None, chunk, dtype=dtype) for _ in range(a.num_hidden_layers)]
        )

    def route(self, i: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k expert ids and weights [T, K] for the normed MLP input x."""
        probs = softmax(linear(x, self.layers[i]["router"]))  # [T, E]
        idx, w = top_k(probs, self.args.num_experts_per_tok)  # [T, K]
        if self.args.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        return idx, w

    def layer(self, i: int, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        return self.ffn_half(i, self.attn_half(i, h, cache, positions))

    def attn_half(self, i: int, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        """The layer up to its MLP: h [T, H] → h + attention [T, H] (rows need their earlier rows' K/V)."""
        o = self.attn(i, rms_norm(h, self.layers[i]["attn_norm"], self.args.rms_norm_eps), cache, positions)
        return self.o(i, o, h)  # [T, H]

    def ffn_half(self, i: int, h: np.ndarray) -> np.ndarray:
        """The layer's MLP or MoE block and its residual, row by row: any number of rows at once."""
        x = rms_norm(h, self.layers[i]["mlp_norm"], self.args.rms_norm_eps)
        if "mlp" in self.layers[i]:
            return h + expert_mlp(x, self.layers[i]["mlp"], silu, self.ops)
        idx, w = self.route(i, x)
        lookahead(self, i, lambda j: rms_norm(h, self.layers[j]["mlp_norm"], self.args.rms_norm_eps))
        return h + mixture(x, idx, w, i, self.experts, silu, ops=self.ops)[0]

    def qkv(self, i: int, x: np.ndarray) -> list[np.ndarray]:
        """x [T, H] (attention-normed) → q [T, Hq·D], k, v [T, Hkv·D]: the NPU's graph where there is one
        (`rkmojo npu build`), else one kernel call on the CPU (they share x)."""
        got = self.ops.graph(i, "qkv", x)
        if got is not None:
            return got
        Lw = self.layers[i]
        return self.ops.linear_many(x, (Lw["q"], Lw["k"], Lw["v"]))

    def o(self, i: int, o: np.ndarray, h: np.ndarray) -> np.ndarray:
        """o [T, Hq·D] (attention output), h [T, H] (residual) → h + o·Woᵀ [T, H]: the NPU's graph where
        there is one; the post-attention norm feeds the router and stays on the CPU."""
        got = self.ops.graph(i, "o", o, h)
        if got is not None:
            return got[0]
        return h + self.ops.linear(o, self.layers[i]["o"])

    def attn(self, i: int, x: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        """Self-attention of the normed input x [T, H] → its output [T, Hq·D] before the o projection
        (`o`); q/k RMSNorm per head."""
        a, Lw = self.args, self.layers[i]
        T, D = x.shape[0], a.head_dim
        cos, sin = self.rope(positions, self.inv_freq)
        q, k, v = self.qkv(i, x)
        q = rms_norm(q.reshape(T, -1, D), Lw["q_norm"], a.rms_norm_eps)
        k = rms_norm(k.reshape(T, -1, D), Lw["k_norm"], a.rms_norm_eps)
        v = v.reshape(T, -1, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.layers[i].append(k, v, positions)
        return attention(q, cache.layers[i], positions, D**-0.5).reshape(T, -1)
