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


# --- text → value: the same parsers read an environment variable and a settings form field -------------
def parse_bool(text: str) -> bool:
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise ValueError("write 1/true/yes/on or 0/false/no/off")


def parse_int(text: str, minimum: int | None = None) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ValueError("not a whole number") from None
    if minimum is not None and n < minimum:
        raise ValueError(f"must be at least {minimum}")
    return n


def parse_choice(text: str, choices: tuple[str, ...]) -> str:
    if text.strip().lower() not in choices:
        raise ValueError(f"choose one of {', '.join(choices)}")
    return text.strip().lower()


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


def parse_bytes(text: str) -> int:
    """Bytes from "512M", "4G", "3.5GiB" or a plain number of bytes."""
    from inference.engine import parse_size
    from inference.errors import RkmojoError

    try:
        return parse_size(text)
    except RkmojoError:
        raise ValueError("write a size like 512M, 4G or 3.5GiB") from None


def _env(name: str, default, parse, want: str | None = None):
    """`parse(value)` of variable `name`, or `default` when unset; a ValueError names the variable."""
    value = _raw(name)
    if value is None:
        return default
    try:
        return parse(value)
    except ValueError as e:
        raise _bad(name, value, want or str(e)) from None


def env_bool(name: str, default: bool) -> bool:
    return _env(name, default, parse_bool)


def env_int(name: str, default: int | None, *, minimum: int | None = None) -> int | None:
    return _env(name, default, lambda t: parse_int(t, minimum))


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    return _env(name, default, lambda t: parse_choice(t, choices))


def env_path(name: str, default: Path) -> Path:
    value = _raw(name)
    return Path(value).expanduser() if value is not None else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    return default if value is None else [v.strip() for v in value.split(",") if v.strip()]


def env_duration(name: str, default: float, *, minimum: float | None = None) -> float:
    """Seconds; negative means "forever" where a setting allows it (one with a `minimum` does not)."""
    seconds = _env(name, default, parse_duration, "write a duration like 30s, 5m, 1.5h or 7d")
    if minimum is not None and seconds < minimum:
        raise _bad(name, _raw(name) or str(default), f"must be at least {minimum:g}s")
    return seconds


def env_size(name: str, default: int | None) -> int | None:
    """Bytes from "512M", "4G", "3.5GiB" or a plain number of bytes."""
    return _env(name, default, parse_bytes)


def env_options(cls: type) -> dict:
    """The options of an option set (`inference.options`) given as `RKMOJO_<NAME>` variables, checked by its
    schema: `RKMOJO_TEMPERATURE=5` fails naming the variable and the range."""
    from inference.options import from_env

    try:
        return from_env(cls)
    except ValueError as e:
        raise ImproperlyConfigured(str(e)) from None
