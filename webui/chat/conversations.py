"""The chat page's conversations in the database: whose they are, the turns that extend them, export and import.

Whose: a signed-in user's (`ChatSession.owner`), or with `RKMOJO_CHAT_OPEN` an anonymous browser's
(`visitor`: its Django session key). Every lookup goes through `owned(who)`, so a conversation of
someone else is a 404, never a 403 that tells it exists (a bulk action's `chosen` just leaves it out).
The list (`listing`) shows the pinned ones first (at most `MAX_PINNED`), then the newest.

A turn (`Turn`) is one answer to compute: `send` appends a user message, `regenerate` drops the last
answer, `edit` rewrites an earlier user message and drops what followed it, `proceed` continues a
cut-off answer. Each stores the user's side first (so a failed generation loses no typing) and says
where the answer goes (`index`); `record` stores the answer with its measurements when it ends.
The worker gets the conversation in the engine's spelling (`webui.sessions.for_worker`): tool calls and
tool results included (an imported or API-made conversation may hold them), thinking left out. It gets
all of it: the worker leaves the oldest turns out of a prompt that would overflow the context
(`truncate`), and the answer keeps where its prompt began (`ChatMessage.dropped`) for the page's marker.
"Summarize and continue" (`summarize`, then `keep_summary`) has the model fold the messages left out into a
summary, which later prompts hold in their place, after the system prompt (`ChatSession.summary`,
`summary_upto`); the messages themselves stay.

Export is JSON (`Export`, the format import reads back) or Markdown. An exported message is
{role: user | assistant | tool, content, the answer's measurements, reasoning, tool_calls: [{id, name,
arguments: {…}}], tool_call_id, name}; the last four only where they apply (thinking and tool calls on
an assistant's message, the call's id and the tool's name on a tool's), checked on import.

What a conversation costs is bounded by these, not by its length: a page reads `LAST` messages
(`window`: "Load earlier" asks for the `LAST` before them), an export is text made one message at a time
from a database read of `CHUNK` rows (`export_json`, `export_markdown`; the view streams it), and an
import takes at most `MAX_CONVERSATIONS` conversations, `MAX_MESSAGES` messages in one, `MAX_TOTAL` in
all, nested at most `IMPORT_DEPTH` deep (`read_export` refuses more, naming the limit).
"""

from __future__ import annotations

import datetime
import json
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic import ValidationError as SchemaError

from appliance.events import Final

from ..api.common import ApiError
from ..door import load_json
from ..models import ChatMessage, ChatSession
from ..sessions import for_worker, name_tool_results, tool_call

TITLE_LENGTH = 80
ROLES = ("user", "assistant", "tool")  # what a conversation shows and exports (API sessions also store "system")
LAST = 100  # messages a conversation's page shows at a time (`window`); "Load earlier" brings as many more
CHUNK = 500  # messages read from the database, or written, at a time by export and import
# what one imported file may hold: a conversation's page shows `LAST` at a time whatever its length, but an
# import is parsed whole in memory (the request's body limit, RKMOJO_MAX_REQUEST_BYTES, bounds its bytes)
MAX_CONVERSATIONS = 1_000
MAX_MESSAGES = 10_000  # in one conversation
MAX_TOTAL = 50_000  # in the whole file
IMPORT_DEPTH = 32  # objects and arrays inside each other: an export needs 8, plus a tool call's arguments
MAX_PINNED = 25  # pinned conversations of one person: the list shows them all above the others
SUMMARY_TOKENS = 320  # the most a summary may take of the answer's room
SUMMARY_HEAD = "Summary of the earlier conversation:"
SUMMARIZE = (
    "Summarize the conversation above in a few short paragraphs: the questions asked, the answers and "
    "decisions reached, and any names, numbers or code that later messages may refer to. Write only the summary."
)


@dataclass(frozen=True)
class Who:
    """The person at the page: a user, or an anonymous visitor's session key (RKMOJO_CHAT_OPEN)."""

    user: object = None
    visitor: str = ""

    @classmethod
    def of(cls, user, session) -> "Who":
        if user is not None and user.is_authenticated:
            return cls(user=user)
        return cls(visitor=(session.session_key or "") if session is not None else "")


