"""`rkmojo bench`: the JSON it writes, the cache simulator against the engine and the optimum,
the read-bandwidth probe, and the memory-cgroup helper."""

import itertools
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inference.bench import REQUIRED_FIELDS, BenchOptions, Workload, run_bench
from inference.engine import EngineConfig
from inference.bench.bounds import best_bandwidth, read_bandwidth, sustained_bandwidth
from inference.bench.measure import device_counters, device_stat
from inference.bench.cachesim import Call, TraceRecorder, belady, replay
from inference.bench.cgroup import ROOT, MemoryCgroup, check_limit
from inference.bench.measure import run_workload
from inference.bench.run import ttft_bounds
from inference.bench.turns import ttft_ratios, turns_problem
from inference.engine import Engine
from inference.errors import RkmojoError
from inference.store import Store
from inference.synth import synth_store


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth_store(tmp_path_factory.mktemp("bench") / "tiny", "tiny-qwen3-moe", router="skewed", progress=False)


def small_workload() -> Workload:
    return Workload(prompt_tokens=8, prefill_tokens=(8, 20), decode_tokens=12, runs=2)


def field(d: dict, path: str):
    for k in path.split("."):
        d = d[k]
    return d


def test_bench_json_has_every_field(tiny, tmp_path):
    o = BenchOptions(
        engine=EngineConfig(expert_slots=5, token_prefetch=0),  # every miss fills a slot, as the simulator replays
        workload=small_workload(),
        sweep=(4, 8),
        bandwidth_seconds=0.2,
        paired_seconds=0.05,
        compute_tokens=4,
        drop_caches=False,
    )
    lines: list[str] = []
    r = run_bench(tiny, o, json_out=str(tmp_path / "b.json"), echo=lines.append)
    saved = json.loads((tmp_path / "b.json").read_text())
    for path in REQUIRED_FIELDS + ("prefill.8.tok_s", "prefill.8.ttft_s", "prefill.20.ttft_s"):
        field(saved, path)  # KeyError names the missing one
    assert saved["router"].startswith("skewed") and saved["engine"]["slots"] == 5
    # every digest checked before the timed runs, as a worker does while idle after a load
    checked = saved["engine"]["digests_checked_before"]
    assert checked["left"] == 0 and checked["seconds"] > 0
    assert any(x.startswith("engine") and "digest checked before the runs" in x for x in lines)
    b = r["bounds"]
    assert b["io_bound_tok_s"] > 0 and b["compute_only_tok_s"] > 0 and b["efficiency"] > 0
    assert b["fault"] == (b["efficiency"] > 1.0)
    assert [s["depth"] for s in b["read"]["sustained"]["sweep"]] == [1, 2, 4, 8, 16, 32, 64]
    # the store's device over the decode runs, from its kernel counters (none for a store on tmpfs)
    dev = saved["decode"]["device"]
    if device_stat(tiny) is None:
        assert dev is None
    else:
        assert 0 < dev["busy_share"] <= 1 and dev["busy_s"] > 0
        assert dev["bytes_per_token"] > 0 and dev["busy_bytes_per_s"] == pytest.approx(
            dev["bytes_per_token"] * saved["workload"]["decode_tokens"] * saved["workload"]["runs"] / dev["busy_s"]
        )
        assert any(x.startswith("decode disk") and "of the bound's rate" in x for x in lines)
    t = r["ttft_bounds"]["20"]
    assert t["bound_s"] == max(t["read_experts_s"] or 0, t["resident_s"]) and t["ratio"] > 0
    assert t["fault"] == (t["ratio"] < 1.0)
    # the bound is the fastest resident run, and every run is shown beside it
    assert len(t["resident_runs_s"]) == 2 and t["resident_s"] == min(t["resident_runs_s"])
    shown = ", ".join(f"{x:.2f}" for x in t["resident_runs_s"])
    assert any(line.startswith("TTFT bound 20") and f"of {shown} s" in line for line in lines)
    assert r["sweep"]["slots"] == [4, 8] and len(r["sweep"]["belady"]) == 2
    assert r["sweep"]["check"]["simulated"] == pytest.approx(r["sweep"]["check"]["measured"])
    assert r["sweep"]["check"]["prefetch_hits"] == 0
    # every timed run is paired with the disk measured right after it
    assert all(x["disk"]["bytes_per_s"] > 0 for x in r["decode"]["runs"] + r["prefill"]["20"]["runs"])
    # at the sweep's deepest depth, capped, whichever depth that sweep found fastest
    assert {x["disk"]["depth"] for x in r["decode"]["runs"] + r["prefill"]["20"]["runs"]} == {16}
    d = r["paired"]["decode"]
    assert len(d["efficiencies"]) == 2 and d["efficiency"] == pytest.approx(np.median(d["efficiencies"]))
    assert d["fault"] == (d["efficiency"] > 1.0) and sorted(r["paired"]["ttft"]) == ["20", "8"]
    assert any(line.startswith("paired") for line in lines)
    # RAM holds both children here: each timed prompt took a turn with the same prompt all-resident
    turns = r["ttft_turns"]
    assert {n: len(x["ratios"]) for n, x in turns.items()} == {"8": 2, "20": 1}
    assert turns["8"]["orders"] == ["streamed first", "resident first"]
    assert len(r["bounds"]["compute"]["turns_served"]) == 3
    for n, x in turns.items():
        runs = r["prefill"][n]["runs"]
        assert x["resident_runs_s"] == [p["resident"]["ttft_s"] for p in runs]
        assert x["same_first_token"]  # streamed bits are the resident ones
        assert x["ratio"] == pytest.approx(np.median(x["ratios"])) and x["fault"] == (x["ratio"] < 1.0)
    shown = ", ".join(f"{x:.2f}" for x in turns["20"]["ratios"])
    assert any(line.startswith("TTFT turns 20") and f"per run: {shown};" in line for line in lines)
    assert all(p[k] >= 0 for p in r["prefill"]["8"]["runs"] for k in ("user_s", "system_s"))


