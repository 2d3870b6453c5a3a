"""librknnrt's matmul API through ctypes: C[M, N] = A[M, K] · B[K, N] on one RK3588 NPU core.

The structures are written from the documented layout (LP64), not from Rockchip's headers, and their
sizes are checked at import: matmul_info 64 bytes, tensor_attr 332, io_attr 996, tensor_mem 40,
quant_params 288. The binding loads whatever library it is given (`/usr/lib/librknnrt.so` on a board,
the stand-in built by the tests here) and never asks which one it has.

What it relies on, per RK3588's type table: FP16×FP16→FP32 and raw INT8×INT8→INT32 (no runtime
quantization parameters: per-channel INT8 is reported to return zeros, so the weight's per-channel
scale and the activation's per-row scale are applied here, on the CPU, after the run). K is padded to
a multiple of 32 (≤ 10240), N to 16 (fp16) or 32 (int8); B goes through the library's own
`rknn_B_normal_layout_to_native_layout`, never our packing.

B's memory is the runtime's (`rknn_create_mem`), or with `import_b` a buffer of ours that the runtime
imports by fd (`rknn_create_mem_from_fd`; `dmabuf.py`: dma-heap on a board, else memfd): an expert slot
the NPU reads where the CPU wrote it. A runtime that refuses the import gets `rknn_create_mem` instead
(`Matmul.imported` says which; the caller logs it).
"""

from __future__ import annotations

import contextlib
import ctypes as C

import numpy as np

from ...errors import RkmojoError
from .dmabuf import DMA_HEAP, SharedBuffer

NAME_LEN, MAX_DIMS = 256, 16
FP16_TO_FP32, INT8_TO_INT32 = 1, 2  # rknn_matmul_type values used here
TYPES = {"fp16": FP16_TO_FP32, "int8": INT8_TO_INT32}
N_ALIGN = {FP16_TO_FP32: 16, INT8_TO_INT32: 32}
K_ALIGN, K_MAX = 32, 10240
CORES = {0: 1, 1: 2, 2: 4}  # core index → rknn_core_mask bit
QUERY_SDK_VERSION = 5
ERRORS = {
    -1: "RKNN_ERR_FAIL",
    -2: "RKNN_ERR_TIMEOUT",
    -3: "RKNN_ERR_DEVICE_UNAVAILABLE",
    -4: "RKNN_ERR_MALLOC_FAIL",
    -5: "RKNN_ERR_PARAM_INVALID",
    -7: "RKNN_ERR_CTX_INVALID",
}


class MatmulInfo(C.Structure):
    _fields_ = [
        ("M", C.c_int32),
        ("K", C.c_int32),
        ("N", C.c_int32),
        ("type", C.c_int32),
        ("B_layout", C.c_int16),
        ("B_quant_type", C.c_int16),
        ("AC_layout", C.c_int16),
        ("AC_quant_type", C.c_int16),
        ("iommu_domain_id", C.c_int32),
        ("group_size", C.c_int16),
        ("reserved", C.c_int8 * 34),
    ]


class TensorAttr(C.Structure):
    _fields_ = [
        ("name", C.c_char * NAME_LEN),
        ("n_dims", C.c_uint32),
        ("dims", C.c_uint32 * MAX_DIMS),
        ("size", C.c_uint32),
        ("type", C.c_int32),
    ]


class IoAttr(C.Structure):
    _fields_ = [("A", TensorAttr), ("B", TensorAttr), ("C", TensorAttr)]


class TensorMem(C.Structure):
    _fields_ = [
        ("virt_addr", C.c_void_p),
        ("phys_addr", C.c_uint64),
        ("fd", C.c_int32),
        ("offset", C.c_int32),
        ("size", C.c_uint32),
        ("flags", C.c_uint32),
        ("priv_data", C.c_void_p),
    ]


class QuantParams(C.Structure):
    _fields_ = [
        ("name", C.c_char * NAME_LEN),
        ("scale", C.POINTER(C.c_float)),
        ("scale_len", C.c_int32),
        ("zp", C.POINTER(C.c_int32)),
        ("zp_len", C.c_int32),
    ]


class SdkVersion(C.Structure):
    _fields_ = [("api_version", C.c_char * 256), ("drv_version", C.c_char * 256)]


