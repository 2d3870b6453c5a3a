"""Loads the compiled kernels (rkkernels.c) and checks every call's arguments.

The kernels are plain C functions, loaded with ctypes. The installed build is also a CPython extension
whose one function, `linear_many`, takes the arrays themselves (buffer protocol): decode makes ~200
calls per token and ctypes' argument conversion took ~3 µs of each. Other builds of the same source
(the portable C one the tests load) are called through ctypes with pointers. Either way the GIL is
released for the whole computation, so expert IO threads keep running while a matmul computes.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import math
import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import options
from ..options import option
from ..quant import KINDS, REPACKED_Q4, REPACKED_Q4_1, REPACKED_Q8_0, QTensor, part_layout

EXTENSION = "inference.kernels._rkkernels"
BUILD_HINT = "build it with `pip install -e .` (or `python setup.py build_ext --inplace`) in the repo"

# kind → its code in rkkernels.c
_KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
RP_FLAG = 32  # RK_RP in rkkernels.c: q4's, q4_1's, q8_0's code with it takes repacked parts (quant.repack_*)
_KIND_CODES[REPACKED_Q4] = _KIND_CODES["q4"] | RP_FLAG
_KIND_CODES[REPACKED_Q4_1] = _KIND_CODES["q4_1"] | RP_FLAG
_KIND_CODES[REPACKED_Q8_0] = _KIND_CODES["q8_0"] | RP_FLAG
_ERRORS = {1: "invalid kind or shape", 2: "out of memory for the activation scratch"}
Q8A = 16  # RK_Q8A in rkkernels.c: a kind code's flag for int8 activations
# float activations (the exact path); int8 per block of 32 (q4, q4_0, q4_1, q8_0 weights) everywhere; int8
# only in the MoE experts' grouped calls (linear_grouped), the bulk of an MoE model's compute; or there and
# in a generated token's dense products too (llama_decode; moe_decode_layer but its router; Gemma 4's calls)
ACTIVATIONS = ("f32", "q8", "experts", "decode")
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
MAX_MATRICES = 16  # per linear_many call (MAX_MATRICES in rkkernels.c)
MAX_GROUPED, GROUP_ROWS = 64, 128  # per linear_grouped call, and rows per matrix (MAX_GROUPED, TILE_T)
# the experts of an rk_moe_experts call: this many int64 fields each (rkmoedecode.c)
MOE_EXPERT_FIELDS = 13
EXPERT_ACTIVATIONS = ("silu", "gelu_tanh")  # rk_moe_experts_act's codes, in order

# An ndarray's data pointer sits right after the object header (PyArrayObject: PyObject_HEAD, then
# `char *data`, numpy's stable C ABI). Reading it there takes 0.1 µs where `.ctypes.data` takes 1.2 µs,
# which adds up over the hundreds of calls per token. `_check_data_offset` verifies it at import.
_DATA_OFFSET = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)


_pointer_at = ctypes.c_void_p.from_address


def _modes(mode: str) -> tuple[str, int, int, int]:
    """(mode, the kind-code flag of linear/linear_many, that of linear_grouped, that of llama_decode).

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in ACTIVATIONS:
        raise ValueError(f"activations {mode!r}: choose one of {', '.join(ACTIVATIONS)}")
    return mode, Q8A if mode == "q8" else 0, 0 if mode == "f32" else Q8A, Q8A if mode in ("q8", "decode") else 0


def _data_fast(a: np.ndarray) -> int:
    return _pointer_at(id(a) + _DATA_OFFSET).value or 0


def _data_slow(a: np.ndarray) -> int:
    return a.ctypes.data


def _check_data_offset():
    probe = np.arange(6, dtype=np.float32)
    views = (probe, probe[2:], probe[4:].view(np.uint8))
    if all(_data_fast(v) == v.ctypes.data for v in views):
        return _data_fast
    return _data_slow


_data = _check_data_offset()


