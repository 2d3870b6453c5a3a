"""Expert popularity kept across restarts: each MoE layer's per-expert request counts, saved to a file.

A fresh engine's caches are empty, so its first tokens read nearly every expert they route to. With the
counts of earlier runs, `StreamingExperts.warm` fills each layer's slots with its most requested experts
while the worker is idle, and LFU starts from those counts instead of from zero.

The file is NumPy's `.npz` (no pickles): `digest` (the store's, so another model's counts are never
used), and `layer_NN` int64 arrays [experts]. It is written to a temporary name and renamed.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from ..errors import RkmojoError


class PopularityError(RkmojoError):
    """A popularity file that cannot be read; the message names it and the fix."""


def save(path: str | os.PathLike, digest: str, counts: dict[int, np.ndarray]) -> None:
    """Write `counts` (MoE layer → [experts] request counts) for the store `digest`, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f, digest=np.array(digest), **{f"layer_{l:02d}": np.asarray(c, np.int64) for l, c in counts.items()}
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | os.PathLike, digest: str) -> dict[int, np.ndarray] | None:
    """The counts saved for store `digest`; None when there is no file or it belongs to another store.

    Raises:
        PopularityError: the file is truncated or not a popularity file.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["digest"]) != digest:
                return None
            return {int(k[6:]): z[k].astype(np.int64) for k in z.files if k.startswith("layer_")}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise PopularityError(
            f"{path}: not a readable expert popularity file ({e}); delete it, the worker "
            "writes a new one as the model runs"
        ) from None
