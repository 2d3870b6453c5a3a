"""The slot cache's eviction policy: LFU with whole-run counts and recency tie-break, LRU, pins."""

import numpy as np
import pytest

from inference.experts.cache import LayerCache, SlotPool
from inference.options import OptionError


def cache(slots=3, policy="lfu", n=16):
    return LayerCache(n, SlotPool(slots, 5000), policy)


def load(c, experts):
    """One layer step: request, assign misses, fill them, unpin."""
    hits, misses = c.request(experts)
    c.pin(hits.values())
    for e in misses:
        c.fill(e, c.assign(e))
    c.unpin_all()
    return hits, misses


def test_slots_are_page_aligned_and_preallocated():
    p = SlotPool(4, 5000)
    assert p.slot_bytes == 8192 and p.array.ctypes.data % 4096 == 0
    assert all(p.view(i).ctypes.data % 4096 == 0 for i in range(4))


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(
    "[never]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read(), reason="transparent huge pages are off"
)
def test_the_slots_ask_for_huge_pages():
    """O_DIRECT reads into 2 MiB pages go out whole instead of split by max_segments 4 KiB pages."""
    p = SlotPool(2, 3 * 2**20)
    assert p.huge and "hg" in vm_flags(p.array.ctypes.data)


def test_hugepages_off_keeps_the_slots_in_small_pages(tmp_path):
    from inference.engine import Engine
    from inference.synth import synth_store

    p = SlotPool(2, 3 * 2**20, huge=False)
    assert not p.huge and "hg" not in vm_flags(p.array.ctypes.data)
    e = Engine.open(synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False), expert_slots=2, hugepages=False)
    try:
        ex = e.model.experts
        assert not any(c.pool.huge for c in ex.caches.values()) and not any(p.huge for p in ex.lookahead.pools.values())
    finally:
        e.close()


def test_lfu_evicts_empty_slots_first_then_the_least_requested():
    c = cache()
    load(c, [1])
    load(c, [1])
    load(c, [2])
    load(c, [2])
    load(c, [3])
    assert c.stats.evictions == 0
    load(c, [4])  # 3 has count 1, the others 2
    assert 3 not in c.where and {1, 2, 4} <= set(c.where)


def test_lfu_counts_survive_eviction_and_ties_go_to_the_least_recent():
    c = cache(slots=2)
    for _ in range(3):
        load(c, [5])  # count 3
    load(c, [6])
    load(c, [7])  # 7 evicts 6 (count 1 < 3)
    assert set(c.where) == {5, 7}
    load(c, [6])  # 6 comes back: its count is now 2 (kept across the eviction); evicts 7 (count 1)
    assert set(c.where) == {5, 6}
    load(c, [8])  # evicts 6 (count 2 < 3)
    load(c, [9])  # evicts 8 (count 1)
    assert set(c.where) == {5, 9}
    c2 = cache(slots=2)
    load(c2, [1])
    load(c2, [2])  # equal counts: the least recently used goes
    load(c2, [1])
    load(c2, [2])
    load(c2, [3])
    assert set(c2.where) == {2, 3}


def test_lru_ignores_counts():
    c = cache(slots=2, policy="lru")
    for _ in range(5):
        load(c, [1])
    load(c, [2])
    load(c, [3])
    assert set(c.where) == {2, 3}


def test_pinned_slots_are_never_evicted():
    c = cache(slots=2)
    load(c, [1])
    load(c, [2])
    hits, misses = c.request([1, 3])
    c.pin(hits.values())
    s = c.assign(3)
    assert c.slot_expert[hits[1]] == 1 and s != hits[1]
    with pytest.raises(RuntimeError, match="every slot is pinned"):
        c.assign(4)


def test_stats_count_every_request():
    c = cache(slots=2)
    load(c, [1, 2])
    load(c, [1, 3])
    st = c.stats
    assert (st.requests, st.hits, st.misses, st.evictions) == (4, 1, 3, 1)
    assert st.hit_rate == 0.25


