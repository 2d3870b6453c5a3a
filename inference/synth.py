"""`rkmojo synth`: stores with a real model's shapes and random weights, for benchmarks and tests.

A synthetic store is a real store (written by `StoreWriter`, digested, verifiable) whose config is
the model's own, so the engine runs it exactly as it would run the converted checkpoint: same
tensor kinds (q4 everywhere, the router q8, norms f32), same blob sizes, same reads per token.
Only the values are random, chosen so activations stay finite through every layer: q4 nibbles are
any bytes, scales are small positive fp16 values with bias = −7.5 × scale (centred weights, std ≈
in^-½), norms are ones.

The router decides which experts a token reads, so it is the one knob that changes cache
behaviour: `uniform` gives every expert's router row the same scale (the worst case for a cache);
`skewed` scales the rows of a random permutation of the experts by (rank + 1)^-α, a power law of
expert popularity (α = 0.7: for independent router inputs the 16 most popular of 128 experts take
≈ 58 % of the picks, about what real routers show; `rkmojo bench` reports the share it measured).
The choice is recorded in the manifest's `source`, and every bench result is labelled with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import models
from .errors import RkmojoError
from .quant import Q4_GROUP, QTensor, part_layout
from .store import StoreWriter

ROUTERS = ("uniform", "skewed")
DEFAULT_SKEW = 0.7
# std of a uniform nibble 0..15 (the spread a q4 scale multiplies)
NIBBLE_STD = float(np.sqrt((16**2 - 1) / 12))
INT8_STD = float(np.sqrt((255**2 - 1) / 12))
# Random attention averages its context into a vector every position shares. Where that output
# joins the residual stream unnormalised (Qwen3), it swamps the stream within a few layers and every
# token routes alike (88 % of picks on 1/8 of the experts, "uniform" router); drawn at a fifth of
# the usual scale, hidden states stay token-driven. Gemma 4 post-norms its attention: no change.
ATTN_OUT_SCALE = {"qwen3_moe": 0.2}
# Gemma 4 norms only MoE layers carry
MOE_ONLY_NORMS = {"post_mlp_norm", "moe_norm", "post_moe_norm", "router_scale", "router_expert_scale"}


def _gemma4(layers: int, **c) -> dict:
    c = {
        "model_type": "gemma4_text",
        "num_hidden_layers": layers,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "final_logit_softcapping": 30.0,
        "attention_k_eq_v": True,
        "enable_moe_block": True,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        **c,
    }
    # every 6th layer full attention, and the last one always (as transformers' Gemma4TextConfig forces)
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    types[-1] = "full_attention"
    c["layer_types"] = types
    c["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    }
    return c


def _qwen3_moe(layers: int, **c) -> dict:
    return {
        "model_type": "qwen3_moe",
        "num_hidden_layers": layers,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": False,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        **c,
    }


# name → (architecture, config builder, default layer count)
SHAPES = {
    # Gemma 4 26B-A4B: 128 experts of 3 × 2816 × 704, top-8, a dense MLP of 2112 beside them
    "gemma4-26b-a4b": (
        "gemma4",
        lambda n: _gemma4(
            n,
            hidden_size=2816,
            intermediate_size=2112,
            moe_intermediate_size=704,
            num_experts=128,
            top_k_experts=8,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            global_head_dim=512,
            num_global_key_value_heads=2,
            sliding_window=1024,
            vocab_size=262_144,
            max_position_embeddings=262_144,
        ),
        30,
    ),
    # Qwen3-30B-A3B: 48 layers of 128 experts of 3 × 2048 × 768, top-8, untied vocab 151,936
    "qwen3-30b-a3b": (
        "qwen3_moe",
        lambda n: _qwen3_moe(
            n,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=151_936,
            max_position_embeddings=40_960,
        ),
        48,
    ),
    # test-sized variants with the same structure (sliding + full layers, K = V, shared MLP)
    "tiny-gemma4": (
        "gemma4",
        lambda n: _gemma4(
            n,
            hidden_size=256,
            intermediate_size=192,
            moe_intermediate_size=128,
            num_experts=16,
            top_k_experts=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            global_head_dim=128,
            num_global_key_value_heads=1,
            sliding_window=32,
            vocab_size=1024,
            max_position_embeddings=4096,
        ),
        4,
    ),
    "tiny-qwen3-moe": (
        "qwen3_moe",
        lambda n: _qwen3_moe(
            n,
            hidden_size=256,
            intermediate_size=384,
            moe_intermediate_size=128,
            num_experts=16,
            num_experts_per_tok=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            vocab_size=1024,
            max_position_embeddings=4096,
        ),
        4,
    ),
}


def shape_config(shape: str, layers: int | None = None) -> tuple[str, dict]:
    """(architecture, config) of a named shape, optionally with fewer or more layers.

    Raises:
        RkmojoError: unknown shape or a layer count below 1.
    """
    if shape not in SHAPES:
        raise RkmojoError(f"--shape {shape}: choose one of {', '.join(SHAPES)}")
    arch, build, default = SHAPES[shape]
    n = default if layers is None else layers
    if n < 1:
        raise RkmojoError(f"--layers {layers}: a model needs at least 1 layer")
    return arch, build(n)


def dense_shapes(arch, args, cfg: dict) -> dict[str, tuple]:
    """Every resident tensor the architecture loads: its `expected_shapes`, plus the per-layer norms
    its name table lists but `expected_shapes` leaves out (Gemma 4's sandwich norms, layer_scalar)."""
    shapes = dict(arch.expected_shapes(args))
    if cfg.get("tie_word_embeddings"):
        shapes.pop("lm_head", None)
    for _, internal, cls in arch.HF_NAMES:
        if cls != "norm" or not internal or "{0}" not in internal:
            continue
        for i in range(args.num_hidden_layers):
            name = internal.format(i)
            if name in shapes or (name.rsplit(".", 1)[-1] in MOE_ONLY_NORMS and not args.is_moe(i)):
                continue
            shapes[name] = (1,) if name.endswith("layer_scalar") else (args.hidden_size,)
    return shapes


class RandomWeights:
    """Random tensors in their stored kinds, drawn from one seeded generator (SFC64: fast in bulk)."""

    def __init__(self, seed):
        self.rng = np.random.Generator(np.random.SFC64(seed))

    def bytes(self, n: int) -> np.ndarray:
        words = self.rng.integers(0, 2**64 - 1, -(-n // 8), dtype=np.uint64, endpoint=True)
        return words.view(np.uint8)[:n]

    def q4(self, shape: tuple[int, int], std: float) -> QTensor:
        """Centred 4-bit affine weights with element std ≈ `std` (scales vary ±50 % per group)."""
        out, inn = shape
        layout = part_layout("q4", shape)
        q = self.bytes(out * inn // 2).reshape(layout["q"][1])
        scale = (std / NIBBLE_STD) * self.rng.uniform(0.5, 1.5, layout["scales"][1])
        scales = scale.astype(np.float16)
        biases = (scales.astype(np.float32) * -7.5).astype(np.float16)
        return QTensor("q4", shape, {"q": q, "scales": scales, "biases": biases})

    def q8(self, shape: tuple[int, int], std: float, row_factor: np.ndarray | None = None) -> QTensor:
        out, inn = shape
        q = self.bytes(out * inn).view(np.int8).reshape(out, inn).copy()
        q[q == -128] = -127  # symmetric int8, as the quantizer writes it
        scales = np.full(out, std / INT8_STD, np.float32)
        if row_factor is not None:
            scales *= row_factor.astype(np.float32)
        return QTensor("q8", shape, {"q": q, "scales": scales})

    def popularity(self, n: int, alpha: float) -> np.ndarray:
        """Router row scales for a power law of expert popularity over a random order of experts."""
        f = (np.arange(n) + 1.0) ** -alpha
        f /= np.sqrt(np.mean(f * f))
        out = np.empty(n)
        out[self.rng.permutation(n)] = f
        return out


def _kind(name: str, shape: tuple) -> str:
    """Storage kind of a resident tensor: norms f32, the router q8, every matrix q4 (q8 where rows don't group by 64)."""
    if len(shape) == 1:
        return "f32"
    if name.endswith(".router") or shape[1] % Q4_GROUP:
        return "q8"
    return "q4"


def _dense_tensor(
    rw: RandomWeights, name: str, shape: tuple, arch_name: str, hidden: int, router_factor: np.ndarray | None
) -> QTensor:
    kind = _kind(name, shape)
    if kind == "f32":
        return QTensor("f32", shape, {"w": np.ones(shape, np.float32)})
    if name.endswith(".router"):
        # Gemma 4 feeds the router x × hidden^-½, Qwen3 feeds it the normed x: logits of std ≈ 1 both ways
        std = 1.0 if arch_name == "gemma4" else hidden**-0.5
        return rw.q8(shape, std, router_factor)
    # an untied input embedding gets unit rows, so tokens stay distinct after the first norm
    std = 1.0 if name == "embed" and arch_name != "gemma4" else shape[1] ** -0.5
    if name.endswith(".attn.o"):
        std *= ATTN_OUT_SCALE.get(arch_name, 1.0)
    return rw.q4(shape, std) if kind == "q4" else rw.q8(shape, std)


def synth_store(
    out: str | os.PathLike,
    shape: str,
    *,
    layers: int | None = None,
    router: str = "uniform",
    skew: float = DEFAULT_SKEW,
    seed: int = 0,
    progress: bool = True,
    repack: bool = True,
) -> Path:
    """Write a store of the named shape with random weights.

    Args:
        out: the store directory to create (must not exist; its parent must).
        shape: a key of `SHAPES`.
        layers: override the layer count (smaller variants of a real shape).
        router: "uniform" or "skewed" (power-law expert popularity with exponent `skew`).
        seed: all values derive from it; the same arguments give the same bytes.
        repack: experts in the kernels' repacked layout (q4r), as `rkmojo convert` writes them; False:
            plain q4, as an older store (what `rkmojo repack` rewrites).
    Returns:
        The store path.
    Raises:
        RkmojoError: bad shape, layer count or router; ConvertError from the writer (path exists).
    """
    from .convert.progress import progress_bar

    if router not in ROUTERS:
        raise RkmojoError(f"--router {router}: choose one of {', '.join(ROUTERS)}")
    arch_name, cfg = shape_config(shape, layers)
    arch = models.get(arch_name)
    args = arch.Args.from_dict(cfg)
    shapes = dense_shapes(arch, args, cfg)
    expert_shapes = args.expert_shapes()
    moe = args.moe_layers()
    weights_seed, router_seed = np.random.SeedSequence(seed).spawn(2)
    rw = RandomWeights(weights_seed)
    # popularity from its own stream: uniform and skewed stores of one seed differ only in router scales
    pop = RandomWeights(router_seed)
    factors = {i: pop.popularity(args.num_experts, skew) if router == "skewed" else None for i in moe}

    kinds = {"default": "q4", "embedding": "q4", "router": "q8", "norm": "f32"}
    dense_bytes = sum(_nbytes(_kind(n, s), s) for n, s in shapes.items())
    expert_bytes = len(moe) * args.num_experts * sum(_nbytes("q4", s) for s in expert_shapes.values())
    with (
        StoreWriter(out, arch_name, cfg, repack_experts=repack) as w,
        progress_bar(dense_bytes + expert_bytes, f"synth {shape}", progress) as bar,
    ):
        w.set_quantization(kinds)
        w.set_source(
            {
                "type": "synthetic",
                "shape": shape,
                "layers": args.num_hidden_layers,
                "router": router,
                "skew": skew if router == "skewed" else None,
                "seed": seed,
            }
        )
        for name, s in shapes.items():
            layer = int(name.split(".")[1]) if name.startswith("layers.") else None
            t = _dense_tensor(rw, name, s, arch_name, args.hidden_size, factors.get(layer))
            w.add_dense(name, t)
            bar.update(t.nbytes)
        for layer in moe:
            w.begin_expert_layer(layer, args.num_experts, {n: ("q4", s) for n, s in expert_shapes.items()})
            for e in range(args.num_experts):
                for n, s in expert_shapes.items():
                    t = rw.q4(s, s[1] ** -0.5)
                    w.add_expert_tensor(layer, e, n, t)
                    bar.update(t.nbytes)
        bar.set_description(f"synth {shape}: digests")
        return w.finish()


def _nbytes(kind: str, shape: tuple) -> int:
    return sum(int(np.prod(s)) * np.dtype(d).itemsize for d, s in part_layout(kind, shape).values())
