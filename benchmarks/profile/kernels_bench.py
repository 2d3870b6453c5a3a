"""Throughput of `inference.kernels.linear` per weight kind, shape, batch and thread count.

GB/s counts the weight bytes read once per call (what bounds decode); GFLOP/s counts 2·T·out·in.
The numpy column (dequantize, then float32 matmul on OpenBLAS threads) is a sanity baseline.
`--cold MB` cycles through copies of each weight filling MB, so weights come from DRAM rather than a
big last-level cache (the RK3588 has 3 MiB of L3; x86 servers can hold every shape here), and first
prints what one thread streams from DRAM when it only sums (numpy over MB of float32): at T = 1 a
kernel's GB/s over that figure says whether decode is bound by memory (near 1) or by its own
instructions (well below).

    .venv/bin/python benchmarks/profile/kernels_bench.py [--kinds q4 q8] [--tokens 1 128] [--threads 1 2] [--cold 1024]
        [--activations f32 q8] [--shapes 768x2048 2048x768]

`--activations` times each mode side by side in one run (RKMOJO_KERNELS=avx2 or scalar picks the build).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from inference import kernels
from inference.quant import KINDS, QTensor, dequantize, quantize

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576), (2816, 2816), (704, 2816))


def best_time(fn, min_time: float) -> float:
    """Best seconds per call over repeats lasting at least `min_time` in all (after one warm-up)."""
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_time:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 128], help="batch sizes T")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per cell")
    ap.add_argument("--no-numpy", action="store_true", help="skip the numpy baseline")
    ap.add_argument("--cold", type=float, default=0, metavar="MB", help="cycle weight copies filling MB")
    ap.add_argument("--activations", nargs="+", default=["f32"], choices=["f32", "q8"])
    ap.add_argument("--shapes", nargs="+", default=None, metavar="OUTxIN", help="default: SmolLM2 and Gemma 4 shapes")
    args = ap.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else SHAPES

    rng = np.random.default_rng(0)
    print(f"backend {kernels.BACKEND} (int8 dot: {kernels.DOT}); GB/s of weight bytes, GFLOP/s = 2*T*out*in / time")
    thr_cols = "".join(f" | {f'{n} thr ms':>9} {'GB/s':>6} {'GFLOP/s':>7}" for n in args.threads)
    if args.cold:
        buf = np.ones(int(args.cold * 1e6 / 4), np.float32)
        print(
            f"DRAM read reference: {buf.nbytes / best_time(buf.sum, args.min_time) / 1e9:.2f} GB/s (one thread summing {args.cold:g} MB)"
        )
        del buf
    print(f"{'kind':5} {'act':3} {'out x in':>11} {'T':>4}{thr_cols} | {'numpy ms':>8}")
    for kind in args.kinds:
        for out, inn in shapes:
            w = quantize(rng.standard_normal((out, inn), dtype=np.float32) * 0.05, kind)
            copies = [w] + [
                QTensor(kind, w.shape, {k: v.copy() for k, v in w.parts.items()})
                for _ in range(int(args.cold * 1e6 / w.nbytes))
            ]
            turn = iter(range(1 << 62))
            for T, act in ((T, act) for T in args.tokens for act in args.activations):
                x = rng.standard_normal((T, inn), dtype=np.float32)
                kernels.set_activations(act)
                cells = ""
                for n in args.threads:
                    kernels.set_threads(n)
                    dt = best_time(lambda: kernels.linear(x, copies[next(turn) % len(copies)]), args.min_time)  # noqa: B023 - timed now
                    cells += f" | {dt * 1e3:9.3f} {w.nbytes / dt / 1e9:6.2f} {2 * T * out * inn / dt / 1e9:7.1f}"
                ref = "" if args.no_numpy else f"{best_time(lambda: x @ dequantize(w).T, args.min_time) * 1e3:8.2f}"  # noqa: B023
                print(f"{kind:5} {act:3} {f'{out}x{inn}':>11} {T:4d}{cells} | {ref:>8}", flush=True)


if __name__ == "__main__":
    main()
