"""The Channels chat consumer (the chat page's plumbing): actions in, the worker's events out, per owner."""
import asyncio
import time

import pytest

@pytest.fixture
def socket_of(session_cookie):
    """`socket_of(username, origin=…)`: a WebsocketCommunicator with that user's session (made ahead:
    a session is made through the ORM, which refuses to run inside the test's event loop)."""
    from channels.testing import WebsocketCommunicator

    from appliance.asgi import application

    cookies = {name: session_cookie(name).encode() for name in ("chatter",)}

    def make(username: str | None, origin: bytes = b"http://127.0.0.1"):
        headers = [(b"host", b"127.0.0.1"), (b"origin", origin)]
        if username:
            headers.append((b"cookie", cookies[username]))
        return WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    return make


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
        await ws.send_json_to({"action": "send", "text": "hi",
                               "new": {"model": "smollm2", "max_tokens": 4, "temperature": 0, "system": "Be brief."}})
        events = await until_end(ws)
        assert [e["t"] for e in events[:2]] == ["turn", "start"] and events[-1]["t"] == "final"
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
        return [(await socket_of(None).connect())[0], (await socket_of("chatter", b"http://evil.example").connect())[0],
                (await socket_of("chatter").connect())[0]]

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
        for msg in ({"action": "send", "session": str(theirs.pk), "text": "mine now"},
                    {"action": "regenerate"}, {"action": "fly"},
                    {"action": "send", "text": "hi", "new": {"model": "smollm2", "top_p": 3}},
                    {"action": "send", "text": "hi", "new": {"model": "nope"}}):
            await ws.send_json_to(msg)
            out.append(await ws.receive_json_from(timeout=10))
        await ws.disconnect()
        return out

    errs = asyncio.run(scenario())
    assert [(e["t"], e["status"], e["param"]) for e in errs] == [
        ("error", 404, "session"), ("error", 400, "session"), ("error", 400, "action"),
        ("error", 400, "top_p"), ("error", 400, "model")]
    assert "top_p=3" in errs[3]["message"] and theirs.messages.count() == 0


def test_stop_frees_the_worker_within_a_token_keeps_the_answer_and_the_socket(socket_of, stack):
    from webui.models import ChatMessage

    async def scenario():
        ws = socket_of("chatter")
        await ws.connect()
        await ws.send_json_to({"action": "send", "text": "Tell a long story about a dragon.",
                               "new": {"model": "smollm2", "max_tokens": 400}})
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
        await ws.send_json_to({"action": "send", "text": "Count from 1 to 30.",
                               "new": {"model": "smollm2", "max_tokens": 6, "temperature": 0}})
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
