"""`rkmojo npu calibrate`: time the CPU kernels against the NPU binding on this board, per shape and row
count, and store the result in the calibration file (`calibration.py`, its contract) that
`backend="auto"`/`"rknpu"` follow.

Thresholds: the smallest row count from which the NPU beat the CPU at every larger measured count,
summed over the shapes of a kind (dense: one chunk's projections; expert: one expert's gate/up/down, B
re-set included, as `experts.py` runs them); None: never. Timings are medians of `repeats` rounds, the
CPU and the NPU interleaved per shape and row count, so that a change of load on the machine hits both.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ... import kernels
from ...errors import RkmojoError
from ...models.base import silu
from ...models.moe import experts_mlp
from ...quant import QTensor, quantize
from .calibration import (
    DENSE,
    EXPERT,
    Calibration,
    Timing,
    calibration_path,
    library_sha256,
    read_entries,
    write_entries,
)

ROWS = (1, 8, 16, 32, 64, 128)


@dataclass
class Shape:
    """What one row of the table times: a dense weight, or one expert's gate/up/down."""

    name: str
    kind: str  # DENSE or EXPERT
    weights: QTensor | dict[str, QTensor]

    @property
    def dims(self) -> str:
        w = self.weights if self.kind == DENSE else self.weights["gate"]
        text = f"{w.shape[0]}×{w.shape[1]} {w.kind}"
        return text if self.kind == DENSE else f"3 × {text}"


def standard_shapes(seed: int = 0) -> list[Shape]:
    """Gemma 4 26B-A4B's matmul shapes (docs: DESIGN) with random q4 weights: q, k/v, o, the shared MLP's
    gate/up and down, and one routed expert (width 704)."""
    rng = np.random.default_rng(seed)

    def q4(n: int, k: int) -> QTensor:
        return quantize((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), "q4")

    H = 2816
    return [
        Shape("q", DENSE, q4(4096, H)),
        Shape("k, v", DENSE, q4(2048, H)),
        Shape("o", DENSE, q4(H, 4096)),
        Shape("mlp gate, up", DENSE, q4(2112, H)),
        Shape("mlp down", DENSE, q4(H, 2112)),
        Shape("expert", EXPERT, {"gate": q4(704, H), "up": q4(704, H), "down": q4(H, 704)}),
    ]


def model_shapes(store) -> list[Shape]:
    """The distinct matmul shapes a store's layers send to a backend, with its own weights: the attention
    projections and dense MLP of its first layer that has them, and its first MoE layer's expert 0."""
    from ...model import load_model

    model = load_model(store)
    seen: dict[tuple, Shape] = {}  # (shape, kind) → its row: names sharing a shape share the row
    for L in model.layers:
        named = [(n, L.get(n)) for n in ("q", "k", "v", "o")]
        mlp = L.get("mlp")
        if isinstance(mlp, dict):
            named += [(f"mlp {n}", mlp.get(n)) for n in ("gate", "up", "down")]
        for name, w in named:
            if not (isinstance(w, QTensor) and len(w.shape) == 2):
                continue
            row = seen.setdefault((w.shape, w.kind), Shape("", DENSE, w))
            if name not in row.name.split(", "):
                row.name = f"{row.name}, {name}" if row.name else name
    out = list(seen.values())
    if store.expert_layers:
        layer = min(store.expert_layers)
        out.append(Shape(f"expert (layer {layer})", EXPERT, store.expert(layer, 0)))
    return out


def _seconds(fn, x) -> float:
    t = time.perf_counter()
    fn(x)
    return time.perf_counter() - t