def test_hits_and_misses_are_counted_per_expert_and_a_snapshot_is_a_copy():
    c = cache(slots=2)
    load(c, [1, 2])
    load(c, [1, 3])
    load(c, [1])
    snap = c.snapshot()
    assert snap.hits[1] == 2 and snap.misses[1] == 1 and snap.misses[2] == snap.misses[3] == 1
    assert snap.hits.sum() == c.stats.hits and snap.misses.sum() == c.stats.misses
    assert sorted(snap.cached.tolist()) == sorted(c.where) and snap.prefetching == ()
    load(c, [1])
    assert snap.hits[1] == 2 and c.snapshot().hits[1] == 3  # the snapshot does not follow the cache


def test_a_streaming_store_snapshots_every_moe_layer_and_its_prefetch_slots(tmp_path):
    import numpy as np

    from inference.engine import Engine
    from inference.synth import synth_store

    e = Engine.open(synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False), expert_slots=3, prefetch=2)
    try:
        e.forward(np.random.default_rng(0).integers(0, e.args.vocab_size, 12), last_only=False)
        experts = e.model.experts
        snaps = experts.snapshot()
        assert sorted(snaps) == sorted(experts.caches)
        for layer, s in snaps.items():
            st = experts.caches[layer].stats
            assert (s.hits.sum(), s.misses.sum()) == (st.hits, st.misses) and st.requests > 0
            assert len(s.cached) <= 3 and set(s.prefetching) <= set(range(len(s.hits)))
        cache_bytes, prefetch_bytes = experts.slot_bytes()
        assert cache_bytes == sum(3 * c.pool.slot_bytes for c in experts.caches.values())
        assert prefetch_bytes == 2 * cache_bytes // 3
    finally:
        e.close()


# --- warm start from saved popularity ----------------------------------------------------------------
def test_a_fresh_engine_warmed_from_saved_popularity_hits_where_a_cold_one_misses(moe_store, tmp_path):
    from inference.engine import Engine

    prompt = list(range(10, 42))
    first = Engine.open(moe_store, expert_slots=4, verify_experts="always")
    try:
        first.forward(prompt)
        assert first.save_popularity(tmp_path / "pop.npz")
        saved = first.model.experts.popularity()
    finally:
        first.close()

    cold = Engine.open(moe_store, expert_slots=4)
    warm = Engine.open(moe_store, expert_slots=4)
    try:
        assert warm.warm_experts(tmp_path / "pop.npz") == 4 * len(saved)  # every slot of every layer filled
        for layer, cache in warm.model.experts.caches.items():
            top = set(np.argsort(-saved[layer], kind="stable")[:4].tolist())
            assert set(cache.where) == top and cache.stats.requests == 0
        a, b = cold.forward(prompt[:1]), warm.forward(prompt[:1])
        np.testing.assert_array_equal(a, b)  # the same bits whatever the cache holds
        hits = lambda e: sum(c.stats.hits for c in e.model.experts.caches.values())  # noqa: E731
        assert hits(warm) > hits(cold) == 0
    finally:
        cold.close()
        warm.close()


def test_popularity_of_another_store_is_ignored_and_a_broken_file_is_named(moe_store, tmp_path):
    from inference.engine import Engine
    from inference.experts import popularity

    popularity.save(tmp_path / "other.npz", "not-this-store", {0: np.ones(16, np.int64)})
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 truncated")
    e = Engine.open(moe_store, expert_slots=4)
    try:
        assert e.warm_experts(tmp_path / "other.npz") == 0
        assert e.warm_experts(tmp_path / "missing.npz") == 0
        with pytest.raises(popularity.PopularityError, match="broken.npz.*delete it"):
            e.warm_experts(tmp_path / "broken.npz")
    finally:
        e.close()
    assert not list(tmp_path.glob(".*tmp*"))


