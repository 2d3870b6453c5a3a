"""The chat page: the conversation list, one conversation, and the plain-form actions.

Every page works without JavaScript: messages are rendered here (`render.prepare`), and sending,
regenerating, editing and continuing are form posts to `act`, which runs the turn to its end before
it redirects. With JavaScript (`static/webui/chat.js`) the same forms go over the WebSocket instead
and the answer streams. Only the list's newest `PAGE` conversations are loaded (`?n=` for more).

A conversation's page shows its newest `conversations.LAST` messages. Above them "Load earlier
messages" is a link to `?before=INDEX` (the page of the ones before), which htmx turns into a request
for the same URL with `HX-Request`, answered with those messages alone (`_messages.html`) to put in its
place. Exports stream (`StreamingHttpResponse` over `_in_pieces`); an import the file limits refuse
(`conversations.read_export`) is the chat page again, status 400, saying which limit and what to do.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib import messages as flash
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_POST

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


def _page(request, who: conv.Who, template: str, catalog: dict | None = None, status: int = 200, **ctx) -> HttpResponse:
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
        status=status,
    )


def _new_chat(request, who, status: int = 200) -> HttpResponse:
    catalog = async_to_sync(turns.models)()
    form = NewChatForm(models=list(catalog))
    first = next(iter(catalog.values()), {})
    return _page(
        request,
        who,
        "webui/chat/new.html",
        catalog,
        status,
        form=form,
        sampling=form.sampling(model_defaults(first.get("generation"))),
    )


@require_GET
@chat_view
def index(request, who):
    if request.GET.get("refused") == "too-large":  # an import over the body limit (webui.door.TOO_LARGE_PAGES)
        flash.error(
            request,
            f"that file is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE / 2**20:g} MiB, the most this "
            "appliance takes in one request (RKMOJO_MAX_REQUEST_BYTES): import it in parts (each "
            "conversation's own Export link gives a file of one), or raise the limit",
        )
    return _new_chat(request, who)


@require_GET
@chat_view
def conversation(request, who, pk):
    session = conv.get(who, pk)
    before = conv.before(request.GET)
    msgs, earlier = conv.window(session.messages.all(), before)
    prepare(msgs)
    if request.headers.get("HX-Request"):  # "Load earlier": these messages alone, put where the link was
        resp = render(request, "webui/chat/_messages.html", {"session": session, "msgs": msgs, "earlier": earlier})
    else:
        last = msgs[-1] if before is None and msgs else conv.last_message(session)  # the conversation's
        answered = last is not None and last.role == "assistant"
        resp = _page(
            request,
            who,
            "webui/chat/conversation.html",
            session=session,
            msgs=msgs,
            earlier=earlier,
            later=before is not None,
            used=(last.prompt_tokens or 0) + (last.completion_tokens or 0) if answered else 0,
            can_continue=answered and last.finish_reason in ("length", "cancelled"),
            can_regenerate=last is not None,
        )
    patch_vary_headers(resp, ["HX-Request"])
    return resp


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


async def _in_pieces(parts: Iterator[str], size: int = 64 * 1024):
    """The text of `parts` (a generator that reads the database), encoded, in pieces of about `size`
    characters, each made in Django's thread for sync code: the event loop never waits on the database
    or on the formatting, and a sync iterator would have been read whole first (Django under ASGI)."""

    def take() -> bytes:
        buf, n = [], 0
        for part in parts:
            buf.append(part)
            n += len(part)
            if n >= size:
                break
        return "".join(buf).encode()

    try:
        while piece := await sync_to_async(take)():
            yield piece
    finally:  # a client gone mid-way: the database read ends here, not when the generator is collected
        await sync_to_async(parts.close)()


def _to_export(who: conv.Who, pk) -> list:
    return [conv.get(who, pk)] if pk else list(conv.owned(who).order_by("-updated"))


@require_GET
@chat_view
async def export(request, who, pk=None):
    sessions = await sync_to_async(_to_export)(who, pk)
    name = f"chat-{pk}" if pk else "chats"
    if request.GET.get("format") == "md":
        parts, kind, ext = conv.export_markdown(sessions), "text/markdown; charset=utf-8", "md"
    else:
        parts, kind, ext = conv.export_json(sessions), "application/json", "json"
    resp = StreamingHttpResponse(_in_pieces(parts), content_type=kind)
    resp["Content-Disposition"] = f'attachment; filename="{name}.{ext}"'
    return resp


def _refused(request, who, message: str) -> HttpResponse:
    """The chat page again, status 400, saying why the import took nothing."""
    flash.error(request, message)
    return _new_chat(request, who, status=400)


@require_POST
@chat_view
def import_(request, who):
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return _refused(request, who, "choose a JSON file exported from this page")
    try:
        data = conv.read_export(form.cleaned_data["file"].read())
    except conv.ImportRefused as e:
        return _refused(request, who, str(e))
    made = conv.import_(who, data)
    flash.success(request, f"imported {len(made)} conversation{'s' if len(made) != 1 else ''}")
    return HttpResponseRedirect(f"/chat/{made[0].pk}/" if len(made) == 1 else "/chat/")
