"""The generation API on the demo model: events, stop conditions, cancellation, context errors,
usage and timings; the streaming detokenizer on hard text; embeddings."""

import threading

import numpy as np
import pytest
import regex

from inference.engine import Engine
from inference.generate import ContextLengthError, Final, TextDelta, TokenEvent
from inference.store import Store
from inference.tokenizer import IncrementalDecoder, StoreTokenizer, TextStream

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def engine(smollm2_store):
    return Engine.open(smollm2_store)


def run(events):
    """(token ids, text deltas, final) of one generation."""
    ids, deltas, final = [], [], None
    for ev in events:
        if isinstance(ev, TokenEvent):
            ids.append(ev.id)
        elif isinstance(ev, TextDelta):
            deltas.append(ev.text)
        else:
            assert isinstance(ev, Final) and final is None
            final = ev
    assert final is not None
    return ids, deltas, final


@pytest.fixture(scope="module")
def greedy(engine):
    """The greedy answer to QUESTION: it ends with the end-of-turn token well within 24 tokens."""
    return run(engine.chat(QUESTION, GREEDY))


def test_a_chat_streams_text_that_adds_up_to_the_answer(engine, greedy):
    ids, deltas, final = greedy
    assert final.finish_reason == "stop"
    assert "Paris" in final.text
    assert "".join(deltas) == final.text == engine.tokenizer.decode(ids)
    assert final.usage.completion_tokens == len(ids) and final.usage.prompt_tokens > 10
    t = final.timings
    assert t.ttft > 0 and t.prefill_tps > 0 and t.decode_tps > 0 and t.expert_hit_rate is None


def test_greedy_is_deterministic_and_the_second_turn_reuses_the_cache(engine, greedy):
    ids, _, final = run(engine.chat(QUESTION, GREEDY))
    assert ids == greedy[0]
    assert final.usage.cached_tokens == final.usage.prompt_tokens - 1  # all but the row that yields logits
    follow = QUESTION + [{"role": "assistant", "content": final.text}, {"role": "user", "content": "And Spain?"}]
    _, _, second = run(engine.chat(follow, GREEDY))
    assert second.usage.cached_tokens >= final.usage.prompt_tokens


def test_the_prefill_reports_its_progress_chunk_by_chunk_to_the_callers_callback(smollm2_store):
    e = Engine.open(smollm2_store, chunk=16)
    ids = list(range(100, 150))  # 50 new tokens: chunks of 16, 16, 16, 2
    calls = []
    run(e.generate(ids, temperature=0, max_tokens=2, progress=lambda done, total: calls.append((done, total))))
    assert calls == [(0, 50), (16, 50), (32, 50), (48, 50), (50, 50)]
    calls.clear()
    run(e.generate(ids + [7, 8, 9], temperature=0, max_tokens=2, progress=lambda *a: calls.append(a)))
    assert calls[0][1] == calls[-1][0] == calls[-1][1] < 10  # the reused prefix is not counted
    before = list(calls)
    run(e.generate(ids, temperature=0, max_tokens=2))  # no callback, nothing called
    assert calls == before


def test_the_same_seed_gives_the_same_answer(engine):
    p = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 7, "max_tokens": 8}
    a = run(engine.chat(QUESTION, p))[0]
    assert run(engine.chat(QUESTION, p))[0] == a
    assert run(engine.chat(QUESTION, dict(p, seed=8)))[0] != a


def test_max_tokens_ends_with_length(engine):
    ids, _, final = run(engine.chat(QUESTION, temperature=0, max_tokens=3))
    assert final.finish_reason == "length" and len(ids) == 3 == final.usage.completion_tokens


def test_any_of_several_eos_ids_stops_without_emitting_it(engine, greedy):
    ids = greedy[0]
    extra = ids[3]  # pretend the fourth answer token ends the turn too
    tok = engine.tokenizer
    saved = tok.eos_ids
    tok.eos_ids = saved | {extra}
    try:
        got, _, final = run(engine.chat(QUESTION, GREEDY))
    finally:
        tok.eos_ids = saved
    assert final.finish_reason == "stop" and got == ids[:3]
    assert final.text == tok.decode(ids[:3])


