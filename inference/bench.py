"""`rkmojo bench STORE`: prefill and decode speed of a store, by token ids (no tokenizer needed)."""
from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from .model import load_model


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(store_path: Path, *, threads: int | None = None, prompt_tokens: int = 128,
            decode_tokens: int = 128, runs: int = 3, seed: int = 0) -> dict:
    """Prefill tok/s for a `prompt_tokens` prompt and decode tok/s (median of `runs` runs)."""
    from .kernels import get_threads, set_threads

    if threads:
        set_threads(threads)
    m = load_model(store_path)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, m.args.vocab_size, prompt_tokens)
    # warm-up: touch every weight once so page-cache state does not skew the first run
    m.forward(prompt[:8], m.new_cache(), last_only=True)
    prefill, decode = [], []
    for _ in range(runs):
        cache = m.new_cache()
        t = time.perf_counter()
        logits = m.forward(prompt, cache, last_only=True)
        prefill.append(prompt_tokens / (time.perf_counter() - t))
        nxt = int(np.argmax(logits[-1]))
        t = time.perf_counter()
        for _ in range(decode_tokens):
            nxt = int(np.argmax(m.forward(np.array([nxt]), cache, last_only=True)[-1]))
        decode.append(decode_tokens / (time.perf_counter() - t))
    return {
        "store": str(store_path),
        "architecture": m.store.architecture,
        "threads": get_threads(),
        "prompt_tokens": prompt_tokens,
        "decode_tokens": decode_tokens,
        "prefill_tok_s": statistics.median(prefill),
        "decode_tok_s": statistics.median(decode),
        "decode_runs": decode,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_bench(store_path: Path, *, json_out: str | None = None, **kw) -> dict:
    r = measure(store_path, **kw)
    print(f"{'store':<14}{r['store']}\n{'threads':<14}{r['threads']}\n"
          f"{'prefill':<14}{r['prefill_tok_s']:.1f} tok/s ({r['prompt_tokens']}-token prompt)\n"
          f"{'decode':<14}{r['decode_tok_s']:.1f} tok/s (median of {len(r['decode_runs'])} × {r['decode_tokens']} tokens)\n"
          f"{'peak RSS':<14}{r['peak_rss_mib']:.0f} MiB")
    if json_out:
        tmp = Path(json_out).with_suffix(".json.part")
        tmp.write_text(json.dumps(r, indent=1))
        tmp.rename(json_out)
    return r
