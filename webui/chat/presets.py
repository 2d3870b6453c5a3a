"""Presets: a named system prompt and sampling set that a chat page conversation takes on, new or existing.

A person's own presets are `Preset` rows, whose they are as conversations are (`conversations.Who`: a
user, or with `RKMOJO_CHAT_OPEN` an anonymous browser's session); every user also sees the built-ins
(`BUILTIN`: concise, code, creative), which live here in code and cannot be changed: editing one saves a
copy of your own. A preset is named by its key: a built-in's slug ("code") or a saved one's id ("12").
Every lookup goes through `mine(who)`, so someone else's preset is a 404, as their conversations are.

A preset's `params` are what the new-chat form's sampling fields make of themselves (`ChatSession.params`):
the form for a preset (`PresetForm`) is that form without the model and the message, with its checks.
Applying one (`apply`) sets a conversation's system prompt and all of its sampling: a field the preset
leaves empty goes back to the model's default. The next answer uses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404

from inference.options import OPENAI

from ..api.common import ApiError
from ..api.params import check_sampling
from ..models import ChatSession, Preset
from .conversations import Who
from .forms import SAMPLING, NewChatForm

MAX_PRESETS = 100  # of one person: the picker lists them all


@dataclass(frozen=True)
class Choice:
    """A preset as the pages offer it: built-in or saved, by `key`."""

    key: str
    name: str
    system: str = ""
    params: dict = field(default_factory=dict)
    builtin: bool = False

    def fields(self) -> dict:
        """The new-chat form's fields (system prompt, sampling, stop) filled as this preset fills them."""
        out = {"system": self.system, **{k: self.params[k] for k in SAMPLING if k in self.params}}
        return {**out, "stop": "\n".join(self.params.get("stop") or ())}

    def summary(self) -> str:
        """The sampling in a few words: "temperature 0.2 · max tokens 2048", or "model defaults"."""
        parts = [f"{k.replace('_', ' ')} {self.params[k]}" for k in (*SAMPLING, "repetition_guard") if k in self.params]
        if self.params.get("stop"):
            parts.append("stop " + ", ".join(repr(s) for s in self.params["stop"]))
        return " · ".join(parts) or "model defaults"


BUILTIN = (
    Choice(
        "concise",
        "Concise",
        "Answer briefly and directly: the answer first, in as few words as it takes, then only the detail "
        "that was asked for. No preamble, no restating the question, no closing summary.",
        {"temperature": 0.3, "max_tokens": 512},
        builtin=True,
    ),
    Choice(
        "code",
        "Code",
        "You are a careful programming assistant. Give working code in fenced blocks that name their "
        "language, then explain briefly what it does and why. Say which assumptions you made; ask when the "
        "request is ambiguous instead of guessing.",
        {"temperature": 0.2, "top_p": 0.95, "max_tokens": 2048},
        builtin=True,
    ),
    Choice(
        "creative",
        "Creative",
        "You are an imaginative writer. Prefer vivid, concrete detail and surprising but fitting ideas; vary "
        "sentence rhythm; avoid clichés.",
        {"temperature": 1.0, "top_p": 0.95, "min_p": 0.05, "max_tokens": 1024},
        builtin=True,
    ),
)
_BUILTIN = {c.key: c for c in BUILTIN}


def mine(who: Who) -> QuerySet[Preset]:
    """`who`'s own presets (none for a visitor without a session)."""
    if who.user is not None:
        return Preset.objects.filter(owner=who.user)
    if who.visitor:
        return Preset.objects.filter(owner=None, visitor=who.visitor)
    return Preset.objects.none()


def _choice(p: Preset) -> Choice:
    return Choice(str(p.pk), p.name, p.system, dict(p.params))


def available(who: Who) -> list[Choice]:
    """The built-ins, then `who`'s own by name."""
    return [*BUILTIN, *map(_choice, mine(who)[:MAX_PRESETS])]


def own(who: Who, pk) -> Preset:
    """`who`'s saved preset `pk`. Raises Http404 for any other."""
    try:
        return mine(who).get(pk=pk)
    except (Preset.DoesNotExist, ValueError, OverflowError, ValidationError) as e:  # 2**64 overflows SQLite
        raise Http404("no such preset") from e


def find(who: Who, key: str) -> Choice:
    """The built-in or saved preset `key` that `who` may use. Raises Http404 for any other."""
    if key in _BUILTIN:
        return _BUILTIN[key]
    if not key.isdigit():
        raise Http404("no such preset")
    return _choice(own(who, key))


class PresetError(ValueError):
    """A preset that cannot be saved; the message says why and what to do."""


def save(who: Who, name: str, system: str, params: dict, pk: int | None = None) -> tuple[Preset, bool]:
    """Save `who`'s preset `name`: `pk` edited, else a new one; a new one under a name in use replaces
    that preset ("Save as preset" again updates it).

    Returns:
        (the preset, whether it is new)
    Raises:
        PresetError: `who` is nobody (no session), has `MAX_PRESETS` already, or renames `pk` onto
            another preset's name.
        Http404: `pk` is not `who`'s.
    """
    if who.user is None and not who.visitor:
        raise PresetError("presets need a signed-in user or a browser session; reload the page and retry")
    same = mine(who).filter(name=name).first()
    if pk is not None:
        p = own(who, pk)
        if same is not None and same.pk != p.pk:
            raise PresetError(f"you have a preset named {name!r} already: choose another name, or delete that one")
    elif same is not None:
        p = same
    elif mine(who).count() >= MAX_PRESETS:
        raise PresetError(f"you have {MAX_PRESETS} presets, the most one person keeps: delete one first")
    else:
        p = Preset(owner=who.user, visitor="" if who.user else who.visitor)
    new = p.pk is None
    p.name, p.system, p.params = name, system, params
    p.save()
    return p, new


def from_session(who: Who, session: ChatSession, name: str) -> tuple[Preset, bool]:
    """Save `session`'s system prompt and sampling as `who`'s preset `name` (see `save`).

    Raises:
        PresetError: as `save`, or the conversation's sampling does not pass the form's checks (an
            imported conversation's may not).
    """
    try:
        params = check_sampling(dict(session.params), OPENAI)
    except ApiError as e:
        raise PresetError(f"this conversation's sampling cannot be a preset: {e}") from None
    return save(who, name, session.system, params)


def apply(session: ChatSession, choice: Choice) -> None:
    """Give `session` the preset's system prompt and sampling (all of it: what the preset leaves out goes
    back to the model's default); its next answer uses them."""
    session.system, session.params = choice.system, dict(choice.params)
    session.save(update_fields=["system", "params", "updated"])


class PresetForm(NewChatForm):
    """A preset's fields: a name, then the new-chat form's system prompt and sampling, checked as it checks
    them (`cleaned_data["params"]`)."""

    name = forms.CharField(max_length=100, label="Name")
    field_order = ["name", "system"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, models=[], **kwargs)
        del self.fields["model"], self.fields["text"]
        for f in self.fields.values():
            f.widget.attrs.pop("form", None)  # its own form's fields, not the chat composer's