def may_chat(user, client_addr: str | None, eff=None) -> bool:
    """A signed-in user, or (chat without sign-in) a client that the API key rule lets in without a key.
    `eff`: the settings in effect (`webui.config`); read here when not given (sync code only)."""
    from .. import config
    from ..api.common import key_required

    if user is not None and user.is_authenticated:
        return True
    eff = eff or config.current()
    return eff["chat_open"] and not key_required(eff["api_keys"], client_addr)


def owned(who: Who) -> QuerySet[ChatSession]:
    if who.user is not None:
        return ChatSession.objects.filter(owner=who.user)
    if who.visitor:
        return ChatSession.objects.filter(owner=None, source="web", visitor=who.visitor)
    return ChatSession.objects.none()


def get(who: Who, pk) -> ChatSession:
    """The conversation `pk` of `who`. Raises Http404 for any other (or a malformed id)."""
    try:
        return owned(who).get(pk=pk)
    except (ChatSession.DoesNotExist, ValueError, ValidationError) as e:  # a malformed UUID is ValidationError
        raise Http404("no such conversation") from e


def listing(who: Who, query: str = "", limit: int = 50) -> tuple[list[ChatSession], list[ChatSession]]:
    """The pinned conversations (the latest pinned first), and the newest `limit` others; those whose
    title or messages hold `query` if given.

    Returns:
        (pinned, others)
    """
    qs = owned(who).only("id", "title", "model", "updated", "pinned")
    if query:
        qs = qs.filter(title__icontains=query) | qs.filter(messages__content__icontains=query)
        qs = qs.distinct()
    pinned = list(qs.filter(pinned__isnull=False).order_by("-pinned")[:MAX_PINNED])
    return pinned, list(qs.filter(pinned=None).order_by("-updated")[:limit])


def pin(session: ChatSession, on: bool) -> None:
    """Pin `session` to the top of its owner's list, or unpin it.

    Raises:
        TurnError: its owner has `MAX_PINNED` pinned already.
    """
    if on and session.pinned is None:
        others = ChatSession.objects.filter(owner=session.owner, visitor=session.visitor, pinned__isnull=False)
        if others.count() >= MAX_PINNED:
            raise TurnError(f"{MAX_PINNED} conversations are pinned, the most the list keeps on top: unpin one first")
    if on != (session.pinned is not None):
        session.pinned = timezone.now() if on else None
        ChatSession.objects.filter(pk=session.pk).update(pinned=session.pinned)  # its place by use stays


def chosen(who: Who, ids: Iterable[str]) -> QuerySet[ChatSession]:
    """The conversations of `who` among `ids` (a bulk action's choice), newest first; others' ids and
    malformed ones match nothing."""
    pks = []
    for i in ids:
        try:
            pks.append(uuid.UUID(str(i)))
        except ValueError:
            continue
    return owned(who).filter(pk__in=pks).order_by("-updated")


def create(who: Who, model: str, system: str = "", params: dict | None = None, title: str = "") -> ChatSession:
    return ChatSession.objects.create(
        owner=who.user,
        visitor="" if who.user else who.visitor,
        source="web",
        model=model,
        system=system,
        params=params or {},
        title=title[:200],
    )


def switch_model(session: ChatSession, model: str) -> None:
    """Answer `session` with `model` from its next turn on (the caller checked that a worker serves it)."""
    session.model = model
    session.save(update_fields=["model", "updated"])


def set_max_tokens(session: ChatSession, text: str) -> None:
    """Set the conversation's max tokens per answer from a form's `text`; empty: the chat page's default.

    Raises:
        TurnError: not a whole number of at least 1.
    """
    params = dict(session.params)
    if not text.strip():
        params.pop("max_tokens", None)
    else:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise TurnError(
                f"max tokens: {text[:20]!r} is not a whole number of at least 1; leave it empty for the default"
            )
        params["max_tokens"] = n
    session.params = params
    session.save(update_fields=["params"])


