"""Decode tok/s of a store with the resident dense q4 matrices repacked (kind q4r) and without
(RKMOJO_REPACK=0), each run in a child process of its own, rounds alternating the order so load drifts hit
both alike; medians per variant.

The engine repacks where one-row products use int8 activations (inference/kernels/repack.py): every dense
q4 matrix in the `q8` mode, a dense model's compiled decode step in `decode`; a MoE model in `decode` mode
computes its dense matrices with float activations, so there both variants run the same kernels.

    .venv/bin/python benchmarks/repack_decode.py /work/stores16/qwen3-16l-uniform --activations q8 \\
        --prompt-tokens 128 --tokens 32 --threads 2 --rounds 3
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


def child(store: Path, tokens: int, prompt: list[int], threads: int, activations: str) -> dict:
    from inference.engine import Engine

    t = time.perf_counter()
    e = Engine.open(store, threads=threads, activations=activations)
    opened = time.perf_counter() - t
    t = time.perf_counter()
    logits = e.forward(prompt)[-1]
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(tokens):
        logits = e.forward([int(np.argmax(logits))])[-1]
    kinds = sorted({w.kind for w in e.model.layers[0].values() if hasattr(w, "kind")} | {e.model.lm_head.kind})
    return {
        "tok_s": tokens / (time.perf_counter() - t),
        "prefill_tok_s": prefill,
        "open_s": opened,
        "kinds": kinds,
        "last": int(np.argmax(logits)),
    }


def run(variant: str, a) -> dict:
    env = {**os.environ, "RKMOJO_REPACK": "1" if variant == "repacked" else "0"}
    cmd = [sys.executable, __file__, a.store, "--child", "--tokens", str(a.tokens), "--threads", str(a.threads)]
    cmd += ["--prompt-tokens", str(a.prompt_tokens), "--activations", a.activations]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--activations", default="q8")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    prompt = [300 + i % 1000 for i in range(a.prompt_tokens)]
    if a.child:
        print(json.dumps(child(Path(a.store), a.tokens, prompt, a.threads, a.activations)))
        return 0
    res: dict[str, list[dict]] = {"store layout": [], "repacked": []}
    for r in range(a.rounds):
        order = ("store layout", "repacked") if r % 2 == 0 else ("repacked", "store layout")
        for v in order:
            load = os.getloadavg()[0]
            got = run(v, a)
            res[v].append(got)
            print(
                f"round {r} {v:12} load {load:5.2f}: decode {got['tok_s']:.2f} tok/s, prefill "
                f"{got['prefill_tok_s']:.1f} tok/s, open {got['open_s']:.1f} s, kinds {got['kinds']}",
                flush=True,
            )
    med = {v: {k: statistics.median(x[k] for x in rows) for k in ("tok_s", "prefill_tok_s")} for v, rows in res.items()}
    print(f"medians of {a.rounds}, {a.activations} activations, {a.threads} threads:")
    for v, m in med.items():
        print(f"  {v:12} decode {m['tok_s']:.2f} tok/s, prefill {m['prefill_tok_s']:.1f} tok/s")
    print(f"  decode ratio repacked / store layout: {med['repacked']['tok_s'] / med['store layout']['tok_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
