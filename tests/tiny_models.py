"""Tiny random checkpoints for tests that need a real MoE store: Qwen3-MoE (2 layers, 16 experts, top-4),
Gemma 4 (the parity test's: 4 layers, sliding and K = V full attention, 16 experts, top-4) and OLMoE (the
parity test's: 3 layers, q/k norms over the whole projection, clip_qkv)."""

from pathlib import Path

import numpy as np

import torch
import transformers

from parity import build_checkpoint, randomize


def tiny_qwen3_moe(
    out: Path, *, vocab: int = 256, hidden: int = 64, shard: str | None = None, dtype: torch.dtype = torch.float32
) -> Path:
    """Save the checkpoint at `out` (in shards of `shard`, e.g. "10MB", when given); returns `out`."""
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=16,
        num_experts_per_tok=4,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    randomize(model, 0)
    model.to(dtype).save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    return out


def tiny_gemma4(out: Path, *, vocab: int = 512) -> Path:
    """Save test_parity's tiny Gemma 4 with `vocab` ids at `out`; returns `out`."""
    from test_parity import gemma4

    return _parity_checkpoint(gemma4, out, vocab)


def tiny_olmoe(out: Path, *, vocab: int = 512) -> Path:
    """Save test_parity's tiny OLMoE with `vocab` ids at `out`; returns `out`."""
    from test_parity import olmoe

    return _parity_checkpoint(olmoe, out, vocab)


def _parity_checkpoint(arch, out: Path, vocab: int) -> Path:
    cls, cfg = arch()
    cfg.vocab_size = vocab
    return build_checkpoint(cls, cfg, out)


def tiny_parity_model(name: str, out: Path, *, vocab: int = 512, **overrides) -> Path:
    """Save test_parity's tiny `name` model ("qwen3_moe", "olmoe", "gemma4", ...) with `vocab` ids and the
    config attributes in `overrides` set (e.g. hidden_size=256 for rows that K-quants can hold); returns `out`."""
    from test_parity import ARCHS

    cls, cfg = ARCHS[name]()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg.vocab_size = vocab
    return build_checkpoint(cls, cfg, out)


# --- reference K-quantizers (ggml's block layouts, QK_K = 256) -----------------------------------
# Simple min/max scales rather than llama.cpp's searched ones: the layout is what a converter reads, and
# `gguf.quants.dequantize` must give back exactly `kquant_values` of what these write.
QK_K = 256


def _f16(x):
    return np.asarray(x, np.float32).astype(np.float16)


def _pack_scale_min(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 scale bytes from 8 six-bit scales and 8 six-bit mins per super-block ([n, 8] each)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _affine_k(w: np.ndarray, bits: int):
    """Per super-block: f16 d and dmin, 6-bit scales and mins of 8 sub-blocks of 32, and codes 0..2^bits-1."""
    x = w.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(axis=2), 0.0)  # the block's minimum is −dmin·m ≤ 0
    scale = (x.max(axis=2) - lo) / (2**bits - 1)
    d = _f16(scale.max(axis=1) / 63)
    dmin = _f16(-lo.min(axis=1) / 63)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63)
    mn = np.clip(np.rint(np.divide(-lo, dmf, out=np.zeros_like(lo), where=dmf > 0)), 0, 63)
    step = (df * sc)[..., None]
    q = np.divide(x + (dmf * mn)[..., None], step, out=np.zeros_like(x), where=step > 0)
    q = np.clip(np.rint(q), 0, 2**bits - 1).astype(np.uint8)
    return d, dmin, sc, mn, q  # q: [n, 8, 32]


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """`w` [rows, n] (n a multiple of 256) as Q4_K blocks [rows, n/256 × 144]."""
    rows = w.shape[0]
    d, dmin, sc, mn, q = _affine_k(w, 4)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # chunk k: sub-block 2k low, 2k+1 high
    blocks = np.concatenate([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scale_min(sc, mn), qs], 1)
    return blocks.reshape(rows, -1)


def quantize_q5_k(w: np.ndarray) -> np.ndarray:
    """`w` [rows, n] as Q5_K blocks [rows, n/256 × 176]: low nibbles as Q4_K, bit 4 of sub-block i in bit i of qh."""
    rows = w.shape[0]
    d, dmin, sc, mn, q = _affine_k(w, 5)
    lo = q & 0x0F
    qs = (lo[:, 0::2] | (lo[:, 1::2] << 4)).reshape(-1, 128)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)  # [n, 32]
    blocks = np.concatenate(
        [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scale_min(sc, mn), qh, qs], 1
    )
    return blocks.reshape(rows, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """`w` [rows, n] as Q6_K blocks [rows, n/256 × 210]: 16 int8 scales of 16 values, codes q − 32 in −32..31."""
    rows = w.shape[0]
    x = w.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(x).max(axis=2) / 31
    d = _f16(scale.max(axis=1) / 127)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), -128, 127)
    step = (df * sc)[..., None]
    q = np.divide(x, step, out=np.zeros_like(x), where=step > 0)
    q = (np.clip(np.rint(q), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [n, half, group, 32]
    lo, hi = q & 0x0F, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)  # [n, 2, 64]
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)  # [n, 2, 32]
    blocks = np.concatenate(
        [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), d[:, None].view(np.uint8)], 1
    )
    return blocks.reshape(rows, -1)


def kquant_values(w: np.ndarray, ty: str) -> np.ndarray:
    """The values the K-quantizer above means `w` to become (ty "Q4_K", "Q5_K" or "Q6_K"), in float32, from
    its own integers and the block formula (value = d·sc·q − dmin·m, or d·sc·(q − 32) for Q6_K)."""
    rows = w.shape[0]
    if ty == "Q6_K":
        x = w.reshape(-1, 16, 16).astype(np.float32)
        scale = np.abs(x).max(axis=2) / 31
        d = _f16(scale.max(axis=1) / 127).astype(np.float32)[:, None]
        sc = np.clip(np.rint(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), -128, 127)
        step = (d * sc)[..., None]
        q = np.clip(np.rint(np.divide(x, step, out=np.zeros_like(x), where=step > 0)), -32, 31)
        return (step * q).reshape(rows, -1)
    d, dmin, sc, mn, q = _affine_k(w, {"Q4_K": 4, "Q5_K": 5}[ty])
    step = (d.astype(np.float32)[:, None] * sc)[..., None]
    return (step * q.astype(np.float32) - (dmin.astype(np.float32)[:, None] * mn)[..., None]).reshape(rows, -1)


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}
