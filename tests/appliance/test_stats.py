"""The live view's sampler: the machine from /sys (a fake root here), the memory budget, the decaying
expert heatmap of a streaming MoE store, and one whole `WorkerStats` of a board that ran a request."""

import shutil
import time

import numpy as np
import pytest

from appliance.stats import HeatmapWindow, Sampler, machine, memory_budget
from test_worker_board import unit_board
from inference.engine import Engine
from inference.synth import synth_store


def fake_sysfs(root, zones: dict[str, int], cur_khz: int | None = None, max_khz: int | None = None):
    for i, (kind, milli) in enumerate(zones.items()):
        zone = root / "class" / "thermal" / f"thermal_zone{i}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(f"{milli}\n")
    freq = root / "devices" / "system" / "cpu" / "cpu0" / "cpufreq"
    freq.mkdir(parents=True)
    if cur_khz is not None:
        (freq / "scaling_cur_freq").write_text(f"{cur_khz}\n")
    if max_khz is not None:
        (freq / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
    return root


def test_temperatures_and_clocks_come_from_sysfs_where_it_has_them(tmp_path):
    m = machine(fake_sysfs(tmp_path, {"soc-thermal": 51500, "bigcore0-thermal": 48000}, 1800000, 2400000))
    assert m.temperatures == {"soc-thermal": 51.5, "bigcore0-thermal": 48.0}
    assert (m.cpu_mhz, m.cpu_max_mhz) == (1800.0, 2400.0)


def test_a_machine_without_thermal_zones_or_cpufreq_reports_nothing(tmp_path):
    m = machine(tmp_path)
    assert m.temperatures == {} and m.cpu_mhz is None and m.cpu_max_mhz is None
    (tmp_path / "class" / "thermal" / "thermal_zone0").mkdir(parents=True)  # a zone whose files cannot be read
    assert machine(tmp_path).temperatures == {}


@pytest.fixture(scope="module")
def moe_store(tmp_path_factory, smollm2_store):
    store = synth_store(tmp_path_factory.mktemp("moe") / "tiny", "tiny-qwen3-moe", router="skewed", progress=False)
    shutil.copy(smollm2_store / "tokenizer.json", store / "tokenizer.json")  # a worker loads a tokenizer
    return store


def test_the_memory_budget_splits_rss_into_weights_kv_slots_and_runtime(moe_store):
    e = Engine.open(moe_store, expert_slots=3, prefetch=1)
    try:
        slots, prefetch = e.model.experts.slot_bytes()
        mb = memory_budget([e], rss=10 * 2**30, total=16 * 2**30)
        assert mb.dense == e.store.manifest["dense"]["size"] and mb.expert_slots == slots > 0
        assert mb.prefetch_slots == prefetch > 0 and mb.kv > 0
        held = mb.dense + mb.kv + mb.expert_slots + mb.prefetch_slots
        assert mb.runtime == 10 * 2**30 - held and mb.free == 6 * 2**30
        tight = memory_budget([e], rss=1, total=1)  # never below zero
        assert tight.runtime == 0 and tight.free == 0
    finally:
        e.close()


def test_the_heatmap_counts_hits_and_misses_per_expert_and_forgets_them_with_its_half_life(moe_store):
    e = Engine.open(moe_store, expert_slots=3)
    try:
        experts = e.model.experts
        window = HeatmapWindow(half_life=10.0)
        e.forward(np.random.default_rng(0).integers(0, e.args.vocab_size, 16), last_only=False)
        first = window.update("tiny", "k", experts.snapshot(), 1.0)
        layers = sorted(experts.caches)
        assert first.layer_ids == layers and first.experts == experts.caches[layers[0]].n_experts
        hits, misses = np.array(first.hits), np.array(first.misses)
        assert hits.sum() == sum(c.stats.hits for c in experts.caches.values())
        assert misses.sum() == sum(c.stats.misses for c in experts.caches.values())
        for i, layer in enumerate(layers):
            held = {e for e, r in enumerate(first.residency[i]) if r == 1}
            assert held == set(experts.caches[layer].where)
            st = experts.caches[layer].stats
            assert first.layer_hit_rate[i] == pytest.approx(st.hits / st.requests, abs=1e-4)
        later = window.update("tiny", "k", experts.snapshot(), 10.0)  # nothing new for one half-life
        assert np.allclose(np.array(later.hits), hits / 2, atol=0.01)
        assert later.layer_hit_rate == first.layer_hit_rate
        fresh = window.update("tiny", "another engine", experts.snapshot(), 1.0)  # another engine: afresh
        assert np.allclose(np.array(fresh.hits), hits)
    finally:
        e.close()


def test_a_board_that_ran_a_request_samples_into_one_sane_worker_stats(stack, moe_store, tmp_path):
    b = unit_board(stack, tmp_path, {"tiny": moe_store}, name="unit-stats", context=256, expert_slots=3)
    b.scan()
    eng, _ = b.engine("tiny")
    sampler = Sampler(b, sysfs=fake_sysfs(tmp_path / "sys", {"soc-thermal": 60000}, 1000000, 2000000))
    try:
        idle = sampler.sample()
        assert idle.state == "idle" and idle.loaded == ["tiny"] and idle.throttled is False
        time.sleep(0.05)
        for _ in eng.generate(list(range(10, 40)), temperature=0, max_tokens=6):
            pass
        b.tokens += 6
        b.state, b.prefill = "prefill", (64, 128)
        s = sampler.sample()
        assert s.worker == "unit-stats" and s.state == "prefill" and (s.prefill_done, s.prefill_total) == (64, 128)
        assert s.tokens_per_s > 0 and 0 <= s.expert_hit_rate <= 1 and s.disk_mb_per_s > 0
        assert s.throttled is True and s.temperatures == {"soc-thermal": 60.0} and s.cpu_max_mhz == 2000.0
        assert s.memory.total == b.budget() and s.memory.expert_slots > 0 and s.memory.runtime > 0
        assert (
            s.heatmap is not None and s.heatmap.model == "tiny" and any(r is not None for r in s.heatmap.layer_hit_rate)
        )
        assert s.queue_depth == 0 and s.oldest_wait == 0.0
        quiet = sampler.sample()  # nothing ran since: no rate, the heatmap remembers
        assert quiet.tokens_per_s == 0 and quiet.expert_hit_rate is None and quiet.disk_mb_per_s == 0
        assert np.allclose(quiet.heatmap.hits, s.heatmap.hits, rtol=0.01)
    finally:
        b.unload("tiny")
