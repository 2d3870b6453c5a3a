"""Expert streaming: the routed experts of each MoE layer come from NVMe into a few cache slots.

`StreamingExperts.run` is the layer's expert phase: count the request, submit the misses, do the
work that needs no missing expert (the shared expert, the cached experts) while the reads land,
then the remaining experts as their reads land. When the misses outnumber the free slots (a prompt
after a chat filled the cache), the cached experts come first, so that their slots are reading
during the shared expert. A landed read is checked (digest) and repacked on a lander thread (a
prefetch: on its reader thread) while the engine computes the experts landed before it; experts
landed by the time the engine gets to them are computed in one call. When a layer wants more
experts at once than it has slots (prefill, or tiny caches), it streams them through its slots:
each computed expert's slot takes the next read. A prompt's gate lookahead reads the next layer's
experts ahead, into its pool and into the slots of layers the pass has finished (its first layers
also into those of the layers it reaches last).
The math is the caller's (`moe.mixture`); its results do not depend on the order experts arrive in
or on how they are grouped, so every cache setting gives the same bits as the all-resident run.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable

import numpy as np

from ..errors import ModelFormatError
from ..options import OptionError
from ..store.format import digest_bytes
from ..sysmem import meminfo
from .cache import PAGE, CacheSnapshot, LayerCache, LayerStats, SlotPool, _switch
from ..kernels.repack import as_repacked, repack_expert, repackable_kind
from .io import LayerFiles, ReadRequest, ThreadReader, open_reader

log = logging.getLogger(__name__)

VERIFY_MODES = ("off", "first", "always")
LAND_WORKERS = 2  # threads that check and repack demand reads as they land
GROUP_MAX = 8  # experts landed together computed in one call, at most (a call's temporaries grow with it)
RESIDENT_COPY_SHARE = 0.8  # repacked resident experts may take this share of the available memory
# a generated token's lookahead reads at most this many experts per layer (its best guesses), however many
# prefetch slots there are: on the uniform Gemma 4 store 95 % of 2 guesses were used, 74-79 % of 6-10,
# and the unused reads take the disk from the misses; the slots beyond it serve prompts (a whole pool).
# A streaming engine reads them even with no prefetch slots, into two pools of this many slots: started
# once a layer's own reads have landed, they keep the disk busy through the next layer's attention
# (11 cache slots in 3 GiB: decode 1.09-1.17x in 5 of 6 runs, benchmarks/token_lookahead_ab.py). 0: off.
TOKEN_PREFETCH_ENV = "RKMOJO_TOKEN_PREFETCH"


def token_prefetch() -> int:
    """$RKMOJO_TOKEN_PREFETCH, default 3 (see above).

    Raises:
        OptionError: the variable is not a whole number >= 0.
    """
    text = os.environ.get(TOKEN_PREFETCH_ENV, "3").strip()
    if not text.isdigit():
        raise OptionError(TOKEN_PREFETCH_ENV, text, "a whole number of guesses per layer, 0 (off) or more (default 3)")
    return int(text)


def lookahead_pools(prefetch: int, n_layers: int, guesses: int) -> tuple[int, int]:
    """(pools, slots per pool) of the gate lookahead, which the MoE layers take in turn. `prefetch` slots
    per layer (the memory plan's count) make two pools of half the layers' worth each, so that a prompt
    reads the next layer's experts while this one computes; with none, two pools of a token's `guesses`."""
    if n_layers == 0 or not (prefetch or guesses):
        return 0, 0
    pools = 2 if n_layers > 1 else 1
    return pools, max(prefetch, prefetch * n_layers // 2) if prefetch else guesses


# A prompt's lookahead reads the next layer's experts beyond its pool into cache slots lent by the layers
# this pass has finished (their cached experts are dropped; every slot lent is empty again once the
# borrowing layer has computed it): without them the disk idles through each layer's attention, with them
# it reads on (benchmarks/README.md, "a prompt reads ahead into the slots of the layers it has finished"). 0: off.
PROMPT_LEND_ENV = "RKMOJO_PROMPT_LEND"


def prompt_lend() -> bool:
    """$RKMOJO_PROMPT_LEND, default 1 (see above)."""
    return _switch(PROMPT_LEND_ENV, True, "a prompt borrows finished layers' slots")


# A miss that a generated token's lookahead read is computed from its lookahead slot and stays out of the
# cache, so an expert the lookahead keeps guessing right is read again at each use. 1: promoted, it is then
# copied into a cache slot if the policy would keep it (`LayerCache.admits`). Off by default: on the skewed
# Gemma 4 shapes in 3 GiB it read 5 % fewer bytes per token and decoded 0.93-0.99x as fast, with or without
# the copy (benchmarks/README.md, "lookahead reads promoted into the cache").
PROMOTE_ENV = "RKMOJO_PROMOTE"


def promote_prefetched() -> bool:
    """$RKMOJO_PROMOTE, default 0 (see above)."""
    return _switch(PROMOTE_ENV, False, "lookahead reads enter the cache")


# A generated token's k-th guess is read only while the k-th guesses have been right often enough: each
# layer's candidates (the best `token_prefetch` experts not cached, in the router's order) are scored against
# the experts the layer then asks for, read or not, so a rank left out keeps being measured. Per rank, an
# average over about the last GUESS_WINDOW layer calls; a rank is read while its share is at least
# $RKMOJO_GUESS_PRECISION (default GUESS_PRECISION_DEFAULT; 0: every guess, as before). A wrong guess takes
# the disk from a miss, and the more the cache holds, the less often a later guess is right. On the uniform
# Gemma 4 store the third guess was right 85-87 % of the time in 3 GiB and paid (3 guesses against 2: 1.05x),
# 77-79 % in 6 GiB and did not (2 against 3: 1.04-1.09x); a fourth, right 80 % in 3 GiB, did not either
# (0.98x). This rule in 6 GiB against every guess: 0.99-1.07x, 2.1 ranks read (benchmarks/README.md,
# "guesses read while they are right", token_lookahead_ab.py --min-precision).
GUESS_PRECISION_ENV = "RKMOJO_GUESS_PRECISION"
GUESS_PRECISION_DEFAULT = 0.82
GUESS_WINDOW = 256


def guess_precision() -> float:
    """$RKMOJO_GUESS_PRECISION (see above).

    Raises:
        OptionError: the variable is not a share between 0 and 1.
    """
    text = os.environ.get(GUESS_PRECISION_ENV, str(GUESS_PRECISION_DEFAULT)).strip()
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= 1.0:
        raise OptionError(GUESS_PRECISION_ENV, text, "a share between 0 and 1 that a guess rank must be right (0: all)")
    return v


PREFETCH_WORKERS = 16  # reader threads of the prefetch (the demand reads have their own reader); a prompt fills a pool


def stored_repacked(lay) -> bool:
    """Whether a layer's experts are stored repacked (`rkmojo repack`): nothing to repack where they land."""
    return not any(repackable_kind(spec["kind"], spec["shape"]) for spec in lay.tensors.values())


class ResidentExperts:
    """All experts memory-mapped from the store, or held as repacked copies (`repack_experts`); no cache,
    no IO of our own."""

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


class StreamingExperts:
    """Per-layer slot caches fed by parallel direct reads.

    Args:
        store: the opened store.
        slots: cache slots per MoE layer.
        policy: "lfu" or "lru".
        io: "auto", "uring" or "threads".
        verify: digest check of blobs: "off", "first" (first load of each blob) or "always".
        prefetch: the gate lookahead's slots per layer, for prompts (`lookahead_pools`).
        guesses: a generated token's lookahead reads per layer (default: $RKMOJO_TOKEN_PREFETCH; 0: off).
        lend: a prompt's lookahead also reads into slots lent by the layers its pass has finished
            (default: $RKMOJO_PROMPT_LEND).
        promote: a generated token's misses read by the lookahead are copied into the cache once computed,
            if the policy keeps them (default: $RKMOJO_PROMOTE).
    """

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
        guesses: int | None = None,
        lend: bool | None = None,
        promote: bool | None = None,
    ):
        self.streams = True  # reads cost: a prompt goes layer by layer (`Transformer.pass_forward`)
        if verify not in VERIFY_MODES:
            raise OptionError("verify_experts", verify, f"one of {', '.join(VERIFY_MODES)}")
        if slots < 1:
            raise OptionError("expert_slots", slots, "at least 1 slot per layer")
        self.store = store
        self.verify = verify
        self.layouts = store.expert_layers
        self.caches: dict[int, LayerCache] = {}
        for layer, lay in self.layouts.items():
            pool = SlotPool(min(slots, lay.n_experts), lay.blob_size)
            self.caches[layer] = LayerCache(lay.n_experts, pool, policy)
        self.reader = open_reader(store, io, direct=direct)
        self.verified: set[tuple[int, int]] = set()
        self.mismatched: set[tuple[int, int]] = set()  # found bad by `check_unchecked`: not tried again
        self.repacked = False  # experts repacked in their slots as they land (`repack_experts`)
        self._stored_repacked = {layer: stored_repacked(lay) for layer, lay in self.layouts.items()}
        # gate-lookahead prefetch: its own slots per layer and its own reader threads, so a
        # prefetch never takes a demand read's slot or waits in front of it in a queue
        # Only the next layer prefetches at a time, so the lookahead's slots form two pools that alternate
        # between the layers (`lookahead_pools`): one token's lookahead takes its best guesses' worth, a
        # prompt's (every expert wanted) a whole pool.
        self.prefetch_slots = prefetch
        guesses = token_prefetch() if guesses is None else guesses
        self.token_prefetch = min(prefetch, guesses) if prefetch else guesses
        # per guess rank: the share of recent layer calls whose k-th candidate the layer then asked for
        # (starts at 1: every rank read until measured), and the counts behind it (`stats`)
        self.guess_min = guess_precision()
        ranks = max(self.token_prefetch, lookahead_pools(prefetch, len(self.layouts), guesses)[1])
        self.guess_right = np.ones(ranks)
        self.guess_scored = np.zeros(ranks, np.int64)
        self.guess_used = np.zeros(ranks, np.int64)
        self._candidates: dict[int, list[int]] = {}  # layer -> this token's candidates, in rank order
        # landing (digest check, repack) off the engine's thread: a demand read's on these threads, while
        # the engine computes the experts landed before it; a prefetch's on its reader thread
        self.lander = ThreadPoolExecutor(max_workers=LAND_WORKERS, thread_name_prefix="rkmojo-land")
        self.pf_pools: dict[int, SlotPool] = {}
        self.pf_pending: dict[int, dict[int, tuple]] = {}
        self.pf_running: dict[int, list] = {}  # per pool: unused prefetch reads still landing in its slots
        # the lookahead `prefetch` asked for, started by the current `run`: (layer, experts, how many, only
        # once the layer's reads have landed)
        self._deferred: tuple[int, list, int, bool] | None = None
        order = sorted(self.layouts)
        self.lend = prompt_lend() if lend is None else lend
        self.promote = promote_prefetched() if promote is None else promote
        self._place = {layer: k for k, layer in enumerate(order)}
        self._order = order
        # slots lent to a prompt's lookahead: lender layer -> [(slot, the read's batch, borrowing layer, expert)]
        self.loans: dict[int, list[tuple[int, object, int, int]]] = {}
        # told the order reads landed in and what the lookahead did to the caches, which a replay of the
        # requests alone cannot know (they depend on timing): `cachesim.TraceRecorder`
        self.observer = None
        pools, n = lookahead_pools(prefetch, len(order), guesses)
        # a token's guesses go on the demand reads' ring where there is one (`io.UringReader`), chained
        # behind the layer's last reads (a kernel too old to link them: the prefetch threads)
        self.guess_reader = self.reader if self.reader.name == "uring" and self.reader.links else None
        if pools:
            self.pf_reader = ThreadReader(LayerFiles(store, direct), workers=PREFETCH_WORKERS)
            blob = max(lay.blob_size for lay in self.layouts.values())
            shared = [SlotPool(n, blob) for _ in range(pools)]
            for k, layer in enumerate(order):
                self.pf_pools[layer] = shared[k % len(shared)]
                self.pf_pending[layer] = {}

    def repack_experts(self) -> None:
        """From now on each expert read is repacked in its slot as it lands, after its digest check
        (`kernels.repack`; same layout as `ResidentExperts.repack_experts`, so the same bits). Call
        before the first forward: slots filled before hold the store's layout and are emptied."""
        self.repacked = True
        for cache in self.caches.values():
            cache.slot_expert[:] = -1
            cache.where.clear()

    def _view(self, layer: int, buf: np.ndarray) -> dict:
        """The expert in slot memory `buf` (landed: see `_land`)."""
        w = self.layouts[layer].view(buf)
        return as_repacked(w) if self.repacked else w

    def _land(self, r: ReadRequest, buf: np.ndarray) -> dict:
        """A completed read into `buf`: its digest check, then (`repacked`) its repacking in place; the
        expert's views. Runs on any thread (a lander, a prefetch reader): it touches only `buf` and adds
        to `verified`."""
        self._check(r)
        w = self.layouts[r.layer].view(buf)
        return repack_expert(w, in_place=True) if self.repacked else w

    def _landed(self, buf: np.ndarray, r: ReadRequest) -> tuple[ReadRequest, dict]:
        return r, self._land(r, buf)

    def _lands_free(self, r: ReadRequest) -> bool:
        """Whether landing `r` is only making its views: its digest is checked already (or never) and
        nothing is repacked (the store holds its experts repacked). The engine then lands it itself: a
        lander thread would first have to wake and take the GIL, which kept the engine waiting 12 ms per
        token in 3 GiB (`benchmarks/README.md`, "landing on the engine's thread")."""
        checked = self.verify == "off" or (self.verify == "first" and (r.layer, r.expert) in self.verified)
        return checked and self._nothing_to_repack(r.layer)

    def _nothing_to_repack(self, layer: int) -> bool:
        """Whether a read of `layer` lands without a repack: none asked for, or the store holds it repacked."""
        return not self.repacked or self._stored_repacked[layer]

    @property
    def wants_prefetch(self) -> bool:
        return bool(self.pf_pools)

    def prefetch(self, layer: int, experts, rows: int = 1) -> None:
        """Read the experts layer `layer` is predicted to miss (most likely first) into its prefetch
        slots, to keep the disk reading through the next layer's attention without slowing the reads the
        current layer waits for (`run` starts them):
        - a prompt (`rows` > 1, whose layer wants nearly every expert): a whole pool, then (`lend`) as
          many cache slots lent by the layers this pass has finished as its other guesses need, once
          the current layer's own reads are all submitted, so they follow those on the disk;
        - a generated token: its best `token_prefetch` guesses, once the current layer's reads have all
          landed (started alongside them, they slowed those reads: decode 1.04x against 1.15x).
        Experts already cached are skipped."""
        if layer not in self.pf_pools:
            return
        self._deferred = None
        self._candidates.pop(layer, None)
        if rows > 1:  # the pool, then (`lend`) as many lent slots as the layer's other guesses need
            n = self.layouts[layer].n_experts if self.lend else self.pf_pools[layer].n
            self._deferred = (layer, list(experts), n, False)
        elif self.token_prefetch:
            cache = self.caches[layer]
            cands = [e for e in dict.fromkeys(int(e) for e in experts) if e not in cache.where]
            self._candidates[layer] = cands[: min(self.token_prefetch, len(self.guess_right))]
            n = self.guess_ranks()
            if n:
                self._deferred = (layer, list(experts), min(self.pf_pools[layer].n, n), True)

    def guess_ranks(self) -> int:
        """How many of a token's guesses to read now: the leading ranks right at least `guess_min` of the time."""
        n, most = 0, min(self.token_prefetch, len(self.guess_right))
        while n < most and self.guess_right[n] >= self.guess_min:
            n += 1
        return n

    def _score_guesses(self, layer: int, experts) -> None:
        """Score the candidates a token's lookahead named for `layer` (read or not) against what it asks for."""
        cands = self._candidates.pop(layer, None)
        if not cands:
            return
        want = {int(e) for e in experts}
        rate = 1.0 / GUESS_WINDOW
        for k, e in enumerate(cands):
            used = e in want
            self.guess_right[k] += rate * (used - self.guess_right[k])
            self.guess_scored[k] += 1
            self.guess_used[k] += used

    def _on_ring(self, layer: int) -> bool:
        """Whether a token's guesses for `layer` go on the demand reads' ring: where there is one, and landing
        them takes the engine no more than a digest check (nothing to repack), for it lands them itself."""
        return self.guess_reader is not None and self._nothing_to_repack(layer)

    def _start_prefetch(self, layer: int, experts, n: int, token: bool = False, chained: bool = False) -> None:
        """`chained`: a token's guesses, held back to follow the reads submitted next (`io.UringReader`)."""
        pool = self.pf_pools[layer]
        ring = token and self._on_ring(layer)
        reader = self.guess_reader if ring else self.pf_reader
        more = {"chained": True} if ring and chained else {}
        self._settle_prefetch(layer, wait=True)
        cache, lay = self.caches[layer], self.layouts[layer]
        length = -(-lay.blob_size // PAGE) * PAGE
        todo = [int(e) for e in dict.fromkeys(experts) if int(e) not in cache.where][:n]
        slots = [(pool, s, None) for s in range(min(pool.n, len(todo)))]
        if len(todo) > len(slots):  # a prompt's guesses beyond the pool (n > pool.n only when `lend`)
            slots += self._borrow(layer, len(todo) - len(slots), length)
        for (buf, s, lender), e in zip(slots, todo):
            r = ReadRequest(layer, e, s, buf.memoryview(s), e * lay.stride, length)
            land = functools.partial(self._landed, buf.view(s))  # lands in its reader thread
            batch = reader.submit([r], then=land, **more)
            self.pf_pending[layer][e] = (r, batch)
            if lender is not None:
                self.loans.setdefault(lender, []).append((s, batch, layer, e))
                cache.stats.borrowed += 1
            cache.stats.prefetched += 1

    def _borrow(self, layer: int, n: int, length: int) -> list[tuple[SlotPool, int, int]]:
        """Up to `n` cache slots, as (pool, slot, lender), lent by the layers before the one running now
        (`layer` is the next one): this pass has finished them, so only a later pass or token needs their
        experts. Empty slots first, then the least requested experts (LFU counts), which leave the cache.
        Where those are too few (the pass's first layers), the layers after `layer` lend too, the last to
        run first: their experts that leave the cache are read again when they run, late in the pass,
        where the prompt waits for the CPU and the disk has time, while the first layers wait for it.
        A slot lent to a layer that has run since is lent again once no read is landing in it."""
        place = self._place[layer]
        later = self._order[place + 1 :][::-1]
        offers = []
        for lender in self._order[: max(place - 1, 0)] + later:
            cache = self.caches[lender]
            rank = later.index(lender) + 1 if self._place[lender] > place else 0  # finished layers first
            if cache.pool.slot_bytes < length:
                continue
            loans = self.loans.get(lender, [])
            for loan in list(loans):
                _, batch, borrower, _ = loan
                if self._place[borrower] < place - 1:  # it has run: the slot is free once its read ended
                    batch.cancel()
                    if not batch.pending:
                        loans.remove(loan)
                        self._forget(loan)
            lent = {s for s, *_ in loans}
            for s in range(cache.pool.n):
                if s not in lent:
                    e = int(cache.slot_expert[s])
                    offers.append((rank, -1 if e < 0 else int(cache.counts[e]), lender, s))
        offers.sort()
        out = []
        for *_, lender, s in offers[:n]:
            e = int(self.caches[lender].slot_expert[s])
            self.caches[lender].drop(s)
            if e >= 0 and self.observer is not None:
                self.observer.lent(lender, e)
            out.append((self.caches[lender].pool, s, lender))
        return out

    def _reclaim(self, lender: int) -> None:
        """Take back the slots `lender` lent: reads not started are dropped, running ones waited for, and a
        borrowing layer that has not computed its expert yet forgets it (it reads it itself)."""
        for loan in self.loans.pop(lender, ()):
            loan[1].cancel()
            loan[1].abandon()
            self._forget(loan)

    def _reclaim_all(self) -> None:
        for lender in list(self.loans):
            self._reclaim(lender)

    def _forget(self, loan) -> None:
        """A borrowing layer that has not computed the expert of an ended loan (its run failed) reads it itself."""
        _, batch, layer, e = loan
        got = self.pf_pending.get(layer, {}).get(e)
        if got is not None and got[1] is batch:
            del self.pf_pending[layer][e]

    def _start_deferred(self, landed: bool, chained: bool = False) -> None:
        """Start the lookahead `prefetch` left for this layer's `run`: a prompt's once the layer's reads
        are submitted, a token's once they have `landed` too, or (`chained`) held back to follow them."""
        if self._deferred is not None and (landed or chained or not self._deferred[3]):
            layer, experts, n, token = self._deferred
            self._deferred = None
            self._start_prefetch(layer, experts, n, token, chained)

    def _settle_prefetch(self, layer: int, wait: bool = False) -> None:
        """Forget the layer's unused prefetches: the queued ones are cancelled; one still running is
        waited for only when its slot is about to be reused (`wait`), i.e. at its pool's next prefetch."""
        running = self.pf_running.setdefault(id(self.pf_pools[layer]), [])
        for _, batch in self.pf_pending[layer].values():
            self.caches[layer].stats.prefetch_cancelled += batch.cancel()
            if batch.pending:
                running.append(batch)
        self.pf_pending[layer].clear()
        if wait:
            for batch in running:
                batch.abandon()
            running.clear()

    def _take_prefetched(self, layer: int, misses: list[int], compute: Callable, promote: bool) -> list[int]:
        """Compute the misses that a prefetch already read (landed in its reader thread), those landed
        by now together in one call, then the others as they land; returns the misses still to read.
        `promote`: each one computed is then copied into a cache slot if the cache admits it."""
        pending = self.pf_pending.get(layer)
        if not pending:
            return misses
        cache = self.caches[layer]
        stats, rest, todo = cache.stats, [], {}
        for e in misses:
            if e in pending:
                todo[e] = pending.pop(e)
            else:
                rest.append(e)
        landed: dict[int, tuple] = {}  # expert -> (request, weights): read and landed, not computed yet
        try:
            while todo or landed:
                for e, (_, batch) in list(todo.items()):
                    for got in batch.ready():
                        landed[e] = got
                        del todo[e]
                if not landed:  # none landed yet: wait for the first
                    e, (_, batch) = next(iter(todo.items()))
                    t = time.perf_counter()
                    for got in batch.wait_one():
                        landed[e] = got
                    del todo[e]
                    stats.read_seconds += time.perf_counter() - t
                group = list(landed.items())[:GROUP_MAX]
                for e, (r, _) in group:  # read and landed (`_start_prefetch`)
                    del landed[e]
                    stats.bytes_read += r.length
                    stats.prefetch_hits += 1
                compute([(e, w) for e, (_, w) in group])
                for e, (r, _) in group if promote else ():  # the lookahead's slot is still this read's
                    if cache.admits(e):
                        self._promote(layer, e, r)
        finally:  # an error: reads still landing in the pool's slots must end before the slots are reused
            for _, batch in todo.values():
                batch.abandon()
        self._settle_prefetch(layer)
        return rest

    def _promote(self, layer: int, e: int, r: ReadRequest) -> None:
        """Copy expert e, landed in a lookahead slot (`r.dest`), into a cache slot of its layer."""
        cache, n = self.caches[layer], self.layouts[layer].blob_size
        s = cache.assign(e)
        cache.pool.view(s)[:n] = np.frombuffer(r.dest, np.uint8, n)
        cache.fill(e, s)
        cache.pinned.discard(s)
        cache.stats.promoted += 1
        if self.observer is not None:
            self.observer.promoted(layer, e)

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

    def _check(self, r: ReadRequest) -> None:
        lay = self.layouts[r.layer]
        if self.verify == "off" or (self.verify == "first" and (r.layer, r.expert) in self.verified):
            return
        if digest_bytes(r.dest[: lay.blob_size]).hexdigest() != lay.digests[r.expert]:
            raise ModelFormatError(
                f"{self.store.path}: experts/layer_{r.layer:02d}.bin expert {r.expert} digest mismatch; "
                "re-run `rkmojo pull` or `rkmojo convert`"
            )
        self.verified.add((r.layer, r.expert))

    def _top_up(self, layer: int, batch, queue: list[int]):
        """Submit the next misses of `queue` into every slot that is free now (not pinned); returns the
        batch they joined (a new one when `batch` is None). Once the queue is empty, a prompt's prefetch
        for the next layer starts (`prefetch`), and a token's too when no read is in flight."""
        cache = self.caches[layer]
        n = min(len(queue), cache.pool.n - len(cache.pinned))
        d = self._deferred
        if n == len(queue) and d is not None and d[3] and self._on_ring(d[0]):
            # a token's guesses, on the ring behind the reads submitted now (the layer's last): each starts
            # as one of them lands
            self._start_deferred(landed=False, chained=True)
        if n > 0:
            reqs = self._requests(layer, queue[:n])
            del queue[:n]
            if batch is None:
                batch = self.reader.submit(reqs)
            else:
                batch.add(reqs)
        if self.guess_reader is not None and self.guess_reader.chained:
            self.guess_reader.flush()  # no read of this layer was left to follow
        if not queue:
            self._start_deferred(landed=batch is None or not batch.pending)
        return batch

    def _drain(self, layer: int, batch, compute: Callable, queue: list[int]) -> None:
        """Compute each expert of `batch` as its read lands; the slot it leaves takes the next miss in
        `queue` at once, so the disk never waits for a tile of computations to end. Landed reads are
        checked and repacked on the lander threads (`_land`) while the engine computes the experts
        landed before them, in the order their reads landed."""
        cache = self.caches[layer]
        stats = cache.stats
        landing: collections.deque = collections.deque()  # (request, its landing's future), read order

        def land(reqs) -> None:
            for r in reqs:
                if self._lands_free(r):
                    fut: Future = Future()
                    fut.set_result(self._land(r, cache.pool.view(r.slot)))
                else:
                    fut = self.lander.submit(self._land, r, cache.pool.view(r.slot))
                landing.append((r, fut))

        try:
            while True:
                land(batch.ready())
                if not queue and not batch.pending:  # every read of the layer landed: a token's lookahead
                    self._start_deferred(landed=True)
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
                        if self.observer is not None:
                            self.observer.filled(layer, r.expert)
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
        if layer in self.loans:
            self._reclaim(layer)
        self._score_guesses(layer, experts)
        hits, misses = cache.request(experts)
        cache.pin(hits.values())
        batch = None
        try:
            prefetched = set(self.pf_pending.get(layer, ()))
            queue = [e for e in misses if e not in prefetched]
            batch = self._top_up(layer, None, queue)
            fits = not queue  # every miss had a free slot (a generated token)
            if queue and hits:  # misses wait for the slots the hits hold (a prompt): free those first
                compute([(e, self._view(layer, cache.pool.view(s))) for e, s in hits.items()])
                cache.pinned.difference_update(hits.values())
                hits = {}
                batch = self._top_up(layer, batch, queue)
            extra = during_io() if during_io else None  # the shared work, while the reads land
            if hits:
                compute([(e, self._view(layer, cache.pool.view(s))) for e, s in hits.items()])
            cache.pinned.difference_update(hits.values())
            took = [e for e in misses if e in prefetched]  # computed from the lookahead's slots
            if took and self.observer is not None:
                self.observer.took(layer, took)
            # promoted only when no miss of this call waited for a slot (a prompt's layer needs them all)
            self._take_prefetched(layer, took, compute, promote=self.promote and fits)
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
            "guesses": {
                "min_precision": self.guess_min,
                "scored": self.guess_scored.tolist(),
                "right": self.guess_used.tolist(),
                "recent": self.guess_right.round(3).tolist(),
                "reading": self.guess_ranks(),
            },
        }

    def snapshot(self) -> dict[int, CacheSnapshot]:
        """Per MoE layer: its experts' whole-run hits and misses and which experts are held (cache slots,
        prefetch slots). Read-only and lock-free: another thread may call it while a generation runs."""
        out = {}
        for layer, c in list(self.caches.items()):
            snap = c.snapshot()
            pending = self.pf_pending.get(layer)
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
        self._reclaim_all()
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
                    self._land(r, cache.pool.view(r.slot))
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
        """Check the digests of experts that no read has checked yet, in store order, for about `seconds`
        (at least one expert per call); returns how many are left to check. Call while no generation runs.

        With `verify` "first", an expert is checked on its first read and trusted after; checked here, a
        prompt's first reads of it are trusted too, so the first prompt after a load no longer pays for the
        hashing (12.8 GB of experts at 10 GB/s: 1.2 s of CPU on the Gemma 4 shapes). Each expert is read
        through the buffered file into memory of its own, its pages dropped after, so no slot or cache
        changes. An expert whose digest does not match stays unchecked and is not tried again: the prompt
        that reads it fails with the usual message. Nothing to check with `verify` "off" or "always"."""
        if self.verify != "first":
            return 0
        files = self.reader.files
        t0, left, checked = time.perf_counter(), 0, 0
        for layer, lay in self.layouts.items():
            for e in range(lay.n_experts):
                if (layer, e) in self.verified or (layer, e) in self.mismatched:
                    continue
                if left or (checked and time.perf_counter() - t0 >= seconds):
                    left += 1
                    continue
                fd = files.buffered[layer]
                blob = os.pread(fd, lay.blob_size, e * lay.stride)
                os.posix_fadvise(fd, e * lay.stride, lay.blob_size, os.POSIX_FADV_DONTNEED)
                if digest_bytes(blob).hexdigest() == lay.digests[e]:
                    self.verified.add((layer, e))
                else:
                    self.mismatched.add((layer, e))
                    log.error(
                        "%s: experts/layer_%02d.bin expert %d digest mismatch; re-run `rkmojo pull` or `rkmojo convert`",
                        self.store.path,
                        layer,
                        e,
                    )
                checked += 1
        return left

    def slot_bytes(self) -> tuple[int, int]:
        """(bytes of the cache slots, bytes of the prefetch slots), over every layer."""
        cache = sum(c.pool.n * c.pool.slot_bytes for c in self.caches.values())
        pools = {id(p): p for p in self.pf_pools.values()}.values()  # shared between the layers
        return cache, sum(p.n * p.slot_bytes for p in pools)

    def reset_stats(self) -> None:
        for c in self.caches.values():
            c.stats = LayerStats()

    def close(self) -> None:
        self._deferred = None
        self._reclaim_all()
        for layer in self.pf_pending:
            self._settle_prefetch(layer, wait=True)
        self.lander.shutdown(wait=True)
        for r in [self.reader] + ([self.pf_reader] if self.pf_pools else []):
            r.close()
            r.files.close()
