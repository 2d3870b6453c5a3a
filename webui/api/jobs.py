"""The web side of a request: route it to a worker, admit it to the queue, follow its event stream.

    job = await Job.submit("rkmojo.generate", model, payload, client=addr)   # 404 / 429 as ApiError
    try:
        async for ev in job.events():   # Start, Delta…, Final — or one Error (`appliance.events`),
            ...                         # with the status events (Queued, Loading, PrefillProgress) between
    finally:
        await job.close()               # the client left before the end: the worker stops at its next token

Consumers dispatch on the event's type: the HTTP APIs ignore the status events, the chat socket forwards
them. `Queued` is the one event made here rather than by the worker: until a worker claims the request,
`events()` yields the number of requests ahead of it in its model's queue (`bus.queued`: those running,
then the waiting ones by priority, oldest first) each time it changes, the first value included (a
request claimed at once sees none).

A model no live worker lists is a 404, unless Redis restarted (empty) within `RESTART_WINDOW` seconds and the
model is known: installed in this machine's models directory while this machine's worker has not registered
yet, or listed within `KNOWN_FOR` seconds by workers none of which has registered since. Such a model is a
503 with Retry-After while its workers register again, not a 404 a client would take as final; a worker
that registered again without it has deleted it meanwhile: 404.

While it waits, `events()` renews the request's lease in the queue and watches the worker: a worker
that took the request and then vanished (killed, its registration expired or replaced by a restarted
worker's) ends the stream with an error event instead of a hang. So does losing Redis: a broken
connection, or a stream that vanished because Redis restarted empty, is an error event (503
`redis_lost`); the next request reconnects (`bus.connect_async` retries with backoff).
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from appliance import bus
from appliance.events import Claim, Error, Event, Final, Loading, PrefillProgress, Queued, Start

from .. import config
from .common import ApiError
from .priority import INTERACTIVE

_CLIENTS: dict = {}
STATUS = (Queued, Loading, PrefillProgress)  # what a request is waiting for; not part of its answer
QUEUE_POLL_MS = 250  # how often a request not yet claimed looks at its place in the queue
KNOWN_FOR = 600.0  # s a model listed by a worker stays known while that worker has not registered again
RESTART_WINDOW = 120  # s after Redis started in which a known model no worker lists is a 503, not a 404
_KNOWN: dict[str, tuple[float, frozenset]] = {}  # model → (when listed, by which workers), in this process


def redis():
    """The async Redis client of the running event loop."""
    loop = asyncio.get_running_loop()
    r = _CLIENTS.get(loop)
    if r is None:
        _CLIENTS.clear()  # a new loop (tests, reloads): the old clients belong to a closed loop
        r = _CLIENTS[loop] = bus.connect_async(settings.REDIS_URL)
    return r


async def catalog() -> dict[str, list[dict]]:
    """{model name: [(worker registration, model description), …]} over every live worker."""
    out: dict[str, list] = {}
    for w in await bus.workers(redis()):
        for m in w.get("models", []):
            out.setdefault(m["name"], []).append((w, m))
    now = time.monotonic()
    for name, found in out.items():
        _KNOWN[name] = (now, frozenset(w["name"] for w, _ in found))
    return out


async def known(name: str) -> bool:
    """Whether `name`, which no live worker lists, should come back: Redis started within the last
    `RESTART_WINDOW` seconds (it restarted, empty), and the model is installed in this machine's models
    directory while no worker of this machine has registered yet, or was listed lately by workers none of
    which has registered since (one that has, without it, deleted it meanwhile). A worker that stopped
    cleanly since (`bus.gone`) will not register again soon: its models are not known."""
    r = redis()
    if (await r.info("server")).get("uptime_in_seconds", RESTART_WINDOW) >= RESTART_WINDOW:
        return False  # no restart: a model no worker lists is gone
    live, stopped = await bus.workers(r), await bus.gone(r)
    here = socket.gethostname()
    installed = "/" not in name and not name.startswith(".") and (Path(settings.MODELS_DIR) / name / "manifest.json")
    if installed and installed.is_file() and here not in {w.get("hostname") for w in live} | set(stopped.values()):
        return True
    at, by = _KNOWN.get(name, (float("-inf"), frozenset()))
    waiting = by - set(stopped)
    return time.monotonic() - at <= KNOWN_FOR and bool(waiting) and not (by & {w["name"] for w in live})


async def find_model(name: str) -> tuple[list[dict], dict]:
    """The workers serving `name` and its description (a restarting worker counts).

    Raises:
        ApiError: 404 no live worker serves it; 503 with Retry-After when it is known (`known`) and its
            workers have not registered yet.
    """
    if not isinstance(name, str) or not name:
        raise ApiError(400, "you must provide a model parameter", param="model", code="missing_required_parameter")
    found = (await catalog()).get(name)
    if not found and (worker := await bus.seen(redis(), name)):
        return [{"name": worker}], {"name": name}  # its worker is restarting: the request waits for it
    if not found and await known(name):
        wait = settings.RKMOJO["RETRY_AFTER"]
        raise ApiError(
            503,
            f"The model '{name}' is installed but no worker has registered it yet (workers register again within "
            f"seconds of a restart); retry after {wait} s",
            param="model",
            code="model_unavailable",
            headers={"Retry-After": str(wait)},
        )
    if not found:
        raise ApiError(
            404,
            f"The model '{name}' does not exist or is not served by any worker; GET /v1/models lists the ones that are",
            param="model",
            code="model_not_found",
        )
    return [w for w, _ in found], found[0][1]


@dataclass(frozen=True)
class Context:
    """A model's context on a worker, both figures named.

    `configured` is the KV cache length the worker opens the model with (RKMOJO_CONTEXT, Settings →
    Context); `model` the model's own maximum (its config's max_position_embeddings; None when it says
    none). `tokens`, the smaller, is what a conversation may hold, prompt and answer: the figure the
    chat page's gauge and the engine's overflow errors use.
    """

    configured: int
    model: int | None

    @property
    def tokens(self) -> int:
        return min(self.configured, self.model) if self.model else self.configured


def context_of(worker: dict, desc: dict) -> Context:
    """The context of the model `desc` (a worker's description of it) on `worker` (its registration): as
    the loaded engine was opened, or as the worker's next load will open it."""
    loaded = next((ld for ld in worker.get("loaded", []) if ld.get("name") == desc.get("name")), None)
    if loaded is not None:
        configured = loaded.get("configured_context") or loaded.get("context")
    else:
        configured = worker.get("context")
    if not configured:  # a worker of an earlier version: the engine's default
        from inference.engine import EngineConfig

        configured = EngineConfig.__dataclass_fields__["context"].default
    return Context(int(configured), int(desc.get("context") or 0) or None)


async def model_context(name: str) -> Context:
    """The context of `name` on the first live worker serving it.

    Raises:
        ApiError: as `find_model`.
    """
    found = (await catalog()).get(name)
    if not found:
        await find_model(name)  # raises the 404 or 503 of a model no worker lists
        raise ApiError(404, f"The model '{name}' is not served by any worker", param="model")
    worker, desc = found[0]
    return context_of(worker, desc)


class Job:
    def __init__(
        self,
        task: str,
        queue: str,
        payload: dict,
        *,
        model: str | None,
        worker: str | None,
        names: dict[str, str] | None = None,
    ):
        self.task, self.queue, self.payload = task, queue, payload
        self.names = names or {}  # the engine's name of a field → this API's (prompt → messages)
        self.model, self.worker = model, worker
        self.id = payload["id"]
        self.done = False  # no more events to read
        self.settled = False  # the worker sent its last event, or close() asked it to stop
        self.claim: Claim | None = None
        self.status: Queued | Loading | PrefillProgress | None = None  # the latest, for pages that show it
        self.after = "0"  # the last stream id read: `events()` may be called again and goes on from there

    @classmethod
    async def submit(
        cls,
        task: str,
        model: str,
        payload: dict,
        *,
        client: str | None = None,
        refused_status: int = 429,
        names: dict[str, str] | None = None,
        priority: int = INTERACTIVE,
    ) -> "Job":
        """Admit a generation request for `model` and hand it to the model's queue at `priority`
        (`webui.api.priority`). `names`: how this API spells the fields the worker's errors name
        (`{"prompt": "messages"}` for a chat).

        Raises:
            ApiError: 404 unknown model; `refused_status` (429 or 503) with Retry-After when the queue is full.
        """
        workers, _ = await find_model(model)
        rid = payload.setdefault("id", uuid.uuid4().hex)
        # each worker's generations at once (`parallel`) and its queue, as saved in the panel
        limit = (await config.acurrent())["queue_limit"]
        capacity = sum(int(w.get("parallel") or 1) + limit for w in workers)
        info = {"id": rid, "model": model, "kind": payload.get("kind"), "client": client, "created": time.time()}
        info["priority"] = payload["priority"] = priority
        if not await bus.admit(redis(), model, rid, capacity, info):
            wait = settings.RKMOJO["RETRY_AFTER"]
            raise ApiError(
                refused_status,
                f"{model} has {capacity} requests running or waiting, the most it queues; retry after {wait} s",
                code="queue_full",
                headers={"Retry-After": str(wait)},
            )
        job = cls(task, bus.model_queue(model), payload, model=model, worker=None, names=names)
        await job._send(priority)
        return job

    @classmethod
    async def submit_board(cls, task: str, worker: str, payload: dict) -> "Job":
        """Hand a control task (install, delete, verify) to one worker's board queue."""
        payload.setdefault("id", uuid.uuid4().hex)
        job = cls(task, bus.board_queue(worker), payload, model=None, worker=worker)
        await job._send()
        return job

    async def _send(self, priority: int = INTERACTIVE) -> None:
        from appliance.celery import app

        send = sync_to_async(app.send_task, thread_sensitive=False)
        try:
            await send(self.task, args=[self.payload], queue=self.queue, priority=priority)
        except BaseException:
            await self.close()
            raise

    async def events(self, *, statuses: bool = False) -> AsyncIterator[Event]:
        """The request's events from the first; ends after Final/Error.

        Claim and the status events (Queued, Loading, PrefillProgress) are kept on the job; the status
        events are yielded too with `statuses` (the chat page shows them while it waits).
        """
        r = redis()
        waiting_since = checked = time.monotonic()
        while not self.done:
            try:
                waiting = self.model is not None and self.claim is None
                batch = await bus.read(r, self.id, self.after, QUEUE_POLL_MS if waiting else 1000)
                if (task := asyncio.current_task()) is not None and task.cancelling():
                    # redis-py 8 loses about 1 cancellation in 300 inside a blocking read: the client is
                    # gone, so stop here rather than follow the answer to its end
                    raise asyncio.CancelledError
                problem = None
                if time.monotonic() - checked > 0.25:
                    checked = time.monotonic()
                    if await self._redis_restarted(r):
                        batch, problem = [], redis_lost(None)
                if not batch and not problem:
                    if self.model:
                        await bus.renew(r, self.model, self.id)
                    problem = await self._check_worker(r, waiting_since)
                if not batch and not problem and waiting:
                    batch = await self._queue_position(r)
            except (RedisConnectionError, RedisTimeoutError) as e:
                batch, problem = [], redis_lost(e)
            if not batch:
                if problem:
                    self.done = True
                    yield problem
                continue
            for eid, ev in batch:
                self.after = eid
                if isinstance(ev, Claim):
                    self.claim = ev
                    continue
                if isinstance(ev, STATUS):
                    self.status = ev
                    if statuses:
                        yield ev
                    continue
                if isinstance(ev, Error) and ev.param in self.names:
                    ev = ev.model_copy(update={"param": self.names[ev.param]})
                if isinstance(ev, (Final, Error)):
                    self.done = self.settled = True
                yield ev
                if self.done:
                    return

    async def _queue_position(self, r) -> list[tuple[str, Queued]]:
        """[(the last stream id read, Queued)] when the requests ahead of this one changed in number, else []."""
        ids = [q.get("id") for q in await bus.queued(r, self.model)]
        if self.id not in ids:
            return []  # released, or its lease lapsed: nothing to tell
        position = ids.index(self.id)
        if isinstance(self.status, Queued) and self.status.position == position:
            return []
        return [(self.after, Queued(position=position))]

    async def first(self) -> Event:
        """The first event past the status events: `Start` (the request is valid and running) or `Error`."""
        async for ev in self.events():
            if not isinstance(ev, STATUS):
                return ev
        raise ApiError(500, "the request's event stream ended without an event")

    async def started(self) -> Start:
        """Wait (through the queue) for the start event; an error event instead raises it as an ApiError.

        The HTTP status is decided here: a request the worker refused (prompt too long, …) is still a 4xx.
        """
        try:
            ev = await self.first()
        except BaseException:
            await self.close()
            raise
        if isinstance(ev, Error):
            await self.close()
            raise ApiError.from_event(ev)
        if not isinstance(ev, Start):
            await self.close()
            raise ApiError(500, f"the worker sent {ev.t!r} before start")
        return ev

    async def _redis_restarted(self, r) -> bool:
        """Whether Redis restarted under this request: it keeps no data, so the request's keys are gone.

        The connection retries hide the restart itself, and the worker's next event would recreate the
        stream after a gap: the request's description (or, for board jobs, its stream) tells instead.
        """
        if self.model:  # EXPIRE also keeps the description of a long request alive; 0: the key is gone
            return not await r.expire(bus.k_req(self.id), bus.EVENT_TTL)
        return self.claim is not None and not await r.exists(bus.k_events(self.id))

    async def _check_worker(self, r, waiting_since: float) -> Error | None:
        if self.claim is not None:
            w = await bus.worker(r, self.claim.worker)
            if w is None or w.get("boot") != self.claim.boot:
                why = "restarted" if w is not None else "stopped answering"
                return Error(
                    status=503,
                    code="worker_lost",
                    message=f"the worker {self.claim.worker} {why} while serving this request; retry it",
                )
            return None
        if self.worker is not None:
            alive = await bus.worker(r, self.worker) is not None
        else:
            alive = any(m["name"] == self.model for w in await bus.workers(r) for m in w.get("models", []))
        if not alive and time.monotonic() - waiting_since > settings.RKMOJO["NO_WORKER_TIMEOUT"]:
            return Error(
                status=503,
                code="no_worker",
                message=f"no worker serving {self.model or self.worker} came up within "
                f"{settings.RKMOJO['NO_WORKER_TIMEOUT']:.0f} s; retry later",
            )
        return None

    async def stop(self) -> None:
        """Ask the worker to stop at its next token; the stream goes on to a Final (finish_reason cancelled)."""
        if not self.settled:
            await bus.cancel(redis(), self.id)

    async def close(self) -> None:
        """Cancel the request unless it finished, and drop it from its queue. Safe to call twice.

        A cancellation that arrives meanwhile (a page closed, a client gone while this runs) does not cut
        it short: both steps still run, then the cancellation goes on. Skipping the release would leave
        the request counted in its model's queue until the entry expired.
        """
        r = redis()
        steps = []
        if not self.settled:  # also after an error of our own (Redis lost): the worker may still run
            self.done = self.settled = True
            steps.append(bus.cancel(r, self.id))
        if self.model:
            steps.append(bus.release(r, self.model, self.id))
        cancelled = False
        for step in steps:
            try:
                await asyncio.shield(step)
            except asyncio.CancelledError:
                cancelled = True
            except (RedisConnectionError, RedisTimeoutError):
                pass  # without Redis there is nothing to cancel: the worker's stream broke too
        if cancelled:
            raise asyncio.CancelledError


def redis_lost(e: Exception | None) -> Error:
    """The error event of a request whose events were lost with the Redis connection."""
    why = f" ({type(e).__name__})" if e is not None else " (it restarted)"
    return Error(
        status=503,
        code="redis_lost",
        message=f"the appliance lost its Redis connection{why} while serving this request; retry it",
    )
