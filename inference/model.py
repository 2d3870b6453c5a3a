"""Open a store and build its model: `load_model(path)` → a `Transformer` with `new_cache` and `forward`."""
from __future__ import annotations

import os

from . import models
from .store import Store


def load_model(store: str | os.PathLike | Store, *, chunk: int = 128, **kw):
    """Build the model of `store` with its weights resident (memory-mapped).

    Args:
        store: a store directory or an opened `Store`.
        chunk: prefill chunk size in rows.
    Returns:
        The architecture's `Model`: `m.forward(ids, cache)` → logits [T, vocab]; `m.new_cache()`.
    """
    st = store if isinstance(store, Store) else Store(store)
    arch = models.get(st.architecture)
    return arch.Model(arch.Args.from_dict(st.config), st, chunk=chunk, **kw)
