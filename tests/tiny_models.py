"""Tiny random checkpoints for tests that need a real MoE store: Qwen3-MoE (2 layers, 16 experts, top-4),
Gemma 4 (the parity test's: 4 layers, sliding and K = V full attention, 16 experts, top-4) and OLMoE (the
parity test's: 3 layers, q/k norms over the whole projection, clip_qkv)."""

from pathlib import Path

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
