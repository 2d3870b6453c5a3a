"""Typed readers of environment variables: each returns the default when unset and fails loudly otherwise.

A bad value raises `ImproperlyConfigured` naming the variable, the value and what would be accepted,
so `rkmojo up` (or daphne, or the worker) stops at start instead of misbehaving later.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _bad(name: str, value: str, want: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{name}={value!r}: {want}")


def env_str(name: str, default: str | None = None) -> str | None:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _bad(name, value, "write 1/true/yes/on or 0/false/no/off")


def env_int(name: str, default: int | None, *, minimum: int | None = None) -> int | None:
    value = _raw(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise _bad(name, value, "not a whole number") from None
    if minimum is not None and n < minimum:
        raise _bad(name, value, f"must be at least {minimum}")
    return n


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() not in choices:
        raise _bad(name, value, f"choose one of {', '.join(choices)}")
    return value.lower()


def env_path(name: str, default: Path) -> Path:
    value = _raw(name)
    return Path(value).expanduser() if value is not None else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    return default if value is None else [v.strip() for v in value.split(",") if v.strip()]


def parse_duration(text: str | int | float) -> float:
    """Seconds from 30, "30s", "5m", "1.5h", "7d" (a bare number is seconds).

    Raises:
        ValueError: naming the text that does not parse.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text).lower())
    if not m:
        raise ValueError(f"duration {text!r}: write it like 30s, 5m, 1.5h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def env_duration(name: str, default: float) -> float:
    """Seconds; negative means "forever" where a setting allows it."""
    value = _raw(name)
    if value is None:
        return default
    try:
        return parse_duration(value)
    except ValueError:
        raise _bad(name, value, "write a duration like 30s, 5m, 1.5h or 7d") from None


def env_size(name: str, default: int | None) -> int | None:
    """Bytes from "512M", "4G", "3.5GiB" or a plain number of bytes."""
    value = _raw(name)
    if value is None:
        return default
    from inference.engine import parse_size
    from inference.errors import RkmojoError

    try:
        return parse_size(value)
    except RkmojoError:
        raise _bad(name, value, "write a size like 512M, 4G or 3.5GiB") from None


def env_options(cls: type) -> dict:
    """The options of an option set (`inference.options`) given as `RKMOJO_<NAME>` variables, checked by its
    schema: `RKMOJO_TEMPERATURE=5` fails naming the variable and the range."""
    from inference.options import from_env

    try:
        return from_env(cls)
    except ValueError as e:
        raise ImproperlyConfigured(str(e)) from None
