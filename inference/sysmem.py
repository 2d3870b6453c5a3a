"""The machine's memory as /proc/meminfo states it (the bench, the worker's budget, the engine's resident copies)."""

from __future__ import annotations

from pathlib import Path


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    out = {}
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        k, v = line.split(":", 1)
        parts = v.split()
        out[k] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out
