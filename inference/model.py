"""Open a store and build its model: `load_model(path)` → a `Transformer` with `new_cache` and `forward`."""

from __future__ import annotations

import os

from . import models, steps
from .store import Store


def load_model(store: str | os.PathLike | Store, *, chunk: int = 128, **kw):
    """Build the model of `store` with its weights resident (memory-mapped), or with the expert provider
    given as `experts=` (MoE architectures).

    Args:
        store: a store directory or an opened `Store`.
        chunk: prefill chunk size in rows.
    Returns:
        The architecture's `Model`: `m.forward(ids, cache)` → logits [T, vocab]; `m.new_cache()`.
    """
    st = store if isinstance(store, Store) else Store(store)
    arch = models.get(st.architecture)
    model = arch.Model(arch.Args.from_dict(st.config), st, chunk=chunk, **kw)
    model.step_class = steps.for_model(model)  # the compiled one-token path, if the architecture has one
    return model


def empty_cache(store: Store, *, chunk: int = 128, kv_dtype: str = "f32"):
    """The KV cache `load_model(store, chunk=…, kv_dtype=…)` would make, without building the model."""
    from .models.base import KV_DTYPES

    arch = models.get(store.architecture)
    return arch.Model.cache_for(arch.Args.from_dict(store.config), chunk, KV_DTYPES[kv_dtype])
