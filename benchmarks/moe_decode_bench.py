"""MoE decode tok/s of a store: the compiled decode step against the Python layers and another checkout.

Each variant runs in a fresh process of its own, rounds alternating so that load drifts hit every variant
alike; each prefills the same prompt ids (so that the experts' pages are mapped) and then decodes greedily.
Prints each round with the load average and the medians.

    .venv/bin/python benchmarks/moe_decode_bench.py /work/stores16/qwen3-16l-uniform --threads 2 \\
        --prompt-tokens 128 --tokens 32 --rounds 3 --variants fused,python,baseline --baseline-src /tmp/rk-base
    .venv/bin/python benchmarks/moe_decode_bench.py STORE --profile 16   # cProfile of 16 decode tokens
    .venv/bin/python benchmarks/moe_decode_bench.py STORE --same-process 8 --block 4   # fused/python alternating

Variants: `fused` (this checkout, the compiled step: the default), `python` (this checkout with the
architecture's `fused_decode` off: every token through `layer`), `baseline` (the checkout --baseline-src,
built in place, with its defaults). `:MODE` after a variant picks the activation mode (`fused:experts`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def child(store: str, tokens: int, prompt: int, threads: int, variant: str, profile: bool) -> dict:
    from inference import models
    from inference.engine import Engine
    from inference.store import Store

    name, _, mode = variant.partition(":")
    if name == "python":
        models.get(Store(store).architecture).Model.fused_decode = False
    e = Engine.open(store, threads=threads, **({"activations": mode} if mode else {}))
    ids = [300 + i % 1000 for i in range(prompt)]
    t = time.perf_counter()
    logits = e.forward(ids)[-1]
    prefill = prompt / (time.perf_counter() - t)
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(tokens):
        logits = e.forward([int(np.argmax(logits))])[-1]
    took, cpu = time.perf_counter() - t, time.process_time() - c
    if profile:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {"tok_s": tokens / took, "prefill_tok_s": prefill, "cpu_ms": 1e3 * cpu / max(tokens, 1)}


def same_process(store: str, blocks: int, block: int, prompt: int, threads: int, mode: str) -> None:
    """The fused step and the Python layers alternating in blocks of `block` tokens in one process (one
    decode, the same cache): per variant the median wall and CPU ms per token over `blocks` blocks."""
    from inference import models
    from inference.engine import Engine
    from inference.store import Store

    arch = models.get(Store(store).architecture).Model
    e = Engine.open(store, threads=threads, **({"activations": mode} if mode else {}))
    logits = e.forward([300 + i % 1000 for i in range(prompt)])[-1]
    times: dict[bool, list] = {True: [], False: []}
    for b in range(2 * blocks):
        fused = b % 2 == 0
        arch.fused_decode = fused
        t, c = time.perf_counter(), time.process_time()
        for _ in range(block):
            logits = e.forward([int(np.argmax(logits))])[-1]
        times[fused].append(((time.perf_counter() - t) / block, (time.process_time() - c) / block))
    for fused, got in times.items():
        wall, cpu = (statistics.median(x[j] for x in got) for j in (0, 1))
        print(
            f"  {'fused' if fused else 'python':<8} {1 / wall:.2f} tok/s (median of {blocks} blocks of {block}: "
            f"{1e3 * wall:.1f} ms wall, {1e3 * cpu:.1f} ms CPU per token)"
        )


def run(args, variant: str) -> dict:
    name = variant.partition(":")[0]
    env = dict(os.environ)
    if name == "baseline":
        env["PYTHONPATH"] = str(Path(args.baseline_src).resolve())
    cmd = [sys.executable, __file__, args.store, "--child", variant, "--tokens", str(args.tokens)]
    cmd += ["--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="fused,python")
    p.add_argument("--baseline-src", help="the checkout the variant `baseline` runs")
    p.add_argument("--profile", type=int, metavar="TOKENS", help="cProfile this many tokens of `fused` and exit")
    p.add_argument("--same-process", type=int, metavar="BLOCKS", help="fused and python alternating in one process")
    p.add_argument("--block", type=int, default=4, help="tokens per block of --same-process")
    p.add_argument("--mode", default="", help="activation mode of --same-process (default: the default)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.same_process:
        print(f"load {os.getloadavg()[0]:.2f}")
        same_process(a.store, a.same_process, a.block, a.prompt_tokens, a.threads, a.mode)
        print(f"load {os.getloadavg()[0]:.2f}")
        return 0
    if a.child or a.profile:
        tokens = a.profile or a.tokens
        print(json.dumps(child(a.store, tokens, a.prompt_tokens, a.threads, a.child or "fused", bool(a.profile))))
        return 0
    variants = a.variants.split(",")
    rows = []
    for r in range(a.rounds):
        load = os.getloadavg()[0]
        got = {v: run(a, v) for v in variants}
        rows.append(got)
        cells = "  ".join(
            f"{v} {o['tok_s']:.2f} tok/s ({o['cpu_ms']:.0f} ms CPU, prefill {o['prefill_tok_s']:.1f})"
            for v, o in got.items()
        )
        print(f"round {r}: load {load:.2f}  {cells}", flush=True)
    print(f"median of {a.rounds} (load now {os.getloadavg()[0]:.2f}):")
    for v in variants:
        tok = statistics.median(x[v]["tok_s"] for x in rows)
        pre = statistics.median(x[v]["prefill_tok_s"] for x in rows)
        cpu = statistics.median(x[v]["cpu_ms"] for x in rows)
        print(f"  {v:<16} decode {tok:.2f} tok/s ({cpu:.0f} ms CPU per token), prefill {pre:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
