"""The live view's data on the real stack: the worker's stats in Redis (and their two-minute ring) and on the
Channels group, a waiting request's place in the queue and its prefill progress on the chat socket, saved
settings applied."""

import asyncio
import json
import time

from appliance import bus, events
from appliance.events import WorkerStats

CHAT = "/ws/chat/"


def socket(cookie: bytes):
    from channels.testing import WebsocketCommunicator

    from appliance.asgi import application

    return WebsocketCommunicator(
        application, CHAT, headers=[(b"host", b"127.0.0.1"), (b"cookie", cookie), (b"origin", b"http://127.0.0.1")]
    )


async def until_end(ws, timeout: float = 60) -> list[dict]:
    out = []
    while not out or out[-1]["t"] not in ("final", "error"):
        out.append(await ws.receive_json_from(timeout=timeout))
    return out


def test_the_worker_writes_its_stats_to_redis_within_three_seconds(stack):
    r = stack.r()
    r.delete(bus.k_stats("board-a"))
    raw = stack.wait_until(lambda: r.get(bus.k_stats("board-a")), timeout=3)
    s = events.decode(raw)
    assert isinstance(s, WorkerStats) and s.worker == "board-a"
    assert s.boot == stack.registration("board-a")["boot"] and abs(s.at - time.time()) < 3
    assert s.state in ("idle", "loading", "prefill", "decoding", "embedding") and s.queue_depth >= 0
    assert s.memory.total > 0 and s.cpu_percent >= 0 and s.load_average >= 0
    if "smollm2" in s.loaded:
        assert s.memory.dense > 0 and s.memory.kv > 0 and s.heatmap is None  # a dense model: no heatmap
    assert 0 < r.ttl(bus.k_stats("board-a")) <= 5


def test_the_worker_keeps_a_ring_of_its_charted_stats_in_redis(stack):
    from appliance.stats import CHARTED, HISTORY, history

    r = stack.r()
    key = bus.k_stats_history("board-a")
    r.delete(key)
    stack.wait_until(lambda: r.llen(key) >= 3, timeout=6)
    points = history(r.lrange(key, 0, -1))
    assert 3 <= len(points) <= HISTORY and all(set(p) == set(CHARTED) for p in points)
    ats = [p["at"] for p in points]
    assert ats == sorted(ats) and 0.5 < (ats[-1] - ats[0]) / (len(ats) - 1) < 1.5  # one a second, oldest first
    assert HISTORY < r.ttl(key) <= HISTORY + 5  # outlives the worker by as long as it spans


