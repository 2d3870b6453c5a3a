"""Every worker → web event type crosses the real Redis unchanged; a foreign or malformed one is an error naming it."""

import asyncio

import pytest

from appliance import bus, events
from appliance.events import (
    Claim,
    Delta,
    Embeddings,
    Error,
    Final,
    Loading,
    Logprob,
    PrefillProgress,
    Progress,
    Queued,
    Start,
    Timings,
    ToolCallDelta,
    ToolCallOut,
    TopLogprob,
    Usage,
    WorkerStats,
)
from appliance.events import Heatmap, MemoryBudget

ONE_OF_EACH = [
    Claim(worker="board-a", boot="b00t"),
    Queued(position=2),
    Loading(model="smollm2"),
    Start(prompt_tokens=12, load_duration=0.5),
    PrefillProgress(done=64, total=512),
    Delta(
        text="Paris",
        tokens=3,
        logprobs=[
            Logprob(
                token="Paris",
                logprob=-0.1,
                bytes=list(b"Paris"),
                top_logprobs=[TopLogprob(token="Rome", logprob=-3.0, bytes=list(b"Rome"))],
            )
        ],
    ),
    Delta(text="Let me think.", tokens=4, channel="reasoning"),
    ToolCallDelta(index=0, id="call_0123456789abcdef01234567", name="get_weather"),
    ToolCallDelta(index=0, id="call_0123456789abcdef01234567", arguments='{"city": "Par'),
    Embeddings(data="AACAPw==", shape=(1, 1), prompt_tokens=2),
    Progress(status="verifying", completed=10, total=100),
    Final(
        finish_reason="stop",
        usage=Usage(prompt_tokens=12, cached_tokens=4, completion_tokens=3),
        timings=Timings(ttft=0.1, prefill_tps=120.0, decode_tps=30.0, total=0.2, expert_hit_rate=0.6),
        load_duration=0.5,
        cancel_latency=0.01,
        tokens_after_cancel=1,
    ),
    Final(
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=30, completion_tokens=20, reasoning_tokens=8),
        tool_calls=[ToolCallOut(id="call_0123456789abcdef01234567", name="get_weather", arguments={"city": "Paris"})],
    ),
    Error(status=400, code="invalid_value", param="temperature", message="temperature=5 is out of range"),
    WorkerStats(
        worker="board-a",
        boot="b1",
        at=1.5e9,
        state="prefill",
        running="r1",
        running_model="m",
        prefill_done=128,
        prefill_total=512,
        loaded=["m"],
        queue_depth=2,
        oldest_wait=3.5,
        tokens_per_s=6.1,
        ttft=1.2,
        expert_hit_rate=0.6,
        disk_mb_per_s=400.0,
        memory=MemoryBudget(total=16 << 30, dense=1 << 30, kv=1 << 28, expert_slots=1 << 29, runtime=1 << 27),
        temperatures={"soc-thermal": 51.5},
        cpu_mhz=1800.0,
        cpu_max_mhz=2400.0,
        throttled=False,
        heatmap=Heatmap(
            model="m",
            layer_ids=[0, 1],
            experts=2,
            half_life=30.0,
            hits=[[1.0, 0.0], [0.5, 2.0]],
            misses=[[0.0, 1.0], [0.0, 0.0]],
            residency=[[1, 0], [2, 1]],
            layer_hit_rate=[0.5, None],
        ),
    ),
]


def test_one_of_each_covers_every_type():
    assert {type(e) for e in ONE_OF_EACH} == set(events.TYPES.values())


def test_every_event_type_round_trips_through_redis(stack):
    r = stack.r()
    for ev in ONE_OF_EACH:
        bus.emit(r, "roundtrip", ev)

    async def read_all():
        got = await bus.read(bus.connect_async(stack.redis_url), "roundtrip", "0", 100)
        return [ev for _, ev in got]

    assert asyncio.run(read_all()) == ONE_OF_EACH


@pytest.mark.parametrize(
    "raw, names",
    [
        ('{"t": "telepathy", "x": 1}', "unknown event type 'telepathy'"),
        ('{"t": "delta", "tokens": 1}', "malformed 'delta' event: text"),
        ('{"t": "error", "status": "bad", "message": "m"}', "malformed 'error' event: status"),
        ('{"worker": "a"}', "unknown event type None"),
        ("not json", "not a JSON object"),
    ],
)
def test_a_foreign_or_malformed_event_is_an_error_naming_it(raw, names):
    with pytest.raises(events.EventError) as e:
        events.decode(raw)
    assert names in str(e.value)
