"""The contract between worker and web: every event a worker writes to a request's Redis stream.

A request's stream (`bus.k_events`) carries, in order:

- `Claim` {worker, boot}: a worker took the request (the web side now watches that worker's heartbeat);
- `Queued` {position}: requests ahead of this one in its model's queue (0: next), while no worker has
  claimed it; the web side makes it from the queue (`webui.api.jobs`), it is not on the stream;
- `Loading` {model}: the worker is loading the model before it can start;
- `Start` {prompt_tokens, load_duration, dropped_messages?}: the request is valid and computing (the HTTP
  status is 200 from here); `dropped_messages`: with `truncate`, how many of the oldest messages after the
  system prompt were left out of the prompt so that it fits the context (absent when none were);
- `PrefillProgress` {done, total}: prompt tokens computed so far;
- `Delta` {text, tokens, channel, logprobs?}: new answer text; `channel` "content" (the answer) or
  "reasoning" (a thinking model's thoughts, which never appear in the content);
- `ToolCallDelta` {index, id, name?, arguments}: a piece of a tool call the model writes: the first piece
  of call `index` carries its `id` and `name` (arguments ""), the next ones pieces of its arguments' JSON
  text (the same `id` on each); a call's pieces concatenated are a JSON object;
- `Embeddings` {data (base64 float32), shape, prompt_tokens};
- `Progress` {status, digest?, completed?, total?}: a pull or verify of a store (board tasks);
- `Final` {finish_reason, usage (reasoning_tokens: those of the completion that wrote reasoning), timings
  (with the expert cache hit rate), load_duration, logprobs?,
  tool_calls?, cancel_latency?, tokens_after_cancel?}: finish_reason "tool_calls" when the answer ended
  with at least one tool call, whose parsed arguments are in `tool_calls` [{id, name, arguments}], and
  "repetition" when the repetition guard stopped an answer that ended in a loop (the APIs say "stop");
- `Error` {status, code, param, message} instead of `Start`, or after it when something broke.

`WorkerStats` is the worker's once-a-second summary for the live view (not on a request's stream).

Each event is a frozen pydantic model tagged by `t`; `encode` and `decode` are the only ways across
Redis. The wire format is JSON (`{"t": "delta", "text": …}`), fields that are None left out. Decoding
an unknown or malformed event raises `EventError` naming the event, never a KeyError further on.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Claim(_Event):
    t: Literal["claim"] = "claim"
    worker: str
    boot: str


class Queued(_Event):
    t: Literal["queued"] = "queued"
    position: int = Field(ge=0)


class Loading(_Event):
    t: Literal["loading"] = "loading"
    model: str


class Start(_Event):
    t: Literal["start"] = "start"
    prompt_tokens: int = Field(0, ge=0)
    load_duration: float = 0.0
    dropped_messages: int | None = Field(None, ge=1)


class PrefillProgress(_Event):
    t: Literal["prefill"] = "prefill"
    done: int = Field(ge=0)
    total: int = Field(ge=0)


class TopLogprob(_Event):
    token: str
    logprob: float
    bytes: list[int]


class Logprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class Delta(_Event):
    t: Literal["delta"] = "delta"
    text: str
    tokens: int = Field(ge=0)  # tokens generated so far
    channel: Literal["content", "reasoning"] = "content"
    logprobs: list[Logprob] | None = None


class ToolCallDelta(_Event):
    t: Literal["tool_call"] = "tool_call"
    index: int = Field(ge=0)  # 0, 1, … in the order the model wrote the calls
    id: str  # "call_…", the same on every piece of one call
    name: str | None = None  # on the first piece of a call only
    arguments: str = ""  # a piece of the arguments' JSON text ("" on the first)


class ToolCallOut(_Event):
    """A finished tool call: its arguments parsed (a JSON object)."""

    id: str
    name: str
    arguments: dict


def logprob_dicts(ev: Delta | Final) -> list[dict]:
    """An event's log-probabilities as OpenAI spells them ({token, logprob, bytes, top_logprobs})."""
    return [lp.model_dump() for lp in ev.logprobs or ()]


class Embeddings(_Event):
    t: Literal["embeddings"] = "embeddings"
    data: str  # base64 of the little-endian float32 vectors [N, H], L2-normalised
    shape: tuple[int, int]
    prompt_tokens: int = Field(ge=0)


class Progress(_Event):
    t: Literal["progress"] = "progress"
    status: str
    digest: str | None = None
    completed: int | None = Field(None, ge=0)
    total: int | None = Field(None, ge=0)


class Usage(_Event):
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of the completion tokens, those that wrote reasoning (thinking)


class Timings(_Event):
    ttft: float
    prefill_tps: float
    decode_tps: float
    total: float
    expert_hit_rate: float | None = None  # expert cache hits / requests; None: all experts resident


class Final(_Event):
    t: Literal["final"] = "final"
    finish_reason: str  # stop, length, cancelled, tool_calls, repetition; load, unload for the control kinds
    usage: Usage | None = None
    timings: Timings | None = None
    load_duration: float = 0.0
    logprobs: list[Logprob] | None = None
    tool_calls: list[ToolCallOut] | None = None
    cancel_latency: float | None = None
    tokens_after_cancel: int | None = None

    def usage_dict(self) -> dict | None:
        return None if self.usage is None else self.usage.model_dump()


