"""The settings the administrator saved, as a worker applies them without a restart.

The web side's settings page writes `bus.K_SETTINGS`: a JSON object, option name → value. A worker reads
it at every heartbeat (`Board.read_settings`) and takes the names it owns:

- `keep_alive` (what `RKMOJO_KEEP_ALIVE` sets: seconds, or a duration like "30m"; negative: forever)
  applies at once, to the loaded models that follow the default too;
- `prompt_cache_days` and `prompt_cache_max` apply at once too: each open prompt cache prunes to them;
- `pull_from_lan` applies to the next install: its URL pull's policy (`inference.pull.PullPolicy`);
- the engine's options (`inference.engine.EngineConfig`: expert_slots, prefetch, kv_dtype, threads,
  context, memory_budget, …), checked by their schema, apply at the next load of a model: a loaded
  engine keeps the options it was opened with.

A variable set in the worker's environment wins over a saved value (`RKMOJO_KEEP_ALIVE`,
`RKMOJO_EXPERT_SLOTS`, … as `inference.options.ENV` spells them). A value the schema refuses is logged
and ignored; the others still apply. Names the worker does not own are the web side's: ignored here.

What the worker made of them is in its registration, `info()["settings"]` (`Resolved.status`):
`applied`, `pending` (a loaded model runs with another value: "takes effect after reload"),
`environment` (saved, but an environment variable wins) and `invalid` (name → why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from inference.engine import EngineConfig
from inference.options import ENV, Surface, read_value, specs

from .env import parse_duration
from .tunables import SERVICE

KEEP_ALIVE = "keep_alive"
PULL_FROM_LAN = "pull_from_lan"  # → settings.RKMOJO["PULL_FROM_LAN"]
PROMPT_CACHE = {"prompt_cache_days": "PROMPT_CACHE_DAYS", "prompt_cache_max": "PROMPT_CACHE_MAX"}  # → settings.RKMOJO
SETTINGS = Surface("settings")  # errors name the option as the settings page does


@dataclass(frozen=True)
class Resolved:
    """The configuration a worker runs with: the environment's, then the saved settings where it is silent."""

    keep_alive: float | None = None  # seconds (negative: forever)
    engine: dict = field(default_factory=dict)  # the options `Engine.open` gets at the next load
    saved: tuple[str, ...] = ()  # the names taken from the saved settings
    environment: tuple[str, ...] = ()  # saved names an environment variable overrides
    invalid: dict[str, str] = field(default_factory=dict)  # saved name → why it was ignored
    prompt_cache: dict = field(default_factory=dict)  # PROMPT_CACHE_DAYS, PROMPT_CACHE_MAX (settings.RKMOJO's keys)
    pull_from_lan: bool = False  # URL pulls may reach private LAN addresses

    def status(self, loaded: list) -> dict:
        """What was applied and what waits for a reload, given the `EngineConfig` of each loaded engine."""
        try:
            want = EngineConfig(**self.engine)
        except ValueError:
            want = None
        pending = sorted(
            {
                name
                for cfg in loaded
                if cfg is not None and want is not None
                for name in specs(EngineConfig)
                if getattr(cfg, name) != getattr(want, name)
            }
        )
        return {
            "applied": [n for n in self.saved if n not in pending],
            "pending": pending,
            "environment": list(self.environment),
            "invalid": dict(self.invalid),
        }


def _env_set(environ: Mapping[str, str], variable: str) -> bool:
    return bool(environ.get(variable, "").strip())


def resolve(raw: str | None, base: dict, environ: Mapping[str, str]) -> Resolved:
    """The worker's configuration from its environment's (`base`: {"KEEP_ALIVE", "ENGINE", "PROMPT_CACHE_DAYS",
    "PROMPT_CACHE_MAX", "PULL_FROM_LAN"} of `settings.RKMOJO`) and the saved settings `raw` (the JSON text of
    `bus.K_SETTINGS`, or None)."""
    try:
        saved = json.loads(raw) if raw else {}
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        return Resolved(
            base["KEEP_ALIVE"],
            dict(base["ENGINE"]),
            invalid={"*": f"not a JSON object: {raw[:80]!r}"},
            prompt_cache={k: base[k] for k in PROMPT_CACHE.values()},
            pull_from_lan=base["PULL_FROM_LAN"],
        )
    keep_alive, engine, pull_from_lan = base["KEEP_ALIVE"], dict(base["ENGINE"]), base["PULL_FROM_LAN"]
    prompt_cache = {k: base[k] for k in PROMPT_CACHE.values()}
    taken, environment, invalid = [], [], {}
    for name, value in saved.items():
        if name == KEEP_ALIVE:
            variable = "RKMOJO_KEEP_ALIVE"
        elif name in PROMPT_CACHE or name == PULL_FROM_LAN:
            variable = SERVICE[name].env
        elif name in specs(EngineConfig):
            variable = ENV.spell(name)
        else:
            continue  # the web side's
        if _env_set(environ, variable):
            environment.append(name)
            continue
        try:
            if name == KEEP_ALIVE:
                if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                    raise ValueError(f"duration {value!r}: write it like 30s, 5m, 1.5h or 7d")
                keep_alive = parse_duration(value)
            elif name in PROMPT_CACHE:
                if isinstance(value, bool) or not isinstance(value, (int, str)):
                    raise ValueError(f"{value!r}: {SERVICE[name].help}")
                prompt_cache[PROMPT_CACHE[name]] = SERVICE[name].parse(str(value))
            elif name == PULL_FROM_LAN:
                if not isinstance(value, bool):
                    raise ValueError(f"{value!r}: on or off")
                pull_from_lan = value
            elif value is not None:  # null: the default
                engine[name] = read_value(EngineConfig, name, value, SETTINGS)
        except ValueError as e:
            invalid[name] = str(e)
            continue
        taken.append(name)
    return Resolved(keep_alive, engine, tuple(taken), tuple(environment), invalid, prompt_cache, pull_from_lan)
