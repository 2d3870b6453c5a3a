"""How long the compiled repacking (`kernels.repack_q4`, in place, as an expert lands in a cache slot)
takes per matrix, this build against another build of rkkernels.c (`--baseline` FILE.so, e.g. from a
checkout of an earlier commit built in place), alternating the two in one process so machine load hits
both alike; medians over the rounds of each round's best call.

Each call repacks a fresh copy of a matrix from a ring of copies filling `--cold` MB, after reading
`--scrub` MB of other memory, so the bytes come from DRAM as a just-read expert's do (the read's DMA
leaves them there), not from the cache; `--scrub 0` times them in the cache.

    .venv/bin/python benchmarks/repack_speed.py --baseline /tmp/rk-old/inference/kernels/_rkkernels.cpython-311-x86_64-linux-gnu.so \\
        [--shapes 704x2816 2816x704 768x2048 2048x768] [--rounds 9] [--cold 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from inference import kernels
from inference.kernels._lib import KernelLib
from inference.quant import QTensor, repack_q4

SHAPES = ("704x2816", "2816x704", "768x2048", "2048x768")  # Gemma 4 26B-A4B and Qwen3-30B-A3B experts


def ring(out: int, inn: int, mb: float, rng) -> list[QTensor]:
    one = {
        "q": rng.integers(0, 256, (out, inn // 2), dtype=np.uint8),
        "scales": rng.standard_normal((out, inn // 64)).astype(np.float16),
        "biases": rng.standard_normal((out, inn // 64)).astype(np.float16),
    }
    size = sum(p.nbytes for p in one.values())
    n = max(2, int(mb * 1e6 // size))
    return [QTensor("q4", (out, inn), {k: p.copy() for k, p in one.items()}) for _ in range(n)]


def best(repack, mats: list[QTensor], start: int, calls: int, scrub: np.ndarray) -> float:
    """The best time of `calls` in-place repacks of the next matrices of the ring (each a fresh copy,
    pushed out of the caches by reading `scrub` before the call, as a read's DMA leaves its bytes)."""
    out = float("inf")
    for k in range(calls):
        m = mats[(start + k) % len(mats)]
        fresh = QTensor("q4", m.shape, {n: p.copy() for n, p in m.parts.items()})
        scrub.sum()
        t = time.perf_counter()
        repack(fresh, True)
        out = min(out, time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, metavar="SO", help="another build of rkkernels.c")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), metavar="OUTxIN")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=8, help="calls per kernel per round")
    ap.add_argument("--cold", type=float, default=512, metavar="MB")
    ap.add_argument("--scrub", type=int, default=96, metavar="MB", help="read before each call (> the LLC)")
    a = ap.parse_args()
    other = KernelLib(a.baseline)
    rng = np.random.default_rng(0)
    scrub = np.ones(a.scrub * 1_000_000 // 8)  # larger than the last-level cache
    print(f"this build: {kernels.BACKEND}; baseline: {other.backend} ({a.baseline})")
    print(f"{'out x in':<12} {'baseline ms':>12} {'this ms':>9} {'speed-up':>9}")
    for shape in a.shapes:
        out, inn = map(int, shape.split("x"))
        mats = ring(out, inn, a.cold, rng)
        want = repack_q4(mats[0])
        got = kernels.repack_q4(QTensor("q4", mats[0].shape, {n: p.copy() for n, p in mats[0].parts.items()}))
        assert all(np.array_equal(got.parts[n], want.parts[n]) for n in want.parts), "this build's bytes differ"
        times = {"baseline": [], "this": []}
        for r in range(a.rounds):
            order = [("baseline", other.repack_q4), ("this", kernels.repack_q4)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(best(fn, mats, r * a.calls, a.calls, scrub))
        b, t = (statistics.median(times[k]) * 1e3 for k in ("baseline", "this"))
        print(f"{shape:<12} {b:>12.3f} {t:>9.3f} {b / t:>8.2f}x")


if __name__ == "__main__":
    main()