# --- turns -----------------------------------------------------------------------------------------
class TurnError(ValueError):
    """An action that does not fit the conversation (edit a reply, continue a question, …)."""


@dataclass
class Turn:
    session: ChatSession
    index: int  # where the answer goes
    messages: list[dict]  # what the worker gets, system prompt first
    prefix: str = ""  # the cut-off answer a continuation extends
    prefix_reasoning: str = ""  # and its thinking
    user_index: int | None = None  # the user message this turn stored, if any
    extra: dict = field(default_factory=dict)  # payload fields beyond kind/model/messages/params
    created: bool = False  # this turn started the conversation
    dropped: int = 0  # messages the worker left out of the prompt to fit the context (`Start.dropped_messages`)
    base: int = 0  # the index of the first message `messages` holds (past the summary's)

    @property
    def edge(self) -> int:
        """The index of the first message the prompt held when the worker left older ones out (0: none)."""
        return self.base + self.dropped if self.dropped else 0

    @property
    def payload(self) -> dict:
        return {
            "kind": "chat",
            "model": self.session.model,
            "messages": self.messages,
            "params": dict(self.session.params),
            "session": str(self.session.pk),
            **self.extra,
        }


def _history(session: ChatSession, upto: int | None = None) -> list[dict]:
    """What the worker gets: the system prompt (with the summary, if any), then the messages past the
    summary's, up to `upto` (None: all)."""
    msgs = session.messages.order_by("index").only("role", "content", "tool_calls", "tool_call_id", "name")
    msgs = msgs.filter(index__gte=first_sent(session))
    if upto is not None:
        msgs = msgs.filter(index__lte=upto)
    system = session.system
    if session.summary_upto is not None:
        system = "\n\n".join(p for p in (system, f"{SUMMARY_HEAD}\n{session.summary}") if p)
    out = [{"role": "system", "content": system}] if system else []
    return out + [for_worker(m) for m in msgs]


def first_sent(session: ChatSession) -> int:
    """The index of the first message a prompt holds: past the summary's."""
    return 0 if session.summary_upto is None else session.summary_upto + 1


def edge(session: ChatSession, last: ChatMessage | None) -> int:
    """Where the model's view begins for the page's marker: the first message the last answer's prompt held
    when older ones past the summary were left out (0: no marker)."""
    if last is None or last.role != "assistant" or last.dropped <= first_sent(session):
        return 0
    return last.dropped


def last_message(session: ChatSession) -> ChatMessage | None:
    return session.messages.order_by("-index").first()


def before(query) -> int | None:
    """A page's `?before=INDEX` (its query dict): the window ahead of that message; None (the newest) if
    absent or not a number."""
    try:
        return min(max(0, int(query["before"])), 2**31)  # past SQLite's integers: an OverflowError
    except (KeyError, ValueError):
        return None


def window(messages: QuerySet[ChatMessage], before: int | None = None, n: int = LAST):
    """The last `n` of `messages` (all of a conversation's, or a filter of them) with an index below
    `before` (None: the newest), oldest first; and the `before` that asks for the ones ahead of them, None
    when these are the first. Two indexed reads of at most `n + 1` rows, whatever the conversation's length.

    Returns:
        (messages, earlier)
    """
    if before is not None:
        messages = messages.filter(index__lt=before)
    rows = list(messages.order_by("-index")[: n + 1])
    earlier = rows[n - 1].index if len(rows) > n else None
    return rows[:n][::-1], earlier


@transaction.atomic
def send(session: ChatSession, text: str) -> Turn:
    if not text.strip():
        raise TurnError("the message is empty")
    last = last_message(session)
    if last is not None and last.role == "user":  # an unanswered question (its answer failed): replace it
        last.delete()
        last = last_message(session)
    index = 0 if last is None else last.index + 1
    ChatMessage.objects.create(session=session, index=index, role="user", content=text)
    if not session.title:
        session.title = " ".join(text.split())[:TITLE_LENGTH]
    session.save()
    return Turn(session, index + 1, _history(session), user_index=index, base=first_sent(session))


