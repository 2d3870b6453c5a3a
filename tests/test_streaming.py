"""Expert streaming gives the all-resident run's logits bit for bit, whatever the cache does."""

import shutil

import numpy as np
import pytest

from inference.convert import convert
from inference.engine import Engine
from inference.errors import ModelFormatError, RkmojoError
from inference.experts.io import uring_problem
from inference.options import OptionError
from parity import build_checkpoint
from test_parity import gemma4, olmoe, qwen3_moe

ARCHS = {"gemma4": gemma4, "qwen3_moe": qwen3_moe, "olmoe": olmoe}


@pytest.fixture(scope="module", params=list(ARCHS))
def moe_store(request, tmp_path_factory):
    model_cls, cfg = ARCHS[request.param]()
    d = tmp_path_factory.mktemp(request.param)
    src = build_checkpoint(model_cls, cfg, d / "hf")
    return convert(src, d / "store", "q4", progress=False)


def run_tokens(engine: Engine, ids: np.ndarray, n_prompt: int) -> np.ndarray:
    outs = [engine.forward(ids[:n_prompt], last_only=False)]
    for t in ids[n_prompt:]:
        outs.append(engine.forward([t], last_only=False))
    return np.concatenate(outs)


def ids_for(store, n=72, seed=1):
    vocab = Engine.open(store).args.vocab_size
    return np.random.default_rng(seed).integers(0, vocab, n)


@pytest.mark.parametrize(
    "slots,policy,io,prefetch,activations",
    [
        (2, "lfu", "uring", 0, "f32"),
        (2, "lru", "threads", 0, "q8"),
        (3, "lfu", "threads", 4, "f32"),
        (3, "lfu", "threads", 4, "experts"),
        (2, "lfu", "uring", 2, "q8"),
        (3, "lfu", "uring", 2, "decode"),
        (16, "lfu", "uring", 0, "f32"),
    ],
)
def test_streamed_logits_are_bit_identical_to_resident(moe_store, slots, policy, io, prefetch, activations):
    if io == "uring" and uring_problem():
        pytest.skip(f"io_uring cannot be used here: {uring_problem()}")
    ids = ids_for(moe_store)
    resident = run_tokens(Engine.open(moe_store, chunk=16, activations=activations), ids, 40)
    e = Engine.open(
        moe_store, chunk=16, expert_slots=slots, policy=policy, io=io, prefetch=prefetch, activations=activations
    )
    streamed = run_tokens(e, ids, 40)
    assert np.array_equal(resident, streamed)
    st = e.expert_stats
    assert st["io"] == io and st["slots"] == slots
    t = st["total"]
    assert t["requests"] == t["hits"] + t["misses"] and t["misses"] > 0 and t["bytes_read"] > 0
    if slots < 4:
        assert t["evictions"] > 0
    if prefetch:
        assert t["prefetched"] > 0 and t["prefetch_hits"] > 0


def test_where_o_direct_is_refused_reads_are_buffered_and_dropped_from_the_page_cache(moe_store, monkeypatch):
    # tmpfs refused O_DIRECT before Linux 6.6 (this machine's tmpfs accepts it), so refuse it here
    import errno
    import os

    real_open, advised = os.open, []

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    real_fadvise = os.posix_fadvise
    monkeypatch.setattr(
        os, "posix_fadvise", lambda fd, off, n, adv: advised.append(adv) or real_fadvise(fd, off, n, adv)
    )
    ids = ids_for(moe_store, 24)
    a = run_tokens(Engine.open(moe_store, chunk=8), ids, 8)
    e = Engine.open(moe_store, chunk=8, expert_slots=2, io="threads")
    assert not e.model.experts.reader.files.direct
    assert np.array_equal(a, run_tokens(e, ids, 8))
    assert advised and set(advised) == {os.POSIX_FADV_DONTNEED}


def test_a_corrupt_expert_blob_is_named_and_never_used(moe_store, tmp_path):
    bad = shutil.copytree(moe_store, tmp_path / "bad")
    e = Engine.open(bad, expert_slots=4, verify_experts="first")
    lay = e.store.expert_layers[0]
    ids = ids_for(bad, 16)
    # find an expert the first layer will ask for, then corrupt it
    probe = Engine.open(bad)
    asked = []
    probe.model.experts.run = lambda layer, ex, compute, during=None, _r=probe.model.experts.run: (
        (asked.extend(ex) if layer == 0 else None) or _r(layer, ex, compute, during)
    )
    probe.forward(ids)
    victim = asked[0]
    with open(lay.path, "r+b") as f:
        f.seek(victim * lay.stride + 10)
        b = f.read(1)
        f.seek(victim * lay.stride + 10)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(ModelFormatError, match=f"experts/layer_00.bin expert {victim} digest mismatch"):
        e.forward(ids)
    assert victim not in e.model.experts.caches[0].where
    # with checks off the same blob would be used: the check is what stops it
    e2 = Engine.open(bad, expert_slots=4, verify_experts="off")
    e2.forward(ids)


