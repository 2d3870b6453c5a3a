"""`rkmojo bench`'s human-readable summary of a result (`run.combine`'s dict): one line per row, a label
column `LABEL` wide, then the row's parts joined by " · ". Each section is a function of the result."""

from __future__ import annotations

import statistics
from pathlib import Path

from .paired import paired_lines
from .turns import turns_lines

GiB = 2**30
LABEL = 14  # the label column's width


class Lines(list):
    """The summary's lines."""

    def row(self, label: str, *parts: str | None, sep: str = " · ") -> None:
        """`label`, padded to the label column, then the parts that are not empty."""
        self.append(f"{label:<{LABEL}}" + sep.join(p for p in parts if p))


def table(r: dict) -> list[str]:
    """The human-readable summary of a result."""
    out = Lines([f"rkmojo bench: {Path(r['store']).name} ({r['architecture']}; router: {r['router']})"])
    _setting(out, r)
    _runs(out, r)
    if r["engine"]["slots"]:
        _bounds(out, r)
        _analysis(out, r)
    return out


def _pct(x) -> str:
    return "   —  " if x is None else f"{100 * x:5.1f} %"


def median_of(prefill: dict, key: str) -> float:
    """The median over a prefill's runs of one of its counters (0 where an older report lacks it)."""
    return statistics.median(x.get(key, 0.0) for x in prefill["runs"])


def _setting(out: Lines, r: dict) -> None:
    """The engine's configuration, and what else the machine was doing."""
    e = r["engine"]
    compute = f"{e['threads']} threads", f"{e.get('kernels', '?')} kernels, {e.get('activations', 'f32')} activations"
    if e["slots"]:
        direct = " (O_DIRECT)" if r["bounds"]["read"].get("direct") else ""
        verify = f"verify {e['verify_experts']}{checked_note(e)}"
        out.row("engine", f"{e['slots']} slots/layer", e["policy"], f"io {e['io']}{direct}", verify, *compute)
    else:
        out.row("engine", "every expert resident (no --expert-slots/--memory-budget)", *compute)
    if r.get("load"):
        ld = r["load"]
        out.row(
            "load",
            f"other processes used {100 * ld['cpu_busy_before']:.0f} % of the {ld['cpus']} CPUs before, "
            f"{100 * ld['cpu_busy_after']:.0f} % after; load average {ld['before'][0]:.2f} before, "
            f"{ld['after'][0]:.2f} after",
        )
        out.row("env", " ".join(f"{k}={v}" for k, v in r["env"].items()))
    out.row(
        "disturbance",
        f"other processes used up to {100 * r['decode']['others_cpu_max']:.0f} % of the CPUs during a decode run",
    )


def _runs(out: Lines, r: dict) -> None:
    """The timed runs: decode, each prompt's first token, the experts' traffic, memory."""
    e, d, w = r["engine"], r["decode"], r["workload"]
    runs = ", ".join(f"{x['tok_s']:.2f}" for x in d["runs"])
    out.row(
        "decode",
        f"{d['tok_s']:.2f} tok/s  median of {len(d['runs'])} × {w['decode_tokens']} tokens after a "
        f"{w['prompt_tokens']}-token prompt, {w['feed']} ids ({runs})",
    )
    for n, p in r["prefill"].items():
        each = ", ".join(f"{x['ttft_s']:.2f}" for x in p["runs"])
        first = (
            f"time to first token {p['ttft_s']:.2f} s (median of {len(p['runs'])}: {each} s) = {p['tok_s']:.1f} tok/s"
        )
        streamed = ()
        if e["slots"]:
            lent = median_of(p, "borrowed")
            streamed = (
                f"IO wait {median_of(p, 'read_seconds'):.2f} s, landing {median_of(p, 'land_seconds'):.2f} s",
                lent and f"{lent:.0f} experts read ahead into slots lent by finished layers",
            )
        out.row("prefill " + n, first, *streamed)
    if e["slots"]:
        out.row(
            "experts",
            f"hit rate {_pct(d['hit_rate']).strip()}",
            f"{d['expert_mb_per_token']:.0f} MB read per token",
            f"IO wait {d['io_wait_ms_per_token']:.0f} ms per token",
            f"landing (digest check, repack) {d.get('land_ms_per_token', 0):.1f} ms per token",
        )
    if d.get("prefetched"):
        out.row(
            "prefetch",
            f"{e['prefetch']} slots per layer" if e["prefetch"] else "a token's best guesses",
            f"{d['prefetch_recall']:.0%} of the misses were prefetched",
            f"{d['prefetch_precision']:.0%} of the prefetches were used",
            f"{d['prefetch_wasted_mb_per_token']:.0f} MB per token read and not used",
            guesses_note(r.get("guesses")),
        )
    g = r["cgroup"]
    out.row(
        "memory",
        f"peak RSS {r['peak_rss_bytes'] / GiB:.2f} GiB",
        g
        and f"cgroup peak {g['max_usage_bytes'] / GiB:.2f} of {g['limit_bytes'] / GiB:.2f} GiB (page cache "
        f"included), limit hit {g['failcnt']}×, OOM kills {g['oom_kills']}",
    )


