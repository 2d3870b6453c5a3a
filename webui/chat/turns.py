"""One chat page action, from the request to the stored answer: the WebSocket's and the plain form's.

    turn = await begin(who, Action(...), client)       # ApiError 400/404 naming the field
    job = await submit(turn, client)                    # the model's queue (404, 429 as ApiError)
    async for out in follow(turn, job): ...            # browser events, the last one final or error

`follow` yields the worker's events as browsers get them (`appliance.events.as_dict`), the status
events included (queued, loading, prefill); `start` carries `dropped_messages` when the worker left the
oldest turns out of the prompt, and `edge`: the index of the message the model's view begins at (the page
marks it; 0: no marker); a `delta` names its `channel` (content, or reasoning: the
model's thinking), a `tool_call` is a piece of a tool call. The `final` event gains `message`: the
stored answer (thinking and tool calls included) rendered on the server with its measurements, and
`context`: tokens used of the model's context.
"""

from __future__ import annotations

import uuid
from typing import AsyncIterator, Literal

from asgiref.sync import sync_to_async
from django.template.loader import render_to_string
from pydantic import BaseModel, ConfigDict, ValidationError

from appliance.events import Delta, Error, Final, Start, as_dict

from appliance import tunables

from .. import config
from ..api.common import ApiError
from ..api.jobs import Job, catalog, context_of
from ..api.params import TRUNCATE
from . import conversations as conv
from .forms import NewChatForm
from .render import message


