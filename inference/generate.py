"""Generation's events and token loop. `Engine.chat`, `Engine.complete` and `Engine.generate` (engine.py)
check the request and return `decode(engine, …)`, the generator below; `Engine.embed` pools states.

The events, in order: for each new token a `TokenEvent` (its id, and log-probabilities when asked)
followed by a `TextDelta` when that token completes text that is safe to show (see
`tokenizer.TextStream`); last, one `Final` with the finish reason (stop, length, cancelled, tool_calls, or
repetition when `repetition_guard` found a loop), token counts and timings.

    for ev in engine.chat([{"role": "user", "content": "Hi"}], {"temperature": 0, "max_tokens": 64}):
        if isinstance(ev, TextDelta):
            print(ev.text, end="", flush=True)

Parameters are checked and the prompt is tokenized when `chat`/`complete` is called, so a bad value or
a prompt that does not fit the context raises there, before any compute. The engine holds one
conversation's KV state and runs one generation at a time; the next call reuses the longest common
prefix of its prompt with what the cache holds (multi-turn chat costs only the new turn).
`engine.cancel()` may be called from any thread: the running generation stops before its next token.
`progress=` on `chat`/`complete`/`generate` is called as `progress(done, total)` during the prefill, in the
generating thread (a server turns it into progress events for its clients).
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from .errors import RkmojoError
from .sampler import Sampler, SamplingParams, top_logprobs
from .tokenizer import TextStream


from .events import Event, Final, Timings, TextDelta, TokenEvent, ToolCall, ToolCallDelta, Usage  # noqa: F401 (re-exported)


class ContextLengthError(RkmojoError, ValueError):
    """The prompt plus the tokens asked for do not fit the context."""


class EngineBusyError(RkmojoError):
    """A generation is already running on this engine."""


# --- the repetition guard --------------------------------------------------------------------------
LOOP_PERIOD = 64  # the longest loop, in tokens, the guard looks for
LOOP_SPAN = 128  # a loop stops the answer when its repeats cover this many tokens, and 3 periods at least


class RepetitionGuard:
    """Whether the tokens generated so far end in a loop: for some period p ≤ `period`, each of the last
    max(`span`, 3p) tokens equals the token p before it (so they are the same p tokens, over and over).

    Why these bounds: 128 tokens of one token (p = 1: "=====", blank lines) or of a short phrase is no
    prose; 3 back-to-back copies of a block of up to 64 tokens (a sentence, a line of code) is a model
    stuck, where 2 may be a chorus or a repeated line. Longer loops (whole paragraphs) are not caught; the
    answer's max_tokens ends those. Stopping costs at most `span` tokens or 3 periods past the loop's start.

    Per period p it keeps the run length of the latest tokens that equal the token p before them; a new token
    updates every period at once against the last `period` tokens: the same work per token (a few vector
    operations of 64) however long the answer is.
    """

    def __init__(self, period: int = LOOP_PERIOD, span: int = LOOP_SPAN):
        p = np.arange(1, period + 1)
        self.need = np.maximum(span, 3 * p) - p  # run length at which period p's repeats cover the span
        self.recent = np.full(period, -1, np.int64)  # recent[j]: the token j + 1 places back (-1: none yet)
        self.run = np.zeros(period, np.int64)

    def push(self, token: int) -> bool:
        """Add the next generated token; True when the answer now ends in a loop."""
        self.run = np.where(self.recent == token, self.run + 1, 0)
        self.recent[1:] = self.recent[:-1]
        self.recent[0] = token
        return bool((self.run >= self.need).any())


# --- the token loop: plain functions over an engine (Engine.chat/complete/generate call them) ----------
def max_new_tokens(n_prompt: int, p: SamplingParams, context: int) -> int:
    """How many tokens a generation may add: `p.max_tokens`, or what is left of the context.

    Raises:
        ContextLengthError: the prompt (plus max_tokens) does not fit the context (stating both numbers).
    """
    if p.max_tokens is None:
        if n_prompt >= context:
            raise ContextLengthError(
                f"the prompt has {n_prompt} tokens and the context holds {context}; shorten the prompt"
            )
        return context - n_prompt
    if n_prompt + p.max_tokens > context:
        raise ContextLengthError(
            f"the prompt has {n_prompt} tokens and max_tokens is {p.max_tokens}: {n_prompt + p.max_tokens} "
            f"exceeds the context of {context} tokens; shorten the prompt or lower max_tokens"
        )
    return p.max_tokens


class TokenLoop:
    """One generation's state between model calls: the sampler, the stop conditions, the events and the
    timings. `decode` (one sequence on the engine's own cache) and `inference.batch` (several sequences
    stepped together) both drive it, so a token is chosen and reported the same way in either:

        loop = TokenLoop(engine, ids, p, max_tokens, cancelled, plan=plan)
        logits = <the prompt's last logits>; loop.prefilled(reused)
        while (nxt := loop.token(logits, events)) is not None:
            logits = <the logits after nxt>
        events += loop.finish()
    """

    def __init__(self, engine, ids: list[int], p: SamplingParams, max_tokens: int, cancelled, *, plan=None):
        self.ids, self.p, self.max_tokens, self.cancelled, self.plan = ids, p, max_tokens, cancelled, plan
        self.engine = engine
        self.tok = engine.tokenizer
        self.sampler = Sampler(p)
        self.guard = RepetitionGuard() if p.repetition_guard else None
        self.stream: TextStream = self.tok.stream(p.stop, skip_special_tokens=not (plan and plan.keep_special))
        self.before = _expert_counts(engine.expert_stats)
        self.t0 = time.perf_counter()
        self.t_prefill = self.t0
        self.t_first: float | None = None
        self.ttft = 0.0
        self.generated: list[int] = []
        self.pieces: list[str] = []
        self.reused = 0
        self.reason = "length"
        # (hits, requests) of this generation's own expert requests, where the engine's totals also count
        # others' (a batcher's sequences: `inference.batch`); None: the engine's totals over the generation
        self.expert_requests: tuple[int, int] | None = None

    def prefilled(self, reused: int) -> None:
        """The prompt is in the cache (`reused` of its tokens were there already)."""
        self.reused = reused
        self.t_prefill = time.perf_counter()

    def token(self, logits: np.ndarray, events: list) -> int | None:
        """Choose the next token from `logits` (the model's row after the last token), appending its events
        to `events`; the token to feed the model next, or None when the answer has ended (`reason`)."""
        if self.cancelled():
            self.reason = "cancelled"
            return None
        plan, p = self.plan, self.p
        raw = logits
        if plan is not None and plan.masking:
            logits = np.array(logits, dtype=np.float32)  # the model's own row stays as it is for logprobs
            plan.mask(logits)
        nxt = self.sampler(logits, self.generated, masked=plan is not None and plan.masking)
        if self.t_first is None:
            self.t_first = time.perf_counter()
            self.ttft = self.t_first - self.t0
        if nxt in self.tok.eos_ids or (plan is not None and plan.ends(nxt)):
            self.reason = "stop"
            return None
        self.generated.append(nxt)
        end = plan.accept(nxt) if plan is not None else False
        if p.logprobs is not None:
            lp, top = top_logprobs(raw, nxt, p.logprobs)
            events.append(TokenEvent(nxt, lp, tuple(top)))
        else:
            events.append(TokenEvent(nxt))
        text = self.stream.push(nxt)
        if text:
            events.extend(_text(text, plan, self.pieces))
        if self.stream.stopped or end:
            self.reason = "stop"
            return None
        if self.guard is not None and self.guard.push(nxt):
            self.reason = "repetition"
            return None
        if len(self.generated) >= self.max_tokens:
            self.reason = "length"
            return None
        return nxt

    def finish(self) -> list[Event]:
        """The last text and the `Final` event."""
        plan, events = self.plan, []
        tail = self.stream.finish()
        if tail:
            events.extend(_text(tail, plan, self.pieces))
        if plan is not None:
            events.extend(_text(None, plan, self.pieces))
        t_end = time.perf_counter()
        computed = len(self.ids) - self.reused
        after = _expert_counts(self.engine.expert_stats)
        hit_rate = None
        if self.expert_requests is not None:
            hits, requests = self.expert_requests
            hit_rate = hits / requests if requests > 0 else None
        elif self.before is not None and after is not None:
            before = self.before
            hits, requests = after[0] - before[0], (after[0] + after[1]) - (before[0] + before[1])
            hit_rate = hits / requests if requests > 0 else None
        n = len(self.generated)
        decode_time = t_end - self.t_first if self.t_first is not None else 0.0
        timings = Timings(
            ttft=self.ttft,
            prefill_tps=computed / (self.t_prefill - self.t0) if self.t_prefill > self.t0 else 0.0,
            decode_tps=(n - 1) / decode_time if n > 1 and decode_time > 0 else 0.0,
            expert_hit_rate=hit_rate,
            total=t_end - self.t0,
        )
        usage = Usage(len(self.ids), self.reused, n)
        if plan is None or plan.parser is None:
            events.append(Final(self.reason, usage, timings, "".join(self.pieces)))
            return events
        parsed = plan.parser
        reason = "tool_calls" if parsed.calls and self.reason == "stop" else self.reason
        events.append(Final(reason, usage, timings, parsed.text, "".join(parsed.reasoning), tuple(parsed.calls)))
        return events


def decode(
    engine, ids: list[int], p: SamplingParams, max_tokens: int, cancelled, *, progress=None, plan=None
) -> Iterator[Event]:
    """Prefill `ids` on `engine`, then sample up to `max_tokens` tokens: TokenEvent/TextDelta…, one Final.

    `cancelled()` is checked before every token; `progress(done, total)` is the prefill's (`Engine.prefill`).
    `plan` (`structured.Plan`): grammar, logit bias and the reading of reasoning and tool calls.
    The caller holds the engine's generation lock.
    """
    loop = TokenLoop(engine, ids, p, max_tokens, cancelled, plan=plan)
    if cancelled():
        loop.reason = "cancelled"
    else:
        logits, reused = engine.prefill(ids, progress=progress)
        loop.prefilled(reused)
        while True:
            events: list[Event] = []
            nxt = loop.token(logits, events)
            yield from events
            if nxt is None:
                break
            logits = engine.forward([nxt])[-1]
    yield from loop.finish()


def _text(text: str | None, plan, pieces: list[str]):
    """The events of new detokenized `text` (None: the end of the answer), read by the plan's parser if any."""
    if plan is None or plan.parser is None:
        if text:
            pieces.append(text)
            yield TextDelta(text)
        return
    yield from (plan.feed(text) if text is not None else plan.finish())


def _is_set(token) -> bool:
    """A cancellation token: None, a threading.Event-like object, or a callable returning bool."""
    if token is None:
        return False
    if hasattr(token, "is_set"):
        return bool(token.is_set())
    return bool(token())


def _expert_counts(stats: dict) -> tuple[int, int] | None:
    """(hits, misses) from `Engine.expert_stats` ({"total": {"hits", "misses"}}); None when all are resident."""
    total = (stats or {}).get("total")
    if not total:
        return None
    return int(total["hits"]), int(total["misses"])
