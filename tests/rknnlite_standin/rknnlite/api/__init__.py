"""A stand-in for rknn-toolkit-lite2's `rknnlite.api.RKNNLite`, for the tests only (put on sys.path by
the `rknnlite_standin` fixture). RKNNLite exists only as aarch64 wheels that drive the board's NPU, and
nothing off the board can execute a `.rknn` file: so this is not the runtime, it is its contract.

What it enforces, as the documented API does (0 for success, -1 for failure; `inference` returns None
on failure):
- the constants NPU_CORE_AUTO/0/1/2/0_1/0_1_2/ALL; `init_runtime` refuses any other core mask, a second
  init, and an init before `load_rknn`;
- `load_rknn` refuses a missing file, one that is not an RKNN model (its magic), and a second load;
- `inference(inputs=[…])` refuses before init and after `release`, and checks the inputs' count, dtype
  (float32, the graph's) and shape against the graph.

How it computes: `rkmojo npu build --keep-onnx` keeps beside each `.rknn` the ONNX it was compiled from,
whose metadata names the precision; the stand-in evaluates that ONNX with onnx's reference evaluator.
For fp16 graphs the inputs, every MatMul's operands and result, and the outputs are rounded to fp16
(the NPU's arithmetic; the elementwise ops run in fp32 here). For w8a8 graphs each MatMul's weight is
rounded per output channel to int8 and its activation per tensor to int8 with the chunk's own range
(the real graph uses scales calibrated at build time: this is an approximation, not the simulator).

`RKNNLITE_STANDIN_FAULT=inference` makes every `inference` fail (the runtime-failure tests).
"""

from __future__ import annotations

import os

import numpy as np

PRECISION_KEY = "rkmojo.precision"


def _fp16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _int8(a: np.ndarray, axis) -> np.ndarray:
    """Symmetric int8 rounding of `a` with one scale per slice along `axis` (None: one for all)."""
    scale = np.max(np.abs(a), axis=axis, keepdims=axis is not None) / 127.0
    scale = np.where(scale == 0, 1.0, scale)
    return (np.clip(np.round(a / scale), -127, 127) * scale).astype(np.float32)


def _matmul_op(precision: str):
    from onnx.reference.op_run import OpRun

    class MatMul(OpRun):
        op_domain = ""

        def _run(self, a, b):
            if precision == "fp16":
                return (_fp16(np.matmul(_fp16(a), _fp16(b))),)
            return (_fp16(np.matmul(_int8(a, None), _int8(b, 0))),)  # b [in, out]: a scale per out channel

    return MatMul


class RKNNLite:
    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xFFFF
    _MASKS = (NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_2, NPU_CORE_0_1, NPU_CORE_0_1_2, NPU_CORE_ALL)

    def __init__(self, verbose: bool = False, verbose_file: str | None = None):
        self.verbose = verbose
        self.model = None
        self.precision = None
        self.evaluator = None
        self.core_mask = None
        self.released = False

    def _fail(self, why: str):
        print(f"E RKNNLite (stand-in): {why}")
        return -1

    def load_rknn(self, path: str) -> int:
        if self.released or self.model is not None:
            return self._fail("load_rknn: the object is released or already holds a model")
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            return self._fail(f"load_rknn: {path}: {e.strerror}")
        if magic != b"RKNN":
            return self._fail(f"load_rknn: {path}: not an RKNN model")
        onnx_path = os.path.splitext(path)[0] + ".onnx"
        if not os.path.exists(onnx_path):
            return self._fail(f"load_rknn: {onnx_path}: missing (the stand-in needs `rkmojo npu build --keep-onnx`)")
        import onnx

        self.model = onnx.load(onnx_path)
        self.precision = {p.key: p.value for p in self.model.metadata_props}.get(PRECISION_KEY)
        if self.precision not in ("fp16", "w8a8"):
            self.model = None
            return self._fail(f"load_rknn: {onnx_path}: no {PRECISION_KEY} metadata")
        return 0

    def init_runtime(self, target=None, device_id=None, core_mask: int = NPU_CORE_AUTO) -> int:
        if self.model is None or self.released:
            return self._fail("init_runtime: no model loaded")
        if self.evaluator is not None:
            return self._fail("init_runtime: the runtime is already initialized")
        if core_mask not in self._MASKS:
            return self._fail(f"init_runtime: core_mask {core_mask} is not one of {self._MASKS}")
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(self.model, new_ops=[_matmul_op(self.precision)])
        self.core_mask = core_mask
        return 0

    def inference(self, inputs=None, data_format=None, inputs_pass_through=None):
        if self.evaluator is None or self.released:
            self._fail("inference: the runtime is not initialized (or released)")
            return None
        if os.environ.get("RKNNLITE_STANDIN_FAULT") == "inference":
            self._fail("inference: rknn_run failed (injected fault)")
            return None
        graph_inputs = self.model.graph.input
        if inputs is None or len(inputs) != len(graph_inputs):
            self._fail(f"inference: {len(inputs or [])} inputs given, the graph has {len(graph_inputs)}")
            return None
        feed = {}
        for a, spec in zip(inputs, graph_inputs):
            shape = [d.dim_value for d in spec.type.tensor_type.shape.dim]
            if not isinstance(a, np.ndarray) or a.dtype != np.float32 or list(a.shape) != shape:
                got = (getattr(a, "dtype", type(a)), list(getattr(a, "shape", [])))
                self._fail(f"inference: input {spec.name} is {got}, the graph wants float32 {shape}")
                return None
            feed[spec.name] = _fp16(a) if self.precision == "fp16" else a
        return [_fp16(y) for y in self.evaluator.run(None, feed)]

    def release(self) -> None:
        self.evaluator = None
        self.model = None
        self.released = True
