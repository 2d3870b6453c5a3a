"""Sockets die with their session (`webui.socket_auth`), on the real stack: daphne, a real WebSocket client.

Each case ends a session or changes its user the way it happens for real (a POST /logout/ with the
session's cookie and CSRF token, the panel's disable button, the ORM from this process as the admin or a
shell does, SQL by hand, an expiry) and measures the time from the change to the close frame, which
must carry 4401 within a second. Other sessions' sockets stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest
import websockets

SIGNED_OUT = 4401


@dataclass
class Login:
    user: object
    key: str  # the session key: the cookie a browser holds

    @property
    def cookie(self) -> str:
        return f"sessionid={self.key}"


@pytest.fixture
def login(django_for_stack):
    """`login(username, staff=False)`: that user (made if new, enabled) signed in in a new session."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    def make(username: str, staff: bool = False) -> Login:
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_active, user.is_staff = True, staff
        user.save()  # its password unchanged: the user's other sessions stay valid
        c = Client()
        c.force_login(user)
        return Login(user, c.cookies["sessionid"].value)

    return make


async def opened(stack, path: str, who: Login):
    url = stack.url.replace("http", "ws") + path
    return await websockets.connect(
        url, additional_headers={"Origin": stack.url, "Cookie": who.cookie}, open_timeout=10
    )


async def closed(ws, since: float, timeout: float = 3.0) -> tuple[int | None, float]:
    """The close code the server sent and the seconds from `since` (time.monotonic) until it came."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)  # the live socket receives stats meanwhile
    except websockets.ConnectionClosed as e:
        return (e.rcvd.code if e.rcvd else None), time.monotonic() - since
    except TimeoutError:
        raise AssertionError(f"the socket was still open {timeout} s later") from None


async def stays_open(ws, seconds: float = 1.0) -> bool:
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ws.recv(), left)
    except websockets.ConnectionClosed:
        return False
    return True


async def csrf(client: httpx.AsyncClient, page: str, who: Login) -> tuple[str, str]:
    """A CSRF token from a page's form, and the cookie that goes with it."""
    r = await client.get(page, headers={"Cookie": who.cookie})
    assert r.status_code == 200, (page, r.status_code)
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', r.text).group(1), r.cookies["csrftoken"]


async def post_form(stack, page: str, path: str, who: Login, data: dict) -> tuple[httpx.Response, float]:
    """POST a form as the browser on `page` would; the answer and when it was sent (time.monotonic)."""
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as c:
        token, cookie = await csrf(c, page, who)
        headers = {"Cookie": f"{who.cookie}; csrftoken={cookie}"}
        sent = time.monotonic()
        return await c.post(path, data={**data, "csrfmiddlewaretoken": token}, headers=headers), sent


def test_logout_closes_that_sessions_chat_and_panel_sockets_and_no_others(stack, login):
    admin = login("sock-admin", staff=True)
    elsewhere = login("sock-admin", staff=True)  # the same user in another browser

    async def scenario():
        chat, live = await opened(stack, "/ws/chat/", admin), await opened(stack, "/ws/panel/live/", admin)
        other = await opened(stack, "/ws/chat/", elsewhere)
        r, t0 = await post_form(stack, "/chat/", "/logout/", admin, {})
        assert r.status_code == 302 and r.headers["location"] == "/login/"
        got = [await closed(chat, t0), await closed(live, t0)]
        assert await stays_open(other)
        await other.close()
        return got

    got = asyncio.run(scenario())
    print("logout:", [f"{dt * 1000:.0f} ms" for _, dt in got])
    assert [code for code, _ in got] == [SIGNED_OUT, SIGNED_OUT] and all(dt < 1.0 for _, dt in got), got


