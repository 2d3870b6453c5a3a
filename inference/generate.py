"""Generation: `engine.chat`, `engine.complete`, `engine.generate` yield events; `engine.embed` pools states.

The events, in order: for each new token a `TokenEvent` (its id, and log-probabilities when asked)
followed by a `TextDelta` when that token completes text that is safe to show (see
`tokenizer.TextStream`); last, one `Final` with the finish reason, token counts and timings.

    for ev in engine.chat([{"role": "user", "content": "Hi"}], {"temperature": 0, "max_tokens": 64}):
        if isinstance(ev, TextDelta):
            print(ev.text, end="", flush=True)

Parameters are checked and the prompt is tokenized when `chat`/`complete` is called, so a bad value or
a prompt that does not fit the context raises there, before any compute. The engine holds one
conversation's KV state and runs one generation at a time; the next call reuses the longest common
prefix of its prompt with what the cache holds (multi-turn chat costs only the new turn).
`engine.cancel()` may be called from any thread: the running generation stops before its next token.
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Union

import numpy as np

from . import kernels
from .errors import RkmojoError
from .sampler import Sampler, SamplingParams, top_logprobs
from .tokenizer import StoreTokenizer, TextStream


# --- events --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextDelta:
    """New answer text (whole characters and grapheme clusters; stop strings never appear)."""

    text: str


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `logprob`/`top_logprobs` ((id, log-probability) pairs, best first) when asked."""

    id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # the whole prompt
    cached_tokens: int  # of which reused from the KV cache (not recomputed)
    completion_tokens: int  # generated tokens, the end-of-sequence token not counted


@dataclass(frozen=True)
class Timings:
    ttft: float  # seconds from the call to the first sampled token (prefill included)
    prefill_tps: float  # prompt tokens computed per second (cached ones excluded)
    decode_tps: float  # generated tokens per second after the first
    expert_hit_rate: float | None  # expert cache hits / requests during this generation; None: no streaming
    total: float = 0.0  # seconds for the whole generation


@dataclass(frozen=True)
class Final:
    """The end of a generation: why it ended ("stop", "length" or "cancelled"), counts, timings, full text."""

    finish_reason: str
    usage: Usage
    timings: Timings
    text: str = ""


Event = Union[TextDelta, TokenEvent, Final]


class ContextLengthError(RkmojoError, ValueError):
    """The prompt plus the tokens asked for do not fit the context."""


class EngineBusyError(RkmojoError):
    """A generation is already running on this engine."""


# --- the mixin -----------------------------------------------------------------------------------
@dataclass
class _GenerationState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # cancel events of prepared or running generations (weak: a generator dropped unstarted leaves nothing)
    live: weakref.WeakSet = field(default_factory=weakref.WeakSet)


