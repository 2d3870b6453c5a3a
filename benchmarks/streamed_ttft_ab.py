"""Streamed time to first token of this checkout against another (`--baseline-src`), each run in a child
process of its own, rounds alternating the order so load drifts hit both alike; medians per variant.

Each child opens the store streaming (`--expert-slots`, `--prefetch`), then prefills `--prompt-tokens`
random ids `--prefills` times (a fresh sequence each time; the first one also verifies every expert it
reads, as a first prompt after start does) and reports each time to first token with the engine's IO
wait and landing time (the engine waiting for reads, and for their digest check and repack). The
machine's page cache plays no part: expert reads are O_DIRECT. For the bound and the memory cgroup, use
`rkmojo bench`; this script is for telling two versions apart on a machine whose speed drifts.
`--baseline-store` gives the baseline another store (this checkout, unless `--baseline-src` too);
`--check-idle` has this checkout check every expert's digest before its first prompt, as the worker does
in idle time after a load (with `--baseline-store` the same store: the same code without it):

    .venv/bin/python benchmarks/streamed_ttft_ab.py /work/stores/gemma4-26b-a4b-repacked \
        --baseline-store /work/stores/gemma4-26b-a4b-uniform --prompt-tokens 128 --rounds 3

    .venv/bin/python benchmarks/streamed_ttft_ab.py /work/stores/gemma4-26b-a4b-uniform \\
        --baseline-src /tmp/rk-old --expert-slots 16 --prefetch 6 --prompt-tokens 128 --rounds 3
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


def child(a) -> dict:
    from inference.engine import Engine

    plan = {"memory_budget": a.memory_budget} if a.memory_budget else {"expert_slots": a.expert_slots}
    e = Engine.open(a.store, prefetch=a.prefetch, threads=a.threads, **plan)
    ids = np.random.default_rng(0).integers(0, e.model.args.vocab_size, a.prompt_tokens)
    runs = []
    check_s = None
    try:
        if a.check_idle:  # what a worker does in idle heartbeats after a load, untimed in the prompts
            t = time.perf_counter()
            left = e.check_experts(1e9)
            check_s = time.perf_counter() - t
            assert left == 0, f"{left} experts left unchecked"
        for _ in range(a.prefills):
            n = a.decode if runs else 0
            t = time.perf_counter()
            for k in range(n):  # generated tokens leave the caches as a chat does (timed: decode tok/s)
                e.forward([int(ids[k % len(ids)])])
            decode_tok_s = n / (time.perf_counter() - t) if n else None
            e.reset()
            before = dict(e.expert_stats["total"])
            t = time.perf_counter()
            logits = e.forward(ids)
            dt = time.perf_counter() - t
            now = e.expert_stats["total"]
            runs.append(
                {
                    "ttft_s": dt,
                    "io_wait_s": now["read_seconds"] - before["read_seconds"],
                    "land_s": now.get("land_seconds", 0.0) - before.get("land_seconds", 0.0),
                    "next": int(np.argmax(logits[-1])),
                    "decode_tok_s": decode_tok_s,
                }
            )
    finally:
        e.close()
    return {"runs": runs, "check_s": check_s}


def run(variant: str, a) -> dict:
    env = dict(os.environ)
    if variant == "baseline":
        env["PYTHONPATH"] = a.baseline_src
    store = a.baseline_store if variant == "baseline" else a.store
    cmd = [sys.executable, __file__, store, "--child", "--expert-slots", str(a.expert_slots), "--decode", str(a.decode)]
    cmd += ["--memory-budget", a.memory_budget] if a.memory_budget else []
    cmd += ["--prefetch", str(a.prefetch), "--prompt-tokens", str(a.prompt_tokens), "--prefills", str(a.prefills)]
    cmd += ["--threads", str(a.threads)]
    cmd += ["--check-idle"] if a.check_idle and variant == "this" else []
    out = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=a.baseline_src if variant == "baseline" else HERE.parent,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--baseline-src", help="another checkout, built in place (setup.py build_ext --inplace)")
    p.add_argument(
        "--baseline-store", help="the baseline's store (default: STORE), e.g. the store before `rkmojo repack`"
    )
    p.add_argument("--expert-slots", type=int, default=16)
    p.add_argument("--prefetch", type=int, default=6)
    p.add_argument("--memory-budget", help="plan the slots for this budget (e.g. 4G) instead of --expert-slots")
    p.add_argument("--decode", type=int, default=0, help="tokens generated before each prefill but the first")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--prefills", type=int, default=3, help="prefills per child (the first verifies digests)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the results here too")
    p.add_argument(
        "--check-idle",
        action="store_true",
        help="this checkout checks every expert's digest after opening (as the worker does in idle time), "
        "before its first prompt; compare the first prefills (with --baseline-store STORE: the same code without)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return 0
    if not a.baseline_src and not a.baseline_store:
        p.error("--baseline-src or --baseline-store is required: the checkout or store to compare with")
    a.baseline_src = str(Path(a.baseline_src or HERE.parent).resolve())
    a.baseline_store = a.baseline_store or a.store
    results: dict[str, list[dict]] = {"baseline": [], "this": []}
    for k in range(a.rounds):
        order = ["baseline", "this"] if k % 2 == 0 else ["this", "baseline"]
        line = []
        for v in order:
            r = run(v, a)
            results[v].extend(r["runs"])
            line.append(f"{v}: " + ", ".join(f"{x['ttft_s']:.2f}" for x in r["runs"]) + " s")
            if r.get("check_s") is not None:
                line[-1] += f" (digests checked before, in {r['check_s']:.1f} s)"
        print(f"round {k}: load {os.getloadavg()[0]:.2f}  " + "  |  ".join(line), flush=True)
    summary = {}
    for v, runs in results.items():
        later = [x for i, x in enumerate(runs) if i % a.prefills] or runs  # without each child's first
        summary[v] = {key: statistics.median(x[key] for x in later) for key in ("ttft_s", "io_wait_s", "land_s")} | {
            "first_ttft_s": statistics.median(x["ttft_s"] for i, x in enumerate(runs) if i % a.prefills == 0)
        }
        decode = [x["decode_tok_s"] for x in runs if x.get("decode_tok_s")]
        summary[v]["decode_tok_s"] = statistics.median(decode) if decode else None
        s = summary[v]
        print(
            f"{v:<9} TTFT {s['ttft_s']:.2f} s (median of the later prefills; first prefill {s['first_ttft_s']:.2f} s)"
            f" · IO wait {s['io_wait_s']:.2f} s · landing {s['land_s']:.2f} s"
            + (
                f" · decode {s['decode_tok_s']:.2f} tok/s (median of {len(decode)} runs of {a.decode})"
                if decode
                else ""
            )
        )
    print(f"this / baseline: TTFT {summary['this']['ttft_s'] / summary['baseline']['ttft_s']:.3f}", end="")
    first = summary["this"]["first_ttft_s"] / summary["baseline"]["first_ttft_s"]
    print(f", first prefill {first:.3f}", end="")
    if summary["this"]["decode_tok_s"] and summary["baseline"]["decode_tok_s"]:
        print(f", decode tok/s {summary['this']['decode_tok_s'] / summary['baseline']['decode_tok_s']:.3f}", end="")
    print()
    same = {x["next"] for runs in results.values() for x in runs}
    print(f"first generated token: {sorted(same)} (the same in every run: {len(same) == 1})")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "summary": summary, "args": vars(a)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
