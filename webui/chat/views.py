"""The chat page: the conversation list, one conversation, presets, and the plain-form actions.

Every page works without JavaScript: messages are rendered here (`render.prepare`), and sending,
regenerating, editing and continuing are form posts to `act`, which runs the turn to its end before
it redirects. With JavaScript (`static/webui/chat.js`) the same forms go over the WebSocket instead
and the answer streams. Only the list's newest `PAGE` conversations are loaded (`?n=` for more).

A conversation's page shows its newest `conversations.LAST` messages. Above them "Load earlier
messages" is a link to `?before=INDEX` (the page of the ones before), which htmx turns into a request
for the same URL with `HX-Request`, answered with those messages alone (`_messages.html`) to put in its
place. Exports stream (`StreamingHttpResponse` over `_in_pieces`); an import the file limits refuse
(`conversations.read_export`) is the chat page again, status 400, saying which limit and what to do.

The list pins (`pin`: JSON for `conversation-list.js`, else a redirect back) and acts on the conversations
ticked in it (`bulk`: delete them, or export them as one file through the same stream as Export). Presets
(`webui.chat.presets`) have their page (`/chat/presets/`: yours, the built-ins, a form), fill a new chat's
form (`/chat/?preset=KEY`), and apply to, or are saved from, a conversation (`preset_apply`, `preset_save`).
A conversation's model badge switches its model (`switch_model`: an imported one whose model is not
installed opens with the picker showing); its settings set the answer length (`answer_length`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib import messages as flash
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from .. import config
from ..api.common import ApiError
from . import conversations as conv
from . import presets, turns
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
    pinned, others = conv.listing(who, q, n + 1)
    catalog = async_to_sync(turns.models)() if catalog is None else catalog
    if ctx.get("session"):
        ctx["info"] = catalog.get(ctx["session"].model)
        ctx["context"] = (ctx["info"] or {}).get("context")
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
            "chats": pinned + others[:n],
            "more": n + PAGE if len(others) > n else None,
            "q": q,
            "config": config,
            "catalog": catalog,
            **ctx,
        },
        status=status,
    )


def _new_chat(request, who, status: int = 200) -> HttpResponse:
    catalog = async_to_sync(turns.models)()
    key = request.GET.get("preset", "")
    preset = presets.find(who, key) if key else None  # someone else's: 404
    form = NewChatForm(models=list(catalog), initial=preset.fields() if preset else None)
    first = next(iter(catalog.values()), {})
    choices = presets.available(who)
    return _page(
        request,
        who,
        "webui/chat/new.html",
        catalog,
        status,
        form=form,
        sampling=form.sampling(model_defaults(first.get("generation"))),
        presets=choices,
        preset=preset,
        preset_data={p.key: p.fields() for p in choices},
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
        edge = conv.edge(session, conv.last_message(session))
        ctx = {"session": session, "msgs": msgs, "earlier": earlier, "edge": edge, "summary_at": _summary_at(session)}
        resp = render(request, "webui/chat/_messages.html", ctx)
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
            edge=conv.edge(session, last),
            summary_at=_summary_at(session),
            presets=presets.available(who),
            current=presets.Choice("", "", session.system, session.params),
            default_max_tokens=config.current()["chat_max_tokens"],
        )
    patch_vary_headers(resp, ["HX-Request"])
    return resp


def _summary_at(session) -> int | None:
    """The message the summary's block goes before (None: no summary)."""
    return None if session.summary_upto is None else session.summary_upto + 1


@require_POST
@chat_view
async def summarize(request, who, pk):
    """ "Summarize and continue": runs to the end of the summary, then back to the conversation."""
    try:
        await turns.summarize(who, pk, request.META.get("REMOTE_ADDR"))
    except ApiError as e:
        await sync_to_async(flash.error)(request, str(e))
        return HttpResponseRedirect(f"/chat/{pk}/")
    return HttpResponseRedirect(f"/chat/{pk}/#summary")


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


def _download(sessions: list, fmt: str | None, name: str) -> StreamingHttpResponse:
    """`sessions` as one streamed file: Markdown (`fmt` "md") or JSON, the format import reads."""
    if fmt == "md":
        parts, kind, ext = conv.export_markdown(sessions), "text/markdown; charset=utf-8", "md"
    else:
        parts, kind, ext = conv.export_json(sessions), "application/json", "json"
    resp = StreamingHttpResponse(_in_pieces(parts), content_type=kind)
    resp["Content-Disposition"] = f'attachment; filename="{name}.{ext}"'
    return resp


@require_GET
@chat_view
async def export(request, who, pk=None):
    sessions = await sync_to_async(_to_export)(who, pk)
    return _download(sessions, request.GET.get("format"), f"chat-{pk}" if pk else "chats")


# --- the list: pin, and several at once ------------------------------------------------------------
def _back(request, default: str = "/chat/") -> str:
    """Where a list action returns: the chat page it was sent from (the form's `next`), else `default`."""
    target = request.POST.get("next", "")
    ok = target.startswith("/chat/") and url_has_allowed_host_and_scheme(target, {request.get_host()})
    return target if ok else default


