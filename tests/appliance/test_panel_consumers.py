"""The panel's WebSockets through Channels' communicator on the real ASGI application: the live view is for
staff from this server's origin, sends each worker's last two minutes and its latest stats at connect,
forwards the live group at most twice a second per worker; a job socket follows a board job to its end."""

import asyncio
import time

import pytest

from live_samples import push, sample, store


def socket(path: str, cookie: str | None, origin: str = "http://127.0.0.1"):
    from channels.testing import WebsocketCommunicator

    from appliance.asgi import application

    headers = [(b"host", b"127.0.0.1"), (b"origin", origin.encode())]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.fixture
def staff_cookie(session_cookie):
    from django.contrib.auth import get_user_model

    get_user_model().objects.update_or_create(username="live-staff", defaults={"is_staff": True})
    return session_cookie("live-staff")


def test_the_live_socket_refuses_visitors_users_and_other_origins(session_cookie, staff_cookie):
    async def connects(cookie, origin="http://127.0.0.1"):
        ws = socket("/ws/panel/live/", cookie, origin)
        ok, _ = await ws.connect()
        await ws.disconnect()
        return ok

    plain = session_cookie("live-plain")

    async def scenario():
        assert not await connects(None)
        assert not await connects(plain)
        assert not await connects(staff_cookie, "http://evil.example")
        assert await connects(staff_cookie)

    asyncio.run(scenario())


def test_the_live_socket_sends_the_latest_stats_then_the_group_throttled(staff_cookie, stack):
    r = stack.r()
    first = sample("board-live", 1)
    store(r, first)

    async def scenario():
        ws = socket("/ws/panel/live/", staff_cookie)
        assert (await ws.connect())[0]
        got = []
        while not any(m["t"] == "stats" and m["worker"] == "board-live" for m in got):  # others' may come first
            got.append(await ws.receive_json_from(timeout=5))
        latest = next(m for m in got if m["t"] == "stats" and m["worker"] == "board-live")
        assert latest["heatmap"]["experts"] == 32 and latest["memory"]["total"] == 8 * 2**30

        # ten samples within half a second: one goes out at once, the latest at the next slot, none between
        async def pushes():
            for step in range(2, 12):
                await push(sample("board-other", step))
                await asyncio.sleep(0.05)

        t0 = time.monotonic()
        pusher = asyncio.create_task(pushes())
        seen = []
        while time.monotonic() - t0 < 1.6:
            if await ws.receive_nothing(timeout=0.05, interval=0.01):
                continue  # (a receive that times out would cancel the consumer)
            m = await ws.receive_json_from()
            if m["t"] == "stats" and m["worker"] == "board-other":
                seen.append((time.monotonic() - t0, m["oldest_wait"]))
        await pusher
        await ws.disconnect()
        return seen

    seen = asyncio.run(scenario())
    r.delete("rkmojo:stats:board-live")
    assert 2 <= len(seen) <= 3, seen
    assert all(b[0] - a[0] >= 0.45 for a, b in zip(seen, seen[1:])), seen
    assert seen[-1][1] == sample("board-other", 11).oldest_wait  # the latest sample is the one sent


def test_a_new_live_socket_gets_each_workers_last_two_minutes_before_its_latest_stats(staff_cookie, stack):
    from appliance.stats import CHARTED, HISTORY, remember

    r = stack.r()
    r.delete("rkmojo:stats-history:board-past")
    t0 = time.time() - 200
    for step in range(HISTORY + 30):  # more than the ring keeps: the oldest fall out
        s = sample("board-past", step)
        remember(r, s.model_copy(update={"at": t0 + step}))
    store(r, sample("board-past", 999))

    async def scenario():
        ws = socket("/ws/panel/live/", staff_cookie)
        assert (await ws.connect())[0]
        got = []
        while not any(m["t"] == "stats" and m["worker"] == "board-past" for m in got):
            got.append(await ws.receive_json_from(timeout=5))
        await ws.disconnect()
        return [m for m in got if m["worker"] == "board-past"]

    history, latest = asyncio.run(scenario())
    r.delete("rkmojo:stats:board-past", "rkmojo:stats-history:board-past")
    assert history["t"] == "history" and latest["t"] == "stats"
    points = history["points"]
    assert len(points) == HISTORY and set(points[0]) == set(CHARTED)
    assert [p["at"] for p in points] == [t0 + step for step in range(30, HISTORY + 30)]  # oldest first
    assert points[-1]["tokens_per_s"] == sample("board-past", HISTORY + 29).tokens_per_s


def test_a_job_socket_follows_a_verify_to_its_end(staff_cookie, stack):
    from webui.api.jobs import Job

    async def scenario():
        job = await Job.submit_board("rkmojo.verify", "board-a", {"name": "smollm2"})
        ws = socket(f"/ws/panel/job/board-a/{job.id}/", staff_cookie)
        assert (await ws.connect())[0]
        events = []
        while not events or events[-1]["t"] not in ("final", "error"):
            events.append(await ws.receive_json_from(timeout=60))
        await ws.disconnect()
        return events

    events = asyncio.run(scenario())
    progress = [e for e in events if e["t"] == "progress"]
    assert events[-1]["t"] == "final" and progress and progress[-1]["completed"] == progress[-1]["total"]


def test_chat_without_sign_in_saved_in_the_panel_opens_the_chat_socket_within_seconds(django_for_stack, monkeypatch):
    from webui import config

    monkeypatch.setenv("RKMOJO_API_KEYS", "never")  # this process serves the socket: no key asked of anyone

    async def connects():
        ws = socket("/ws/chat/", None)
        ok, _ = await ws.connect()
        await ws.disconnect()
        return ok

    config.save({})
    try:
        assert not asyncio.run(connects())
        config.save({"chat_open": True})
        assert asyncio.run(connects())
    finally:
        config.save({"chat_open": None})