@transaction.atomic
def regenerate(session: ChatSession) -> Turn:
    last = last_message(session)
    if last is not None and last.role == "assistant":
        last.delete()
        last = last_message(session)
    if last is None or last.role not in ("user", "tool"):  # a tool's result is answered as a question is
        raise TurnError("there is no question to answer again")
    session.save()
    return Turn(session, last.index + 1, _history(session), base=first_sent(session))


@transaction.atomic
def edit(session: ChatSession, index: int, text: str) -> Turn:
    msg = session.messages.filter(index=index).first()
    if msg is None or msg.role != "user":
        raise TurnError(f"message {index} is not a question of yours; only those can be edited")
    if not text.strip():
        raise TurnError("the message is empty")
    session.messages.filter(index__gt=index).delete()  # what followed answered the old text
    msg.content = text
    msg.save(update_fields=["content"])
    if session.summary_upto is not None and index <= session.summary_upto:  # it summarized the old text
        session.summary, session.summary_upto = "", None
    session.save()
    return Turn(session, index + 1, _history(session), user_index=index, base=first_sent(session))


@transaction.atomic
def proceed(session: ChatSession) -> Turn:
    """Continue the last answer where it was cut off (the chat template's continue_final_message)."""
    last = last_message(session)
    if last is None or last.role != "assistant" or not last.content.strip():
        raise TurnError("there is no answer to continue")
    session.save()
    return Turn(
        session,
        last.index,
        _history(session),
        base=first_sent(session),
        prefix=last.content,
        prefix_reasoning=last.reasoning,
        extra={"template": {"continue_final_message": True}},
    )


def record(turn: Turn, text: str, final: Final, reasoning: str = "") -> ChatMessage:
    """Store the answer (the continued one extended), its thinking and tool calls, with the final event's
    measurements."""
    t, u = final.timings, final.usage
    fields = {
        "role": "assistant",
        "content": turn.prefix + text,
        "reasoning": turn.prefix_reasoning + reasoning,
        "tool_calls": [tool_call(c) for c in final.tool_calls or ()],
        "finish_reason": final.finish_reason,
        "dropped": turn.edge,
        "prompt_tokens": u and u.prompt_tokens,
        "cached_tokens": u and u.cached_tokens,
        "completion_tokens": u and u.completion_tokens,
        "ttft": t and t.ttft,
        "prefill_tps": t and t.prefill_tps,
        "decode_tps": t and t.decode_tps,
        "expert_hit_rate": t and t.expert_hit_rate,
    }
    with transaction.atomic():
        msg, _ = ChatMessage.objects.update_or_create(session=turn.session, index=turn.index, defaults=fields)
        ChatSession.objects.filter(pk=turn.session.pk).update(updated=timezone.now())
    return msg


@dataclass
class Summary:
    """A summary to compute: `messages` ask the model to fold the conversation up to message `upto`."""

    session: ChatSession
    upto: int
    messages: list[dict]


def summarize(session: ChatSession) -> Summary:
    """What "Summarize and continue" asks the model: the messages the last answer's prompt left out (with the
    summary before them, if any) and an instruction to summarize them. They are whole turns, so they end
    with an answer and the instruction is the next question.

    Raises:
        TurnError: nothing was left out of the last answer's prompt.
    """
    at = edge(session, last_message(session))
    if not at:
        raise TurnError("nothing is outside the model's context yet: there is nothing to summarize")
    start = first_sent(session)
    msgs = session.messages.order_by("index").filter(index__gte=start, index__lt=at)
    system = "You summarize conversations faithfully and briefly."
    if session.summary_upto is not None:
        system += f"\n\n{SUMMARY_HEAD}\n{session.summary}"
    out = [{"role": "system", "content": system}] + [for_worker(m) for m in msgs]
    return Summary(session, at - 1, out + [{"role": "user", "content": SUMMARIZE}])


def keep_summary(s: Summary, text: str) -> None:
    """Store the model's summary: later prompts hold it in place of messages up to `s.upto`.

    Raises:
        TurnError: the model wrote nothing.
    """
    if not text.strip():
        raise TurnError("the model wrote an empty summary; try Summarize again")
    ChatSession.objects.filter(pk=s.session.pk).update(summary=text.strip(), summary_upto=s.upto)
    s.session.summary, s.session.summary_upto = text.strip(), s.upto