def test_a_layer_wanting_more_experts_than_slots_keeps_every_slot_reading(tmp_path):
    """A prefill's layer streams its experts through its slots: each computed expert's slot takes the
    next read at once, not when a whole tile of slots has been computed (experts landed together are
    computed in one call)."""
    from inference.experts import StreamingExperts
    from inference.store import Store
    from inference.synth import synth_store

    store = Store(synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False))
    src = StreamingExperts(store, 3, io="threads")
    try:
        layer = next(iter(src.layouts))
        submitted = []
        real = src._requests
        src._requests = lambda layer, experts: submitted.extend(experts) or real(layer, experts)  # noqa: E731
        seen = []  # per compute call: (experts computed before it, reads submitted so far)
        computed = []

        def compute(batch):
            seen.append((len(computed), len(submitted)))
            computed.extend(e for e, _ in batch)

        want = list(range(10))
        src.run(layer, want, compute)
        assert sorted(submitted) == want and sorted(computed) == want  # every expert read once, computed once
        # each slot an earlier call left has taken the next read before the next call (a tile would wait
        # until all 3 slots were computed)
        assert len(seen) > 1 and seen[1][1] > 3
        assert all(n_read == min(10, 3 + before) for before, n_read in seen)
        assert len(src.caches[layer].pinned) == 0 and len(src.caches[layer].where) == 3
    finally:
        src.close()


def test_a_prompt_computes_the_cached_experts_first_so_their_slots_read_during_the_shared_work(tmp_path):
    """When a layer's misses outnumber its free slots (a prompt after a chat filled the cache), the cached
    experts are computed before the shared work (`during_io`, the dense MLP), so the slots they held are
    reading the misses while it runs; a generated token (misses fit the free slots) keeps the shared work
    first. Every expert is computed once either way."""
    from inference.experts import StreamingExperts
    from inference.store import Store
    from inference.synth import synth_store

    store = Store(synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False))
    src = StreamingExperts(store, 3, io="threads", guesses=0)
    try:
        layer = next(iter(src.layouts))
        src.run(layer, [0, 1, 2], lambda batch: None)  # cached: 0, 1, 2
        submitted, computed, at_shared = [], [], []
        real = src._requests
        src._requests = lambda layer, experts: submitted.extend(experts) or real(layer, experts)  # noqa: E731

        def shared():
            at_shared.append((sorted(computed), list(submitted)))

        src.run(layer, [0, 1, 2, 3, 4, 5, 6], lambda batch: computed.extend(e for e, _ in batch), shared)
        assert at_shared == [([0, 1, 2], [3, 4, 5])]  # the three slots took the first misses before it
        assert sorted(computed) == list(range(7)) and sorted(submitted) == [3, 4, 5, 6]

        computed.clear(), submitted.clear(), at_shared.clear()
        two = sorted(src.caches[layer].where)[:2]
        src.run(layer, [*two, 9], lambda batch: computed.extend(e for e, _ in batch), shared)  # 1 miss, 1 free
        assert at_shared == [([], [9])]  # the miss fits: read, and the shared work comes first
        assert sorted(computed) == sorted([*two, 9])
    finally:
        src.close()


def test_prefetch_slots_are_two_pools_a_prompt_fills_one_and_a_token_takes_its_share(tmp_path):
    """`prefetch` slots per layer, as the memory plan counts them, alternate between the layers as two
    pools: a prompt's lookahead (every expert wanted) reads a whole pool ahead, one token's `prefetch`.
    (The pools alone: no slots lent by finished layers, which the test after the next one covers.)"""
    from inference.engine import Engine
    from inference.synth import synth_store

    e = Engine.open(synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False), expert_slots=2, prefetch=2)
    try:
        ex = e.model.experts
        ex.lookahead.lend = False
        pools = ex.lookahead.pools
        layers = sorted(pools)
        assert len({id(p) for p in pools.values()}) == 2 and pools[layers[0]] is pools[layers[2]]
        assert ex.slot_bytes()[1] == 2 * len(layers) * ex.caches[layers[0]].pool.slot_bytes
        e.forward(np.arange(1, 13))
        assert [ex.caches[i].stats.prefetched for i in layers] == [0] + [len(layers)] * (len(layers) - 1)
        ex.reset_stats()
        e.forward([5])
        assert [ex.caches[i].stats.prefetched for i in layers] == [0] + [2] * (len(layers) - 1)
    finally:
        e.close()