for _s, _n in (
    (MatmulInfo, 64),
    (TensorAttr, 332),
    (IoAttr, 996),
    (TensorMem, 40),
    (QuantParams, 288),
    (SdkVersion, 512),
):
    assert C.sizeof(_s) == _n, f"{_s.__name__} is {C.sizeof(_s)} bytes, the runtime's is {_n}"


class NpuError(RkmojoError):
    """A librknnrt call failed: names the call and the runtime's error code."""


def _check(ret: int, call: str) -> None:
    if ret != 0:
        raise NpuError(f"librknnrt: {call} returned {ret} ({ERRORS.get(ret, 'unknown code')})")


class Runtime:
    """The loaded library with typed signatures. One per process is enough; contexts are per core."""

    def __init__(self, path: str = "librknnrt.so"):
        try:
            lib = C.CDLL(path)
        except OSError as e:
            raise NpuError(
                f"librknnrt: cannot load {path}: {e}; install the vendor's librknnrt.so (docs/npu.md)"
            ) from e
        ctx, pmem = C.c_uint64, C.POINTER(TensorMem)
        sig = {
            "rknn_matmul_create": (C.c_int, [C.POINTER(ctx), C.POINTER(MatmulInfo), C.POINTER(IoAttr)]),
            "rknn_matmul_set_io_mem": (C.c_int, [ctx, pmem, C.POINTER(TensorAttr)]),
            "rknn_matmul_set_core_mask": (C.c_int, [ctx, C.c_int32]),
            "rknn_matmul_run": (C.c_int, [ctx]),
            "rknn_matmul_destroy": (C.c_int, [ctx]),
            "rknn_create_mem": (pmem, [ctx, C.c_uint32]),
            "rknn_create_mem_from_fd": (pmem, [ctx, C.c_int32, C.c_void_p, C.c_uint32, C.c_int32]),
            "rknn_destroy_mem": (C.c_int, [ctx, pmem]),
            "rknn_B_normal_layout_to_native_layout": (
                C.c_int,
                [C.c_void_p, C.c_void_p, C.c_int, C.c_int, C.POINTER(MatmulInfo)],
            ),
            "rknn_query": (C.c_int, [ctx, C.c_int, C.c_void_p, C.c_uint32]),
        }
        for name, (res, args) in sig.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise NpuError(
                    f"librknnrt: {path} has no {name}; it is too old for the matmul API (need 1.6 or later)"
                ) from e
            fn.restype, fn.argtypes = res, args
        self.lib, self.path = lib, path


