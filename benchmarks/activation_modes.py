"""Decode and prefill speed of one store in each activation mode, interleaved in one process.

The modes take turns on the same engine (weights resident and warm), round after round, so load
drifts on a shared machine hit every mode alike; the best and the median of the rounds are printed.
RKMOJO_KERNELS picks the kernel build (native, avx2, scalar) for the whole run.

    .venv/bin/python benchmarks/activation_modes.py STORE [--modes f32 experts q8] [--prompt-tokens 128]
        [--tokens 16] [--rounds 3] [--threads 2]
"""

import argparse
import statistics
import time

import numpy as np

from inference import kernels
from inference.engine import Engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--modes", nargs="+", default=["f32", "experts", "q8"], choices=kernels.ACTIVATIONS)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    e = Engine.open(a.store, threads=a.threads)
    prompt = [300 + i % 1000 for i in range(a.prompt_tokens)]
    e.forward(prompt[:8])  # touch the weights once
    res = {m: {"prefill": [], "decode": []} for m in a.modes}
    for r in range(a.rounds):
        for m in a.modes:
            kernels.set_activations(m)
            e.reset()
            t = time.perf_counter()
            logits = e.forward(prompt)
            res[m]["prefill"].append(a.prompt_tokens / (time.perf_counter() - t))
            t = time.perf_counter()
            for _ in range(a.tokens):
                logits = e.forward([int(np.argmax(logits[-1]))])
            res[m]["decode"].append(a.tokens / (time.perf_counter() - t))
        print(
            f"round {r}: "
            + "  ".join(f"{m} decode {res[m]['decode'][-1]:.2f} prefill {res[m]['prefill'][-1]:.1f}" for m in a.modes),
            flush=True,
        )
    print(
        f"kernels {kernels.BACKEND} (int8 dot {kernels.DOT}), {a.threads} threads; tok/s best / median of {a.rounds}:"
    )
    base = a.modes[0]
    for m in a.modes:
        d, pf = res[m]["decode"], res[m]["prefill"]
        print(
            f"  {m:<8} decode {max(d):6.2f} / {statistics.median(d):6.2f} (x{max(d) / max(res[base]['decode']):.2f})  "
            f"prefill {a.prompt_tokens}: {max(pf):7.1f} / {statistics.median(pf):7.1f} "
            f"(x{max(pf) / max(res[base]['prefill']):.2f})"
        )


if __name__ == "__main__":
    main()
