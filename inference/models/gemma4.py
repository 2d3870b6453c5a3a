"""Gemma 4 text model with its MoE block (Gemma 4 26B-A4B).

The traps, in the order a token meets them: embedding × √hidden; RMSNorm multiplies by the weight
(no +1); q_norm/k_norm with weights and v_norm without; attention scale 1.0; sliding layers (own
head size, RoPE θ) and full layers (global head size, K = V when `attention_k_eq_v`, proportional
partial RoPE); dense MLP and routed experts side by side, each with its own pre/post norms, summed,
post-norm, residual, × layer_scalar; final logit softcap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends import CPU
from ..kernels import configured, get_activations, get_threads, linear
from .base import ACTIVATIONS, BaseArgs, KVCache, LayerKV, Transformer, apply_rope, attention, rms_norm, rope_inv_freq
from ..experts import ResidentExperts
from .moe import expert_mlp, lookahead, mixture, softmax, top_k

L = r"model\.layers\.(\d+)\."
HF_NAMES = [
    (r"model\.embed_tokens\.weight", "embed", "embedding"),
    (r"lm_head\.weight", "lm_head", "embedding"),
    (r"model\.norm\.weight", "norm", "norm"),
    (L + r"input_layernorm\.weight", "layers.{0}.attn_norm", "norm"),
    (L + r"post_attention_layernorm\.weight", "layers.{0}.post_attn_norm", "norm"),
    (L + r"pre_feedforward_layernorm\.weight", "layers.{0}.mlp_norm", "norm"),
    (L + r"post_feedforward_layernorm\.weight", "layers.{0}.post_ffn_norm", "norm"),
    (L + r"post_feedforward_layernorm_1\.weight", "layers.{0}.post_mlp_norm", "norm"),
    (L + r"pre_feedforward_layernorm_2\.weight", "layers.{0}.moe_norm", "norm"),
    (L + r"post_feedforward_layernorm_2\.weight", "layers.{0}.post_moe_norm", "norm"),
    (L + r"layer_scalar", "layers.{0}.layer_scalar", "norm"),
    (L + r"self_attn\.q_proj\.weight", "layers.{0}.attn.q", "linear"),
    (L + r"self_attn\.k_proj\.weight", "layers.{0}.attn.k", "linear"),
    (L + r"self_attn\.v_proj\.weight", "layers.{0}.attn.v", "linear"),
    (L + r"self_attn\.o_proj\.weight", "layers.{0}.attn.o", "linear"),
    (L + r"self_attn\.q_norm\.weight", "layers.{0}.attn.q_norm", "norm"),
    (L + r"self_attn\.k_norm\.weight", "layers.{0}.attn.k_norm", "norm"),
    (L + r"mlp\.gate_proj\.weight", "layers.{0}.mlp.gate", "linear"),
    (L + r"mlp\.up_proj\.weight", "layers.{0}.mlp.up", "linear"),
    (L + r"mlp\.down_proj\.weight", "layers.{0}.mlp.down", "linear"),
    (L + r"router\.proj\.weight", "layers.{0}.router", "router"),
    (L + r"router\.scale", "layers.{0}.router_scale", "norm"),
    (L + r"router\.per_expert_scale", "layers.{0}.router_expert_scale", "norm"),
    (L + r"experts\.gate_up_proj", "experts:{0}:*:gate_up", "experts_fused"),
    (L + r"experts\.down_proj", "experts:{0}:*:down", "experts_fused"),
    (L + r"experts\.(\d+)\.gate_proj\.weight", "experts:{0}:{1}:gate", "expert"),
    (L + r"experts\.(\d+)\.up_proj\.weight", "experts:{0}:{1}:up", "expert"),
    (L + r"experts\.(\d+)\.down_proj\.weight", "experts:{0}:{1}:down", "expert"),
]
# the released checkpoint (Gemma4ForConditionalGeneration) nests the text model and adds towers
HF_PREFIXES = {"model.language_model.": "model."}
HF_DROP = (r"model\.(vision_tower|audio_tower|embed_vision|embed_audio|multi_modal_projector)\..*",)


@dataclass
class Args(BaseArgs):
    intermediate_size: int = 0
    hidden_activation: str = "gelu_pytorch_tanh"
    layer_types: list = field(default_factory=list)
    sliding_window: int = 512
    rope_parameters: dict = field(default_factory=dict)
    final_logit_softcapping: float | None = None
    attention_k_eq_v: bool = False
    global_head_dim: int | None = None
    num_global_key_value_heads: int | None = None
    per_layer_config: dict = field(default_factory=dict)
    enable_moe_block: bool = False
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    hidden_size_per_layer_input: int | None = 0
    num_kv_shared_layers: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.hidden_size_per_layer_input:
            raise ValueError("gemma4: per-layer input embeddings (the E2B/E4B models) are not supported")
        if self.num_kv_shared_layers:
            raise ValueError("gemma4: KV-shared layers are not supported")
        if not self.layer_types:
            self.layer_types = [
                "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(self.num_hidden_layers)
            ]
        self.rope_parameters = self.rope_parameters or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        }

    def is_sliding(self, i: int) -> bool:
        return self.layer_types[i] == "sliding_attention"

    def attn_dims(self, i: int) -> tuple[int, int]:
        """(head_dim, kv heads) of layer i: full layers may use a wider head and fewer KV heads."""
        if self.is_sliding(i):
            return self.head_dim, self.num_key_value_heads
        over = self.per_layer_config.get(str(i)) or self.per_layer_config.get(i) or {}
        d = over.get("head_dim", self.global_head_dim or self.head_dim)
        kv = over.get(
            "num_key_value_heads",
            self.num_global_key_value_heads
            if self.attention_k_eq_v and self.num_global_key_value_heads
            else self.num_key_value_heads,
        )
        return d, kv

    def k_eq_v(self, i: int) -> bool:
        return self.attention_k_eq_v and not self.is_sliding(i)

    def is_moe(self, i: int) -> bool:
        return self.enable_moe_block

    def moe_layers(self) -> list[int]:
        return list(range(self.num_hidden_layers)) if self.enable_moe_block else []

    def expert_shapes(self) -> dict[str, tuple[int, int]]:
        I, H = self.moe_intermediate_size, self.hidden_size
        return {"gate": (I, H), "up": (I, H), "down": (H, I)}


def expected_shapes(a: Args) -> dict[str, tuple]:
    H, V = a.hidden_size, a.vocab_size
    s = {"embed": (V, H), "lm_head": (V, H), "norm": (H,)}
    for i in range(a.num_hidden_layers):
        D, kv = a.attn_dims(i)
        p = f"layers.{i}."
        s.update(
            {
                p + "attn.q": (a.num_attention_heads * D, H),
                p + "attn.k": (kv * D, H),
                p + "attn.v": (kv * D, H),
                p + "attn.o": (H, a.num_attention_heads * D),
                p + "attn.q_norm": (D,),
                p + "attn.k_norm": (D,),
                p + "mlp.gate": (a.intermediate_size, H),
                p + "mlp.up": (a.intermediate_size, H),
                p + "mlp.down": (H, a.intermediate_size),
            }
        )
        if a.k_eq_v(i):
            del s[p + "attn.v"]
        if a.is_moe(i):
            s.update(
                {
                    p + "router": (a.num_experts, H),
                    p + "router_scale": (H,),
                    p + "router_expert_scale": (a.num_experts,),
                }
            )
    return s


class Model(Transformer):
    # a generated token on the CPU through the compiled step (`decode_step`); False: through `layer` (the reference)
    fused_decode: bool = True
    # a generated token's q/k/v/o and dense MLP products take int8 in "decode" mode (step or not)
    int8_dense_decode: bool = True

    @property
    def int8_decode(self) -> bool:
        """As `Transformer.int8_decode`, but only on the CPU backend, with or without the compiled step."""
        return self.ops is CPU

    def __init__(self, args: Args, store, *, experts=None, **kw):
        super().__init__(args, store, **kw)
        self._int8_rows = False  # set for a generated token's layers (`layers_forward`)
        self.embed_scale = float(np.float32(args.hidden_size**0.5))
        self.final_softcap = args.final_logit_softcapping
        self.act = ACTIVATIONS[args.hidden_activation]
        self.experts = experts or ResidentExperts(store)
        self.inv_freq = {}
        for kind, rp in args.rope_parameters.items():
            D = args.head_dim if kind == "sliding_attention" else args.attn_dims(args.layer_types.index(kind))[0]
            self.inv_freq[kind] = rope_inv_freq(
                D,
                float(rp["rope_theta"]),
                float(rp.get("partial_rotary_factor", 1.0)),
                proportional=rp.get("rope_type") == "proportional",
                factor=float(rp.get("factor", 1.0)),
            )
        self.layers = [self._load_layer(i) for i in range(args.num_hidden_layers)]

    def _load_layer(self, i: int) -> dict:
        p = f"layers.{i}."
        names = [
            "attn_norm",
            "post_attn_norm",
            "mlp_norm",
            "post_ffn_norm",
            "layer_scalar",
            "attn.q_norm",
            "attn.k_norm",
        ]
        d = {n: self.vec(p + n) for n in names}
        d.update({n: self.w(p + "attn." + n) for n in ("q", "k", "o")})
        d["v"] = None if self.args.k_eq_v(i) else self.w(p + "attn.v")
        d["mlp"] = {n: self.w(p + "mlp." + n) for n in ("gate", "up", "down")}
        if self.args.is_moe(i):
            d.update(
                {
                    n: self.vec(p + n)
                    for n in ("post_mlp_norm", "moe_norm", "post_moe_norm", "router_scale", "router_expert_scale")
                }
            )
            d["router"] = self.w(p + "router")
            # the router's input scaling folded once: rms_norm(x) × scale × hidden^-½
            d["router_in"] = d["router_scale"] * np.float32(self.args.hidden_size**-0.5)
        return d

    @staticmethod
    def cache_for(a: Args, chunk: int, dtype) -> KVCache:
        return KVCache(
            [
                LayerKV(
                    a.attn_dims(i)[1],
                    a.attn_dims(i)[0],
                    a.sliding_window if a.is_sliding(i) else None,
                    chunk,
                    dtype=dtype,
                )
                for i in range(a.num_hidden_layers)
            ]
        )

    def route(self, i: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k expert ids and weights [T, K] from the residual stream x (not the normed input)."""
        Lw = self.layers[i]
        xr = rms_norm(x, None, self.args.rms_norm_eps) * Lw["router_in"]
        probs = softmax(linear(xr, Lw["router"]))  # [T, E]
        idx, w = top_k(probs, self.args.top_k_experts)
        w = w / w.sum(axis=-1, keepdims=True)
        return idx, w * Lw["router_expert_scale"][idx]

    def layer(self, i: int, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        return self.ffn_half(i, self.attn_half(i, h, cache, positions))

    def compiled_decode(self) -> bool:
        """Whether a generated token runs through the compiled step (`decode_step`): on the CPU backend."""
        return self.fused_decode and self.ops is CPU

    def layers_forward(self, h: np.ndarray, cache: KVCache, positions: np.ndarray, prompt: bool) -> np.ndarray:
        """As `Transformer.layers_forward`; a generated token on the CPU runs through the compiled step
        (`decode_step`: each layer in C calls, rkgemma4.c, around the expert source) unless `fused_decode`
        is False. In the "decode" mode its dense products (`dense`, the step's q/k/v/o) take int8
        activations, as the other architectures' compiled steps do, on the matrices `repack_model` put in
        rows-in-lanes panels. The router stays float, as there."""
        one = not prompt and len(positions) == 1
        self._int8_rows = one and self.int8_decode and get_activations() == "decode"
        try:
            step = self.decode_step() if one and self.compiled_decode() else None
            if step is None:
                return super().layers_forward(h, cache, positions, prompt)
            return step(h, cache, positions)
        finally:
            self._int8_rows = False

    def dense(self, fn, *args):
        """fn(*args), a dense product of this layer's, with int8 activations for a generated token's row."""
        if not self._int8_rows:
            return fn(*args)
        with configured(get_threads(), "q8"):
            return fn(*args)

    def attn_half(self, i: int, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        """The layer up to its MLP and MoE: h [T, H] → h + the normed attention [T, H]."""
        a, Lw, eps = self.args, self.layers[i], self.args.rms_norm_eps
        T = h.shape[0]
        D = a.attn_dims(i)[0]
        x = rms_norm(h, Lw["attn_norm"], eps)
        cos, sin = self.rope(positions, self.inv_freq[a.layer_types[i]])
        qkv = self.qkv(i, x)
        q = rms_norm(qkv[0].reshape(T, -1, D), Lw["attn.q_norm"], eps)  # [T, Hq, D]
        k_raw = qkv[1].reshape(T, -1, D)  # [T, Hkv, D]
        v = k_raw if Lw["v"] is None else qkv[2].reshape(T, -1, D)
        k = apply_rope(rms_norm(k_raw, Lw["attn.k_norm"], eps), cos, sin)
        v = rms_norm(v, None, eps)
        cache.layers[i].append(k, v, positions)
        o = attention(apply_rope(q, cos, sin), cache.layers[i], positions, 1.0).reshape(T, -1)
        return self.o_norm(i, o, h)

    def ffn_half(self, i: int, h: np.ndarray) -> np.ndarray:
        """The dense MLP, the MoE block, their norms and the layer scalar, row by row: any number of rows."""
        Lw, eps = self.layers[i], self.args.rms_norm_eps

        def shared() -> np.ndarray:  # the dense MLP: computed while missing experts are read
            x, c = rms_norm(h, Lw["mlp_norm"], eps), self.chunk
            if len(x) <= c:
                return self.mlp(i, x)
            # a prefill pass of many chunks (`Transformer.hidden`): an NPU graph takes one chunk at a time
            return np.concatenate([self.mlp(i, x[s : s + c]) for s in range(0, len(x), c)])

        if "router" in Lw:
            idx, w = self.route(i, h)
            lookahead(self, i, lambda j: h)
            moe, m = mixture(rms_norm(h, Lw["moe_norm"], eps), idx, w, i, self.experts, self.act, shared, self.ops)
            m = rms_norm(m, Lw["post_mlp_norm"], eps) + rms_norm(moe, Lw["post_moe_norm"], eps)
        else:
            m = shared()
        h = h + rms_norm(m, Lw["post_ffn_norm"], eps)
        return h * Lw["layer_scalar"]

    # The three parts of the layer's dense block that an NPU graph can take over (rknpu/graphs.py builds
    # the same math as ONNX; the norms around them, attention, router and experts stay on the CPU).
    def qkv(self, i: int, x: np.ndarray) -> list[np.ndarray]:
        """x [T, H] (attention-normed) → q [T, Hq·D], k [T, Hkv·D] and, unless the layer has K = V, v."""
        got = self.ops.graph(i, "qkv", x)  # the NPU's graph (rkmojo npu build), or None
        if got is not None:
            return got
        Lw = self.layers[i]
        return self.dense(self.ops.linear_many, x, [w for w in (Lw["q"], Lw["k"], Lw["v"]) if w is not None])

    def o_norm(self, i: int, o: np.ndarray, h: np.ndarray) -> np.ndarray:
        """o [T, Hq·D] (attention output), h [T, H] (residual) → h + rms_norm(o·Woᵀ) · post_attn_norm [T, H]."""
        got = self.ops.graph(i, "o_norm", o, h)
        if got is not None:
            return got[0]
        Lw = self.layers[i]
        return h + rms_norm(self.dense(self.ops.linear, o, Lw["o"]), Lw["post_attn_norm"], self.args.rms_norm_eps)

    def mlp(self, i: int, x: np.ndarray) -> np.ndarray:
        """x [T, H] (the MLP-normed residual) → the dense MLP's output [T, H], before its post-norm."""
        got = self.ops.graph(i, "mlp", x)
        if got is not None:
            return got[0]
        return self.dense(expert_mlp, x, self.layers[i]["mlp"], self.act, self.ops)
