"""WebSocket consumers. The chat consumer streams a generation's events to the browser page (next issue).

Client → server: {"model", "messages", "session"?, "params"?}; server → client: the worker's events
({"t": "start" | "delta" | "final" | "error", …}); the final event carries the session id to continue
with. Closing the socket cancels the running generation.
Same-origin browser pages only: the socket is wrapped in Channels' origin check in `appliance.asgi`.
A socket needs a logged-in session, or `RKMOJO_CHAT_OPEN` and a client the API key rule lets in
without a key (`key_required`): every way into generation follows that rule. Others are refused at
the handshake (HTTP 403). Messages are checked as HTTP bodies are (`webui.door.load_json`).
"""
from __future__ import annotations

import asyncio
import contextlib

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from appliance.events import Delta, Error, Final, as_dict
from inference.options import OPENAI

from . import config, sessions
from .api.common import ApiError, key_required
from .api.jobs import Job
from .api.params import chat_messages, check_sampling
from .door import load_json


async def may_chat(scope: dict) -> bool:
    """A logged-in user, or (chat without sign-in, `webui.config`) a client that needs no API key."""
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return True
    client = (scope.get("client") or [None])[0]
    eff = await config.acurrent()
    return eff["chat_open"] and not key_required(eff["api_keys"], client)


def error_event(e: ApiError) -> dict:
    """An API error as the `error` event browsers get, the same shape as a worker's (`appliance.events`)."""
    return as_dict(Error(status=e.status, code=e.code, param=e.param, message=str(e)))


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.task: asyncio.Task | None = None
        self.busy = False  # a generation runs (its last event not yet sent)
        if not await may_chat(self.scope):
            await self.close()  # before accept: the handshake is answered 403
            return
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            content = load_json(text_data if text_data is not None else bytes_data)
        except ApiError as e:
            await self.send_json(error_event(e))
            return
        if not isinstance(content, dict):
            await self.send_json(error_event(ApiError(400, "send a JSON object")))
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content, **kwargs):
        if self.busy:
            await self.send_json(error_event(ApiError(409, "a generation is already running")))
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
            await self.send_json(error_event(e))
        finally:
            self.busy = False
            if job is not None:
                await job.close()

    async def disconnect(self, code):
        if self.task and not self.task.done():
            self.task.cancel()  # its `finally` cancels the job: the worker stops at its next token
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
