"""Sessions: every conversation (web and API), viewed and deleted; the prompt-cache files' total size and a
button that clears them (the workers then recompute prompts until they save new ones).

Each row names its owner (`owner`): the chat page user's name, "visitor" for a conversation of chat without
sign-in, "API key NAME" for an API session made with a key, "API" for one made without (or before keys were
recorded). The search matches titles and owners' names.

A conversation's transcript is bounded as the chat page's is (`webui.chat.views`): its newest
`conversations.LAST` messages, "Load earlier messages" above them as a link to `?before=INDEX` that htmx
turns into a request for those messages alone (`_transcript.html`, asked with `HX-Request`)."""

from __future__ import annotations

import shutil

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from ..chat import conversations
from ..chat.render import prepare
from ..models import ChatSession
from .access import staff_only

PAGE = 50


def prompt_cache_usage() -> tuple[int, int]:
    """(files, bytes) of the prompt-cache directory's `.kv` files."""
    files = total = 0
    root = settings.PROMPT_CACHE_DIR
    for kv in root.glob("*/*.kv") if root.is_dir() else ():
        try:
            total += kv.stat().st_size
        except FileNotFoundError:
            continue
        files += 1
    return files, total


def owner(s: ChatSession) -> str:
    """Whose conversation `s` is, in a few words (see the module docstring)."""
    if s.owner is not None:
        return s.owner.get_username()
    if s.source == "web":
        return "visitor (no sign-in)"
    return f"API key {s.api_key.name}" if s.api_key is not None else "API"


@staff_only
def sessions(request):
    q = request.GET.get("q", "").strip()
    rows = ChatSession.objects.select_related("owner", "api_key")
    if q:
        rows = rows.filter(Q(title__icontains=q) | Q(owner__username__icontains=q) | Q(api_key__name__icontains=q))
    page = Paginator(rows, PAGE).get_page(request.GET.get("page"))
    for s in page:
        s.owner_label = owner(s)
    files, size = prompt_cache_usage()
    return render(
        request,
        "webui/panel/sessions.html",
        {"section": "panel", "tab": "sessions", "page": page, "q": q, "cache_files": files, "cache_bytes": size},
    )


@staff_only
def session(request, pk):
    s = get_object_or_404(ChatSession, pk=pk)
    if request.method == "POST":
        s.delete()
        messages.success(request, f"Deleted the conversation {s.title or s.pk}.")
        return redirect("/panel/sessions/")
    before = conversations.before(request.GET)
    msgs, earlier = conversations.window(s.messages.all(), before)
    ctx = {"section": "panel", "tab": "sessions", "s": s, "chat_messages": prepare(msgs), "earlier": earlier}
    if request.headers.get("HX-Request"):  # "Load earlier": these messages alone, put where the link was
        resp = render(request, "webui/panel/_transcript.html", ctx)
    else:
        resp = render(request, "webui/panel/session.html", {**ctx, "later": before is not None})
    patch_vary_headers(resp, ["HX-Request"])
    return resp


@staff_only
@require_POST
def clear_prompt_cache(request):
    root = settings.PROMPT_CACHE_DIR
    files, size = prompt_cache_usage()
    for d in root.iterdir() if root.is_dir() else ():
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
    messages.success(request, f"Cleared {files} prompt-cache file{'s' * (files != 1)} ({size / 2**20:.1f} MiB).")
    return redirect("/panel/sessions/")
