"""A streamed prompt's time to first token beside its all-resident bound, in turns, on one machine at once.

`rkmojo bench` times its streamed prompts in one child and the all-resident ones in another, minutes
later, and divides the streamed median by the resident's fastest run. On a machine whose speed drifts by
a tenth within minutes, that ratio carries the drift. Here both engines are loaded at once, each in a
child of its own (the streamed one in a `--cgroup-memory` cgroup, the resident one outside it, its
experts memory-mapped and page-cache warm), and they take turns: each round, both generate `--decode`
tokens and then prefill the same fresh `--prompt-tokens` random ids, one after the other, the order
alternating round by round. Each round's bound is the larger of the resident prefill and reading what
the streamed prompt read at the disk's best rate (random expert-sized O_DIRECT reads, the bench's sweep of
1-64 in flight, probed by this process after the rounds, with the engines gone); each round's ratio is its
streamed TTFT over that bound. Prints every round, the median ratio, and the ratio of the medians.
`--aa` runs a second resident engine in the streamed one's place (outside the cgroup): the spread of a
ratio whose true value is 1.0, on this machine, at this time.

    .venv/bin/python benchmarks/ttft_side_by_side.py /work/stores/gemma4-26b-a4b-uniform \\
        --memory-budget 4G --cgroup-memory 4G --prompt-tokens 128 --decode 16 --rounds 6

Needs root (the cgroup) and RAM for both: the resident engine's experts stay in the page cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(a) -> int:
    """A child: open the engine, then answer one JSON line per `round SEED` line on stdin."""
    from inference.engine import Engine, parse_size

    plan = {"memory_budget": parse_size(a.memory_budget)} if a.serve == "streamed" else {}
    e = Engine.open(a.store, threads=a.threads, **plan)
    vocab = e.model.args.vocab_size
    # a first prompt reads (and digest-checks, or pages in) what a prompt reads; a second warms the rest
    for seed in (10_000, 10_001):
        e.forward(np.random.default_rng(seed).integers(0, vocab, a.prompt_tokens))
        e.reset()
    print(json.dumps({"ready": a.serve}), flush=True)
    for line in sys.stdin:
        seed = int(line.split()[1])
        ids = np.random.default_rng(seed).integers(0, vocab, a.prompt_tokens)
        for k in range(a.decode):  # generated tokens leave the caches as a chat does
            e.forward([int(ids[k % len(ids)])])
        e.reset()
        stats = e.expert_stats.get("total", {}) if e.model.experts.streams else {}
        before = (stats.get("read_seconds", 0.0), stats.get("bytes_read", 0))
        t = time.perf_counter()
        logits = e.forward(ids)
        dt = time.perf_counter() - t
        stats = e.expert_stats.get("total", {}) if e.model.experts.streams else {}
        e.reset()
        out = {
            "ttft_s": dt,
            "io_wait_s": stats.get("read_seconds", 0.0) - before[0],
            "bytes_read": stats.get("bytes_read", 0) - before[1],
            "next": int(np.argmax(logits[-1])),
        }
        print(json.dumps(out), flush=True)
    e.close()
    return 0


def best_rate(store_path: str, seconds: float) -> float:
    """The disk's best rate for random expert reads, bytes/s: the bench's own sweep of 1-64 in flight."""
    from inference.bench import bounds
    from inference.store import Store

    return bounds.best_bandwidth(Store(store_path), seconds=seconds, seed=7_000)["bytes_per_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--memory-budget", default="4G")
    p.add_argument("--cgroup-memory", default=None, help="the streamed child's memory cgroup (default: the budget)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode", type=int, default=16, help="tokens generated before each timed prompt")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--probe-seconds", type=float, default=14.0, help="the disk sweep's time, split over its depths")
    p.add_argument("--aa", action="store_true", help="a second resident engine in the streamed one's place")
    p.add_argument("--serve", choices=("streamed", "resident"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        return serve(a)

    from inference.bench.cgroup import MemoryCgroup, children_die_with_us

    me = [sys.executable, str(Path(__file__).resolve()), a.store, "--memory-budget", a.memory_budget]
    me += ["--prompt-tokens", str(a.prompt_tokens), "--decode", str(a.decode)]
    me += ["--threads", str(a.threads)] if a.threads else []
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "bufsize": 1}
    rounds = []
    with children_die_with_us(), MemoryCgroup(a.cgroup_memory or a.memory_budget) as group:
        kids = {
            "streamed": subprocess.Popen([*me, "--serve", "resident"], **pipes)
            if a.aa
            else subprocess.Popen([*me, "--serve", "streamed"], preexec_fn=group.enter, **pipes),
            "resident": subprocess.Popen([*me, "--serve", "resident"], **pipes),
        }
        try:
            for name, kid in kids.items():  # loaded one after the other: each load reads the disk
                line = kid.stdout.readline()
                if not line:
                    raise SystemExit(f"the {name} child ended before it was ready (exit {kid.wait()})")
            for k in range(a.rounds):
                order = ["streamed", "resident"] if k % 2 == 0 else ["resident", "streamed"]
                got = {}
                for name in order:
                    kids[name].stdin.write(f"round {1000 + k}\n")
                    line = kids[name].stdout.readline()
                    if not line:
                        raise SystemExit(f"the {name} child ended in round {k} (exit {kids[name].wait()})")
                    got[name] = json.loads(line)
                rounds.append(got)
                s, r = got["streamed"], got["resident"]
                same = "same" if s["next"] == r["next"] else "DIFFERENT"
                print(
                    f"round {k} ({order[0]} first): streamed {s['ttft_s']:.2f} s (IO wait {s['io_wait_s']:.2f} s, "
                    f"{s['bytes_read'] / 1e9:.2f} GB read), resident {r['ttft_s']:.2f} s, "
                    f"{s['ttft_s'] / r['ttft_s']:.3f}x; next token {same}",
                    flush=True,
                )
        finally:
            for kid in kids.values():
                kid.stdin.close()
            for kid in kids.values():
                kid.wait()
        use = group.usage()
    if a.aa:
        print("--aa: the 'streamed' engine above was a second resident one")
    rate = best_rate(a.store, a.probe_seconds)
    ratios = []
    for got in rounds:
        s, r = got["streamed"], got["resident"]
        ratios.append(s["ttft_s"] / max(r["ttft_s"], s["bytes_read"] / rate))
    med = {n: statistics.median(g[n]["ttft_s"] for g in rounds) for n in ("streamed", "resident")}
    read_s = statistics.median(g["streamed"]["bytes_read"] for g in rounds) / rate
    print(f"disk's best rate after the rounds: {rate / 1e9:.2f} GB/s; the median prompt's reads at it: {read_s:.2f} s")
    print(
        f"streamed {a.prompt_tokens}-token TTFT / bound, per round: {', '.join(f'{x:.3f}' for x in ratios)}; "
        f"median {statistics.median(ratios):.3f}"
    )
    print(
        f"medians: streamed {med['streamed']:.2f} s, resident {med['resident']:.2f} s, "
        f"ratio {med['streamed'] / max(med['resident'], read_s):.3f}"
    )
    print(
        f"streamed child's cgroup: limit {use['limit_bytes'] / 2**30:.2f} GiB, peak {use['max_usage_bytes'] / 2**30:.2f} "
        f"GiB, limit hit {use['failcnt']} times, OOM kills {use['oom_kills']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