def test_a_stop_string_across_tokens_ends_the_answer_and_is_never_shown(engine, greedy):
    ids, _, full = greedy
    pieces = [engine.tokenizer.decode(ids[: i + 1]) for i in range(len(ids))]
    cut = len(pieces[1]) - 2  # starts two characters before the end of the second token ...
    stop = full.text[cut : len(pieces[3]) + 2]  # ... and ends two characters into the fifth
    assert len(stop) > 4
    _, deltas, final = run(engine.chat(QUESTION, GREEDY, stop=["never matches", stop]))
    assert final.finish_reason == "stop"
    assert "".join(deltas) == final.text == full.text[:cut]
    # a stop string that only begins to match is held back, then released when the match fails
    _, deltas, final = run(engine.chat(QUESTION, GREEDY, stop=[full.text[-3:] + "!"]))
    assert "".join(deltas) == final.text == full.text


def test_cancel_from_another_thread_stops_within_one_token(engine):
    seen, after_cancel = 0, 0
    cancelled = False
    final = None
    for ev in engine.chat(QUESTION, {"temperature": 1.0, "seed": 1, "max_tokens": 200}):
        if isinstance(ev, TokenEvent):
            seen += 1
            after_cancel += cancelled
            if seen == 3:
                t = threading.Thread(target=engine.cancel)
                t.start()
                t.join()
                cancelled = True
        elif isinstance(ev, Final):
            final = ev
    assert final.finish_reason == "cancelled" and after_cancel <= 1 and final.usage.completion_tokens == seen


def test_a_cancel_token_in_the_params_stops_the_generation(engine):
    token = threading.Event()
    events = engine.chat(QUESTION, {"temperature": 0, "max_tokens": 20, "cancel": token})
    next(events)
    token.set()
    final = [ev for ev in events if isinstance(ev, Final)][0]
    assert final.finish_reason == "cancelled" and final.usage.completion_tokens <= 2


def test_a_prompt_that_does_not_fit_fails_before_any_compute(engine):
    held = list(engine.tokens)
    with pytest.raises(ContextLengthError) as e:
        engine.chat(QUESTION, max_tokens=engine.context_length)
    n = len(engine.tokenizer.encode_chat(QUESTION))
    assert f"{n} tokens" in str(e.value) and f"max_tokens is {engine.context_length}" in str(e.value)
    assert f"context of {engine.context_length}" in str(e.value)
    with pytest.raises(ValueError, match=r"top_p=2 is out of range; allowed: \(0, 1\]"):
        engine.chat(QUESTION, top_p=2)
    assert engine.tokens == held


def test_logprobs_come_with_each_token_when_asked(engine):
    evs = [ev for ev in engine.chat(QUESTION, temperature=0, max_tokens=4, logprobs=3) if isinstance(ev, TokenEvent)]
    assert len(evs) == 4
    for ev in evs:
        assert len(ev.top_logprobs) == 3 and ev.top_logprobs[0][0] == ev.id  # greedy: the chosen one is the best
        assert ev.logprob == pytest.approx(ev.top_logprobs[0][1]) and ev.logprob <= 0


def test_complete_continues_raw_text(engine):
    _, _, final = run(engine.complete("The capital of France is", temperature=0, max_tokens=4))
    assert "Paris" in final.text and final.finish_reason == "length"


def test_embeddings_are_unit_mean_pooled_states_and_leave_the_chat_alone(engine):
    held = list(engine.tokens)
    v = engine.embed(["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly tax filing deadlines"])
    assert v.shape == (3, engine.args.hidden_size) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]
    np.testing.assert_allclose(engine.embed("The cat sat on the mat.")[0], v[0], rtol=1e-5, atol=1e-6)
    assert engine.tokens == held


