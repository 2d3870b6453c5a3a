"""The expert reader's io_uring path: a wait that a signal interrupts goes on waiting; batches sharing the
ring; a token's guesses chained behind the layer's reads."""

import os
import signal
import threading
import time

import pytest

from inference.experts.io import LayerFiles, ReadRequest, UringReader, kernel_release, uring_problem


def test_a_signal_during_an_io_uring_wait_does_not_end_the_read(tmp_path):
    """A profiler attaching or a child exiting sends the engine's thread a signal while it waits for a read;
    io_uring's wait returns EINTR then, and the read must still land rather than fail the generation."""
    if uring_problem():
        pytest.skip(f"io_uring cannot be used here: {uring_problem()}")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer yet: open without blocking
    wfd = os.open(fifo, os.O_WRONLY)
    os.set_blocking(rfd, True)  # its read waits for the writer below, so the reader's wait blocks
    files = LayerFiles.__new__(LayerFiles)  # one "layer" whose file is the FIFO
    files.fds, files.buffered, files.direct = {0: rfd}, {0: wfd}, True
    reader = UringReader(files)
    payload = os.urandom(4096)
    buf = bytearray(4096)
    alarms = []

    def write_later():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # the alarms go to the waiting thread
        time.sleep(0.4)
        os.write(wfd, payload)

    old = signal.signal(signal.SIGALRM, lambda *_: alarms.append(time.monotonic()))
    writer = threading.Thread(target=write_later)
    writer.start()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
        batch = reader.submit([ReadRequest(0, 0, 0, memoryview(buf), 0, len(buf))])
        got = list(batch.completed())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        writer.join()
        reader.close()
        os.close(rfd)
        os.close(wfd)
    assert len(alarms) >= 3  # the wait was interrupted, more than once
    assert [(r.layer, r.expert) for r in got] == [(0, 0)] and bytes(buf) == payload


def _queue_files(tmp_path, data: bytes):
    """A one-"layer" LayerFiles over a plain file holding `data` (buffered: tmp may refuse O_DIRECT)."""
    path = tmp_path / "layer.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    files = LayerFiles.__new__(LayerFiles)
    files.fds, files.buffered, files.direct = {0: fd}, {0: fd}, False
    return files


def test_a_uring_reader_hands_each_batch_its_own_reads_whichever_batch_reaps_the_ring(tmp_path):
    """Reads share one ring, a batch each: a batch asked first may reap the others' completions,
    which stay theirs; `then` runs on the asking thread; a ring smaller than the reads queues the rest."""
    if uring_problem():
        pytest.skip(f"io_uring cannot be used here: {uring_problem()}")
    blob = 8192
    data = os.urandom(blob * 6)
    files = _queue_files(tmp_path, data)
    q = UringReader(files, depth=2)  # 6 reads through a ring of 2
    bufs = [bytearray(blob) for _ in range(6)]
    threads = set()

    def then(r):
        threads.add(threading.get_ident())
        return r.expert

    try:
        batches = [q.submit([ReadRequest(0, e, 0, memoryview(bufs[e]), e * blob, blob)], then) for e in range(6)]
        assert sum(bool(b.mine) for b in batches) == 2 and all(b.pending for b in batches)
        got = {}
        for e in reversed(range(6)):  # the last batch waits first: its read starts once others have landed
            b = batches[e]
            while b.pending:
                got.setdefault(e, []).extend(b.wait_one())
        assert got == {e: [e] for e in range(6)}
        assert all(bytes(bufs[e]) == data[e * blob : (e + 1) * blob] for e in range(6))
        assert threads == {threading.get_ident()} and not q.inflight and not q.landed
    finally:
        q.close()
        os.close(files.fds[0])


