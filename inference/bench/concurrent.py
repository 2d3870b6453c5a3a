"""`rkmojo bench STORE --concurrent 1,2,4`: aggregate decode speed of N conversations stepped together
(`inference.batch.Batcher`) against one alone, on one engine, in alternating rounds.

Each round runs every N once, in a rotating order, so a machine whose speed drifts within minutes
drifts on every N alike. A run: N prompts of random ids (`prompt_tokens` each, a different one per
sequence) are prefilled, then the clock runs while the batcher decodes until every sequence has
generated `decode_tokens` tokens (sampled at temperature 1 from a fixed seed; a sequence that samples
an end of text stops early and its tokens count as they are). Reported per N: the median aggregate
tok/s (every sequence's tokens over the decode's wall time), its ratio to N = 1's, and, for a streamed
store, the expert bytes read per generated token.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from ..batch import Batcher
from ..events import TokenEvent


def one_run(engine, n: int, prompt_tokens: int, decode_tokens: int, seed: int) -> dict:
    """One run of n sequences: {"tokens", "seconds", "tok_s", "bytes_read"}."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.args.vocab_size
    batcher = Batcher(engine, slots=n)
    seqs = [
        batcher.generate(
            rng.integers(0, min(vocab, 32000), prompt_tokens).tolist(),
            {"max_tokens": decode_tokens, "temperature": 1.0, "seed": seed + i},
        )
        for i in range(n)
    ]
    while any(s.logits is None and not s.finished for s in seqs):  # every prompt in
        batcher.round()
    before = _bytes_read(engine)
    already = sum(_tokens(s) for s in seqs)
    t0 = time.perf_counter()
    batcher.run_until_idle()
    seconds = time.perf_counter() - t0
    tokens = sum(_tokens(s) for s in seqs) - already
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds if seconds > 0 else 0.0,
        "bytes_read": _bytes_read(engine) - before,
    }


def _tokens(seq) -> int:
    return sum(isinstance(e, TokenEvent) for e in list(seq.events.queue))


def _bytes_read(engine) -> int:
    total = (engine.expert_stats or {}).get("total")
    return int(total["bytes_read"]) if total else 0


def run_concurrent(
    engine, counts: list[int], *, prompt_tokens: int = 64, decode_tokens: int = 64, rounds: int = 3, seed: int = 0
) -> dict:
    """Every N of `counts` once per round, `rounds` rounds, the order rotating; the summary per N."""
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    for r in range(rounds):
        order = counts[r % len(counts) :] + counts[: r % len(counts)]
        for n in order:
            runs[n].append(one_run(engine, n, prompt_tokens, decode_tokens, seed + 1000 * r))
    base = statistics.median(x["tok_s"] for x in runs[counts[0]])
    out = {"counts": counts, "rounds": rounds, "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens}
    for n in counts:
        tok_s = statistics.median(x["tok_s"] for x in runs[n])
        tokens = sum(x["tokens"] for x in runs[n])
        out[str(n)] = {
            "tok_s": tok_s,
            "ratio": tok_s / base if base else None,
            "per_round": [round(x["tok_s"], 2) for x in runs[n]],
            "bytes_per_token": sum(x["bytes_read"] for x in runs[n]) / tokens if tokens else None,
        }
    return out


def report(result: dict, first: int) -> str:
    lines = [f"{'N':>3}  {'aggregate tok/s':>16}  {'vs N=' + str(first):>8}  {'expert MB/token':>16}  rounds"]
    for n in result["counts"]:
        r = result[str(n)]
        mb = "-" if not r["bytes_per_token"] else f"{r['bytes_per_token'] / 1e6:.2f}"
        lines.append(f"{n:>3}  {r['tok_s']:>16.2f}  {r['ratio']:>8.2f}  {mb:>16}  {r['per_round']}")
    return "\n".join(lines)


def main(store, counts: list[int], engine_kw: dict, *, prompt_tokens, decode_tokens, rounds, seed, json_out=None):
    from ..engine import Engine

    engine = Engine.open(store, **{**engine_kw, "parallel": max(counts)})
    try:
        result = run_concurrent(
            engine, counts, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens, rounds=rounds, seed=seed
        )
    finally:
        engine.close()
    print(report(result, counts[0]))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result