def _wants_json(request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@require_POST
@chat_view
def pin(request, who, pk):
    """Pin (`pin=1`) or unpin (`pin=0`) a conversation. JSON for the page's script, else back to the page."""
    session = conv.get(who, pk)
    try:
        conv.pin(session, request.POST.get("pin") == "1")
    except conv.TurnError as e:
        if _wants_json(request):
            return JsonResponse({"error": str(e)}, status=409)
        flash.error(request, str(e))
    if _wants_json(request):
        return JsonResponse({"pinned": session.pinned is not None})
    return HttpResponseRedirect(_back(request, f"/chat/{pk}/"))


BULK = ("delete", "export-json", "export-md")


@require_POST
@chat_view
def bulk(request, who):
    """The conversations ticked in the list (`ids`): deleted, or exported as one file (`action`)."""
    action = request.POST.get("action")
    if action not in BULK:
        flash.error(request, f"unknown action {action!r}: choose one of {', '.join(BULK)}")
        return HttpResponseRedirect(_back(request))
    chosen = list(conv.chosen(who, request.POST.getlist("ids")))
    if not chosen:
        flash.error(request, "tick one or more conversations in the list first")
        return HttpResponseRedirect(_back(request))
    if action != "delete":
        return _download(chosen, action.removeprefix("export-"), "chats")
    conv.owned(who).filter(pk__in=[s.pk for s in chosen]).delete()
    flash.success(request, f"deleted {len(chosen)} conversation{'s' if len(chosen) != 1 else ''}")
    back = _back(request)
    return HttpResponseRedirect("/chat/" if any(str(s.pk) in back for s in chosen) else back)


# --- presets ---------------------------------------------------------------------------------------
def _presets_page(request, who, form: presets.PresetForm, editing=None, status: int = 200) -> HttpResponse:
    return _page(
        request,
        who,
        "webui/chat/presets.html",
        status=status,
        form=form,
        sampling=form.sampling({}),
        editing=editing,
        builtin=presets.BUILTIN,
        mine=[p for p in presets.available(who) if not p.builtin],
    )


def _saved(request, who, form: presets.PresetForm, pk: int | None = None, editing=None) -> HttpResponse:
    """Save a posted preset form; the page again (400) saying why if it cannot be."""
    if form.is_valid():
        d = form.cleaned_data
        try:
            p, new = presets.save(who, d["name"], d["system"], d["params"], pk)
        except presets.PresetError as e:
            form.add_error("name", str(e))
        else:
            flash.success(request, f"{'saved' if new else 'updated'} the preset “{p.name}”")
            return HttpResponseRedirect("/chat/presets/")
    return _presets_page(request, who, form, editing, status=400)


@require_http_methods(["GET", "POST"])
@chat_view
def presets_page(request, who):
    """Every preset `who` may use, and a form for a new one (`?from=KEY`: filled from that preset)."""
    if request.method == "POST":
        return _saved(request, who, presets.PresetForm(request.POST))
    key = request.GET.get("from", "")
    base = presets.find(who, key) if key else None
    initial = {**base.fields(), "name": f"{base.name} (mine)" if base.builtin else base.name} if base else None
    return _presets_page(request, who, presets.PresetForm(initial=initial))


@require_http_methods(["GET", "POST"])
@chat_view
def preset_edit(request, who, pk):
    p = presets.own(who, pk)
    if request.method == "POST":
        return _saved(request, who, presets.PresetForm(request.POST), pk, editing=p)
    choice = presets.find(who, str(p.pk))
    return _presets_page(request, who, presets.PresetForm(initial={**choice.fields(), "name": p.name}), editing=p)


@require_POST
@chat_view
def preset_delete(request, who, pk):
    p = presets.own(who, pk)
    p.delete()
    flash.success(request, f"deleted the preset “{p.name}”")
    return HttpResponseRedirect("/chat/presets/")


@require_POST
@chat_view
def preset_apply(request, who, pk):
    """Give the conversation a preset's system prompt and sampling (`preset`: its key)."""
    session = conv.get(who, pk)
    choice = presets.find(who, request.POST.get("preset", ""))
    presets.apply(session, choice)
    flash.success(request, f"applied the preset “{choice.name}”: the next answer uses its system prompt and sampling")
    return HttpResponseRedirect(f"/chat/{pk}/")


@require_POST
@chat_view
def preset_save(request, who, pk):
    """Save the conversation's system prompt and sampling as a preset (`name`)."""
    session = conv.get(who, pk)
    name = request.POST.get("name", "").strip()[:100]
    if not name:
        flash.error(request, "give the preset a name")
    else:
        try:
            p, new = presets.from_session(who, session, name)
        except presets.PresetError as e:
            flash.error(request, str(e))
        else:
            flash.success(request, f"{'saved' if new else 'updated'} the preset “{p.name}” from this conversation")
    return HttpResponseRedirect(f"/chat/{pk}/")


@require_POST
@chat_view
def switch_model(request, who, pk):
    """Answer the conversation with another installed model (`model`) from its next turn on."""
    session = conv.get(who, pk)
    name = request.POST.get("model", "")
    if name not in async_to_sync(turns.models)():
        flash.error(request, f"no worker serves the model “{name[:200]}”; pick one of the installed models")
    elif name != session.model:
        conv.switch_model(session, name)
        flash.success(request, f"this conversation now uses {name}: the next answer comes from it")
    return HttpResponseRedirect(f"/chat/{pk}/")


@require_POST
@chat_view
def answer_length(request, who, pk):
    """Set the conversation's max tokens per answer (`max_tokens`; empty: the chat page's default)."""
    session = conv.get(who, pk)
    try:
        conv.set_max_tokens(session, request.POST.get("max_tokens", ""))
    except conv.TurnError as e:
        flash.error(request, str(e))
    return HttpResponseRedirect(f"/chat/{pk}/")


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