def test_a_live_group_member_receives_the_stats_about_once_a_second(django_for_stack):
    from channels.layers import get_channel_layer

    async def listen(seconds: float) -> list[tuple[float, dict]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(bus.LIVE_GROUP, channel)
        got, t0 = [], time.monotonic()
        try:
            while time.monotonic() - t0 < seconds:
                got.append((time.monotonic(), await asyncio.wait_for(layer.receive(channel), 2.5)))
        finally:
            await layer.group_discard(bus.LIVE_GROUP, channel)
        return got

    got = [(t, m) for t, m in asyncio.run(listen(4.2)) if events.decode(m["stats"]).worker == "board-a"]
    assert 3 <= len(got) <= 6 and all(m["type"] == "live.stats" for _, m in got)
    sampled = [events.decode(m["stats"]).at for _, m in got]
    assert 0.8 < (sampled[-1] - sampled[0]) / (len(sampled) - 1) < 1.25, sampled  # one a second, on average
    assert 0.8 < (got[-1][0] - got[0][0]) / (len(got) - 1) < 1.25  # and as they arrive


def test_a_waiting_chat_request_sees_its_place_in_the_queue_fall_before_it_starts(session_cookie, stack):
    cookie = session_cookie("queuer").encode()
    story = "Tell a long story about a dragon."

    def new_chat(max_tokens: int, text: str = story, **params) -> dict:
        return {"action": "send", "text": text, "new": {"model": "smollm2", "max_tokens": max_tokens, **params}}

    async def scenario():
        socks = [socket(cookie) for _ in range(3)]
        for ws in socks:
            assert (await ws.connect())[0]
        # Both long enough for the third request's 250 ms polls to see each place, however fast decoding is:
        # 40 tokens for the first once ended before the third queued (it only ever saw place 1), and 20 for
        # the second once ran between two polls (it only ever saw place 2).
        await socks[0].send_json_to(new_chat(200))
        while (await socks[0].receive_json_from(timeout=30))["t"] != "start":
            pass
        await socks[1].send_json_to(new_chat(120))
        assert (await socks[1].receive_json_from(timeout=10))["t"] == "turn"  # the page shows the user's message
        assert (await socks[1].receive_json_from(timeout=10)) == {"t": "queued", "position": 1}
        await socks[2].send_json_to(new_chat(2))
        third = await until_end(socks[2])
        rest = [await until_end(ws) for ws in socks[:2]]
        for ws in socks:
            await ws.disconnect()
        return third, rest

    third, rest = asyncio.run(scenario())
    kinds = [e["t"] for e in third]
    positions = [e["position"] for e in third if e["t"] == "queued"]
    assert kinds[-1] == "final" and "start" in kinds and kinds.index("start") > kinds.index("queued")
    assert "queued" not in kinds[kinds.index("start") :]
    assert positions[0] >= 1 and min(positions) < positions[0], positions
    assert positions == sorted(positions, reverse=True) and len(set(positions)) == len(positions)
    assert all(r[-1]["t"] == "final" for r in rest)
    stack.idle(10)


def test_a_long_prompt_reports_its_prefill_progress_between_start_and_the_answer(session_cookie, stack):
    cookie = session_cookie("prefiller").encode()
    long = "Summarise: " + "the river runs past the old mill " * 36

    async def scenario():
        ws = socket(cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to(
            {"action": "send", "text": long, "new": {"model": "smollm2", "max_tokens": 3, "temperature": 0}}
        )
        out = await until_end(ws)
        await ws.disconnect()
        return out

    out = asyncio.run(scenario())
    kinds = [e["t"] for e in out]
    start = out[kinds.index("start")]
    prefill = [e for e in out if e["t"] == "prefill"]
    assert kinds.index("start") < kinds.index("prefill") and kinds[-1] == "final"
    last_prefill = max(i for i, k in enumerate(kinds) if k == "prefill")
    assert "delta" not in kinds[:last_prefill]
    assert prefill[0]["done"] == 0 and prefill[-1]["done"] == prefill[-1]["total"] > 200
    assert prefill[-1]["total"] <= start["prompt_tokens"] and len(prefill) >= 2
    assert [p["done"] for p in prefill] == sorted(p["done"] for p in prefill)
    stats = events.decode(stack.wait_until(lambda: stack.r().get(bus.k_stats("board-a"))))
    assert stats.ttft is not None and stats.ttft > 0


def test_a_saved_keep_alive_applies_at_once_and_the_environment_still_wins(stack):
    r = stack.r()
    stack.openai().chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )  # loaded, following the default keep-alive

    def model_in(reg):
        return next(ld for ld in reg["loaded"] if ld["name"] == "smollm2")

    r.set(bus.K_SETTINGS, json.dumps({"keep_alive": "3h", "context": 1024, "expert_slots": 0, "theme": "dark"}))
    try:
        reg = stack.wait_until(
            lambda: (g := stack.registration("board-a")) and "keep_alive" in g["settings"]["applied"] and g, timeout=5
        )
        assert model_in(reg)["expires_at"] - time.time() > 2 * 3600
        assert reg["settings"]["environment"] == ["context"]  # RKMOJO_CONTEXT=512 in the stack's environment
        assert "expert_slots=0 is out of range" in reg["settings"]["invalid"]["expert_slots"]
    finally:
        r.delete(bus.K_SETTINGS)
    reg = stack.wait_until(
        lambda: (g := stack.registration("board-a")) and not g["settings"]["applied"] and g, timeout=5
    )
    assert model_in(reg)["expires_at"] - time.time() < 1800 + 5  # back to the 30 min default
