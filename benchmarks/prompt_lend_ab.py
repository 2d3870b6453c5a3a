"""A prompt's lookahead with and without the slots finished layers lend it, in one streaming engine,
alternating prompt by prompt so that the disk's drift (on the VMs here up to 30 % between `rkmojo bench`
runs minutes apart) falls on both alike.

The engine opens the store within `--memory-budget` (the budget `rkmojo bench --memory-budget` plans
with). Each round prefills a fresh sequence of `--prompt-tokens` random ids with lending on or off (the
order alternates between rounds), then decodes `--tokens` random ids after it with lending as it is (a
generated token never borrows; what it sees is the cache the prompt left). A first prompt runs untimed
(it verifies the digests of the experts it reads). For the memory cgroup, wrap it (root):

    .venv/bin/python -m inference.bench.cgroup 4G -- .venv/bin/python benchmarks/prompt_lend_ab.py \\
        /work/stores/gemma4-26b-a4b-uniform --memory-budget 4G --rounds 6

Prints every round's time to first token and decode tok/s per mode, their medians and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--memory-budget", default="4G")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16, help="decoded tokens after each prompt")
    ap.add_argument("--rounds", type=int, default=6, help="prompts timed, both modes together")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    from inference.engine import Engine

    e = Engine.open(a.store, memory_budget=a.memory_budget)
    try:
        ex = e.model.experts
        if not getattr(ex, "pf_pools", None):
            raise SystemExit("the engine has no lookahead pools: RKMOJO_TOKEN_PREFETCH must be 1 or more")
        vocab = e.model.args.vocab_size
        rng = np.random.default_rng(a.seed)
        e.reset()
        e.forward(rng.integers(10, vocab, a.prompt_tokens).tolist())  # untimed: digests, a full cache
        seen: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for k in range(a.rounds):
            mode = ("on", "off")[(k + k // 2) % 2]  # on off off on on off ...
            ex.lend = mode == "on"
            e.reset()
            t = time.perf_counter()
            e.forward(rng.integers(10, vocab, a.prompt_tokens).tolist())
            ttft = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(a.tokens):
                e.forward([int(rng.integers(10, vocab))])
            tok_s = a.tokens / (time.perf_counter() - t)
            seen[mode].append((ttft, tok_s))
            print(f"round {k + 1} lend {mode}: TTFT {ttft:.2f} s, then decode {tok_s:.2f} tok/s", flush=True)
        print(f"{e.slots} cache slots per layer · {a.prompt_tokens}-token prompts · {a.tokens} tokens after each")
        med = {
            m: (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
            for m, rows in seen.items()
        }
        for m, (ttft, tok_s) in med.items():
            print(f"lend {m:<4} TTFT median {ttft:.2f} s · decode median {tok_s:.2f} tok/s")
        print(f"on / off: TTFT {med['on'][0] / med['off'][0]:.2f} · decode {med['on'][1] / med['off'][1]:.2f}")
    finally:
        e.close()


if __name__ == "__main__":
    main()
