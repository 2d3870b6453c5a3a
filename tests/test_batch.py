"""Continuous batching (inference.batch): several sequences stepped together give, each, the tokens and
log-probabilities they get alone on the engine, bit for bit; a cancelled one leaves the others as they
were; a full batcher queues the next request until a slot frees.

Solo references run on the same engine (`Engine.generate` after `reset`), so both sides use the same
kernels, activations and thread count. Prompts differ in length and join at different steps: the
batcher admits one request per round here (`join_at`), so later ones prefill while earlier ones decode.
"""

import numpy as np
import pytest

from inference import kernels
from inference.batch import Batcher
from inference.engine import Engine
from inference.generate import Final, TokenEvent

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea. The sea is",
    "1, 2, 3, 4,",
    "Once upon a time, in a land far away, there lived a king who had three daughters. The youngest",
]


def _ids(engine, n):
    return [engine.tokenizer.encode(t) for t in PROMPTS[:n]]


def _params(i):
    # greedy for some, seeded sampling for others: both must match their solo run
    return {"max_tokens": 12 + 3 * i, "temperature": 0 if i % 2 == 0 else 0.9, "seed": 7 + i, "logprobs": 2}


def _tokens(events):
    return [(e.id, e.logprob, e.top_logprobs) for e in events if isinstance(e, TokenEvent)]


def _solo(engine, ids, i):
    engine.reset()
    events = list(engine.generate(ids, _params(i)))
    return _tokens(events), events[-1]


def _batched(engine, prompts, slots, join_at=None):
    b = Batcher(engine, slots=slots)
    seqs = []
    join_at = join_at or [0] * len(prompts)
    rounds = 0
    pending = list(enumerate(prompts))
    while pending or b.running or b.waiting:
        while pending and join_at[pending[0][0]] <= rounds:
            i, ids = pending.pop(0)
            seqs.append(b.generate(ids, _params(i)))
        b.round()
        rounds += 1
    out = []
    for s in seqs:
        evs = []
        while not s.events.empty():
            evs.append(s.events.get())
        assert isinstance(evs[-1], Final)
        out.append((_tokens(evs), evs[-1]))
    return out, b


@pytest.fixture(scope="module", params=["llama", "qwen3_moe", "qwen3_moe_streamed", "gemma4"])
def engine(request, smollm2_store, moe_text_store, gemma4_store):
    kind = request.param
    if kind == "llama":
        e = Engine.open(smollm2_store)
    elif kind == "qwen3_moe":
        e = Engine.open(moe_text_store)
    elif kind == "qwen3_moe_streamed":  # few slots: experts evicted and read again within a step
        e = Engine.open(moe_text_store, expert_slots=5, token_prefetch=2)
    else:
        e = Engine.open(gemma4_store)
    yield e
    e.close()


@pytest.mark.parametrize("n", [1, 2, 4])
def test_batched_sequences_get_the_tokens_they_get_alone(engine, n):
    prompts = _ids(engine, n)
    solo = [_solo(engine, ids, i) for i, ids in enumerate(prompts)]
    batched, b = _batched(engine, prompts, slots=4, join_at=[0, 0, 3, 7][:n])
    for i, ((tokens, final), (s_tokens, s_final)) in enumerate(zip(batched, solo)):
        assert tokens == s_tokens, f"sequence {i}"
        assert final.text == s_final.text and final.finish_reason == s_final.finish_reason
    if n > 1 and engine.model.compiled_decode() and hasattr(engine.model.step_class, "batch"):
        assert b.rows > b.steps  # some steps really ran several sequences at once


def test_the_batched_step_rows_have_the_one_row_bits_in_every_activation_mode(engine):
    """The model-level step, in the f32 and the int8 ("decode") modes: rows of one call against one row
    each."""
    model = engine.model
    for mode in ("f32", "decode"):
        with kernels.configured(None, mode):
            caches, alone = [model.new_cache() for _ in range(3)], [model.new_cache() for _ in range(3)]
            prompts = _ids(engine, 3)
            for c, a, ids in zip(caches, alone, prompts):
                model.forward(np.array(ids), c, prompt=True)
                model.forward(np.array(ids), a, prompt=True)
            steps = [model.step_class(model) if model.step_class else None for _ in range(3)]
            got = model.decode_batch([5, 17, 300], caches, steps)
            for s, (t, a) in enumerate(zip([5, 17, 300], alone)):
                want = model.forward(np.array([t]), a, last_only=True)
                assert np.array_equal(got[s], want[0]), f"row {s} in mode {mode}"


def test_cancelling_one_sequence_leaves_the_others_unchanged(engine):
    prompts = _ids(engine, 3)
    solo = [_solo(engine, ids, i) for i, ids in enumerate(prompts)]
    b = Batcher(engine, slots=3)
    seqs = [b.generate(ids, _params(i)) for i, ids in enumerate(prompts)]
    for _ in range(6):
        b.round()
    seqs[1].cancel()
    b.run_until_idle()
    results = [list(s.events.queue) for s in seqs]
    assert results[1][-1].finish_reason == "cancelled"
    for i in (0, 2):
        assert _tokens(results[i]) == solo[i][0]


