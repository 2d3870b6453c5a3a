"""rkmojo against llama.cpp on the same Qwen3-30B-A3B shapes, in the same memory cgroup, in one run.

- rkmojo: `rkmojo bench` (inference.bench.run_bench) on a `rkmojo synth --shape qwen3-30b-a3b`
  store, its streaming part inside a cgroup-v1 memory limit, `--memory-budget` set to the same size
  (the engine derives its expert slots from it).
- llama.cpp: this script shells out to a separate Python that has llama-cpp-python (default
  /work/llamavenv/bin/python, a venv with llama-cpp-python==0.3.36) and runs our driver
  `benchmarks/llamacpp_decode.py --no-repack` (decode by token ids, mmap, weights not repacked)
  inside a cgroup of the same size, on a Q4_0 GGUF of the same shapes
  (/work/shared/tools/synth_qwen3moe_gguf.py). The driver decodes greedily, which can only help
  llama.cpp (a repeated token re-reads the same experts).
- The page cache is dropped before each side: pages cached earlier by another cgroup would be
  used by the limited child without being charged to it, and llama.cpp would look RAM-resident.
- Then the curve: rkmojo decode tok/s and hit rate at each size of `--curve`.

    sudo .venv/bin/python benchmarks/streaming_vs_llamacpp.py --store /work/stores/qwen3-30b-a3b \\
        --gguf /work/stores/qwen3-30b-a3b-q4_0.gguf --memory 4G --curve 3G,4G,6G --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from inference.bench import BenchOptions, Workload, run_bench
from inference.bench.bounds import drop_caches
from inference.bench.cgroup import MemoryCgroup
from inference.engine import EngineConfig
from inference.errors import RkmojoError

LLAMA_PYTHON = "/work/llamavenv/bin/python"
LLAMA_DRIVER = str(Path(__file__).resolve().parent / "llamacpp_decode.py")
TARGET_RATIO = 10.0


def llama_decode(gguf: str, tokens: int, limit: str, python: str, threads: int) -> dict:
    """llama.cpp decode tok/s inside a memory cgroup of `limit` (page cache dropped first)."""
    dropped = drop_caches()
    cmd = [python, LLAMA_DRIVER, gguf, "--tokens", str(tokens), "--threads", str(threads), "--no-repack"]
    t = time.perf_counter()
    with MemoryCgroup(limit) as g:
        proc, use = g.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        why = "killed by the OOM killer" if use["oom_kills"] else f"exit status {proc.returncode}"
        raise RkmojoError(f"llama.cpp run failed ({why}): {proc.stderr.strip()[-400:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        **r,
        "peak_rss_gib": r["peak_rss_mib"] / 1024,
        "cgroup": use,
        "wall_s": wall,
        "drop_caches": dropped,
        "cmd": cmd,
    }


def rkmojo(store: str, limit: str, w: Workload, *, threads: int | None, prefetch: int, **kw) -> dict:
    """`rkmojo bench` in a cgroup of `limit`, with the memory budget set to the same size."""
    drop_caches()
    o = BenchOptions(
        engine=EngineConfig(memory_budget=limit, threads=threads, prefetch=prefetch),
        cgroup_memory=limit,
        workload=w,
        **kw,
    )
    return run_bench(store, o, echo=lambda line: print("  " + line))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True, help="rkmojo store (rkmojo synth --shape qwen3-30b-a3b)")
    p.add_argument("--gguf", required=True, help="the same shapes as a Q4_0 GGUF (synth_qwen3moe_gguf.py)")
    p.add_argument("--memory", default="4G", help="cgroup limit (and rkmojo memory budget) of the comparison")
    p.add_argument("--curve", default="3G,4G,6G", help="sizes for the decode/hit-rate curve ('' to skip)")
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--prefill-tokens", default="128,1024", help="prompt lengths timed for prefill and TTFT")
    p.add_argument("--compute-tokens", type=int, default=64, help="decode tokens of the compute-only run")
    p.add_argument("--curve-decode-tokens", type=int, default=128)
    p.add_argument("--llama-tokens", type=int, default=5, help="llama.cpp decode tokens (it runs at ~0.1 tok/s)")
    p.add_argument("--llama-python", default=LLAMA_PYTHON)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--prefetch",
        type=int,
        default=0,
        metavar="SLOTS",
        help="rkmojo's gate-lookahead prefetch slots per layer (paid for out of the same budget)",
    )
    p.add_argument("--json")
    a = p.parse_args(argv)

    out = {"memory": a.memory, "llama_cpp_via": a.llama_python, "prefetch": a.prefetch}

    def save() -> None:  # after every stage, so a failure late in a long run keeps what was measured
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)

    print(f"rkmojo, {a.memory} cgroup, budget {a.memory}:")
    w = Workload(
        decode_tokens=a.decode_tokens, runs=a.runs, prefill_tokens=tuple(int(x) for x in a.prefill_tokens.split(","))
    )
    out["rkmojo"] = rkmojo(
        a.store, a.memory, w, threads=a.threads, compute_tokens=a.compute_tokens, prefetch=a.prefetch
    )
    save()
    print(f"llama.cpp ({a.llama_python} {LLAMA_DRIVER}), {a.memory} cgroup, {a.llama_tokens} tokens:")
    out["llama_cpp"] = llama_decode(a.gguf, a.llama_tokens, a.memory, a.llama_python, a.threads or os.cpu_count())
    ours, theirs = out["rkmojo"]["decode"]["tok_s"], out["llama_cpp"]["tok_s"]
    out["ratio"] = ours / theirs
    save()
    print(
        f"  llama.cpp decode {theirs:.3f} tok/s, peak RSS {out['llama_cpp']['peak_rss_gib']:.2f} GiB, "
        f"cgroup peak {out['llama_cpp']['cgroup']['max_usage_bytes'] / 2**30:.2f} GiB"
    )

    out["curve"] = []
    for size in [s for s in a.curve.split(",") if s.strip()]:
        print(f"rkmojo curve point: {size} cgroup, budget {size}:")
        r = rkmojo(
            a.store,
            size,
            Workload(prefill_tokens=(128,), decode_tokens=a.curve_decode_tokens, runs=1),
            threads=a.threads,
            compute_bound=False,
            prefetch=a.prefetch,
        )
        out["curve"].append(
            {
                "memory": size,
                "slots": r["engine"]["slots"],
                "tok_s": r["decode"]["tok_s"],
                "hit_rate": r["decode"]["hit_rate"],
                "peak_rss_bytes": r["peak_rss_bytes"],
                "cgroup": r["cgroup"],
                "io_bound_tok_s": r["bounds"]["io_bound_tok_s"],
                "others_cpu_max": r["decode"]["others_cpu_max"],
            }
        )
        save()

    print(f"\n{'':<12}{'decode tok/s':>14}{'peak RSS GiB':>14}{'cgroup peak GiB':>17}")
    r, l = out["rkmojo"], out["llama_cpp"]
    print(
        f"{'rkmojo':<12}{ours:>14.2f}{r['peak_rss_bytes'] / 2**30:>14.2f}{r['cgroup']['max_usage_bytes'] / 2**30:>17.2f}"
    )
    print(f"{'llama.cpp':<12}{theirs:>14.3f}{l['peak_rss_gib']:>14.2f}{l['cgroup']['max_usage_bytes'] / 2**30:>17.2f}")
    print(
        f"rkmojo / llama.cpp = {out['ratio']:.1f}× (target ≥ {TARGET_RATIO:.0f}×: "
        f"{'met' if out['ratio'] >= TARGET_RATIO else 'not met'})"
    )
    if out["curve"]:
        print(f"\n{'memory':<8}{'slots':>7}{'decode tok/s':>14}{'hit rate':>10}{'IO bound':>10}")
        for c in out["curve"]:
            print(
                f"{c['memory']:<8}{c['slots']:>7}{c['tok_s']:>14.2f}{100 * c['hit_rate']:>9.1f}%"
                f"{c['io_bound_tok_s']:>10.2f}"
            )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RkmojoError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
