"""Sockets die with their session: a signed-in socket lives exactly as long as its cookie would get in.

A chat or panel socket is let in at the handshake by its session (Channels' `AuthMiddlewareStack`). From
then on `SessionBound`, wrapped around each socket route (`webui.routing`), ends it when any of these
stops holding, which are the checks an HTTP request with the same cookie meets:

- its session row exists and has not expired (logout flushes it; `Session.delete()` from a shell or a
  future "sign out everywhere", `clearsessions`, SQL by hand delete it; its `expire_date` passes);
- its user exists and is active (the panel disables, the admin deletes);
- its user's password is the one of connect time: the session's auth hash is an HMAC of the password
  field, and a session key keeps its hash for life (`login` and `update_session_auth_hash` give a new
  key), so "the hash still matches" is "the field is unchanged", compared as strings, no HMAC per check;
- a panel socket's user (`staff=True`) is still staff.

Ending a socket: the client gets close code `SIGNED_OUT` (4401), which the pages turn into "Signed out —
sign in again" with a link to the login page (`chat.js`, `panel-live.js`); the consumer gets
`websocket.disconnect` at once, so its own cleanup runs: the chat consumer cancels a generation in flight
(`Job.close` sets `cancel:ID`: the worker stops before its next token; the partial answer is not stored,
as when a tab closes). What the client sends after that is dropped. Visitors' sockets
(`RKMOJO_CHAT_OPEN`, no user) are not bound.

How it is noticed, in each process that serves sockets (one `Watch` per event loop, running while it
has sockets):
- **Nudges.** After the commit that deletes a session row or saves or deletes a user, a receiver
  publishes `session:KEY` or `user:ID` on `bus.AUTH_CHANNEL`, from whichever process made the change
  (daphne for logout and the panel, a shell, a test). A watch with a socket of that session or user
  checks at once. Measured on the test stack (real daphne, a real client, 2 shared cores), from the start
  of the change to the close frame: logout (the POST) 20–50 ms, disabled in the panel (the POST) 30–90
  ms, user or session deleted 10–35 ms, password saved 30–80 ms, staff removed 10–30 ms.
- **The poll**, the backstop for what sends no signal: expiry, `QuerySet.update`, SQL by hand, a lost
  nudge (Redis restarting). Every `CHECK_EVERY` seconds one query for the sessions and one for the users
  of all the watch's sockets, on a thread of its own with its own connection (not the thread the sync
  views share, which a slow page would hold). A check costs 0.5 ms for 1 socket, 0.6 ms for 10, 1.1 ms
  for 100 (SQLite, one EPYC core; reopening the connection each time doubled it): 0.1–0.2 % of a core
  at two a second. Measured: a session deleted by SQL closed after ~0.5 s, an expiry 20–360 ms after
  its `expire_date`; the bound is `CHECK_EVERY` plus a check.

Why not a Channels group per session and per user: the chat consumer runs without a channel layer, a
group member expires after a day (a panel left open would stop hearing), and the signal cannot decide
alone (a user saved: disabled? new password? a new `last_login`?). Here a nudge only says "look now";
the database decides, in one place. `user_logged_out` is not hooked: logout's flush deletes the row after
the signal, and that delete is what the watch must see. A deleted session that had already expired
sends no nudge (`clearsessions` deletes thousands; their sockets ended at expiry; the receiver makes it
load the rows it deletes: 5000 in 0.16 s instead of 0.03 s). A failing check (the
database locked past its timeout) is logged and retried at the next tick: sockets stay open meanwhile,
as pages would fail rather than sign out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
from importlib import import_module
from typing import NamedTuple

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from appliance import bus

log = logging.getLogger("rkmojo.sockets")
SIGNED_OUT = 4401  # the close code of a socket whose session ended (4000-4999: the application's own)
CHECK_EVERY = 0.5  # seconds between polls: a session that expires is closed within this (plus a check)


def session_model():
    """The model of the session engine's rows.

    Raises:
        ImproperlyConfigured: an engine that keeps no rows (cache, signed cookies): nothing to watch.
    """
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):
        raise ImproperlyConfigured(
            f"SESSION_ENGINE={settings.SESSION_ENGINE!r} keeps no session rows, so sockets cannot end with their "
            "session (webui.socket_auth); use django.contrib.sessions.backends.db or cached_db"
        )
    return store.get_model_class()


class UserRow(NamedTuple):
    is_active: bool
    is_staff: bool
    password: str


@dataclasses.dataclass(frozen=True)
class Grant:
    """What let a socket in: its session key, and its user as it was at the handshake."""

    session_key: str
    user_id: int
    password: str = dataclasses.field(repr=False)  # the user's password field then (the module docstring)
    staff: bool  # a panel socket: it also ends when its user loses staff

    @classmethod
    def of(cls, scope: dict, staff: bool) -> Grant | None:
        """The grant of a socket's scope (after `AuthMiddlewareStack`), or None for a visitor's."""
        user, session = scope.get("user"), scope.get("session")
        if user is None or not user.is_authenticated or session is None or not session.session_key:
            return None
        return cls(session.session_key, user.pk, user.password, staff)

    def broken(self, session_alive: bool, user: UserRow | None) -> str | None:
        """Why the grant no longer holds, or None while it does."""
        if not session_alive:
            return "session ended"
        if user is None:
            return "user deleted"
        if not user.is_active:
            return "user disabled"
        if user.password != self.password:
            return "password changed"
        if self.staff and not user.is_staff:
            return "no longer staff"
        return None


def broken(grants: list[Grant]) -> dict[Grant, str]:
    """The grants that no longer hold, with why: two indexed queries whatever their number (sync)."""
    alive = set(
        session_model()
        .objects.filter(session_key__in={g.session_key for g in grants}, expire_date__gt=timezone.now())
        .values_list("session_key", flat=True)
    )
    users = {
        pk: UserRow(*row)
        for pk, *row in get_user_model()
        .objects.filter(pk__in={g.user_id for g in grants})
        .values_list("pk", "is_active", "is_staff", "password")
    }
    verdicts = {g: g.broken(g.session_key in alive, users.get(g.user_id)) for g in grants}
    return {g: why for g, why in verdicts.items() if why}


# the checks' own thread, with its own database connection kept open between checks (reopening it each
# time doubled a check's cost); a connection that failed is dropped and the next check opens another
_DB_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rkmojo-socket-checks")


def _broken_on_own_connection(grants: list[Grant]) -> dict[Grant, str]:
    try:
        return broken(grants)
    except DatabaseError:
        connection.close()
        raise


class Watch:
    """One event loop's bound sockets, checked every `CHECK_EVERY` seconds and when nudged."""

    def __init__(self, redis_url: str):
        self.redis_url = redis_url
        self.sockets: set[_Socket] = set()
        self.nudged = asyncio.Event()
        self.task: asyncio.Task | None = None

    def add(self, sock: _Socket) -> None:
        self.sockets.add(sock)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def discard(self, sock: _Socket) -> None:
        self.sockets.discard(sock)  # the task ends at its next tick once none are left

    async def _run(self) -> None:
        listener = asyncio.create_task(self._listen())
        try:
            while self.sockets:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.nudged.wait(), CHECK_EVERY)
                self.nudged.clear()
                await self._check()
        finally:
            listener.cancel()

    async def _check(self) -> None:
        socks = list(self.sockets)
        if not socks:
            return
        try:
            grants = [s.grant for s in socks]
            ended = await asyncio.get_running_loop().run_in_executor(_DB_THREAD, _broken_on_own_connection, grants)
        except Exception:
            log.exception("checking %d sockets' sessions failed; trying again in %s s", len(socks), CHECK_EVERY)
            return
        doomed = [(s, ended[s.grant]) for s in socks if s.grant in ended]
        for s, why in doomed:
            log.info("closing a socket of user %s: %s", s.grant.user_id, why)
        await asyncio.gather(*(s.end() for s, _ in doomed))

    async def _listen(self) -> None:
        """Nudges from `bus.AUTH_CHANNEL`; reconnects after a lost Redis (the poll covers the gap)."""
        while True:
            r = bus.connect_async(self.redis_url)
            try:
                async with r.pubsub() as ps:
                    await ps.subscribe(bus.AUTH_CHANNEL)
                    while True:
                        msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if msg and msg["type"] == "message" and self._ours(msg["data"]):
                            self.nudged.set()
            except (redis.RedisError, OSError) as e:
                log.warning("socket nudges: %s; listening again in 1 s (sessions are still polled)", e)
                await asyncio.sleep(1.0)
            finally:
                await r.aclose()

    def _ours(self, nudge: str) -> bool:
        kind, _, ident = nudge.partition(":")
        if kind == "session":
            return any(s.grant.session_key == ident for s in self.sockets)
        return kind == "user" and any(str(s.grant.user_id) == ident for s in self.sockets)


