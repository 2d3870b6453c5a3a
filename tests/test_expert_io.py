"""The expert reader's io_uring path under signals: a wait that a signal interrupts goes on waiting."""

import os
import signal
import threading
import time

import pytest

from inference.experts.io import LayerFiles, ReadRequest, UringReader, uring_problem


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