def _fifo_and_file(tmp_path, data: bytes):
    """LayerFiles of two "layers": 0 a FIFO with no writer yet (its reads wait for a write to the FIFO's
    write end), 1 a plain file holding `data`; and the three fds (read, write, plain) to close."""
    if uring_problem():
        pytest.skip(f"io_uring cannot be used here: {uring_problem()}")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fifo, os.O_WRONLY)
    os.set_blocking(rfd, True)
    plain = tmp_path / "plain.bin"
    plain.write_bytes(data)
    pfd = os.open(plain, os.O_RDONLY)
    files = LayerFiles.__new__(LayerFiles)
    files.fds, files.buffered, files.direct = {0: rfd, 1: pfd}, {0: wfd, 1: pfd}, True
    return files, rfd, wfd, pfd


def test_a_uring_batch_does_not_wait_for_another_batch_s_read(tmp_path):
    """A batch whose read lands at once is handed it while another batch's read still waits (a FIFO with no
    writer yet); `abandon` then drops that read once it lands, and `cancel` drops only unsubmitted reads."""
    files, rfd, wfd, pfd = _fifo_and_file(tmp_path, b"x" * 4096)
    q = UringReader(files, depth=4)
    slow, fast = bytearray(4096), bytearray(4096)
    try:
        waiting = q.submit([ReadRequest(0, 0, 0, memoryview(slow), 0, 4096)])
        landed = q.submit([ReadRequest(1, 1, 0, memoryview(fast), 0, 4096)])
        assert [r.expert for r in landed.wait_one()] == [1] and bytes(fast) == b"x" * 4096
        assert waiting.pending and waiting.ready() == [] and waiting.cancel() == 0 and waiting.pending
        os.write(wfd, b"y" * 4096)
        # a FIFO read's completion is polled for: a blocking wait for it (unlike a disk read's) can sleep on
        # here until a signal comes, which the test above relies on
        for _ in range(500):
            q._reap()
            if q.landed:
                break
            time.sleep(0.01)
        waiting.abandon()
        assert not waiting.pending and not q.inflight and bytes(slow) == b"y" * 4096
    finally:
        q.close()
        for fd in (rfd, wfd, pfd):
            os.close(fd)


def test_a_chained_read_waits_on_the_ring_until_the_read_it_follows_lands(tmp_path):
    """A chained read (a token's guess) is held back until the next batch's reads, then linked behind its
    last one: it does not start while that read waits (a FIFO with no writer yet), and lands after it."""
    files, rfd, wfd, pfd = _fifo_and_file(tmp_path, b"g" * 4096)
    q = UringReader(files, depth=4)
    demand, guess = bytearray(4096), bytearray(4096)
    try:
        g = q.submit(
            [ReadRequest(1, 7, 0, memoryview(guess), 0, 4096)], then=lambda r: ("landed", r.expert), chained=True
        )
        assert g.pending and not q.inflight  # held back: nothing on the ring yet
        d = q.submit([ReadRequest(0, 3, 0, memoryview(demand), 0, 4096)])
        assert len(q.inflight) == 2 and g.mine and not q.chained  # linked behind the demand read
        time.sleep(0.3)
        assert g.ready() == [] and d.ready() == []  # the guess has not started: the read it follows waits
        os.write(wfd, b"d" * 4096)
        got = []
        for _ in range(500):  # polled: see the test above
            got += g.ready()
            if got:
                break
            time.sleep(0.01)
        assert got == [("landed", 7)] and bytes(guess) == b"g" * 4096
        assert [r.expert for r in d.ready()] == [3] and bytes(demand) == b"d" * 4096
        held = q.submit([ReadRequest(1, 8, 0, memoryview(guess), 0, 4096)], chained=True)
        q.flush()  # no read came to follow: it goes on the ring alone
        assert [r.expert for r in held.wait_one()] == [8] and not q.inflight
    finally:
        q.close()
        for fd in (rfd, wfd, pfd):
            os.close(fd)


def test_the_kernel_release_is_read_from_uname_s_form():
    """Linking a guess behind a read needs Linux 5.5; an unreadable release counts as too old."""
    assert kernel_release("6.1.0-18-arm64") == (6, 1) and kernel_release("5.10.160-rockchip-rk3588") == (5, 10)
    assert kernel_release("5.4.0") < (5, 5) <= kernel_release("5.5") and kernel_release("garbage") == (0, 0)
