"""The gate lookahead: the next MoE layer's experts, named by its router on this layer's input, read ahead.

Only the next layer reads ahead at a time, so the lookahead's slots form pools that the MoE layers take in
turn (`lookahead_pools`), with reader threads of their own: a lookahead read never takes a demand read's
slot or waits in front of it in a queue.
- A prompt (every expert wanted) reads a whole pool, then into cache slots the finished layers lend
  (`lending`), once the current layer's own reads are all submitted, so they follow those on the disk.
- A generated token reads its best `token_prefetch` guesses not cached, once the current layer's reads
  have landed; where the demand reads use io_uring, on that ring, chained behind the layer's last reads.
  Its k-th guess is read only while the k-th guesses have been right at least GUESS_PRECISION of the
  time (`GuessScores`): each layer's candidates are scored against what the layer then asks for, read or
  not, so a rank left out keeps being measured.
A miss the lookahead read is computed from its lookahead slot and stays out of the cache (`take`).
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import numpy as np

from .cache import PAGE, LayerCache, SlotPool
from .io import LayerFiles, ReadRequest, ThreadReader
from .landing import GROUP_MAX, Landing
from .lending import Lending

TOKEN_PREFETCH = 3  # a generated token's guesses read per layer, by default (`EngineConfig.token_prefetch`)
GUESS_PRECISION = 0.82  # a guess rank is read while right at least this share of the time (0: always)
GUESS_WINDOW = 256  # a rank's share is an average over about this many recent layer calls
PREFETCH_WORKERS = 16  # reader threads of the lookahead (the demand reads have their own reader)


def lookahead_pools(prefetch: int, n_layers: int, guesses: int) -> tuple[int, int]:
    """(pools, slots per pool) of the gate lookahead, which the MoE layers take in turn. `prefetch` slots
    per layer (the memory plan's count) make two pools of half the layers' worth each, so that a prompt
    reads the next layer's experts while this one computes; with none, two pools of a token's `guesses`."""
    if n_layers == 0 or not (prefetch or guesses):
        return 0, 0
    pools = 2 if n_layers > 1 else 1
    return pools, max(prefetch, prefetch * n_layers // 2) if prefetch else guesses


class GuessScores:
    """Per rank of a token's guesses: the share of recent layer calls whose k-th candidate the layer then
    asked for (`right`, starting at 1: every rank read until measured), and the counts behind it.

    Args:
        ranks: guess ranks scored.
        reads: a token's guesses per layer at most (`token_prefetch`).
        precision: the share a rank must reach to be read (`min`; 0: every rank).
    """

    def __init__(self, ranks: int, reads: int, precision: float = GUESS_PRECISION):
        self.reads = reads
        self.min = precision
        self.right = np.ones(ranks)
        self.scored = np.zeros(ranks, np.int64)
        self.used = np.zeros(ranks, np.int64)
        self.candidates: dict[int, list[int]] = {}  # layer -> this token's candidates, in rank order

    def name(self, layer: int, candidates: list[int]) -> None:
        """The candidates a token's lookahead names for `layer` (read or not), best first."""
        self.candidates[layer] = candidates[: min(self.reads, len(self.right))]

    def ranks(self) -> int:
        """How many of a token's guesses to read now: the leading ranks right at least `min` of the time."""
        n, most = 0, min(self.reads, len(self.right))
        while n < most and self.right[n] >= self.min:
            n += 1
        return n

    def score(self, layer: int, experts) -> None:
        """Score the candidates named for `layer` (read or not) against what it asks for."""
        cands = self.candidates.pop(layer, None)
        if not cands:
            return
        want = {int(e) for e in experts}
        rate = 1.0 / GUESS_WINDOW
        for k, e in enumerate(cands):
            used = e in want
            self.right[k] += rate * (used - self.right[k])
            self.scored[k] += 1
            self.used[k] += used

    def as_dict(self) -> dict:
        return {
            "min_precision": self.min,
            "scored": self.scored.tolist(),
            "right": self.used.tolist(),
            "recent": self.right.round(3).tolist(),
            "reading": self.ranks(),
        }


class Lookahead:
    """The lookahead's pools, its reads in flight and the read `prefetch` asked for, for `StreamingExperts`.

    Args:
        store: the opened store.
        caches: each MoE layer's cache (a read ahead skips the experts cached; stats are counted there).
        landing: lands each read on its reader thread.
        ring: the demand reads' io_uring reader where it can chain reads (`io.UringReader.links`), else None.
        prefetch: slots per layer for prompts (`lookahead_pools`).
        guesses: a generated token's guesses per layer (0: none).
        direct: O_DIRECT reads.
        huge: the pools in transparent huge pages.
    """

    def __init__(
        self,
        store,
        caches: dict[int, LayerCache],
        landing: Landing,
        ring,
        *,
        prefetch: int,
        guesses: int,
        direct: bool,
        huge: bool,
    ):
        self.caches = caches
        self.layouts = store.expert_layers
        self.landing = landing
        self.token_prefetch = min(prefetch, guesses) if prefetch else guesses
        pools, n = lookahead_pools(prefetch, len(caches), guesses)
        self.guesses = GuessScores(max(self.token_prefetch, n), self.token_prefetch)
        self.lend = True  # a prompt's lookahead also reads into slots lent by the layers its pass has finished
        self.pools: dict[int, SlotPool] = {}
        self.pending: dict[int, dict[int, tuple]] = {}  # layer -> {expert: (request, batch)}
        self.running: dict[int, list] = {}  # per pool: unused reads still landing in its slots
        self.lending = Lending(caches, self.pending)
        # the lookahead `prefetch` asked for, started by the current `run`: (layer, experts, how many, only
        # once the layer's reads have landed)
        self.deferred: tuple[int, list, int, bool] | None = None
        self.ring = ring
        self.reader = None
        if pools:
            self.reader = ThreadReader(LayerFiles(store, direct), workers=PREFETCH_WORKERS)
            blob = max(lay.blob_size for lay in self.layouts.values())
            shared = [SlotPool(n, blob, huge=huge) for _ in range(pools)]
            for k, layer in enumerate(sorted(caches)):
                self.pools[layer] = shared[k % len(shared)]
                self.pending[layer] = {}

    def prefetch(self, layer: int, experts, rows: int = 1) -> None:
        """Ask for the experts layer `layer` is predicted to miss (most likely first): a prompt's (`rows`
        > 1) a whole pool, then (`lend`) lent slots for its other guesses; a generated token's best guesses
        (`GuessScores.ranks`). Started by the current layer's `run` (`start_deferred`)."""
        if layer not in self.pools:
            return
        self.deferred = None
        self.guesses.candidates.pop(layer, None)
        if rows > 1:
            n = self.layouts[layer].n_experts if self.lend else self.pools[layer].n
            self.deferred = (layer, list(experts), n, False)
        elif self.token_prefetch:
            cache = self.caches[layer]
            self.guesses.name(layer, [e for e in dict.fromkeys(int(e) for e in experts) if e not in cache.where])
            n = self.guesses.ranks()
            if n:
                self.deferred = (layer, list(experts), min(self.pools[layer].n, n), True)

    def on_ring(self, layer: int) -> bool:
        """Whether a token's guesses for `layer` go on the demand reads' ring: where there is one, and landing
        them takes the engine no more than a digest check (nothing to repack), for it lands them itself."""
        return self.ring is not None and self.landing.nothing_to_repack(layer)

    def chain(self) -> None:
        """Before a layer's last reads are submitted: a token's guesses, when they go on the ring, are held
        back to follow them, each starting as one of them lands."""
        d = self.deferred
        if d is not None and d[3] and self.on_ring(d[0]):
            self.start_deferred(landed=False, chained=True)

    def flush(self) -> None:
        """After a layer's reads are submitted: chained guesses that no read was left to follow start now."""
        if self.ring is not None and self.ring.chained:
            self.ring.flush()

    def start_deferred(self, landed: bool, chained: bool = False) -> None:
        """Start the lookahead `prefetch` left for this layer's `run`: a prompt's once the layer's reads
        are submitted, a token's once they have `landed` too, or (`chained`) held back to follow them."""
        if self.deferred is not None and (landed or chained or not self.deferred[3]):
            layer, experts, n, token = self.deferred
            self.deferred = None
            self._start(layer, experts, n, token, chained)

    def _start(self, layer: int, experts, n: int, token: bool = False, chained: bool = False) -> None:
        pool = self.pools[layer]
        ring = token and self.on_ring(layer)
        reader = self.ring if ring else self.reader
        more = {"chained": True} if ring and chained else {}
        self.settle(layer, wait=True)
        cache, lay = self.caches[layer], self.layouts[layer]
        length = -(-lay.blob_size // PAGE) * PAGE
        todo = [int(e) for e in dict.fromkeys(experts) if int(e) not in cache.where][:n]
        slots = [(pool, s, None) for s in range(min(pool.n, len(todo)))]
        if len(todo) > len(slots):  # a prompt's guesses beyond the pool (n > pool.n only when `lend`)
            slots += self.lending.borrow(layer, len(todo) - len(slots), length)
        for (buf, s, lender), e in zip(slots, todo):
            r = ReadRequest(layer, e, s, buf.memoryview(s), e * lay.stride, length)
            land = functools.partial(self.landing.landed, buf.view(s))  # lands in its reader thread
            batch = reader.submit([r], then=land, **more)
            self.pending[layer][e] = (r, batch)
            if lender is not None:
                self.lending.lend(lender, s, batch, layer, e)
                cache.stats.borrowed += 1
            cache.stats.prefetched += 1

    def settle(self, layer: int, wait: bool = False) -> None:
        """Forget the layer's unused reads: the queued ones are cancelled; one still running is waited for
        only when its slot is about to be reused (`wait`), i.e. at its pool's next read."""
        running = self.running.setdefault(id(self.pools[layer]), [])
        for _, batch in self.pending[layer].values():
            self.caches[layer].stats.prefetch_cancelled += batch.cancel()
            if batch.pending:
                running.append(batch)
        self.pending[layer].clear()
        if wait:
            for batch in running:
                batch.abandon()
            running.clear()

    def take(self, layer: int, misses: list[int], compute: Callable) -> list[int]:
        """Compute the misses that the lookahead already read (landed in its reader thread), those landed
        by now together in one call, then the others as they land; returns the misses still to read."""
        pending = self.pending.get(layer)
        if not pending:
            return misses
        stats, rest, todo = self.caches[layer].stats, [], {}
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
                for e, (r, _) in group:
                    del landed[e]
                    stats.bytes_read += r.length
                    stats.prefetch_hits += 1
                compute([(e, w) for e, (_, w) in group])
        finally:  # an error: reads still landing in the pool's slots must end before the slots are reused
            for _, batch in todo.values():
                batch.abandon()
        self.settle(layer)
        return rest

    def slot_bytes(self) -> int:
        """Bytes of the pools (shared between the layers)."""
        pools = {id(p): p for p in self.pools.values()}.values()
        return sum(p.n * p.slot_bytes for p in pools)

    def close(self) -> None:
        """Drop the read asked for, take every lent slot back and let every read end (the readers stay open)."""
        self.deferred = None
        self.lending.reclaim_all()
        for layer in self.pending:
            self.settle(layer, wait=True)
