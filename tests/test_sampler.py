"""The sampler: each step of the chain agrees with transformers' logits processors, draws follow the
distribution, seeds reproduce, and every out-of-range parameter is named in its error."""

import dataclasses

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inference.sampler import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    Sampler,
    SamplingParams,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    top_logprobs,
)

V = 1000


def params(**kw) -> SamplingParams:
    return SamplingParams(**kw).resolve({})


@pytest.fixture
def logits():
    return np.random.default_rng(0).normal(0, 3, V).astype(np.float32)


def survivors_hf(warper, logits) -> set:
    out = warper(torch.zeros(1, 1, dtype=torch.long), torch.tensor(logits)[None].clone())[0].numpy()
    return set(np.flatnonzero(np.isfinite(out)))


def chain(logits, p, steps):
    ids, x = np.arange(len(logits)), logits
    for step in steps:
        ids, x = step(ids, x, p)
    return ids, x


def test_top_k_top_p_and_min_p_keep_the_same_tokens_as_transformers(logits):
    for k in (1, 5, 64):
        ids, _ = chain(logits, params(top_k=k), [apply_top_k])
        assert set(ids) == survivors_hf(TopKLogitsWarper(k), logits)
    for top_p in (0.1, 0.5, 0.9, 0.99):
        ids, _ = chain(logits, params(top_p=top_p, top_k=0), [apply_top_p])
        assert set(ids) == survivors_hf(TopPLogitsWarper(top_p), logits)
    for min_p in (0.05, 0.3, 0.9):
        ids, _ = chain(logits, params(min_p=min_p), [apply_min_p])
        assert set(ids) == survivors_hf(MinPLogitsWarper(min_p), logits)


@pytest.mark.parametrize("scale", [8.0, 0.5])  # peaked: the nucleus is in the best 1024; flat: it is not
def test_top_p_on_a_gemma_sized_vocabulary_matches_transformers(scale):
    logits = np.random.default_rng(1).normal(0, scale, 262144).astype(np.float32)
    ids, _ = chain(logits, params(top_p=0.9, top_k=0), [apply_top_p])
    assert set(ids) == survivors_hf(TopPLogitsWarper(0.9), logits)


def test_temperature_and_repetition_penalty_match_transformers(logits):
    _, x = chain(logits, params(temperature=0.7), [apply_temperature])
    want = TemperatureLogitsWarper(0.7)(None, torch.tensor(logits)[None].clone())[0].numpy()
    np.testing.assert_allclose(x, want, rtol=1e-6)
    history = np.array([3, 3, 17, 999, 0])
    _, x = apply_penalties(np.arange(V), logits, history, params(repetition_penalty=1.3))
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor(history)[None], torch.tensor(logits)[None].clone())
    np.testing.assert_allclose(x, want[0].numpy(), rtol=1e-6)


def test_presence_and_frequency_penalties_subtract_per_seen_token(logits):
    _, x = apply_penalties(
        np.arange(V), logits, np.array([5, 5, 5, 9]), params(presence_penalty=0.5, frequency_penalty=0.25)
    )
    assert x[5] == pytest.approx(logits[5] - 0.5 - 0.75)
    assert x[9] == pytest.approx(logits[9] - 0.5 - 0.25)
    untouched = np.setdiff1d(np.arange(V), [5, 9])
    np.testing.assert_array_equal(x[untouched], logits[untouched])


def test_temperature_zero_is_greedy_and_top_k_one_agrees(logits):
    assert Sampler(params(temperature=0))(logits) == int(np.argmax(logits))
    assert Sampler(params(temperature=1.5, top_k=1, seed=3))(logits) == int(np.argmax(logits))


def test_greedy_honours_the_repetition_penalty():
    x = np.array([0.0, 5.0, 4.9], np.float32)
    assert Sampler(params(temperature=0, repetition_penalty=1.5))(x, [1]) == 2


def test_draws_follow_the_tempered_distribution():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    s = Sampler(params(temperature=1.0, top_k=0, top_p=1.0, seed=0))
    counts = np.bincount([s(x) for _ in range(4000)], minlength=4) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    s = Sampler(params(temperature=1.0, top_k=0, top_p=0.8, seed=0))
    assert set(s(x) for _ in range(500)) == {0, 1}  # 0.5 + 0.3 reaches 0.8: the nucleus is two tokens
    s = Sampler(params(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=0))
    assert set(s(x) for _ in range(500)) == {0, 1}  # 0.3 ≥ 0.5 × 0.5, 0.15 is not


def test_the_same_seed_draws_the_same_tokens(logits):
    a = Sampler(params(temperature=1.0, seed=42))
    b = Sampler(params(temperature=1.0, seed=42))
    c = Sampler(params(temperature=1.0, seed=43))
    xs = [a(logits) for _ in range(50)]
    assert xs == [b(logits) for _ in range(50)]
    assert xs != [c(logits) for _ in range(50)]


def test_logprobs_are_the_raw_log_softmax(logits):
    lp, top = top_logprobs(logits, 7, 5)
    ref = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()
    assert lp == pytest.approx(ref[7])
    assert [i for i, _ in top] == list(np.argsort(-ref)[:5])
    assert [v for _, v in top] == pytest.approx(sorted(ref, reverse=True)[:5])


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("temperature", -0.1, "[0, 2]"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -1, "≥ 0"),
        ("top_k", 2.5, "integer"),
        ("min_p", 1.1, "[0, 1]"),
        ("repetition_penalty", 0.0, "(0, 10]"),
        ("presence_penalty", 3.0, "[-2, 2]"),
        ("frequency_penalty", -2.5, "[-2, 2]"),
        ("max_tokens", 0, "≥ 1"),
        ("seed", -5, "≥ 0"),
        ("logprobs", 21, "[0, 20]"),
        ("temperature", float("nan"), "[0, 2]"),
        ("temperature", "hot", "[0, 2]"),
    ],
)
def test_out_of_range_values_name_the_parameter_and_its_range(field, value, allowed):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert field in str(e.value) and allowed in str(e.value)


def test_unknown_parameters_are_refused():
    with pytest.raises(ValueError, match="unknown generation parameter 'temprature'"):
        SamplingParams.from_any({"temprature": 0.5})


def test_defaults_come_from_the_generation_config_else_ours():
    p = SamplingParams().resolve({})
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (
        DEFAULT_TEMPERATURE,
        DEFAULT_TOP_K,
        DEFAULT_TOP_P,
        0.0,
        1.0,
    )
    p = SamplingParams(top_k=5).resolve({"temperature": 1.0, "top_k": 40, "top_p": 0.9})
    assert (p.temperature, p.top_k, p.top_p) == (1.0, 5, 0.9)
    assert SamplingParams().resolve({"do_sample": False, "temperature": 0.6}).temperature == 0.0
    assert SamplingParams(temperature=0.3).resolve({"do_sample": False}).temperature == 0.3


def test_a_masked_row_samples_only_its_allowed_tokens_as_the_same_row_without_them():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=5000).astype(np.float32)
    allowed = rng.choice(5000, size=40, replace=False)
    masked = np.full_like(logits, -np.inf)
    masked[allowed] = logits[allowed]
    p = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.0, repetition_penalty=1.0, seed=7)
    got = [Sampler(dataclasses.replace(p, seed=s))(masked, masked=True) for s in range(30)]
    assert set(got) <= set(allowed.tolist())
    sub = Sampler(p)(logits[np.sort(allowed)])  # the same candidates as a row of their own
    assert Sampler(p)(masked, masked=True) == int(np.sort(allowed)[sub])
