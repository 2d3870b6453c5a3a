"""Timed runs of an opened engine, by token ids (no tokenizer): prefill with its time to first
token, and decode, each with the expert cache's counters read before and after.

Decode feeds a fixed, seeded sequence of random token ids by default (`feed="random"`), and still
computes the full logits of every step. Greedy decoding of random weights falls into a loop of a
few tokens whose repeated routing would flatter any cache; `feed="greedy"` is there to see that.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .cachesim import TraceRecorder

FEEDS = ("random", "greedy")
COUNTERS = (
    "requests",
    "hits",
    "misses",
    "bytes_read",
    "read_seconds",
    "land_seconds",
    "prefetched",
    "prefetch_hits",
    "prefetch_cancelled",
    "borrowed",
)


@dataclass
class Workload:
    """What a bench run computes: the same for the streaming and the compute-only runs."""

    prompt_tokens: int = 128  # the prompt before each decode run
    prefill_tokens: tuple[int, ...] = (128, 1024)  # prompts timed for prefill speed and TTFT
    decode_tokens: int = 256
    runs: int = 3
    feed: str = "random"
    seed: int = 0

    def prompt(self, vocab: int) -> np.ndarray:
        n = max((self.prompt_tokens, *self.prefill_tokens))
        return np.random.default_rng(self.seed).integers(0, vocab, n)

    def feed_ids(self, vocab: int) -> np.ndarray:
        return np.random.default_rng(self.seed + 1).integers(0, vocab, self.decode_tokens)

    def as_dict(self) -> dict:
        return asdict(self)


def cpu_mark() -> tuple[float, float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of this process, wall clock) right now."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    t = os.times()
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), t.user + t.system, time.perf_counter()


def others_cpu(mark: tuple[float, float, float]) -> float:
    """Share of all CPUs that other processes used since `mark`: what disturbed a timing."""
    busy, own, wall = cpu_mark()
    used = (busy - mark[0]) - (own - mark[1])
    return min(1.0, max(0.0, used / max(1e-9, (wall - mark[2]) * (os.cpu_count() or 1))))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def counters(engine) -> dict:
    """The expert cache's running totals (zeros when every expert is resident)."""
    t = engine.expert_stats.get("total", {})
    return {k: t.get(k, 0) for k in COUNTERS}


def _since(engine, before: dict) -> dict:
    now = counters(engine)
    return {k: now[k] - before[k] for k in COUNTERS}


def timed_prefill(engine, ids: np.ndarray) -> dict:
    """Prefill `ids` into a fresh sequence; the time to the first token's logits."""
    engine.reset()
    c, mark, cpu = counters(engine), cpu_mark(), os.times()
    t = time.perf_counter()
    logits = engine.forward(ids)
    dt = time.perf_counter() - t
    used = os.times()
    return {
        "tokens": len(ids),
        "ttft_s": dt,
        "tok_s": len(ids) / dt,
        "next": int(np.argmax(logits[-1])),
        "others_cpu": others_cpu(mark),
        # this process's CPU over the prompt, every thread (kernels, readers, landers): where a slower
        # prompt's time went, when it went to CPU
        "user_s": used.user - cpu.user,
        "system_s": used.system - cpu.system,
        **_since(engine, c),
    }


def device_stat(store_path) -> str | None:
    """The `/sys/dev/block/M:m/stat` of the block device that holds the store's expert files (a partition's
    own), or None where there is none (a store on tmpfs or an overlay)."""
    experts = Path(store_path) / "experts"
    try:
        st = os.stat(experts if experts.exists() else store_path)
    except OSError:
        return None
    path = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    return path if os.path.exists(path) else None


def device_counters(stat: str | None) -> tuple[int, int] | None:
    """(bytes read, milliseconds with at least one I/O in flight: `io_ticks`) of a device's stat file."""
    if stat is None:
        return None
    try:
        with open(stat) as f:
            v = f.read().split()
        return int(v[2]) * 512, int(v[9])
    except (OSError, IndexError, ValueError):
        return None


def timed_decode(engine, first: int, feed: np.ndarray | None, n: int) -> dict:
    """`n` decode steps after the current sequence; the fed ids are `feed`, or the argmax when None.

    Where the store is on a block device, the run's record also has "device": what that device did over
    the run, read from its kernel counters before and after (nothing sampled, nothing in the way): the
    bytes it read and the time it had a read in flight ("busy_s"). The rest of the run the disk stood idle,
    the part of a streamed token that no read rate can shorten."""
    c, mark = counters(engine), cpu_mark()
    stat = device_stat(engine.store.path) if getattr(engine, "slots", None) else None
    dev0 = device_counters(stat)
    nxt = first
    t = time.perf_counter()
    for i in range(n):
        logits = engine.forward([nxt])
        nxt = int(feed[i]) if feed is not None else int(np.argmax(logits[-1]))
    dt = time.perf_counter() - t
    dev1 = device_counters(stat)
    if not np.isfinite(logits).all():
        raise FloatingPointError("decode produced non-finite logits; the store's weights are not usable")
    out = {"tokens": n, "seconds": dt, "tok_s": n / dt, "others_cpu": others_cpu(mark), **_since(engine, c)}
    if dev0 is not None and dev1 is not None:
        out["device"] = {"read_bytes": dev1[0] - dev0[0], "busy_s": (dev1[1] - dev0[1]) / 1e3}
    return out