def _bounds(out: Lines, r: dict) -> None:
    """What the disk and the compute allow, and the runs measured against them."""
    b = r["bounds"]
    rd = b["read"]
    if b["io_bound_tok_s"]:
        su = rd.get("sustained") or {}
        sustained = (
            f"{su['bytes_per_s'] / 1e9:.2f} GB/s (random expert-sized O_DIRECT reads, the best of 1-64 in flight: "
            f"{su['depth']}, the median of its {len(sweep_windows(su))} windows; the faster of "
            f"{len(su.get('runs_bytes_per_s', [1]))} sweeps before and after the runs)"
            if su.get("bytes_per_s")
            else "no sustained measurement"
        )
        out.row(
            "IO bound",
            f"{b['io_bound_tok_s']:.2f} tok/s = {b['read_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s / "
            f"{b['miss_bytes_per_token'] / 1e6:.0f} MB per token; the faster of: {rd['bytes_per_s'] / 1e9:.2f} GB/s "
            f"({rd['io']}, {rd['mean_batch']:.1f} random blobs per batch as in decode) and {sustained}; caches "
            f"{'dropped' if rd.get('drop_caches') else 'not dropped'}",
        )
        for sw in su.get("sweeps", []):
            fw = sw["fastest_window"]
            depths = " · ".join(f"{x['depth']}: {x['bytes_per_s'] / 1e9:.2f}" for x in sw["sweep"])
            out.row(
                "",
                f"sweep {sw['when']}, GB/s by reads in flight (median of each depth's windows): {depths}; its "
                f"fastest single window {fw['bytes_per_s'] / 1e9:.2f} at {fw['depth']}",
            )
    dev = r["decode"].get("device")
    if dev and dev["busy_bytes_per_s"]:
        best = b["read_bandwidth_bytes_per_s"]
        rate = f" = {dev['busy_bytes_per_s'] / best:.2f} of the bound's rate" if best else ""
        out.row(
            "decode disk",
            f"a read in flight {dev['busy_share']:.0%} of the decode runs' time (idle the rest), "
            f"{dev['busy_bytes_per_s'] / 1e9:.2f} GB/s then{rate}; the device read {dev['bytes_per_token'] / 1e6:.0f} "
            f"MB per token, of which {b['miss_bytes_per_token'] / 1e6:.0f} MB were experts the tokens used (its "
            "kernel counters)",
        )
    for n, t in r.get("ttft_bounds", {}).items():
        if t["bound_s"]:
            out.row("TTFT bound " + n, " " + _ttft_bound(t))
    if r.get("ttft_turns"):
        out.extend(turns_lines(r["ttft_turns"]))
    c = b["compute"] or {}
    if c.get("mode") == "resident":
        out.row(
            "compute bound",
            f"{c['tok_s']:.2f} tok/s (every expert resident, page cache warm; {c['tokens']} tokens, "
            f"{c['major_faults']} major faults, others used {100 * c['others_cpu']:.0f} % of the CPUs)",
        )
    elif c:
        out.row("compute bound", f"not measured: {c['reason']}")
    if b["efficiency"] is not None and b["efficiency"] > 1.0:
        out.row(
            "efficiency",
            f"MEASUREMENT FAULT: decode beat its bound ({b['efficiency']:.2f} = {b['efficiency_formula']}); a "
            "bound the engine beats was not measured right, so no efficiency is reported",
        )
    elif b["efficiency"] is not None:
        out.row("efficiency", f"{b['efficiency']:.2f} = {b['efficiency_formula']}")
    out.extend(paired_lines(r.get("paired") or {}))