def test_a_token_reads_its_best_few_guesses_and_a_prompt_the_whole_pool(tmp_path):
    """Prefetch slots beyond `token_prefetch` (3) serve prompts: a generated token's lookahead reads only its
    best guesses, in score order, while a prompt fills the pool."""
    from inference.engine import Engine
    from inference.synth import synth_store

    e = Engine.open(
        synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False), expert_slots=2, prefetch=5, token_prefetch=3
    )
    try:
        ex = e.model.experts
        layers = sorted(ex.lookahead.pools)
        e.forward(np.arange(1, 13))
        assert all(ex.caches[i].stats.prefetched > 5 for i in layers[1:])
        ex.reset_stats()
        e.forward([5])
        assert [ex.caches[i].stats.prefetched for i in layers[1:]] == [3] * (len(layers) - 1)
    finally:
        e.close()
    with pytest.raises(OptionError, match=r"token_prefetch=-1 .*an integer ≥ 0"):
        Engine.open(tmp_path / "s", expert_slots=2, prefetch=5, token_prefetch=-1)


def test_with_no_prefetch_slots_a_token_reads_its_guesses_into_two_small_pools(tmp_path):
    """A streaming engine without prefetch slots still reads a generated token's best guesses, into two
    pools of that many slots (the memory plan counts them); a prompt fills such a pool too, and
    `token_prefetch` 0 turns the lookahead off."""
    from inference.engine import Engine, lookahead_bytes
    from inference.synth import synth_store

    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    e = Engine.open(path, expert_slots=2, token_prefetch=2)
    try:
        ex = e.model.experts
        ex.lookahead.lend = False  # the pools alone (lent slots: the next test)
        pools = ex.lookahead.pools
        layers = sorted(pools)
        assert len(layers) > 2 and {p.n for p in pools.values()} == {2}
        assert len({id(p) for p in pools.values()}) == 2
        assert ex.slot_bytes()[1] == lookahead_bytes(e.store, 0, 2) == 2 * 2 * ex.caches[layers[0]].pool.slot_bytes
        e.forward(np.arange(1, 13))
        assert [ex.caches[i].stats.prefetched for i in layers] == [0] + [2] * (len(layers) - 1)
        ex.reset_stats()
        e.forward([5])
        st = [ex.caches[i].stats for i in layers]
        assert [s.prefetched for s in st] == [0] + [2] * (len(layers) - 1)
        assert sum(s.prefetch_hits for s in st) > 0
    finally:
        e.close()
    e = Engine.open(path, expert_slots=2, token_prefetch=0)
    try:
        assert not e.model.experts.wants_prefetch and e.model.experts.slot_bytes()[1] == 0
        e.forward([5, 6])
    finally:
        e.close()


