"""The quality gate of an NPU precision: perplexity, top-1 agreement and per-layer error against the CPU.

A precision whose perplexity rises more than `MAX_PERPLEXITY_RISE` over the CPU's, on any model the
gate was measured on, is not used by `backend="auto"` (`auto_precisions`: `select` in
`inference/backends/__init__.py` for the matmul path and the graphs, `rkmojo npu build --precision auto`
for the graphs it compiles). `MEASURED` holds the rises measured over the Zen of Python (a text the
standard library ships), on SmolLM2 (dense) and a tiny random Qwen3-MoE; the tests measure them again
(tests/test_rknpu_quality.py, tests/test_rknpu_backend.py, tests/test_rknpu_lite.py) and fail when a
measurement lands on the other side of the line than this table: the table, and so `auto`, follow the
measurements, never a hope.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_PERPLEXITY_RISE = 0.02
PATHS = ("matmul", "graphs")  # librknnrt's matmul API (fp16, int8); the `.rknn` graphs (fp16, w8a8)
# (path, precision) → {model: perplexity rise over the CPU}; docs/npu.md has the commands and top-1 figures.
# The graphs' w8a8 is the rknnlite stand-in's approximation (per-tensor int8 activations), not the simulator.
MEASURED: dict[tuple[str, str], dict[str, float]] = {
    ("matmul", "fp16"): {"smollm2": -0.0000, "tiny-qwen3-moe": 0.0014},
    ("matmul", "int8"): {"smollm2": 0.118, "tiny-qwen3-moe": 0.0010},
    ("graphs", "fp16"): {"smollm2": 0.0000, "tiny-qwen3-moe": 0.0022},
    ("graphs", "w8a8"): {"smollm2": 0.0562, "tiny-qwen3-moe": 0.0013},
}


def auto_precisions(path: str) -> tuple[str, ...]:
    """The precisions of `path` ("matmul" or "graphs") that `auto` may use: every measured rise within
    MAX_PERPLEXITY_RISE."""
    return tuple(p for (pa, p), rises in MEASURED.items() if pa == path and max(rises.values()) <= MAX_PERPLEXITY_RISE)


def failed(path: str, precision: str) -> str:
    """Why `auto` does not use `precision` on `path`, e.g. "int8 raised smollm2's perplexity +11.8 %"."""
    model, rise = max(MEASURED[path, precision].items(), key=lambda kv: kv[1])
    return f"{precision} raised {model}'s perplexity {rise:+.1%} (the quality gate allows +{MAX_PERPLEXITY_RISE:.0%})"


@dataclass
class Quality:
    perplexity: float
    cpu_perplexity: float
    top1_agreement: float  # share of positions whose argmax equals the CPU's
    layer_errors: list[float] = field(default_factory=list)  # relative L2 of each layer's output h [T, H]

    @property
    def rise(self) -> float:
        return self.perplexity / self.cpu_perplexity - 1.0

    @property
    def passes(self) -> bool:
        return self.rise <= MAX_PERPLEXITY_RISE


def scored(engine, ids: list[int]) -> tuple[float, np.ndarray, list[np.ndarray]]:
    """(perplexity of ids[1:] given their prefixes, argmax per position, each layer's output [T, H]) from a
    fresh sequence. The layers' outputs are taken by wrapping the model's `layer` for this call only."""
    engine.reset()
    model = engine.model
    layer, outs = model.layer, {}

    def spy(i, h, cache, positions):
        out = layer(i, h, cache, positions)
        outs.setdefault(i, []).append(np.array(out, np.float32))
        return out

    model.layer = spy
    try:
        logits = engine.forward(ids, last_only=False).astype(np.float64)  # [T, V]
    finally:
        del model.layer
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean())), logits.argmax(axis=-1), [np.concatenate(outs[i]) for i in sorted(outs)]


def measure(npu_engine, cpu_engine, ids: list[int]) -> Quality:
    """Compare two engines on one token sequence (at least 2 tokens)."""
    p, top, hs = scored(npu_engine, ids)
    p0, top0, hs0 = scored(cpu_engine, ids)
    errs = [float(np.linalg.norm(h - h0) / np.linalg.norm(h0)) for h, h0 in zip(hs, hs0)]
    return Quality(p, p0, float((top == top0).mean()), errs)
