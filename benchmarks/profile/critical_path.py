"""Where a streamed token's time goes on the engine's thread, and how much of the CPU between two layers'
expert phases the token then waits for.

A generated token runs, per MoE layer, an expert phase (`StreamingExperts.run`: its reads, the experts as
they land, the dense MLP while they land) and, between two phases, the layer's norms, the next layer's
attention half and its router. The reads of the next layer cannot start before its router has run, so
that CPU sits between one layer's reads and the next layer's; how much of it the token waits for depends
on how much of the disk's work the lookahead's guesses keep going meanwhile. This script measures it
instead of guessing: it adds a fixed busy wait (`--added-ms`) after every expert phase on alternate token
pairs, in one engine, so the disk's drift falls on both alike, and reports the share of the added time
that shows in the token's time. A share of 1 means the CPU between phases is all on the critical path, 0
that the disk hides it; a faster attention half or router pays about that share of what it saves.

    .venv/bin/python -m inference.bench.cgroup 3G -- .venv/bin/python benchmarks/profile/critical_path.py \\
        /work/stores/gemma4-26b-a4b-uniform --memory-budget 3G --tokens 120

It first prints, over `--split-tokens` tokens without anything added, the token's time split into: the
expert phases (what they waited for reads, the experts' compute, the dense MLP, the rest: the streaming
code itself, and the time from the first phase's entry to its first read submitted), the time between
phases and the token boundary (the last phase to the next token's first: the final norm, the LM head,
sampling, the first layer's attention). Only the second token of each pair is timed, as in
`benchmarks/ab.py`, so no timed token pays for what the other mode left running.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


class Split:
    """Wraps one engine's expert source and LM head to time the parts of a token (see the module docstring)."""

    def __init__(self, engine):
        self.ex = engine.model.experts
        self.model = engine.model
        self.added = 0.0  # busy wait after every expert phase, seconds
        self.first = min(self.ex.caches)
        self.t = dict.fromkeys(("phases", "compute", "mlp", "between", "boundary", "logits", "to_submit"), 0.0)
        self.exit: float | None = None
        self.entered: float | None = None
        run, top_up, logits = self.ex.run, self.ex._top_up, self.model.logits

        def timed_run(layer, experts, compute, during_io=None):
            t0 = time.perf_counter()
            if self.exit is not None:
                self.t["boundary" if layer == self.first else "between"] += t0 - self.exit
            self.entered = t0

            def c(batch):
                t = time.perf_counter()
                compute(batch)
                self.t["compute"] += time.perf_counter() - t

            def io():
                t = time.perf_counter()
                try:
                    return during_io()
                finally:
                    self.t["mlp"] += time.perf_counter() - t

            try:
                return run(layer, experts, c, io if during_io else None)
            finally:
                if self.added:
                    stop = time.perf_counter() + self.added
                    while time.perf_counter() < stop:
                        pass
                self.exit = time.perf_counter()
                self.t["phases"] += self.exit - t0 - self.added

        def timed_top_up(layer, batch, queue):
            out = top_up(layer, batch, queue)
            if self.entered is not None:  # the phase's first submission
                self.t["to_submit"] += time.perf_counter() - self.entered
                self.entered = None
            return out

        def timed_logits(h):
            t = time.perf_counter()
            try:
                return logits(h)
            finally:
                self.t["logits"] += time.perf_counter() - t

        self.ex.run, self.ex._top_up, self.model.logits = timed_run, timed_top_up, timed_logits

    def reset(self) -> None:
        for k in self.t:
            self.t[k] = 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--memory-budget", default="3G")
    ap.add_argument("--tokens", type=int, default=120, help="decoded tokens of the A/B, both modes together")
    ap.add_argument("--split-tokens", type=int, default=40, help="decoded tokens of the split, before the A/B")
    ap.add_argument("--added-ms", type=float, default=1.0, help="busy wait after every expert phase, ms")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.added_ms <= 0 or a.tokens < 4 or a.split_tokens < 1:
        raise SystemExit("--added-ms must be above 0, --tokens at least 4 and --split-tokens at least 1")

    from inference.engine import Engine

    e = Engine.open(a.store, memory_budget=a.memory_budget, threads=a.threads)
    try:
        if not getattr(e.model.experts, "streams", False):
            raise SystemExit(f"{a.store} fits --memory-budget {a.memory_budget} whole: nothing is streamed")
        s = Split(e)
        ex = e.model.experts
        layers = len(ex.caches)
        vocab = e.model.args.vocab_size
        rng = np.random.default_rng(a.seed)
        e.forward(rng.integers(10, vocab, a.prompt_tokens).tolist())
        for _ in range(2):
            e.forward([int(rng.integers(10, vocab))])

        s.reset()
        before = ex.stats()["total"]
        t0 = time.perf_counter()
        for _ in range(a.split_tokens):
            e.forward([int(rng.integers(10, vocab))])
        n = a.split_tokens
        total = (time.perf_counter() - t0) / n
        wait = (ex.stats()["total"]["read_seconds"] - before["read_seconds"]) / n
        ms = {k: v / n * 1e3 for k, v in s.t.items()}
        rest = ms["phases"] - wait * 1e3 - ms["compute"] - ms["mlp"]
        print(f"{e.slots} cache slots per layer · {layers} MoE layers · {n} tokens: {total * 1e3:.1f} ms per token")
        print(
            f"  expert phases {ms['phases']:.1f} ms: waiting for reads {wait * 1e3:.1f}, experts {ms['compute']:.1f}, "
            f"dense MLP {ms['mlp']:.1f}, the streaming code {rest:.1f} (entry to first read submitted: "
            f"{ms['to_submit']:.1f})"
        )
        print(
            f"  between phases {ms['between']:.1f} ms ({ms['between'] / (layers - 1):.2f} per gap) · token boundary "
            f"{ms['boundary']:.1f} ms (LM head {ms['logits']:.1f})"
        )

        seen: dict[bool, list[float]] = {False: [], True: []}
        for t in range(a.tokens):
            added = bool((t // 2) % 2)
            s.added = a.added_ms / 1e3 if added else 0.0
            t1 = time.perf_counter()
            e.forward([int(rng.integers(10, vocab))])
            if t % 2:
                seen[added].append(time.perf_counter() - t1)
        s.added = 0.0
        m0, m1 = statistics.median(seen[False]), statistics.median(seen[True])
        per_token = layers * a.added_ms
        print(
            f"added {a.added_ms:g} ms after each expert phase ({per_token:g} ms per token) on {len(seen[True])} tokens, "
            f"none on {len(seen[False])}: median {m0 * 1e3:.1f} -> {m1 * 1e3:.1f} ms per token; "
            f"{(m1 - m0) * 1e3 / per_token:.2f} of the added time shows"
        )
    finally:
        e.close()


if __name__ == "__main__":
    main()
