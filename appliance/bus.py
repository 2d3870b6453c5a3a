"""The Redis protocol between the web side and the workers (besides Celery's own broker keys).

Keys (all under `rkmojo:`):
- `worker:NAME` — a worker's registration (JSON: boot id, models it serves, models loaded, the request
  it runs and its state, what it made of the saved `settings`), written every heartbeat with a short
  TTL: a worker that stops answering disappears.
- `seen:MODEL` — the worker that last served a model, kept for minutes: a request for it waits in the
  queue while that worker restarts instead of being refused as an unknown model.
- `gone:NAME` — a worker's clean stop (its host name), kept for `GONE_TTL` and deleted when it registers
  again: the web side tells a model whose worker stopped (404) from one whose worker's registration a
  Redis restart lost (503 until it registers again; `webui.api.jobs.known`).
- `queue:MODEL` — sorted set of the requests admitted for a model (waiting or running), scored by the
  last time their HTTP side renewed its lease. Admission is one Lua script: count, compare, add.
- `req:ID` — a request's description for `/api/ps` (model, kind, priority, client, times).
- `claimed:ID` — when a worker took the request (`claimed`): the queue's order puts it before the waiting ones.
- `events:ID` — the request's event stream (XADD by the worker, XREAD by the web side): ordered and
  replayable, so the web side may start reading after the worker started writing.
- `cancel:ID` — set by the web side when its client went away; the worker checks it before every token.
- `stats:NAME` — a worker's latest `events.WorkerStats`, written once a second with a short TTL; the same
  event is sent to the Channels group `LIVE_GROUP` (message type `live.stats`, field `stats`: the encoded
  event), which the admin panel's live view forwards to browsers.
- `stats-history:NAME` — list of a worker's last `stats.HISTORY` samples (two minutes), each the JSON of the
  few `WorkerStats` fields the live view's charts draw (`stats.CHARTED`), oldest first; the live view sends
  it to a browser at load so that its charts start full.
- `auth` — a pub/sub channel, not a key: `session:KEY` or `user:ID`, published after a commit that deleted
  that session or saved or deleted that user; processes serving sockets then check theirs at once
  (`webui.socket_auth`).
- `throttle:…` — failed sign-ins and API keys per address and user name, each a count whose TTL is the
  time left of its window or lock (`webui.throttle`).
- `settings` — the settings the administrator saved (JSON object, option name → value), written by the
  web side; workers read it at every heartbeat. Environment variables still win.

Events are `appliance.events` types, written and read only through its `encode` and `decode`.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import redis

from . import events

PREFIX = "rkmojo:"
EVENT_TTL = 3600  # an event stream nobody reads vanishes after this long
LEASE = 30.0  # an admitted request whose HTTP side has not renewed it for this long no longer counts


def k_worker(name: str) -> str:
    return f"{PREFIX}worker:{name}"


def k_seen(model: str) -> str:
    return f"{PREFIX}seen:{model}"


def k_gone(worker: str) -> str:
    return f"{PREFIX}gone:{worker}"


def k_queue(model: str) -> str:
    return f"{PREFIX}queue:{model}"


def k_req(req_id: str) -> str:
    return f"{PREFIX}req:{req_id}"


def k_claimed(req_id: str) -> str:
    return f"{PREFIX}claimed:{req_id}"


def k_events(req_id: str) -> str:
    return f"{PREFIX}events:{req_id}"


def k_cancel(req_id: str) -> str:
    return f"{PREFIX}cancel:{req_id}"


def k_stats(worker: str) -> str:
    return f"{PREFIX}stats:{worker}"


def k_stats_history(worker: str) -> str:
    return f"{PREFIX}stats-history:{worker}"


K_SETTINGS = f"{PREFIX}settings"
LIVE_GROUP = "rkmojo-live"  # the Channels group live-view sockets join
AUTH_CHANNEL = f"{PREFIX}auth"  # pub/sub: a session or a user changed; sockets check theirs


def model_queue(model: str) -> str:
    """The Celery queue of a model's generation tasks."""
    return f"model.{model}"


def board_queue(worker: str) -> str:
    """The Celery queue of one worker's control tasks (install, delete, …)."""
    return f"board.{worker}"


def kombu_url(redis_url: str) -> str:
    """The broker URL kombu wants for a redis-py URL (`unix:///x.sock?db=1` → `redis+socket:///x.sock?virtual_host=1`)."""
    u = urllib.parse.urlsplit(redis_url)
    if u.scheme != "unix":
        return redis_url
    db = urllib.parse.parse_qs(u.query).get("db", ["0"])[0]
    return f"redis+socket://{u.path}?virtual_host={db}"


def _retry(cls):
    # a restarting Redis (rkmojo up restarts its private one) is back within a second: a command retries
    # on a new connection with a growing pause, ~1.5 s in all, before its error reaches the caller
    from redis.backoff import ExponentialBackoff

    return cls(ExponentialBackoff(cap=0.5, base=0.05), 5)


def connect(url: str) -> redis.Redis:
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        retry=_retry(Retry),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


def connect_async(url: str):
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry

    return aioredis.Redis.from_url(
        url, decode_responses=True, retry=_retry(Retry), retry_on_error=[redis.ConnectionError, redis.TimeoutError]
    )


# --- admission ---------------------------------------------------------------------------------
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
return 1
"""


async def admit(r, model: str, req_id: str, capacity: int, info: dict) -> bool:
    """Add the request to its model's queue unless `capacity` requests are already there."""
    now = time.time()
    ok = await r.eval(_ADMIT, 1, k_queue(model), now, now - LEASE, capacity, req_id)
    if ok:
        await r.set(k_req(req_id), json.dumps(info), ex=EVENT_TTL)
    return bool(ok)


async def renew(r, model: str, req_id: str) -> None:
    await r.zadd(k_queue(model), {req_id: time.time()}, xx=True)


async def release(r, model: str, req_id: str) -> None:
    async with r.pipeline(transaction=False) as p:
        p.zrem(k_queue(model), req_id)
        p.delete(k_req(req_id))
        await p.execute()


async def queued(r, model: str) -> list[dict]:
    """The live requests of a model with their descriptions, in the order workers take them: those taken
    (`claimed`) first, then the waiting ones by priority (`webui.api.priority`), oldest first."""
    ids = await r.zrangebyscore(k_queue(model), time.time() - LEASE, "+inf")
    return _in_turn(await r.mget([k_req(i) for i in ids] + [k_claimed(i) for i in ids]) if ids else [])


def queued_now(r: redis.Redis, model: str) -> list[dict]:
    """`queued` for a synchronous client (the worker's)."""
    ids = r.zrangebyscore(k_queue(model), time.time() - LEASE, "+inf")
    return _in_turn(r.mget([k_req(i) for i in ids] + [k_claimed(i) for i in ids]) if ids else [])


def claimed(r: redis.Redis, req_id: str) -> None:
    """A worker took the request: it goes before every waiting one in `queued`."""
    r.set(k_claimed(req_id), repr(time.time()), ex=EVENT_TTL)


def _in_turn(raw: list[str | None]) -> list[dict]:
    """`queued`'s order from the requests' descriptions and then their claim times, as MGET returns them."""
    n = len(raw) // 2
    out = []
    for info, at in zip(raw[:n], raw[n:]):
        if info:
            d = json.loads(info)
            out.append((0 if at else 1, float(at) if at else d.get("priority", 0), d.get("created", 0), d))
    return [d for *_, d in sorted(out, key=lambda x: x[:3])]


# --- events ------------------------------------------------------------------------------------
def emit(r: redis.Redis, req_id: str, event: events.Event) -> None:
    """Append one event to the request's stream (worker side)."""
    p = r.pipeline(transaction=False)
    p.xadd(k_events(req_id), {"e": events.encode(event)})
    p.expire(k_events(req_id), EVENT_TTL)
    p.execute()


async def read(r, req_id: str, after: str, block_ms: int) -> list[tuple[str, events.Event]]:
    """Events after stream id `after` ("0" for all), waiting up to `block_ms` for the first.

    Raises:
        events.EventError: an event that is not one of ours.
    """
    res = await r.xread({k_events(req_id): after}, block=block_ms, count=256)
    if not res:
        return []
    return [(eid, events.decode(fields["e"])) for eid, fields in res[0][1]]


async def cancel(r, req_id: str) -> None:
    await r.set(k_cancel(req_id), repr(time.time()), ex=EVENT_TTL)


def cancelled_at(r: redis.Redis, req_id: str) -> float | None:
    """When the web side asked to cancel (worker side), or None."""
    v = r.get(k_cancel(req_id))
    return float(v) if v else None


# --- the worker registry -----------------------------------------------------------------------
SEEN_TTL = 300
GONE_TTL = 3600


def register(r: redis.Redis, name: str, info: dict, ttl: float) -> None:
    p = r.pipeline(transaction=False)
    p.set(k_worker(name), json.dumps(info), px=int(ttl * 1000))
    p.delete(k_gone(name))
    for m in info.get("models", []):
        p.set(k_seen(m["name"]), name, ex=SEEN_TTL)
    p.execute()


def unregister(r: redis.Redis, name: str, boot: str) -> None:
    """A clean stop: the worker and the models it served leave the lists at once."""
    raw = r.get(k_worker(name))
    if raw and json.loads(raw).get("boot") == boot:
        for m in json.loads(raw).get("models", []):
            forget(r, m["name"], name)
        r.delete(k_worker(name))
        r.set(k_gone(name), json.loads(raw).get("hostname") or "", ex=GONE_TTL)


async def gone(r) -> dict[str, str]:
    """{worker name: its host} of the workers that stopped cleanly and have not registered since."""
    out = {}
    async for key in r.scan_iter(match=k_gone("*"), count=100):
        host = await r.get(key)
        if host is not None:
            out[key[len(k_gone("")) :]] = host
    return out


def forget(r: redis.Redis, model: str, worker: str) -> None:
    if r.get(k_seen(model)) == worker:
        r.delete(k_seen(model))


async def seen(r, model: str) -> str | None:
    """The worker that served `model` within the last minutes (it may be restarting), or None."""
    return await r.get(k_seen(model))


async def workers(r) -> list[dict]:
    """Every live worker's registration, by name."""
    out = []
    async for key in r.scan_iter(match=k_worker("*"), count=100):
        raw = await r.get(key)
        if raw:
            out.append(json.loads(raw))
    return sorted(out, key=lambda w: w["name"])


async def worker(r, name: str) -> dict | None:
    raw = await r.get(k_worker(name))
    return json.loads(raw) if raw else None