# kernel build name → the build's module; "native" is whatever the machine's best backend is
BUILDS = {"native": EXTENSION, "avx2": EXTENSION + "_avx2", "scalar": EXTENSION + "_scalar"}
BUILD_NAMES = ("native", "avx512", "avx2", "scalar")  # avx512: native, checked to be AVX-512
# int8 in the experts and in a generated token's dense products; prompts stay float: a dense model's
# attention inputs carry outlier channels, which int8 rounds into another greedy answer (SmolLM2's)
DEFAULT_ACTIVATIONS = "decode"


@dataclass(frozen=True)
class KernelOptions:
    """What the process's kernels are loaded with: read once, from the environment (`RKMOJO_KERNELS`,
    `RKMOJO_ACTIVATIONS`), when `inference.kernels` is first imported, for a build cannot change after."""

    kernels: str = option(
        "native",
        help="the kernel build: native (the machine's best), avx512 (native, checked to be AVX-512), or "
        "avx2 or scalar (the same source built beside it on x86, so one machine can time each path)",
        choices=BUILD_NAMES,
        parse=str.lower,
    )
    activations: str = option(
        DEFAULT_ACTIVATIONS,
        help="the activation mode of the kernel calls no engine configures (an engine's `activations` "
        "option sets its own)",
        choices=ACTIVATIONS,
    )

    def __post_init__(self):
        options.check(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "KernelOptions":
        """The options set as `RKMOJO_<NAME>` variables.

        Raises:
            ImportError: a variable's value is not one of its choices (naming it and them).
        """
        try:
            return cls(**options.from_env(cls, environ))
        except ValueError as e:
            raise ImportError(str(e)) from None


def load_build(name: str) -> tuple[Path, object]:
    """The library path and extension module of build `name` (`KernelOptions.kernels`; "" or "avx512" is native).

    Raises:
        ImportError: an unknown name, or that build is missing (it is built only on x86).
    """
    name = name.strip().lower() or "native"
    module = BUILDS.get("native" if name == "avx512" else name)
    if module is None:
        raise ImportError(f"RKMOJO_KERNELS={name!r}: choose one of native, avx512, avx2, scalar")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"RKMOJO_KERNELS={name}: the build {module} is missing (x86 only); {BUILD_HINT}")
    mod = importlib.import_module(module)
    lib = Path(spec.origin)
    if name == "avx512" and ctypes.CDLL(str(lib)).rk_backend() != b"avx512":
        raise ImportError("RKMOJO_KERNELS=avx512: this machine's native build is not AVX-512; use native or avx2")
    return lib, mod


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
def _plan(
    kind: str, shape: tuple[int, ...]
) -> tuple[int, Callable[[dict], tuple], tuple[tuple[str, np.dtype, int], ...]]:
    """The kernel's code for `kind`, a getter of its parts (a tuple in argument order) from a parts
    dict, and (name, dtype, element count) of each part.

    Raises:
        ValueError: not a matrix of a kind the kernels know.
    """
    code = _KIND_CODES.get(kind)
    if code is None or len(shape) != 2:
        raise ValueError(f"linear: needs a matrix [out, in] of kind {', '.join(KINDS)}; got {kind} {shape}")
    layout = tuple((name, np.dtype(dt), math.prod(shp)) for name, (dt, shp) in part_layout(kind, shape).items())
    names = [name for name, _, _ in layout]
    get = operator.itemgetter(*names)
    return code, (get if len(names) > 1 else lambda parts: (get(parts),)), layout


def _part_pointers(w: QTensor) -> list[int]:
    """The kind code and the data pointers of w's parts in the kernel's order (padded to 3), after
    checking their layout.

    Raises:
        ValueError: a part's dtype, size or contiguity is not what the kind needs.
    """
    code, _, layout = _plan(w.kind, tuple(w.shape))
    ptrs = [code, 0, 0, 0]
    for j, (name, dtype, size) in enumerate(layout):
        p = w.parts[name]
        if p.dtype != dtype or p.size != size or not p.flags.c_contiguous:
            raise ValueError(
                f"linear: {w.kind} part {name!r} must be C-contiguous {dtype} with {size} elements for "
                f"shape {w.shape}, got {p.dtype} {p.shape} (contiguous={p.flags.c_contiguous})"
            )
        ptrs[j + 1] = _data(p)
    return ptrs


