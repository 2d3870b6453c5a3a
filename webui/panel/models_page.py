"""Models: what every worker serves, with pull, verify, delete (after a confirmation page), load, unload and
the default model; a model's details. Plain HTML forms; the page's script follows a pull or a verify live.

Pull and verify are board jobs (`webui.api.board`): the form's POST queues one and redirects to
`?job=ID&worker=W`, which the page follows over `ws/panel/job/W/ID/` (`JobConsumer`: the job's events
as JSON, and `{"cancel": true}` from the page cancels it). Leaving the page does not stop the job.
The others wait for their job and come back with one message: done, or the worker's error.
"""

from __future__ import annotations

import asyncio
import contextlib

from asgiref.sync import async_to_sync
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from appliance import bus
from appliance.events import Error, Final, as_dict
from appliance.tunables import DEFAULT_MODEL

from .. import config
from ..api import board
from ..api.common import ApiError
from ..api.jobs import Job, context_of, redis
from .access import staff_only, staff_scope


async def _live_workers() -> list[dict]:
    return await bus.workers(redis())


def live_workers() -> list[dict]:
    """Every live worker's registration (`bus.workers`), from sync code."""
    return async_to_sync(_live_workers)()


def _models(workers: list[dict]) -> list[dict]:
    """One row per (worker, model): its description, loaded or not, and for a loaded one what runs its
    prefill (`backend`: cpu or rknpu) and why (`backend_reason`: the NPU's self-test, or why not)."""
    rows = []
    for w in workers:
        loaded = {ld["name"]: ld for ld in w.get("loaded", [])}
        for m in w.get("models", []):
            ld = loaded.get(m["name"], {})
            rows.append(
                {
                    **m,
                    "worker": w["name"],
                    "loaded": bool(ld),
                    "backend": ld.get("backend"),
                    "backend_reason": ld.get("backend_reason"),
                }
            )
    return rows


@staff_only
def models(request):
    workers = live_workers()
    job = request.GET.get("job", "")
    follow = {"job": job, "worker": request.GET.get("worker", ""), "what": request.GET.get("what", "")} if job else None
    return render(
        request,
        "webui/panel/models.html",
        {
            "section": "panel",
            "tab": "models",
            "workers": workers,
            "models": _models(workers),
            "follow": follow,
            "default_model": config.current()[DEFAULT_MODEL],
        },
    )


def _fail(request, e: ApiError):
    messages.error(request, str(e))
    return redirect("/panel/models/")


@staff_only
@require_POST
def pull(request):
    source = request.POST.get("source", "").strip()
    try:
        job, name = async_to_sync(board.start_install)(source, request.POST.get("worker") or None)
    except ApiError as e:
        return _fail(request, e)
    if job is None:
        messages.info(request, f"{name} is installed already.")
        return redirect("/panel/models/")
    return redirect(f"/panel/models/?job={job.id}&worker={job.worker}&what=pull+{name}")


@staff_only
@require_POST
def verify(request, worker: str, name: str):
    job = async_to_sync(Job.submit_board)("rkmojo.verify", worker, {"name": name})
    return redirect(f"/panel/models/?job={job.id}&worker={worker}&what=verify+{name}")


@staff_only
def delete(request, name: str):
    """GET: the confirmation page; POST: delete it from every worker."""
    if request.method != "POST":
        return render(request, "webui/panel/delete.html", {"section": "panel", "tab": "models", "name": name})
    try:
        async_to_sync(board.delete)(name)
    except ApiError as e:
        return _fail(request, e)
    if config.current()[DEFAULT_MODEL] == name:
        config.save({DEFAULT_MODEL: None})
    messages.success(request, f"Deleted {name}.")
    return redirect("/panel/models/")


@staff_only
@require_POST
def load(request, name: str):
    unload = request.POST.get("unload") == "1"
    try:
        async_to_sync(board.load)(name, unload=unload)
    except ApiError as e:
        return _fail(request, e)
    messages.success(request, f"{'Unloaded' if unload else 'Loaded'} {name}.")
    return redirect("/panel/models/")


@staff_only
@require_POST
def default(request, name: str):
    config.save({DEFAULT_MODEL: name})
    messages.success(request, f"{name} is the default model.")
    return redirect("/panel/models/")


@staff_only
def detail(request, name: str):
    """A model's details: its context as the chat page counts it (`jobs.context_of`: the configured one and the
    model's maximum), its last verify (`verified`: {at, ok, message}, kept by the worker) among them."""
    workers = live_workers()
    rows = [m for m in _models(workers) if m["name"] == name]
    if not rows:
        raise Http404(f"no worker serves a model named {name!r}")
    worker = next(w for w in workers if w["name"] == rows[0]["worker"])
    return render(
        request,
        "webui/panel/model.html",
        {
            "section": "panel",
            "tab": "models",
            "m": rows[0],
            "rows": rows,
            "experts": expert_layout(name),
            "context": context_of(worker, rows[0]),
            "verified": _verified(rows[0].get("verified")),
        },
    )


def _verified(v: dict | None) -> dict | None:
    """The last verify with its time as a datetime, for the template; `recent`: within the last minute
    (which the template says as "just now", where `timesince` would say "0 minutes")."""
    import datetime
    import time

    if not v or not v.get("at"):
        return None
    at = datetime.datetime.fromtimestamp(v["at"], datetime.timezone.utc)
    return {**v, "at": at, "recent": time.time() - v["at"] < 60}


def expert_layout(name: str) -> dict | None:
    """Experts per layer and the store's expert bytes, read from the store when this machine holds it."""
    from inference.errors import RkmojoError
    from inference.store import Store

    path = settings.MODELS_DIR / name
    if not (path / "manifest.json").is_file():
        return None
    try:
        st = Store(path)
    except (RkmojoError, OSError, ValueError):
        return None
    layers = st.expert_layers
    if not layers:
        return {"moe_layers": 0}
    first = next(iter(layers.values()))
    cfg = st.config
    return {
        "moe_layers": len(layers),
        "experts": first.n_experts,
        "stride": first.stride,
        "bytes": sum(lay.stride * lay.n_experts for lay in layers.values()),
        "top_k": cfg.get("num_experts_per_tok") or cfg.get("top_k_experts") or cfg.get("num_experts_per_token"),
    }


class JobConsumer(AsyncJsonWebsocketConsumer):
    """`ws/panel/job/WORKER/ID/`: a board job's events (`events.as_dict`) from the first; staff only."""

    channel_layer_alias = "none"  # it reads the job's Redis stream; no channel of its own to wait on

    async def connect(self):
        self.task = None
        if not staff_scope(self.scope):
            await self.close()
            return
        kw = self.scope["url_route"]["kwargs"]
        self.job = Job("", bus.board_queue(kw["worker"]), {"id": kw["id"]}, model=None, worker=kw["worker"])
        await self.accept()
        self.task = asyncio.create_task(self._follow())

    async def _follow(self):
        async for ev in self.job.events():
            await self.send_json(as_dict(ev))
            if isinstance(ev, (Final, Error)):
                break

    async def receive_json(self, content, **kwargs):
        if isinstance(content, dict) and content.get("cancel"):
            await bus.cancel(redis(), self.job.id)

    async def disconnect(self, code):
        if self.task is not None and not self.task.done():
            self.task.cancel()  # stop following; the job itself goes on
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
