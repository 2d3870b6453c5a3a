"""The service's processes — redis-server, daphne, a Celery worker — as commands, and a child-process handle.

`rkmojo up` and the tests start the same commands. Each child runs in its own process group (a
terminal's Ctrl-C reaches only `rkmojo up`, which stops the children in order) and is asked by the
kernel to get SIGTERM should its parent die without stopping it (PR_SET_PDEATHSIG): no orphans.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def redis_argv(data_dir: Path) -> tuple[list[str], str]:
    """A private redis-server on a unix socket in `data_dir` (no TCP port, no persistence); (argv, REDIS_URL)."""
    sock = data_dir / "redis.sock"
    argv = [
        "redis-server",
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
        "--daemonize",
        "no",
        "--logfile",
        str(data_dir / "logs" / "redis.log"),
    ]
    return argv, f"unix://{sock}?db=0"


def daphne_argv(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "appliance.serve",
        "-b",
        host,
        "-p",
        str(port),
        "--application-close-timeout",
        "5",
        "appliance.asgi:application",
    ]


def worker_argv(name: str, loglevel: str = "info", env: dict | None = None) -> list[str]:
    """A Celery worker in the process that owns the engines: the solo pool (one task at a time), or with
    RKMOJO_PARALLEL=N > 1 in `env` (the process environment when None) a pool of N + 1 threads, whose
    generations a model's batcher steps together (`inference.batch`) and one more task (an embedding, a
    load) beside them."""
    raw = (os.environ if env is None else env).get("RKMOJO_PARALLEL") or "1"
    parallel = int(raw) if raw.isdigit() else 1  # a bad value: the worker's settings refuse it by name
    pool = (
        ["--pool", "solo", "--concurrency", "1"]
        if parallel <= 1
        else ["--pool", "threads", "--concurrency", str(parallel + 1)]
    )
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "appliance.celery",
        "worker",
        *pool,
        "--prefetch-multiplier",
        "1",
        "-n",
        f"{name}@%h",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        loglevel,
    ]


def migrate_argv() -> list[str]:
    return [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"]


def setup_token_argv() -> list[str]:
    """Prints the one-time setup token while no administrator exists (webui's `setuptoken` command)."""
    return [sys.executable, "-m", "django", "setuptoken"]


class Child:
    """One child process, its output appended to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path | None = None, cwd: str | None = None):
        self.name, self.argv, self.env, self.log, self.cwd = name, argv, env, log, cwd
        self.proc: subprocess.Popen | None = None
        self.before_start = None  # called before every (re)start: e.g. remove a stale unix socket

    def start(self) -> "Child":
        if self.before_start is not None:
            self.before_start()
        out = subprocess.DEVNULL
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()


def wait_for(check, timeout: float, what: str, interval: float = 0.1, child: Child | None = None) -> None:
    """Poll `check()` until true.

    Raises:
        RuntimeError: `timeout` passed, or `child` exited meanwhile (naming `what` and its log).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if child is not None and not child.alive():
            raise RuntimeError(
                f"{child.name} exited with status {child.proc.returncode} while waiting for {what}"
                + (f"; see {child.log}" if child.log else "")
            )
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def redis_ready(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def unix_socket_path(url: str) -> str | None:
    u = urllib.parse.urlsplit(url)
    return u.path if u.scheme == "unix" else None


def base_env(**extra: str) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "appliance.settings", "PYTHONUNBUFFERED": "1"}
    env.update({k: v for k, v in extra.items() if v is not None})
    return env
