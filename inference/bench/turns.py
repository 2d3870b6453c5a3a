"""A streamed prompt in turns with the same prompt all-resident: `rkmojo bench`'s first-token ratio
measured side by side.

The bench's children run one after the other, so its TTFT ratio divides the streamed prompts' median by
the resident prompt's fastest run, timed minutes apart. On a machine whose speed drifts by a tenth within
minutes that ratio carries the drift (the resident runs of one child spread 6.03–7.76 s). Where RAM holds
both children at once (the whole store in the page cache for the resident one, the streaming one's memory
limit beside it), the resident child is started first: it does its own runs, then serves the streaming
child over a Unix socket. Each timed streamed prompt is paired with the same prompt all-resident, run just
after it or just before it (the order alternating prompt by prompt), while the other child waits. A pair's
bound is the larger of that resident prefill and the streamed prompt's reads at the disk's best rate; the
figure is the median of the pairs' ratios (`ttft_ratios`).

Protocol: one JSON line per request, {"tokens": n}, answered by one JSON line, the resident prefill of
the workload's prompt[:n] ({"ttft_s", "next", "major_faults", "user_s", …}); the streaming child's closing the
connection ends the serving.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import subprocess
import time
from pathlib import Path

from ..errors import RkmojoError
from ..sysmem import meminfo
from .paired import ttft_bound

GiB = 2**30
HEADROOM = GiB  # besides the two children: the parent, the kernel's own, what a cgroup's page cache spills


def turns_problem(store, memory_limit: int | None) -> str | None:
    """Why the two children cannot be alive at once on this machine now, or None when they can. The
    resident child needs the store in RAM plus a GiB (as `child_compute` asks), the streaming one its
    memory limit (its cgroup, else its budget; with neither, at most the whole store)."""
    need = store.total_bytes() + GiB + (memory_limit or store.total_bytes()) + HEADROOM
    avail = meminfo().get("MemAvailable", 0)
    if avail < need:
        return (
            f"both children at once need {need / GiB:.1f} GiB of free RAM (the store, the streaming one's limit, 2 GiB), "
            f"{avail / GiB:.1f} GiB available: the prompts were timed one child after the other only"
        )
    return None


def serve(engine, prompt, sock_path: str, ready_path: str) -> list[dict]:
    """In the resident child: listen on `sock_path`, say so by creating `ready_path`, then time the
    resident prefill of prompt[:n] for each request until the streaming child closes the connection.
    Returns every turn served."""
    from .measure import timed_prefill

    served = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(sock_path)
        srv.listen(1)
        tmp = Path(ready_path).with_name(Path(ready_path).name + ".part")
        tmp.write_text(str(os.getpid()))
        tmp.rename(ready_path)
        conn, _ = srv.accept()
        with conn, conn.makefile("rw", encoding="utf-8", newline="\n") as f:
            for line in f:
                n = int(json.loads(line)["tokens"])
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
                p = timed_prefill(engine, prompt[:n])
                turn = {
                    "tokens": n,
                    "ttft_s": p["ttft_s"],
                    "next": p["next"],
                    "others_cpu": p["others_cpu"],
                    "user_s": p["user_s"],
                    "system_s": p["system_s"],
                    # pages read from disk during the turn: a resident prompt slowed by the disk bounds nothing
                    "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults,
                }
                served.append(turn)
                f.write(json.dumps(turn) + "\n")
                f.flush()
    engine.reset()
    return served


class Resident:
    """In the streaming child: the resident child's prefills, asked for one at a time."""

    def __init__(self, sock_path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock_path)
        self.f = self.sock.makefile("rw", encoding="utf-8", newline="\n")
        self.turns = 0

    def prefill(self, n: int) -> dict:
        """The resident child's prefill of the workload's prompt[:n], timed there.

        Raises:
            RkmojoError: the resident child ended (its error is on its stderr).
        """
        self.f.write(json.dumps({"tokens": n}) + "\n")
        self.f.flush()
        line = self.f.readline()
        if not line:
            raise RkmojoError(
                "bench: the resident child ended while serving the prompts' turns; its error is printed above"
            )
        return json.loads(line)

    def paired(self, timed, n: int) -> dict:
        """`timed()` (the streamed prefill of n tokens) with the resident one right after it or right
        before it, the order alternating call by call; the result carries the resident run as "resident"."""
        first = self.turns % 2 == 1
        self.turns += 1
        r = self.prefill(n) if first else None
        p = timed()
        r = r or self.prefill(n)
        return {**p, "resident": {**r, "order": "resident first" if first else "streamed first"}}

    def close(self) -> None:
        self.f.close()
        self.sock.close()


