"""Chat sessions in the database: each answered chat request extends its conversation's session.

An API request names no session: it continues the session whose messages (reply included) are exactly
the request's messages before its last one, else it starts a new session. The chat page keeps its
own conversations, with their owners (`webui.chat.conversations`). The prompt-cache reuse happens on
the worker either way (by token prefix).
"""

from __future__ import annotations

import hashlib
import json

from django.db import transaction
from asgiref.sync import sync_to_async

from .models import ChatMessage, ChatSession


def digest(messages: list[dict]) -> str:
    plain = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
    return hashlib.sha256(json.dumps(plain, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


@sync_to_async
def record(source: str, model: str, messages: list[dict], reply: str, usage: dict | None) -> str:
    """Store the exchange; returns the session id."""
    conversation = messages + [{"role": "assistant", "content": reply}]
    with transaction.atomic():
        session = (
            ChatSession.objects.filter(digest=digest(messages[:-1]), model=model, owner=None).first()
            if len(messages) > 1
            else None
        )  # never a chat page's conversation
        if session is None:
            first_user = next((m.get("content") or "" for m in messages if m["role"] == "user"), "")
            session = ChatSession.objects.create(
                model=model, source=source, title=first_user[:80], digest=digest(conversation)
            )
            start = 0
        else:
            start = session.messages.count()
        new = conversation[start:]
        ChatMessage.objects.bulk_create(
            [
                ChatMessage(
                    session=session,
                    index=start + i,
                    role=m["role"],
                    content=m.get("content") or "",
                    **(_usage(usage) if i == len(new) - 1 else {}),
                )
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