def test_a_full_batcher_queues_the_next_request_and_serves_it_when_a_slot_frees(engine):
    prompts = _ids(engine, 3)
    b = Batcher(engine, slots=2)
    seqs = [b.generate(ids, {"max_tokens": 4 + 6 * i, "temperature": 0}) for i, ids in enumerate(prompts)]
    b.round()
    assert len(b.running) == 2 and b.waiting == [seqs[2]]
    while not seqs[0].finished:
        assert seqs[2].slot is None
        b.round()
    b.round()
    assert seqs[2].slot is not None  # admitted at the next round, into the slot the first one left
    b.run_until_idle()
    assert all(s.finished for s in seqs)
    engine.reset()
    alone = [
        e.id for e in engine.generate(prompts[2], {"max_tokens": 16, "temperature": 0}) if isinstance(e, TokenEvent)
    ]
    assert [e.id for e in seqs[2].events.queue if isinstance(e, TokenEvent)] == alone


def test_a_background_request_does_not_take_the_last_free_slot(smollm2_store):
    e = Engine.open(smollm2_store)
    b = Batcher(e, slots=2)
    ids = _ids(e, 3)
    first = b.generate(ids[0], {"max_tokens": 30, "temperature": 0}, priority=6)
    second = b.generate(ids[1], {"max_tokens": 30, "temperature": 0}, priority=6)
    b.round()
    assert first.slot is not None and second.slot is None  # one slot kept for an interactive request
    chat = b.generate(ids[2], {"max_tokens": 5, "temperature": 0}, priority=0)
    b.round()
    assert chat.slot is not None and second.slot is None
    b.run_until_idle()
    assert all(s.finished for s in (first, second, chat))


def test_a_slot_taken_by_another_conversation_is_saved_and_its_conversation_resumes_from_the_file(
    smollm2_store, tmp_path
):
    """One slot, a saved-state store (the worker's prompt cache): A runs, B takes A's slot (A is saved to a
    file first), then A's next turn starts from the file, reusing all of A's tokens, and answers as it does
    alone."""
    from appliance.promptcache import PromptCache

    e = Engine.open(smollm2_store)
    saved = PromptCache(tmp_path / "pc", "smollm2", max_bytes=2**30, max_age=3600)
    b = Batcher(e, slots=1, saved=saved)
    a_ids = e.tokenizer.encode(PROMPTS[3])
    a = b.generate(a_ids, {"max_tokens": 8, "temperature": 0}, session="a")
    b.run_until_idle()
    held = list(b.slots[0].tokens)  # A's prompt and answer
    other = b.generate(e.tokenizer.encode(PROMPTS[1]), {"max_tokens": 4, "temperature": 0})
    b.run_until_idle()
    saved.flush()
    assert a.finished and other.finished
    assert len(list((tmp_path / "pc").rglob("*.kv"))) == 1  # A's state, written before B cut the slot
    nxt = held + e.tokenizer.encode(" And then")
    again = b.generate(nxt, {"max_tokens": 8, "temperature": 0}, session="a")
    b.run_until_idle()
    final = list(again.events.queue)[-1]
    assert final.usage.cached_tokens == len(held)
    e.reset()
    assert _tokens(list(again.events.queue)) == _tokens(list(e.generate(nxt, {"max_tokens": 8, "temperature": 0})))
    saved.close()


def test_a_batched_sequence_reports_its_own_expert_hit_rate(moe_text_store):
    """Streamed experts (no lookahead, so the cache's contents follow the requests alone): one sequence in a
    batcher reports the hit rate it reports alone on a fresh engine; beside another sequence, each reports its
    own, not the engine's total over both."""

    def fresh():
        return Engine.open(moe_text_store, expert_slots=6, token_prefetch=0)

    ids = [fresh().tokenizer.encode(t) for t in PROMPTS[:2]]
    p = {"max_tokens": 10, "temperature": 0}
    alone = [list(fresh().generate(i, p))[-1].timings.expert_hit_rate for i in ids]
    e = fresh()
    b = Batcher(e, slots=1)
    one = b.generate(ids[0], p)
    b.run_until_idle()
    assert list(one.events.queue)[-1].timings.expert_hit_rate == alone[0]
    e = fresh()
    b = Batcher(e, slots=2)
    both = [b.generate(i, p) for i in ids]
    b.run_until_idle()
    rates = [list(s.events.queue)[-1].timings.expert_hit_rate for s in both]
    own = [[s.experts[k] + s.slot.step.expert_tally[k] for k in (0, 1)] for s in both]  # [hits, requests]
    assert rates == [h / r for h, r in own]
    # the two asked for more experts than the engine read or found: a step asks for their union once
    assert sum(r for _, r in own) > e.expert_stats["total"]["requests"]
