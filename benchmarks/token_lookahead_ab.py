"""A generated token's gate lookahead on and off, in one streaming engine, alternating token by token so
that the disk's drift (this script's reason to exist: on the VMs here one configuration's decode moved by
up to 30 % between `rkmojo bench` runs minutes apart) falls on both alike.

The engine opens the store within `--memory-budget` (the budget that `rkmojo bench --memory-budget` plans
with, guess pools included), prefills `--prompt-tokens` random ids, then decodes `--tokens` random ids in
pairs: two tokens with the lookahead reading its best `--guesses` per layer (once the layer's own reads
have landed), two with it off, or reading `--against` guesses (two counts compared: the pools then need
`RKMOJO_TOKEN_PREFETCH` at the larger of the two). Only the second token of a pair is timed, so no token
pays for reads the other mode started. For the memory cgroup, wrap it (root):

    .venv/bin/python -m inference.bench.cgroup 3G -- .venv/bin/python benchmarks/token_lookahead_ab.py \\
        /work/stores/gemma4-26b-a4b-uniform --memory-budget 3G --tokens 160

Prints per mode the median and mean time per token, tok/s, the misses per token and the MB read per token
(used prefetches included), and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--memory-budget", default="3G")
    ap.add_argument("--tokens", type=int, default=160, help="decoded tokens, both modes together")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--guesses", type=int, default=3, help="the lookahead's guesses per layer when on")
    ap.add_argument("--against", type=int, default=0, help="the other mode's guesses per layer (default 0: off)")
    ap.add_argument(
        "--min-precision",
        type=float,
        default=None,
        help="on: read only the guess ranks right at least this share of the time ($RKMOJO_GUESS_PRECISION); "
        "off: every guess (0)",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    from inference.engine import Engine

    e = Engine.open(a.store, memory_budget=a.memory_budget, threads=a.threads)
    try:
        ex = e.model.experts
        if not getattr(ex, "pf_pools", None):
            raise SystemExit("the engine has no lookahead pools: set RKMOJO_TOKEN_PREFETCH to 1 or more")
        pool_n = next(iter(ex.pf_pools.values())).n
        if max(a.guesses, a.against) > pool_n:
            raise SystemExit(
                f"the lookahead pools hold {pool_n} slots: set RKMOJO_TOKEN_PREFETCH={max(a.guesses, a.against)}"
            )
        vocab = e.model.args.vocab_size
        rng = np.random.default_rng(a.seed)
        e.forward(rng.integers(10, vocab, a.prompt_tokens).tolist())
        seen = {"on": [], "off": []}
        for t in range(a.tokens):
            mode = ("on", "off")[(t // 2) % 2]
            ex.token_prefetch = min(a.guesses if mode == "on" else a.against, pool_n)
            if a.min_precision is not None:
                ex.guess_min = a.min_precision if mode == "on" else 0.0
            reading = ex.guess_ranks()
            before = ex.stats()["total"]
            t0 = time.perf_counter()
            e.forward([int(rng.integers(10, vocab))])
            dt = time.perf_counter() - t0
            after = ex.stats()["total"]
            if t % 2:  # the second of the pair
                seen[mode].append(
                    (dt, after["misses"] - before["misses"], after["bytes_read"] - before["bytes_read"], reading)
                )
        print(
            f"{e.slots} cache slots per layer · {a.tokens} tokens · lookahead {a.guesses} guesses when on, {a.against} off"
        )
        med = {}
        for mode, rows in seen.items():
            ts = [r[0] for r in rows]
            med[mode] = statistics.median(ts)
            print(
                f"{mode:>4}: median {med[mode] * 1e3:.0f} ms, mean {statistics.mean(ts) * 1e3:.0f} ms per token "
                f"({1 / med[mode]:.2f} tok/s) over {len(ts)} tokens · "
                f"{statistics.mean(r[1] for r in rows):.0f} misses, "
                f"{statistics.mean(r[2] for r in rows) / 1e6:.0f} MB read per token · "
                f"{statistics.mean(r[3] for r in rows):.2f} guess ranks read"
            )
        print(f"on / off: {med['off'] / med['on']:.3f}x tok/s")
        g = ex.stats()["guesses"]
        print(
            "guess ranks right (all tokens): "
            + ", ".join(f"{r / max(n, 1):.2f}" for r, n in zip(g["right"], g["scored"]) if n)
        )
    finally:
        e.close()


if __name__ == "__main__":
    main()
