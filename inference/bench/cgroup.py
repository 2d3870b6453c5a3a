"""Run a command under a cgroup-v1 memory limit, and read back what it used.

`rkmojo bench --cgroup-memory 4G` and `benchmarks/vs_llamacpp.py --memory` both go through
`MemoryCgroup`: make a group, write `memory.limit_in_bytes`, put the child in it before it execs
(so everything it allocates is charged), wait, read `memory.max_usage_in_bytes`, `memory.failcnt`
and the OOM-kill count, remove the group. The group is made under the caller's own memory cgroup
(from /proc/self/cgroup), so any limit the caller already lives under still applies.

Page cache counts: pages of files the child reads are charged to the group, and the kernel
reclaims them before it OOM-kills. A limit therefore also caps how much of a memory-mapped model
can stay cached, which is what makes it a fair small-board stand-in.

As a wrapper: `python -m inference.bench.cgroup 4G -- COMMAND [ARGS…]` (needs root).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..engine import parse_size
from ..errors import RkmojoError
from ..sysmem import meminfo

ROOT = Path("/sys/fs/cgroup/memory")
# below this Python and numpy do not even start; a limit like that is a typo (4M for 4G)
MIN_LIMIT = 128 * 2**20


def mem_total() -> int:
    """Physical RAM in bytes (MemTotal)."""
    return meminfo()["MemTotal"]


def check_limit(size: str | int) -> int:
    """A memory limit in bytes from '4G', '3.5GiB', '512M' or an int.

    Raises:
        RkmojoError: unparsable, below 128 MiB, or more than this machine's RAM (a limit that never binds).
    """
    limit = parse_size(size) if isinstance(size, str) else int(size)
    if limit < MIN_LIMIT:
        raise RkmojoError(
            f"--cgroup-memory {size}: {limit / 2**20:.0f} MiB is too small to start Python "
            f"(at least {MIN_LIMIT // 2**20} MiB); did you mean {size}G?"
        )
    total = mem_total()
    if limit > total:
        raise RkmojoError(
            f"--cgroup-memory {size}: more than this machine's RAM ({total / 2**30:.1f} GiB), "
            "so the limit would never bind; choose a smaller size"
        )
    return limit


def own_memory_cgroup() -> str:
    """This process's memory cgroup path relative to the v1 memory hierarchy ('/' at the top)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return "/"


@contextlib.contextmanager
def children_die_with_us():
    """SIGTERM and SIGHUP raise SystemExit while inside, so that `subprocess.run` kills and reaps the child
    and a `MemoryCgroup` is removed, as they are on Ctrl-C. By default those signals end Python at once: a
    `kill` of a bench left its child running on in its cgroup until the OOM killer took it. (Main thread
    only; elsewhere a no-op.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, leave) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class MemoryCgroup:
    """A temporary cgroup-v1 memory group with a limit. Use as a context manager.

    Args:
        limit: bytes, or a size string ('4G').
        name: the group's directory name (default: rkmojo-bench-<pid>-<time>).
    Raises:
        RkmojoError: a bad size, no writable v1 memory controller (names the fix).
    """

    def __init__(self, limit: int | str, *, name: str | None = None, root: Path = ROOT):
        self.limit = check_limit(limit)
        if not (root / "memory.limit_in_bytes").exists():
            raise RkmojoError(
                f"{root}: no cgroup-v1 memory controller here; run the bench without "
                "--cgroup-memory, or under `systemd-run --scope -p MemoryMax=…` on cgroup v2"
            )
        self.path = root / own_memory_cgroup().lstrip("/") / (name or f"rkmojo-bench-{os.getpid()}-{time.time_ns()}")

    def __enter__(self) -> "MemoryCgroup":
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
        except PermissionError:
            self.remove()
            raise RkmojoError(
                f"{self.path.parent}: cannot create a memory cgroup here (permission denied); run as root"
            ) from None
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def enter(self) -> None:
        """Move the calling process into the group (use as `preexec_fn`: the child joins before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self) -> dict:
        """Limit, peak usage (page cache included), times the limit was hit, OOM kills."""

        def read(name: str) -> str:
            return (self.path / name).read_text()

        oom = dict(line.split() for line in read("memory.oom_control").splitlines())
        return {
            "limit_bytes": self.limit,
            "max_usage_bytes": int(read("memory.max_usage_in_bytes")),
            "failcnt": int(read("memory.failcnt")),
            "oom_kills": int(oom.get("oom_kill", 0)),
        }

    def run(self, cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, dict]:
        """Run `cmd` inside the group; (the completed process, `usage()` after it ended)."""
        with children_die_with_us():
            proc = subprocess.run(cmd, preexec_fn=self.enter, **kw)
        return proc, self.usage()

    def remove(self) -> None:
        for _ in range(50):  # a just-reaped child can hold the group for a moment
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m inference.bench.cgroup SIZE -- COMMAND [ARGS…]", file=sys.stderr)
        return 2
    try:
        with children_die_with_us(), MemoryCgroup(argv[0]) as g:
            proc, use = g.run(argv[2:])
    except RkmojoError as e:
        print(f"cgroup: error: {e}", file=sys.stderr)
        return 1
    print(
        f"cgroup: limit {use['limit_bytes'] / 2**30:.2f} GiB, peak {use['max_usage_bytes'] / 2**30:.2f} GiB "
        f"(page cache included), limit hit {use['failcnt']} times, OOM kills {use['oom_kills']}",
        file=sys.stderr,
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