# --- export and import -------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExportedToolCall(_Strict):
    id: str = Field("", max_length=200)
    name: str = Field(max_length=200)
    arguments: dict = {}

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, v):
        # the engine's {id, type, function: {name, arguments}} too, arguments as an object or its JSON text
        return tool_call(v) if isinstance(v, dict) else v


class ExportedMessage(_Strict):
    role: str = Field(pattern="^(user|assistant|tool)$")
    content: str = ""
    finish_reason: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None
    prefill_tps: float | None = None
    decode_tps: float | None = None
    expert_hit_rate: float | None = None
    reasoning: str = ""
    tool_calls: list[ExportedToolCall] = []
    tool_call_id: str = Field("", max_length=200)
    name: str = Field("", max_length=200)

    @model_validator(mode="after")
    def _parts_fit_the_role(self):
        for f, role in (
            ("reasoning", "assistant"),
            ("tool_calls", "assistant"),
            ("tool_call_id", "tool"),
            ("name", "tool"),
        ):
            if getattr(self, f) and self.role != role:
                raise ValueError(f"{f} belongs on a message of role {role}, not {self.role}; move it there or drop it")
        return self


class ExportedConversation(_Strict):
    title: str = Field("", max_length=200)
    model: str = Field(max_length=200)
    system: str = ""
    params: dict = {}
    created: datetime.datetime | None = None
    summary: str = ""  # "Summarize and continue": the model's summary of messages 0..summary_upto
    summary_upto: int | None = Field(None, ge=0)
    messages: list[ExportedMessage]

    @model_validator(mode="after")
    def _summary_within(self):
        if self.summary_upto is not None and (self.summary_upto >= len(self.messages) or not self.summary.strip()):
            raise ValueError(
                f"summary_upto {self.summary_upto} needs a summary and a message after it "
                f"(the conversation has {len(self.messages)}); drop summary_upto to import it without its summary"
            )
        return self


class Export(_Strict):
    format: str = Field("rkmojo-chat", pattern="^rkmojo-chat$")
    version: int = 1
    conversations: list[ExportedConversation]


FIELDS = [f for f in ExportedMessage.model_fields if f not in ("role", "content")]  # ChatMessage's own names


def _exported(m: ChatMessage) -> ExportedMessage:
    return ExportedMessage(role=m.role, content=m.content, **{f: getattr(m, f) for f in FIELDS})


def _messages(s: ChatSession) -> Iterator[ChatMessage]:
    """`s`'s messages as a conversation shows them, read from the database `CHUNK` at a time."""
    return s.messages.filter(role__in=ROLES).order_by("index").iterator(chunk_size=CHUNK)


def export_json(sessions: Iterable[ChatSession]) -> Iterator[str]:
    """The `Export` of `sessions` as JSON text in pieces, one message at a time: what `Export` would
    dump, never held whole (a conversation of 100k messages is ~30 MB of JSON)."""
    yield '{"format": "rkmojo-chat", "version": 1, "conversations": ['
    for i, s in enumerate(sessions):
        head = ExportedConversation.model_construct(  # its messages come after: checked on import, not here
            title=s.title,
            model=s.model,
            system=s.system,
            params=s.params,
            created=s.created,
            summary=s.summary,
            summary_upto=s.summary_upto,
            messages=[],
        ).model_dump_json(exclude={"messages"})
        yield ("," if i else "") + "\n" + head[:-1] + ', "messages": ['  # messages last: after the head's fields
        for j, m in enumerate(_messages(s)):
            yield ("," if j else "") + "\n " + _exported(m).model_dump_json()
        yield "]}"
    yield "\n]}\n"


