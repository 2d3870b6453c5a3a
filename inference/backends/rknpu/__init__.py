"""The `rknpu` backend: the dense matmuls of prefill chunks on RK3588's NPU through librknnrt's matmul
API (`matmul.py`); the `.rknn` graphs of a layer's dense block are built by `graphs.py` and checked on
Rockchip's simulator (`simulate.py`, in the rknn-toolkit2 venv).

Per weight matrix W [N, K] one matmul context with M = the prefill chunk, B = Wᵀ set once, on cores
0, 1, 2 in turn. Chunks of fewer than `min_rows` rows (decode) stay on the CPU: the NPU pays off from
about 32 rows (the default; a board's `rkmojo npu calibrate` sets it, `calibrate.py`). Routed experts
with at least `expert_min_rows` rows of a chunk run on the NPU too (`experts.py`: B re-set per call).
A runtime error after the self-test (a context limit, a failed run) moves everything
back to the CPU for the rest of the process, with one log line: an answer is never lost to the NPU. Precisions:
- fp16: A and B rounded to fp16, C in fp32;
- int8: B = the weight's int8 values (q8 as stored; other kinds quantized per output channel here),
  A = the rows quantized per row; C = raw int32 products × row scale × channel scale, on the CPU.
"""

from __future__ import annotations

import logging

import numpy as np

from ... import kernels
from ...quant import QTensor, quantize
from . import pack
from .experts import NpuExperts
from .experts import fits as expert_fits
from .matmul import K_ALIGN, K_MAX, N_ALIGN, TYPES, Matmul, NpuError, Runtime, padded

log = logging.getLogger("inference.backends")
MIN_ROWS = 32
DRIVER_VERSION = "/sys/kernel/debug/rknpu/version"  # "RKNPU driver: v0.9.x" (debugfs, root only)
SELF_TEST_TOLERANCE = {"fp16": 1e-2, "int8": 5e-2}  # relative L2 against the CPU kernels


class _Weight:
    """One weight's context, its padding and (int8) per-channel scales."""

    def __init__(self, rt: Runtime, w: QTensor, rows: int, kind: str, core: int):
        N, K = w.shape
        self.N, self.K = N, K
        Kp, Np = padded(K, K_ALIGN), padded(N, N_ALIGN[TYPES[kind]])
        self.mm = Matmul(rt, rows, Kp, Np, kind, core)
        b = np.zeros((Kp, Np), np.float16 if kind == "fp16" else np.int8)  # [K, N]: B = Wᵀ
        block, scales = pack.b_block(w, kind)
        b[:K, :N] = block
        self.scales = None if scales is None else np.pad(scales, (0, Np - N))  # [Np]
        self.mm.set_b(b)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return pack.run(self.mm, x, self.scales)[:, : self.N]


