"""The first tokens of a fresh engine, with and without its expert caches warmed from saved popularity.

A "history" run decodes on the store and saves each layer's expert request counts (what a worker keeps
in `POPULARITY_DIR/NAME.npz`). Then, in fresh processes with the page cache dropped before each, "cold"
and "warm" take turns: both prefill the same prompt (other ids than the history's) and decode `--tokens`
tokens; "warm" first fills its caches from the saved counts, as the worker does while idle after a
load, and that warming time is reported apart. Root is needed to drop the page cache.

    rkmojo synth --shape gemma4-26b-a4b --layers 6 --router skewed /work/stores/gemma6-skewed
    .venv/bin/python benchmarks/warm_start.py /work/stores/gemma6-skewed [--slots 16] [--tokens 64] [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(store: str, mode: str, pop: str, slots: int, prompt: int, tokens: int, threads: int, seed: int) -> dict:
    import numpy as np

    from inference.engine import Engine

    rng = np.random.default_rng(seed)
    ids = rng.integers(300, 20000, prompt + tokens).tolist()
    e = Engine.open(store, expert_slots=slots, threads=threads)
    out = {"mode": mode}
    if mode == "warm":
        t = time.perf_counter()
        out["warmed_experts"] = e.warm_experts(pop)
        out["warm_s"] = time.perf_counter() - t
    t = time.perf_counter()
    e.forward(ids[:prompt])
    out["prefill_s"] = time.perf_counter() - t
    for i in ids[prompt:]:
        e.forward([i])
    out["decode_s"] = time.perf_counter() - t - out["prefill_s"]
    out["first_tokens_s"] = time.perf_counter() - t
    total = e.expert_stats["total"]
    out["hit_rate"] = total["hits"] / max(1, total["requests"])
    out["mb_read"] = total["bytes_read"] / 1e6
    if mode == "history":
        e.save_popularity(pop)
    e.close()
    return out


def run(a, mode: str, seed: int) -> dict:
    from inference.bench.bounds import drop_caches

    if not drop_caches():
        sys.exit("warm_start: run as root (the page cache is dropped before each run)")
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        a.store,
        "--pop",
        a.pop,
        "--slots",
        str(a.slots),
        "--prompt",
        str(a.prompt),
        "--tokens",
        str(a.tokens),
        "--threads",
        str(a.threads),
        "--seed",
        str(seed),
    ]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--history-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pop", default=None, help="popularity file (default: a temporary one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.store, a.child, a.pop, a.slots, a.prompt, a.tokens, a.threads, a.seed)))
        return
    a.pop = a.pop or str(Path(tempfile.mkdtemp()) / "popularity.npz")
    hist = run(argparse.Namespace(**{**vars(a), "tokens": a.history_tokens}), "history", a.seed + 1000)
    print(f"history: {a.history_tokens} tokens, hit rate {hist['hit_rate']:.2f}; saved {a.pop}")
    res = {"cold": [], "warm": []}
    for r in range(a.rounds):
        for mode in ("cold", "warm"):
            res[mode].append(run(a, mode, a.seed + r))
            x = res[mode][-1]
            print(
                f"  round {r} {mode}: prompt {a.prompt} + {a.tokens} tokens in {x['first_tokens_s']:.2f} s "
                f"(prefill {x['prefill_s']:.2f} s, decode {a.tokens / x['decode_s']:.2f} tok/s), hit rate "
                f"{x['hit_rate']:.2f}, {x['mb_read']:.0f} MB read"
                + (f"; warming read {x['warmed_experts']} experts in {x['warm_s']:.2f} s" if mode == "warm" else "")
            )
    med = {m: statistics.median(x["first_tokens_s"] for x in v) for m, v in res.items()}
    print(
        f"median time to the first {a.tokens} tokens: cold {med['cold']:.2f} s, warm {med['warm']:.2f} s "
        f"(warm / cold {med['warm'] / med['cold']:.2f}); warming itself (idle time) median "
        f"{statistics.median(x['warm_s'] for x in res['warm']):.2f} s"
    )


if __name__ == "__main__":
    main()
