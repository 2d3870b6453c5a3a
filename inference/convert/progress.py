"""A byte-counting progress bar (tqdm) that can be switched off."""

from __future__ import annotations

import contextlib
import sys

from tqdm import tqdm


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool = True):
    """tqdm over `total` bytes, on stderr; a no-op bar when disabled."""
    bar = tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    try:
        yield bar
    finally:
        bar.close()
