"""Compute backends for the dense matmuls of a prefill chunk: `cpu` (the kernels, always there) and
`rknpu` (RK3588's NPU through librknnrt's matmul API). A backend is an object with `linear(x, w)` and
`linear_many(x, ws)`, the signatures of `inference.kernels`; the layer code calls it for the matrices
an NPU can take and stays the same whichever backend it has.

`select(cfg)` turns `EngineConfig.backend` (auto | cpu | rknpu) into a backend and the reason for the
choice. `rknpu` is used only after its self-test passes; otherwise the CPU, with one log line saying why.
`auto` is the CPU off aarch64 (no RK3588 there) and where librknnrt.so is absent, and uses only the
precisions that pass the quality gate (`rknpu/quality.py`): fp16; int8 raised SmolLM2's perplexity 11.8 %.
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
AUTO_PRECISIONS = ("fp16",)  # those within the quality gate's 2 % perplexity rise (rknpu/quality.py)


class CpuBackend:
    """The compiled kernels (`inference.kernels`)."""

    name = "cpu"
    linear = staticmethod(kernels.linear)
    linear_many = staticmethod(kernels.linear_many)

    def close(self) -> None:
        pass


CPU = CpuBackend()


@dataclass
class Choice:
    backend: object
    name: str  # "cpu" or "rknpu": what runs the dense matmuls
    reason: str  # why; shown in logs, `/api/ps` and the admin panel


def select(backend: str, *, library: str | None = None, precision: str = "fp16", rows: int = 128) -> Choice:
    """The backend for `EngineConfig.backend`, after the NPU's self-test where one is wanted.

    Args:
        backend: "auto", "cpu" or "rknpu".
        library: librknnrt.so to load (default /usr/lib/librknnrt.so).
        precision: "fp16" or "int8" for the NPU's matmuls.
        rows: the prefill chunk.
    Raises:
        RkmojoError: `backend` is not one of auto, cpu, rknpu.
    """
    if backend not in CHOICES:
        raise RkmojoError(f"backend {backend!r}: choose one of {', '.join(CHOICES)}")
    if backend == "cpu":
        return Choice(CPU, "cpu", "asked for")
    library = library or DEFAULT_LIBRARY
    if backend == "auto":
        if platform.machine() != "aarch64":
            return Choice(CPU, "cpu", f"auto: {platform.machine()} has no RK3588 NPU")
        if not os.path.exists(library):
            return Choice(CPU, "cpu", f"auto: {library} is absent (docs/npu.md)")
        if precision not in AUTO_PRECISIONS:
            log.info("backend: auto uses fp16 on the NPU; %s failed the quality gate (docs/npu.md)", precision)
            precision = "fp16"
    from .rknpu import RknpuBackend

    try:
        npu = RknpuBackend(library, precision=precision, rows=rows)
        versions = npu.self_test()
    except RkmojoError as e:
        log.warning("backend: the CPU runs prefill; the NPU self-test failed: %s", e)
        return Choice(CPU, "cpu", f"NPU self-test failed: {e}")
    log.info("backend: rknpu (%s) passed its self-test", versions)
    return Choice(npu, "rknpu", f"self-test passed ({versions})")