class GenerationMixin:
    """Chat, completion and embeddings over `self.store`, `self.model`, `self.prefill`, `self.forward`."""

    @cached_property
    def tokenizer(self) -> StoreTokenizer:
        return StoreTokenizer(self.store)

    @cached_property
    def _generation(self) -> _GenerationState:
        return _GenerationState()

    @property
    def context_length(self) -> int:
        """Tokens a sequence may hold: the model's maximum, capped by the configured context."""
        limit = int(getattr(self.model.args, "max_position_embeddings", 0) or 0)
        configured = getattr(getattr(self, "cfg", None), "context", None)
        if configured:
            limit = min(limit, int(configured)) if limit else int(configured)
        return limit or 4096

    def chat(self, messages: list[dict], params: SamplingParams | dict | None = None, **overrides) -> Iterator[Event]:
        """Answer a conversation with the model's chat template.

        Args:
            messages: [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...].
            params: a `SamplingParams` or a dict of its fields; keyword overrides win.
        Returns:
            An iterator of `TokenEvent`, `TextDelta`, and one final `Final`.
        Raises:
            ValueError: a parameter out of range (naming it and the range).
            ChatTemplateError: the template refused the messages.
            ContextLengthError: prompt + max_tokens exceed the context (stating both numbers).
        """
        p = self._params(params, overrides)
        return self._start(self.tokenizer.encode_chat(messages, tools=p.tools, **p.template), p)

    def complete(self, prompt: str, params: SamplingParams | dict | None = None, **overrides) -> Iterator[Event]:
        """Continue raw text (no chat template; BOS added when the tokenizer adds it). As `chat` otherwise."""
        p = self._params(params, overrides)
        return self._start(self.tokenizer.encode(prompt), p)

    def generate(self, ids: list[int], params: SamplingParams | dict | None = None, **overrides) -> Iterator[Event]:
        """Continue the token ids `ids` (no template, nothing added). As `chat` otherwise."""
        return self._start([int(i) for i in ids], self._params(params, overrides))

    def cancel(self) -> None:
        """Stop the running generation (and any prepared one) before its next token; safe from any thread."""
        for ev in list(self._generation.live):
            ev.set()

    def embed(self, texts: str | list[str]) -> np.ndarray:
        """Embeddings: the mean over tokens of the final-normed hidden states, L2-normalised.

        Each text is tokenized as by `complete` and run through a fresh KV cache, so the chat state is
        untouched. Returns float32 [len(texts), hidden_size].

        Raises:
            ValueError: an empty text.
            ContextLengthError: a text longer than the context.
            EngineBusyError: a generation is running.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        encoded = [self.tokenizer.encode(t) for t in texts]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"texts[{i}] is empty (no tokens)")
            if len(ids) > self.context_length:
                raise ContextLengthError(
                    f"texts[{i}] has {len(ids)} tokens and the context holds {self.context_length}; shorten it"
                )
        with self._exclusive():
            out = []
            for ids in encoded:
                with kernels.threads(self.cfg.threads):
                    h = self.model.hidden(np.array(ids), self.model.new_cache())  # [T, H]
                v = h.astype(np.float32).mean(axis=0)
                out.append(v / max(float(np.linalg.norm(v)), 1e-12))
        return np.stack(out).astype(np.float32)

    # --- internals -----------------------------------------------------------------------------
    def _params(self, params, overrides) -> SamplingParams:
        return SamplingParams.from_any(params, **overrides).resolve(self.store.manifest.get("generation"))

    def _start(self, ids: list[int], p: SamplingParams) -> Iterator[Event]:
        """Check the request against the context and the engine's state; the generator that runs it."""
        if not ids:
            raise ValueError("the prompt is empty (no tokens); give some text")
        ctx = self.context_length
        if p.max_tokens is None:
            if len(ids) >= ctx:
                raise ContextLengthError(
                    f"the prompt has {len(ids)} tokens and the context holds {ctx}; shorten the prompt"
                )
            max_tokens = ctx - len(ids)
        else:
            max_tokens = p.max_tokens
            if len(ids) + max_tokens > ctx:
                raise ContextLengthError(
                    f"the prompt has {len(ids)} tokens and max_tokens is {max_tokens}: {len(ids) + max_tokens} "
                    f"exceeds the context of {ctx} tokens; shorten the prompt or lower max_tokens"
                )
        if self._generation.lock.locked():
            raise EngineBusyError("the engine is busy with another generation; wait for it or cancel() it")
        cancel = threading.Event()
        self._generation.live.add(cancel)
        return self._run(ids, p, max_tokens, cancel)

    @contextlib.contextmanager
    def _exclusive(self):
        lock = self._generation.lock
        if not lock.acquire(blocking=False):
            raise EngineBusyError("the engine is busy with another generation; wait for it or cancel() it")
        try:
            yield
        finally:
            lock.release()

    def _run(self, ids: list[int], p: SamplingParams, max_tokens: int, cancel: threading.Event) -> Iterator[Event]:
        state = self._generation
        try:
            with self._exclusive():
                yield from self._decode(ids, p, max_tokens, lambda: cancel.is_set() or _is_set(p.cancel))
        finally:
            state.live.discard(cancel)

    def _decode(self, ids, p: SamplingParams, max_tokens: int, cancelled) -> Iterator[Event]:
        tok = self.tokenizer
        sampler = Sampler(p)
        stream: TextStream = tok.stream(p.stop)
        before = _expert_counts(getattr(self, "expert_stats", None))
        t0 = time.perf_counter()
        generated: list[int] = []
        pieces: list[str] = []
        reused, ttft, t_first, reason = 0, 0.0, None, "length"
        t_prefill = t0
        if cancelled():
            reason = "cancelled"
        else:
            logits, reused = self.prefill(ids)
            t_prefill = time.perf_counter()
            while True:
                if cancelled():
                    reason = "cancelled"
                    break
                nxt = sampler(logits, generated)
                if t_first is None:
                    t_first = time.perf_counter()
                    ttft = t_first - t0
                if nxt in tok.eos_ids:
                    reason = "stop"
                    break
                generated.append(nxt)
                if p.logprobs is not None:
                    lp, top = top_logprobs(logits, nxt, p.logprobs)
                    yield TokenEvent(nxt, lp, tuple(top))
                else:
                    yield TokenEvent(nxt)
                text = stream.push(nxt)
                if text:
                    pieces.append(text)
                    yield TextDelta(text)
                if stream.stopped:
                    reason = "stop"
                    break
                if len(generated) >= max_tokens:
                    reason = "length"
                    break
                logits = self.forward([nxt])[-1]
        tail = stream.finish()
        if tail:
            pieces.append(tail)
            yield TextDelta(tail)
        t_end = time.perf_counter()
        computed = len(ids) - reused
        after = _expert_counts(getattr(self, "expert_stats", None))
        hit_rate = None
        if before is not None and after is not None:
            hits, requests = after[0] - before[0], (after[0] + after[1]) - (before[0] + before[1])
            hit_rate = hits / requests if requests > 0 else None
        decode_time = t_end - t_first if t_first is not None else 0.0
        timings = Timings(
            ttft=ttft,
            prefill_tps=computed / (t_prefill - t0) if t_prefill > t0 else 0.0,
            decode_tps=(len(generated) - 1) / decode_time if len(generated) > 1 and decode_time > 0 else 0.0,
            expert_hit_rate=hit_rate,
            total=t_end - t0,
        )
        yield Final(reason, Usage(len(ids), reused, len(generated)), timings, "".join(pieces))


def _is_set(token) -> bool:
    """A cancellation token: None, a threading.Event-like object, or a callable returning bool."""
    if token is None:
        return False
    if hasattr(token, "is_set"):
        return bool(token.is_set())
    return bool(token())


def _expert_counts(stats) -> tuple[int, int] | None:
    """(hits, misses) from the engine's expert statistics ({"total": {"hits", "misses"}}), or None."""
    if callable(stats):
        stats = stats()
    if not stats:
        return None
    total = stats.get("total", stats) if isinstance(stats, dict) else stats
    get = total.get if isinstance(total, dict) else (lambda k, d=None: getattr(total, k, d))
    hits, misses = get("hits"), get("misses")
    if hits is None or misses is None:
        return None
    return int(hits), int(misses)
