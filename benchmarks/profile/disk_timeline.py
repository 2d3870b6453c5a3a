"""What the disk does during a streamed prompt: the store's block device sampled every few
milliseconds (its in-flight count and bytes read, `/sys/dev/block/M:m/stat`) beside the engine's layer
boundaries, in one process with no memory cgroup.

    .venv/bin/python benchmarks/profile/disk_timeline.py /work/stores/gemma4-26b-a4b-uniform \\
        --expert-slots 16 --prefetch 6 --tokens 128

Prints the prefill's wall time, the bytes the device read and their rate, the share of the time with no
read in flight, the time spent at each depth (and the device's rate then), and per layer: when the engine
entered its expert phase, how long it stayed, what the disk read between the previous layer's expert phase
and this one (the attention), and the time with no read in flight there and inside the expert phase. A
first 128-token prompt runs untimed first (it verifies the digests of the experts it reads), as in `rkmojo
bench`, whose later prompts find its last experts in the slots (`--warm-decode N`: it also generates N
tokens, so that the timed prompt, another one, meets a cache a chat left, as `rkmojo bench`'s prompts do).
Reads are O_DIRECT, so the page cache plays no part.

`--decode N` times N generated tokens after the prompt instead, and prints per layer and token the time
before its expert phase and in it, with the time no read was in flight in each (the token's LM head, which
precedes the first layer, is in that layer's "before"), and how much of the idle time inside the phases
fell in their last thirds (where the layer's reads have landed and its lookahead should keep the disk busy):

    .venv/bin/python -m inference.bench.cgroup 3G -- .venv/bin/python benchmarks/profile/disk_timeline.py \
        /work/stores/gemma4-26b-a4b-uniform --memory-budget 3G --prefetch 0 --decode 24 --period-ms 1
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

from inference.bench.measure import device_stat


def read_stat(f) -> tuple[int, int]:
    """(sectors read, I/Os in flight) of the device."""
    f.seek(0)
    v = f.read().split()
    return int(v[2]), int(v[8])


class Sampler(threading.Thread):
    def __init__(self, path: str, period: float):
        super().__init__(daemon=True)
        self.f = open(path)  # noqa: SIM115 (closed in run)
        self.period = period
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.samples.append((time.perf_counter(), *read_stat(self.f)))
                time.sleep(self.period)
        finally:
            self.f.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--expert-slots", type=int, default=16)
    ap.add_argument("--prefetch", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--period-ms", type=float, default=2.0)
    ap.add_argument("--memory-budget", help="plan the slots for this budget (e.g. 3G) instead of --expert-slots")
    ap.add_argument(
        "--warm-decode",
        type=int,
        default=0,
        metavar="N",
        help="decode N tokens after the untimed prompt, as `rkmojo bench`'s runs leave the caches (prompt mode)",
    )
    ap.add_argument(
        "--decode",
        type=int,
        default=0,
        metavar="N",
        help="time N generated tokens after the prompt instead of the prompt",
    )
    a = ap.parse_args()
    from inference.engine import Engine

    kw = {"memory_budget": a.memory_budget} if a.memory_budget else {"expert_slots": a.expert_slots}
    e = Engine.open(a.store, threads=a.threads, prefetch=a.prefetch, **kw)
    try:
        ids = np.random.default_rng(0).integers(0, e.model.args.vocab_size, a.tokens)
        e.reset()
        e.forward(ids[:128])
        for t in range(a.warm_decode):
            e.forward([int(ids[t % len(ids)])])
        e.reset()
        ids = np.random.default_rng(1).integers(0, e.model.args.vocab_size, a.tokens)  # another prompt
        if a.decode:  # the prompt untimed, then its greedy continuation timed
            nxt = int(np.argmax(np.asarray(e.forward(ids))[-1]))
        src = e.model.experts
        marks: list[tuple[float, float, int]] = []  # (enter, leave, layer)
        inner = src.run

        def run(layer, *args, **kw):
            t = time.perf_counter()
            try:
                return inner(layer, *args, **kw)
            finally:
                marks.append((t, time.perf_counter(), layer))

        src.run = run
        stat = device_stat(a.store)
        if stat is None:
            raise SystemExit(f"{a.store}: its experts are on no block device (tmpfs, overlay): nothing to sample")
        s = Sampler(stat, a.period_ms / 1000)
        s.start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        if a.decode:
            for _ in range(a.decode):
                nxt = int(np.argmax(np.asarray(e.forward([nxt]))[-1]))
        else:
            e.forward(ids)
        t1 = time.perf_counter()
        time.sleep(0.05)
        s.stop.set()
        s.join()
    finally:
        e.close()
    sm = [x for x in s.samples if t0 <= x[0] <= t1]
    wall = t1 - t0
    gb = (sm[-1][1] - sm[0][1]) * 512 / 1e9
    depth = np.array([x[2] for x in sm])
    dt = np.diff([x[0] for x in sm], append=t1)
    idle = float(dt[depth == 0].sum())
    what = f"{a.decode} generated tokens" if a.decode else f"prefill of {a.tokens} tokens"
    print(f"{what}: {wall:.2f} s; the device read {gb:.2f} GB, {gb / wall:.2f} GB/s")
    print(f"no read in flight: {idle:.2f} s ({idle / wall:.0%}); while reading: {gb / max(wall - idle, 1e-9):.2f} GB/s")
    ts = np.array([x[0] for x in sm])
    sectors = np.array([x[1] for x in sm])
    got = np.diff(sectors, append=sectors[-1]) * 512  # read in each sampling period, at the depth it began with
    edges = [0, 1, 2, 3, 4, 8, 16, 32, 64, 1 << 30]
    for lo, hi in zip(edges, edges[1:], strict=False):
        at = (depth >= lo) & (depth < hi)
        sec = float(dt[at].sum())
        if sec:
            name = f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1 if hi < 1 << 30 else 'more'}"
            rate = f", {float(got[at].sum()) / sec / 1e9:.2f} GB/s" if lo else ""
            print(f"  in flight {name}: {sec:.2f} s ({sec / wall:.0%}){rate}")
    if a.decode:  # per layer over every token: time in the expert phase, idle before and inside it
        per: dict[int, list[float]] = {}
        prev = t0
        tail = 0.0  # idle in the last third of the expert phases: after the layer's reads, before the next layer's
        for enter, leave, layer in marks:
            before = float(dt[(ts >= prev) & (ts < enter) & (depth == 0)].sum())
            inside = float(dt[(ts >= enter) & (ts < leave) & (depth == 0)].sum())
            tail += float(dt[(ts >= enter + (leave - enter) * 2 / 3) & (ts < leave) & (depth == 0)].sum())
            p = per.setdefault(layer, [0.0, 0.0, 0.0, 0.0])
            p[0] += enter - prev
            p[1] += leave - enter
            p[2] += before
            p[3] += inside
            prev = leave
        n = a.decode
        print("layer  ms per token: before its expert phase (idle), in it (idle)")
        for layer, (b, i, ib, ii) in sorted(per.items()):
            print(f"{layer:5d}  {b / n * 1e3:6.1f} ({ib / n * 1e3:4.1f})  {i / n * 1e3:6.1f} ({ii / n * 1e3:4.1f})")
        tot = np.sum(list(per.values()), axis=0) / n * 1e3
        print(
            f"per token: {wall / n * 1e3:.0f} ms; between expert phases {tot[0]:.0f} ms (idle {tot[2]:.0f}), "
            f"in them {tot[1]:.0f} ms (idle {tot[3]:.0f}, of which {tail / n * 1e3:.0f} in their last thirds)"
        )
        return
    print("layer  enter s  in run s  GB read since the previous expert phase  idle s: before the run, in it")
    prev = t0
    idle_before = idle_in = 0.0
    for enter, leave, layer in marks:
        before = float(dt[(ts >= prev) & (ts < enter) & (depth == 0)].sum())
        inside = float(dt[(ts >= enter) & (ts < leave) & (depth == 0)].sum())
        idle_before, idle_in = idle_before + before, idle_in + inside
        got = (np.interp(enter, ts, sectors) - np.interp(prev, ts, sectors)) * 512 / 1e9
        print(f"{layer:5d}  {enter - t0:7.2f}  {leave - enter:8.2f}  {got:6.3f}  {before:6.3f}  {inside:6.3f}")
        prev = leave
    print(f"idle before the layers' expert phases {idle_before:.2f} s, in them {idle_in:.2f} s")


if __name__ == "__main__":
    main()
