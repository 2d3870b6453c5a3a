"""Compute backends for the dense matmuls of a prefill chunk: `cpu` (the kernels, always there) and
`rknpu` (RK3588's NPU: a layer's dense block as `.rknn` graphs run by RKNNLite, or the matmuls through
librknnrt's matmul API). A backend's `graph(layer, kind, *inputs)` gives a whole block's outputs or None. A backend is an object with `linear(x, w)` and
`linear_many(x, ws)`, the signatures of `inference.kernels`; the layer code calls it for the matrices
an NPU can take and stays the same whichever backend it has.

`select(cfg)` turns `EngineConfig.backend` (auto | cpu | rknpu) into a backend and the reason for the
choice. `rknpu` is used only after its self-test passes; otherwise the CPU, with one log line saying why.
`auto` is the CPU off aarch64 (no RK3588 there) and where librknnrt.so is absent, and uses only the
precisions that pass the quality gate (`rknpu/quality.py`'s `auto_precisions`, for graphs and matmuls).
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass

from .. import kernels
from ..errors import RkmojoError

log = logging.getLogger(__name__)
CHOICES = ("auto", "cpu", "rknpu")
PRECISIONS = ("fp16", "int8")
DEFAULT_LIBRARY = "/usr/lib/librknnrt.so"


class CpuBackend:
    """The compiled kernels (`inference.kernels`). Routed experts stay with the MoE code's own grouped
    kernel calls: `expert_min_rows` None (a backend that takes experts has a number there and
    `expert_mlp(x, w, act, key)`)."""

    name = "cpu"
    expert_min_rows = None
    linear = staticmethod(kernels.linear)
    linear_many = staticmethod(kernels.linear_many)

    @staticmethod
    def graph(layer: int, kind: str, *inputs):
        """A whole-block graph's outputs (`rknpu/lite.py`); None: the layer code computes it here."""
        return None

    def close(self) -> None:
        pass


CPU = CpuBackend()


def dense_on_cpu(ops, rows: int) -> bool:
    """True when backend `ops` leaves the dense matmuls (and graphs) of a chunk of `rows` rows to the CPU
    kernels: the CPU itself, or an NPU backend below its `min_rows` (None there: it runs none of them).
    Decode's one row is such a chunk on every backend here."""
    if ops is CPU:
        return True
    least = getattr(ops, "min_rows", 0)
    return least is None or rows < least


@dataclass
class Choice:
    backend: object
    name: str  # "cpu" or "rknpu": what runs the dense matmuls
    reason: str  # why; shown in logs, `/api/ps` and the admin panel


def select(
    backend: str,
    *,
    library: str | None = None,
    precision: str = "fp16",
    rows: int = 128,
    expert_rows: int | None = None,
    calibration=None,
    store=None,
    model=None,
    graph_layers: int | None = None,
) -> Choice:
    """The backend for `EngineConfig.backend`, after the NPU's self-test where one is wanted.

    The NPU is tried as whole-block graphs first (`rknpu/lite.py`: the store has `npu/rk3588/` from
    `rkmojo npu build` and RKNNLite loads), else as matmuls through librknnrt (`rknpu/__init__.py`).
    The matmuls follow the board's calibration for this library, driver and precision
    (`rknpu/calibrate.py`), else the defaults: dense matmuls from 32 rows, routed experts on the CPU.
    (With graphs, the routed experts stay on the CPU.) `auto` takes only graphs and a matmul precision
    within the quality gate (`rknpu/quality.py`: `auto_precisions`); `rknpu` runs what it is asked for.

    Args:
        backend: "auto", "cpu" or "rknpu".
        library: librknnrt.so to load (default /usr/lib/librknnrt.so).
        precision: "fp16" or "int8" for the NPU's matmuls (graphs carry the precision they were built in).
        rows: the prefill chunk.
        expert_rows: routed experts with at least this many rows run on the NPU (overrides the calibration).
        calibration: the calibration file (default: the data directory's npu-calibration.json).
        store, model: the opened store and its model (the graphs and their self-test's CPU reference).
        graph_layers: layers whose graphs stay loaded (None: all).
    Raises:
        RkmojoError: `backend` is not one of auto, cpu, rknpu.
    """
    if backend not in CHOICES:
        raise RkmojoError(f"backend {backend!r}: choose one of {', '.join(CHOICES)}")
    if backend == "cpu":
        return Choice(CPU, "cpu", "asked for")
    if backend == "auto" and platform.machine() != "aarch64":
        return Choice(CPU, "cpu", f"auto: {platform.machine()} has no RK3588 NPU")
    from .rknpu import quality

    graphs_failed = ""
    if store is not None and store.manifest.get("npu"):
        from .rknpu.lite import GraphBackend
        from .rknpu.matmul import NpuError

        graphs = None
        allowed = quality.auto_precisions("graphs") if backend == "auto" else None
        try:
            graphs = GraphBackend(store, rows=rows, max_layers=graph_layers, precisions=allowed)
            about = graphs.self_test(model)
        except NpuError as e:
            if graphs is not None:
                graphs.close()
            log.warning("backend: the NPU graphs are not used: %s", e)
            graphs_failed = f"graphs not used: {e}; "
        else:
            log.info("backend: rknpu graphs (%s) passed their self-test", about)
            return Choice(graphs, "rknpu", f"graphs: self-test passed ({about})")
    library = library or DEFAULT_LIBRARY
    if backend == "auto":
        if not os.path.exists(library):
            return Choice(CPU, "cpu", f"{graphs_failed}auto: {library} is absent (docs/npu.md)")
        allowed = quality.auto_precisions("matmul")
        if not allowed:
            why = "; ".join(quality.failed("matmul", p) for p in PRECISIONS)
            return Choice(CPU, "cpu", f"{graphs_failed}auto: no NPU precision passes the quality gate: {why}")
        if precision not in allowed:
            log.info(
                "backend: auto uses %s on the NPU; %s (docs/npu.md)", allowed[0], quality.failed("matmul", precision)
            )
            precision = allowed[0]
    from .rknpu import RknpuBackend

    try:
        npu = RknpuBackend(library, precision=precision, rows=rows)
        versions = npu.self_test()
    except RkmojoError as e:
        log.warning("backend: the CPU runs prefill; the NPU self-test failed: %s", e)
        return Choice(CPU, "cpu", f"{graphs_failed}NPU self-test failed: {e}")
    from .rknpu import calibration as calfile

    cal = calfile.lookup(calibration or calfile.calibration_path(), library, npu.versions[1], precision)
    if cal is not None:
        npu.min_rows, npu.expert_min_rows = cal.min_rows, cal.expert_min_rows
    if expert_rows is not None:
        npu.expert_min_rows = expert_rows
    dense = f"dense from {npu.min_rows} rows" if npu.min_rows is not None else "dense on the CPU"
    experts = f"experts from {npu.expert_min_rows} rows" if npu.expert_min_rows is not None else "experts on the CPU"
    how = f"{'calibrated' if cal is not None else 'not calibrated'}: {dense}, {experts}"
    log.info("backend: rknpu (%s) passed its self-test; %s", versions, how)
    return Choice(npu, "rknpu", f"{graphs_failed}matmuls: self-test passed ({versions}); {how}")
