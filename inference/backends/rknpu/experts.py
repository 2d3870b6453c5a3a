"""Routed experts on the NPU through librknnrt's matmul API: gate/up/down of an expert that a prefill
chunk gives enough rows (`RknpuBackend.expert_min_rows`, from the board's calibration).

How B is set, and why per call rather than per cache slot. An expert's weights sit in a cache slot
(streamed) or in the store's mapping (resident) in the store's format (q4/q8 groups) that the NPU
cannot read, so B is always a converted copy: Wᵀ in fp16 (or int8 + channel scales) in the runtime's
native layout. Contexts per cache slot would hold that copy for every slot of every layer: Gemma 4
26B-A4B's expert is 3 × 704 × 2816 weights, 11.9 MB in fp16 (5.9 MB int8), so 16 slots × 30 layers
would take 5.7 GB (2.9 GB int8) beside the slots themselves: more than an 8 GB board has. So a few
contexts are shared by every layer and expert, and B is re-set (converted + laid out by the library's
`rknn_B_normal_layout_to_native_layout`) when the expert asked for is not the one a context holds.
The layer loop meets each expert once per chunk, so in practice that is once per call: its cost
(`load_seconds`) is part of what the calibration times, and so of the threshold.

Contexts: per (rows bucket, H, F) one pair, gate‖up fused (B = [H, gate | up], one run for both) and
down; M = the smallest of `ROW_BUCKETS` holding the expert's rows (an 8-row expert does not pay for a
128-row product). Both dimensions are padded to 32 (a K multiple and an N multiple of both types).

Each context's B, the expert slot the NPU reads, is a buffer of ours imported by fd
(`rknn_create_mem_from_fd`): a dma-heap buffer on a board (`dmabuf.py`), a memfd elsewhere; a runtime
that refuses the import gets B in `rknn_create_mem`'s memory, with one log line per backend. Filled by
the CPU's conversion today; a store of pre-converted native-layout experts could be read straight
into it (not built: docs/npu.md).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from ...quant import QTensor
from . import pack
from .dmabuf import DMA_HEAP
from .matmul import K_MAX, Matmul, Runtime, padded

log = logging.getLogger("inference.backends")

ROW_BUCKETS = (1, 8, 16, 32, 64, 128)
ALIGN = 32


def bucket(n: int, rows: int) -> int:
    """M of the context for an expert with n ≤ rows rows: the smallest bucket ≥ n, at most `rows`."""
    return min(next((b for b in ROW_BUCKETS if b >= n), rows), rows)


def fits(w: dict[str, QTensor]) -> bool:
    F, H = w["gate"].shape
    return padded(H, ALIGN) <= K_MAX and padded(F, ALIGN) <= K_MAX


class _ExpertContexts:
    """One gate‖up context and one down context of M rows; the expert whose B they hold (`key`)."""

    def __init__(self, rt: Runtime, M: int, H: int, F: int, kind: str, core: int, heap: str = DMA_HEAP):
        self.H, self.F, self.kind = H, F, kind
        self.Hp, self.Fp = padded(H, ALIGN), padded(F, ALIGN)
        slot = {"import_b": True, "heap": heap}
        self.gate_up = Matmul(rt, M, self.Hp, 2 * self.Fp, kind, core, **slot)  # [T, H] → [T, gate | up]
        try:
            self.down = Matmul(rt, M, self.Fp, self.Hp, kind, core, **slot)  # [T, F] → [T, H]
        except BaseException:
            self.gate_up.close()
            raise
        self.key = None
        self.s_gu = self.s_down = None  # int8: channel scales, zero in the padding

    def load(self, w: dict[str, QTensor], key) -> None:
        """Set B of both contexts from the expert's weights (gate, up [F, H]; down [H, F])."""
        H, F, Hp, Fp = self.H, self.F, self.Hp, self.Fp
        dt = np.float16 if self.kind == "fp16" else np.int8
        self.key = None  # a failed load leaves no expert claimed
        b, s = np.zeros((Hp, 2 * Fp), dt), np.zeros(2 * Fp, np.float32)
        for col, name in ((0, "gate"), (Fp, "up")):
            block, scales = pack.b_block(w[name], self.kind)  # [H, F]
            b[:H, col : col + F] = block
            if scales is not None:
                s[col : col + F] = scales
        self.gate_up.set_b(b)
        b, s2 = np.zeros((Fp, Hp), dt), np.zeros(Hp, np.float32)
        block, scales = pack.b_block(w["down"], self.kind)  # [F, H]
        b[:F, :H] = block
        if scales is not None:
            s2[:H] = scales
        self.down.set_b(b)
        self.s_gu, self.s_down = (s, s2) if self.kind == "int8" else (None, None)
        self.key = key

    def __call__(self, x: np.ndarray, act: Callable) -> np.ndarray:
        F, Fp = self.F, self.Fp
        gu = pack.run(self.gate_up, x, self.s_gu)  # [T, 2Fp]
        g, u = np.ascontiguousarray(gu[:, :F]), np.ascontiguousarray(gu[:, Fp : Fp + F])  # [T, F] each
        h = act(g) * u  # as moe.experts_mlp does it on the CPU (contiguous: the same ufunc loops)
        return pack.run(self.down, h, self.s_down)[:, : self.H]  # [T, H]

    def close(self) -> None:
        self.gate_up.close()
        self.down.close()


class NpuExperts:
    """The expert contexts of one backend, made on first use per (rows bucket, H, F).

    Args:
        rt: the loaded runtime.
        kind: "fp16" or "int8".
        rows: the prefill chunk: the largest M.
        heap: the dma-heap device for the slots (a memfd where there is none).
    Attributes:
        imported: the slots' source ("dma-heap" or "memfd"), None where the runtime refused the import.
    """

    def __init__(self, rt: Runtime, kind: str, rows: int, heap: str = DMA_HEAP):
        self.rt, self.kind, self.rows, self.heap = rt, kind, rows, heap
        self.imported: str | None = None
        self._refused = False
        self._ctx: dict[tuple[int, int, int], _ExpertContexts] = {}
        self.calls = self.loads = 0
        self.load_seconds = 0.0  # time spent re-setting B (conversion + the library's layout change)

    def __call__(self, x: np.ndarray, w: dict[str, QTensor], act: Callable, key=None) -> np.ndarray:
        """down(act(gate(x)) × up(x)) for x [n ≤ rows, H] → [n, H]. `key` names the expert's weights
        (e.g. (layer, expert)): a context holding the same key keeps its B; None always re-sets it."""
        F, H = w["gate"].shape
        M = bucket(x.shape[0], self.rows)
        c = self._ctx.get((M, H, F))
        if c is None:
            c = self._ctx[(M, H, F)] = _ExpertContexts(self.rt, M, H, F, self.kind, len(self._ctx) % 3, self.heap)
            self._slots(c)
        if key is None or c.key != key:
            t = time.perf_counter()
            c.load(w, key)
            self.load_seconds += time.perf_counter() - t
            self.loads += 1
        self.calls += 1
        return c(x, act)

    def _slots(self, c: _ExpertContexts) -> None:
        """Note where a new context's slots live; the first refused import logs one line."""
        sources = {c.gate_up.imported, c.down.imported}
        if None in sources and not self._refused:
            log.warning(
                "backend: the runtime refused expert slots imported by fd (rknn_create_mem_from_fd); "
                "their B is in rknn_create_mem's memory"
            )
        self._refused = self._refused or None in sources
        self.imported = None if self._refused else sources.pop()

    def close(self) -> None:
        for c in self._ctx.values():
            c.close()
        self._ctx.clear()
