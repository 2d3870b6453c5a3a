"""The Channels chat consumer (the chat page's plumbing): actions in, the worker's events out, per owner."""

import asyncio
import time


STATUS = ("queued", "loading", "prefill")


async def until_end(ws, timeout=60) -> list[dict]:
    events = [await ws.receive_json_from(timeout=timeout)]
    while events[-1]["t"] not in ("final", "error"):
        events.append(await ws.receive_json_from(timeout=timeout))
    return events


def test_a_new_chat_streams_and_is_stored_for_its_owner(socket_of, stack):
    from webui.models import ChatSession

    async def scenario():
        ws = socket_of("chatter")
        assert (await ws.connect())[0]
        await ws.send_json_to(
            {
                "action": "send",
                "text": "hi",
                "new": {"model": "smollm2", "max_tokens": 4, "temperature": 0, "system": "Be brief."},
            }
        )
        events = await until_end(ws)
        answer = [e["t"] for e in events if e["t"] not in STATUS]  # queued, loading, prefill: shown while waiting
        assert answer[:2] == ["turn", "start"] and events[-1]["t"] == "final"
        turn, final = events[0], events[-1]
        assert turn["index"] == 1 and 'data-role="user"' in turn["user"]["html"] and turn["prefix"] == ""
        assert "".join(e["text"] for e in events if e["t"] == "delta")
        assert final["message"]["index"] == 1 and 'data-m="ttft"' in final["message"]["html"]
        assert final["context"]["context"] == 512 and final["context"]["used"] > 0
        # the next message continues the same conversation
        await ws.send_json_to({"action": "send", "session": turn["session"], "text": "again"})
        again = await until_end(ws)
        assert again[0]["session"] == turn["session"] and again[0]["index"] == 3 and again[-1]["t"] == "final"
        await ws.disconnect()
        return turn["session"]

    sid = asyncio.run(scenario())
    s = ChatSession.objects.get(pk=sid)
    assert s.owner.username == "chatter" and s.system == "Be brief." and s.params == {"max_tokens": 4, "temperature": 0}
    assert [m.role for m in s.messages.order_by("index")] == ["user", "assistant", "user", "assistant"]
    stack.idle(10)


def test_sockets_without_a_session_or_from_another_origin_are_refused(socket_of):
    async def scenario():
        refused = [
            (await socket_of(None).connect())[0],
            (await socket_of("chatter", b"http://evil.example").connect())[0],
        ]
        ws = socket_of("chatter")
        accepted = (await ws.connect())[0]
        await ws.disconnect()  # left open, its consumer was cancelled at the loop's end, and once hung there
        return [*refused, accepted]

    assert asyncio.run(scenario()) == [False, False, True]


def test_another_users_conversation_and_bad_actions_are_refused_by_name(socket_of, django_for_stack):
    from django.contrib.auth import get_user_model

    from webui.models import ChatSession

    owner, _ = get_user_model().objects.get_or_create(username="someone-else")
    theirs = ChatSession.objects.create(owner=owner, source="web", model="smollm2", title="theirs")

    async def scenario():
        ws = socket_of("chatter")
        await ws.connect()
        out = []
        for msg in (
            {"action": "send", "session": str(theirs.pk), "text": "mine now"},
            {"action": "regenerate"},
            {"action": "fly"},
            {"action": "send", "text": "hi", "new": {"model": "smollm2", "top_p": 3}},
            {"action": "send", "text": "hi", "new": {"model": "nope"}},
        ):
            await ws.send_json_to(msg)
            out.append(await ws.receive_json_from(timeout=10))
        await ws.disconnect()
        return out

    errs = asyncio.run(scenario())
    assert [(e["t"], e["status"], e["param"]) for e in errs] == [
        ("error", 404, "session"),
        ("error", 400, "session"),
        ("error", 400, "action"),
        ("error", 400, "top_p"),
        ("error", 400, "model"),
    ]
    assert "top_p=3" in errs[3]["message"] and theirs.messages.count() == 0


