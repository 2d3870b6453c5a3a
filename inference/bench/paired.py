"""A bound measured beside each run: the disk read for a moment right after every timed run of
`rkmojo bench`, and each run's efficiency or TTFT ratio against that rate.

The bench's IO bound is the disk's best rate, swept over 1-64 reads in flight before and after the runs
(`bounds.best_bandwidth`). A virtual disk's rate moved 2x within minutes here (benchmarks/README.md at 9362a58,
"a bound measured beside each run"), so one figure bounds some runs and flatters others, and the same
command's efficiency moved from 0.80 to 0.53 in half an hour. Paired with its own probe, each run is held
to the disk as it was then; the median over the runs is the figure.
"""

from __future__ import annotations

import itertools
import statistics

from .bounds import sustained_bandwidth

PAIRED_DEPTH_MAX = 16  # a probe between runs shares the engine's memory cgroup: 16 blobs take ~54 MB


def paired_probe(store, depth: int, seconds: float, seed: int = 0):
    """A function that measures the disk now, for `seconds`, at `depth` reads in flight (at most
    PAIRED_DEPTH_MAX; the bench passes the sweep's deepest): called right after each timed run
    (`measure.run_workload`'s probe), so that the run's bound is the disk's rate at that time.

    Returns:
        probe() → {"bytes_per_s", "depth", "seconds"}.
    """
    depth = max(1, min(depth, PAIRED_DEPTH_MAX))
    calls = itertools.count()

    def probe() -> dict:
        r = sustained_bandwidth(store, depth, seconds=seconds, seed=seed + next(calls))
        return {"bytes_per_s": r["bytes_per_s"], "depth": depth, "seconds": r["seconds"]}

    return probe


def ttft_bound(read_bytes: float, rate: float | None, resident_s: float | None) -> tuple[float | None, float | None]:
    """(a streamed prompt's TTFT bound, its read half): the larger of reading `read_bytes` once at `rate`
    and the same prefill all-resident (`resident_s`); None where neither was measured."""
    read_s = read_bytes / rate if rate and read_bytes else None
    parts = [x for x in (read_s, resident_s) if x]
    return (max(parts) if parts else None), read_s


def paired_bounds(dec: dict, prefill: dict, compute: float | None, c: dict | None) -> dict:
    """Each timed run against the disk measured right after it (its "disk", `run_workload`'s probe):
    - a decode run: tok/s / min(the disk's rate / the run's expert bytes per token, compute-only tok/s);
    - a prompt: TTFT / max(its expert bytes at the disk's rate, the resident prefill's fastest run).
    The median over the runs is the figure; a median beyond its bound is a fault of the measurement,
    and `beyond` counts the single runs that were (the disk can speed up between a run and its probe).

    Returns:
        {"decode": {"depth", "seconds", "disk_bytes_per_s", "efficiencies", "efficiency", "beyond",
        "fault"} or None, "ttft": {str(n): {"disk_bytes_per_s", "ratios", "ratio", "beyond", "fault"}}}.
    """

    def measured(runs: list[dict]) -> list[dict]:
        return [x for x in runs if (x.get("disk") or {}).get("bytes_per_s")]

    runs = measured(dec["runs"])
    out: dict = {"decode": None, "ttft": {}}
    effs = []
    for x in runs:
        per_token = x["bytes_read"] / x["tokens"]
        bounds = [b for b in (x["disk"]["bytes_per_s"] / per_token if per_token else None, compute) if b]
        if bounds:
            effs.append(x["tok_s"] / min(bounds))
    if effs:
        eff = statistics.median(effs)
        out["decode"] = {
            "depth": runs[0]["disk"]["depth"],
            "seconds": runs[0]["disk"]["seconds"],
            "disk_bytes_per_s": [x["disk"]["bytes_per_s"] for x in runs],
            "efficiencies": effs,
            "efficiency": eff,
            "beyond": sum(e > 1.0 for e in effs),
            "fault": eff > 1.0,
        }
    resident = (c or {}).get("prefill_ttft_s") or {}
    for n, p in prefill.items():
        rs = measured(p["runs"])
        ratios = []
        for x in rs:
            bound, _ = ttft_bound(x["bytes_read"], x["disk"]["bytes_per_s"], resident.get(n))
            if bound:
                ratios.append(x["ttft_s"] / bound)
        if ratios:
            ratio = statistics.median(ratios)
            out["ttft"][n] = {
                "disk_bytes_per_s": [x["disk"]["bytes_per_s"] for x in rs],
                "ratios": ratios,
                "ratio": ratio,
                "beyond": sum(q < 1.0 for q in ratios),
                "fault": ratio < 1.0,
            }
    return out


def paired_lines(pb: dict) -> list[str]:
    """The table's lines for `paired_bounds`."""

    def each(xs, fmt="{:.2f}") -> str:
        return ", ".join(fmt.format(x) for x in xs)

    out = []
    d, ttft = pb.get("decode"), pb.get("ttft") or {}
    if d or ttft:
        out.append(f"{'paired':<14}each timed run against the disk measured right after it")
    if d:
        gbs = [x / 1e9 for x in d["disk_bytes_per_s"]]
        out.append(
            f"{'':<14}the disk after each decode run: {each(gbs)} GB/s ({d['depth']} random blobs in flight "
            f"for {d['seconds']:.1f} s)"
        )
        verdict = _verdict(d["fault"], d["efficiency"], d["beyond"], "beyond")
        out.append(f"{'':<14}decode efficiency per run {each(d['efficiencies'])}: {verdict}")
    for n, t in ttft.items():
        out.append(
            f"{'':<14}TTFT {n} / bound per run {each(t['ratios'])}: {_verdict(t['fault'], t['ratio'], t['beyond'], 'under')}"
        )
    return out


def _verdict(fault: bool, median: float, beyond: int, side: str) -> str:
    if fault:
        return "MEASUREMENT FAULT: the median beat its bound"
    return f"median {median:.2f}" + (f" ({beyond} run(s) {side} 1.0)" if beyond else "")
