"""The expert phase of a layer whose experts stream: `StreamingExperts.run`.

Count the request, submit the misses, do the work that needs no missing expert (the shared expert, the
cached experts) while the reads land, then the remaining experts as their reads land. When the misses
outnumber the free slots (a prompt after a chat filled the cache), the cached experts come first, so that
their slots are reading during the shared expert. A landed read is checked and repacked on a lander thread
(`landing`) while the engine computes the experts landed before it; experts landed by the time the engine
gets to them are computed in one call. When a layer wants more experts at once than it has slots (prefill,
or tiny caches), it streams them through its slots: each computed expert's slot takes the next read.
The lookahead (`lookahead`) reads the next layer's experts ahead; its reads start from here, after the
layer's own.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from concurrent.futures import wait
from typing import Callable

import numpy as np

from ..options import OptionError
from .cache import PAGE, CacheSnapshot, LayerCache, LayerStats, SlotPool
from .io import ReadRequest, open_reader
from .landing import GROUP_MAX, Landing
from .lookahead import TOKEN_PREFETCH, Lookahead


class StreamingExperts:
    """Per-layer slot caches fed by parallel direct reads.

    Args:
        store: the opened store.
        slots: cache slots per MoE layer.
        policy: "lfu" or "lru".
        io: "auto", "uring" or "threads".
        verify: digest check of blobs: "off", "first" (first load of each blob) or "always".
        direct: O_DIRECT reads where the filesystem takes them.
        prefetch: the gate lookahead's slots per layer, for prompts (`lookahead.lookahead_pools`).
        guesses: a generated token's lookahead reads per layer (0: off).
        hugepages: slots in transparent huge pages where the kernel has them.

    Raises:
        OptionError: `verify` or `slots` out of range, named as the engine's options.
    """

    streams = True  # reads cost: a prompt goes layer by layer (`Transformer.pass_forward`)

    def __init__(
        self,
        store,
        slots: int,
        *,
        policy: str = "lfu",
        io: str = "auto",
        verify: str = "first",
        direct: bool = True,
        prefetch: int = 0,
        guesses: int = TOKEN_PREFETCH,
        hugepages: bool = True,
    ):
        self.landing = Landing(store, verify)
        if slots < 1:
            raise OptionError("expert_slots", slots, "at least 1 slot per layer")
        self.store = store
        self.layouts = store.expert_layers
        self.caches: dict[int, LayerCache] = {}
        for layer, lay in self.layouts.items():
            pool = SlotPool(min(slots, lay.n_experts), lay.blob_size, huge=hugepages)
            self.caches[layer] = LayerCache(lay.n_experts, pool, policy)
        self.reader = open_reader(store, io, direct=direct)
        # a token's guesses go on the demand reads' ring where there is one (`io.UringReader`), chained
        # behind the layer's last reads (a kernel too old to link them: the lookahead's threads)
        ring = self.reader if self.reader.name == "uring" and self.reader.links else None
        self.lookahead = Lookahead(
            store, self.caches, self.landing, ring, prefetch=prefetch, guesses=guesses, direct=direct, huge=hugepages
        )
        # told the order reads landed in and what the lookahead did to the caches, which a replay of the
        # requests alone cannot know (they depend on timing): `cachesim.TraceRecorder`
        self._observer = None

    @property
    def observer(self):
        return self._observer

    @observer.setter
    def observer(self, value) -> None:
        self._observer = self.lookahead.lending.observer = value

    @property
    def repacked(self) -> bool:
        return self.landing.repacked

    def repack_experts(self) -> None:
        """From now on each expert read is repacked in its slot as it lands, after its digest check
        (`kernels.repack`; same layout as `ResidentExperts.repack_experts`, so the same bits). Call
        before the first forward: slots filled before hold the store's layout and are emptied."""
        self.landing.repacked = True
        for cache in self.caches.values():
            cache.slot_expert[:] = -1
            cache.where.clear()

    @property
    def wants_prefetch(self) -> bool:
        return bool(self.lookahead.pools)

    def prefetch(self, layer: int, experts, rows: int = 1) -> None:
        """Read the experts layer `layer` is predicted to miss (most likely first) ahead, into lookahead
        slots, once the current layer's `run` has submitted (a prompt, `rows` > 1) or landed (a generated
        token) its own reads (`lookahead.Lookahead.prefetch`). Experts already cached are skipped."""
        self.lookahead.prefetch(layer, experts, rows)

    @property
    def io_name(self) -> str:
        return self.reader.name

    def _requests(self, layer: int, experts: list[int]) -> list[ReadRequest]:
        lay, cache = self.layouts[layer], self.caches[layer]
        length = -(-lay.blob_size // PAGE) * PAGE
        out = []
        for e in experts:
            s = cache.assign(e)
            out.append(ReadRequest(layer, e, s, cache.pool.memoryview(s), e * lay.stride, length))
        return out

    def _top_up(self, layer: int, batch, queue: list[int]):
        """Submit the next misses of `queue` into every slot that is free now (not pinned); returns the
        batch they joined (a new one when `batch` is None). Once the queue is empty, a prompt's lookahead
        for the next layer starts, and a token's too when no read is in flight."""
        cache = self.caches[layer]
        n = min(len(queue), cache.pool.n - len(cache.pinned))
        if n == len(queue):  # the layer's last reads
            self.lookahead.chain()
        if n > 0:
            reqs = self._requests(layer, queue[:n])
            del queue[:n]
            if batch is None:
                batch = self.reader.submit(reqs)
            else:
                batch.add(reqs)
        self.lookahead.flush()
        if not queue:
            self.lookahead.start_deferred(landed=batch is None or not batch.pending)
        return batch

    def _drain(self, layer: int, batch, compute: Callable, queue: list[int]) -> None:
        """Compute each expert of `batch` as its read lands; the slot it leaves takes the next miss in
        `queue` at once, so the disk never waits for a tile of computations to end. Landed reads are
        checked and repacked (`landing`) while the engine computes the experts landed before them, in the
        order their reads landed."""
        cache = self.caches[layer]
        stats = cache.stats
        landing: collections.deque = collections.deque()  # (request, its landing's future), read order

        def land(reqs) -> None:
            for r in reqs:
                landing.append((r, self.landing.submit(r, cache.pool.view(r.slot))))

        try:
            while True:
                land(batch.ready())
                if not queue and not batch.pending:  # every read of the layer landed: a token's lookahead
                    self.lookahead.start_deferred(landed=True)
                if landing:  # the oldest landing, and with it every later one already landed: one call
                    r, fut = landing.popleft()
                    t = time.perf_counter()
                    done = [(r, fut.result())]
                    stats.land_seconds += time.perf_counter() - t
                    while landing and landing[0][1].done() and len(done) < GROUP_MAX:
                        r, fut = landing.popleft()
                        done.append((r, fut.result()))
                    compute([(r.expert, w) for r, w in done])
                    for r, _ in done:  # one by one, as `cachesim.serve` replays them
                        cache.fill(r.expert, r.slot)
                        if self._observer is not None:
                            self._observer.filled(layer, r.expert)
                        stats.bytes_read += r.length
                        cache.pinned.discard(r.slot)  # computed: this layer needs it no more
                        self._top_up(layer, batch, queue)
                elif batch.pending:
                    t = time.perf_counter()
                    land(batch.wait_one())
                    stats.read_seconds += time.perf_counter() - t
                else:
                    return
        finally:  # an error: landings still running write into slots that are about to be handed out
            wait([fut for _, fut in landing])

    def run(self, layer: int, experts, compute: Callable, during_io: Callable | None = None):
        """Call compute([(e, weights), ...]) so that every expert in `experts` is in exactly one batch (the
        cached ones together, the others as their reads land); returns during_io()'s result.

        A layer that wants more experts than it has slots (a prefill) streams them through its slots:
        each slot whose expert has been computed takes the next read at once, so reads stay in flight
        the whole time. Which experts stay cached at the end does not change any result."""
        cache = self.caches[layer]
        ahead = self.lookahead
        if layer in ahead.lending.loans:
            ahead.lending.reclaim(layer)
        ahead.guesses.score(layer, experts)
        hits, misses = cache.request(experts)
        cache.pin(hits.values())
        batch = None
        try:
            prefetched = set(ahead.pending.get(layer, ()))
            queue = [e for e in misses if e not in prefetched]
            batch = self._top_up(layer, None, queue)
            if queue and hits:  # misses wait for the slots the hits hold (a prompt): free those first
                compute([(e, self.landing.view(layer, cache.pool.view(s))) for e, s in hits.items()])
                cache.pinned.difference_update(hits.values())
                hits = {}
                batch = self._top_up(layer, batch, queue)
            extra = during_io() if during_io else None  # the shared work, while the reads land
            if hits:
                compute([(e, self.landing.view(layer, cache.pool.view(s))) for e, s in hits.items()])
            cache.pinned.difference_update(hits.values())
            took = [e for e in misses if e in prefetched]  # computed from the lookahead's slots
            if took and self._observer is not None:
                self._observer.took(layer, took)
            ahead.take(layer, took, compute)
            batch = self._top_up(layer, batch, queue)
            if batch is not None:
                self._drain(layer, batch, compute, queue)
            if queue:  # cannot happen: a drained batch leaves every slot free
                raise RuntimeError(f"expert streaming: layer {layer} left {len(queue)} experts unread")
        except BaseException:
            # slots whose read failed or never completed stay empty (assign() cleared them);
            # reads still in flight must land before those buffers can be handed out again
            if batch is not None:
                batch.abandon()
            raise
        finally:
            cache.unpin_all()
        return extra

    def stats(self) -> dict:
        """Per-layer and total cache/IO statistics."""
        total = LayerStats()
        per = {}
        for layer, c in sorted(self.caches.items()):
            per[layer] = c.stats.as_dict()
            total.add(c.stats)
        return {
            "layers": per,
            "total": total.as_dict(),
            "io": self.io_name,
            "slots": next(iter(self.caches.values())).pool.n if self.caches else 0,
            # per rank of a token's guesses: how often the layer asked for its candidate, read or not
            "guesses": self.lookahead.guesses.as_dict(),
        }

    def snapshot(self) -> dict[int, CacheSnapshot]:
        """Per MoE layer: its experts' whole-run hits and misses and which experts are held (cache slots,
        lookahead slots). Read-only and lock-free: another thread may call it while a generation runs."""
        out = {}
        for layer, c in list(self.caches.items()):
            snap = c.snapshot()
            pending = self.lookahead.pending.get(layer)
            if pending:
                snap = dataclasses.replace(snap, prefetching=tuple(pending))
            out[layer] = snap
        return out

    def popularity(self) -> dict[int, np.ndarray]:
        """Per MoE layer, each expert's request count over this run (what LFU ranks by)."""
        return {layer: c.counts.copy() for layer, c in self.caches.items()}

    def warm(self, counts: dict[int, np.ndarray]) -> int:
        """Fill each layer's empty slots with its most requested experts by `counts` (an earlier run's
        `popularity`) and let LFU start from those counts. Call while no generation runs. Returns the
        experts read; a layer whose expert count differs from `counts` is left as it is."""
        read = 0
        self.lookahead.lending.reclaim_all()
        for layer, cache in self.caches.items():
            saved = counts.get(layer)
            if saved is None or len(saved) != cache.n_experts:
                continue
            cache.counts += saved
            free = cache.pool.n - len(cache.where)
            order = np.argsort(-saved, kind="stable")
            want = [int(e) for e in order if saved[e] > 0 and int(e) not in cache.where][:free]
            if not want:
                continue
            batch = self.reader.submit(self._requests(layer, want))
            try:
                for r in batch.completed():
                    self.landing.land(r, cache.pool.view(r.slot))
                    cache.fill(r.expert, r.slot)
                    cache.stats.warmed += 1
            except BaseException:
                batch.abandon()
                raise
            finally:
                cache.unpin_all()
            read += len(want)
        return read

    def check_unchecked(self, seconds: float) -> int:
        """Check, while no generation runs, the digests no read has checked yet, for about `seconds`;
        returns how many are left (`landing.Landing.check_unchecked`)."""
        return self.landing.check_unchecked(self.reader.files, seconds)

    def slot_bytes(self) -> tuple[int, int]:
        """(bytes of the cache slots, bytes of the lookahead slots), over every layer."""
        cache = sum(c.pool.n * c.pool.slot_bytes for c in self.caches.values())
        return cache, self.lookahead.slot_bytes()

    def reset_stats(self) -> None:
        for c in self.caches.values():
            c.stats = LayerStats()

    def close(self) -> None:
        self.lookahead.close()
        self.landing.close()
        for r in [self.reader] + ([self.lookahead.reader] if self.lookahead.pools else []):
            r.close()
            r.files.close()
