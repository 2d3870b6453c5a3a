"""Where a prompt's prefill spends its time, streamed or all-resident, in one process: the wall time and
cProfile's cumulative seconds of the layer halves, the expert source and the grouped kernels.

Run the two modes back to back (same machine state) to see what streaming adds:

    .venv/bin/python benchmarks/profile/prefill_profile.py /work/stores/gemma4-26b-a4b-uniform --mode streamed \\
        --tokens 1024 --expert-slots 16 --prefetch 6
    .venv/bin/python benchmarks/profile/prefill_profile.py /work/stores/gemma4-26b-a4b-uniform --mode resident --tokens 1024

Streamed, a first 128-token prompt runs untimed first (it verifies the digests of the experts it reads).
No memory cgroup: for the bound and the cgroup, `rkmojo bench`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import numpy as np

FUNCS = r"pass_forward|attn_half|ffn_half|mixture|experts_mlp|linear_grouped|run\b|_drain|_take_prefetched|wait_one"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--mode", choices=["streamed", "resident"], required=True)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--expert-slots", type=int, default=16)
    ap.add_argument("--prefetch", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    from inference.engine import Engine

    kw = {"expert_slots": a.expert_slots, "prefetch": a.prefetch} if a.mode == "streamed" else {}
    e = Engine.open(a.store, threads=a.threads, **kw)
    try:
        ids = np.random.default_rng(0).integers(0, e.model.args.vocab_size, a.tokens)
        if a.mode == "streamed":
            e.reset()
            e.forward(ids[:128])
        e.reset()
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        e.forward(ids)
        prof.disable()
        print(f"{a.mode} prefill of {a.tokens} tokens: {time.perf_counter() - t:.2f} s (under cProfile)")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(FUNCS, 20)
    finally:
        e.close()


if __name__ == "__main__":
    main()
