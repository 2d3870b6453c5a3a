"""Which requests a worker takes first: someone waiting on an answer before work nobody watches.

A worker runs one generation at a time and takes the next from its model's queue by priority, then in
the order sent (Celery's Redis transport keeps one list per priority step, `appliance.celery`). A request is
background work when it is one of Open WebUI's task requests (title, tags, follow-ups, search queries:
a user message that opens with "### Task:" and holds the chat as "<chat_history>"), or when it is not
streamed and may run long (max tokens unset or at least `LONG`) and calls no tools. Everything else is
interactive: a streamed answer, the chat page, a tool-call turn (tools offered, or the tools' results to
answer from), a short answer, an embedding. A running request is never interrupted; a waiting interactive
one goes ahead of every waiting background one, and its queue position counts only what goes before it
(`appliance.bus.queued`).
"""

from __future__ import annotations

INTERACTIVE, BACKGROUND = 0, 6  # Celery priorities on Redis: 0 is taken first (steps 0, 3, 6, 9)
LONG = 256  # max tokens from which a non-streamed answer is background work
TASK_OPENING = "### Task:"  # Open WebUI's task prompts (its utils/task.py templates)


def of(payload: dict, *, streamed: bool) -> int:
    """The priority of a generation `payload` (the worker's shape: kind, messages or prompt, params)."""
    if _open_webui_task(payload):
        return BACKGROUND
    params = payload.get("params") or {}
    messages = payload.get("messages") or []
    if streamed or params.get("tools") or (messages and messages[-1].get("role") == "tool"):
        return INTERACTIVE
    if payload.get("kind") not in ("chat", "complete"):
        return INTERACTIVE
    limit = params.get("max_tokens")
    return BACKGROUND if limit is None or limit >= LONG else INTERACTIVE


def _open_webui_task(payload: dict) -> bool:
    for m in payload.get("messages") or ():
        text = m.get("content")
        if m.get("role") == "user" and isinstance(text, str):
            return text.lstrip().startswith(TASK_OPENING) and "<chat_history>" in text
    return False
