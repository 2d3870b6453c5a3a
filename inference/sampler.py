"""Sampling parameters and the sampler: a chain of small functions over one row of logits.

Order (transformers' and mlx-lm's): penalties → temperature → top_k → top_p → min_p → draw.
Temperature 0 is greedy. Each step narrows a candidate set `(ids, logits)`, so after top_k the rest
works on k entries instead of the whole vocabulary (262,144 for Gemma 4).

Penalties look at the tokens generated so far (not the prompt, whose template tokens would otherwise be
penalised): repetition divides positive logits and multiplies negative ones by the factor
(transformers' rule); presence subtracts a constant from every token seen; frequency subtracts
its count times the factor (OpenAI's rules).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import options
from .options import option

# defaults when neither the request nor the store's generation config says otherwise
DEFAULT_TEMPERATURE = 0.2
DEFAULT_TOP_K = 64
DEFAULT_TOP_P = 0.95
# generation_config.json key → our field, for the defaults a model ships with
GENERATION_KEYS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}


@dataclass
class SamplingParams:
    """What to generate and how. None means "the model's default" (see `resolve`).

    Attributes:
        max_tokens: at most this many new tokens; None: up to the context length.
        temperature: 0 is greedy; in [0, 2].
        top_k: keep the k most likely tokens; 0 disables.
        top_p: keep the smallest set whose probability reaches p; in (0, 1], 1 disables.
        min_p: drop tokens less likely than min_p × the most likely one; in [0, 1], 0 disables.
        repetition_penalty: > 0, 1 disables.
        presence_penalty, frequency_penalty: in [-2, 2], 0 disables.
        seed: same seed, same prompt, same parameters → same output.
        stop: strings that end the answer (not included in it), matched across token boundaries.
        logprobs: None for none; n in [0, 20]: each token's log-probability and the n most likely
            alternatives' (under the model's raw distribution, before penalties and temperature).
        cancel: a `threading.Event` (or anything with `is_set()`, or a callable returning bool)
            checked before every token; when set the generation ends with finish_reason "cancelled".
        template: extra chat template variables (`{"enable_thinking": False}`, …).
        tools: function tools ({"type": "function", "function": {"name", "description", "parameters"}}).
        tool_choice: "none", "auto" (default), "required", or {"type": "function", "function": {"name": N}}.
        parallel_tool_calls: the model may make several calls in one answer.
        format: a JSON schema the answer must match (constrained decoding; `inference.structured`).
        think: a thinking model reasons before it answers; None: the template's default.
        logit_bias: token id → a number in [-100, 100] added to its logit before sampling.
        repetition_guard: stop the answer, finish_reason "repetition", when it ends in a loop (see
            `inference.generate.RepetitionGuard`); None or False: off (the chat page turns it on).
    """

    max_tokens: int | None = option(help="answer length limit (default: the context)", ge=1)
    temperature: float | None = option(help="0 is greedy", ge=0, le=2)
    top_k: int | None = option(help="keep the k most likely tokens; 0 disables", ge=0)
    top_p: float | None = option(help="keep the smallest set whose probability reaches p; 1 disables", gt=0, le=1)
    min_p: float | None = option(help="drop tokens less likely than min_p × the most likely; 0 disables", ge=0, le=1)
    repetition_penalty: float | None = option(
        help="divide the logits of tokens already generated; 1 disables", gt=0, le=10
    )
    presence_penalty: float = option(0.0, help="subtract from every token already generated; 0 disables", ge=-2, le=2)
    frequency_penalty: float = option(0.0, help="subtract its count times this from every token generated", ge=-2, le=2)
    seed: int | None = option(help="same seed, prompt and parameters: same output", ge=0)
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = option(help="log-probabilities of each token and this many alternatives", ge=0, le=20)
    repetition_guard: bool | None = option(
        help="stop an answer that ends in a loop: a run of ≤ 64 tokens repeated over the last 128 tokens or more "
        "(3 times at least); finish reason repetition"
    )
    cancel: Any = None
    template: dict = field(default_factory=dict)
    tools: list | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    format: dict | None = None
    think: bool | None = None
    logit_bias: dict | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        options.check(self)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise options.OptionError("stop", s, "non-empty strings")

    @classmethod
    def from_any(cls, params: "SamplingParams | dict | None" = None, **overrides) -> "SamplingParams":
        """From a `SamplingParams`, a dict of its fields, or None; keyword overrides win.

        Raises:
            ValueError: an unknown field, or a value out of its range (naming both).
        """
        if isinstance(params, SamplingParams):
            base = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
        else:
            base = dict(params or {})
        base.update(overrides)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(base) - names)
        if unknown:
            raise ValueError(f"unknown generation parameter {unknown[0]!r}; known: {', '.join(sorted(names))}")
        return cls(**base)

    def resolve(self, generation_config: dict | None) -> "SamplingParams":
        """A copy whose unset sampling fields come from the model's generation config, else our defaults."""
        gen = generation_config or {}
        fallback = {
            "temperature": DEFAULT_TEMPERATURE,
            "top_k": DEFAULT_TOP_K,
            "top_p": DEFAULT_TOP_P,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
        }
        values = {}
        for key, name in GENERATION_KEYS.items():
            if getattr(self, name) is None:
                v = gen.get(key)
                values[name] = fallback[name] if v is None else v
        if self.temperature is None and gen.get("do_sample") is False:  # the model asks for greedy decoding
            values["temperature"] = 0.0
        return dataclasses.replace(self, **values) if values else self