# --- the streaming detokenizer -------------------------------------------------------------------
HARD = "héllo 👩‍👩‍👧 wörld 中文 e\u0301 🇫🇷🇩🇪 ok"


def test_streamed_text_never_splits_a_character_or_a_grapheme(smollm2_store):
    tok = StoreTokenizer(Store(smollm2_store))
    ids = tok.encode(HARD, add_special_tokens=False)
    stream = TextStream(IncrementalDecoder(tok.tok))
    deltas = [stream.push(i) for i in ids] + [stream.finish()]
    assert "".join(deltas) == HARD
    bounds = {m.end() for m in regex.finditer(r"\X", HARD)}
    pos = 0
    for d in deltas:
        assert "\ufffd" not in d
        pos += len(d)
        assert pos in bounds or pos == 0
    assert len([d for d in deltas if d]) > 5  # it did stream


def test_a_stop_string_split_over_single_byte_tokens_is_caught(smollm2_store):
    tok = StoreTokenizer(Store(smollm2_store))
    ids = tok.encode("abc 中文 STOP here", add_special_tokens=False)
    stream = TextStream(IncrementalDecoder(tok.tok), ["文 ST"])
    out = "".join(stream.push(i) for i in ids) + stream.finish()
    assert out == "abc 中" and stream.stopped


# --- expert statistics on a streaming MoE store -----------------------------------------------------
def test_the_expert_hit_rate_of_a_streaming_engine_is_reported(moe_store):
    e = Engine.open(moe_store, expert_slots=4)
    try:
        _, _, final = run(e.generate(list(range(10, 40)), temperature=0, max_tokens=8))
    finally:
        e.close()
    assert final.usage.completion_tokens + (final.finish_reason == "stop") >= 1
    assert 0.0 <= final.timings.expert_hit_rate <= 1.0


# --- the repetition guard ---------------------------------------------------------------------------------
def loop_stops_at(tokens) -> int | None:
    """How many tokens a `RepetitionGuard` takes of `tokens` before it calls a loop (None: never)."""
    from inference.generate import RepetitionGuard

    guard = RepetitionGuard()
    return next((i + 1 for i, t in enumerate(tokens) if guard.push(int(t))), None)


def test_the_guard_stops_a_loop_once_it_covers_128_tokens_and_three_periods():
    rng = np.random.default_rng(0)
    lead = list(rng.integers(1000, 2000, 37))  # the answer before it loops
    for period, span in [(1, 128), (2, 128), (7, 128), (43, 129), (50, 150), (64, 192)]:
        block = list(range(3000, 3000 + period))  # distinct tokens: no shorter period
        assert loop_stops_at(lead + block * 400) == len(lead) + span, period


def test_the_guard_lets_prose_two_copies_and_loops_longer_than_64_pass():
    rng = np.random.default_rng(1)
    assert loop_stops_at(rng.integers(0, 50, 5000)) is None  # a small vocabulary repeats, never for long
    block = list(range(100, 164))
    assert loop_stops_at(block * 2 + list(range(200, 400))) is None  # a repeated line, a chorus
    assert loop_stops_at(list(range(500, 600)) * 10) is None  # a loop of 100 tokens: max_tokens ends those


def test_a_looping_answer_stops_with_finish_reason_repetition_when_guarded(engine):
    prompt = "The cat sat on the mat. " * 12  # the demo model goes on saying it
    ids, _, final = run(engine.complete(prompt, {"temperature": 0, "max_tokens": 300, "repetition_guard": True}))
    assert final.finish_reason == "repetition"
    assert 128 <= len(ids) < 140 and final.text.count("The cat sat on the mat.") >= 10
    ids, _, final = run(engine.complete(prompt, {"temperature": 0, "max_tokens": 160}))  # off by default
    assert final.finish_reason == "length" and len(ids) == 160