def _ttft_bound(t: dict) -> str:
    """One prompt length's first-token bound and the measured TTFT against it."""
    read = f"{t['read_bytes'] / 1e9:.2f} GB in {t['read_experts_s']:.2f} s" if t["read_experts_s"] else "not measured"
    res = f"{t['resident_s']:.2f} s" if t["resident_s"] else "not measured"
    if t["resident_s"] and t.get("resident_order"):
        res += f" ({t['resident_order']})"
    if t["resident_s"] and len(t.get("resident_runs_s") or ()) > 1:
        res += f" of {', '.join(f'{x:.2f}' for x in t['resident_runs_s'])} s"
    verdict = (
        "MEASUREMENT FAULT: the streamed run beat its bound (see the compute bound's major faults and load), so "
        "no ratio is reported"
        if t.get("fault")
        else f"measured / bound = {t['ratio']:.2f}"
    )
    return (
        f"{t['bound_s']:.2f} s = max(read the experts it read, once, at the disk's best rate: {read}, the same "
        f"prefill all-resident, its fastest run: {res}); {verdict}"
    )


def _analysis(out: Lines, r: dict) -> None:
    """The run's routing, and its trace replayed through the cache at other sizes."""
    ro = r["routing"]
    out.row(
        "routing",
        f"the {ro['top']} most used experts of a layer take {_pct(ro['share']).strip()} of its decode picks "
        f"({_pct(ro['uniform_share']).strip()} for as many uniformly random picks)",
    )
    sw = r["sweep"]
    out.row(
        "cache sweep",
        "decode hit rate replayed on this run's routing trace (LFU/LRU: the engine's LayerCache; Belady: offline optimum)",
    )
    out.append(f"{'':>6}{'slots':>8}{'LFU':>10}{'LRU':>10}{'Belady':>10}")
    for i, n in enumerate(sw["slots"]):
        out.append(f"{'':>6}{n:>8}{_pct(sw['lfu'][i]):>10}{_pct(sw['lru'][i]):>10}{_pct(sw['belady'][i]):>10}")
    ck = sw["check"]
    lookahead = (
        f" (replayed with the {ck['prefetch_hits']} misses the lookahead read)" if ck.get("prefetch_hits") else ""
    )
    out.row(
        "check",
        f"simulated {ck['policy']} at {ck['slots']} slots {_pct(ck['simulated']).strip()}, engine measured "
        f"{_pct(ck['measured']).strip()}{lookahead}",
    )


def guesses_note(g: dict | None) -> str:
    """How often each rank of a token's guesses was right over the whole run, and how many ranks it reads now."""
    if not g or not any(g["scored"]):
        return ""
    right = "/".join(f"{r / n:.0%}" for r, n in zip(g["right"], g["scored"]) if n)
    return (
        f"guess ranks right {right} of the time; {g['reading']} read now "
        f"(those right at least {g['min_precision']:.0%} of the recent layers)"
    )


def checked_note(e: dict) -> str:
    """The digest check before the runs, as the worker's idle time after a load does it (`check_experts`)."""
    c = e.get("digests_checked_before")
    if not c or e.get("verify_experts") != "first":
        return ""
    left = f", {c['left']} left" if c["left"] else ""
    return f" (every expert's digest checked before the runs, untimed, as a worker does while idle: {c['seconds']:.1f} s{left})"


def sweep_windows(su: dict) -> list:
    """The windows behind a sustained rate's best depth (one for a sweep from before they were medians)."""
    for x in su.get("sweep", []):
        if x["depth"] == su.get("depth"):
            return x.get("windows") or [x["bytes_per_s"]]
    return [su.get("bytes_per_s")]
