"""`rkmojo up` end to end: private Redis, migrations, demo model on first start, the URL, a clean stop."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import ollama
import psutil
import pytest

from appliance import processes

ROOT = Path(__file__).resolve().parents[2]


def start_up(data: Path, port: int) -> tuple[subprocess.Popen, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "RKMOJO_", "DJANGO_"))}
    env.update(RKMOJO_DATA=str(data), RKMOJO_THREADS="1", OMP_NUM_THREADS="1", RKMOJO_WORKER_NAME="up-test")
    proc = subprocess.Popen(
        [sys.executable, "-m", "inference.cli", "up", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 180
    while not any("Ctrl-C stops" in l for l in lines):
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
    return proc, lines


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def stop_and_check(proc, sig) -> None:
    kids = descendants(proc.pid)
    names = " ".join(" ".join(k.cmdline()) for k in kids)
    assert (
        "redis-server" in names and "appliance.serve" in names and "celery" in names
    )  # daphne, as appliance.serve runs it
    proc.send_signal(sig)
    assert proc.wait(60) == 0
    gone, alive = psutil.wait_procs(kids, timeout=5)
    assert not alive, [p.cmdline() for p in alive]


@pytest.mark.slow
def test_up_serves_the_demo_model_and_stops_every_child(tmp_path):
    data = tmp_path / "data"
    port = processes.free_port()
    proc, lines = start_up(data, port)
    try:
        assert any("installing the demo model" in l for l in lines)
        assert (data / "db.sqlite3").is_file() and (data / "secret_key").is_file()
        client = ollama.Client(host=f"http://127.0.0.1:{port}")  # loopback: no API key needed by default
        assert "smollm2-135m-instruct" in [m.model for m in client.list().models]
        assert "smollm2-135m-instruct" in [m.model for m in client.ps().models]  # loaded at start
        r = client.chat(
            model="smollm2-135m-instruct", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2}
        )
        assert r.done and r.load_duration == 0
        # the worker's engine keeps its own data (models/, the NPU calibration) in the same directory
        worker = next(k for k in descendants(proc.pid) if "celery" in " ".join(k.cmdline()))
        assert worker.environ()["RKMOJO_HOME"] == str(data)
        stop_and_check(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (data / "redis.sock").exists()

    # the second start: the demo model is there already; Ctrl-C (SIGINT) stops it the same way
    proc, lines = start_up(data, port)
    try:
        assert not any("installing the demo model" in l for l in lines)
        stop_and_check(proc, signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_up_restarts_a_worker_that_dies(tmp_path):
    port = processes.free_port()
    proc, lines = start_up(tmp_path / "data", port)
    try:
        worker = next(k for k in descendants(proc.pid) if "celery" in " ".join(k.cmdline()))
        worker.kill()
        deadline = time.monotonic() + 60
        while not any("restarting" in l for l in lines):
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        r = client.generate(model="smollm2-135m-instruct", prompt="hi", options={"num_predict": 2})
        assert r.done
        stop_and_check(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
