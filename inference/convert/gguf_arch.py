"""What each GGUF architecture means to rkmojo: its metadata → an HF-style config, and its tensor names.

One `ArchTable` per `general.architecture`, read as llama.cpp reads the file (llama-model.cpp):

- `llama`: q/k rows permuted by llama.cpp's converter for its interleaved RoPE; put back (`unpermute`).
- `qwen3moe`, `olmoe`, `gemma4`: no permutation (llama.cpp's converter permutes for llama only). Experts
  are 3-D tensors `blk.N.ffn_{gate,up,down}_exps` ([experts, rows, in] in numpy order); Gemma 4 fuses
  gate and up (`ffn_gate_up_exps`, gate rows first, as in the HF checkpoint).
- Values read the way llama.cpp's runtime reads them when the file leaves them out: qwen3moe renormalises
  its top-k weights and olmoe does not, unless `{arch}.expert_weights_norm` says otherwise; olmoe clips
  q/k/v at `attention.clamp_kqv` when present. Gemma 4's norms are stored as the HF weights (no +1).

Names use `{}` for the layer index. An expert's internal name is `experts:{layer}:{sub}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ConvertError


class GGUFMeta:
    """A GGUF file's metadata and tensor index, read for one architecture (`{arch}.` keys)."""

    def __init__(self, fields: dict, arch: str, src: str, tensors: dict):
        self.fields, self.arch, self.src, self.tensors = fields, arch, src, tensors

    def get(self, key: str, default=None):
        v = self.fields.get(f"{self.arch}.{key}")
        return default if v is None else v

    def req(self, key: str):
        v = self.fields.get(f"{self.arch}.{key}")
        if v is None:
            raise ConvertError(
                f"{self.src}: metadata key {self.arch}.{key} missing; the GGUF is incomplete, re-export it"
            )
        return v

    def scalar(self, key: str, default=None):
        """A per-model value; a per-layer array must hold one value throughout."""
        v = self.get(key, default)
        if isinstance(v, list):
            if len(set(v)) != 1:
                raise ConvertError(f"{self.src}: per-layer {self.arch}.{key} {v} is not supported")
            v = v[0]
        return v

    def layers_with(self, suffix: str) -> set[int]:
        """The layers that have tensor `blk.N.<suffix>`."""
        return {int(n.split(".")[1]) for n in self.tensors if n.startswith("blk.") and n.endswith("." + suffix)}

    def common(self, model_type: str) -> dict:
        """The config keys every architecture reads the same way."""
        hidden, heads = int(self.req("embedding_length")), int(self.req("attention.head_count"))
        vocab = self.get("vocab_size") or len(self.fields.get("tokenizer.ggml.tokens") or ())
        return {
            "model_type": model_type,
            "hidden_size": hidden,
            "num_hidden_layers": int(self.req("block_count")),
            "num_attention_heads": heads,
            "head_dim": int(self.get("attention.key_length") or hidden // heads),
            "rms_norm_eps": float(self.req("attention.layer_norm_rms_epsilon")),
            "vocab_size": int(vocab),
            "max_position_embeddings": int(self.req("context_length")),
            "bos_token_id": self.fields.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.fields.get("tokenizer.ggml.eos_token_id"),
            "pad_token_id": self.fields.get("tokenizer.ggml.padding_token_id"),
        }


@dataclass(frozen=True)
class ArchTable:
    """How one GGUF architecture maps onto a store."""

    config: Callable[[GGUFMeta], dict]  # metadata → HF-style config
    tensors: dict[str, tuple[str, str]]  # GGUF name → (internal name, tensor class)
    unpermute: dict[str, str] = field(default_factory=dict)  # internal name → config key of its head count
    skip: frozenset = frozenset()  # GGUF tensors read into the config, not stored
    extra_shapes: Callable | None = None  # Args → shapes of tensors `expected_shapes` leaves unchecked


def rope_scaling(m: GGUFMeta) -> dict | None:
    kind = m.get("rope.scaling.type")
    factor = m.get("rope.scaling.factor") or m.get("rope.scale_linear")
    if kind in (None, "none") and not factor:
        return None
    if kind in (None, "linear"):
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        orig = m.get("rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": orig}
    raise ConvertError(
        f"{m.src}: RoPE scaling {kind!r} ({m.arch}.rope.scaling.type) is not supported; supported: linear, yarn"
    )


def _full_rope(m: GGUFMeta, head_dim: int) -> None:
    rope_dim = int(m.get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ConvertError(
            f"{m.src}: partial RoPE ({m.arch}.rope.dimension_count={rope_dim}, head_dim={head_dim}) is not supported"
        )


# --- llama ------------------------------------------------------------------------------------
def _llama_config(m: GGUFMeta) -> dict:
    c = m.common("llama")
    if isinstance(m.get("attention.head_count_kv"), list):
        raise ConvertError(f"{m.src}: per-layer llama.attention.head_count_kv is not supported")
    _full_rope(m, c["head_dim"])
    return c | {
        "intermediate_size": int(m.req("feed_forward_length")),
        "num_key_value_heads": int(m.get("attention.head_count_kv", c["num_attention_heads"])),
        "rope_theta": float(m.get("rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling(m),
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
    }


_DENSE = {
    "token_embd.weight": ("embed", "embedding"),
    "output_norm.weight": ("norm", "norm"),
    "output.weight": ("lm_head", "embedding"),
    "blk.{}.attn_norm.weight": ("layers.{}.attn_norm", "norm"),
    "blk.{}.attn_q.weight": ("layers.{}.attn.q", "linear"),
    "blk.{}.attn_k.weight": ("layers.{}.attn.k", "linear"),
    "blk.{}.attn_v.weight": ("layers.{}.attn.v", "linear"),
    "blk.{}.attn_output.weight": ("layers.{}.attn.o", "linear"),
    "blk.{}.ffn_gate.weight": ("layers.{}.mlp.gate", "linear"),
    "blk.{}.ffn_up.weight": ("layers.{}.mlp.up", "linear"),
    "blk.{}.ffn_down.weight": ("layers.{}.mlp.down", "linear"),
}
LLAMA = ArchTable(
    config=_llama_config,
    tensors=_DENSE | {"blk.{}.ffn_norm.weight": ("layers.{}.mlp_norm", "norm")},
    unpermute={"layers.{}.attn.q": "num_attention_heads", "layers.{}.attn.k": "num_key_value_heads"},
)


# --- qwen3moe and olmoe -----------------------------------------------------------------------
def _sparse_moe_config(m: GGUFMeta, model_type: str, renormalise: bool) -> dict:
    c = m.common(model_type)
    _full_rope(m, c["head_dim"])
    moe = m.layers_with("ffn_gate_inp.weight")
    return c | {
        "intermediate_size": int(m.scalar("feed_forward_length", 0)),
        "moe_intermediate_size": int(m.get("expert_feed_forward_length", 0)),
        "num_key_value_heads": int(m.scalar("attention.head_count_kv", c["num_attention_heads"])),
        "rope_theta": float(m.get("rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling(m),
        "num_experts": int(m.req("expert_count")),
        "num_experts_per_tok": int(m.req("expert_used_count")),
        "norm_topk_prob": bool(m.get("expert_weights_norm", renormalise)),
        "mlp_only_layers": [i for i in range(c["num_hidden_layers"]) if i not in moe],
        "decoder_sparse_step": 1,
        "hidden_act": "silu",
    }


def _qwen3moe_config(m: GGUFMeta) -> dict:
    return _sparse_moe_config(m, "qwen3_moe", renormalise=True)


def _olmoe_config(m: GGUFMeta) -> dict:
    clamp = float(m.get("attention.clamp_kqv", 0.0))
    return _sparse_moe_config(m, "olmoe", renormalise=False) | {"clip_qkv": clamp if clamp > 0 else None}


_EXPERTS = {
    "blk.{}.ffn_gate_exps.weight": ("experts:{}:gate", "expert"),
    "blk.{}.ffn_up_exps.weight": ("experts:{}:up", "expert"),
    "blk.{}.ffn_down_exps.weight": ("experts:{}:down", "expert"),
}
_SPARSE_MOE = (
    _DENSE
    | _EXPERTS
    | {
        "blk.{}.ffn_norm.weight": ("layers.{}.mlp_norm", "norm"),
        "blk.{}.attn_q_norm.weight": ("layers.{}.attn.q_norm", "norm"),
        "blk.{}.attn_k_norm.weight": ("layers.{}.attn.k_norm", "norm"),
        "blk.{}.ffn_gate_inp.weight": ("layers.{}.router", "router"),
    }
)
QWEN3MOE = ArchTable(config=_qwen3moe_config, tensors=_SPARSE_MOE)
OLMOE = ArchTable(config=_olmoe_config, tensors=_SPARSE_MOE)


# --- gemma4 -----------------------------------------------------------------------------------
def _gemma4_config(m: GGUFMeta) -> dict:
    c = m.common("gemma4")
    n = c["num_hidden_layers"]
    swa = m.req("attention.sliding_window_pattern")
    swa = list(swa) if isinstance(swa, list) else [bool(swa)] * n
    if len(swa) != n:
        raise ConvertError(f"{m.src}: gemma4.attention.sliding_window_pattern has {len(swa)} entries for {n} layers")
    kv = m.req("attention.head_count_kv")
    kv = list(kv) if isinstance(kv, list) else [kv] * n
    kv_swa = {int(k) for k, s in zip(kv, swa) if s} or {int(kv[0])}
    kv_full = {int(k) for k, s in zip(kv, swa) if not s} or kv_swa
    if len(kv_swa) != 1 or len(kv_full) != 1:
        raise ConvertError(f"{m.src}: gemma4.attention.head_count_kv {kv} varies within a layer type; not supported")
    head_swa = int(m.get("attention.key_length_swa") or c["head_dim"])
    head_full = int(m.get("attention.key_length") or head_swa)
    full = [i for i in range(n) if not swa[i]]
    # full layers without attn_v share K as V (attention_k_eq_v)
    k_eq_v = bool(full) and not any(f"blk.{i}.attn_v.weight" in m.tensors for i in full)
    n_experts = int(m.get("expert_count", 0))
    return c | {
        "head_dim": head_swa,
        "global_head_dim": head_full,
        "num_key_value_heads": kv_swa.pop(),
        "num_global_key_value_heads": kv_full.pop(),
        "attention_k_eq_v": k_eq_v,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in swa],
        "sliding_window": int(m.req("attention.sliding_window")),
        "intermediate_size": int(m.scalar("feed_forward_length")),
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": m.get("final_logit_softcapping"),
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": float(m.get("rope.freq_base_swa", 10000.0)),
                **_swa_partial(m, head_swa),
            },
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": _proportional_factor(m, head_full),
                "rope_theta": float(m.get("rope.freq_base", 1_000_000.0)),
            },
        },
        "enable_moe_block": n_experts > 0,
        "num_experts": n_experts,
        "top_k_experts": int(m.get("expert_used_count", 0)),
        "moe_intermediate_size": int(m.get("expert_feed_forward_length", 0)),
        "hidden_size_per_layer_input": int(m.get("embedding_length_per_layer_input", 0)),
        "num_kv_shared_layers": int(m.get("attention.shared_kv_layers", 0)),
    }


def _swa_partial(m: GGUFMeta, head_dim: int) -> dict:
    rot = int(m.get("rope.dimension_count_swa", head_dim))
    return {} if rot == head_dim else {"partial_rotary_factor": rot / head_dim}


def _proportional_factor(m: GGUFMeta, head_dim: int) -> float:
    """Full layers' rotated fraction, from `rope_freqs`: 1.0 for each rotated pair, 1e30 for the others."""
    t = m.tensors.get("rope_freqs.weight")
    if t is None:
        return 1.0
    f = np.asarray(t.data, np.float32).reshape(-1)
    rot = int((f == 1.0).sum())
    if f.size != head_dim // 2 or not (f[:rot] == 1.0).all() or not (f[rot:] >= 1e29).all():
        raise ConvertError(
            f"{m.src}: rope_freqs.weight is not a proportional-RoPE mask for head size {head_dim}; "
            "this Gemma 4 variant is not supported"
        )
    return 2 * rot / head_dim


def _gemma4_extra(a) -> dict[str, tuple]:
    H, s = a.hidden_size, {}
    for i in range(a.num_hidden_layers):
        for n in ("attn_norm", "post_attn_norm", "mlp_norm", "post_ffn_norm"):
            s[f"layers.{i}.{n}"] = (H,)
        s[f"layers.{i}.layer_scalar"] = (1,)
        if a.is_moe(i):
            for n in ("post_mlp_norm", "moe_norm", "post_moe_norm"):
                s[f"layers.{i}.{n}"] = (H,)
    return s


GEMMA4 = ArchTable(
    config=_gemma4_config,
    tensors=_DENSE
    | {
        "blk.{}.attn_q_norm.weight": ("layers.{}.attn.q_norm", "norm"),
        "blk.{}.attn_k_norm.weight": ("layers.{}.attn.k_norm", "norm"),
        "blk.{}.post_attention_norm.weight": ("layers.{}.post_attn_norm", "norm"),
        "blk.{}.ffn_norm.weight": ("layers.{}.mlp_norm", "norm"),
        "blk.{}.post_ffw_norm.weight": ("layers.{}.post_ffn_norm", "norm"),
        "blk.{}.post_ffw_norm_1.weight": ("layers.{}.post_mlp_norm", "norm"),
        "blk.{}.pre_ffw_norm_2.weight": ("layers.{}.moe_norm", "norm"),
        "blk.{}.post_ffw_norm_2.weight": ("layers.{}.post_moe_norm", "norm"),
        "blk.{}.layer_output_scale.weight": ("layers.{}.layer_scalar", "norm"),
        "blk.{}.ffn_gate_inp.weight": ("layers.{}.router", "router"),
        "blk.{}.ffn_gate_inp.scale": ("layers.{}.router_scale", "norm"),
        "blk.{}.ffn_down_exps.scale": ("layers.{}.router_expert_scale", "norm"),
        "blk.{}.ffn_gate_up_exps.weight": ("experts:{}:gate_up", "expert"),
        "blk.{}.ffn_down_exps.weight": ("experts:{}:down", "expert"),
    },
    skip=frozenset({"rope_freqs.weight"}),
    extra_shapes=_gemma4_extra,
)

ARCHITECTURES: dict[str, ArchTable] = {"llama": LLAMA, "qwen3moe": QWEN3MOE, "olmoe": OLMOE, "gemma4": GEMMA4}