def test_no_turns_times_the_children_one_after_the_other_and_says_so(tiny):
    o = BenchOptions(
        engine=EngineConfig(expert_slots=5),
        workload=Workload(prompt_tokens=8, prefill_tokens=(8,), decode_tokens=2, runs=1),
        bandwidth_seconds=0.1,
        paired_seconds=0,
        compute_tokens=2,
        drop_caches=False,
        turns=False,
    )
    lines: list[str] = []
    r = run_bench(tiny, o, echo=lines.append)
    assert r["ttft_turns"] == {"skipped": "--no-turns"} and r["bounds"]["compute"]["turns_served"] == []
    assert "resident" not in r["prefill"]["8"]["runs"][0]
    assert any(line.startswith("TTFT in turns") and "--no-turns" in line for line in lines)


def test_turns_need_ram_for_both_children_at_once(tiny):
    why = turns_problem(Store(tiny), 2**50)
    assert why.startswith("both children at once need 1048") and "GiB available" in why
    assert turns_problem(Store(tiny), 2**20) is None


def test_a_turns_ratio_is_bounded_by_the_resident_run_beside_it_or_its_reads():
    def run(ttft, resident, read_bytes, order="streamed first", nxt=3):
        cpu = {"user_s": ttft * 1.5, "system_s": 0.5}
        return {
            "ttft_s": ttft,
            "bytes_read": read_bytes,
            "next": 3,
            **cpu,
            "resident": {"ttft_s": resident, "next": nxt, "major_faults": 0, "order": order, **cpu, "user_s": 7.0},
        }

    prefill = {"128": {"runs": [run(6.0, 5.0, 0), run(9.0, 5.0, 8e9, "resident first"), run(4.0, 5.0, 0, nxt=4)]}}
    t = ttft_ratios(prefill, 1e9)["128"]
    assert t["ratios"] == pytest.approx([1.2, 9.0 / 8.0, 0.8]) and t["ratio"] == pytest.approx(9.0 / 8.0)
    assert t["beyond"] == 1 and not t["fault"] and not t["same_first_token"]
    assert t["cpu_s"] == {"streamed": {"user_s": 9.0, "system_s": 0.5}, "resident": {"user_s": 7.0, "system_s": 0.5}}
    assert ttft_ratios({"8": {"runs": [{"ttft_s": 1.0}]}}, 1e9) == {}  # no run took a turn