def export_markdown(sessions: Iterable[ChatSession]) -> Iterator[str]:
    """The conversations as Markdown, in pieces as `export_json`."""
    for i, s in enumerate(sessions):
        yield ("\n" if i else "") + f"# {s.title or 'Untitled'}\n\n_{s.model} · {s.created:%Y-%m-%d %H:%M} UTC_\n"
        if s.system:
            yield f"\n**System:** {s.system}\n"
        for m in _messages(s):
            yield "\n" + _markdown_message(m)
            if m.index == s.summary_upto:
                yield f"\n## Summary of the messages above\n\n{s.summary}\n"


def _markdown_message(m: ChatMessage) -> str:
    """One message as Markdown: its thinking quoted, its tool calls and a tool's JSON result fenced."""
    head = f"Tool result{f' ({m.name})' if m.name else ''}" if m.role == "tool" else m.role.capitalize()
    out = [f"## {head}\n"]
    if m.reasoning:
        out.append("> **Thinking**\n>\n" + "\n".join(f"> {line}".rstrip() for line in m.reasoning.splitlines()) + "\n")
    if m.content:
        try:
            as_json = m.role == "tool" and json.dumps(json.loads(m.content), indent=2, ensure_ascii=False)
        except ValueError:
            as_json = ""
        out.append((_fenced(as_json, "json") if as_json else m.content) + "\n")
    for c in m.tool_calls:
        out.append(
            f"**Tool call** `{c['name']}`\n\n"
            + _fenced(json.dumps(c["arguments"], indent=2, ensure_ascii=False), "json")
            + "\n"
        )
    return "\n".join(out)


def _fenced(text: str, lang: str) -> str:
    ticks = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return f"{ticks}{lang}\n{text}\n{ticks}\n"


class ImportRefused(ValueError):
    """A file the import does not take; the message names the limit or the field, and the fix."""


def read_export(raw: bytes | str) -> Export:
    """An uploaded file as an `Export`, checked against the import's limits before it is validated.

    Raises:
        ImportRefused: not JSON, nested deeper than `IMPORT_DEPTH`, more than `MAX_CONVERSATIONS`
            conversations, `MAX_MESSAGES` messages in one or `MAX_TOTAL` in all, or not an export's shape.
    """
    try:
        value = load_json(raw, IMPORT_DEPTH)
    except ApiError as e:
        raise ImportRefused(f"that file is not a chat export: {e}") from None
    convs = value.get("conversations") if isinstance(value, dict) else None
    if isinstance(convs, list):  # counted before validation: a 100k-message file costs no model per message
        _check_counts(convs)
    try:
        return Export.model_validate(value)
    except SchemaError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the file"
        raise ImportRefused(f"that file is not a chat export: {where}: {err['msg']}") from None


def _check_counts(convs: list) -> None:
    if len(convs) > MAX_CONVERSATIONS:
        raise ImportRefused(
            f"that file holds {len(convs):,} conversations; an import takes at most {MAX_CONVERSATIONS:,}: "
            "import it in parts (each conversation's own Export link gives a file of one)"
        )
    total = 0
    for i, c in enumerate(convs):
        msgs = c.get("messages") if isinstance(c, dict) else None
        n = len(msgs) if isinstance(msgs, list) else 0
        if n > MAX_MESSAGES:
            raise ImportRefused(
                f"conversations.{i} holds {n:,} messages; an import takes at most {MAX_MESSAGES:,} per "
                "conversation: split it into conversations of fewer messages"
            )
        total += n
    if total > MAX_TOTAL:
        raise ImportRefused(
            f"that file holds {total:,} messages; an import takes at most {MAX_TOTAL:,} in all: import "
            "it in parts (each conversation's own Export link gives a file of one)"
        )


@transaction.atomic
def import_(who: Who, data: Export) -> list[ChatSession]:
    made = []
    for c in data.conversations:
        s = create(who, c.model, c.system, c.params, c.title)
        if c.summary_upto is not None:
            ChatSession.objects.filter(pk=s.pk).update(summary=c.summary, summary_upto=c.summary_upto)
        rows = name_tool_results([m.model_dump() for m in c.messages])
        ChatMessage.objects.bulk_create(
            [ChatMessage(session=s, index=i, **row) for i, row in enumerate(rows)], batch_size=CHUNK
        )
        made.append(s)
    return made