def test_disabling_a_user_in_the_panel_closes_their_sockets_and_cancels_the_answer_in_flight(stack, login):
    from appliance import bus
    from appliance.events import Final

    admin, bob, carol = login("sock-admin", staff=True), login("sock-bob"), login("sock-carol")
    r = stack.r()

    async def scenario():
        ws, bystander = await opened(stack, "/ws/chat/", bob), await opened(stack, "/ws/chat/", carol)
        story = {
            "action": "send",
            "text": "Tell a long story about a dragon.",
            "new": {"model": "smollm2", "max_tokens": 400},
        }
        await ws.send(json.dumps(story))
        while json.loads(await asyncio.wait_for(ws.recv(), 60))["t"] != "delta":
            pass
        [rid] = r.zrange(bus.k_queue("smollm2"), 0, -1)  # admitted: the one running
        assert not r.exists(bus.k_cancel(rid))
        resp, t0 = await post_form(
            stack, "/panel/users/", f"/panel/users/{bob.user.pk}/active/", admin, {"active": "0"}
        )
        assert resp.status_code == 302
        code, dt = await closed(ws, t0)
        await asyncio.to_thread(stack.wait_until, lambda: r.exists(bus.k_cancel(rid)), 1.0, 0.01)
        final = await asyncio.to_thread(stack.wait_until, lambda: last_event(r, rid), 5.0, 0.01)
        stopped = time.monotonic() - t0
        assert await stays_open(bystander, 0.5)
        await bystander.close()
        return code, dt, final, stopped

    code, dt, final, stopped = asyncio.run(scenario())
    print(f"disabled: closed in {dt * 1000:.0f} ms, the worker's final event after {stopped * 1000:.0f} ms")
    assert code == SIGNED_OUT and dt < 1.0
    assert isinstance(final, Final) and final.finish_reason == "cancelled" and final.tokens_after_cancel <= 1, final
    assert stopped < 1.0, f"the worker still ran the answer {stopped:.2f} s after the user was disabled"


def last_event(r, rid: str):
    """The request's final or error event once the worker wrote it (`bus.k_events`), else None."""
    from appliance import bus
    from appliance.events import decode

    entries = r.xrevrange(bus.k_events(rid), count=1)
    ev = decode(entries[0][1]["e"]) if entries else None
    return ev if ev is not None and ev.t in ("final", "error") else None


@pytest.mark.parametrize(
    "case",
    ["user deleted", "session deleted", "session deleted by hand", "password changed"],
)
def test_each_end_of_a_grant_closes_the_socket_within_a_second(stack, login, case):
    from django.contrib.sessions.models import Session
    from django.db import connection

    who = login("sock-dave")

    def change():
        if case == "user deleted":
            who.user.delete()
        elif case == "session deleted":  # as `Session.delete()` in a shell does
            Session.objects.get(pk=who.key).delete()
        elif case == "session deleted by hand":  # no signal: the poll finds it
            with connection.cursor() as c:
                c.execute("DELETE FROM django_session WHERE session_key = %s", [who.key])
        elif case == "password changed":
            who.user.save()  # set below: hashing takes a third of a second, not part of the change

    if case == "password changed":
        who.user.set_password("another long passphrase 8")

    async def scenario():
        ws = await opened(stack, "/ws/chat/", who)
        t0 = time.monotonic()
        await asyncio.to_thread(change)
        return await closed(ws, t0)

    code, dt = asyncio.run(scenario())
    print(f"{case}: {dt * 1000:.0f} ms")
    assert code == SIGNED_OUT and dt < 1.0, (code, dt)


def test_losing_staff_closes_the_panel_socket_and_leaves_the_chat_socket(stack, login):
    who = login("sock-gina", staff=True)

    def demote():
        who.user.is_staff = False
        who.user.save()

    async def scenario():
        live, chat = await opened(stack, "/ws/panel/live/", who), await opened(stack, "/ws/chat/", who)
        t0 = time.monotonic()
        await asyncio.to_thread(demote)
        got = await closed(live, t0)
        assert await stays_open(chat)
        await chat.close()
        return got

    code, dt = asyncio.run(scenario())
    print(f"staff removed: {dt * 1000:.0f} ms")
    assert code == SIGNED_OUT and dt < 1.0, (code, dt)


def test_a_session_closes_its_socket_within_a_second_of_expiring(stack, login):
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    who = login("sock-erin")
    expires = timezone.now() + timedelta(seconds=1.5)
    Session.objects.filter(pk=who.key).update(expire_date=expires)

    async def scenario():
        ws = await opened(stack, "/ws/chat/", who)
        code, _ = await closed(ws, time.monotonic(), timeout=5)
        return code, time.time() - expires.timestamp()

    code, late = asyncio.run(scenario())
    print(f"expiry: closed {late * 1000:.0f} ms after the session expired")
    assert code == SIGNED_OUT and 0 <= late < 1.0, (code, late)


def test_a_user_who_signed_out_cannot_open_a_new_socket(stack, login):
    who = login("sock-frank")

    async def scenario():
        ws = await opened(stack, "/ws/chat/", who)
        assert (await post_form(stack, "/chat/", "/logout/", who, {}))[0].status_code == 302
        await closed(ws, time.monotonic())
        with pytest.raises(websockets.InvalidStatus) as e:
            await opened(stack, "/ws/chat/", who)
        return e.value.response.status_code

    assert asyncio.run(scenario()) == 403