def test_a_layered_prompts_resident_bound_is_the_faster_of_its_two_orders(tiny):
    """A prompt longer than a chunk streams layer by layer: its all-resident bound is timed in that order too
    (a 1024-token prompt streamed "beat" a bound timed chunk by chunk only)."""
    from inference.bench.run import child_compute

    w = Workload(prompt_tokens=8, prefill_tokens=(8, 20), decode_tokens=4, runs=3)
    c = child_compute(tiny, BenchOptions(engine=EngineConfig(chunk=8), workload=w, compute_tokens=4))
    orders = c["prefill_ttft_by_order_s"]
    assert set(orders["20"]) == {"chunk by chunk", "layer by layer"} and set(orders["8"]) == {"chunk by chunk"}
    assert c["prefill_ttft_s"] == {n: min(v.values()) for n, v in orders.items()}
    # every run is kept: the bound is the fastest of them (3 runs of each length, in either order)
    assert {n: len(v) for n, v in c["prefill_ttft_runs_s"].items()} == {"8": 3, "20": 3}
    assert c["prefill_ttft_s"] == {n: min(v) for n, v in c["prefill_ttft_runs_s"].items()}


def test_a_resident_prompt_layer_by_layer_gives_the_chunked_bits(tiny):
    e = Engine.open(tiny, chunk=8)
    ids = np.random.default_rng(3).integers(0, e.args.vocab_size, 20)
    chunked = e.forward(ids)
    e.reset()
    e.model.layer_by_layer = True
    passes, pass_forward = [], e.model.pass_forward
    e.model.pass_forward = lambda *a, **k: passes.append(1) or pass_forward(*a, **k)
    layered = e.forward(ids)
    assert passes and np.array_equal(chunked, layered)


def test_a_run_is_bounded_by_the_disk_measured_right_after_it():
    """Each run's bound uses its own probe: a run next to a fast disk is held to more than one next to a
    slow one; the median is the figure, single runs beyond their bound are counted, not hidden."""
    from inference.bench.paired import paired_bounds

    def run(tok_s, mb_per_token, disk_gbs, ttft=None):
        disk = {"bytes_per_s": disk_gbs * 1e9, "depth": 8, "seconds": 2.0}
        x = {"tok_s": tok_s, "tokens": 10, "bytes_read": mb_per_token * 1e7, "disk": disk}
        return x | ({"ttft_s": ttft} if ttft else {})

    dec = {"runs": [run(1.0, 500, 1.0), run(1.0, 500, 2.0), run(2.2, 500, 1.0)]}  # IO bounds 2, 4, 2 tok/s
    prefill = {"128": {"runs": [run(0, 500, 1.0, ttft=6.0), run(0, 500, 2.0, ttft=4.0)]}}  # 5 GB: 5 s, 2.5 s
    pb = paired_bounds(dec, prefill, compute=5.0, c={"prefill_ttft_s": {"128": 3.0}})
    assert pb["decode"]["efficiencies"] == pytest.approx([0.5, 0.25, 1.1])
    assert pb["decode"]["efficiency"] == pytest.approx(0.5) and pb["decode"]["beyond"] == 1
    assert not pb["decode"]["fault"]
    t = pb["ttft"]["128"]  # bounds max(5, 3) = 5 s and max(2.5, 3) = 3 s
    assert t["ratios"] == pytest.approx([6.0 / 5.0, 4.0 / 3.0]) and not t["fault"] and t["beyond"] == 0
    slow = paired_bounds({"runs": [run(3.0, 500, 1.0)]}, {}, compute=None, c=None)
    assert slow["decode"]["fault"]  # 1.5x its bound: the measurement, not a result


def test_unpaired_runs_have_no_paired_figures():
    from inference.bench.paired import paired_bounds

    dec = {"runs": [{"tok_s": 1.0, "tokens": 10, "bytes_read": 1e9}]}
    assert paired_bounds(dec, {"8": {"runs": [{"ttft_s": 1.0, "bytes_read": 1e9}]}}, 2.0, None) == {
        "decode": None,
        "ttft": {},
    }


def test_the_paired_probe_stays_within_its_depth_cap(tiny):
    from inference.bench.paired import PAIRED_DEPTH_MAX, paired_probe

    probe = paired_probe(Store(tiny), 64, 0.02)
    a, b = probe(), probe()
    assert a["depth"] == b["depth"] == PAIRED_DEPTH_MAX and a["bytes_per_s"] > 0 and b["bytes_per_s"] > 0


def test_the_prefill_line_counts_the_experts_read_into_lent_slots(tiny):
    """With the lookahead on (the default), a timed prompt reads ahead into slots the finished layers lend,
    and the report says how many; the JSON keeps the count per run."""
    lines: list[str] = []
    o = BenchOptions(
        engine=EngineConfig(expert_slots=3),
        workload=small_workload(),
        sweep=(4,),
        bandwidth_seconds=0.1,
        paired_seconds=0.0,
        compute_tokens=4,
        drop_caches=False,
    )
    r = run_bench(tiny, o, echo=lines.append)
    runs = r["prefill"]["20"]["runs"]
    assert all(x["borrowed"] > 0 for x in runs)
    (line,) = [x for x in lines if x.startswith("prefill 20")]
    assert "experts read ahead into slots lent by finished layers" in line