def test_a_token_s_guesses_go_on_the_demand_reads_ring_and_change_no_bit(tmp_path):
    """Where the demand reads use io_uring, a generated token's guesses go on that ring, behind the layer's
    reads (a prompt's still through the prefetch threads, which land them in parallel), and the logits are
    those of reading every guess through threads."""
    from inference.engine import Engine
    from inference.experts.io import uring_problem
    from inference.synth import synth_store

    if uring_problem():
        pytest.skip(f"io_uring cannot be used here: {uring_problem()}")
    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    out = {}
    for io in ("auto", "threads"):
        e = Engine.open(path, expert_slots=2, io=io, token_prefetch=2)
        try:
            ex = e.model.experts
            assert (ex.lookahead.ring is not None) == (io == "auto")
            rings = []
            if ex.lookahead.ring is not None:
                submit = ex.lookahead.ring.submit
                ex.lookahead.ring.submit = lambda reqs, then=None, rings=rings, submit=submit, **kw: (
                    (then is not None and rings.append(len(reqs))) or submit(reqs, then, **kw)
                )
            prompt = np.asarray(e.forward(np.arange(1, 13)))
            on_ring_in_prompt = len(rings)
            ex.reset_stats()
            token = np.asarray(e.forward([5]))
            guessed = sum(ex.caches[i].stats.prefetched for i in ex.lookahead.pools)
            out[io] = (prompt, token, on_ring_in_prompt, len(rings), guessed)
        finally:
            e.close()
    (p_ring, t_ring, in_prompt, on_ring, guessed), (p_threads, t_threads, *_) = out["auto"], out["threads"]
    assert in_prompt == 0 and guessed > 0 and on_ring == guessed  # every guess of the token, none of the prompt
    assert np.array_equal(p_ring, p_threads) and np.array_equal(t_ring, t_threads)


def test_a_prompt_reads_the_next_layer_into_slots_the_finished_layers_lend(tmp_path):
    """Beyond its pool, a prompt's lookahead reads the next layer's experts into cache slots lent by the
    layers its pass has finished, and where those are too few (its first layers) by the layers after the
    next one, never the running layer's or the next one's; the lenders' cached experts leave their cache,
    a lender's next run takes its slots back, and every logit is the all-resident run's."""
    from inference.engine import Engine
    from inference.synth import synth_store

    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    calls = [np.arange(1, 25), [7], [9], np.arange(30, 50), [11]]  # a prompt, tokens, a second prompt, a token
    want = Engine.open(path)
    want = [want.forward(ids, last_only=False) for ids in calls]
    e = Engine.open(path, expert_slots=4)
    try:
        ex = e.model.experts
        layers = sorted(ex.lookahead.pools)
        loans = ex.lookahead.lending.loans
        assert len(layers) > 3 and ex.lookahead.lend
        got = [e.forward(calls[0], last_only=False)]
        st = [ex.caches[i].stats for i in layers]
        assert st[0].borrowed == 0 and all(s.borrowed > 0 for s in st[1:])  # layer 1 from the later layers
        assert sum(s.prefetched for s in st) > sum(s.borrowed for s in st) > 0 and sum(s.lent for s in st) > 0
        place = {layer: k for k, layer in enumerate(layers)}
        # what is still lent after the pass: the finished layers' slots (a later lender took its own back as it ran)
        assert loans and all(
            place[borrower] >= place[lender] + 2 for lender, lent in loans.items() for _, _, borrower, _ in lent
        )
        got.append(e.forward(calls[1], last_only=False))
        assert not loans  # each lender's run took its slots back
        got += [e.forward(ids, last_only=False) for ids in calls[2:]]
        for a, b in zip(want, got):
            assert np.array_equal(a, b)
    finally:
        e.close()
    e = Engine.open(path, expert_slots=4)
    try:
        e.model.experts.lookahead.lend = False
        e.forward(calls[0])
        assert e.expert_stats["total"]["borrowed"] == 0
    finally:
        e.close()


