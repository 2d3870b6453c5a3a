"""Repacked q4 (rows in lanes, kind q4r) against the row-major q4 kernel at one activation row with int8
activations (the decode product), alternating the two in one process so machine load hits both alike.

Each round times a burst of calls of one kernel, then of the other (per round the best call of each);
the table gives the medians over the rounds and GB/s of the q4 weight bytes. `--cold MB` cycles copies of
each weight filling MB, so weights come from DRAM (as a model's do) rather than the last-level cache.

    .venv/bin/python benchmarks/profile/repack_bench.py [--threads 1 2] [--rounds 15] [--cold 1024]
        [--shapes 2048x2048 4096x2048 512x2048 2048x4096 151936x2048] [--tokens 1] [--activations q8]

`--tokens 128` (or `--activations f32`) times what a repacked matrix costs where it is not in lanes: the
prompt and float calls unpack each panel of 16 rows into the store layout before the row-major kernel.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from inference import kernels
from inference.quant import QTensor, quantize, repack_q4
from kernels_bench import best_time  # this directory: the scripts run as `python benchmarks/profile/X.py`

SHAPES = ("2048x2048", "4096x2048", "512x2048", "2048x4096", "151936x2048")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--burst", type=float, default=0.05, help="seconds per kernel per round")
    ap.add_argument("--cold", type=float, default=0, metavar="MB", help="cycle weight copies filling MB")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), metavar="OUTxIN")
    ap.add_argument("--tokens", type=int, default=1, help="activation rows T")
    ap.add_argument("--activations", default="q8", choices=["q8", "f32"])
    args = ap.parse_args()
    kernels.set_activations(args.activations)
    rng = np.random.default_rng(0)
    print(
        f"backend {kernels.BACKEND}, row-major int8 dot {kernels.DOT}, repacked {kernels._LIB.rp_kernel}; "
        f"load {os.getloadavg()[0]:.2f}; T = {args.tokens}, {args.activations} activations; medians of {args.rounds} alternating rounds"
    )
    head = "".join(f" | {n} thr: old ms  GB/s  new ms  GB/s  speedup" for n in args.threads)
    print(f"{'out x in':>12}{head}")
    for shape in args.shapes:
        out, inn = map(int, shape.split("x"))
        w = quantize(rng.standard_normal((out, inn), dtype=np.float32) * 0.05, "q4")
        n_copies = max(1, int(args.cold * 1e6 / w.nbytes)) if args.cold else 1
        olds = [w] + [QTensor("q4", w.shape, {k: v.copy() for k, v in w.parts.items()}) for _ in range(n_copies - 1)]
        news = [repack_q4(c) for c in olds]
        x = rng.standard_normal((args.tokens, inn), dtype=np.float32)
        assert np.allclose(kernels.linear(x, news[0]), kernels.linear(x, olds[0]), rtol=1e-3, atol=1e-3)
        cells = ""
        for n in args.threads:
            kernels.set_threads(n)
            turn = iter(range(1 << 62))
            times = {"old": [], "new": []}
            for r in range(args.rounds):
                for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    ws = olds if name == "old" else news
                    times[name].append(
                        best_time(lambda ws=ws, x=x, turn=turn: kernels.linear(x, ws[next(turn) % len(ws)]), args.burst)
                    )
            t_old, t_new = statistics.median(times["old"]), statistics.median(times["new"])
            gb = w.nbytes / 1e9
            cells += (
                f" | {t_old * 1e3:14.3f} {gb / t_old:5.1f} {t_new * 1e3:7.3f} {gb / t_new:5.1f} {t_old / t_new:7.2f}x"
            )
        print(f"{shape:>12}{cells}", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