def test_stop_frees_the_worker_within_a_token_keeps_the_answer_and_the_socket(socket_of, stack):
    from webui.models import ChatMessage

    async def scenario():
        ws = socket_of("chatter")
        await ws.connect()
        await ws.send_json_to(
            {
                "action": "send",
                "text": "Tell a long story about a dragon.",
                "new": {"model": "smollm2", "max_tokens": 400},
            }
        )
        turn = await ws.receive_json_from(timeout=30)
        ev = await ws.receive_json_from(timeout=30)
        while ev["t"] != "delta":
            ev = await ws.receive_json_from(timeout=30)
        await ws.send_json_to({"action": "stop"})
        stopped_at = time.monotonic()
        final = (await until_end(ws))[-1]
        idle = await asyncio.to_thread(lambda: (stack.idle(5), time.monotonic() - stopped_at)[1])
        # the socket stays open and the next prompt works
        await ws.send_json_to({"action": "send", "session": turn["session"], "text": "Now say hi."})
        after = await until_end(ws)
        await ws.disconnect()
        return final, idle, after

    final, idle, after = asyncio.run(scenario())
    assert final["t"] == "final" and final["finish_reason"] == "cancelled" and final["tokens_after_cancel"] <= 1
    assert idle < 1.0, f"the worker was busy {idle:.2f} s after stop"
    assert 'data-m="finish">stopped' in final["message"]["html"]
    msg = ChatMessage.objects.filter(finish_reason="cancelled").latest("created")
    assert msg.content and after[-1]["t"] == "final" and after[0]["index"] == msg.index + 2


def test_continue_extends_a_cut_off_answer_in_place(socket_of, stack):
    from webui.models import ChatMessage

    async def scenario():
        ws = socket_of("chatter")
        await ws.connect()
        await ws.send_json_to(
            {
                "action": "send",
                "text": "Count from 1 to 30.",
                "new": {"model": "smollm2", "max_tokens": 6, "temperature": 0},
            }
        )
        first = await until_end(ws)
        sid = first[0]["session"]
        await ws.send_json_to({"action": "continue", "session": sid})
        more = await until_end(ws)
        await ws.disconnect()
        return first, more

    first, more = asyncio.run(scenario())
    assert first[-1]["finish_reason"] == "length"
    assert more[0]["index"] == 1 and more[0]["prefix"] and more[-1]["t"] == "final", more[-1]
    msg = ChatMessage.objects.get(session_id=first[0]["session"], index=1)
    assert msg.content.startswith(more[0]["prefix"]) and len(msg.content) > len(more[0]["prefix"])
    stack.idle(10)


async def behind_a_long_answer(socket_of, stack, text: str) -> tuple:
    """Two sockets: `busy` streams a long answer; `waiting` sent `text` as a new chat, which waits behind
    it in the queue. Returns (busy, waiting, waiting's turn event, the waiting request's id)."""
    busy, waiting = socket_of("chatter"), socket_of("chatter")
    await busy.connect()
    await waiting.connect()
    await busy.send_json_to(
        {"action": "send", "text": "Tell a long story.", "new": {"model": "smollm2", "max_tokens": 300}}
    )
    while (await busy.receive_json_from(timeout=30))["t"] != "delta":
        pass
    await waiting.send_json_to({"action": "send", "text": text, "new": {"model": "smollm2", "max_tokens": 2}})
    turn = await waiting.receive_json_from(timeout=10)
    assert turn["t"] == "turn", turn
    r, running = stack.r(), stack.registration("board-a")["running"]
    ids = await asyncio.to_thread(
        lambda: stack.wait_until(lambda: [i for i in r.zrange("rkmojo:queue:smollm2", 0, -1) if i != running])
    )
    return busy, waiting, turn, ids[0]