def _activations(x: np.ndarray, inn: int, what: str) -> tuple[np.ndarray, int]:
    """x as C-contiguous float32 and its row count T.

    Raises:
        ValueError: x's last dimension is not `inn`.
    """
    x = np.ascontiguousarray(x, dtype=_F32)
    if x.ndim == 0 or x.shape[-1] != inn:
        raise ValueError(f"linear: x has shape {x.shape}, {what} needs [..., {inn}]")
    return x, (x.size // inn if inn else math.prod(x.shape[:-1]))


def _fields(lib) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every descriptor layout the library declares (`rk_fields`, generated from rkdescriptors.h's lists):
    {"matrix", "<step>.header", "<step>.layer", "<step>.matrices" for the steps decode, moe and gemma4:
    (field names in order, each one's type: int, f32, ptr; "" for a matrix)}."""
    out, i = {}, 0
    while (text := lib.rk_fields(i)) is not None:
        table, *fields = text.decode().split()
        pairs = [f.partition(":")[::2] for f in fields]
        out[table] = (tuple(n for n, _ in pairs), tuple(t for _, t in pairs))
        i += 1
    return out


class KernelLib:
    """One loaded build of rkkernels.c (tests also load other builds, e.g. the portable C one).

    Args:
        path: the shared library.
        module: the same library imported as the extension module, for its fast entry point.
    """

    def __init__(self, path: str | Path, module=None):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise ImportError(f"cannot load the compiled kernels {path}: {e}; {BUILD_HINT}") from e
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.rk_linear.argtypes = [ctypes.c_int, i64, i64, i64, vp, vp, vp, vp, vp]
        lib.rk_linear.restype = ctypes.c_int
        lib.rk_linear_many.argtypes = [ctypes.c_int, i64, i64, vp, vp]
        lib.rk_linear_many.restype = ctypes.c_int
        lib.rk_linear_grouped.argtypes = [ctypes.c_int, i64, vp]
        lib.rk_linear_grouped.restype = ctypes.c_int
        lib.rk_set_threads.argtypes = [ctypes.c_int]
        lib.rk_set_threads.restype = None
        lib.rk_use_threads.argtypes = [ctypes.c_int]
        lib.rk_use_threads.restype = None
        lib.rk_get_threads.argtypes = []
        lib.rk_get_threads.restype = ctypes.c_int
        lib.rk_backend.argtypes = []
        lib.rk_backend.restype = ctypes.c_char_p
        lib.rk_dot.argtypes = []
        lib.rk_dot.restype = ctypes.c_char_p
        lib.rk_rp_kernel.argtypes = []
        lib.rk_rp_kernel.restype = ctypes.c_char_p
        lib.rk_attention.argtypes = [
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            vp,
            ctypes.c_int,
            vp,
            i64,
            vp,
            i64,
            vp,
            vp,
            i64,
            ctypes.c_float,
            vp,
        ]
        lib.rk_attention.restype = ctypes.c_int
        lib.rk_pool_stats.argtypes = [vp]
        lib.rk_pool_stats.restype = None
        lib.rk_llama_decode.argtypes = [vp]
        lib.rk_llama_decode.restype = ctypes.c_int
        lib.rk_moe_decode_layer.argtypes = [vp, i64]
        lib.rk_moe_decode_layer.restype = ctypes.c_int
        lib.rk_llama_decode_batch.argtypes = [i64, vp]
        lib.rk_llama_decode_batch.restype = ctypes.c_int
        lib.rk_moe_decode_layer_batch.argtypes = [i64, vp, i64]
        lib.rk_moe_decode_layer_batch.restype = ctypes.c_int
        for part in ("attn", "route", "ffn_out"):
            getattr(lib, f"rk_gemma4_{part}").argtypes = [vp, i64]
            getattr(lib, f"rk_gemma4_{part}").restype = ctypes.c_int
        lib.rk_moe_experts_act.argtypes = [ctypes.c_int, i64, i64, i64, i64, vp, vp, vp]
        lib.rk_moe_experts_act.restype = ctypes.c_int
        lib.rk_moe_combine.argtypes = [i64, i64, vp, vp, vp]
        lib.rk_moe_combine.restype = None
        lib.rk_f16_round.argtypes = [i64, vp, vp]
        lib.rk_f16_round.restype = None
        lib.rk_repack_q4.argtypes = [i64, i64, vp, vp, vp, vp, vp, vp]
        lib.rk_repack_q4.restype = ctypes.c_int
        lib.rk_fields.argtypes = [ctypes.c_int]
        lib.rk_fields.restype = ctypes.c_char_p
        self._lib = lib
        self.fields = _fields(lib)
        # the header fields that carry this thread's activation flags (`llama_decode`, `moe_decode_flags`)
        self._q8a = self.fields["decode.header"][0].index("q8a")
        self._router_q8a = self.fields["moe.header"][0].index("router_q8a")
        self._fast = getattr(module, "linear_many", None)
        self.path = Path(path)
        self.backend = lib.rk_backend().decode()
        self.dot = lib.rk_dot().decode()  # the int8 dot product: vnni, maddubs, sdot, smull or scalar
        self.rp_kernel = lib.rk_rp_kernel().decode()  # that of repacked q4: vnni16, maddubs8x2, sdot4x4, ...
        # (mode, kind-code flag of linear/linear_many, of linear_grouped): the process's default, and a
        # thread's own while an engine computes on it (`use`), as the thread count in rkkernels.c
        self._default = _modes("f32")
        self._local = threading.local()

    @property
    def _modes(self) -> tuple[str, int, int, int]:
        return getattr(self._local, "modes", None) or self._default

    @property
    def _flag(self) -> int:
        return self._modes[1]

    @property
    def _group_flag(self) -> int:
        return self._modes[2]

    def set_activations(self, mode: str) -> None:
        """The process's default mode: "f32" (float activations), "q8" (int8 per block of 32 for the
        q4/q4_0/q4_1/q8_0 weights), "experts" (int8 in linear_grouped calls only) or "decode" (int8 in
        linear_grouped and llama_decode calls).

        Raises:
            ValueError: an unknown mode.
        """
        self._default = _modes(mode)

    def get_activations(self) -> str:
        """The mode of calls from this thread."""
        return self._modes[0]

    def use(self, threads: int | None, activations: str | None) -> tuple[int | None, str | None]:
        """This thread's own thread count and mode (None: the process's default) for the calls it makes
        from now on; returns the ones it had, to restore.

        Raises:
            ValueError: a thread count that is not positive, or an unknown mode.
        """
        if threads is not None and (not isinstance(threads, (int, np.integer)) or threads < 1):
            raise ValueError(f"thread count must be a positive integer, got {threads!r}")
        modes = None if activations is None else _modes(activations)
        before = (getattr(self._local, "threads", None), (getattr(self._local, "modes", None) or (None,))[0])
        self._local.threads, self._local.modes = threads, modes
        self._lib.rk_use_threads(int(threads or 0))
        return before

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

    def pool_stats(self) -> dict[str, int]:
        """Counters of the thread pool since load (see rk_pool_stats in rkkernels.c)."""
        out = np.zeros(6, np.int64)
        self._lib.rk_pool_stats(_data(out))
        return dict(zip(("shared", "solo", "stalls", "stall_ns", "tasks", "helper_tasks"), map(int, out)))

    def linear(self, x: np.ndarray, w: QTensor) -> np.ndarray:
        """y[..., out] = x[..., in] @ W.T in float32 (see `inference.kernels.linear`)."""
        code, get_parts, _ = _plan(w.kind, tuple(w.shape))
        code |= self._flag
        out, inn = w.shape
        x, T = _activations(x, inn, f"the {w.kind} weight {w.shape}")
        y = np.empty(x.shape[:-1] + (out,), _F32)
        if self._fast is not None:
            try:
                self._fast(T, inn, x, ((code, out, y) + get_parts(w.parts),))
            except (ValueError, BufferError) as e:
                self._explain(e, x, (w,))
            return y
        code, p0, p1, p2 = _part_pointers(w)
        rc = self._lib.rk_linear(code | self._flag, T, out, inn, _data(x), _data(y), p0, p1, p2)
        if rc:
            raise ValueError(f"linear: the kernel rejected {w.kind} {w.shape} with x {x.shape}: {_ERRORS.get(rc, rc)}")
        return y

    def linear_many(self, x: np.ndarray, ws) -> list[np.ndarray]:
        """[x @ W.T for W in ws] in one call (see `inference.kernels.linear_many`)."""
        ws = tuple(ws)
        if not 1 <= len(ws) <= MAX_MATRICES:
            raise ValueError(f"linear_many: takes 1 to {MAX_MATRICES} matrices, got {len(ws)}")
        inn = ws[0].shape[-1]
        x, T = _activations(x, inn, f"the {ws[0].kind} weight {ws[0].shape}")
        lead = x.shape[:-1]
        for w in ws:
            if len(w.shape) != 2 or w.shape[1] != inn:
                raise ValueError(f"linear_many: all weights need input size {inn} (as x), got {w.kind} {w.shape}")
        ys = [np.empty(lead + (w.shape[0],), _F32) for w in ws]
        if self._fast is not None:
            items = []
            for w, y in zip(ws, ys):
                code, get_parts, _ = _plan(w.kind, tuple(w.shape))
                items.append((code | self._flag, w.shape[0], y) + get_parts(w.parts))
            try:
                self._fast(T, inn, x, tuple(items))
            except (ValueError, BufferError) as e:
                self._explain(e, x, ws)
            return ys
        desc = []
        for w, y in zip(ws, ys):
            code, p0, p1, p2 = _part_pointers(w)
            desc += (code | self._flag, w.shape[0], _data(y), p0, p1, p2)
        desc = np.array(desc, dtype=np.int64)  # held until the call returns: _data() takes no reference
        rc = self._lib.rk_linear_many(len(ws), T, inn, _data(x), _data(desc))
        if rc:
            shapes = ", ".join(f"{w.kind} {w.shape}" for w in ws)
            raise ValueError(f"linear_many: the kernel rejected {shapes} with x {x.shape}: {_ERRORS.get(rc, rc)}")
        return ys

    def linear_grouped(self, pairs) -> list[np.ndarray]:
        """[x_j @ W_j.T for (x_j, W_j) in pairs] as one job (see `inference.kernels.linear_grouped`)."""
        pairs = list(pairs)
        if not pairs:
            return []
        inn = pairs[0][1].shape[-1]
        xs, ys, desc = [], [], []
        for x, w in pairs:
            if len(w.shape) != 2 or w.shape[1] != inn:
                raise ValueError(f"linear_grouped: all weights need input size {inn}, got {w.kind} {w.shape}")
            x, T = _activations(x, inn, f"the {w.kind} weight {w.shape}")
            y = np.empty(x.shape[:-1] + (w.shape[0],), _F32)
            xs.append(x)
            ys.append(y)
            if T > GROUP_ROWS:  # more than one activation tile: a call of its own
                self._lib_linear_into(x, T, w, y)
                continue
            code, p0, p1, p2 = _part_pointers(w)
            desc.append((code | self._group_flag, w.shape[0], _data(y), p0, p1, p2, _data(x), T))
        for i in range(0, len(desc), MAX_GROUPED):
            chunk = np.array(desc[i : i + MAX_GROUPED], dtype=np.int64)  # held: _data() takes no reference
            rc = self._lib.rk_linear_grouped(len(chunk), inn, _data(chunk))
            if rc:
                raise ValueError(
                    f"linear_grouped: the kernel rejected {len(chunk)} matrices of input size {inn}: "
                    f"{_ERRORS.get(rc, rc)}"
                )
        return ys

    def _lib_linear_into(self, x: np.ndarray, T: int, w: QTensor, y: np.ndarray) -> None:
        code, p0, p1, p2 = _part_pointers(w)
        rc = self._lib.rk_linear(code | self._group_flag, T, w.shape[0], w.shape[1], _data(x), _data(y), p0, p1, p2)
        if rc:
            raise ValueError(f"linear: the kernel rejected {w.kind} {w.shape} with x {x.shape}: {_ERRORS.get(rc, rc)}")

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        kpos: np.ndarray,
        qpos: np.ndarray,
        window: int | None,
        scale: float,
    ) -> np.ndarray:
        """Causal grouped-query attention over held K/V rows (see `inference.kernels.attention`)."""
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
            raise ValueError(
                f"attention: q [T, H, D], k [KV, S, D], v [KV, S, Dv]; got {q.shape}, {k.shape}, {v.shape}"
            )
        T, H, D = q.shape
        KV, S, Dk = k.shape
        Dv = v.shape[2]
        if Dk != D or v.shape[:2] != (KV, S) or H % KV or len(kpos) != S or len(qpos) != T or S == 0:
            raise ValueError(
                f"attention: shapes do not fit: q {q.shape}, k {k.shape}, v {v.shape}, "
                f"{len(kpos)} key positions, {len(qpos)} query positions"
            )
        if k.dtype != v.dtype or k.dtype not in (_F32, _F16):
            raise ValueError(f"attention: k and v must both be float32 or both float16, got {k.dtype} and {v.dtype}")
        for name, a in (("k", k), ("v", v)):  # heads may be strided (a view of a longer cache); rows not
            n = a.itemsize
            if a.strides[2] != n or a.strides[1] != n * a.shape[2] or a.strides[0] % n:
                raise ValueError(f"attention: {name} must have contiguous rows, got strides {a.strides}")
        q = np.ascontiguousarray(q, dtype=_F32)
        kpos = np.ascontiguousarray(kpos, dtype=np.int64)
        qpos = np.ascontiguousarray(qpos, dtype=np.int64)
        out = np.empty((T, H, Dv), _F32)
        rc = self._lib.rk_attention(
            T,
            H,
            KV,
            D,
            Dv,
            S,
            _data(q),
            int(k.dtype == _F16),
            k.ctypes.data,
            k.strides[0] // k.itemsize,
            v.ctypes.data,
            v.strides[0] // v.itemsize,
            _data(kpos),
            _data(qpos),
            int(window or 0),
            float(scale),
            _data(out),
        )
        if rc:
            raise ValueError(
                f"attention: the kernel rejected q {q.shape}, k {k.shape}, v {v.shape}: {_ERRORS.get(rc, rc)}"
            )
        return out

    def matrix_fields(self, w: QTensor) -> tuple[int, int, int, int]:
        """(kind code, part pointers) of `w` as a decode model descriptor holds them (rkdecode.h), after
        checking its parts' layout. The pointers are w's memory: keep w alive while they are used.

        Raises:
            ValueError: a part's dtype, size or contiguity is not what the kind needs.
        """
        return tuple(_part_pointers(w))

    def llama_decode(self, model: np.ndarray) -> None:
        """One decode step through the layers the int64 descriptor `model` describes (rkdecode.h), in this
        thread's activation mode and thread count.

        Raises:
            ValueError: the kernel rejected a shape or kind, or ran out of memory.
        """
        model[self._q8a] = int(self._modes[3] == Q8A)
        rc = self._lib.rk_llama_decode(_data(model))
        if rc:
            raise ValueError(f"llama_decode: the kernel rejected the step: {_ERRORS.get(rc, rc)}")

    def llama_decode_batch(self, models: list[np.ndarray]) -> None:
        """One decode step of several sequences of one model (their descriptors `models`), the matrix
        products over all their rows at once; each sequence gets `llama_decode`'s bits.

        Raises:
            ValueError: the kernel rejected a shape or kind, descriptors of different models, or ran out of
                memory.
        """
        q8a = int(self._modes[3] == Q8A)
        for m in models:
            m[self._q8a] = q8a
        addrs = np.array([_data(m) for m in models], np.int64)
        rc = self._lib.rk_llama_decode_batch(len(models), _data(addrs))
        if rc:
            raise ValueError(f"llama_decode_batch: the kernel rejected the step: {_ERRORS.get(rc, rc)}")

    def moe_decode_layer_batch(self, models: list[np.ndarray], layer: int) -> None:
        """`moe_decode_layer` of several sequences of one model (their descriptors `models`, each with
        `moe_decode_flags` set), the matrix products over all their rows at once; each sequence gets the
        one-sequence call's bits.

        Raises:
            ValueError: the kernel rejected a shape, kind or layer, descriptors of different models, or ran
                out of memory.
        """
        addrs = np.array([_data(m) for m in models], np.int64)
        rc = self._lib.rk_moe_decode_layer_batch(len(models), _data(addrs), layer)
        if rc:
            raise ValueError(f"moe_decode_layer_batch: the kernel rejected layer {layer}: {_ERRORS.get(rc, rc)}")

    def moe_decode_flags(self, model: np.ndarray) -> int:
        """Sets the activation flags of an MoE decode descriptor (rkmoedecode.h) for this thread's mode: the
        dense matrices as llama_decode's, the router as `linear`'s; returns the experts' kind-code flag
        (linear_grouped's), to pass to `moe_experts`."""
        _, flag, group_flag, decode_flag = self._modes
        model[self._q8a] = int(decode_flag == Q8A)
        model[self._router_q8a] = int(flag == Q8A)
        return group_flag

    def moe_decode_layer(self, model: np.ndarray, layer: int) -> None:
        """The attention half of `layer` (and a dense layer's MLP) for the token the descriptor describes;
        call `moe_decode_flags` first.

        Raises:
            ValueError: the kernel rejected a shape, kind or layer, or ran out of memory.
        """
        rc = self._lib.rk_moe_decode_layer(_data(model), layer)
        if rc:
            raise ValueError(f"moe_decode_layer: the kernel rejected layer {layer}: {_ERRORS.get(rc, rc)}")

    def gemma4_attn(self, model: np.ndarray, layer: int) -> None:
        """Gemma 4's attention half of `layer` for the token the descriptor describes (rkgemma4.h)."""
        self._gemma4("attn", model, layer)

    def gemma4_route(self, model: np.ndarray, layer: int) -> None:
        """Gemma 4's router of `layer` on the descriptor's h into its ids and wts (rkgemma4.h)."""
        self._gemma4("route", model, layer)

    def gemma4_ffn_out(self, model: np.ndarray, layer: int) -> None:
        """The end of Gemma 4's `layer` from the descriptor's mlp and y into its h (rkgemma4.h)."""
        self._gemma4("ffn_out", model, layer)

    def _gemma4(self, part: str, model: np.ndarray, layer: int) -> None:
        """rk_gemma4_<part>(model, layer).

        Raises:
            ValueError: the kernel rejected a shape or layer, or ran out of memory.
        """
        rc = getattr(self._lib, f"rk_gemma4_{part}")(_data(model), layer)
        if rc:
            raise ValueError(f"gemma4_{part}: the kernel rejected layer {layer}: {_ERRORS.get(rc, rc)}")

    def activation_flags(self) -> tuple[int, int, int]:
        """This thread's kind-code flags: (linear and linear_many's, linear_grouped's, llama_decode's)."""
        return self._modes[1:]

    def moe_experts(
        self, desc: np.ndarray, hidden: int, inter: int, flag: int, x: np.ndarray, y: np.ndarray, act: str = "silu"
    ) -> None:
        """y[slot] = expert(x) for each expert row of `desc` [n, MOE_EXPERT_FIELDS] (slot, then the kind
        code and parts of gate, up and down), x [hidden] float32, y [K, hidden] float32, `act` one of
        EXPERT_ACTIVATIONS.

        Raises:
            ValueError: the kernel rejected a shape or kind, or ran out of memory; an unknown `act`.
        """
        if act not in EXPERT_ACTIVATIONS:
            raise ValueError(f"moe_experts: activation {act!r}: choose one of {', '.join(EXPERT_ACTIVATIONS)}")
        code = EXPERT_ACTIVATIONS.index(act)
        rc = self._lib.rk_moe_experts_act(len(desc), hidden, inter, flag, code, _data(x), _data(desc), _data(y))
        if rc:
            raise ValueError(f"moe_experts: the kernel rejected {len(desc)} experts: {_ERRORS.get(rc, rc)}")

    def moe_combine(self, y: np.ndarray, w: np.ndarray, h: np.ndarray) -> None:
        """h += sum_k w[k] y[k] in slot order, as moe.mixture (y [K, H], w [K], h [H], float32, contiguous)."""
        self._lib.rk_moe_combine(len(w), y.shape[1], _data(y), _data(w), _data(h))

    def f16_round(self, x: np.ndarray) -> np.ndarray:
        """x as the IEEE halves the decode step stores K/V in (round to nearest even, as numpy)."""
        x = np.ascontiguousarray(x, dtype=_F32)
        out = np.empty(x.shape, np.float16)
        self._lib.rk_f16_round(x.size, _data(x), _data(out))
        return out

    def repack_q4(self, t: QTensor, in_place: bool = False) -> QTensor:
        """`t` (q4, rows a multiple of 16) as q4r, the bytes of `quant.repack_q4` (which pads other row
        counts); `in_place`: rewritten in `t`'s own memory (writable, C-contiguous; `t` is then stale).

        Raises:
            ValueError: not a q4 matrix with rows a multiple of 16, or read-only parts for `in_place`.
        """
        out, inn = t.shape if len(t.shape) == 2 else (0, 0)
        if t.kind != "q4" or out % 16 or not out:
            raise ValueError(f"repack_q4: needs a q4 matrix of rows a multiple of 16, got {t.kind} {t.shape}")
        src = _part_pointers(t)[1:]
        if in_place:
            if not all(p.flags.writeable for p in t.parts.values()):
                raise ValueError("repack_q4: in_place needs writable parts (a read-only memory map is not)")
            parts = dict(t.parts)
        else:
            parts = {name: np.empty_like(p, order="C") for name, p in t.parts.items()}
        dst = [_data(parts[name]) for name in ("q", "scales", "biases")]
        rc = self._lib.rk_repack_q4(out, inn, *src, *dst)
        if rc:
            raise ValueError(f"repack_q4: the kernel rejected {t.kind} {t.shape}: {_ERRORS.get(rc, rc)}")
        return QTensor(REPACKED_Q4, (out, inn), parts)

    @staticmethod
    def _explain(e: Exception, x: np.ndarray, ws: tuple):
        """Raises the ValueError for the fast entry point's refusal `e`, naming the part at fault."""
        for w in ws:
            _part_pointers(w)
        shapes = ", ".join(f"{w.kind} {w.shape}" for w in ws)
        raise ValueError(f"linear: the kernel rejected {shapes} with x {x.shape}: {e}") from e