def test_a_budget_too_small_is_refused_with_the_minimum(moe_store):
    with pytest.raises(RkmojoError, match=r"the minimum for store is \d+\.\d\d GiB"):
        Engine.open(moe_store, memory_budget="64M")
    e = Engine.open(moe_store, memory_budget="2G")
    assert e.slots == 16  # everything fits: one slot per expert


def test_prefetch_slots_come_out_of_the_budget(moe_store):
    from inference.engine import RUNTIME_OVERHEAD, expert_slot_bytes, kv_bytes, lookahead_bytes

    e = Engine.open(moe_store, expert_slots=4)
    st, per = e.store, expert_slot_bytes(e.store)
    fixed = st.manifest["dense"]["size"] + kv_bytes(e.cache, e.cfg.context) + RUNTIME_OVERHEAD
    budget = fixed + 10 * per
    assert Engine.open(moe_store, memory_budget=budget, prefetch=2).slots == 8
    with pytest.raises(RkmojoError, match=r"\(\+ \d+ MiB of lookahead slots\); the minimum for store is"):
        Engine.open(moe_store, memory_budget=budget, prefetch=3)
    # with no prefetch slots, a token's 3 guesses take two pools of 3 slots (not 3 per layer)
    guesses = lookahead_bytes(st, 0, 3)
    assert guesses > 0 and Engine.open(moe_store, memory_budget=budget + guesses).slots == 10
    assert Engine.open(moe_store, memory_budget=budget + guesses - 1).slots == 9
    assert Engine.open(moe_store, memory_budget=budget, token_prefetch=0).slots == 10


def test_a_prompt_sharing_a_prefix_only_prefills_the_rest(moe_store):
    ids = ids_for(moe_store, 60).tolist()
    e = Engine.open(moe_store, chunk=16, expert_slots=4)
    e.prefill(ids[:50])
    logits, reused = e.prefill(ids[:40] + ids[50:60])
    assert reused == 40
    fresh = Engine.open(moe_store, chunk=16)
    want, _ = fresh.prefill(ids[:40] + ids[50:60])
    # chunk boundaries differ (40 + 10 rows vs 50), so float sums may differ in the last bits
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)


@pytest.fixture
def crashing_liburing(tmp_path, monkeypatch):
    """A `liburing` that dies with SIGILL when it sets up a ring, as the 2026 wheels do on CPUs
    without AVX-512; it shadows the installed one for the probe's child process."""
    (tmp_path / "liburing.py").write_text(
        "import os, signal\nclass Ring:\n    def __init__(self):\n        os.kill(os.getpid(), signal.SIGILL)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    uring_problem.cache_clear()
    yield
    uring_problem.cache_clear()


def test_a_liburing_that_crashes_the_cpu_is_not_used_and_uring_is_refused_by_name(moe_store, crashing_liburing):
    problem = uring_problem()
    assert problem and "SIGILL" in problem
    with pytest.raises(
        OptionError,
        match=r"io='uring' is out of range; allowed: auto or threads: io_uring is not "
        r"available here \(the liburing package dies with SIGILL",
    ):
        Engine.open(moe_store, chunk=16, expert_slots=2, io="uring")
    e = Engine.open(moe_store, chunk=16, expert_slots=2, io="auto")  # falls back to the thread pool
    assert e.expert_stats["io"] == "threads"
    assert np.isfinite(e.forward([1, 2, 3])).all()


def test_a_prompt_of_many_chunks_reads_each_layers_experts_once_per_pass_with_the_same_bits(moe_store):
    ids = ids_for(moe_store, n=48)
    resident = Engine.open(moe_store, chunk=8).forward(ids, last_only=False)
    read, seen = {}, {}
    for rows in (8, 48):  # 8: chunk by chunk (6 chunks); 48: one layer-by-layer pass of 6 chunks
        e = Engine.open(moe_store, chunk=8, expert_slots=2, prefill_pass=rows)
        progress: list = []
        out = e.forward(ids, last_only=False, progress=lambda d, n, got=progress: got.append((d, n)))
        assert np.array_equal(out, resident)  # every row's arithmetic is the chunked order's
        read[rows] = e.expert_stats["total"]["misses"]
        seen[rows] = progress
        e.close()
    assert read[48] < read[8] / 2  # 2 slots per layer: chunk by chunk re-reads most experts 6 times
    done = [d for d, _ in seen[48]]
    assert done == sorted(done) and done[-1] == 48 and {n for _, n in seen[48]} == {48}
