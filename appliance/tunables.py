"""The settings an administrator may change at run time, declared once: the service's own (below) and the
engine's (`inference.engine.EngineConfig`, declared with its schema in `inference.options`).

Each setting has one name (`queue_limit`, `expert_slots`): the key in the settings page's table, in
Redis `bus.K_SETTINGS` and in `settings.RKMOJO` (upper case), and `RKMOJO_<NAME>` as an environment
variable. Precedence everywhere: the environment, then what the administrator saved, then the default.

- `SERVICE` declares the service settings; `settings.py` reads them from the environment through
  `from_env`, the settings page parses its fields through `parse` — the same parser (`appliance.env`).
- `ENGINE_NAMES` are the engine options the page offers; their values are parsed and range-checked by
  the engine's schema (`inference.options.read_value`), as the CLI flags and variables are.
- `applies` tells who applies a setting: `web` (the web process, within seconds of a save), `worker`
  (at its next heartbeat), `reload` (an engine option: when the worker next loads a model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal

from .env import _env, parse_bool, parse_bytes, parse_choice, parse_duration, parse_int

Applies = Literal["web", "worker", "reload"]


@dataclass(frozen=True)
class Tunable:
    """A service setting: its name, default, help, who applies it and its parser (text → value)."""

    name: str
    default: Any
    help: str
    applies: Applies
    parse: Callable[[str], Any]
    kind: Literal["int", "bool", "choice", "duration", "size"] = "int"
    choices: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return "RKMOJO_" + self.name.upper()

    def from_env(self) -> Any:
        """The variable's value, or the default when unset.

        Raises:
            ImproperlyConfigured: naming the variable and what it takes.
        """
        return _env(self.env, self.default, self.parse)

    def env_given(self) -> bool:
        return bool(os.environ.get(self.env, "").strip())


API_KEY_POLICIES = ("remote", "always", "never")

SERVICE: dict[str, Tunable] = {
    t.name: t
    for t in (
        Tunable(
            "queue_limit",
            8,
            "requests waiting per worker behind the running one; past it the API answers 429 (OpenAI) or 503 (Ollama)",
            "web",
            lambda t: parse_int(t, 0),
        ),
        Tunable(
            "keep_alive",
            30 * 60.0,
            "a model unused this long is unloaded (30s, 5m, 2h; negative: never)",
            "worker",
            parse_duration,
            "duration",
        ),
        Tunable(
            "api_keys",
            "remote",
            "who must show an API key: remote (all but this machine), always, never",
            "web",
            lambda t: parse_choice(t, API_KEY_POLICIES),
            "choice",
            API_KEY_POLICIES,
        ),
        Tunable("prompt_cache_days", 7, "days a prompt-cache file lives unused", "worker", lambda t: parse_int(t, 0)),
        Tunable(
            "prompt_cache_max",
            2 * 2**30,
            "prompt-cache files in all, at most (512M, 2G)",
            "worker",
            parse_bytes,
            "size",
        ),
        Tunable(
            "pull_from_lan",
            False,
            "pulls by URL may reach private LAN addresses (10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10), "
            "e.g. a NAS at 192.168.1.10. Off by default: an admin API key could otherwise make the appliance "
            "fetch from, and probe, the devices of your network. This machine's own addresses are always refused",
            "worker",
            parse_bool,
            "bool",
        ),
        Tunable(
            "chat_max_tokens",
            1024,
            "the chat page's answer length, in tokens, for a conversation that sets none: an answer stops there, "
            "or where the context ends if that comes first (0: at the end of the context)",
            "web",
            lambda t: parse_int(t, 0),
        ),
        Tunable(
            "chat_repetition_guard",
            True,
            "the chat page stops an answer that ends in a loop (a run of up to 64 tokens repeated over the last "
            "128 or more) and says so, for a conversation that does not say otherwise",
            "web",
            parse_bool,
            "bool",
        ),
        Tunable(
            "chat_open",
            False,
            "the chat page without signing in (for clients the API-key rule lets in)",
            "web",
            parse_bool,
            "bool",
        ),
    )
}


def chat_defaults(values) -> dict:
    """What a chat-page request carries as its payload's `defaults` (`appliance.tasks`), from the settings in
    effect (`webui.config.current()`, or any mapping of these names): the sampling fields its conversation
    leaves unset. `max_tokens` is a cap the worker fits to the room left in the context."""
    out = {"repetition_guard": bool(values["chat_repetition_guard"])}
    if values["chat_max_tokens"]:
        out["max_tokens"] = int(values["chat_max_tokens"])
    return out


# the engine options the settings page offers (the rest stay RKMOJO_* variables and CLI flags)
ENGINE_NAMES = ("memory_budget", "expert_slots", "prefetch", "kv_dtype", "threads", "context")
DEFAULT_MODEL = "default_model"  # the model the chat page and the API pick when a request names none


def parse_engine(name: str, text: str) -> Any:
    """An engine option from a form field, checked by the engine's schema.

    Raises:
        ValueError: naming the option and its range.
    """
    from inference.engine import EngineConfig
    from inference.options import Surface, read_value

    return read_value(EngineConfig, name, text.strip(), Surface("settings"))


def engine_from_env(name: str) -> Any:
    """Engine option `name` as its `RKMOJO_<NAME>` variable gives it (the variable must be set)."""
    from inference.engine import EngineConfig
    from inference.options import from_env

    return from_env(EngineConfig, names=(name,))[name]


def engine_env_given(name: str) -> bool:
    from inference.options import ENV

    return bool(os.environ.get(ENV.spell(name), "").strip())
