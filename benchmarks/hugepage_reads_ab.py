"""Slot memory in transparent huge pages against 4 KiB pages: the disk's rate for random expert reads, and
a streaming engine's decode, side by side in one process, the order alternating round by round.

`reads`: random expert-sized O_DIRECT reads into one long-lived pool of each kind, (a) kept `--depths` in
flight by preadv threads (the bench's disk probe, `bounds.sustained_bandwidth`) and (b) in batches of
`--batch` through the engine's reader (`bounds.read_bandwidth`, as a generated token's misses go out).
Each run reads blobs of its own seed: a virtual disk's host caches what was read a moment ago, and two
runs over the same blobs time that cache, not the pages.

`decode`: two engines on one store with one memory budget, one with huge-page slots and one without,
each first reading every expert once (a 256-token prompt, so no timed token pays a first digest check),
then taking turns: a short prompt and `--tokens` generated tokens of fresh random ids each, timed, with
the engine's IO wait and the process's user and system CPU.

    .venv/bin/python benchmarks/hugepage_reads_ab.py /work/stores/gemma4-26b-a4b-uniform reads --rounds 4
    .venv/bin/python benchmarks/hugepage_reads_ab.py /work/stores/gemma4-26b-a4b-uniform decode \\
        --memory-budget 4G --rounds 16

Needs `transparent_hugepage` "madvise" or "always" (/sys/kernel/mm/transparent_hugepage/enabled).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.bench import bounds  # noqa: E402
from inference.experts.cache import SlotPool  # noqa: E402
from inference.store import Store  # noqa: E402

KINDS = ("4k", "huge")


def orders(rounds: int):
    for k in range(rounds):
        yield k, KINDS if k % 2 == 0 else KINDS[::-1]


def pooled(pool: SlotPool):
    """`bounds`' pool factory, returning `pool` (long-lived) instead of a fresh one per run."""
    return lambda n, slot_bytes, **kw: pool


def reads(a) -> dict:
    st = Store(a.store)
    blob = max(lay.blob_size for lay in st.expert_layers.values())
    width = max([a.batch, *a.depths])
    pools = {k: SlotPool(width, blob, huge=k == "huge") for k in KINDS}
    layers = sorted(st.expert_layers)
    out: dict[str, dict[str, list[float]]] = {}
    made = bounds.SlotPool
    try:
        for k, kinds in orders(a.rounds):
            for kind in kinds:
                bounds.SlotPool = pooled(pools[kind])
                seed = 1000 * k + 10 * KINDS.index(kind)
                for d in a.depths:
                    r = bounds.sustained_bandwidth(st, d, seconds=a.seconds, seed=seed + d)
                    out.setdefault(f"{d} in flight (preadv)", {}).setdefault(kind, []).append(r["bytes_per_s"] / 1e9)
                r = bounds.read_bandwidth(
                    st, [(l, a.batch) for l in layers], io="auto", seconds=a.seconds, seed=seed + 7
                )
                name = f"batches of {a.batch} ({r['io']})"
                out.setdefault(name, {}).setdefault(kind, []).append(r["bytes_per_s"] / 1e9)
            print(f"round {k} done", flush=True)
    finally:
        bounds.SlotPool = made
    print(f"{'pattern':<28}{'4 KiB GB/s (median; runs)':<40}{'huge GB/s (median; runs)':<40}huge / 4k")
    for name, v in out.items():
        m = {kind: statistics.median(v[kind]) for kind in KINDS}
        runs = {kind: ", ".join(f"{x:.2f}" for x in v[kind]) for kind in KINDS}
        print(
            f"{name:<28}{m['4k']:.2f} ({runs['4k']})".ljust(68)
            + f"{m['huge']:.2f} ({runs['huge']})".ljust(40)
            + f"{m['huge'] / m['4k']:.2f}"
        )
    return out


def decode(a) -> dict:
    from inference.engine import Engine

    engines = {}
    for kind in KINDS:
        os.environ["RKMOJO_HUGEPAGES"] = "1" if kind == "huge" else "0"
        engines[kind] = Engine.open(a.store, memory_budget=a.memory_budget)
    vocab = engines["huge"].model.args.vocab_size
    for e in engines.values():
        e.forward(np.random.default_rng(9).integers(0, vocab, 256))
        e.reset()
    rng = np.random.default_rng(1)
    out: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for k, kinds in orders(a.rounds):
        line = []
        for kind in kinds:
            e = engines[kind]
            e.reset()
            e.forward(rng.integers(0, vocab, 8))
            ids = rng.integers(0, vocab, a.tokens)
            before, cpu, t = dict(e.expert_stats["total"]), os.times(), time.perf_counter()
            for i in ids:
                e.forward([int(i)])
            wall, cpu2, after = time.perf_counter() - t, os.times(), e.expert_stats["total"]
            run = {
                "tok_s": a.tokens / wall,
                "io_wait_ms": (after["read_seconds"] - before["read_seconds"]) / a.tokens * 1e3,
                "mb_per_token": (after["bytes_read"] - before["bytes_read"]) / a.tokens / 1e6,
                "user_s": cpu2.user - cpu.user,
                "sys_s": cpu2.system - cpu.system,
            }
            out[kind].append(run)
            line.append(f"{kind} {run['tok_s']:.2f} tok/s")
        print(f"round {k}: " + ", ".join(line), flush=True)
    med = {kind: {key: statistics.median(r[key] for r in out[kind]) for key in out[kind][0]} for kind in KINDS}
    for kind in KINDS:
        m = med[kind]
        print(
            f"{kind:<5} {m['tok_s']:.2f} tok/s · IO wait {m['io_wait_ms']:.0f} ms/token · {m['mb_per_token']:.0f} MB/token · "
            f"user {m['user_s']:.2f} s, system {m['sys_s']:.2f} s per {a.tokens} tokens (medians of {a.rounds})"
        )
    print(f"huge / 4k decode: {med['huge']['tok_s'] / med['4k']['tok_s']:.3f}")
    for e in engines.values():
        e.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("what", choices=("reads", "decode"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16, 64])
    p.add_argument("--batch", type=int, default=6, help="reads per batch, as a generated token's misses")
    p.add_argument("--seconds", type=float, default=2.0, help="per run of the reads")
    p.add_argument("--memory-budget", default="4G")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--json", help="write the runs here too")
    a = p.parse_args()
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if enabled.exists() and "[never]" in enabled.read_text():
        p.error(f"{enabled} says never: there are no huge pages to compare with")
    out = reads(a) if a.what == "reads" else decode(a)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "runs": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