def test_while_it_waits_the_page_gets_the_queue_position_loading_and_prefill_progress(socket_of, stack):
    """The worker's status events (`appliance.events`: queued, loading, prefill) pass through as they come.
    Here a second request waits behind a long one, and its status events are written into its stream as
    a worker writes them."""
    from appliance import bus
    from appliance.events import Loading, PrefillProgress, Queued

    r = stack.r()

    async def scenario():
        busy, waiting, _, rid = await behind_a_long_answer(socket_of, stack, "hi")
        for ev in (Queued(position=1), Loading(model="smollm2"), PrefillProgress(done=512, total=1800)):
            bus.emit(r, rid, ev)
        got = [await waiting.receive_json_from(timeout=10) for _ in range(3)]
        await busy.send_json_to({"action": "stop"})
        await until_end(busy)
        rest = await until_end(waiting)
        for ws in (busy, waiting):
            await ws.disconnect()
        return got, rest

    got, rest = asyncio.run(scenario())
    assert got == [
        {"t": "queued", "position": 1},
        {"t": "loading", "model": "smollm2"},
        {"t": "prefill", "done": 512, "total": 1800},
    ]
    assert rest[-1]["t"] == "final"
    stack.idle(10)


def test_thinking_and_tool_calls_reach_the_page_on_their_channels_and_are_stored_apart(socket_of, stack):
    """The demo model neither thinks nor calls tools, so a worker's events for them are written into a
    waiting request's stream (as in the test above); the request is marked cancelled first so the worker
    skips it when its turn comes."""
    from appliance import bus
    from appliance.events import Delta, Final, Start, ToolCallDelta, ToolCallOut, Usage
    from webui.api import jobs
    from webui.models import ChatMessage

    r = stack.r()
    written = [
        Start(prompt_tokens=12),
        Delta(text="The user asks about ", tokens=1, channel="reasoning"),
        Delta(text="*Paris*.", tokens=2, channel="reasoning"),
        Delta(text="Let me check.", tokens=3),
        ToolCallDelta(index=0, id="call_" + "a" * 24, name="get_weather"),
        ToolCallDelta(index=0, id="call_" + "a" * 24, arguments='{"city": '),
        ToolCallDelta(index=0, id="call_" + "a" * 24, arguments='"Paris"}'),
        Final(
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=12, completion_tokens=9),
            tool_calls=[ToolCallOut(id="call_" + "a" * 24, name="get_weather", arguments={"city": "Paris"})],
        ),
    ]

    async def scenario():
        busy, thinker, turn, rid = await behind_a_long_answer(socket_of, stack, "Weather in Paris?")
        await bus.cancel(jobs.redis(), rid)
        for ev in written:
            bus.emit(r, rid, ev)
        got = [e for e in await until_end(thinker) if e["t"] not in STATUS]
        await busy.send_json_to({"action": "stop"})
        await until_end(busy)
        for ws in (busy, thinker):
            await ws.disconnect()
        return turn, got

    turn, got = asyncio.run(scenario())
    assert [(e["t"], e.get("channel")) for e in got[1:4]] == [
        ("delta", "reasoning"),
        ("delta", "reasoning"),
        ("delta", "content"),
    ]
    assert [e["text"] for e in got[1:4]] == ["The user asks about ", "*Paris*.", "Let me check."]
    assert got[4] == {"t": "tool_call", "index": 0, "id": "call_" + "a" * 24, "name": "get_weather", "arguments": ""}
    assert "".join(e["arguments"] for e in got[4:7]) == '{"city": "Paris"}'
    final = got[-1]
    assert final["t"] == "final" and final["finish_reason"] == "tool_calls"
    assert final["tool_calls"] == [{"id": "call_" + "a" * 24, "name": "get_weather", "arguments": {"city": "Paris"}}]
    html = final["message"]["html"]
    assert (
        '<details class="thinking"><summary>Thinking…</summary><div class="md"><p>The user asks about <em>Paris</em>.'
        in html
    )
    assert '<code class="tool-name">get_weather</code>' in html and "<tr><th>city</th><td>Paris</td></tr>" in html
    msg = ChatMessage.objects.get(session_id=turn["session"], index=turn["index"])
    assert (msg.content, msg.reasoning, msg.finish_reason) == (
        "Let me check.",
        "The user asks about *Paris*.",
        "tool_calls",
    )
    assert msg.tool_calls == [{"id": "call_" + "a" * 24, "name": "get_weather", "arguments": {"city": "Paris"}}]
    stack.idle(10)
