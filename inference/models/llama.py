"""Llama (dense): SmolLM2 and friends. RMSNorm, rotate-half RoPE, GQA, SwiGLU MLP.

A generated token (decode) on the CPU runs all layers as one compiled call (`kernels.llama_decode`), the
same math as `layer` without its per-layer numpy steps; `layer` stays the reference and runs prompts
(so a prompt's rows have the same bits however it is chunked: a prompt cache recomputes its last row alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels
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


def f32_bits(v: float) -> int:
    """v as float32, its bits as an int (a descriptor's float fields)."""
    return int(np.float32(v).view(np.int32))


class DecodeStep:
    """The descriptor of `kernels.llama_decode` for a model's layers: weights fixed at build, the K/V
    cache's arrays re-read when they change (a new cache, or one grown), the token's fields per call."""

    def __init__(self, model: Model):
        a = model.args
        hdr, lay = kernels.DECODE_HEADER, kernels.DECODE_LAYER
        self.skeleton(hdr, lay, kernels.DECODE_MATRICES, a.num_hidden_layers)
        for name, value in {
            "layers": a.num_hidden_layers,
            "hidden": a.hidden_size,
            "heads": a.num_attention_heads,
            "kv_heads": a.num_key_value_heads,
            "head_dim": a.head_dim,
            "inter": a.intermediate_size,
            "rot_half": len(model.inv_freq),
            "eps": f32_bits(a.rms_norm_eps),
            "scale": f32_bits(a.head_dim**-0.5),
        }.items():
            self.desc[self.field[name]] = value
        for i, L in enumerate(model.layers):
            row = self.desc[self.h0 + i * self.nl :][: self.nl]
            row[0], row[1] = L["attn_norm"].ctypes.data, L["mlp_norm"].ctypes.data
            mats = [L[n] for n in ("q", "k", "v", "o")] + [L["mlp"][n] for n in ("gate", "up", "down")]
            row[len(lay) :] = [f for w in mats for f in kernels.matrix_fields(w)]
        self._norms = [(L["attn_norm"], L["mlp_norm"]) for L in model.layers]  # the addresses above
        self._kv: list = []  # the cache arrays the descriptor points at

    def skeleton(self, header, layer_fields, matrices, n_layers: int) -> None:
        """The zeroed descriptor: the header's fields, then per layer its fields and its matrices' (shared
        with the MoE step, whose header and layer fields extend these)."""
        self.nl = len(layer_fields) + len(matrices) * kernels.DECODE_MAT_FIELDS
        self.h0 = len(header)
        self.desc = np.zeros(len(header) + n_layers * self.nl, np.int64)
        self.field = {name: j for j, name in enumerate(header)}

    def __call__(self, h: np.ndarray, cache: KVCache, pos: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """h [1, H] at position `pos` through every layer, appending to `cache`; a new [1, H]."""
        h, _held = self.prepare(h, cache, pos, cos, sin)
        kernels.llama_decode(self.desc)
        return h

    def prepare(self, h, cache: KVCache, pos: int, cos, sin) -> tuple[np.ndarray, tuple]:
        """`desc` for this token: the (new) h array the call updates, and the arrays to keep alive meanwhile."""
        for kv in cache.layers:
            kv.reserve(pos + 1)
        held = [a for kv in cache.layers for a in (kv.k, kv.v, kv.pos)]
        if len(held) != len(self._kv) or any(x is not y for x, y in zip(held, self._kv)):
            for i, kv in enumerate(cache.layers):
                base = self.h0 + i * self.nl
                self.desc[base + 2 : base + 5] = (kv.k.ctypes.data, kv.v.ctypes.data, kv.pos.ctypes.data)
            self.desc[self.field["kv_f16"]] = int(cache.layers[0].k.dtype == np.float16)
            self.desc[self.field["kv_cap"]] = cache.layers[0].cap
            self._kv = held
        h = np.array(h, dtype=np.float32, order="C")
        cos, sin = np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32)
        f, d = self.field, self.desc
        d[f["pos"]], d[f["h"]], d[f["cos"]], d[f["sin"]] = pos, h.ctypes.data, cos.ctypes.data, sin.ctypes.data
        return h, (cos, sin)


class Model(Transformer):
    # one-token chunks on the CPU as one compiled call (DecodeStep); False: through `layer` (the reference)
    fused_decode: bool = True

    def __init__(self, args: Args, store, **kw):
        super().__init__(args, store, **kw)
        self.inv_freq = rope_inv_freq(args.head_dim, args.rope_theta)
        self.layers = [self._load_layer(i) for i in range(args.num_hidden_layers)]
        self._decode: DecodeStep | None = None

    def layers_forward(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, prompt: bool) -> np.ndarray:
        if prompt or len(positions) != 1 or not self.fused_decode or not dense_on_cpu(self.ops, 1):
            return super().layers_forward(h, cache, positions, prompt)
        if self._decode is None:
            self._decode = DecodeStep(self)
        cos, sin = self.rope(positions, self.inv_freq)
        return self._decode(h, cache, int(positions[0]), cos, sin)

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
