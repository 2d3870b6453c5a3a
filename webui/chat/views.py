"""The chat page: the conversation list, one conversation, and the plain-form actions.

Every page works without JavaScript: messages are rendered here (`render.prepare`), and sending,
regenerating, editing and continuing are form posts to `act`, which runs the turn to its end before
it redirects. With JavaScript (`static/webui/chat.js`) the same forms go over the WebSocket instead
and the answer streams. Only the list's newest `PAGE` conversations are loaded (`?n=` for more).
"""

from __future__ import annotations

import functools
import json

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.contrib import messages as flash
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from ..api.common import ApiError
from . import conversations as conv
from . import turns
from .forms import ImportForm, NewChatForm, RenameForm, model_defaults
from .render import ALLOWED, prepare

PAGE = 60


def _login(request) -> HttpResponse:
    from django.contrib.auth.views import redirect_to_login

    return redirect_to_login(request.get_full_path())


def chat_view(view):
    """The chat page's door: a signed-in user, or with RKMOJO_CHAT_OPEN a client that needs no API key
    (given a session, which its conversations hang on). Others go to the sign-in page."""

    def who(request, user) -> conv.Who | None:
        if not conv.may_chat(user, request.META.get("REMOTE_ADDR")):
            return None
        if not user.is_authenticated and not request.session.session_key:
            request.session.save()
        return conv.Who.of(user, request.session)

    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(request, *args, **kwargs):
            w = await sync_to_async(who)(request, await request.auser())
            return _login(request) if w is None else await view(request, w, *args, **kwargs)

        return async_wrapper

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        w = who(request, request.user)
        return _login(request) if w is None else view(request, w, *args, **kwargs)

    return wrapper


def _page(request, who: conv.Who, template: str, catalog: dict | None = None, **ctx) -> HttpResponse:
    q = request.GET.get("q", "").strip()[:200]
    try:
        n = max(PAGE, min(int(request.GET.get("n", PAGE)), 10000))
    except ValueError:
        n = PAGE
    chats = conv.listing(who, q, n + 1)
    catalog = async_to_sync(turns.models)() if catalog is None else catalog
    if ctx.get("session"):
        ctx["context"] = (catalog.get(ctx["session"].model) or {}).get("context")
    config = {
        "session": str(ctx["session"].pk) if ctx.get("session") else None,
        "allowed": {k: sorted(v) for k, v in ALLOWED.items()},
        "models": {
            name: {"context": d.get("context"), "defaults": model_defaults(d.get("generation"))}
            for name, d in catalog.items()
        },
    }
    return render(
        request,
        template,
        {
            "section": "chat",
            "chats": chats[:n],
            "more": n + PAGE if len(chats) > n else None,
            "q": q,
            "config": config,
            "catalog": catalog,
            **ctx,
        },
    )


@require_GET
@chat_view
def index(request, who):
    catalog = async_to_sync(turns.models)()
    form = NewChatForm(models=list(catalog))
    first = next(iter(catalog.values()), {})
    return _page(
        request,
        who,
        "webui/chat/new.html",
        catalog,
        form=form,
        sampling=form.sampling(model_defaults(first.get("generation"))),
    )


@require_GET
@chat_view
def conversation(request, who, pk):
    session = conv.get(who, pk)
    msgs = prepare(list(session.messages.order_by("index")))
    last = msgs[-1] if msgs else None
    used = (last.prompt_tokens or 0) + (last.completion_tokens or 0) if last and last.role == "assistant" else 0
    return _page(
        request,
        who,
        "webui/chat/conversation.html",
        session=session,
        msgs=msgs,
        used=used,
        can_continue=last is not None and last.role == "assistant" and last.finish_reason in ("length", "cancelled"),
        can_regenerate=last is not None,
    )


@require_POST
@chat_view
async def act(request, who, pk=None):
    """A turn from a plain form post: runs to the end of the answer, then back to the conversation."""
    post = request.POST
    new = {k: post.get(k) for k in NewChatForm.base_fields if k != "text"} if pk is None else None
    try:
        action = turns.Action.parse(
            {
                "action": post.get("action", "send"),
                "session": pk,
                "text": post.get("text"),
                "index": post.get("index") or None,
                "new": new,
            }
        )
        turn = await turns.begin(who, action)
    except ApiError as e:
        await sync_to_async(flash.error)(request, str(e))
        return HttpResponseRedirect(f"/chat/{pk}/" if pk else "/chat/")
    job = None
    try:
        job = await turns.submit(turn, request.META.get("REMOTE_ADDR"))
        async for out in turns.follow(turn, job):
            if out["t"] == "error":
                await sync_to_async(flash.error)(request, out["message"])
    except ApiError as e:
        await sync_to_async(flash.error)(request, str(e))
    finally:
        if job is not None:
            await job.close()
    return HttpResponseRedirect(f"/chat/{turn.session.pk}/#m{turn.index}")


@require_POST
@chat_view
def rename(request, who, pk):
    session = conv.get(who, pk)
    form = RenameForm(request.POST)
    if form.is_valid():
        session.title = form.cleaned_data["title"]
        session.save(update_fields=["title"])
    return HttpResponseRedirect(f"/chat/{pk}/")


@require_POST
@chat_view
def delete(request, who, pk):
    conv.get(who, pk).delete()
    return HttpResponseRedirect("/chat/")


@require_GET
@chat_view
def export(request, who, pk=None):
    sessions = [conv.get(who, pk)] if pk else list(conv.owned(who).prefetch_related("messages"))
    name = f"chat-{pk}" if pk else "chats"
    if request.GET.get("format") == "md":
        resp = HttpResponse(conv.markdown(sessions), content_type="text/markdown; charset=utf-8")
        resp["Content-Disposition"] = f'attachment; filename="{name}.md"'
        return resp
    resp = HttpResponse(conv.export(sessions).model_dump_json(indent=1), content_type="application/json")
    resp["Content-Disposition"] = f'attachment; filename="{name}.json"'
    return resp


@require_POST
@chat_view
def import_(request, who):
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        flash.error(request, "choose a JSON file exported from this page")
        return HttpResponseRedirect("/chat/")
    try:
        data = conv.Export.model_validate(json.loads(form.cleaned_data["file"].read()))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the file"
        flash.error(request, f"that file is not a chat export: {where}: {err['msg']}")
        return HttpResponseRedirect("/chat/")
    except ValueError as e:
        flash.error(request, f"that file is not a chat export: {str(e).splitlines()[0]}")
        return HttpResponseRedirect("/chat/")
    made = conv.import_(who, data)
    flash.success(request, f"imported {len(made)} conversation{'s' if len(made) != 1 else ''}")
    return HttpResponseRedirect(f"/chat/{made[0].pk}/" if len(made) == 1 else "/chat/")
