"""Loads the compiled kernels (rkkernels.c) with ctypes and checks every call's arguments.

ctypes rather than a CPython extension API: the kernels are plain C functions, and a ctypes call
releases the GIL for its whole duration, so expert IO threads keep running while a matmul computes.
setuptools still builds the file as the extension `inference.kernels._rkkernels`; we only use its path.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import math
from pathlib import Path

import numpy as np

from ..quant import KINDS, QTensor, part_layout

EXTENSION = "inference.kernels._rkkernels"
BUILD_HINT = "build it with `pip install -e .` (or `python setup.py build_ext --inplace`) in the repo"

# kind → its code in rkkernels.c
_KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
_ERRORS = {1: "invalid kind or shape", 2: "out of memory for the activation scratch"}

# An ndarray's data pointer sits right after the object header (PyArrayObject: PyObject_HEAD, then
# `char *data`, numpy's stable C ABI). Reading it there takes 0.1 µs where `.ctypes.data` takes 1.2 µs,
# which adds up over the hundreds of calls per token. `_check_data_offset` verifies it at import.
_DATA_OFFSET = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)


def _data_fast(a: np.ndarray) -> int:
    return ctypes.c_void_p.from_address(id(a) + _DATA_OFFSET).value or 0


def _data_slow(a: np.ndarray) -> int:
    return a.ctypes.data


def _check_data_offset():
    probe = np.arange(6, dtype=np.float32)
    views = (probe, probe[2:], probe[4:].view(np.uint8))
    if all(_data_fast(v) == v.ctypes.data for v in views):
        return _data_fast
    return _data_slow


_data = _check_data_offset()


def default_library_path() -> Path:
    """Where the built extension lives.

    Raises:
        ImportError: it has not been built.
    """
    spec = importlib.util.find_spec(EXTENSION)
    if spec is None or spec.origin is None:
        raise ImportError(f"the compiled kernels ({EXTENSION}) are missing; {BUILD_HINT}")
    return Path(spec.origin)


@functools.lru_cache(maxsize=4096)
def _layout(kind: str, shape: tuple[int, ...]) -> tuple[tuple[str, np.dtype, int], ...]:
    """(name, dtype, element count) of each part, in the kernel's argument order."""
    return tuple((name, np.dtype(dt), math.prod(shp)) for name, (dt, shp) in part_layout(kind, shape).items())


class KernelLib:
    """One loaded build of rkkernels.c (tests also load other builds, e.g. the portable C one)."""

    def __init__(self, path: str | Path):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise ImportError(f"cannot load the compiled kernels {path}: {e}; {BUILD_HINT}") from e
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.rk_linear.argtypes = [ctypes.c_int, i64, i64, i64, vp, vp, vp, vp, vp]
        lib.rk_linear.restype = ctypes.c_int
        lib.rk_set_threads.argtypes = [ctypes.c_int]
        lib.rk_set_threads.restype = None
        lib.rk_get_threads.argtypes = []
        lib.rk_get_threads.restype = ctypes.c_int
        lib.rk_backend.argtypes = []
        lib.rk_backend.restype = ctypes.c_char_p
        self._lib = lib
        self.path = Path(path)
        self.backend = lib.rk_backend().decode()

    def set_threads(self, n: int) -> None:
        """Threads the kernels split output rows over (results do not depend on it).

        Raises:
            ValueError: `n` is not a positive integer.
        """
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"thread count must be a positive integer, got {n!r}")
        self._lib.rk_set_threads(int(n))

    def get_threads(self) -> int:
        return self._lib.rk_get_threads()

    def linear(self, x: np.ndarray, w: QTensor) -> np.ndarray:
        """y[..., out] = x[..., in] @ W.T in float32 (see `inference.kernels.linear`)."""
        code = _KIND_CODES.get(w.kind)
        if code is None or len(w.shape) != 2:
            raise ValueError(f"linear: needs a matrix [out, in] of kind {', '.join(KINDS)}; got {w.kind} {w.shape}")
        out, inn = w.shape
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim == 0 or x.shape[-1] != inn:
            raise ValueError(f"linear: x has shape {x.shape}, the {w.kind} weight {w.shape} needs [..., {inn}]")
        ptrs = [None, None, None]
        for j, (name, dtype, size) in enumerate(_layout(w.kind, w.shape)):
            p = w.parts[name]
            if p.dtype != dtype or p.size != size or not p.flags.c_contiguous:
                raise ValueError(
                    f"linear: {w.kind} part {name!r} must be C-contiguous {dtype} with {size} elements for "
                    f"shape {w.shape}, got {p.dtype} {p.shape} (contiguous={p.flags.c_contiguous})"
                )
            ptrs[j] = _data(p)
        y = np.empty(x.shape[:-1] + (out,), np.float32)
        T = x.size // inn if inn else math.prod(x.shape[:-1])
        rc = self._lib.rk_linear(code, T, out, inn, _data(x), _data(y), *ptrs)
        if rc:
            raise ValueError(f"linear: the kernel rejected {w.kind} {w.shape} with x {x.shape}: {_ERRORS.get(rc, rc)}")
        return y