@pytest.mark.parametrize("io", ["auto", "threads"])
@pytest.mark.parametrize("token_prefetch", [0, 2])
def test_the_simulator_replays_the_engines_own_hits_and_misses(tiny, token_prefetch, io):
    """Reads land in any order (a pread thread pool's need not keep the submitted one), the lookahead's
    reads stay out of the cache and a prompt's lookahead empties finished layers' slots: all of it timing,
    so the trace records it and the replay applies it. With no guesses there is no lookahead."""
    took = lent = 0
    for slots, policy in [(3, "lfu"), (3, "lru"), (6, "lfu")]:  # 3 < top-4 · rows: prefill goes in tiles
        e = Engine.open(tiny, expert_slots=slots, policy=policy, chunk=8, io=io, token_prefetch=token_prefetch)
        rec = e.model.experts = TraceRecorder(e.model.experts)
        run_workload(e, small_workload(), rec)
        sim = replay(rec.calls, 16, slots, policy, as_run=True)
        t = e.expert_stats["total"]
        assert sim["prefill"]["hits"] + sim["decode"]["hits"] == t["hits"]
        assert sim["prefill"]["requests"] + sim["decode"]["requests"] == t["requests"]
        assert sum(c.misses for c in rec.calls) == t["misses"]
        took += sum(len(c.prefetched) for c in rec.calls)
        lent += sum(len(c.lent) for c in rec.calls)
        assert [Call.from_row(json.loads(json.dumps(c.row()))) for c in rec.calls] == rec.calls
        e.close()
    assert (took > 0 and lent > 0) == (token_prefetch != 0)  # both effects were there to replay


def test_the_replay_as_run_keeps_the_lookaheads_reads_uncached_and_empties_lent_slots():
    calls = [
        Call("prefill", 0, (1, 2)),
        Call("prefill", 1, (3, 4), prefetched=(4,), lent=((0, 1),)),
        Call("decode", 0, (1, 2)),
        Call("decode", 1, (3, 4)),
    ]
    plain, run = replay(calls, 8, 2, "lfu"), replay(calls, 8, 2, "lfu", as_run=True)
    assert plain["decode"]["hits"] == 4
    assert run["decode"]["hits"] == 2  # 1 was dropped for a loan, 4 never entered layer 1's cache


def test_the_replay_as_run_lands_reads_in_the_recorded_order():
    """Two slots, a request for 1, 2, 3: 3 takes the slot of whichever of 1 and 2 lands first, so what a
    later request for 1 finds depends on the order the reads landed in, which the trace records."""

    def decode_hits(filled, as_run=True):
        calls = [Call("prefill", 0, (1, 2, 3), filled=filled), Call("decode", 0, (1,))]
        return replay(calls, 8, 2, "lru", as_run=as_run)["decode"]["hits"]

    assert decode_hits((1, 2, 3)) == 0 and decode_hits((), as_run=False) == 0  # 1 landed first, 3 evicted it
    assert decode_hits((2, 1, 3)) == 1  # 2 landed first: 3 took its slot, 1 stayed


def trace(*steps, phase="decode"):
    return [Call(phase, 0, tuple(s)) for s in steps]


def misses(counts):
    return sum(c["requests"] - c["hits"] for c in counts.values())


def test_belady_is_optimal_on_a_hand_made_trace():
    # the textbook reference string: 3 frames, optimum 7 faults
    calls = trace(*[[x] for x in (1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5)])
    assert misses(belady(calls, 3)) == 7
    assert misses(replay(calls, 8, 3, "lru")) == 10
    assert misses(replay(calls, 8, 3, "lfu")) > 7


def brute_force_misses(steps, slots):
    """The true optimum by searching every eviction choice (tiny traces only)."""
    best = {frozenset(): 0}
    for req in steps:
        req = set(req)
        nxt = {}
        for cache, m in best.items():
            m += len(req - cache)
            full = cache | req
            evictable = sorted(cache - req)
            over = max(0, len(full) - slots)
            for out in itertools.combinations(evictable, over):
                state = frozenset(full - set(out))
                nxt[state] = min(nxt.get(state, 1 << 30), m)
        best = nxt
    return min(best.values())


