"""How one memory budget is best split between expert cache slots and gate-lookahead prefetch slots:
`rkmojo bench` at each budget and each `--prefetch` (the cache gets the slots the rest of the budget
holds), each run a process of its own inside a memory cgroup of the budget's size, rounds alternating
the order so a drifting disk hits every split alike. Prints decode tok/s, its efficiency against the IO
bound, the time to first token against its read bound, and peak RSS, per split (medians over rounds).
This is the measurement behind the engine's default, no prefetch slots (benchmarks/README.md, "Cache or
prefetch slots"); run as root (cgroup, drop_caches):

    .venv/bin/python benchmarks/slot_split.py /work/stores/gemma4-26b-a4b-uniform \
        --budgets 3G:0,2,3 --budgets 4G:0,3,6,10 --rounds 2 --json split.json

`--budgets B:P,P,…` names a budget and the prefetch slot counts to try there. Each run is also appended
to `JSON` with the suffix `.runs.jsonl` as it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(a, budget: str, prefetch: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "bench.json"
        cmd = [
            str(Path(sys.executable).parent / "rkmojo"), "bench", a.store,
            "--memory-budget", budget, "--cgroup-memory", budget,
            "--prefill-tokens", a.prefill_tokens, "--decode-tokens", str(a.decode_tokens),
            "--runs", str(a.runs), "--no-compute-bound", "--json", str(out),
        ]  # fmt: skip
        cmd += ["--prefetch", prefetch]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"slot_split: {' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        r = json.loads(out.read_text())
        r["wall_s"] = time.perf_counter() - t
        return r


def summary(runs: list[dict]) -> dict:
    med = statistics.median
    first = runs[0]
    ttft = {}
    for n in first.get("ttft_bounds", {}):
        ratios = [r["ttft_bounds"][n]["ratio"] for r in runs if r["ttft_bounds"][n]["ratio"] is not None]
        ttft[n] = {
            "ttft_s": [r["prefill"][n]["ttft_s"] for r in runs],
            "ratio": med(ratios) if ratios else None,
        }
    return {
        "slots": first["engine"]["slots"],
        "prefetch": first["engine"]["prefetch"],
        "decode_tok_s": [r["decode"]["tok_s"] for r in runs],
        "efficiency": [r["bounds"]["efficiency"] for r in runs],
        "hit_rate": med(r["decode"]["hit_rate"] for r in runs),
        "mb_per_token": med(r["decode"]["expert_mb_per_token"] for r in runs),
        "ttft": ttft,
        "peak_rss_gib": max(r["peak_rss_bytes"] for r in runs) / 2**30,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--budgets", action="append", required=True, help="BUDGET:P,P,… (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefill-tokens", default="128")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3, help="decode runs per bench (its median)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("slot_split: run as root (memory cgroup, drop_caches)")
    configs = []
    for spec in a.budgets:
        budget, _, ps = spec.partition(":")
        if not ps:
            sys.exit(f"--budgets {spec}: write BUDGET:P,P,… e.g. 4G:0,3,6,10")
        configs += [(budget, p.strip()) for p in ps.split(",")]
    results: dict = {c: [] for c in configs}
    log = Path(a.json).with_suffix(".runs.jsonl") if a.json else None  # every run as it ends: a crash keeps them
    for rnd in range(a.rounds):
        for c in configs if rnd % 2 == 0 else configs[::-1]:
            r = run_bench(a, *c)
            results[c].append(r)
            if log:
                with open(log, "a") as f:
                    f.write(json.dumps({"budget": c[0], "prefetch": c[1], **r}) + "\n")
            print(
                f"round {rnd + 1} {c[0]} prefetch {c[1]}: {r['engine']['slots']}+{r['engine']['prefetch']} slots, "
                f"decode {r['decode']['tok_s']:.2f} tok/s, efficiency {r['bounds']['efficiency']:.2f}, TTFT "
                + ", ".join(f"{n}: {p['ttft_s']:.2f} s" for n, p in r["prefill"].items())
                + f" ({r['wall_s']:.0f} s)",
                flush=True,
            )
    rows = {f"{b} prefetch {p}": summary(results[(b, p)]) for b, p in configs}
    print()
    print(
        "| budget | slots + prefetch | decode tok/s | efficiency | hit rate | MB/token | TTFT (× read bound) | peak RSS |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (b, _), s in zip(configs, rows.values()):
        tt = ", ".join(
            f"{n}: {', '.join(f'{x:.2f}' for x in t['ttft_s'])} s" + (f" ({t['ratio']:.2f})" if t["ratio"] else "")
            for n, t in s["ttft"].items()
        )
        print(
            f"| {b} | {s['slots']} + {s['prefetch']} | {', '.join(f'{x:.2f}' for x in s['decode_tok_s'])} | "
            f"{', '.join(f'{x:.2f}' for x in s['efficiency'])} | {s['hit_rate']:.0%} | {s['mb_per_token']:.0f} | "
            f"{tt} | {s['peak_rss_gib']:.2f} GiB |"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"rows": rows, "runs": {f"{b}:{p}": results[(b, p)] for b, p in configs}}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
