"""The quality gate of an NPU precision: perplexity and top-1 agreement against the CPU on one text.

A precision whose perplexity rises more than `MAX_PERPLEXITY_RISE` over the CPU's is not used by
`backend="auto"`. Measured on SmolLM2 over the Zen of Python (203 tokens, 64-row chunks; docs/npu.md):
fp16 −0.00 % with every top-1 token the CPU's; int8 (per-row activations) +11.8 %, top-1 0.73.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_PERPLEXITY_RISE = 0.02


@dataclass
class Quality:
    perplexity: float
    cpu_perplexity: float
    top1_agreement: float  # share of positions whose argmax equals the CPU's

    @property
    def rise(self) -> float:
        return self.perplexity / self.cpu_perplexity - 1.0

    @property
    def passes(self) -> bool:
        return self.rise <= MAX_PERPLEXITY_RISE


def scored(engine, ids: list[int]) -> tuple[float, np.ndarray]:
    """(perplexity of ids[1:] given their prefixes, argmax per position) from a fresh sequence."""
    engine.reset()
    logits = engine.forward(ids, last_only=False).astype(np.float64)  # [T, V]
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean())), logits.argmax(axis=-1)


def measure(npu_engine, cpu_engine, ids: list[int]) -> Quality:
    """Compare two engines on one token sequence (at least 2 tokens)."""
    p, top = scored(npu_engine, ids)
    p0, top0 = scored(cpu_engine, ids)
    return Quality(p, p0, float((top == top0).mean()))