_WATCH: dict = {}


def watch() -> Watch:
    """The running event loop's watch (daphne has one loop; each test's `asyncio.run` its own)."""
    loop = asyncio.get_running_loop()
    w = _WATCH.get(loop)
    if w is None:
        _WATCH.clear()  # a new loop: the old watch belongs to a closed one
        w = _WATCH[loop] = Watch(settings.REDIS_URL)
    return w


class _Socket:
    """One bound connection between the server and the consumer: passes messages both ways until `end`."""

    def __init__(self, grant: Grant, receive, send):
        self.grant, self._receive, self._send = grant, receive, send
        self.ended = asyncio.Event()
        self.pending: asyncio.Future | None = None  # the server's receive, kept across the consumer's calls

    async def send(self, message: dict) -> None:
        if self.ended.is_set():
            return  # the client has had its close
        if message["type"] == "websocket.accept":
            watch().add(self)
        elif message["type"] == "websocket.close":
            watch().discard(self)
        await self._send(message)

    async def receive(self) -> dict:
        if self.pending is None:
            self.pending = asyncio.ensure_future(self._receive())
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({self.pending, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if self.ended.is_set():
            return {"type": "websocket.disconnect", "code": SIGNED_OUT}
        message, self.pending = self.pending.result(), None
        return message

    async def end(self) -> None:
        """Close the client's socket with `SIGNED_OUT`; the consumer's next receive is a disconnect."""
        if self.ended.is_set():
            return
        self.ended.set()
        watch().discard(self)
        with contextlib.suppress(Exception):  # the client may have gone meanwhile
            await self._send({"type": "websocket.close", "code": SIGNED_OUT})

    def release(self) -> None:
        watch().discard(self)
        if self.pending is not None:
            self.pending.cancel()


class SessionBound:
    """ASGI middleware for a socket route: a signed-in socket ends with its session (the module docstring).

    Args:
        app: the consumer's ASGI application (`Consumer.as_asgi()`), inside `AuthMiddlewareStack`.
        staff: the route is the panel's: the socket also ends when its user loses staff.
    """

    def __init__(self, app, *, staff: bool = False):
        self.app, self.staff = app, staff

    async def __call__(self, scope, receive, send):
        grant = Grant.of(scope, self.staff)
        if grant is None:
            return await self.app(scope, receive, send)
        sock = _Socket(grant, receive, send)
        try:
            return await self.app(scope, sock.receive, sock.send)
        finally:
            sock.release()


# --- nudges: sent after the commit that changed a session or a user ----------------------------------
@functools.cache
def _publisher() -> redis.Redis:
    # one quick try (and one on a new connection, for a Redis that restarted): logout must not wait for
    # Redis's backoff, and a lost nudge only means the poll closes the socket
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 1)
    )