# --- the chain ---------------------------------------------------------------------------------
# Each step takes and returns (ids, logits) of the remaining candidates, float32 logits.


def apply_penalties(ids: np.ndarray, logits: np.ndarray, history: np.ndarray, p: SamplingParams):
    """Repetition, presence and frequency penalties for the `history` token ids (the vocabulary, unsorted)."""
    if not len(history) or (p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty):
        return ids, logits
    seen, counts = np.unique(history, return_counts=True)
    logits = logits.copy()
    x = logits[seen]
    if p.repetition_penalty != 1.0:
        x = np.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
    x = x - p.presence_penalty - p.frequency_penalty * counts
    logits[seen] = x
    return ids, logits


def apply_temperature(ids, logits, p: SamplingParams):
    return ids, logits / np.float32(p.temperature)


def apply_top_k(ids, logits, p: SamplingParams):
    if not p.top_k or p.top_k >= len(logits):
        return ids, logits
    keep = np.argpartition(logits, len(logits) - p.top_k)[len(logits) - p.top_k :]
    return ids[keep], logits[keep]


TOP_P_FIRST_TRY = 1024  # candidates sorted before falling back to the whole row


def apply_top_p(ids, logits, p: SamplingParams):
    if p.top_p >= 1.0:
        return ids, logits
    x = logits.astype(np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    cand = np.arange(len(x))
    if len(x) > 4 * TOP_P_FIRST_TRY:  # the nucleus is usually small: sort the best 1024 only, if they hold top_p
        best = np.argpartition(x, len(x) - TOP_P_FIRST_TRY)[len(x) - TOP_P_FIRST_TRY :]
        if np.exp(x[best] - lse).sum() >= p.top_p:
            cand = best
    order = cand[np.argsort(-x[cand], kind="stable")]
    probs = np.exp(x[order] - lse)
    # keep every token whose preceding mass is still below top_p (always the first one)
    keep = order[: max(1, int(np.searchsorted(np.cumsum(probs) - probs, p.top_p, side="left")))]
    return ids[keep], logits[keep]


def apply_min_p(ids, logits, p: SamplingParams):
    if not p.min_p:
        return ids, logits
    # p_i ≥ min_p · p_max  ⇔  logit_i ≥ logit_max + log(min_p)
    keep = logits >= logits.max() + np.float32(math.log(p.min_p))
    return ids[keep], logits[keep]


CHAIN = (apply_temperature, apply_top_k, apply_top_p, apply_min_p)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class Sampler:
    """Draws the next token from one row of logits under `params` (already resolved).

    Args:
        params: a resolved `SamplingParams` (no None sampling fields).
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: list[int] | np.ndarray = (), *, masked: bool = False) -> int:
        """The next token id for `logits` [vocab]; `history`: the tokens generated so far.

        `masked`: some logits are -inf (a grammar's mask): those tokens leave the candidates first, as
        numpy's partition slows down a hundredfold on a row of many equal values.
        """
        p = self.params
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        ids = np.arange(len(logits))
        ids, logits = apply_penalties(ids, logits, np.asarray(history, dtype=np.int64), p)
        if p.temperature == 0:
            return int(ids[int(np.argmax(logits))])
        if masked:
            keep = np.flatnonzero(logits != -np.inf)
            ids, logits = ids[keep], logits[keep]
        for step in CHAIN:
            ids, logits = step(ids, logits, p)
        return int(ids[self.rng.choice(len(ids), p=_softmax(logits.astype(np.float64)))])


def top_logprobs(logits: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """(log-probability of `token`, the n most likely (id, log-probability)) under the model's raw distribution."""
    lp = log_softmax(np.asarray(logits).reshape(-1))
    top: list[tuple[int, float]] = []
    if n:
        best = np.argpartition(-lp, n - 1)[:n]
        best = best[np.argsort(-lp[best], kind="stable")]
        top = [(int(i), float(lp[i])) for i in best]
    return float(lp[token]), top