class Action(BaseModel):
    """A message from the chat page's socket (or its forms)."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["send", "regenerate", "edit", "continue", "stop"]
    session: uuid.UUID | None = None  # none with send: a new conversation, `new` its settings
    text: str | None = None
    index: int | None = None
    new: dict | None = None  # NewChatForm's fields

    @classmethod
    def parse(cls, content) -> "Action":
        try:
            return cls.model_validate(content)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "the message"
            raise ApiError(400, f"{where}: {err['msg']}", param=where) from None


async def models() -> dict[str, dict]:
    """{model name: its description, `context` (the tokens a conversation may hold: `jobs.Context.tokens`,
    the model page's figure too), `configured` and `model_max` (the two it is the smaller of)} over every
    live worker, by name."""
    out = {}
    for name, entries in sorted((await catalog()).items()):
        ctx = context_of(*entries[0])
        out[name] = {**entries[0][1], "context": ctx.tokens, "configured": ctx.configured, "model_max": ctx.model}
    return out


async def begin(who: conv.Who, a: Action) -> conv.Turn:
    if a.session is None:
        if a.action != "send":
            raise ApiError(400, f"{a.action} needs the conversation's id", param="session")
        form = NewChatForm({**(a.new or {}), "text": a.text or ""}, models=list(await models()))
        if not form.is_valid():
            raise form.first_error()
        d = form.cleaned_data
        session = await sync_to_async(conv.create)(who, d["model"], d["system"], d["params"])
    else:
        session = await sync_to_async(_get)(who, a.session)
    try:
        if a.action == "send":
            turn = await sync_to_async(conv.send)(session, a.text or "")
            turn.created = a.session is None
            return turn
        if a.action == "regenerate":
            return await sync_to_async(conv.regenerate)(session)
        if a.action == "edit":
            if a.index is None:
                raise ApiError(400, "edit needs the index of the message", param="index")
            return await sync_to_async(conv.edit)(session, a.index, a.text or "")
        return await sync_to_async(conv.proceed)(session)
    except conv.TurnError as e:
        raise ApiError(400, str(e), param="action") from None


def _get(who, pk):
    from django.http import Http404

    try:
        return conv.get(who, pk)
    except Http404:
        raise ApiError(404, f"conversation {pk} is not one of yours", param="session") from None


async def announce(turn: conv.Turn) -> dict:
    """The `turn` event: the conversation, where the answer goes, the user's message as stored, the
    cut-off answer a continuation extends (and its thinking, if any); for a new conversation its header and list entry too."""
    out = {
        "t": "turn",
        "session": str(turn.session.pk),
        "index": turn.index,
        "prefix": turn.prefix,
        "model": turn.session.model,
    }
    if turn.prefix_reasoning:
        out["prefix_reasoning"] = turn.prefix_reasoning
    if turn.user_index is not None:
        msg = await sync_to_async(turn.session.messages.get)(index=turn.user_index)
        out["user"] = {"index": msg.index, "html": message(turn.session, msg)}
    if turn.created:  # the page was the new-chat form: the conversation's header and its place in the list
        catalog = await models()
        info = catalog.get(turn.session.model)
        ctx = {"session": turn.session, "c": turn.session, "used": 0, "context": (info or {}).get("context")}
        ctx |= {"info": info, "catalog": catalog}
        out["head"] = render_to_string("webui/chat/_head.html", ctx)
        out["item"] = render_to_string("webui/chat/_item.html", ctx)
    return out


async def submit(turn: conv.Turn, client: str | None) -> Job:
    """Queue the turn with the chat page's defaults (Settings: chat_max_tokens, chat_repetition_guard) for
    what its conversation leaves unset, and its oldest turns left out of a prompt that would overflow the
    context (`TRUNCATE`: the worker's policy, `appliance.tasks`)."""
    payload = {**turn.payload, "defaults": tunables.chat_defaults(await config.acurrent()), "truncate": TRUNCATE}
    return await Job.submit("rkmojo.generate", turn.session.model, payload, client=client, names={"prompt": "messages"})


async def follow(turn: conv.Turn, job: Job) -> AsyncIterator[dict]:
    parts: dict[str, list[str]] = {"content": [], "reasoning": []}
    async for ev in job.events(statuses=True):
        out = as_dict(ev)
        if isinstance(ev, Start):
            turn.dropped = ev.dropped_messages or 0
            out["edge"] = turn.edge
        elif isinstance(ev, Delta):
            parts[ev.channel].append(ev.text)
        elif isinstance(ev, Final):
            text, reasoning = "".join(parts["content"]), "".join(parts["reasoning"])
            msg = await sync_to_async(conv.record)(turn, text, ev, reasoning)
            out["message"] = {"index": msg.index, "html": message(turn.session, msg)}
            out["context"] = await context_used(turn, ev)
        yield out


async def summarize(who: conv.Who, pk, client: str | None) -> None:
    """ "Summarize and continue": the model folds the messages the last answer's prompt left out into a
    summary (`conv.summarize`), kept when it ends (`conv.keep_summary`). The summary's room is at most
    `conv.SUMMARY_TOKENS` and a quarter of the context; its prompt is trimmed as a turn's is.

    Raises:
        ApiError: nothing to summarize (400), no worker serves the model (404), the worker's error.
    """
    session = await sync_to_async(_get)(who, pk)
    try:
        s = await sync_to_async(conv.summarize)(session)
    except conv.TurnError as e:
        raise ApiError(400, str(e), param="action") from None
    context = ((await models()).get(session.model) or {}).get("context") or conv.SUMMARY_TOKENS * 4
    params = {**session.params, "max_tokens": min(conv.SUMMARY_TOKENS, context // 4)}
    payload = {"kind": "chat", "model": session.model, "messages": s.messages, "params": params}
    payload |= {"defaults": tunables.chat_defaults(await config.acurrent()), "truncate": TRUNCATE}
    job = await Job.submit("rkmojo.generate", session.model, payload, client=client, names={"prompt": "messages"})
    text = []
    try:
        async for ev in job.events():
            if isinstance(ev, Error):
                raise ApiError.from_event(ev)
            if isinstance(ev, Delta) and ev.channel == "content":
                text.append(ev.text)
    finally:
        await job.close()
    try:
        await sync_to_async(conv.keep_summary)(s, "".join(text))
    except conv.TurnError as e:
        raise ApiError(400, str(e), param="action") from None


async def context_used(turn: conv.Turn, final: Final) -> dict:
    used = (final.usage.prompt_tokens + final.usage.completion_tokens) if final.usage else 0
    info = (await models()).get(turn.session.model) or {}
    return {"used": used, "context": info.get("context")}