class Matmul:
    """One matmul context: fixed M, K, N and type; B set once (a weight), A run many times.

    Args:
        rt: the loaded `Runtime`.
        M, K, N: rows of A, the shared dimension, columns of B (already aligned: see `padded`).
        kind: "fp16" (FP16×FP16→FP32) or "int8" (INT8×INT8→INT32, raw products).
        core: 0, 1 or 2 (RK3588's cores) or None for the runtime's choice.
        import_b: B in a `SharedBuffer` imported by fd (`imported`: its source, "dma-heap" or "memfd";
            None when the runtime refused the import and B is in `rknn_create_mem`'s memory).
        heap: the dma-heap device for `import_b`.
    Raises:
        NpuError: the runtime refused a call (its error code named).
    """

    def __init__(
        self,
        rt: Runtime,
        M: int,
        K: int,
        N: int,
        kind: str,
        core: int | None = None,
        *,
        import_b: bool = False,
        heap: str = DMA_HEAP,
    ):
        self.rt, self.kind = rt, kind
        self.b_buffer: SharedBuffer | None = None
        self.imported: str | None = None
        self.info = MatmulInfo(M=M, K=K, N=N, type=TYPES[kind], B_layout=1)
        self.io = IoAttr()
        self.ctx = C.c_uint64(0)
        lib = rt.lib
        _check(
            lib.rknn_matmul_create(C.byref(self.ctx), C.byref(self.info), C.byref(self.io)),
            f"rknn_matmul_create(M={M}, K={K}, N={N}, {kind})",
        )
        self.mems = []
        try:
            if core is not None:
                _check(lib.rknn_matmul_set_core_mask(self.ctx, CORES[core]), f"rknn_matmul_set_core_mask({core})")
            self.a = self._mem(self.io.A)
            self.b = self._import(self.io.B, heap) if import_b else None
            if self.b is None:
                self.b = self._mem(self.io.B)
            self.c = self._mem(self.io.C)
        except BaseException:
            self.close()
            raise
        in_dt = np.float16 if kind == "fp16" else np.int8
        self.a_view = self._view(self.a, in_dt, (M, K))
        self.c_view = self._view(self.c, np.float32 if kind == "fp16" else np.int32, (M, N))

    def _mem(self, attr: TensorAttr):
        mem = self.rt.lib.rknn_create_mem(self.ctx, attr.size)
        if not mem:
            raise NpuError(f"librknnrt: rknn_create_mem({attr.size}) for {attr.name.decode()} failed")
        return self._bind(mem, attr)

    def _import(self, attr: TensorAttr, heap: str):
        """attr's memory in a SharedBuffer imported by fd, or None when the runtime refuses the import."""
        try:
            buf = SharedBuffer(attr.size, heap)
        except OSError:  # no fd or mapping to be had (EMFILE, ENOMEM): the runtime's memory, as when refused
            return None
        mem = self.rt.lib.rknn_create_mem_from_fd(self.ctx, buf.fd, buf.addr, attr.size, 0)
        if mem and self.rt.lib.rknn_matmul_set_io_mem(self.ctx, mem, C.byref(attr)) == 0:
            self.mems.append(mem)
            self.b_buffer, self.imported = buf, buf.source
            return mem
        if mem:
            self.rt.lib.rknn_destroy_mem(self.ctx, mem)
        buf.close()
        return None

    def _bind(self, mem, attr: TensorAttr):
        self.mems.append(mem)
        _check(
            self.rt.lib.rknn_matmul_set_io_mem(self.ctx, mem, C.byref(attr)),
            f"rknn_matmul_set_io_mem({attr.name.decode()})",
        )
        return mem

    @staticmethod
    def _view(mem, dtype, shape) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = (C.c_uint8 * n).from_address(mem.contents.virt_addr)
        return np.frombuffer(buf, dtype).reshape(shape)

    def set_b(self, b: np.ndarray) -> None:
        """B [K, N] in normal (row-major) layout, converted by the library into its native layout."""
        b = np.ascontiguousarray(b, np.float16 if self.kind == "fp16" else np.int8)
        assert b.shape == (self.info.K, self.info.N)
        with self.b_buffer.write_access() if self.b_buffer else contextlib.nullcontext():
            ret = self.rt.lib.rknn_B_normal_layout_to_native_layout(
                b.ctypes.data, self.b.contents.virt_addr, self.info.K, self.info.N, C.byref(self.info)
            )
        _check(ret, "rknn_B_normal_layout_to_native_layout")

    def run(self, a: np.ndarray) -> np.ndarray:
        """A [M, K] (fp16 or int8 as the context's kind) → a copy of C [M, N] (float32 or int32)."""
        self.a_view[...] = a
        _check(self.rt.lib.rknn_matmul_run(self.ctx), "rknn_matmul_run")
        return self.c_view.copy()

    def sdk_version(self) -> tuple[str, str]:
        """(runtime API version, NPU driver version) as the runtime reports them."""
        v = SdkVersion()
        _check(
            self.rt.lib.rknn_query(self.ctx, QUERY_SDK_VERSION, C.byref(v), C.sizeof(v)),
            "rknn_query(RKNN_QUERY_SDK_VERSION)",
        )
        return v.api_version.decode(), v.drv_version.decode()

    def close(self) -> None:
        if not self.ctx.value:
            return
        for mem in self.mems:
            self.rt.lib.rknn_destroy_mem(self.ctx, mem)
        self.mems = []
        self.rt.lib.rknn_matmul_destroy(self.ctx)
        self.ctx = C.c_uint64(0)
        if self.b_buffer is not None:  # ours, not the runtime's: unmapped and closed after it let go
            self.b_buffer.close()
            self.b_buffer = None


def padded(n: int, align: int) -> int:
    return -(-n // align) * align


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row: (q [T, K] int8, scale [T] float32), x ≈ q × scale."""
    amax = np.abs(x).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8), scale
