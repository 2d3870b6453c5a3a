"""WebSocket consumers. The chat consumer runs the chat page's actions and streams their events back.

Client → server (`webui.chat.turns.Action`): {"action": "send", "session"?, "text", "new"?} (no session:
a new conversation with `new`'s model, system prompt and sampling, checked as the page's form is),
{"action": "regenerate" | "continue", "session"}, {"action": "edit", "session", "index", "text"},
{"action": "stop"}.
Server → client: first {"t": "turn", "session", "index", "user"?, "prefix", "prefix_reasoning"?}
(`turns.announce`), then the worker's events as they are (`appliance.events`: queued, loading, start,
prefill, delta {text, channel: content | reasoning}, tool_call {index, id, name?, arguments}, final,
error); the final event carries the stored answer rendered on the server (`message`) and the context used.
`stop` asks the worker to stop at its next token: the answer so far is stored (finish_reason
cancelled) and the socket stays open. Closing the socket cancels the running generation; so does the end
of its session (logout, a new password, the user disabled, …: `webui.socket_auth` closes it with 4401).
Same-origin browser pages only: the socket is wrapped in Channels' origin check in `appliance.asgi`.
A socket needs a logged-in session, or `RKMOJO_CHAT_OPEN` and a client the API key rule lets in
without a key (`key_required`): every way into generation follows that rule. Others are refused at
the handshake (HTTP 403). Messages are checked as HTTP bodies are (`webui.door.load_json`).
A conversation is reached only through its owner (`webui.chat.conversations.owned`).
"""

from __future__ import annotations

import asyncio
import contextlib

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from appliance.events import Error, as_dict

from . import config
from .api.common import ApiError
from .chat import conversations, turns
from .door import load_json


async def may_chat(scope: dict) -> bool:
    """The chat page's rule (`conversations.may_chat`) for a socket, with the settings in effect now."""
    return conversations.may_chat(scope.get("user"), (scope.get("client") or [None])[0], await config.acurrent())


def error_event(e: ApiError) -> dict:
    """An API error as the `error` event browsers get, the same shape as a worker's (`appliance.events`)."""
    return as_dict(Error(status=e.status, code=e.code, param=e.param, message=str(e)))


class ChatConsumer(AsyncJsonWebsocketConsumer):
    # no channel layer: a chat socket talks to its own job only. (With one, channels_redis's 5 s blocking
    # read races redis-py 8's default 5 s socket timeout and kills the socket after 5 idle seconds.)
    channel_layer_alias = "chat has none"

    async def connect(self):
        self.task: asyncio.Task | None = None
        self.job = None  # the running generation's, once submitted
        self.stopping = False  # stop arrived before the job was submitted
        self.busy = False  # an action runs (its last event not yet sent)
        if not await may_chat(self.scope):
            await self.close()  # before accept: the handshake is answered 403
            return
        self.who = conversations.Who.of(self.scope.get("user"), self.scope.get("session"))
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
        try:
            action = turns.Action.parse(content)
        except ApiError as e:
            await self.send_json(error_event(e))
            return
        if action.action == "stop":
            self.stopping = self.busy
            if self.job is not None:
                await self.job.stop()
            return
        if self.busy:
            await self.send_json(error_event(ApiError(409, "a generation is already running; stop it first")))
            return
        self.busy, self.stopping = True, False
        self.task = asyncio.create_task(self._run(action))

    async def _run(self, action: turns.Action):
        try:
            if self.who.user is None and not self.who.visitor:
                raise ApiError(403, "this browser has no session yet: open the chat page first")
            turn = await turns.begin(self.who, action)
            await self.send_json(await turns.announce(turn))
            self.job = await turns.submit(turn, (self.scope.get("client") or [None])[0])
            if self.stopping:
                await self.job.stop()
            async for out in turns.follow(turn, self.job):
                if out["t"] in ("final", "error"):
                    self.busy = False
                await self.send_json(out)
        except ApiError as e:
            self.busy = False
            await self.send_json(error_event(e))
        finally:
            self.busy = False
            job, self.job = self.job, None
            if job is not None:
                await job.close()

    async def disconnect(self, code):
        if self.task and not self.task.done():
            # the worker is told first: a cancellation that lands in a Redis read can be lost (redis-py 8.2
            # on Python 3.11, under load), and the task would then follow the answer to its end
            self.stopping = True
            if self.job is not None:
                await self.job.stop()
            self.task.cancel()  # its `finally` closes the job: released from the queue
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