def test_the_lookahead_for_the_next_layer_follows_the_current_layers_reads(tmp_path):
    """A prompt's lookahead reads wait until the current layer's own reads are all submitted, a generated
    token's until they have all landed, so they do not slow the reads the current layer waits for."""
    from inference.engine import Engine
    from inference.synth import synth_store

    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    e = Engine.open(path, expert_slots=2, prefetch=2, io="threads")
    try:
        ex = e.model.experts
        log = []  # ("demand" | "prefetch", layer) in submission order, ("landed", layer) as reads land
        demand, pf = ex._requests, ex.lookahead.reader.submit
        ex._requests = lambda layer, experts: log.extend([("demand", layer)] * len(experts)) or demand(layer, experts)  # noqa: E731
        ex.lookahead.reader.submit = lambda reqs, then=None: (
            log.extend(("prefetch", r.layer) for r in reqs) or pf(reqs, then)
        )  # noqa: E731
        e.forward(np.arange(1, 13))
        layers = sorted(ex.lookahead.pools)
        for prev, nxt in zip(layers, layers[1:]):
            last_demand = max(i for i, x in enumerate(log) if x == ("demand", prev))
            first_pf = min(i for i, x in enumerate(log) if x == ("prefetch", nxt))
            assert last_demand < first_pf
        log.clear()
        one = ex.reader._one  # a demand read, on a reader thread: log it once it has landed

        def logged(r, then=None):
            got = one(r, then)
            log.append(("landed", r.layer))
            return got

        ex.reader._one = logged
        e.forward([7])
        for prev, nxt in zip(layers, layers[1:]):
            if ("prefetch", nxt) in log:  # its guesses were not all cached already
                at = log.index(("prefetch", nxt))
                assert log[:at].count(("demand", prev)) == log[:at].count(("landed", prev)), log
        assert ("prefetch", layers[1]) in log
    finally:
        e.close()


def test_a_read_whose_landing_is_only_its_views_lands_on_the_engine_s_thread(tmp_path):
    """A read whose digest is unchecked lands on a lander thread (the check runs while the engine computes);
    once checked, on a store that holds its experts repacked, landing is only making views: the engine does
    it itself rather than wait for a thread to wake. The logits do not change."""
    from inference.engine import Engine
    from inference.synth import synth_store

    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    out = []
    for verify in ("first", "off"):
        e = Engine.open(path, expert_slots=2, verify_experts=verify, io="threads")
        try:
            ex, landers = e.model.experts, []
            submit = ex.landing.lander.submit
            ex.landing.lander.submit = lambda *a, submit=submit, landers=landers: landers.append(a) or submit(*a)
            first = np.asarray(e.forward(np.arange(1, 13)))
            in_prompt = len(landers)
            e.reset()
            again = np.asarray(e.forward(np.arange(1, 13)))  # every expert checked by now
            out.append((first, again, in_prompt, len(landers) - in_prompt))
        finally:
            e.close()
    (first, again, checked, later), (first_off, again_off, off, off_later) = out
    assert checked > 0 and later == 0 and off == off_later == 0
    assert np.array_equal(first, again) and np.array_equal(first, first_off) and np.array_equal(again, again_off)