def measure(npu, shapes: list[Shape], rows=ROWS, repeats: int = 3, act=None) -> list[Timing]:
    """Median seconds per (shape, row count) on the CPU kernels and through `npu` (an `RknpuBackend`).

    Dense: one weight's context of M = npu.rows, as the backend runs it. Expert: gate/up/down through
    `npu.experts` with B re-set on every call (the per-call design, experts.py) against the CPU's
    grouped expert kernels. Rounds interleave the two per shape and row count.
    """
    act = act or silu
    rng = np.random.default_rng(1)
    rows = [r for r in rows if r <= npu.rows]
    cpu = {(i, r): [] for i in range(len(shapes)) for r in rows}
    dev = {(i, r): [] for i in range(len(shapes)) for r in rows}
    runs = {}
    for i, s in enumerate(shapes):
        if s.kind == DENSE:
            ctx = npu._weight(s.weights)
            runs[i] = (lambda x, w=s.weights: kernels.linear(x, w), ctx)
        else:
            runs[i] = (
                lambda x, w=s.weights: experts_mlp([(x, w)], act),
                lambda x, w=s.weights: npu.experts(x, w, act, None),
            )
    with kernels.configured():
        for _ in range(repeats):
            for i, s in enumerate(shapes):
                K = (s.weights if s.kind == DENSE else s.weights["gate"]).shape[1]
                for r in rows:
                    x = rng.standard_normal((r, K)).astype(np.float32)
                    on_cpu, on_npu = runs[i]
                    cpu[(i, r)].append(_seconds(on_cpu, x))
                    dev[(i, r)].append(_seconds(on_npu, x))
    return [
        Timing(
            s.name,
            s.kind,
            s.dims,
            [float(np.median(cpu[(i, r)])) for r in rows],
            [float(np.median(dev[(i, r)])) for r in rows],
        )
        for i, s in enumerate(shapes)
    ]


def threshold(timings: list[Timing], rows: list[int], kind: str) -> int | None:
    """The smallest row count from which the NPU beat the CPU at every larger one (summed over the kind's
    shapes); None when it never did, or nothing of that kind was measured."""
    mine = [t for t in timings if t.kind == kind]
    if not mine:
        return None
    wins = [sum(t.npu_s[j] for t in mine) < sum(t.cpu_s[j] for t in mine) for j in range(len(rows))]
    best = None
    for j in reversed(range(len(rows))):
        if not wins[j]:
            break
        best = rows[j]
    return best


def run_calibration(
    library: str,
    *,
    precision: str = "fp16",
    shapes: list[Shape] | None = None,
    rows=ROWS,
    repeats: int = 3,
    chunk: int = 128,
    path: Path | None = None,
) -> Calibration:
    """Self-test, measure, derive the thresholds, and store the entry (replacing one of the same key).

    Raises:
        NpuError: the library does not load or the self-test fails (nothing is written).
        RkmojoError: the existing calibration file cannot be read (it names the file).
    """
    from . import RknpuBackend

    if repeats < 1 or chunk < 1:
        raise RkmojoError(f"repeats {repeats}, chunk {chunk}: both must be at least 1")
    if not any(1 <= r <= chunk for r in rows):
        raise RkmojoError(f"rows {list(rows)}: give at least one row count from 1 to the chunk ({chunk})")
    path = path or calibration_path()
    existing = read_entries(path)  # an unreadable file stops us before the (long) measurement
    npu = RknpuBackend(library, precision=precision, rows=chunk)
    try:
        npu.self_test()
        runtime, driver = npu.versions
        rows = [r for r in rows if 1 <= r <= chunk]
        timings = measure(npu, shapes if shapes is not None else standard_shapes(), rows, repeats)
    finally:
        npu.close()
    cal = Calibration(
        library=os.path.realpath(library),
        library_sha256=library_sha256(library),
        runtime=runtime,
        driver=driver,
        precision=precision,
        chunk=chunk,
        repeats=repeats,
        rows=list(rows),
        shapes=timings,
        min_rows=threshold(timings, list(rows), DENSE),
        expert_min_rows=threshold(timings, list(rows), EXPERT),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    existing[cal.key] = asdict(cal)
    write_entries(path, existing)
    return cal


def table(cal: Calibration) -> str:
    """The measurement as text: one line per shape and row count, then the thresholds."""
    lines = [f"{'shape':<22} {'dims':<22} {'rows':>5} {'cpu ms':>9} {'npu ms':>9} {'npu/cpu':>8}"]
    for t in cal.shapes:
        for r, c, n in zip(cal.rows, t.cpu_s, t.npu_s):
            lines.append(f"{t.name:<22} {t.dims:<22} {r:>5} {c * 1e3:>9.3f} {n * 1e3:>9.3f} {n / c:>8.2f}")

    def said(v: int | None, what: str) -> str:
        return f"{what} on the NPU from {v} rows" if v is not None else f"{what} stay on the CPU (the NPU never won)"

    lines.append(f"{said(cal.min_rows, 'dense matmuls')}; {said(cal.expert_min_rows, 'routed experts')}")
    return "\n".join(lines)
