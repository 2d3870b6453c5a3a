"""Buffers the NPU can import by file descriptor (`rknn_create_mem_from_fd`): from the dma-heap when the
kernel has one, else a memfd.

On an RK3588 board `/dev/dma_heap/system` hands out dma-buf file descriptors: memory a device maps
without a copy, and which the CPU maps too (`mmap` of the fd). An expert slot in such a buffer can be
filled by the CPU (or, later, read from the store straight into it) and handed to a matmul context as
its B by fd. Where there is no dma-heap (a PC; a kernel without it; the tests) a memfd stands in: the
same fd + mapping contract, without the device side.

Written from the kernel's documented UAPI (linux/dma-heap.h, linux/dma-buf.h), not copied:
- DMA_HEAP_IOCTL_ALLOC = _IOWR('H', 0, struct dma_heap_allocation_data), the struct being
  {u64 len; u32 fd (out); u32 fd_flags; u64 heap_flags}: 24 bytes;
- DMA_BUF_IOCTL_SYNC = _IOW('b', 0, struct dma_buf_sync {u64 flags}): the CPU brackets its access to a
  dma-buf's mapping with SYNC_START and SYNC_END (| READ / WRITE) so that caches stay coherent with the
  device. A memfd needs (and accepts) none.
The dma-heap branch is not exercised here: no machine of ours has a dma-heap (docs/npu.md).
"""

from __future__ import annotations

import contextlib
import ctypes as C
import fcntl
import mmap
import os
import struct

DMA_HEAP = "/dev/dma_heap/system"


def _ioc(kind: int, type_: str, nr: int, size: int) -> int:
    """The Linux ioctl number: direction (2 bits), size (14), type (8), number (8)."""
    return (kind << 30) | (size << 16) | (ord(type_) << 8) | nr


_WRITE, _READ = 1, 2  # ioctl directions: user → kernel, kernel → user
DMA_HEAP_IOCTL_ALLOC = _ioc(_WRITE | _READ, "H", 0, 24)
DMA_BUF_IOCTL_SYNC = _ioc(_WRITE, "b", 0, 8)
SYNC_WRITE, SYNC_START, SYNC_END = 2, 0, 4


def _heap_fd(heap: str, size: int) -> int:
    """A dma-buf of `size` bytes from the heap device; OSError when it has none to give."""
    hfd = os.open(heap, os.O_RDWR | os.O_CLOEXEC)
    try:
        data = bytearray(struct.pack("<QIIQ", size, 0, os.O_RDWR | os.O_CLOEXEC, 0))
        fcntl.ioctl(hfd, DMA_HEAP_IOCTL_ALLOC, data, True)
    finally:
        os.close(hfd)
    return struct.unpack("<QIIQ", data)[1]


class SharedBuffer:
    """`size` bytes mapped read-write here and importable by the NPU through `fd`.

    Args:
        size: bytes.
        heap: the dma-heap device to ask first (default /dev/dma_heap/system); when it is absent or
            refuses, a memfd.
    Attributes:
        fd, addr (the mapping's address), size, source ("dma-heap" or "memfd").
    """

    def __init__(self, size: int, heap: str = DMA_HEAP):
        self.size, self.source, self.fd = size, "memfd", -1
        try:
            self.fd, self.source = _heap_fd(heap, size), "dma-heap"
        except OSError:  # no heap (ENOENT), or not a heap (ENOTTY), or none left (ENOMEM): a memfd
            self.fd = os.memfd_create("rkmojo-npu", os.MFD_CLOEXEC)
        try:
            if self.source == "memfd":
                os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        view = C.c_char.from_buffer(self._map)  # its address, then let go of it (mmap.close needs no exports)
        self.addr = C.addressof(view)
        del view

    @contextlib.contextmanager
    def write_access(self):
        """Around a CPU write into the mapping: a dma-buf's cache sync (a memfd needs none)."""
        heap = self.source == "dma-heap"
        if heap:
            fcntl.ioctl(self.fd, DMA_BUF_IOCTL_SYNC, struct.pack("<Q", SYNC_START | SYNC_WRITE))
        try:
            yield
        finally:
            if heap:
                fcntl.ioctl(self.fd, DMA_BUF_IOCTL_SYNC, struct.pack("<Q", SYNC_END | SYNC_WRITE))

    def close(self) -> None:
        if self.fd >= 0:
            self._map.close()
            os.close(self.fd)
            self.fd = -1
