"""Chat sessions in the database: each answered chat request extends its conversation's session.

An API request names no session: it continues the session whose messages (reply included) are exactly
the request's messages up to its last assistant message (what follows it is new: the user's next
question, or the results of the tools that message called), else it starts a new session. The chat
page keeps its own conversations, with their owners (`webui.chat.conversations`). The prompt-cache
reuse happens on the worker either way (by token prefix).

A message is stored as `ChatMessage` fields (`stored`) and given back to the worker in the engine's
spelling (`for_worker`):

    stored:  {role, content, reasoning, tool_calls: [{id, name, arguments: dict}], tool_call_id, name}
    worker:  {role, content, tool_calls?: [{id, type: "function", function: {name, arguments: dict}}],
              tool_call_id?, name?}                     (reasoning is never sent back: templates drop it)

`stored` reads the worker's spelling, the flat one, and the APIs' names for thinking (`reasoning_content`,
`thinking`) and for a tool result's tool (`tool_name`).
"""

from __future__ import annotations

import hashlib
import json

from asgiref.sync import sync_to_async
from django.db import transaction

from .models import ChatMessage, ChatSession

REASONING_KEYS = ("reasoning", "reasoning_content", "thinking")


def tool_call(call) -> dict:
    """One tool call as stored: {id, name, arguments: dict}, from the engine's spelling
    ({id, type, function: {name, arguments}}), the flat one, or an event's model (`ToolCallOut`).

    Raises:
        ValueError: arguments that are neither an object nor the JSON text of one.
    """
    if hasattr(call, "model_dump"):
        call = call.model_dump()
    fn = call.get("function") or call
    args = fn.get("arguments")
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"tool call {fn.get('name')!r}: arguments must be a JSON object, not {type(args).__name__}")
    return {"id": str(call.get("id") or ""), "name": str(fn.get("name") or ""), "arguments": args}


def stored(m: dict) -> dict:
    """A message of a request (or a reply) as `ChatMessage` fields: role, content, reasoning, tool_calls,
    tool_call_id, name."""
    reasoning = next((m[k] for k in REASONING_KEYS if isinstance(m.get(k), str) and m[k]), "")
    return {
        "role": m["role"],
        "content": m.get("content") or "",
        "reasoning": reasoning if m["role"] == "assistant" else "",
        "tool_calls": [tool_call(c) for c in m.get("tool_calls") or ()],
        "tool_call_id": str(m.get("tool_call_id") or "") if m["role"] == "tool" else "",
        "name": str(m.get("name") or m.get("tool_name") or "") if m["role"] == "tool" else "",
    }


def for_worker(m: ChatMessage) -> dict:
    """A stored message as the worker's payload spells it (the engine's form); its reasoning left out."""
    out = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out.update({k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name)) if v})
    return out


def digest(messages: list[dict]) -> str:
    """Of the messages' roles, texts and tool calls (name and arguments: clients may rename the ids)."""
    plain = []
    for m in map(stored, messages):
        p = {"role": m["role"], "content": m["content"]}
        if m["tool_calls"]:
            p["tool_calls"] = [[c["name"], json.dumps(c["arguments"], sort_keys=True)] for c in m["tool_calls"]]
        plain.append(p)  # without tool calls the same text as before they were stored: old sessions still match
    return hashlib.sha256(json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def name_tool_results(rows: list[dict]) -> list[dict]:
    """Stored messages (`stored`'s fields) with each tool result's tool named from the call it answers,
    where the client named none (OpenAI's tool messages carry only the call's id)."""
    names = {}
    for m in rows:
        names.update({c["id"]: c["name"] for c in m["tool_calls"] if c["id"]})
        if m["role"] == "tool" and not m["name"]:
            m["name"] = names.get(m["tool_call_id"], "")
    return rows


def _known(messages: list[dict]) -> list[dict] | None:
    """The request's messages up to its last assistant message (a stored session ends with one), or None."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    return None if last is None else messages[: last + 1]


@sync_to_async
def record(
    source: str,
    model: str,
    messages: list[dict],
    reply: str,
    usage: dict | None,
    *,
    reasoning: str = "",
    tool_calls=(),
    api_key=None,
) -> str:
    """Store the exchange; returns the session id. `messages`: the worker's payload messages; `reply`,
    `reasoning`: the answer's text and thinking; `tool_calls`: the calls it made (`tool_call` reads them);
    `api_key`: the request's `ApiKey` (None without one), kept with a session this exchange starts."""
    answer = {"role": "assistant", "content": reply, "reasoning": reasoning, "tool_calls": list(tool_calls or ())}
    conversation = messages + [answer]
    rows = name_tool_results(list(map(stored, conversation)))
    known = _known(messages)
    with transaction.atomic():
        session = (
            ChatSession.objects.filter(digest=digest(known), model=model, owner=None).first() if known else None
        )  # never a chat page's conversation
        if session is None:
            first_user = next((m.get("content") or "" for m in messages if m["role"] == "user"), "")
            session = ChatSession.objects.create(
                model=model,
                source=source,
                title=str(first_user)[:80],
                digest=digest(conversation),
                api_key=api_key,
            )
            start = 0
        else:
            start = session.messages.count()
        new = rows[start:]
        ChatMessage.objects.bulk_create(
            [
                ChatMessage(session=session, index=start + i, **m, **(_usage(usage) if i == len(new) - 1 else {}))
                for i, m in enumerate(new)
            ]
        )
        session.digest = digest(conversation)
        session.save(update_fields=["digest", "updated"])
    return str(session.pk)


def _usage(usage: dict | None) -> dict:
    if not usage:
        return {}
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": usage.get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }
