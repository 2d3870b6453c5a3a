"""The events a generation yields (see `generate`): text, tokens, tool calls, and one `Final`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


# --- events --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextDelta:
    """New answer text (whole characters and grapheme clusters; stop strings never appear).

    `channel` is "content" (the answer) or "reasoning" (a thinking model's thoughts, apart from the answer).
    """

    text: str
    channel: str = "content"


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `logprob`/`top_logprobs` ((id, log-probability) pairs, best first) when asked."""

    id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call as the model writes it: `name` on the call's first delta only, then pieces
    of its arguments' JSON text, which concatenated are one JSON object."""

    index: int  # 0, 1, … in the order the model wrote the calls
    id: str  # "call_" + 24 hex digits, the same on every delta of one call
    name: str | None
    arguments: str = ""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict


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
    """The end of a generation: why it ended ("stop", "length", "cancelled", or "tool_calls" when the answer
    ends with tool calls), counts, timings, the answer's text, its reasoning and its tool calls."""

    finish_reason: str
    usage: Usage
    timings: Timings
    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)


Event = Union[TextDelta, TokenEvent, ToolCallDelta, Final]
