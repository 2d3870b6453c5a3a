"""The librknnrt matmul binding driven against the ABI-faithful stand-in (tests/rknnrt_standin.c), which
refuses each documented violation with the runtime's error code."""

import ctypes as C
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from inference import kernels
from inference.backends.rknpu import RknpuBackend
from inference.backends.rknpu import matmul as mm
from inference.quant import quantize


@pytest.fixture
def rt(rknnrt_standin):
    return mm.Runtime(rknnrt_standin)


def create(rt, **fields):
    info = mm.MatmulInfo(**{"M": 4, "K": 64, "N": 32, "type": mm.FP16_TO_FP32, **fields})
    ctx, io = C.c_uint64(), mm.IoAttr()
    ret = rt.lib.rknn_matmul_create(C.byref(ctx), C.byref(info), C.byref(io))
    return ret, ctx, io


def test_the_structures_have_the_runtime_sizes():
    assert [C.sizeof(s) for s in (mm.MatmulInfo, mm.TensorAttr, mm.IoAttr, mm.TensorMem, mm.QuantParams)] == [
        64,
        332,
        996,
        40,
        288,
    ]
    assert (mm.MatmulInfo.B_layout.offset, mm.MatmulInfo.iommu_domain_id.offset, mm.MatmulInfo.reserved.offset) == (
        16,
        24,
        30,
    )


@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_a_matmul_in_the_native_layout_equals_numpy(rt, kind):
    rng = np.random.default_rng(1)
    m = mm.Matmul(rt, 8, 64, 64, kind, core=2)
    try:
        assert [m.io.A.name, m.io.B.name, m.io.C.name] == [b"A", b"B", b"C"]
        assert list(m.io.B.dims[:4]) == [64 // mm.N_ALIGN[mm.TYPES[kind]], 2, mm.N_ALIGN[mm.TYPES[kind]], 32]
        if kind == "fp16":
            a, b = (rng.standard_normal(s).astype(np.float16) for s in ((8, 64), (64, 64)))
            m.set_b(b)
            np.testing.assert_allclose(m.run(a), a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-3)
        else:
            a, b = (rng.integers(-127, 128, s).astype(np.int8) for s in ((8, 64), (64, 64)))
            m.set_b(b)
            np.testing.assert_array_equal(m.run(a), a.astype(np.int32) @ b.astype(np.int32))
        assert m.sdk_version()[1]  # the driver version is read
    finally:
        m.close()


@pytest.mark.parametrize(
    "fields",
    [
        {"type": 7},  # FP16×INT4 (w4a16): rejected on RK3588
        {"type": 11},  # INT8×INT4
        {"type": 5},  # FP16×INT8
        {"K": 48},  # K not a multiple of 32
        {"K": 10272},  # K above 10240
        {"N": 24},  # fp16 N not a multiple of 16
        {"N": 48, "type": mm.INT8_TO_INT32},  # int8 N not a multiple of 32
    ],
)
def test_the_stand_in_refuses_what_rk3588_refuses(rt, fields):
    assert create(rt, **fields)[0] == -5  # RKNN_ERR_PARAM_INVALID


def test_the_accepted_type_table_includes_int4(rt):
    ret, ctx, _ = create(rt, type=10, N=64)  # INT4×INT4→INT16
    assert ret == 0 and rt.lib.rknn_matmul_destroy(ctx) == 0


def test_reserved_bytes_must_be_zero(rt):
    info_fields = {"reserved": (C.c_int8 * 34)(*([0] * 33 + [1]))}
    assert create(rt, **info_fields)[0] == -5


def test_a_destroyed_context_is_refused(rt):
    ret, ctx, _ = create(rt)
    assert ret == 0 and rt.lib.rknn_matmul_destroy(ctx) == 0
    assert rt.lib.rknn_matmul_run(ctx) == -7 and rt.lib.rknn_matmul_destroy(ctx) == -7


def test_set_io_mem_checks_the_tensor_name_and_size(rt):
    ret, ctx, io = create(rt)
    mem = rt.lib.rknn_create_mem(ctx, io.C.size)
    try:
        assert mem.contents.fd >= 0  # memfd-backed, like the runtime's dma buffers
        wrong = mm.TensorAttr.from_buffer_copy(io.C)
        wrong.name = b"D"
        assert rt.lib.rknn_matmul_set_io_mem(ctx, mem, C.byref(wrong)) == -5
        small = rt.lib.rknn_create_mem(ctx, io.C.size - 4)
        assert rt.lib.rknn_matmul_set_io_mem(ctx, small, C.byref(io.C)) == -5
        assert rt.lib.rknn_matmul_run(ctx) == -5  # A, B, C not all set
        assert rt.lib.rknn_matmul_set_io_mem(ctx, mem, C.byref(io.C)) == 0
    finally:
        rt.lib.rknn_matmul_destroy(ctx)


def test_memory_imported_from_an_fd_is_usable(rt):
    ret, ctx, io = create(rt)
    fd = os.memfd_create("slot")
    os.ftruncate(fd, 4096)
    import mmap

    buf = mmap.mmap(fd, 4096)
    addr = C.addressof(C.c_char.from_buffer(buf))
    mem = rt.lib.rknn_create_mem_from_fd(ctx, fd, addr, io.B.size, 0)
    assert mem and rt.lib.rknn_matmul_set_io_mem(ctx, mem, C.byref(io.B)) == 0
    assert rt.lib.rknn_destroy_mem(ctx, mem) == 0
    rt.lib.rknn_matmul_destroy(ctx)
    del addr
    os.close(fd)


@pytest.mark.parametrize("mask,ok", [(1, True), (2, True), (4, True), (7, True), (0, True), (8, False), (5, False)])
def test_core_masks_are_those_of_three_cores(rt, mask, ok):
    ret, ctx, _ = create(rt)
    assert (rt.lib.rknn_matmul_set_core_mask(ctx, mask) == 0) == ok
    rt.lib.rknn_matmul_destroy(ctx)


def test_an_injected_fault_names_the_call_and_the_code(rt, monkeypatch):
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "run")
    m = mm.Matmul(rt, 4, 64, 32, "fp16")
    with pytest.raises(mm.NpuError, match=r"rknn_matmul_run returned -2 \(RKNN_ERR_TIMEOUT\)"):
        m.run(np.zeros((4, 64), np.float16))
    m.close()


