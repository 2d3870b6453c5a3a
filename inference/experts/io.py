"""Reading expert blobs into cache slots: many reads in flight, completions handed back as they land.

Two paths with one interface (`submit`, then the batch's `completed()` to iterate, or `ready()` (no
waiting) and `wait_one()` for a caller that has other work between completions):
- io_uring through the `liburing` package (python-liburing), where the package imports and the
  kernel lets us set up a ring (tried once per process in a child process: some wheels of it crash
  CPUs without AVX-512);
- a thread pool of `os.preadv` (the GIL is released during the syscall).
Files are opened with `O_DIRECT` (slots are page-aligned, offsets 16 KiB-aligned, lengths rounded
to pages). Where the filesystem refuses `O_DIRECT` (tmpfs), reads are buffered and followed by
`posix_fadvise(DONTNEED)` so the page cache does not fill with experts. Short reads are retried.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable

from ..options import OptionError
from ..errors import RkmojoError
from .cache import PAGE

IO_MODES = ("auto", "uring", "threads")


@dataclass
class ReadRequest:
    layer: int
    expert: int
    slot: int
    dest: memoryview  # page-aligned, at least `length` bytes
    offset: int
    length: int


class LayerFiles:
    """One open file per MoE layer: O_DIRECT where allowed, plus a buffered fd for odd remainders."""

    def __init__(self, store, direct: bool = True):
        self.fds: dict[int, int] = {}
        self.buffered: dict[int, int] = {}
        self.direct = direct
        for layer, lay in store.expert_layers.items():
            self.buffered[layer] = os.open(lay.path, os.O_RDONLY)
            fd = None
            if direct:
                try:
                    fd = os.open(lay.path, os.O_RDONLY | os.O_DIRECT)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self.direct = False
            self.fds[layer] = fd if fd is not None else self.buffered[layer]

    def is_direct(self, layer: int) -> bool:
        return self.fds[layer] != self.buffered[layer]

    def close(self) -> None:
        for fd in set(self.fds.values()) | set(self.buffered.values()):
            os.close(fd)
        self.fds.clear()
        self.buffered.clear()


def read_rest(files: LayerFiles, r: ReadRequest, got: int) -> None:
    """Finish a read synchronously from byte `got` (short reads; buffered fd if misaligned)."""
    while got < r.length:
        aligned = got % PAGE == 0 and files.is_direct(r.layer)
        fd = files.fds[r.layer] if aligned else files.buffered[r.layer]
        n = os.preadv(fd, [r.dest[got : r.length]], r.offset + got)
        if n <= 0:
            raise RkmojoError(
                f"layer {r.layer} expert {r.expert}: read past end of the layer file; run `rkmojo verify`"
            )
        got += n


def after_read(files: LayerFiles, r: ReadRequest) -> None:
    if not files.is_direct(r.layer):
        os.posix_fadvise(files.buffered[r.layer], r.offset, r.length, os.POSIX_FADV_DONTNEED)


class ThreadReader:
    """Reads with a pool of threads doing `os.preadv`."""

    name = "threads"

    def __init__(self, files: LayerFiles, workers: int = 8):
        self.files = files
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rkmojo-io")

    def _one(self, r: ReadRequest, then: Callable | None = None):
        n = os.preadv(self.files.fds[r.layer], [r.dest[: r.length]], r.offset)
        if n < r.length:
            read_rest(self.files, r, max(n, 0))
        after_read(self.files, r)
        return then(r) if then else r

    def submit(self, reqs: list[ReadRequest], then: Callable | None = None) -> "ThreadBatch":
        """Reads `reqs`; with `then`, each read's worker calls then(request) once it has landed, and the
        batch yields what that returns (work done off the caller's thread)."""
        return ThreadBatch(self, [self.pool.submit(self._one, r, then) for r in reqs], then)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class ThreadBatch:
    def __init__(self, reader: ThreadReader, futures, then: Callable | None = None):
        self.reader = reader
        self.pending = set(futures)
        self.then = then

    def add(self, reqs: list[ReadRequest]) -> None:
        """More reads into this batch, also while `completed()` is being iterated (they are yielded too)."""
        self.pending.update(self.reader.pool.submit(self.reader._one, r, self.then) for r in reqs)

    def completed(self):
        """Yield each request as its read lands (completion order)."""
        while self.pending:
            yield from self.wait_one()

    def ready(self) -> list:
        """The requests whose reads have landed by now and were not handed out yet (no waiting)."""
        done = {f for f in self.pending if f.done()}
        self.pending -= done
        return [f.result() for f in done]

    def wait_one(self) -> list:
        """Waits until at least one read lands; the requests landed and not handed out yet."""
        done, self.pending = wait(self.pending, return_when=FIRST_COMPLETED)
        return [f.result() for f in done]

    def abandon(self) -> None:
        """Wait for the reads still in flight, ignoring their results."""
        wait(self.pending)
        self.pending = set()

    def cancel(self) -> int:
        """Drop the reads not started yet; how many were dropped. `pending` keeps those still running."""
        before = len(self.pending)
        dropped = {f for f in self.pending if f.cancel()}
        self.pending = {f for f in self.pending - dropped if not f.done()}
        return len(dropped) if before else 0


class UringReader:
    """Reads through one io_uring (liburing); the ring is driven from the engine's thread only."""

    name = "uring"

    def __init__(self, files: LayerFiles, depth: int = 64):
        import liburing

        self.L = liburing
        self.files = files
        self.ring = liburing.Ring()
        self.cqe = liburing.Cqe()
        self.depth = depth
        liburing.io_uring_queue_init(depth, self.ring, 0)
        self.inflight: dict[int, tuple] = {}
        self.next_id = 0

    def _prep(self, r: ReadRequest) -> int:
        sqe = self.L.io_uring_get_sqe(self.ring)
        iov = self.L.Iovec([r.dest[: r.length]])
        self.L.io_uring_prep_readv(sqe, self.files.fds[r.layer], iov, r.offset)
        rid = self.next_id
        self.next_id += 1
        self.L.io_uring_sqe_set_data64(sqe, rid)
        self.inflight[rid] = (r, iov)  # the Iovec must outlive the read
        return rid

    def submit(self, reqs: list[ReadRequest]) -> "UringBatch":
        return UringBatch(self, list(reqs))

    def wait(self) -> None:
        """Block until a completion is at the queue's head. A signal that interrupts the wait (EINTR: a
        child process exiting, a profiler attaching) does not end it: the wait resumes, as Python resumes
        its own system calls (PEP 475), and a signal handler that raises still stops it."""
        while True:
            try:
                self.L.io_uring_wait_cqe(self.ring, self.cqe)
                return
            except InterruptedError:
                continue

    def close(self) -> None:
        self.L.io_uring_queue_exit(self.ring)


class UringBatch:
    def __init__(self, reader: UringReader, reqs: list[ReadRequest]):
        self.reader = reader
        self.queue = reqs
        self.mine: set[int] = set()
        self._fill()

    def _fill(self) -> None:
        r = self.reader
        n = 0
        while self.queue and len(r.inflight) < r.depth:
            self.mine.add(r._prep(self.queue.pop(0)))
            n += 1
        if n:
            r.L.io_uring_submit(r.ring)

    def add(self, reqs: list[ReadRequest]) -> None:
        """More reads into this batch, also while `completed()` is being iterated (they are yielded too)."""
        self.queue.extend(reqs)
        self._fill()

    @property
    def pending(self) -> bool:
        """Whether reads of this batch are still to land."""
        return bool(self.mine or self.queue)

    def _reap(self) -> ReadRequest:
        """The read of the completion queue's head (a completion must be there)."""
        r, L = self.reader, self.reader.L
        rid = L.io_uring_cqe_get_data64(r.cqe[0])
        res = r.cqe[0].res
        L.io_uring_cqe_seen(r.ring, r.cqe[0])
        req, _ = r.inflight.pop(rid)
        self.mine.discard(rid)
        if res < 0:
            raise RkmojoError(f"layer {req.layer} expert {req.expert}: read failed ({os.strerror(-res)})")
        if res < req.length:
            read_rest(r.files, req, res)
        after_read(r.files, req)
        self._fill()
        return req

    def completed(self):
        r = self.reader
        while self.mine:
            r.wait()
            yield self._reap()

    def ready(self) -> list[ReadRequest]:
        """The requests whose reads have landed by now (no waiting)."""
        r, L, out = self.reader, self.reader.L, []
        while self.mine:
            try:
                L.io_uring_peek_cqe(r.ring, r.cqe)
            except BlockingIOError:
                break
            out.append(self._reap())
        return out

    def wait_one(self) -> list[ReadRequest]:
        """Waits until at least one read lands; the requests landed by then."""
        if not self.mine:
            return []
        self.reader.wait()
        return [self._reap(), *self.ready()]

    def abandon(self) -> None:
        """Wait for the reads still in flight (and drop the queued ones), ignoring their results."""
        r, L = self.reader, self.reader.L
        self.queue = []
        while self.mine:
            r.wait()
            rid = L.io_uring_cqe_get_data64(r.cqe[0])
            L.io_uring_cqe_seen(r.ring, r.cqe[0])
            r.inflight.pop(rid, None)
            self.mine.discard(rid)


class UringQueue(UringReader):
    """Reads through an io_uring of their own, each `submit` a batch of its own, driven from the engine's
    thread only: a generated token's lookahead guesses. Through the thread pool a guess waited for a
    reader thread to wake and take the GIL, which on 2 busy cores took 0.8 ms (median), while the layer
    that started it had 1.6 ms left (`benchmarks/README.md`, "a token's guesses on a ring of their own");
    here the read is at the disk when `submit` returns. A batch's `then` runs on the engine's thread, when
    the batch is asked what has landed (`ready`, `wait_one`); whichever batch asks reaps the ring for all."""

    def __init__(self, files: LayerFiles, depth: int = 32):
        super().__init__(files, depth)
        self.landed: dict[int, int] = {}  # id -> the completion's result, not handed out yet

    def submit(self, reqs: list[ReadRequest], then: Callable | None = None) -> "QueueBatch":
        return QueueBatch(self, list(reqs), then)

    def _start(self, queue: list[ReadRequest]) -> set[int]:
        """Submit as many of `queue` as the ring has room for (taken off it); their ids."""
        ids = set()
        while queue and len(self.inflight) - len(self.landed) < self.depth:  # the kernel's reads
            ids.add(self._prep(queue.pop(0)))
        if ids:
            self.L.io_uring_submit(self.ring)
        return ids

    def _reap(self) -> None:
        """Move every completion at hand into `landed` (no waiting)."""
        while self.inflight:
            try:
                self.L.io_uring_peek_cqe(self.ring, self.cqe)
            except BlockingIOError:
                return
            self._seen()

    def _seen(self) -> None:
        rid = self.L.io_uring_cqe_get_data64(self.cqe[0])
        self.landed[rid] = self.cqe[0].res
        self.L.io_uring_cqe_seen(self.ring, self.cqe[0])

    def _wait(self) -> None:
        """Block until one more completion is in `landed` (a signal does not end the wait: `UringReader.wait`)."""
        self.wait()
        self._seen()

    def close(self) -> None:
        while self.inflight.keys() - self.landed.keys():  # no read may land in memory handed back
            self._wait()
        super().close()


class QueueBatch:
    """One `UringQueue.submit`: the ThreadBatch interface."""

    def __init__(self, q: UringQueue, reqs: list[ReadRequest], then: Callable | None):
        self.q = q
        self.queue = reqs
        self.then = then
        self.mine = q._start(self.queue)

    @property
    def pending(self) -> bool:
        """Whether reads of this batch are still to land."""
        return bool(self.mine or self.queue)

    def add(self, reqs: list[ReadRequest]) -> None:
        self.queue.extend(reqs)
        self.mine |= self.q._start(self.queue)

    def _collect(self) -> list:
        q, out = self.q, []
        for rid in sorted(self.mine & q.landed.keys()):
            self.mine.discard(rid)
            res = q.landed.pop(rid)
            r, _ = q.inflight.pop(rid)
            if res < 0:
                raise RkmojoError(f"layer {r.layer} expert {r.expert}: read failed ({os.strerror(-res)})")
            if res < r.length:
                read_rest(q.files, r, res)
            after_read(q.files, r)
            out.append(self.then(r) if self.then else r)
        self.mine |= q._start(self.queue)
        return out

    def ready(self) -> list:
        """The requests (or what `then` made of them) landed by now and not handed out yet (no waiting)."""
        self.q._reap()
        return self._collect()

    def wait_one(self) -> list:
        """Waits until at least one read of this batch lands; those landed by then."""
        while True:
            out = self.ready()
            if out or not self.pending:
                return out
            self.q._wait()

    def completed(self):
        while self.pending:
            yield from self.wait_one()

    def cancel(self) -> int:
        """Drop the reads not submitted yet; how many were dropped (those submitted still land)."""
        n, self.queue = len(self.queue), []
        return n

    def abandon(self) -> None:
        """Wait for the reads still in flight (and drop the queued ones), ignoring their results."""
        q = self.q
        self.queue = []
        while self.mine:
            q._reap()
            for rid in self.mine & q.landed.keys():
                self.mine.discard(rid)
                q.landed.pop(rid)
                q.inflight.pop(rid)
            if self.mine:
                q._wait()


_URING_PROBE = (
    "import liburing\nr = liburing.Ring()\nliburing.io_uring_queue_init(4, r, 0)\nliburing.io_uring_queue_exit(r)\n"
)


@functools.cache
def uring_problem() -> str | None:
    """Why io_uring cannot be used in this process, or None when it can.

    Asked once per process, in a child process: a `liburing` wheel built for newer CPUs than this one
    (the 2026 releases use AVX-512 instructions) kills the interpreter with SIGILL when it sets up a
    ring, which no `except` can catch.
    """
    try:
        r = subprocess.run(
            [sys.executable, "-c", _URING_PROBE],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the io_uring probe did not run: {e}"
    if r.returncode == 0:
        return None
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        hint = " (its build needs CPU instructions this CPU lacks)" if sig == "SIGILL" else ""
        return f"the liburing package dies with {sig} on this machine{hint}"
    last = (r.stderr.strip().splitlines() or ["no message"])[-1]
    return f"liburing: {last}"


def open_reader(store, mode: str = "auto", *, direct: bool = True):
    """The reader for `mode` (`auto` prefers io_uring and falls back to threads).

    Raises:
        RkmojoError: `uring` was asked for and is not available here.
    """
    if mode not in IO_MODES:
        raise OptionError("io", mode, f"one of {', '.join(IO_MODES)}")
    problem = uring_problem() if mode in ("auto", "uring") else None
    if mode == "uring" and problem:
        raise OptionError("io", mode, f"auto or threads: io_uring is not available here ({problem})")
    files = LayerFiles(store, direct)
    if mode in ("auto", "uring") and not problem:
        try:
            return UringReader(files)
        except (ImportError, OSError) as e:
            if mode == "uring":
                files.close()
                raise OptionError("io", mode, f"auto or threads: io_uring is not available here ({e})") from None
    return ThreadReader(files)
