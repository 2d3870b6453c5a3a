"""A home's mix: a streamed chat sent while three background requests run, against the same chat on an idle
worker, through the real stack.

A private stack (redis-server, daphne, one Celery worker: `tests/appliance/conftest.Stack`) serves the demo
SmolLM2 store with `RKMOJO_PARALLEL` = `--parallel`. Each round, in turn:

    idle: a streamed chat on the idle worker;
    busy: three non-streamed requests with max_tokens 1000 (background: `webui/api/priority.py`; their end of
          text biased away, so each runs its 1000 tokens), then, once the worker runs them, the same chat.

Time to first token is measured at the client (from the request to the first content chunk). Printed: the
p50 and p95 TTFT of idle and busy chats and the p95 ratio (the goal: within 1.5x of idle), and the
background requests' aggregate tok/s.

    .venv/bin/python benchmarks/home_mix.py [--parallel 4] [--rounds 10] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "appliance")]

MODEL = "smollm2"
CHAT = [{"role": "user", "content": "Which room is the kitchen light in? Answer in a few words."}]


def ttft(oai) -> float:
    t0 = time.perf_counter()
    for chunk in oai.chat.completions.create(model=MODEL, messages=CHAT, stream=True, temperature=0, max_tokens=16):
        if chunk.choices and chunk.choices[0].delta.content:
            return time.perf_counter() - t0
    return time.perf_counter() - t0


def background(oai, i: int, out: list) -> None:
    t0 = time.perf_counter()
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Write a long story about a lighthouse keeper, part {i}."}],
        max_tokens=1000,
        temperature=0.8,
        seed=i,
        logit_bias={"2": -100},
    )
    out.append((r.usage.completion_tokens, time.perf_counter() - t0))


def _active(stack) -> int:
    return int((stack.registration("board-a") or {}).get("active") or 0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from conftest import Stack

    from inference.convert.gguf import convert_gguf
    from inference.demo import demo_gguf

    base = Path(tempfile.mkdtemp(prefix="home-mix-"))
    store = convert_gguf(demo_gguf(), base / "store", progress=False)
    stack = Stack(
        base / "stack",
        store,
        RKMOJO_CONTEXT="4096",
        RKMOJO_PARALLEL=str(args.parallel),
        RKMOJO_THREADS=str(args.threads),
        OMP_NUM_THREADS=str(args.threads),
    )
    idle, busy, bg = [], [], []
    try:
        oai = stack.openai(timeout=900)
        ttft(oai)  # the model loaded and warm
        for r in range(args.rounds):
            idle.append(ttft(oai))
            done: list = []
            threads = [
                threading.Thread(target=background, args=(stack.openai(timeout=900), 3 * r + k, done)) for k in range(3)
            ]
            for t in threads:
                t.start()
            running = min(3, args.parallel)
            stack.wait_until(lambda: _active(stack) >= running, 60)  # noqa: B023 (waited for here, in this round)
            time.sleep(0.5)  # the background requests decoding, not only admitted
            busy.append(ttft(oai))
            for t in threads:
                t.join()
            bg += done
            print(f"round {r + 1}: idle {idle[-1] * 1000:.0f} ms, busy {busy[-1] * 1000:.0f} ms", flush=True)
    finally:
        stack.stop()
    result = {
        "parallel": args.parallel,
        "rounds": args.rounds,
        "threads": args.threads,
        "idle_ms": [round(x * 1000, 1) for x in idle],
        "busy_ms": [round(x * 1000, 1) for x in busy],
        "idle_p50_ms": statistics.median(idle) * 1000,
        "idle_p95_ms": pct(idle, 0.95) * 1000,
        "busy_p50_ms": statistics.median(busy) * 1000,
        "busy_p95_ms": pct(busy, 0.95) * 1000,
        "background_tokens": sum(n for n, _ in bg),
    }
    result["p95_ratio"] = result["busy_p95_ms"] / result["idle_p95_ms"]
    print(
        f"parallel {args.parallel}: TTFT idle p50 {result['idle_p50_ms']:.0f} ms p95 {result['idle_p95_ms']:.0f} ms; "
        f"with three background requests p50 {result['busy_p50_ms']:.0f} ms p95 {result['busy_p95_ms']:.0f} ms; "
        f"p95 ratio {result['p95_ratio']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
