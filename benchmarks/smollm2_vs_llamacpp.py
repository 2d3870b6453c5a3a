"""rkmojo against llama.cpp on the demo model (SmolLM2-135M-Instruct, Q4_1 GGUF), in one run.

Both decode greedily after the same prompt ids with the same thread count, alternating rounds so
load drifts hit both sides alike; the median of the rounds is reported with the ratio.

    .venv/bin/python benchmarks/smollm2_vs_llamacpp.py --threads 2 --rounds 3 \\
        --llama-python /path/to/venv-with-llama-cpp-python/bin/python

rkmojo runs the store converted from the same GGUF (`python -m inference.demo install`); llama.cpp
runs in a child process (`benchmarks/llamacpp_decode.py`, in a venv with llama-cpp-python==0.3.36).
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

HERE = Path(__file__).resolve().parent


def rkmojo_decode(store: Path, tokens: int, prompt: list[int], threads: int) -> dict:
    from inference.engine import Engine

    e = Engine.open(store, threads=threads)
    t = time.perf_counter()
    logits = e.forward(prompt)[-1]
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(tokens):
        logits = e.forward([int(np.argmax(logits))])[-1]
    return {"tok_s": tokens / (time.perf_counter() - t), "prefill_tok_s": prefill}


def llama_decode(python: str, gguf: Path, tokens: int, prompt: list[int], threads: int) -> dict:
    out = subprocess.run([python, str(HERE / "llamacpp_decode.py"), str(gguf), "--tokens", str(tokens),
                          "--threads", str(threads), "--prompt", ",".join(map(str, prompt))],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", sys.executable))
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args(argv)
    from inference.demo import demo_gguf, install

    store, gguf = install(progress=False), demo_gguf()
    prompt = list(range(300, 308))
    rows = []
    for r in range(a.rounds):
        load = os.getloadavg()[0]
        ours = rkmojo_decode(store, a.tokens, prompt, a.threads)
        theirs = llama_decode(a.llama_python, gguf, a.tokens, prompt, a.threads)
        rows.append({"round": r, "load_before": load, "rkmojo": ours, "llama_cpp": theirs,
                     "ratio": ours["tok_s"] / theirs["tok_s"]})
        print(f"round {r}: load {load:.2f}  rkmojo {ours['tok_s']:.1f} tok/s  "
              f"llama.cpp {theirs['tok_s']:.1f} tok/s  ratio {rows[-1]['ratio']:.2f}")
    med = {k: statistics.median(x[k]["tok_s"] for x in rows) for k in ("rkmojo", "llama_cpp")}
    result = {"threads": a.threads, "tokens": a.tokens, "rounds": rows, "median_tok_s": med,
              "ratio": med["rkmojo"] / med["llama_cpp"]}
    print(f"median: rkmojo {med['rkmojo']:.1f} tok/s, llama.cpp {med['llama_cpp']:.1f} tok/s, "
          f"ratio {result['ratio']:.2f} (target >= 1.0)")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