class Error(_Event):
    t: Literal["error"] = "error"
    status: int = Field(ge=400, le=599)
    code: str | None = None
    param: str | None = None  # the engine's name (prompt, input, an option); each surface spells it its own way
    message: str


class MemoryBudget(_Event):
    """Where a worker's memory goes, in bytes (the live view's stacked bar)."""

    total: int = Field(0, ge=0)  # the budget: RKMOJO_MEMORY or the machine's RAM
    dense: int = Field(0, ge=0)  # resident weights of the loaded models
    kv: int = Field(0, ge=0)  # KV caches as allocated
    expert_slots: int = Field(0, ge=0)  # the streamed experts' cache slots
    prefetch_slots: int = Field(0, ge=0)
    runtime: int = Field(0, ge=0)  # the process's own (RSS minus the above, never below 0)
    free: int = Field(0, ge=0)  # total minus all of the above, never below 0


class Heatmap(_Event):
    """One loaded model's expert cache, layer × expert, over a decaying window (half-life `half_life` s).

    `hits` and `misses` are decayed counts [layers][experts]; `residency` is 0 not resident,
    1 in a cache slot, 2 in a prefetch slot (or being read ahead); `layer_hit_rate` is hits / requests
    per layer over the same window (None: no requests yet). Layers are the model's MoE layers in order,
    named by `layer_ids`.
    """

    model: str
    layer_ids: list[int]
    experts: int = Field(ge=1)
    half_life: float = Field(gt=0)
    hits: list[list[float]]
    misses: list[list[float]]
    residency: list[list[int]]
    layer_hit_rate: list[float | None]


class WorkerStats(_Event):
    """A worker's once-a-second summary for the live view: `bus.k_stats` and the `bus.LIVE_GROUP` push."""

    t: Literal["stats"] = "stats"
    worker: str
    boot: str
    at: float  # time.time() of the sample
    state: Literal["idle", "loading", "prefill", "decoding", "embedding"] = "idle"
    running: str | None = None  # the request id it computes
    running_model: str | None = None
    prefill_done: int | None = None  # state prefill: prompt tokens computed / to compute
    prefill_total: int | None = None
    loaded: list[str] = []  # loaded models
    active: int = Field(0, ge=0)  # generations running now (several with RKMOJO_PARALLEL > 1)
    parallel: int = Field(1, ge=1)  # the most it runs at once
    queue_depth: int = Field(0, ge=0)  # requests admitted for its models and not yet finished
    oldest_wait: float = 0.0  # seconds the oldest of them has been waiting
    tokens_per_s: float = 0.0  # tokens generated in the last second
    ttft: float | None = None  # the last finished request's time to first token, s
    expert_hit_rate: float | None = None  # over the last second; None: nothing streamed
    disk_mb_per_s: float = 0.0  # expert bytes read in the last second, MB/s
    memory: MemoryBudget = MemoryBudget()
    cpu_percent: float = 0.0  # the machine's, all cores, over the last second
    load_average: float = 0.0  # one-minute
    temperatures: dict[str, float] = {}  # thermal zone type → °C, where /sys/class/thermal has them
    cpu_mhz: float | None = None  # current / maximum frequency of the first core, where cpufreq has them
    cpu_max_mhz: float | None = None
    throttled: bool | None = None  # current frequency below the maximum while busy; None: unknown
    heatmap: Heatmap | None = None  # the loaded MoE model with streamed experts, if any


Event = Annotated[
    Union[
        Claim,
        Queued,
        Loading,
        Start,
        PrefillProgress,
        Delta,
        ToolCallDelta,
        Embeddings,
        Progress,
        Final,
        Error,
        WorkerStats,
    ],
    Field(discriminator="t"),
]
TYPES: dict[str, type[_Event]] = {cls.model_fields["t"].default: cls for cls in get_args(get_args(Event)[0])}
_ADAPTER: TypeAdapter = TypeAdapter(Event)


class EventError(ValueError):
    """An event that is not one of `TYPES`, or lacks what its type needs; the message names it."""


def encode(event: _Event) -> str:
    """The event as the JSON text that goes into Redis."""
    return event.model_dump_json(exclude_none=True)


def decode(raw: str | bytes) -> Event:
    """The event a worker encoded.

    Raises:
        EventError: unknown type, missing or wrong fields, or not JSON at all (naming the event).
    """
    try:
        return _ADAPTER.validate_json(raw)
    except ValidationError as e:
        try:
            t = json.loads(raw).get("t")
        except (ValueError, AttributeError):
            raise EventError(f"an event is not a JSON object: {str(raw)[:120]!r}") from None
        if t not in TYPES:
            raise EventError(f"unknown event type {t!r} (known: {', '.join(TYPES)}): {str(raw)[:120]}") from None
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"][1:]) or "the event"
        raise EventError(f"malformed {t!r} event: {where}: {err['msg']}: {str(raw)[:120]}") from None


def as_dict(event: _Event) -> dict:
    """The event as the JSON object browsers get over a WebSocket (same shape as on Redis)."""
    return event.model_dump(mode="json", exclude_none=True)