def test_int8_products_rescaled_on_the_cpu_equal_the_exact_arithmetic(rknnrt_standin):
    # A chunk through the binding: raw int32 products × row scale × channel scale, against the same
    # arithmetic in numpy (int64 products are exact, so only the final float rounding differs)
    rng = np.random.default_rng(2)
    w = quantize(rng.standard_normal((80, 200)).astype(np.float32), "q8")  # N, K need padding
    x = rng.standard_normal((40, 200)).astype(np.float32)
    npu = RknpuBackend(rknnrt_standin, precision="int8", rows=64)
    try:
        got = npu.linear(x, w)
    finally:
        npu.close()
    qa, sa = mm.quantize_rows(x)
    want = (qa.astype(np.int64) @ w.parts["q"].T.astype(np.int64)) * sa[:, None] * w.parts["scales"][None, :]
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-6)
    assert np.linalg.norm(got - kernels.linear(x, w)) / np.linalg.norm(got) < 1e-2


def test_short_chunks_stay_on_the_cpu(rknnrt_standin, monkeypatch):
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "run")  # the NPU would fail: the CPU must answer
    w = quantize(np.ones((32, 64), np.float32), "q8")
    npu = RknpuBackend(rknnrt_standin, rows=64)
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(npu.linear(x, w), kernels.linear(x, w))
    npu.close()


def test_the_stand_in_keeps_its_layouts_and_arithmetic_on_aarch64(tmp_path):
    # Cross-compiled for the RK3588's Cortex-A76 (its _Static_asserts check the LP64 sizes there) and run
    # under qemu-aarch64 through the binding's call sequence: raw int8 products equal numpy's
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        pytest.skip("no aarch64 cross compiler or qemu-aarch64: run scripts/setup --test")
    here = Path(__file__).parent
    exe = tmp_path / "standin_driver"
    subprocess.run(
        [
            cc,
            "-O2",
            "-static",
            "-mcpu=cortex-a76",
            str(here / "rknnrt_standin_driver.c"),
            str(here / "rknnrt_standin.c"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    rng = np.random.default_rng(3)
    M, K, N = 5, 96, 64
    a, b = rng.integers(-127, 128, (M, K)).astype(np.int8), rng.integers(-127, 128, (K, N)).astype(np.int8)
    out = subprocess.run(
        [qemu, str(exe)],
        input=np.array([M, K, N], np.int32).tobytes() + a.tobytes() + b.tobytes(),
        capture_output=True,
        check=True,
    ).stdout
    np.testing.assert_array_equal(np.frombuffer(out, np.int32).reshape(M, N), a.astype(np.int32) @ b.astype(np.int32))