def test_belady_matches_an_exhaustive_search_on_random_set_traces():
    rng = np.random.default_rng(3)
    for _ in range(30):
        steps = [sorted(rng.choice(7, int(rng.integers(1, 3)), replace=False).tolist()) for _ in range(12)]
        calls = trace(*steps)
        opt = brute_force_misses(steps, 3)
        assert misses(belady(calls, 3)) == opt
        assert misses(replay(calls, 7, 3, "lfu")) >= opt and misses(replay(calls, 7, 3, "lru")) >= opt


def test_read_bandwidth_reads_random_blobs_in_the_given_batches(tiny):
    st = Store(tiny)
    r = read_bandwidth(st, [(0, 3), (1, 2)], io="threads", seconds=0.05)
    lay = st.expert_layers[0]
    assert r["reads"] >= 5 and r["bytes"] == r["reads"] * -(-lay.blob_size // 4096) * 4096
    assert r["io"] == "threads" and r["bytes_per_s"] > 0
    assert r["reads"] % 5 == 0 and r["batches"] % 2 == 0  # whole cycles of the given batches


def test_read_bandwidth_reads_one_whole_cycle_of_batches_when_time_runs_out_at_once(tiny):
    r = read_bandwidth(Store(tiny), [(0, 3), (1, 2)], io="threads", seconds=0.0)
    assert (r["reads"], r["batches"], r["mean_batch"]) == (5, 2, 2.5)


def test_sustained_bandwidth_keeps_the_queue_full_and_counts_whole_blobs(tiny):
    st = Store(tiny)
    r = sustained_bandwidth(st, 4, seconds=0.05)
    lay = st.expert_layers[0]
    assert r["reads"] >= 4 and r["bytes"] == r["reads"] * -(-lay.blob_size // 4096) * 4096
    assert r["depth"] == 4 and r["bytes_per_s"] > 0


def test_the_disk_bound_is_the_best_depth_of_the_sweep(tiny):
    r = best_bandwidth(Store(tiny), seconds=0.06, depths=(1, 4, 16))
    assert [s["depth"] for s in r["sweep"]] == [1, 4, 16]
    assert r["bytes_per_s"] == max(s["bytes_per_s"] for s in r["sweep"])


def test_a_depths_rate_is_the_median_of_its_windows_not_the_fastest(tiny):
    r = best_bandwidth(Store(tiny), seconds=0.09, depths=(1, 4, 16), rounds=3)
    for s in r["sweep"]:
        assert len(s["windows"]) == 3 and s["bytes_per_s"] == sorted(s["windows"])[1]
    best = max(r["sweep"], key=lambda s: s["bytes_per_s"])
    assert r["depth"] == best["depth"] and r["bytes_per_s"] == best["bytes_per_s"]
    every = [(s["depth"], w) for s in r["sweep"] for w in s["windows"]]
    assert (r["fastest_window"]["depth"], r["fastest_window"]["bytes_per_s"]) == max(every, key=lambda t: t[1])
    assert r["fastest_window"]["bytes_per_s"] >= r["bytes_per_s"]
    with pytest.raises(ValueError, match="rounds=0"):
        best_bandwidth(Store(tiny), seconds=0.01, rounds=0)


def test_no_window_of_a_sweep_reads_the_blobs_another_read(tiny, monkeypatch):
    from inference.bench import bounds

    seeds = []
    real = bounds.sustained_bandwidth
    monkeypatch.setattr(bounds, "sustained_bandwidth", lambda *a, **k: seeds.append(k["seed"]) or real(*a, **k))
    bounds.best_bandwidth(Store(tiny), seconds=0.03, seed=3, depths=(1, 4), rounds=2)
    bounds.best_bandwidth(Store(tiny), seconds=0.03, seed=4, depths=(1, 4), rounds=2)
    assert len(set(seeds)) == len(seeds) == 8


def test_one_ttft_definition_gives_the_prefill_speed_of_the_same_figure():
    from inference.bench.measure import summarize_prefill

    runs = [{"tokens": 128, "ttft_s": t, "tok_s": 128 / t} for t in (80.0, 8.4)]  # an even count: cold, warm
    p = summarize_prefill(runs)
    assert p["ttft_s"] == 44.2 and p["tok_s"] == 128 / 44.2 and p["runs"] == runs


@pytest.mark.parametrize(
    "size,message",
    [
        ("4M", "too small"),
        ("four gigs", "write it like"),
        ("100T", "more than this machine's RAM"),
        ("-1G", "positive"),
    ],
)
def test_the_cgroup_helper_refuses_bad_sizes_with_a_clear_message(size, message):
    with pytest.raises(RkmojoError, match=message):
        check_limit(size)


def test_cgroup_limit_names_the_size():
    assert check_limit("512M") == 512 * 2**20


v1_root = pytest.mark.skipif(
    os.geteuid() != 0 or not (ROOT / "memory.limit_in_bytes").exists(),
    reason="needs root and a cgroup-v1 memory controller",
)


@v1_root
def test_a_child_over_the_cgroup_limit_is_oom_killed_and_the_group_is_removed():
    hog = "import numpy as np; a = np.ones(400 * 2**20, np.uint8); print(a.sum())"
    with MemoryCgroup("256M") as g:
        proc, use = g.run([sys.executable, "-c", hog], capture_output=True)
        path = g.path
    assert proc.returncode != 0 and use["oom_kills"] >= 1 and use["max_usage_bytes"] <= 256 * 2**20
    assert not path.exists()


@v1_root
def test_the_cgroup_wrapper_runs_a_command_and_reports_its_peak():
    p = subprocess.run(
        [sys.executable, "-m", "inference.bench.cgroup", "256M", "--", sys.executable, "-c", "print(7)"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    assert p.returncode == 0 and p.stdout.strip() == "7" and "peak" in p.stderr


@v1_root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_killed_cgroup_wrapper_takes_its_child_and_its_group_with_it(tmp_path, sig):
    """`kill` of a bench used to end only the parent: its child ran on in the cgroup until the OOM killer."""
    pidfile = tmp_path / "child.pid"
    child = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    p = subprocess.Popen(
        [sys.executable, "-m", "inference.bench.cgroup", "256M", "--", sys.executable, "-c", child],
        cwd=Path(__file__).parent.parent,
    )
    for _ in range(300):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    group = next(
        line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ":memory:" in line
    )
    assert "rkmojo-bench-" in group
    p.send_signal(sig)
    assert p.wait(timeout=30) == 128 + sig
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert not (ROOT / group.lstrip("/")).exists()


def test_a_streamed_first_token_faster_than_its_resident_bound_is_a_measurement_fault(tiny):
    st = Store(tiny)
    resident = {"mode": "resident", "prefill_ttft_s": {"8": 2.0, "20": 3.0}}
    runs = [{"bytes_read": 1e6}]
    t = ttft_bounds(st, {"8": {"ttft_s": 1.0, "runs": runs}, "20": {"ttft_s": 3.3, "runs": runs}}, 1e12, resident)
    assert t["8"]["bound_s"] == 2.0 and t["8"]["ratio"] == 0.5 and t["8"]["fault"]
    assert t["20"]["ratio"] == pytest.approx(1.1) and not t["20"]["fault"]


def test_the_first_tokens_read_bound_is_what_the_prompt_read_not_every_expert_of_the_store(tiny):
    """A prompt finds the experts the run before it left in the slots; a read bound that counts those too
    is one a disk-bound engine beats (the later of three prompts read 11.2 of 12.9 GB on Gemma 4's shapes)."""
    st = Store(tiny)
    every = sum(lay.n_experts * lay.blob_size for lay in st.expert_layers.values())
    runs = [{"bytes_read": every // 2}, {"bytes_read": every}, {"bytes_read": every // 4}]
    t = ttft_bounds(st, {"64": {"ttft_s": 1.0, "runs": runs}}, every / 4, {"mode": "resident", "prefill_ttft_s": {}})
    assert t["64"]["read_bytes"] == every // 2 and t["64"]["read_experts_s"] == pytest.approx(2.0)
    assert t["64"]["bound_s"] == t["64"]["read_experts_s"] and t["64"]["fault"]


def test_the_device_counters_are_the_store_devices_own(tiny, tmp_path):
    stat = device_stat(tiny)
    if stat is None:  # a store on tmpfs has no block device
        assert device_counters(None) is None
        return
    st = os.stat(tiny / "experts")
    assert stat == f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    assert device_stat(tmp_path) == stat  # the same file system: a file here is read from that device
    f = tmp_path / "blob"
    f.write_bytes(np.random.default_rng(0).bytes(1 << 20))  # no holes: every byte is on the device
    os.sync()
    before = device_counters(stat)
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [mmap.mmap(-1, 1 << 20)], 0) == 1 << 20
    finally:
        os.close(fd)
    after = device_counters(stat)
    assert after[0] - before[0] >= 1 << 20 and after[1] >= before[1]
    assert device_stat(tmp_path / "no-such-store") is None