def _publish(nudge: str) -> None:
    try:
        _publisher().publish(bus.AUTH_CHANNEL, nudge)
    except redis.RedisError as e:
        log.warning("could not nudge sockets (%s): %s; the poll closes them within %s s", nudge, e, CHECK_EVERY)


def _nudge(nudge: str, using: str) -> None:
    transaction.on_commit(functools.partial(_publish, nudge), using=using)


def _session_deleted(sender, instance, using, **kwargs):
    if instance.expire_date > timezone.now():  # an expired session's sockets were closed at its expiry
        _nudge(f"session:{instance.session_key}", using)


def _user_saved(sender, instance, created, update_fields, using, **kwargs):
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return  # a new user has no sockets; a login's `last_login` changes nothing that binds one
    _nudge(f"user:{instance.pk}", using)


def _user_deleted(sender, instance, using, **kwargs):
    _nudge(f"user:{instance.pk}", using)


def connect_signals() -> None:
    """Connect the receivers (`WebuiConfig.ready`, in every process: whichever makes a change nudges)."""
    user = get_user_model()
    post_delete.connect(_session_deleted, sender=session_model(), dispatch_uid="rkmojo-socket-session")
    post_save.connect(_user_saved, sender=user, dispatch_uid="rkmojo-socket-user-saved")
    post_delete.connect(_user_deleted, sender=user, dispatch_uid="rkmojo-socket-user-deleted")
