"""A generated token's lookahead reads promoted into the cache, or not: two streaming engines on one store
in one process, each with its caches, taking turns token by token on the same ids, so that the disk's
drift (on the VMs here one configuration's decode moved by up to 30 % between `rkmojo bench` runs minutes
apart) falls on both alike.

Each engine opens the store within `--memory-budget` (the plan `rkmojo bench --memory-budget` uses, the
lookahead's pools included; two engines take twice that, so run it outside a cgroup of that size), prefills
the same `--prompt-tokens` random ids, then both decode the same `--tokens` random ids, one token each in
turn, alternating which goes first. The difference is `StreamingExperts.promote` (`RKMOJO_PROMOTE`): a miss
the lookahead read is copied into a cache slot once computed, if the policy admits it, or stays out.

    .venv/bin/python benchmarks/promote_ab.py /work/stores/gemma4-26b-a4b-skewed --memory-budget 3G --tokens 96

Prints per engine the median and mean time per token, tok/s, the hit rate, misses and MB read per token,
the experts promoted, and the ratio of the medians.
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
    ap.add_argument("--tokens", type=int, default=96, help="decoded tokens per engine")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    from inference.engine import Engine

    engines = {}
    try:
        for mode in ("on", "off"):
            engines[mode] = e = Engine.open(a.store, memory_budget=a.memory_budget, threads=a.threads)
            if not getattr(e.model.experts, "pf_pools", None):
                raise SystemExit("the engine has no lookahead pools: set RKMOJO_TOKEN_PREFETCH to 1 or more")
            e.model.experts.promote = mode == "on"
        vocab = engines["on"].model.args.vocab_size
        rng = np.random.default_rng(a.seed)
        prompt = rng.integers(10, vocab, a.prompt_tokens).tolist()
        ids = rng.integers(10, vocab, a.tokens).tolist()
        for e in engines.values():
            e.forward(prompt)
            e.model.experts.reset_stats()
        seen = {"on": [], "off": []}
        for t, tok in enumerate(ids):
            for mode in ("on", "off") if t % 2 == 0 else ("off", "on"):
                t0 = time.perf_counter()
                engines[mode].forward([tok])
                seen[mode].append(time.perf_counter() - t0)
        print(f"{engines['on'].slots} cache slots per layer · {a.tokens} tokens per engine after {a.prompt_tokens}")
        med = {}
        for mode, ts in seen.items():
            st = engines[mode].model.experts.stats()["total"]
            med[mode] = statistics.median(ts)
            print(
                f"promote {mode:>3}: median {med[mode] * 1e3:.0f} ms, mean {statistics.mean(ts) * 1e3:.0f} ms per "
                f"token ({1 / med[mode]:.2f} tok/s) · hit rate {st['hit_rate']:.1%} · "
                f"{st['misses'] / a.tokens:.0f} misses, {st['bytes_read'] / a.tokens / 1e6:.0f} MB read per token · "
                f"{st['prefetch_hits']} misses read by the lookahead, {st['promoted']} promoted"
            )
        print(f"on / off: {med['off'] / med['on']:.3f}x tok/s")
    finally:
        for e in engines.values():
            e.close()


if __name__ == "__main__":
    main()
