"""Llama (dense): SmolLM2 and friends. RMSNorm, rotate-half RoPE, GQA, SwiGLU MLP.

A generated token (decode) on the CPU runs all layers as one compiled call (`inference.steps.dense`), the
same math as `layer` without its per-layer numpy steps; `layer` stays the reference and runs prompts
(so a prompt's rows have the same bits however it is chunked: a prompt cache recomputes its last row alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends import dense_on_cpu
from .base import BaseArgs, KVCache, LayerKV, Transformer, apply_rope, attention, rms_norm, rope_inv_freq, silu
from .moe import expert_mlp

# checkpoint tensor name → (internal name, tensor class); see inference/convert/hf.py
HF_NAMES = [
    (r"model\.embed_tokens\.weight", "embed", "embedding"),
    (r"lm_head\.weight", "lm_head", "embedding"),
    (r"model\.norm\.weight", "norm", "norm"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "layers.{0}.attn_norm", "norm"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "layers.{0}.mlp_norm", "norm"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", "layers.{0}.attn.q", "linear"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", "layers.{0}.attn.k", "linear"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", "layers.{0}.attn.v", "linear"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "layers.{0}.attn.o", "linear"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "layers.{0}.mlp.gate", "linear"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "layers.{0}.mlp.up", "linear"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "layers.{0}.mlp.down", "linear"),
    (r"model\.rotary_emb\..*", None, None),
]


@dataclass
class Args(BaseArgs):
    rope_theta: float = 10000.0
    rope_parameters: dict | None = None
    rope_scaling: dict | None = None
    hidden_act: str = "silu"
    intermediate_size: int = 0

    def __post_init__(self):
        super().__post_init__()
        rp = self.rope_parameters or {}
        self.rope_theta = float(rp.get("rope_theta", self.rope_theta))
        scaling = self.rope_scaling or rp
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise ValueError(f"llama: RoPE scaling type {scaling.get('rope_type')!r} is not supported yet")


def expected_shapes(a: Args) -> dict[str, tuple]:
    """Logical shape of each internal tensor, checked by the converters."""
    H, D = a.hidden_size, a.head_dim
    shapes = {"embed": (a.vocab_size, H), "norm": (H,), "lm_head": (a.vocab_size, H)}
    for i in range(a.num_hidden_layers):
        shapes.update(
            {
                f"layers.{i}.attn_norm": (H,),
                f"layers.{i}.mlp_norm": (H,),
                f"layers.{i}.attn.q": (a.num_attention_heads * D, H),
                f"layers.{i}.attn.k": (a.num_key_value_heads * D, H),
                f"layers.{i}.attn.v": (a.num_key_value_heads * D, H),
                f"layers.{i}.attn.o": (H, a.num_attention_heads * D),
                f"layers.{i}.mlp.gate": (a.intermediate_size, H),
                f"layers.{i}.mlp.up": (a.intermediate_size, H),
                f"layers.{i}.mlp.down": (H, a.intermediate_size),
            }
        )
    return shapes


class Model(Transformer):
    # one-token chunks on the CPU as one compiled call (`decode_step`); False: through `layer` (the reference)
    fused_decode: bool = True

    def __init__(self, args: Args, store, **kw):
        super().__init__(args, store, **kw)
        self.inv_freq = rope_inv_freq(args.head_dim, args.rope_theta)
        self.layers = [self._load_layer(i) for i in range(args.num_hidden_layers)]

    def compiled_decode(self) -> bool:
        """Whether a generated token runs through the compiled step (`decode_step`)."""
        return self.fused_decode and dense_on_cpu(self.ops, 1)

    def layers_forward(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, prompt: bool) -> np.ndarray:
        one = not prompt and len(positions) == 1 and self.compiled_decode()
        step = self.decode_step() if one else None
        if step is None:
            return super().layers_forward(h, cache, positions, prompt)
        return step(h, cache, positions)

    def _load_layer(self, i: int) -> dict:
        p = f"layers.{i}."
        return {
            "attn_norm": self.vec(p + "attn_norm"),
            "mlp_norm": self.vec(p + "mlp_norm"),
            **{n: self.w(p + "attn." + n) for n in ("q", "k", "v", "o")},
            "mlp": {n: self.w(p + "mlp." + n) for n in ("gate", "up", "down")},
        }

    @staticmethod
    def cache_for(a: Args, chunk: int, dtype) -> KVCache:
        return KVCache(
            [LayerKV(a.num_key_value_heads, a.head_dim, None, chunk, dtype=dtype) for _ in range(a.num_hidden_layers)]
        )

    def layer(self, i: int, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        a, L = self.args, self.layers[i]
        T, D = h.shape[0], a.head_dim
        cos, sin = self.rope(positions, self.inv_freq)
        q, k, v = self.qkv(i, rms_norm(h, L["attn_norm"], a.rms_norm_eps))
        q = apply_rope(q.reshape(T, -1, D), cos, sin)  # [T, Hq, D]
        k = apply_rope(k.reshape(T, -1, D), cos, sin)  # [T, Hkv, D]
        v = v.reshape(T, -1, D)
        cache.layers[i].append(k, v, positions)
        o = attention(q, cache.layers[i], positions, D**-0.5).reshape(T, -1)
        return self.o_mlp(i, o, h)

    # The layer's dense block, in the two halves around attention that an NPU graph can take over
    # (inference/backends/rknpu/graphs.py builds the same math as ONNX).
    def qkv(self, i: int, x: np.ndarray) -> list[np.ndarray]:
        """x [T, H] (attention-normed) → q [T, Hq·D], k, v [T, Hkv·D]."""
        got = self.ops.graph(i, "qkv", x)  # the NPU's graph (rkmojo npu build), or None
        if got is not None:
            return got
        L = self.layers[i]
        return self.ops.linear_many(x, (L["q"], L["k"], L["v"]))  # one kernel call on the CPU: they share x

    def o_mlp(self, i: int, o: np.ndarray, h: np.ndarray) -> np.ndarray:
        """o [T, Hq·D] (attention output), h [T, H] (residual) → the layer's output [T, H]."""
        got = self.ops.graph(i, "o_mlp", o, h)
        if got is not None:
            return got[0]
        L, eps = self.layers[i], self.args.rms_norm_eps
        h = h + self.ops.linear(o, L["o"])
        return h + expert_mlp(rms_norm(h, L["mlp_norm"], eps), L["mlp"], silu, self.ops)
