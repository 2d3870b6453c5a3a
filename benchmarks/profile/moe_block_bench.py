"""One MoE block's expert matmuls (all gates and ups in one grouped call, silu, all downs in another) on
Qwen3-30B-A3B shapes, timed for several builds of rkkernels.c side by side in one process.

Each `--src NAME=DIR` compiles DIR/inference/kernels/rkkernels.c (another checkout: `git archive main
inference/kernels | tar -x -C DIR`) as a plain shared library with the same flags as every other one,
so the builds differ by their source alone. Rounds alternate between builds (load drifts hit all alike);
the median ms per block of each, its ratio to the first, and whether it gives the first one's bits
are printed. Under `valgrind --tool=callgrind` with `--rounds 1 --calls 1 --threads 1` and
`--cflags=-march=haswell` (valgrind has no AVX-512), each build's library is an object of its own in
the profile: its instruction count is stable on a loaded machine.

    .venv/bin/python benchmarks/profile/moe_block_bench.py --src main=/tmp/rk-main --src new=. [--rows 1 128]
        [--threads 1 2] [--activations experts] [--kind q4] [--cflags="-march=native -DRK_NO_AVX512"] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from inference.kernels._lib import KernelLib
from inference.quant import quantize

HIDDEN, WIDTH, TOP_K, EXPERTS = 2048, 768, 8, 128


def compile_lib(src: Path, out: Path, cflags: list[str]) -> Path:
    c = src / "inference" / "kernels" / "rkkernels.c"
    cmd = ["cc", "-O3", "-std=c11", "-pthread", "-fPIC", "-shared", "-DRK_NO_PYTHON", *cflags, str(c), "-o", str(out)]
    subprocess.run(cmd + ["-lm"], check=True)
    return out


def block(lib: KernelLib, x: np.ndarray, idx: np.ndarray, experts: list[dict]) -> list[np.ndarray]:
    """The expert part of models.moe.mixture for rows x [T, H] routed to idx [T, K]."""
    pairs = []
    for e in np.unique(idx):
        rows = np.nonzero((idx == e).any(axis=1))[0]
        pairs.append((x[rows], experts[e % len(experts)]))
    gu = lib.linear_grouped([(xr, w[n]) for xr, w in pairs for n in ("gate", "up")])
    h = [g / (1.0 + np.exp(-g)) * u for g, u in zip(gu[0::2], gu[1::2])]  # [n, W] silu(gate) * up
    return lib.linear_grouped([(hi, w["down"]) for hi, (_, w) in zip(h, pairs)])


def agreement(out: list[np.ndarray], ref: list[np.ndarray]) -> str:
    """ "same bits" as the first build's last block, or the largest difference relative to its largest output."""
    if all(np.array_equal(o, r) for o, r in zip(out, ref)):
        return "same bits"
    worst = max(float(np.abs(o - r).max() / (np.abs(r).max() + 1e-30)) for o, r in zip(out, ref))
    return f"differs by {worst:.1e}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--cflags", default="-march=native", help='one string: --cflags="-march=native -DRK_NO_AVX512"')
    p.add_argument("--rows", nargs="+", type=int, default=[1, 128], help="T: 1 is decode, 128 a prefill chunk")
    p.add_argument("--threads", nargs="+", type=int, default=[2])
    p.add_argument("--activations", default="experts", choices=["f32", "experts"])
    p.add_argument("--kind", default="q4", choices=["q4", "q4_0", "q4_1", "q8_0"], help="the experts' weights")
    p.add_argument("--distinct", type=int, default=32, help="distinct expert weights (cycled; 32 ≈ 85 MB)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=8, help="blocks per timing")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    libs = {}
    for spec in a.src:
        name, _, d = spec.partition("=")
        libs[name] = KernelLib(compile_lib(Path(d).resolve(), tmp / f"{name}.so", a.cflags.split()))
        libs[name].set_activations(a.activations)
    rng = np.random.default_rng(0)
    experts = []
    for _ in range(a.distinct):
        experts.append(
            {
                n: quantize(rng.standard_normal(s, dtype=np.float32) * 0.02, a.kind)
                for n, s in (("gate", (WIDTH, HIDDEN)), ("up", (WIDTH, HIDDEN)), ("down", (HIDDEN, WIDTH)))
            }
        )
    lib0 = next(iter(libs.values()))
    print(f"{lib0.backend} (dot {lib0.dot}), {a.kind} experts, activations {a.activations}", flush=True)
    for T in a.rows:
        x = rng.standard_normal((T, HIDDEN), dtype=np.float32)
        idxs = [np.stack([rng.permutation(EXPERTS)[:TOP_K] for _ in range(T)]) for _ in range(a.calls)]
        for th in a.threads:
            times, outs = {n: [] for n in libs}, {}
            for _ in range(a.rounds):
                for n, lib in libs.items():
                    lib.set_threads(th)
                    t = time.perf_counter()
                    for idx in idxs:
                        out = block(lib, x, idx, experts)
                    times[n].append((time.perf_counter() - t) / a.calls * 1e3)
                    outs[n] = out
            base, ref = statistics.median(times[next(iter(libs))]), outs[next(iter(libs))]
            cells = "  ".join(
                f"{n} {statistics.median(v):.3f} ms (x{base / statistics.median(v):.2f}, {agreement(outs[n], ref)})"
                for n, v in times.items()
            )
            print(f"T={T} threads={th}: {cells}", flush=True)


if __name__ == "__main__":
    main()
