"""Expert slots the NPU imports by fd (`inference/backends/rknpu/dmabuf.py`, `Matmul(import_b=True)`):
a memfd here (no dma-heap on these machines), imported by the librknnrt stand-in
(tests/rknnrt_standin.c) through `rknn_create_mem_from_fd`, and `rknn_create_mem` when the runtime refuses."""

import ctypes as C
import os

import numpy as np
import pytest

from inference.backends.rknpu import dmabuf
from inference.backends.rknpu import matmul as mm
from inference.backends.rknpu.dmabuf import SharedBuffer


@pytest.fixture
def no_heap(tmp_path) -> str:
    return str(tmp_path / "dma_heap" / "system")


@pytest.fixture
def rt(rknnrt_standin):
    return mm.Runtime(rknnrt_standin)


def test_the_ioctl_numbers_are_the_kernels():
    # _IOWR('H', 0, 24-byte dma_heap_allocation_data) and _IOW('b', 0, u64 flags), as linux/dma-heap.h
    # and linux/dma-buf.h define them
    assert (dmabuf.DMA_HEAP_IOCTL_ALLOC, dmabuf.DMA_BUF_IOCTL_SYNC) == (0xC0184800, 0x40086200)


def test_without_a_dma_heap_a_buffer_is_a_memfd_mapped_here(no_heap):
    buf = SharedBuffer(8192, no_heap)
    assert buf.source == "memfd"
    C.memmove(buf.addr + 4096, b"slot", 4)  # what the CPU writes at the address, the fd holds
    assert os.pread(buf.fd, 4, 4096) == b"slot"
    with buf.write_access():  # no cache sync for a memfd
        C.memmove(buf.addr, b"B", 1)
    fd = buf.fd
    buf.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_device_that_is_not_a_heap_gives_a_memfd(tmp_path):
    not_a_heap = tmp_path / "system"
    not_a_heap.write_bytes(b"")
    buf = SharedBuffer(4096, str(not_a_heap))  # its ALLOC ioctl fails (ENOTTY)
    try:
        assert buf.source == "memfd" and os.fstat(buf.fd).st_size == 4096
    finally:
        buf.close()


@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_an_imported_b_computes_what_the_runtimes_memory_does(rt, no_heap, kind):
    rng = np.random.default_rng(3)
    if kind == "fp16":
        a, b = (rng.standard_normal(s).astype(np.float16) for s in ((8, 64), (64, 64)))
    else:
        a, b = (rng.integers(-127, 128, s).astype(np.int8) for s in ((8, 64), (64, 64)))
    plain = mm.Matmul(rt, 8, 64, 64, kind)
    slot = mm.Matmul(rt, 8, 64, 64, kind, import_b=True, heap=no_heap)
    try:
        assert (plain.imported, plain.b_buffer) == (None, None)
        assert slot.imported == "memfd"
        assert (slot.b.contents.fd, slot.b.contents.virt_addr) == (slot.b_buffer.fd, slot.b_buffer.addr)
        plain.set_b(b)
        slot.set_b(b)
        assert os.pread(slot.b_buffer.fd, 64, 0) != bytes(64)  # the library laid B out in our buffer
        np.testing.assert_array_equal(slot.run(a), plain.run(a))
        fd = slot.b_buffer.fd
    finally:
        plain.close()
        slot.close()
    with pytest.raises(OSError):  # ours to close, after the runtime let go
        os.fstat(fd)


def test_a_refused_import_puts_b_in_the_runtimes_memory(rt, no_heap, monkeypatch):
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "from_fd")
    m = mm.Matmul(rt, 4, 64, 32, "fp16", import_b=True, heap=no_heap)
    try:
        assert (m.imported, m.b_buffer) == (None, None) and m.b.contents.fd >= 0
        b = np.eye(64, 32, dtype=np.float16)
        m.set_b(b)
        a = np.arange(4 * 64).reshape(4, 64).astype(np.float16) / 256
        np.testing.assert_array_equal(m.run(a), a.astype(np.float32)[:, :32])
    finally:
        m.close()


def test_the_stand_in_refuses_a_closed_or_short_fd(rt, no_heap):
    m = mm.Matmul(rt, 4, 64, 32, "fp16")
    buf = SharedBuffer(m.io.B.size - 2, no_heap)
    try:
        assert not rt.lib.rknn_create_mem_from_fd(m.ctx, buf.fd, buf.addr, m.io.B.size, 0)  # too short
        mem = rt.lib.rknn_create_mem_from_fd(m.ctx, buf.fd, buf.addr, m.io.B.size - 2, 0)
        assert mem and rt.lib.rknn_destroy_mem(m.ctx, mem) == 0
        fd, addr = buf.fd, buf.addr
        buf.close()
        assert not rt.lib.rknn_create_mem_from_fd(m.ctx, fd, addr, 64, 0)  # no longer open
    finally:
        m.close()
        buf.close()
