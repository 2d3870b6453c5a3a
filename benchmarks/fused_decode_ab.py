"""A generated token through the architecture's compiled step against the same token through its Python
layers (`fused_decode` off), alternating token pairs in one engine, so the disk's and the machine's drift
fall on both alike.

Only the second token of each pair is timed (as token_lookahead_ab.py), so no timed token pays for what the
other mode left running. With `--memory-budget all` every expert is resident (no budget, no slots, no
prefetch: the compute-only bound of `rkmojo bench`); warm the page cache first (`cat STORE/experts/* >
/dev/null`) or the first tokens read the store. With a budget the experts stream; run it in a cgroup:

    .venv/bin/python benchmarks/fused_decode_ab.py /work/stores/gemma4-26b-a4b-uniform --memory-budget all
    .venv/bin/python -m inference.bench.cgroup 3G -- .venv/bin/python benchmarks/fused_decode_ab.py \\
        /work/stores/gemma4-26b-a4b-uniform --memory-budget 3G
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--memory-budget", default="all", help='"all" (every expert resident) or a size, e.g. 3G')
    ap.add_argument("--tokens", type=int, default=200, help="decoded tokens, both modes together")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.tokens < 4 or a.prompt_tokens < 1:
        raise SystemExit("--tokens must be at least 4 and --prompt-tokens at least 1")

    from inference.engine import Engine

    resident = a.memory_budget == "all"
    where = (
        {"memory_budget": None, "expert_slots": None, "prefetch": 0} if resident else {"memory_budget": a.memory_budget}
    )
    e = Engine.open(a.store, threads=a.threads, **where)
    try:
        model = e.model
        if not hasattr(model, "fused_decode"):
            raise SystemExit(f"{a.store}: its architecture has no compiled decode step to compare")
        vocab = model.args.vocab_size
        rng = np.random.default_rng(a.seed)
        e.forward(rng.integers(10, vocab, a.prompt_tokens).tolist())
        for _ in range(4):
            e.forward([int(rng.integers(10, vocab))])
        seen: dict[bool, list[float]] = {False: [], True: []}
        for t in range(a.tokens):
            fused = bool((t // 2) % 2)
            model.fused_decode = fused
            t0 = time.perf_counter()
            e.forward([int(rng.integers(10, vocab))])
            if t % 2:
                seen[fused].append(time.perf_counter() - t0)
        model.fused_decode = True
        py, step = statistics.median(seen[False]), statistics.median(seen[True])
        print(
            f"{'all resident' if resident else a.memory_budget}, {len(seen[True])} tokens timed per mode: "
            f"Python layers {py * 1e3:.1f} ms, compiled step {step * 1e3:.1f} ms per token (medians; means "
            f"{statistics.mean(seen[False]) * 1e3:.1f} / {statistics.mean(seen[True]) * 1e3:.1f}); "
            f"the step {py / step:.3f}x as fast"
        )
    finally:
        e.close()


if __name__ == "__main__":
    main()
