"""The Channels chat consumer (the browser chat page's plumbing) streams a generation over a WebSocket."""
import asyncio

STATUS = ("queued", "loading", "prefill")


def test_the_chat_consumer_streams_events_and_cancels_on_disconnect(session_cookie, stack):
    from channels.testing import WebsocketCommunicator

    from appliance.asgi import application

    cookie = session_cookie("chatter").encode()

    async def scenario():
        ws = WebsocketCommunicator(application, "/ws/chat/", headers=[(b"host", b"127.0.0.1"), (b"cookie", cookie),
                                                                     (b"origin", b"http://127.0.0.1")])
        connected, _ = await ws.connect()
        assert connected
        await ws.send_json_to({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                               "params": {"max_tokens": 4, "temperature": 0}})
        events = []
        while not events or events[-1]["t"] not in ("final", "error"):
            events.append(await ws.receive_json_from(timeout=30))
        answer = [e for e in events if e["t"] not in STATUS]  # queued, loading, prefill: shown while waiting
        assert answer[0]["t"] == "start" and events[-1]["t"] == "final" and events[-1]["session"]
        assert "".join(e["text"] for e in events if e["t"] == "delta")
        await ws.send_json_to({"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
        err = await ws.receive_json_from(timeout=10)
        assert err["t"] == "error" and err["status"] == 404
        # a long answer, then the page closes: the worker stops
        await ws.send_json_to({"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
                               "params": {"max_tokens": 300}})
        ev = await ws.receive_json_from(timeout=30)
        while ev["t"] in STATUS:
            ev = await ws.receive_json_from(timeout=30)
        assert ev["t"] == "start"
        await ws.disconnect()

    asyncio.run(scenario())
    stack.idle(10)
