"""`rkmojo bench STORE --concurrent 1,2,4`: aggregate decode speed of N sequences stepped together
(`Transformer.decode_batch`, the step `inference.batch` runs) against one alone, on one engine, in
alternating rounds.

Each round runs every N once, in a rotating order, so a machine whose speed drifts within minutes
drifts on every N alike. A run: N prompts of random ids (`prompt_tokens` each, a different one per
sequence) are prefilled, each in a KV cache of its own; then the clock runs while `decode_tokens` steps
feed every sequence a fixed random id (as `rkmojo bench` times decode: the model's work, not sampling's).
Each run is a child process that opens the engine with `parallel` = N, so a memory budget is split for N
KV caches as a server with N slots splits it, and starts with empty expert caches. Reported per N: the median aggregate tok/s (N × steps over the steps'
wall time), its ratio to the first N's, and, for a streamed store, the expert bytes read per generated
token and the expert slots per layer the budget left.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np

from .. import kernels
from ..errors import RkmojoError


def one_run(engine, n: int, prompt_tokens: int, decode_tokens: int, seed: int) -> dict:
    """One run of n sequences: {"tokens", "seconds", "tok_s", "bytes_read"}."""
    rng = np.random.default_rng(seed)
    model = engine.model
    vocab = min(model.args.vocab_size, 32000)
    caches = [model.new_cache() for _ in range(n)]
    steps = [model.step_class(model) if model.step_class is not None else None for _ in range(n)]
    feed = rng.integers(0, vocab, (decode_tokens, n))
    with kernels.configured(engine.cfg.threads, engine.cfg.activations):
        for cache in caches:
            model.forward(rng.integers(0, vocab, prompt_tokens), cache, last_only=True, prompt=True)
        before = _bytes_read(engine)
        t0 = time.perf_counter()
        for ids in feed:
            model.decode_batch(ids.tolist(), caches, steps)
        seconds = time.perf_counter() - t0
    tokens = n * decode_tokens
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds if seconds > 0 else 0.0,
        "bytes_read": _bytes_read(engine) - before,
    }


def _bytes_read(engine) -> int:
    total = (engine.expert_stats or {}).get("total")
    return int(total["bytes_read"]) if total else 0


def run_concurrent(
    run, counts: list[int], *, prompt_tokens: int = 64, decode_tokens: int = 64, rounds: int = 3, seed: int = 0
) -> dict:
    """Every N of `counts` once per round, `rounds` rounds, the order rotating; the summary per N.
    `run(n, prompt_tokens, decode_tokens, seed)` is one run's result (`one_run` on an engine opened for
    it, `child_run`)."""
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    for r in range(rounds):
        order = counts[r % len(counts) :] + counts[: r % len(counts)]
        for n in order:
            runs[n].append(run(n, prompt_tokens, decode_tokens, seed + 1000 * r))
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
            "expert_slots": runs[n][0]["slots"],
        }
    return out


def child_run(store, engine_kw: dict):
    """`run` for `run_concurrent`: each run in a child process of its own (this module's `__main__`), which
    opens the engine with parallel = n: the memory a run leaves behind never counts in the next one's (a
    memory cgroup around the bench holds every child in turn)."""

    def run(n: int, prompt_tokens: int, decode_tokens: int, seed: int) -> dict:
        spec = {
            "store": str(store),
            "engine": {**engine_kw, "parallel": n},
            "n": n,
            "prompt_tokens": prompt_tokens,
            "decode_tokens": decode_tokens,
            "seed": seed,
        }
        done = subprocess.run(
            [sys.executable, "-m", "inference.bench.concurrent", json.dumps(spec)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RkmojoError(f"a run of {n} sequences failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def report(result: dict, first: int) -> str:
    head = (
        f"{'N':>3}  {'aggregate tok/s':>16}  {'vs N=' + str(first):>8}  {'expert MB/token':>16}  {'slots':>5}  rounds"
    )
    lines = [head]
    for n in result["counts"]:
        r = result[str(n)]
        mb = "-" if not r["bytes_per_token"] else f"{r['bytes_per_token'] / 1e6:.2f}"
        slots = r["expert_slots"] if r["expert_slots"] is not None else "-"
        lines.append(f"{n:>3}  {r['tok_s']:>16.2f}  {r['ratio']:>8.2f}  {mb:>16}  {slots:>5}  {r['per_round']}")
    return "\n".join(lines)


def main(store, counts: list[int], engine_kw: dict, *, prompt_tokens, decode_tokens, rounds, seed, json_out=None):
    result = run_concurrent(
        child_run(store, engine_kw),
        counts,
        prompt_tokens=prompt_tokens,
        decode_tokens=decode_tokens,
        rounds=rounds,
        seed=seed,
    )
    print(report(result, counts[0]))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _child(spec: dict) -> dict:
    from ..engine import Engine

    engine = Engine.open(spec["store"], **spec["engine"])
    try:
        r = one_run(engine, spec["n"], spec["prompt_tokens"], spec["decode_tokens"], spec["seed"])
        return {**r, "slots": engine.slots}
    finally:
        engine.close()


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