def run_workload(
    engine,
    w: Workload,
    recorder: TraceRecorder | None = None,
    probe: Callable[[], dict] | None = None,
    resident=None,
) -> dict:
    """Decode runs (each after a prefill of the prompt) and the extra prefill prompts.

    Args:
        probe: measures the disk; called after each decode run and each extra prompt, its result kept
            in that run's record (and in the prefill's before a decode run) as "disk": a bound measured
            beside the run it bounds, which a disk whose speed drifts from minute to minute needs.
        resident: a `turns.Resident`: each timed prompt is paired with the same prompt all-resident in
            the other child, right before or after it (kept in the prompt's record as "resident").

    Returns:
        {"decode": {...}, "prefill": {str(n): {...}}} with per-run details and medians.
    """
    vocab = engine.args.vocab_size
    prompt, feed = w.prompt(vocab), w.feed_ids(vocab)

    def phase(p: str) -> None:
        if recorder is not None:
            recorder.phase = p

    def prefill(n: int) -> dict:
        if resident is None:
            return timed_prefill(engine, prompt[:n])
        return resident.paired(lambda: timed_prefill(engine, prompt[:n]), n)

    prefills: dict[int, list[dict]] = {}
    decodes = []
    for _ in range(w.runs):
        phase("prefill")
        p = prefill(w.prompt_tokens)
        prefills.setdefault(w.prompt_tokens, []).append(p)
        phase("decode")
        d = timed_decode(engine, p["next"], feed if w.feed == "random" else None, w.decode_tokens)
        if probe is not None:
            p["disk"] = d["disk"] = probe()
        decodes.append(d)
    phase("prefill")
    for n in w.prefill_tokens:
        if n not in prefills:
            p = prefill(n)
            if probe is not None:
                p["disk"] = probe()
            prefills[n] = [p]
    engine.reset()
    return {
        "decode": summarize_decode(decodes),
        "prefill": {str(n): summarize_prefill(r) for n, r in prefills.items() if n in w.prefill_tokens},
    }


def summarize_decode(runs: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in runs)
    sums = {k: sum(r[k] for r in runs) for k in COUNTERS}
    return {
        "tok_s": statistics.median(r["tok_s"] for r in runs),
        "runs": runs,
        "hit_rate": sums["hits"] / sums["requests"] if sums["requests"] else None,
        "expert_mb_per_token": sums["bytes_read"] / tokens / 1e6,
        "io_wait_ms_per_token": sums["read_seconds"] / tokens * 1e3,
        "land_ms_per_token": sums["land_seconds"] / tokens * 1e3,
        "miss_bytes_per_token": sums["bytes_read"] / tokens,
        "prefetched": sums["prefetched"],
        "prefetch_hits": sums["prefetch_hits"],
        "prefetch_recall": sums["prefetch_hits"] / sums["misses"] if sums["misses"] else None,
        "prefetch_precision": sums["prefetch_hits"] / sums["prefetched"] if sums["prefetched"] else None,
        # bytes_read counts the prefetches that were used; the others were read for nothing
        "prefetch_wasted_mb_per_token": (
            (sums["prefetched"] - sums["prefetch_hits"] - sums["prefetch_cancelled"])
            * sums["bytes_read"]
            / max(1, sums["misses"])
            / tokens
            / 1e6
        ),
        "others_cpu_max": max(r["others_cpu"] for r in runs),
        "device": summarize_device(runs),
    }


def summarize_device(runs: list[dict]) -> dict | None:
    """What the store's device did over the decode runs together (`timed_decode`): the share of their
    time it had a read in flight, its rate then, and the bytes it read per token (the experts used, the
    guesses that were not, and anything else read from that device meanwhile)."""
    if not runs or any("device" not in r for r in runs):
        return None
    seconds = sum(r["seconds"] for r in runs)
    busy = sum(r["device"]["busy_s"] for r in runs)
    read = sum(r["device"]["read_bytes"] for r in runs)
    return {
        "busy_share": min(busy / seconds, 1.0) if seconds else None,
        "busy_bytes_per_s": read / busy if busy else None,
        "bytes_per_token": read / sum(r["tokens"] for r in runs),
        "busy_s": busy,
        "seconds": seconds,
    }


def summarize_prefill(runs: list[dict]) -> dict:
    """One definition of time to first token: the median over the runs of the time from the prompt's
    submission to its last row's logits; the prefill speed is derived from that same figure (medians
    of an even count of runs taken separately contradicted each other: 5.4 tok/s with a 44 s TTFT)."""
    ttft = statistics.median(r["ttft_s"] for r in runs)
    return {"ttft_s": ttft, "tok_s": runs[0]["tokens"] / ttft, "runs": runs}
