"""The `.rknn` graphs of `rkmojo npu build` run by rknn-toolkit-lite2 (`rknnlite.api.RKNNLite`) on the board.

One RKNNLite per graph: `load_rknn`, `init_runtime(core_mask=…)` with the graphs spread over the three
cores in turn, `inference` per prefill chunk (a chunk shorter than the compiled rows is padded with zero
rows; a longer one, or one under `min_rows`, stays on the CPU). The layer code asks for a graph through
`graph(layer, kind, *inputs)` (models/llama.py `qkv`, `o_mlp`; models/qwen3_moe.py and olmoe.py `qkv`,
`o`; models/gemma4.py `qkv`, `o_norm`, `mlp`) and gets its outputs, or None where the CPU computes; attention,
router and experts never leave the CPU.

`max_layers` bounds the layers whose graphs are loaded at once: a layer's graphs are then loaded just
in time, as the chunk reaches the layer, and the least recently used layer's released (each graph holds
its own copy of the weights: docs/npu.md for what that costs on an 8 GB board).

A runtime failure after the self-test (a load, an init or a run that returns an error) releases every
graph and hands the rest of the process to the CPU, with one log line: an answer is never lost.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np

from ... import kernels
from .graphs import INPUTS
from .matmul import NpuError

log = logging.getLogger("inference.backends")
TARGET = "rk3588"
MIN_ROWS = 32  # as the matmul path: the NPU pays off from about 32 rows (published RK3588 results)
SELF_TEST_TOLERANCE = {"fp16": 1e-2, "w8a8": 0.2}  # relative L2; w8a8 as tests/test_rknpu_graphs.py


def rknnlite_class():
    """RKNNLite, or an NpuError saying why it cannot be had (the aarch64 wheel rknn-toolkit-lite2)."""
    try:
        from rknnlite.api import RKNNLite
    except ImportError as e:
        raise NpuError(f"rknnlite is not importable ({e}); install rknn-toolkit-lite2 (aarch64 only)") from None
    return RKNNLite


class _Graph:
    """One graph's RKNNLite, loaded on demand."""

    def __init__(self, cls, path, spec: dict, core_mask: int):
        self.cls, self.path, self.spec, self.core_mask = cls, path, spec, core_mask
        self.rows = spec["inputs"][INPUTS[spec["kind"]][0]][0]
        self.rt = None

    def load(self) -> None:
        rt = self.cls(verbose=False)
        if rt.load_rknn(str(self.path)) != 0:
            rt.release()
            raise NpuError(f"RKNNLite.load_rknn({self.path}) failed; re-run `rkmojo npu build`")
        if rt.init_runtime(core_mask=self.core_mask) != 0:
            rt.release()
            raise NpuError(f"RKNNLite.init_runtime(core_mask={self.core_mask}) failed for {self.path.name}")
        self.rt = rt

    def __call__(self, inputs: tuple) -> list[np.ndarray]:
        T = inputs[0].shape[0]
        padded = []
        for x in inputs:
            p = np.zeros((self.rows, x.shape[-1]), np.float32)
            p[:T] = x
            padded.append(p)
        outs = self.rt.inference(inputs=padded)
        if outs is None or len(outs) != len(self.spec["outputs"]):  # a K = V layer's qkv has no v
            raise NpuError(f"RKNNLite.inference failed for {self.path.name}")
        return [np.asarray(o, np.float32).reshape(self.rows, -1)[:T] for o in outs]

    def release(self) -> None:
        if self.rt is not None:
            self.rt.release()
            self.rt = None


