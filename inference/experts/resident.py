"""All experts resident: memory-mapped from the store, or held as repacked copies; no cache, no IO of our own."""

from __future__ import annotations

import logging
from typing import Callable

from ..kernels.repack import repack_expert
from ..sysmem import meminfo
from .landing import stored_repacked

log = logging.getLogger(__name__)

RESIDENT_COPY_SHARE = 0.8  # repacked resident experts may take this share of the available memory


class ResidentExperts:
    """All experts memory-mapped from the store, or held as repacked copies (`repack_experts`)."""

    streams = False

    def __init__(self, store):
        self.store = store
        self._views: dict[tuple[int, int], dict] = {}  # (layer, expert) → its tensors, made on first use
        self.repacked = False
        self.not_repacked = ""  # why `repack_experts` kept the store layout

    def repack_experts(self) -> None:
        """Hold every expert as a repacked copy (`kernels.repack`), made now, as llama.cpp repacks at load:
        this reads every expert once (the first tokens would otherwise pay for it), into anonymous memory,
        and unmaps the layer files (their pages become the page cache's to drop). Call before the first
        forward. Where the copies would take more than RESIDENT_COPY_SHARE of the available memory, the
        experts stay memory-mapped in the store layout, as without repacking (`not_repacked` says so):
        an all-resident run of a model larger than RAM pages, where copies could not be paged out."""
        if all(stored_repacked(lay) for lay in self.store.expert_layers.values()):
            self.repacked = True  # `rkmojo repack`: the store's own layout, mapped as it is
            return
        need = sum(lay.stride * lay.n_experts for lay in self.store.expert_layers.values())
        avail = meminfo().get("MemAvailable")
        if avail is not None and need > RESIDENT_COPY_SHARE * avail:
            # copies would not fit where the memory map still runs (paged in and out by the kernel)
            self.not_repacked = (
                f"{need / 2**30:.1f} GiB of experts, {avail / 2**30:.1f} GiB available: kept memory-mapped in the "
                "store layout (a memory budget streams them, repacked, through cache slots)"
            )
            log.warning("experts not repacked: %s", self.not_repacked)
            return
        self.repacked = True
        self._views.clear()
        for layer, lay in self.store.expert_layers.items():
            for e in range(lay.n_experts):
                self._views[(layer, e)] = repack_expert(self.store.expert(layer, e), in_place=False)
            self.store.drop_expert_map(layer)

    def run(self, layer: int, experts, compute: Callable, during_io: Callable | None = None):
        extra = during_io() if during_io else None
        batch = []
        for e in experts:
            e = int(e)
            w = self._views.get((layer, e))
            if w is None:
                w = self._views[(layer, e)] = self.store.expert(layer, e)
            batch.append((e, w))
        compute(batch)  # all at hand: one batch
        return extra

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass
