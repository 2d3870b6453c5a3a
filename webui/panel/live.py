"""The live view: one card per worker from its `WorkerStats` (`appliance.events`), pushed to the page.

Workers write their stats once a second to Redis (`bus.k_stats`), with a two-minute ring of what the
charts draw (`bus.k_stats_history`, `appliance.stats.remember`), and send them to the Channels group
`bus.LIVE_GROUP` (`live.stats`). The page renders the latest stats on the server and hands the script each
worker's ring (`live-history`), so that the charts start full. Then `LiveConsumer` (`ws/panel/live/`,
staff only) sends, for every worker, its ring and then its latest stats at connect (a socket that
reconnects after a gap fills it), and forwards the group's messages, at most `MAX_HZ` per worker (a worker
faster than that has its latest sample sent at the next slot; the ones in between are dropped).

Messages are `events.as_dict(WorkerStats)` (`"t": "stats"`) and, at connect, `{"t": "history", "worker":
NAME, "points": [{at, tokens_per_s, ttft, expert_hit_rate, disk_mb_per_s}, …]}` (`stats.CHARTED`, oldest
first). The socket closes with 4401 when its session ends or its user loses staff (`webui.socket_auth`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from asgiref.sync import async_to_sync
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.shortcuts import render

from appliance import bus, stats
from appliance.events import EventError, WorkerStats, as_dict, decode

from ..api.jobs import redis
from .access import staff_only, staff_scope

log = logging.getLogger("rkmojo.panel")
MAX_HZ = 2.0


async def latest_stats(r) -> list[WorkerStats]:
    """Every worker's latest stats in Redis, by worker name (unreadable ones left out, and logged)."""
    keys = sorted([k async for k in r.scan_iter(match=bus.k_stats("*"), count=100)])
    out = []
    for raw in await r.mget(keys) if keys else []:
        ev = _decode(raw) if raw else None
        if ev is not None:
            out.append(ev)
    return out


async def recent(r, workers: list[str]) -> dict[str, list[dict]]:
    """The ring of each of `workers`: their charted samples of the last two minutes, oldest first."""
    pipe = r.pipeline(transaction=False)
    for w in workers:
        pipe.lrange(bus.k_stats_history(w), 0, -1)
    return {w: stats.history(raw) for w, raw in zip(workers, await pipe.execute())} if workers else {}


def _decode(raw: str) -> WorkerStats | None:
    try:
        ev = decode(raw)
    except EventError as e:
        log.warning("live view: %s", e)
        return None
    return ev if isinstance(ev, WorkerStats) else None


@staff_only
def live(request):
    async def snapshot():
        r = redis()  # the client of the loop the coroutine runs in
        latest = await latest_stats(r)
        return latest, await bus.workers(r), await recent(r, [s.worker for s in latest])

    latest, workers, history = async_to_sync(snapshot)()
    return render(
        request,
        "webui/panel/live.html",
        {
            "section": "panel",
            "tab": "live",
            "stats": latest,
            "workers": workers,
            "initial": [as_dict(s) for s in latest],
            "history": history,
        },
    )


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """`ws/panel/live/`: staff only (others are refused at the handshake, 403); sends WorkerStats as JSON."""

    async def connect(self):
        self.sent: dict[str, float] = {}  # worker → monotonic time of its last message
        self.pending: dict[str, WorkerStats] = {}  # worker → the latest sample waiting for its slot
        if not staff_scope(self.scope):
            await self.close()
            return
        await self.channel_layer.group_add(bus.LIVE_GROUP, self.channel_name)
        await self.accept()
        r = redis()
        latest = await latest_stats(r)
        history = await recent(r, [s.worker for s in latest])
        for ev in latest:
            await self.send_json({"t": "history", "worker": ev.worker, "points": history[ev.worker]})
            await self._send(ev)

    async def disconnect(self, code):
        await self.channel_layer.group_discard(bus.LIVE_GROUP, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        pass  # the page only listens

    async def live_stats(self, message: dict):
        ev = _decode(message.get("stats", ""))
        if ev is None:
            return
        wait = self.sent.get(ev.worker, -1e9) + 1 / MAX_HZ - time.monotonic()
        if wait <= 0:
            await self._send(ev)
            return
        if ev.worker not in self.pending:
            asyncio.get_running_loop().call_later(wait, lambda: asyncio.ensure_future(self._flush(ev.worker)))
        self.pending[ev.worker] = ev

    async def _flush(self, worker: str):
        ev = self.pending.pop(worker, None)
        if ev is not None:
            await self._send(ev)

    async def _send(self, ev: WorkerStats):
        self.sent[ev.worker] = time.monotonic()
        await self.send_json(as_dict(ev))