class GraphBackend:
    """The store's `npu/rk3588/` graphs as the dense block of prefill chunks.

    Args:
        store: an opened Store with an `npu.rk3588` manifest section.
        rows: the engine's prefill chunk; graphs compiled for fewer rows are refused.
        min_rows: chunks of fewer rows run on the CPU.
        max_layers: layers whose graphs stay loaded (None: all, loaded at once).
        precisions: the graph precisions allowed (`auto`: those within the quality gate,
            `quality.auto_precisions("graphs")`); None: any.
    Raises:
        NpuError: no graphs, RKNNLite not importable, graphs compiled for a shorter chunk or in a
            precision not allowed, or a graph that does not load.
    """

    name = "rknpu"
    linear = staticmethod(kernels.linear)  # every other matmul stays on the CPU
    linear_many = staticmethod(kernels.linear_many)
    expert_min_rows = None  # routed experts stay with the MoE code's CPU kernels (their path is the matmul backend's)

    def __init__(
        self,
        store,
        *,
        rows: int = 128,
        min_rows: int = MIN_ROWS,
        max_layers: int | None = None,
        precisions: tuple[str, ...] | None = None,
    ):
        section = store.manifest.get("npu", {}).get(TARGET)
        if not section:
            raise NpuError(f"{store.path}: no npu/{TARGET} graphs; build them with `rkmojo npu build`")
        if section["rows"] < rows:
            raise NpuError(
                f"the graphs are compiled for {section['rows']}-row chunks and the engine's chunk is {rows}: "
                f"rebuild with `rkmojo npu build --rows {rows}` or set chunk={section['rows']}"
            )
        if precisions is not None:
            refused = sorted({g["precision"] for g in section["graphs"].values()} - set(precisions))
            if refused:
                from .quality import failed

                raise NpuError(
                    f"auto uses only {'/'.join(precisions) or 'no'} graphs; "
                    + "; ".join(failed("graphs", p) for p in refused)
                    + ": rebuild with `rkmojo npu build --precision auto`, or ask for them with --backend rknpu"
                )
        cls = rknnlite_class()
        cores = (cls.NPU_CORE_0, cls.NPU_CORE_1, cls.NPU_CORE_2)
        self.section, self.min_rows, self.max_layers = section, min_rows, max_layers
        self.graphs: dict[tuple[int, str], _Graph] = {}
        for n, spec in enumerate(section["graphs"].values()):
            path = store.path / "npu" / TARGET / spec["file"]
            self.graphs[spec["layer"], spec["kind"]] = _Graph(cls, path, spec, cores[n % 3])
        self.layers = sorted({layer for layer, _ in self.graphs})
        self.loaded: OrderedDict[int, None] = OrderedDict()  # layers with loaded graphs, least recent first
        self.failed: str | None = None
        if max_layers is None:
            for layer in self.layers:
                self._load(layer)

    def _load(self, layer: int) -> None:
        if layer in self.loaded:
            self.loaded.move_to_end(layer)
            return
        while self.max_layers is not None and len(self.loaded) >= self.max_layers:
            old, _ = self.loaded.popitem(last=False)
            for (lay, _kind), g in self.graphs.items():
                if lay == old:
                    g.release()
        for (lay, _kind), g in self.graphs.items():
            if lay == layer:
                g.load()
        self.loaded[layer] = None

    def graph(self, layer: int, kind: str, *inputs: np.ndarray) -> list[np.ndarray] | None:
        """The graph's outputs for this chunk, or None where the CPU computes it."""
        g = self.graphs.get((layer, kind))
        if g is None or self.failed is not None or not self.min_rows <= inputs[0].shape[0] <= g.rows:
            return None
        try:
            self._load(layer)
            return g(inputs)
        except NpuError as e:
            self.failed = str(e)
            log.warning("backend: the CPU runs prefill from now on; the NPU failed after its self-test: %s", e)
            self.close()
            return None

    def self_test(self, model) -> str:
        """One chunk of the first layer's qkv graph against the CPU layer code.

        Returns:
            "<n> graphs, <toolkit>".
        Raises:
            NpuError: a graph did not run, or differs from the CPU beyond its precision's tolerance.
        """
        layer = self.layers[0]
        g = self.graphs.get((layer, "qkv"))
        if g is None:
            raise NpuError(f"npu/{TARGET}: layer {layer} has no qkv graph to test; re-run `rkmojo npu build`")
        rows = g.rows
        x = np.random.default_rng(0).standard_normal((rows, g.spec["inputs"]["x"][1])).astype(np.float32)
        self._load(layer)
        got = g((x,))
        want = model.qkv(layer, x)  # the model's ops are the CPU's until the backend is chosen
        err = max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(got, want))
        tolerance = SELF_TEST_TOLERANCE[g.spec["precision"]]
        if not err < tolerance:
            raise NpuError(
                f"layer {layer}'s {g.spec['precision']} qkv graph differs from the CPU by {err:.2e} "
                f"(tolerance {tolerance:.0e})"
            )
        return f"{len(self.graphs)} graphs, {self.section['toolkit']}"

    def close(self) -> None:
        for g in self.graphs.values():
            g.release()
        self.loaded.clear()