def test_experts_checked_while_idle_are_trusted_by_the_first_prompt_and_a_bad_one_still_fails(tmp_path, caplog):
    """`Engine.check_experts` checks the digests no read has checked yet, a slice at a time (at least one
    expert per call), touching no slot: the first prompt then lands every read on the engine's thread. An
    expert whose bytes changed on disk is logged, left unchecked and not tried again, and the prompt that
    reads it fails with the digest message."""
    from inference.engine import Engine
    from inference.errors import ModelFormatError
    from inference.synth import synth_store

    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    e = Engine.open(path, expert_slots=2, io="threads")
    try:
        ex = e.model.experts
        total = sum(lay.n_experts for lay in ex.layouts.values())
        verified = ex.landing.verified
        assert e.check_experts(0) == total - 1 and len(verified) == 1  # a slice of nothing still checks one
        assert e.check_experts(60) == 0 and len(verified) == total and e.check_experts(60) == 0
        assert all(not c.where for c in ex.caches.values())  # no slot was used
        landers = []
        submit = ex.landing.lander.submit
        ex.landing.lander.submit = lambda *a: landers.append(a) or submit(*a)
        checked_first = np.asarray(e.forward(np.arange(1, 13)))
        assert landers == []
    finally:
        e.close()
    e = Engine.open(path, expert_slots=2, io="threads")
    try:  # unchecked, the same prompt: the same logits
        assert np.array_equal(np.asarray(e.forward(np.arange(1, 13))), checked_first)
    finally:
        e.close()
    layer = min(e.store.expert_layers)
    lay = e.store.expert_layers[layer]
    with open(lay.path, "r+b") as f:  # one byte of expert 1 changes on disk
        f.seek(lay.stride + 100)
        b = f.read(1)
        f.seek(lay.stride + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    e = Engine.open(path, expert_slots=2, io="threads")
    try:
        land = e.model.experts.landing
        assert e.check_experts(60) == 0 and land.mismatched == {(layer, 1)} and (layer, 1) not in land.verified
        assert "expert 1 digest mismatch" in caplog.text
        assert e.check_experts(60) == 0 and len(land.verified) == total - 1  # not tried again
        with pytest.raises(ModelFormatError, match=r"expert 1 digest mismatch; re-run `rkmojo pull`"):
            for t in range(1, 200):  # until a token routes to the bad expert
                e.forward([t])
    finally:
        e.close()


def test_a_guess_rank_is_read_while_it_is_right_often_enough_and_scored_even_when_not_read(tmp_path):
    """A token's k-th guess is read while the k-th candidates have been right at least GUESS_PRECISION of
    the time; a rank left out is still scored against what each layer asks for, so it can come back."""
    from inference.engine import Engine
    from inference.experts.lookahead import GUESS_PRECISION
    from inference.synth import synth_store

    path = synth_store(tmp_path / "s", "tiny-qwen3-moe", progress=False)
    e = Engine.open(path, expert_slots=2, token_prefetch=3)
    try:
        ex = e.model.experts
        ex.lookahead.lend = False
        guesses = ex.lookahead.guesses
        layers = sorted(ex.lookahead.pools)
        assert guesses.min == GUESS_PRECISION and guesses.ranks() == 3  # unmeasured: all read
        e.forward(np.arange(1, 13))
        assert ex.stats()["guesses"]["scored"] == [0, 0, 0]  # a prompt's lookahead is not a token's guess
        guesses.right[:] = [1.0, 0.5, 1.0]  # the second rank wrong half the time: only the first is read
        ex.reset_stats()
        e.forward([5])
        assert [ex.caches[i].stats.prefetched for i in layers] == [0] + [1] * (len(layers) - 1)
        g = ex.stats()["guesses"]
        # every layer after the first named three candidates not cached, and scored them
        assert g["scored"] == [len(layers) - 1] * 3 and g["reading"] == 1
        assert all(0 <= r <= n for r, n in zip(g["right"], g["scored"]))
        guesses.right[:] = 0.0  # no rank right enough: nothing read, yet every candidate scored
        ex.reset_stats()
        e.forward([6])
        assert sum(ex.caches[i].stats.prefetched for i in layers) == 0
        scored = ex.stats()["guesses"]["scored"]  # fewer later ranks where the cache holds a candidate
        assert scored[0] == 2 * (len(layers) - 1) and all(len(layers) - 1 < n <= scored[0] for n in scored)
        assert guesses.ranks() == 0
        guesses.min = 0.0  # 0: every guess, whatever its record
        ex.reset_stats()
        e.forward([7])
        assert [ex.caches[i].stats.prefetched for i in layers] == [0] + [3] * (len(layers) - 1)
    finally:
        e.close()


def test_the_scores_move_toward_what_the_layer_asked_for():
    from inference.experts.lookahead import GUESS_WINDOW, GuessScores

    g = GuessScores(3, 3)
    g.candidates = {4: [10, 11, 12]}
    g.score(4, [12, 10, 7])
    assert g.used.tolist() == [1, 0, 1] and g.scored.tolist() == [1, 1, 1]
    assert g.right.tolist() == [1.0, 1.0 - 1.0 / GUESS_WINDOW, 1.0]
    assert 4 not in g.candidates
    g.score(4, [1])  # no candidates named for it: nothing scored
    assert g.scored.tolist() == [1, 1, 1]
