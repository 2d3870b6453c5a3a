"""rkmojo against llama.cpp on the demo model (SmolLM2-135M-Instruct, Q4_1 GGUF) or any store + GGUF
pair, in one run.

Both prefill the same prompt ids, then decode greedily with the same thread count, alternating rounds
so load drifts hit both sides alike; the median of the rounds is reported with the ratio. Each rkmojo
variant (kernel build and activations, `--variants native:f32,avx2:q8`) runs in a child process of
its own, since RKMOJO_KERNELS picks the build at import.

    .venv/bin/python benchmarks/smollm2_vs_llamacpp.py --threads 2 --rounds 3 \\
        --llama-python /path/to/venv-with-llama-cpp-python/bin/python
    .venv/bin/python benchmarks/smollm2_vs_llamacpp.py --store STORE --gguf MODEL.gguf --prompt-tokens 128 \\
        --tokens 32 --variants native:f32,native:experts,avx2:experts --llama-python ...

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


def variant_env(variant: str) -> tuple[str, str, dict[str, str]]:
    """BUILD:ACTIVATIONS[:NAME=VALUE+NAME=VALUE...] as (build, activations, extra environment), e.g.
    `avx2::RKMOJO_REPACK=0` (the AVX2 build, default activations, repacking off).

    Raises:
        SystemExit: an environment item without "=".
    """
    build, _, rest = variant.partition(":")
    activations, _, extra = rest.partition(":")
    env = {}
    for item in filter(None, extra.split("+")):
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise SystemExit(f"--variants {variant!r}: {item!r} is not NAME=VALUE (e.g. avx2::RKMOJO_REPACK=0)")
        env[name] = value
    return build, activations, env


def rkmojo_decode(store: Path, tokens: int, prompt: list[int], threads: int, variant: str = "native:") -> dict:
    build, activations, extra = variant_env(variant)
    env = {**os.environ, "RKMOJO_KERNELS": build, **extra}
    if build == "baseline":  # another checkout's engine (--baseline-src), with its defaults
        env = {**os.environ, "PYTHONPATH": os.environ["RKMOJO_BASELINE_SRC"]}
        env.pop("RKMOJO_KERNELS", None)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            str(store),
            "--tokens",
            str(tokens),
            "--threads",
            str(threads),
            "--prompt",
            ",".join(map(str, prompt)),
            "--activations",
            activations,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(store: Path, tokens: int, prompt: list[int], threads: int, activations: str) -> dict:
    from inference.engine import Engine

    e = Engine.open(store, threads=threads, **({"activations": activations} if activations else {}))
    t = time.perf_counter()
    logits = e.forward(prompt)[-1]
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(tokens):
        logits = e.forward([int(np.argmax(logits))])[-1]
    return {"tok_s": tokens / (time.perf_counter() - t), "prefill_tok_s": prefill}


def llama_decode(python: str, gguf: Path, tokens: int, prompt: list[int], threads: int) -> dict:
    out = subprocess.run(
        [
            python,
            str(HERE / "llamacpp_decode.py"),
            str(gguf),
            "--tokens",
            str(tokens),
            "--threads",
            str(threads),
            "--prompt",
            ",".join(map(str, prompt)),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", sys.executable))
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--store", help="rkmojo store (default: the demo model)")
    p.add_argument("--gguf", help="llama.cpp's GGUF of the same model (default: the demo GGUF)")
    p.add_argument("--prompt-tokens", type=int, default=8, help="prompt ids prefilled before decoding")
    p.add_argument(
        "--variants",
        default="native:",
        help="rkmojo runs as BUILD:ACTIVATIONS[:NAME=VALUE+...], comma-separated "
        "(build native|avx2|scalar|baseline; activations f32|q8|experts|decode, empty: the default; "
        "then environment variables for that child, e.g. avx2::RKMOJO_REPACK=0)",
    )
    p.add_argument("--baseline-src", help="a checkout whose engine runs as the variant 'baseline:' (built in place)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--prompt", help=argparse.SUPPRESS)
    p.add_argument("--activations", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(
            json.dumps(child(Path(a.child), a.tokens, [int(t) for t in a.prompt.split(",")], a.threads, a.activations))
        )
        return 0
    from inference.demo import demo_gguf, install

    store = Path(a.store) if a.store else install(progress=False)
    gguf = Path(a.gguf) if a.gguf else demo_gguf()
    prompt = [300 + i % 1000 for i in range(a.prompt_tokens)]
    variants = a.variants.split(",")
    if a.baseline_src:
        os.environ["RKMOJO_BASELINE_SRC"] = str(Path(a.baseline_src).resolve())
    rows = []
    for r in range(a.rounds):
        load = os.getloadavg()[0]
        ours = {v: rkmojo_decode(store, a.tokens, prompt, a.threads, v) for v in variants}
        theirs = llama_decode(a.llama_python, gguf, a.tokens, prompt, a.threads)
        rows.append({"round": r, "load_before": load, "rkmojo": ours, "llama_cpp": theirs})
        cells = "  ".join(
            f"{v} {o['tok_s']:.1f} tok/s (x{o['tok_s'] / theirs['tok_s']:.2f}), prefill "
            f"{o['prefill_tok_s']:.1f} (x{o['prefill_tok_s'] / theirs['prefill_tok_s']:.2f})"
            for v, o in ours.items()
        )
        print(
            f"round {r}: load {load:.2f}  llama.cpp {theirs['tok_s']:.1f} tok/s, prefill "
            f"{theirs['prefill_tok_s']:.1f}  |  {cells}",
            flush=True,
        )
    med = {
        v: {k: statistics.median(x["rkmojo"][v][k] for x in rows) for k in ("tok_s", "prefill_tok_s")} for v in variants
    }
    med["llama_cpp"] = {k: statistics.median(x["llama_cpp"][k] for x in rows) for k in ("tok_s", "prefill_tok_s")}
    result = {"threads": a.threads, "tokens": a.tokens, "prompt_tokens": a.prompt_tokens, "rounds": rows, "median": med}
    lc = med["llama_cpp"]
    print(f"median of {a.rounds}: llama.cpp {lc['tok_s']:.1f} tok/s, prefill {lc['prefill_tok_s']:.1f} tok/s")
    for v in variants:
        m = med[v]
        print(
            f"  rkmojo {v:<16} decode {m['tok_s']:.1f} tok/s (ratio {m['tok_s'] / lc['tok_s']:.2f}), prefill "
            f"{m['prefill_tok_s']:.1f} tok/s (ratio {m['prefill_tok_s'] / lc['prefill_tok_s']:.2f})"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
