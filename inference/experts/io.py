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
    """Reads through one io_uring (liburing), driven from the engine's thread only. Each `submit` is a batch
    of its own; whichever batch is asked what has landed reaps the ring for all, so the layer's reads and a
    token's lookahead guesses (each a batch) share the ring. A batch's `then` runs on the engine's thread,
    when the batch hands the read out (`ready`, `wait_one`).

    A guess submitted `chained` waits to be put on the ring behind one of the next submission's reads,
    linked (IOSQE_IO_HARDLINK): the kernel starts it as that read lands, so the disk goes from the layer's
    last reads to the guesses with no idle gap and the guesses do not slow the reads the layer waits for."""

    name = "uring"

    def __init__(self, files: LayerFiles, depth: int = 64):
        import liburing

        self.L = liburing
        self.files = files
        self.ring = liburing.Ring()
        self.cqe = liburing.Cqe()
        self.depth = depth
        liburing.io_uring_queue_init(depth, self.ring, 0)
        self.inflight: dict[int, tuple] = {}  # id -> (request, its Iovec, which must outlive the read)
        self.landed: dict[int, int] = {}  # id -> the completion's result, not handed out yet
        self.chained: list[tuple[ReadRequest, "UringBatch"]] = []  # waiting for the next submission's reads
        self.next_id = 0
        self.links = kernel_release() >= (5, 5)  # IOSQE_IO_HARDLINK came in Linux 5.5

    def submit(self, reqs: list[ReadRequest], then: Callable | None = None, chained: bool = False) -> "UringBatch":
        """A batch reading `reqs`. `chained`: held back until the next batch's reads (or `flush`), see above."""
        if chained:
            batch = UringBatch(self, [], then)
            self.chained += [(r, batch) for r in reqs]
            return batch
        return UringBatch(self, list(reqs), then)

    def flush(self) -> None:
        """Submit the chained reads still held back (no reads came to follow), unlinked."""
        held, self.chained = self.chained, []
        for r, batch in held:
            batch.add([r])

    def _prep(self, r: ReadRequest, flags: int = 0) -> int:
        sqe = self.L.io_uring_get_sqe(self.ring)
        iov = self.L.Iovec([r.dest[: r.length]])
        self.L.io_uring_prep_readv(sqe, self.files.fds[r.layer], iov, r.offset)
        if flags:
            self.L.io_uring_sqe_set_flags(sqe, flags)
        rid = self.next_id
        self.next_id += 1
        self.L.io_uring_sqe_set_data64(sqe, rid)
        self.inflight[rid] = (r, iov)
        return rid

    def _room(self) -> int:
        return self.depth - (len(self.inflight) - len(self.landed))  # the kernel's reads

    def _start(self, queue: list[ReadRequest]) -> set[int]:
        """Submit as many of `queue` as the ring has room for (taken off it), the held-back chained reads
        linked behind its last ones; the ids of `queue`'s reads (a chained read's id goes to its batch)."""
        n = min(len(queue), self._room())
        chain = self.chained[: max(0, min(n, self._room() - n))]
        del self.chained[: len(chain)]
        ids = set()
        for k in range(n):
            follow = n - 1 - k  # the last read is followed by the first guess, the one before by the second...
            linked = follow < len(chain)
            ids.add(self._prep(queue.pop(0), self.L.IOSQE_IO_HARDLINK if linked else 0))
            if linked:
                r, batch = chain[follow]
                batch.mine.add(self._prep(r))
        if n:
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

    def wait(self) -> None:
        """Block until one more completion is in `landed`. A signal that interrupts the wait (EINTR: a
        child process exiting, a profiler attaching) does not end it: the wait resumes, as Python resumes
        its own system calls (PEP 475), and a signal handler that raises still stops it."""
        while True:
            try:
                self.L.io_uring_wait_cqe(self.ring, self.cqe)
                break
            except InterruptedError:
                continue
        self._seen()

    def close(self) -> None:
        self.chained = []
        while self.inflight.keys() - self.landed.keys():  # no read may land in memory handed back
            self.wait()
        self.L.io_uring_queue_exit(self.ring)


class UringBatch:
    """One `UringReader.submit`: the ThreadBatch interface."""

    def __init__(self, reader: UringReader, reqs: list[ReadRequest], then: Callable | None = None):
        self.reader = reader
        self.queue = reqs
        self.then = then
        self.mine = reader._start(self.queue)

    @property
    def pending(self) -> bool:
        """Whether reads of this batch are still to land (or held back, chained)."""
        return bool(self.mine or self.queue or any(b is self for _, b in self.reader.chained))

    def add(self, reqs: list[ReadRequest]) -> None:
        """More reads into this batch, also while `completed()` is being iterated (they are yielded too)."""
        self.queue.extend(reqs)
        self.mine |= self.reader._start(self.queue)

    def _collect(self) -> list:
        q, out = self.reader, []
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
        self.reader._reap()
        return self._collect()

    def wait_one(self) -> list:
        """Waits until at least one read of this batch lands; those landed by then."""
        if any(b is self for _, b in self.reader.chained):
            self.reader.flush()  # asked for before any read came to follow it
        while True:
            out = self.ready()
            if out or not self.pending:
                return out
            self.reader.wait()

    def completed(self):
        """Yield each request as its read lands (completion order)."""
        while self.pending:
            yield from self.wait_one()

    def cancel(self) -> int:
        """Drop the reads not submitted yet; how many were dropped (those submitted still land)."""
        q = self.reader
        held = [x for x in q.chained if x[1] is self]
        q.chained = [x for x in q.chained if x[1] is not self]
        n, self.queue = len(self.queue) + len(held), []
        return n

    def abandon(self) -> None:
        """Wait for the reads still in flight (and drop the queued ones), ignoring their results."""
        q = self.reader
        self.cancel()
        while self.mine:
            q._reap()
            for rid in self.mine & q.landed.keys():
                self.mine.discard(rid)
                q.landed.pop(rid)
                q.inflight.pop(rid)
            if self.mine:
                q.wait()


def kernel_release(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of the running kernel (`uname -r`, e.g. "6.1.0-18-arm64"), (0, 0) if unreadable."""
    head = (release or os.uname().release).split("-")[0].split(".")
    try:
        return int(head[0]), int(head[1]) if len(head) > 1 else 0
    except ValueError:
        return 0, 0


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
