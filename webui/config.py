"""The settings in effect: the environment (`RKMOJO_<NAME>`), else what the administrator saved in the panel
(`models.Setting`), else the default (`appliance.tunables`). One function reads them for the web side:

    limit = (await config.acurrent())["queue_limit"]     # async views and consumers
    policy = config.current()["api_keys"]                # sync code

Both read the table at most every `CACHE` seconds, so a save in the panel reaches every web process within
that long, without a restart. `save` stores a change and writes every saved value to Redis
(`bus.K_SETTINGS`), where the workers read them at each heartbeat (their own environment still wins);
a read that finds the key gone (Redis restarted empty) writes it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from asgiref.sync import sync_to_async
from django.conf import settings

from appliance import bus
from appliance.tunables import DEFAULT_MODEL, ENGINE_NAMES, SERVICE, engine_env_given, engine_from_env

CACHE = 2.0  # seconds a read of the table is reused

Source = Literal["env", "saved", "default"]


@dataclass(frozen=True)
class Value:
    value: Any
    source: Source  # where it comes from: the environment wins, then the panel, then the default


@dataclass(frozen=True)
class Effective:
    values: dict[str, Value]
    saved: dict[str, Any]  # what the panel stored, environment or not
    at: float

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value


def engine_defaults() -> dict[str, Any]:
    from inference.engine import EngineConfig

    return {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def _load() -> Effective:
    from .models import Setting

    saved = dict(Setting.objects.values_list("name", "value"))
    values: dict[str, Value] = {}
    for name, t in SERVICE.items():
        values[name] = _pick(t.env_given(), t.from_env, saved, name, t.default)
    defaults = engine_defaults()
    for name in ENGINE_NAMES:
        values[name] = _pick(engine_env_given(name), lambda n=name: engine_from_env(n), saved, name, defaults[name])
    values[DEFAULT_MODEL] = _pick(False, None, saved, DEFAULT_MODEL, None)
    if saved and not _redis().exists(bus.K_SETTINGS):  # Redis restarted empty: the workers need them again
        publish()
    return Effective(values, saved, time.monotonic())


def _pick(from_env: bool, env_value: Callable[[], Any], saved: dict, name: str, default: Any) -> Value:
    if from_env:
        return Value(env_value(), "env")
    if name in saved:
        return Value(saved[name], "saved")
    return Value(default, "default")


_current: list[Effective] = []


def _fresh() -> Effective | None:
    eff = _current[0] if _current else None
    return eff if eff is not None and time.monotonic() - eff.at < CACHE else None


def current() -> Effective:
    """The settings in effect (sync code; reads the database at most every `CACHE` seconds).

    Called from async code (which cannot read the database), it gives the last read: such code awaits
    `acurrent()` first, or uses it instead.
    """
    eff = _fresh()
    if eff is None and _current and _in_event_loop():
        return _current[0]
    if eff is None:
        eff = _load()
        _current[:] = [eff]
    return eff


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def acurrent() -> Effective:
    """`current` for async code."""
    return _fresh() or await sync_to_async(current)()


def save(changes: dict[str, Any]) -> None:
    """Store the administrator's values (None: back to the default), then tell the workers.

    The values must be checked already (`appliance.tunables`); this stores what it is given.
    """
    from .models import Setting

    for name, value in changes.items():
        if value is None:
            Setting.objects.filter(name=name).delete()
        else:
            Setting.objects.update_or_create(name=name, defaults={"value": value})
    _current.clear()
    publish()


def publish() -> None:
    """Write every saved value to Redis for the workers (`bus.K_SETTINGS`)."""
    from .models import Setting

    saved = dict(Setting.objects.values_list("name", "value"))
    _redis().set(bus.K_SETTINGS, json.dumps(saved, sort_keys=True))


_REDIS: list = []


def _redis():
    if not _REDIS:
        _REDIS.append(bus.connect(settings.REDIS_URL))
    return _REDIS[0]
