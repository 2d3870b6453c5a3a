"""Prompt caches under a soak-like mix: two chat conversations taking turns through the real worker, with
API requests between them.

A private stack (redis-server, daphne, one Celery worker: `tests/appliance/conftest.Stack`) serves the demo
SmolLM2 store at `--context` tokens (4096, the default the soak ran with). Each round:

    A returning · A continuing · an API chat · B returning · B continuing · an API completion

"returning" is a conversation's turn after the other one and an API request ran: its KV comes back from
its prompt-cache file (or, while that is still being written, the copy in memory); "continuing" is its
next turn at once, its KV still in the engine. Each turn adds a question of the same length and asks for
`--answer-tokens` tokens at temperature 0; the first turns are ~300 tokens, so the full layers' KV grows
past its first 256 rows, as a long conversation's does. Time to first token is measured at the client
(streamed, from the request to the first content chunk).

Printed: the share of prompt-cache loads that succeeded (the worker log's "restored prompt cache" against
"dropping prompt cache" lines), how many returning turns reused their whole history (the usage's
cached_tokens), the median TTFT of returning and continuing turns and their ratio, and the prompt-cache
directory's size at the end.

    .venv/bin/python benchmarks/prompt_cache_mix.py [--rounds 12] [--context 4096] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "appliance")]

MODEL = "smollm2"


def first_turn(topic: str) -> list[dict]:
    facts = " ".join(f"Fact {i}: the {topic} number {i} is {i * 7 % 13}." for i in range(18))
    return [{"role": "user", "content": f"{facts} Which {topic} number is largest?"}]


def turn(oai, messages: list[dict], max_tokens: int) -> tuple[float, str, object]:
    """(TTFT s, the answer, its usage) of one streamed chat turn."""
    t0 = time.perf_counter()
    ttft, text, usage = None, [], None
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                text.append(c.delta.content)
    return ttft or time.perf_counter() - t0, "".join(text), usage


class Conversation:
    def __init__(self, topic: str):
        self.topic, self.messages, self.held, self.n = topic, first_turn(topic), 0, 0

    def step(self, oai, max_tokens: int) -> dict:
        """One turn: the question after the last answer; what it cost and how much it reused."""
        ttft, answer, usage = turn(oai, self.messages, max_tokens)
        prompt, cached = usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens
        reused_all = self.held == 0 or cached >= self.held - 2  # the engine recomputes the last token or two
        self.held = prompt + usage.completion_tokens
        self.n += 1
        self.messages += [
            {"role": "assistant", "content": answer},
            {
                "role": "user",
                "content": f"Now list the {self.topic} numbers above {self.n % 10}, question {self.n:03d}.",
            },
        ]
        return {"ttft": ttft, "prompt": prompt, "cached": cached, "reused_all": reused_all}


def api_traffic(oai, i: int) -> None:
    """The requests between the conversations: one-off chats and completions from other clients."""
    if i % 2:
        oai.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "You are a terse assistant for a home automation system."},
                {"role": "user", "content": f"Request {i}: is the kitchen light on? Answer yes or no."},
            ],
            max_tokens=8,
            temperature=0,
        )
    else:
        oai.completions.create(model=MODEL, prompt=f"Item {i}. The capital of France is", max_tokens=8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from conftest import Stack

    from inference.convert.gguf import convert_gguf
    from inference.demo import demo_gguf

    base = Path(tempfile.mkdtemp(prefix="prompt-cache-mix-"))
    store = convert_gguf(demo_gguf(), base / "store", progress=False)
    stack = Stack(
        base / "stack",
        store,
        RKMOJO_CONTEXT=str(args.context),
        RKMOJO_THREADS=str(args.threads),
        OMP_NUM_THREADS=str(args.threads),
    )
    try:
        oai = stack.openai(timeout=600)
        a, b = Conversation("apple"), Conversation("river")
        a.step(oai, args.answer_tokens)
        b.step(oai, args.answer_tokens)
        returning, continuing, api = [], [], 0
        for _ in range(args.rounds):
            for conv in (a, b):
                api_traffic(oai, api)
                api += 1
                returning.append(conv.step(oai, args.answer_tokens))
                continuing.append(conv.step(oai, args.answer_tokens))
        log = (stack.data / "logs" / "worker-board-a.log").read_text(errors="replace")
        cache_dir = stack.data / "prompt-cache"
        files = list(cache_dir.glob("*/*"))
        result = {
            "rounds": args.rounds,
            "context": args.context,
            "threads": args.threads,
            "answer_tokens": args.answer_tokens,
            "restored": log.count("restored prompt cache"),
            "dropped": log.count("dropping prompt cache"),
            "returning_reused_all": sum(t["reused_all"] for t in returning),
            "returning": len(returning),
            "ttft_returning_ms": [round(t["ttft"] * 1000, 1) for t in returning],
            "ttft_continuing_ms": [round(t["ttft"] * 1000, 1) for t in continuing],
            "last_prompt_tokens": max(a.held, b.held),
            "prompt_cache_files": sum(1 for f in files if f.suffix == ".kv"),
            "prompt_cache_bytes": sum(f.stat().st_size for f in files),
        }
    finally:
        stack.stop()
    loads = result["restored"] + result["dropped"]
    med_r = statistics.median(result["ttft_returning_ms"])
    med_c = statistics.median(result["ttft_continuing_ms"])
    result.update(
        load_success=result["restored"] / loads if loads else None,
        ttft_returning_median_ms=med_r,
        ttft_continuing_median_ms=med_c,
        ttft_ratio=med_r / med_c,
    )
    print(f"prompt-cache loads: {result['restored']} restored, {result['dropped']} dropped", end="")
    print(f" ({100 * result['load_success']:.1f} % succeeded)" if loads else "")
    print(f"returning turns that reused their whole history: {result['returning_reused_all']} of {len(returning)}")
    print(
        f"TTFT median: returning {med_r:.1f} ms, continuing {med_c:.1f} ms, ratio {result['ttft_ratio']:.2f} "
        f"(conversations at {result['last_prompt_tokens']} tokens at the end)"
    )
    print(
        f"prompt-cache directory: {result['prompt_cache_files']} files, {result['prompt_cache_bytes'] / 2**20:.1f} MiB"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
