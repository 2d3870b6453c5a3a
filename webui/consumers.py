"""WebSocket consumers. The chat consumer streams a generation's events to the browser page (next issue).

Client → server: {"model", "messages", "session"?, "params"?}; server → client: the worker's events
({"t": "start" | "delta" | "final" | "error", …}); the final event carries the session id to continue
with. Closing the socket cancels the running generation.
Same-origin browser pages only: the socket is wrapped in Channels' origin check in `appliance.asgi`.
"""
from __future__ import annotations

import asyncio
import contextlib

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from appliance.events import Delta, Error, Final, as_dict
from inference.options import OPENAI

from . import sessions
from .api.common import ApiError
from .api.jobs import Job
from .api.params import chat_messages, check_sampling


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.task: asyncio.Task | None = None
        self.busy = False  # a generation runs (its last event not yet sent)
        await self.accept()

    async def receive_json(self, content, **kwargs):
        if self.busy:
            await self.send_json({"t": "error", "status": 409, "message": "a generation is already running"})
            return
        self.busy = True
        self.task = asyncio.create_task(self._generate(content))

    async def _generate(self, content: dict):
        job = None
        try:
            model = content.get("model")
            payload = {"kind": "chat", "model": model, "messages": chat_messages(content.get("messages") or []),
                       "params": check_sampling(dict(content.get("params") or {}), OPENAI), "session": content.get("session")}
            job = await Job.submit("rkmojo.generate", model, payload, names={"prompt": "messages"})
            parts = []
            async for ev in job.events():
                out = as_dict(ev)
                if isinstance(ev, Delta):
                    parts.append(ev.text)
                elif isinstance(ev, Final):
                    out["session"] = await sessions.record("web", model, payload["messages"], "".join(parts),
                                                           ev.usage_dict(), content.get("session"))
                if isinstance(ev, (Final, Error)):
                    self.busy = False
                await self.send_json(out)
        except ApiError as e:
            self.busy = False
            await self.send_json({"t": "error", "status": e.status, "param": e.param, "message": str(e)})
        finally:
            self.busy = False
            if job is not None:
                await job.close()

    async def disconnect(self, code):
        if self.task and not self.task.done():
            self.task.cancel()  # its `finally` cancels the job: the worker stops at its next token
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