class RknpuBackend:
    """`linear`/`linear_many` on the NPU for chunks of at least `min_rows` rows.

    Args:
        library: path of librknnrt.so (or the tests' stand-in).
        precision: "fp16" or "int8".
        rows: the prefill chunk (M of every context); shorter chunks are padded with zero rows.
        min_rows: fewer rows than this run on the CPU; None: every dense matmul does (the board's
            calibration found no row count where the NPU wins).
        expert_min_rows: a routed expert with at least this many rows of a chunk runs on the NPU
            (`expert_mlp`); None: experts stay on the CPU.
    Raises:
        NpuError: the library cannot be loaded or lacks the matmul API.
    """

    name = "rknpu"

    def __init__(
        self,
        library: str,
        *,
        precision: str = "fp16",
        rows: int = 128,
        min_rows: int | None = MIN_ROWS,
        expert_min_rows: int | None = None,
    ):
        if precision not in TYPES:
            raise NpuError(f"NPU precision {precision!r}: choose fp16 or int8")
        self.rt = Runtime(library)
        self.precision, self.rows, self.min_rows = precision, rows, min_rows
        self.expert_min_rows = expert_min_rows
        self.experts = NpuExperts(self.rt, precision, rows)
        self.versions: tuple[str, str] | None = None  # (runtime, driver), read by the self-test
        self._weights: dict[int, _Weight] = {}
        self._keep: list[QTensor] = []  # the weights keyed by id() stay alive while their contexts do
        self.failed: str | None = None  # why the NPU was given up after the self-test

    def _fits(self, x: np.ndarray, w: QTensor) -> bool:
        return (
            self.failed is None
            and self.min_rows is not None
            and self.min_rows <= x.shape[0] <= self.rows
            and len(w.shape) == 2
            and w.shape[1] <= K_MAX
        )

    def _weight(self, w: QTensor) -> _Weight:
        got = self._weights.get(id(w))
        if got is None:
            got = _Weight(self.rt, w, self.rows, self.precision, core=len(self._weights) % 3)
            self._weights[id(w)] = got
            self._keep.append(w)
        return got

    def linear(self, x: np.ndarray, w: QTensor) -> np.ndarray:
        x2 = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
        if not self._fits(x2, w):
            return kernels.linear(x, w)
        try:
            y = self._weight(w)(x2)
        except NpuError as e:
            self._give_up(e)
            return kernels.linear(x, w)
        return y.reshape(*x.shape[:-1], w.shape[0])

    def expert_mlp(self, x: np.ndarray, w: dict[str, QTensor], act, key=None) -> np.ndarray | None:
        """One routed expert, down(act(gate(x)) × up(x)) for x [n, H], on the NPU; None when the NPU
        has been given up (or the shape does not fit it): the caller computes it on the CPU."""
        if self.failed is not None or not (1 <= x.shape[0] <= self.rows) or not expert_fits(w):
            return None
        try:
            return self.experts(np.asarray(x, np.float32), w, act, key)
        except NpuError as e:
            self._give_up(e)
            return None

    def _give_up(self, e: NpuError) -> None:
        self.failed = str(e)
        log.warning("backend: the CPU runs prefill from now on; the NPU failed after its self-test: %s", e)
        self.close()

    def linear_many(self, x: np.ndarray, ws) -> list[np.ndarray]:
        return [self.linear(x, w) for w in ws]

    @staticmethod
    def graph(layer: int, kind: str, *inputs):
        """None: the matmul path runs no whole-block graphs (`lite.py` does)."""
        return None

    def self_test(self) -> str:
        """Read the versions and compute one chunk against the CPU kernels.

        Returns:
            "librknnrt <api>, driver <version>".
        Raises:
            NpuError: a call failed, or the chunk differs from the CPU beyond the precision's tolerance.
        """
        rng = np.random.default_rng(0)
        w = quantize(rng.standard_normal((96, 160)).astype(np.float32) / 8, "q8")  # N, K: padding too
        x = rng.standard_normal((self.rows, 160)).astype(np.float32)
        probe = _Weight(self.rt, w, self.rows, self.precision, core=0)
        try:
            api, drv = self.versions = self._versions(probe.mm)
            got, want = probe(x), kernels.linear(x, w)
        finally:
            probe.mm.close()
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        if not err < SELF_TEST_TOLERANCE[self.precision]:
            raise NpuError(
                f"a {self.rows}-row {self.precision} chunk differs from the CPU by {err:.2e} "
                f"(tolerance {SELF_TEST_TOLERANCE[self.precision]:.0e})"
            )
        return f"librknnrt {api}, driver {drv}"

    @staticmethod
    def _versions(mm: Matmul) -> tuple[str, str]:
        """(runtime, driver) versions: from rknn_query, else the driver's debugfs file (whether the
        real runtime answers RKNN_QUERY_SDK_VERSION on a matmul context is unverified: docs/npu.md)."""
        try:
            return mm.sdk_version()
        except NpuError as e:
            try:
                with open(DRIVER_VERSION) as f:
                    return "unknown", f.read().strip()
            except OSError as e2:
                raise NpuError(f"{e}; and {DRIVER_VERSION}: {e2.strerror}") from e

    def close(self) -> None:
        self.experts.close()
        for wt in self._weights.values():
            wt.mm.close()
        self._weights.clear()
        self._keep.clear()