def wait_ready(proc: subprocess.Popen, ready_path: Path, poll_s: float = 0.2) -> None:
    """Until the resident child is serving (it loads the store and does its own runs first).

    Raises:
        RkmojoError: it ended before.
    """
    while not ready_path.exists():
        if proc.poll() is not None:
            raise RkmojoError(
                f"bench: the resident child ended (exit status {proc.returncode}) before serving the prompts' "
                "turns; its error is printed above"
            )
        time.sleep(poll_s)


def ttft_ratios(prefill: dict, bw: float | None) -> dict:
    """Per prompt length with runs timed in turns: each run's TTFT over its pair's bound, max(the resident
    prefill beside it, its own expert bytes at the disk's best rate `bw`), and their median. A median
    below 1.0 is a fault of the measurement; `beyond` counts the single runs below 1.0."""
    out = {}
    for n, p in prefill.items():
        runs = [x for x in p["runs"] if x.get("resident")]
        if not runs:
            continue
        resident = [x["resident"]["ttft_s"] for x in runs]
        ratios = [x["ttft_s"] / ttft_bound(x.get("bytes_read", 0), bw, r)[0] for x, r in zip(runs, resident)]
        med = statistics.median(ratios)
        out[n] = {
            "ratios": ratios,
            "ratio": med,
            "streamed_runs_s": [x["ttft_s"] for x in runs],
            "resident_runs_s": resident,
            "orders": [x["resident"]["order"] for x in runs],
            # CPU seconds of each child over its prompts (medians): a streamed prompt's extra time that is CPU
            "cpu_s": {
                who: {k: statistics.median(get(x)[k] for x in runs) for k in ("user_s", "system_s")}
                for who, get in (("streamed", lambda x: x), ("resident", lambda x: x["resident"]))
            },
            "same_first_token": all(x["next"] == x["resident"]["next"] for x in runs),
            "major_faults": sum(x["resident"]["major_faults"] for x in runs),
            "beyond": sum(r < 1.0 for r in ratios),
            "fault": med < 1.0,
        }
    return out


def turns_lines(t: dict) -> list[str]:
    """The table's lines for `ttft_ratios` (or why the prompts were not timed in turns)."""
    if t.get("skipped"):
        return [f"{'TTFT in turns':<14}not measured: {t['skipped']}"]
    out = []
    for n, x in t.items():
        each = ", ".join(f"{r:.2f}" for r in x["ratios"])
        pairs = "; ".join(f"{s:.2f}/{r:.2f}" for s, r in zip(x["streamed_runs_s"], x["resident_runs_s"]))
        verdict = (
            "MEASUREMENT FAULT: the streamed runs beat the resident ones beside them, so no ratio is reported"
            if x["fault"]
            else f"median {x['ratio']:.2f}"
        )
        cpu = x["cpu_s"]
        pairs += (
            f"; CPU s per prompt, user + system: streamed {cpu['streamed']['user_s']:.2f} + "
            f"{cpu['streamed']['system_s']:.2f}, resident {cpu['resident']['user_s']:.2f} + "
            f"{cpu['resident']['system_s']:.2f}"
        )
        notes = [] if x["same_first_token"] else ["the first tokens DIFFER"]
        if x["major_faults"]:
            notes.append(f"the resident runs faulted {x['major_faults']} pages in from disk")
        out.append(
            f"{'TTFT turns ' + n:<14} streamed / max(the same prompt all-resident beside it, its reads at the "
            f"disk's best rate), per run: {each}; {verdict} (streamed/resident s: {pairs})"
            + (f"; {', '.join(notes)}" if notes else "; the same first token in each pair")
        )
    return out
