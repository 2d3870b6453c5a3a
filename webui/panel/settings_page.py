"""Settings: the engine options and service settings of `appliance.tunables`, edited and saved in the database.

Every field is parsed by the declaration the environment variable is read with (`tunables.SERVICE`'s
parsers, the engine's option schema), so the page refuses what `RKMOJO_<NAME>` would refuse, with the same
words. An empty field means the default. A value from the environment is shown, marked, and not editable
(the environment wins). Engine options take effect when a worker next loads a model; the page says so,
and lists the settings each worker says still wait for that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.shortcuts import redirect, render

from appliance.tunables import ENGINE_NAMES, SERVICE, parse_engine

from .. import config
from .access import staff_only
from .models_page import live_workers

LABELS = {
    "memory_budget": "Memory budget",
    "expert_slots": "Expert slots per layer",
    "prefetch": "Prefetch slots",
    "kv_dtype": "KV cache precision",
    "threads": "Threads",
    "context": "Context (tokens)",
    "keep_alive": "Keep-alive",
    "queue_limit": "Queue limit",
    "api_keys": "API keys required",
    "prompt_cache_days": "Prompt-cache days",
    "prompt_cache_max": "Prompt-cache size",
    "chat_max_tokens": "Chat answer length (tokens)",
    "chat_repetition_guard": "Chat repetition guard",
    "chat_open": "Chat without sign-in",
    "pull_from_lan": "Pull from the LAN",
}
SIZES = {"memory_budget", "prompt_cache_max"}


@dataclass
class Field:
    name: str
    label: str
    help: str
    applies: str  # web, worker, reload (`appliance.tunables`)
    value: Any
    source: str  # env, saved, default
    choices: tuple[str, ...] = ()
    default: Any = None
    text: str = ""  # as the form shows it
    error: str = ""

    @property
    def placeholder(self) -> str:
        return f"default: {format_value(self.name, self.default) or 'automatic'}"

    @property
    def env(self) -> str:
        return "RKMOJO_" + self.name.upper()


def format_value(name: str, value: Any) -> str:
    """A value as one would type it: 2G, 30m, on."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if name in SIZES:
        for unit, size in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
            if value % size == 0:
                return f"{value // size}{unit}"
        return str(value)
    if name == "keep_alive":
        for unit, secs in (("h", 3600), ("m", 60)):
            if value > 0 and value % secs == 0:
                return f"{value / secs:g}{unit}"
        return f"{value:g}s"
    return str(value)


def _fields(eff: config.Effective) -> list[Field]:
    from inference.engine import EngineConfig
    from inference.options import allowed, specs

    out = []
    defaults = config.engine_defaults()
    for name in ENGINE_NAMES:
        tp, spec = specs(EngineConfig)[name]
        v = eff.values[name]
        rule = "" if name in SIZES else f" ({allowed(tp, spec)})"  # a size is typed as 6G, not as bytes
        out.append(
            Field(name, LABELS[name], spec.help + rule, "reload", v.value, v.source, spec.choices or (), defaults[name])
        )
    for name, t in SERVICE.items():
        v = eff.values[name]
        choices = t.choices or (("on", "off") if t.kind == "bool" else ())
        out.append(Field(name, LABELS[name], t.help, t.applies, v.value, v.source, choices, t.default))
    for f in out:
        f.text = format_value(f.name, f.value) if f.source != "default" else ""
    return out


def parse(name: str, text: str) -> Any:
    """A form field's text as the setting's value (None: empty, the default).

    Raises:
        ValueError: what the setting takes.
    """
    if not text.strip():
        return None
    if name in SERVICE:
        return SERVICE[name].parse(text.strip())
    return parse_engine(name, text)


@staff_only
def settings_page(request):
    eff = config.current()
    fields = _fields(eff)
    status = 200
    if request.method == "POST":
        changes, bad = {}, False
        for f in fields:
            if f.source == "env":
                continue  # the environment wins; the page does not offer it
            f.text = request.POST.get(f.name, "").strip()
            try:
                changes[f.name] = parse(f.name, f.text)
            except ValueError as e:
                f.error, bad = str(e), True
        if not bad:
            config.save(changes)
            messages.success(
                request,
                "Saved. Web settings apply now; workers pick theirs up within a second, "
                "engine options when they next load a model.",
            )
            return redirect("/panel/settings/")
        status = 400
    workers = live_workers()
    # what each worker made of the saved settings (its registration's "settings": pending, invalid, …)
    pending = {w["name"]: (w.get("settings") or {}).get("pending") or [] for w in workers}
    invalid = {w["name"]: (w.get("settings") or {}).get("invalid") or {} for w in workers}
    return render(
        request,
        "webui/panel/settings.html",
        {
            "section": "panel",
            "tab": "settings",
            "fields": fields,
            "pending": pending,
            "invalid": invalid,
            "engine": [f for f in fields if f.applies == "reload"],
            "service": [f for f in fields if f.applies != "reload"],
        },
        status=status,
    )
