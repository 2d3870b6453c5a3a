"""Routing traces and the cache simulator: what hit rate other cache sizes and policies would have had.

`TraceRecorder` wraps the engine's expert source and writes down every expert request (phase,
layer, experts, misses). `replay` runs such a trace through the engine's own `LayerCache` class
(so LFU and LRU are the engine's policies, not a re-implementation) in the order
`StreamingExperts.run` uses it; `belady` is the offline optimum on the same trace: on a miss with
every slot taken, evict the cached expert whose next request lies furthest in the future.

What the engine does to its caches also depends on timing, which the requests alone do not tell:
- a miss's read that lands first frees its slot first, and the slot takes the next miss; reads need not
  land in the order submitted (a thread pool's preads, a busy disk);
- a miss the lookahead read is computed from a lookahead slot and does not enter the cache;
- a prompt's lookahead empties slots of finished layers to read into, as many as the loans that have
  ended let it.
The recorder writes all of these down with each call, and `replay(..., as_run=True)` applies them, so that at
the engine's own size and policy the replay gives the engine's own hits.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

from ..experts.cache import LayerCache

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Call:
    """One expert request of one layer: the experts a forward step asked for at once."""

    phase: str
    layer: int
    experts: tuple[int, ...]
    misses: int = 0  # what the engine itself missed (recorded only from a live engine)
    prefetched: tuple[int, ...] = ()  # misses computed from the lookahead's slots
    lent: tuple[tuple[int, int], ...] = ()  # (layer, expert): dropped from finished layers during the call
    filled: tuple[int, ...] = ()  # the misses that entered the cache, in the order their reads landed

    def row(self) -> list:
        """The call as JSON (`from_row` reads it back)."""
        lent = [list(x) for x in self.lent]
        return [self.phase, self.layer, list(self.experts), self.misses, list(self.prefetched), lent, list(self.filled)]

    @classmethod
    def from_row(cls, row: list) -> "Call":
        p, layer, experts, misses, *rest = row
        prefetched, lent, filled = (rest + [[], [], []])[:3]  # a trace saved before these fields
        lent = tuple((a, b) for a, b in lent)
        return cls(p, layer, tuple(experts), misses, tuple(prefetched), lent, tuple(filled))


class TraceRecorder:
    """Wraps a `StreamingExperts` (or `ResidentExperts`); records every `run` call, delegates the rest."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[Call] = []
        self.phase = "prefill"
        self._took: list[int] = []
        self._lent: list[tuple[int, int]] = []
        self._filled: list[int] = []
        if hasattr(inner, "observer"):
            inner.observer = self

    def run(self, layer: int, experts, compute, during_io=None):
        experts = tuple(int(e) for e in experts)
        caches = getattr(self.inner, "caches", None)
        before = caches[layer].stats.misses if caches else 0
        self._took, self._lent, self._filled = [], [], []
        out = self.inner.run(layer, experts, compute, during_io)
        misses = (caches[layer].stats.misses - before) if caches else 0
        took, lent, filled = (tuple(x) for x in (self._took, self._lent, self._filled))
        self.calls.append(Call(self.phase, layer, experts, misses, took, lent, filled))
        return out

    def filled(self, layer: int, expert: int) -> None:
        """`StreamingExperts`: a miss of the running call entered the cache (its read landed)."""
        self._filled.append(expert)

    def took(self, layer: int, experts) -> None:
        """`StreamingExperts`: these misses of the running call are computed from lookahead slots."""
        self._took.extend(int(e) for e in experts)

    def lent(self, layer: int, expert: int) -> None:
        """`StreamingExperts`: `expert` left layer `layer`'s cache, its slot lent to the lookahead."""
        self._lent.append((layer, expert))

    def __getattr__(self, name):
        return getattr(self.inner, name)


@dataclass
class SimPool:
    """Stands in for `SlotPool` in a simulation: `LayerCache` only needs the slot count."""

    n: int


def serve(cache: LayerCache, experts, prefetched=(), landed=()) -> None:
    """One request through `cache` in the order `StreamingExperts.run` takes it: hits pinned, the
    misses that fit the free slots assigned; once the hits are computed their slots are free too, and
    each computed miss frees its slot for the next. Reads land in the order `landed` names them, the
    others in the order submitted; the `prefetched` misses take no slot (the lookahead read them)."""
    hits, misses = cache.request(experts)
    cache.pin(hits.values())
    queue, inflight = [e for e in misses if e not in prefetched], []
    order = list(landed)

    def top_up() -> None:
        while queue and len(cache.pinned) < cache.pool.n:
            e = queue.pop(0)
            inflight.append((e, cache.assign(e)))

    top_up()
    cache.pinned.difference_update(hits.values())
    top_up()
    while inflight:
        named = [i for i, (e, _) in enumerate(inflight) if order and e == order[0]]
        if named:
            order.pop(0)
        e, s = inflight.pop(named[0] if named else 0)
        cache.fill(e, s)
        cache.pinned.discard(s)
        top_up()
    cache.unpin_all()


def replay(calls: list[Call], n_experts: int, slots: int, policy: str, as_run: bool = False) -> dict[str, dict]:
    """Requests and hits per phase of `calls` through fresh `LayerCache`s of `slots` slots. `as_run`:
    with what the recording engine did (its landing order, the misses its lookahead read, lent slots
    emptied), which only the engine's own size and policy reproduce; otherwise every miss fills a
    slot and reads land in the order submitted."""
    caches: dict[int, LayerCache] = {}

    def layer_cache(layer: int) -> LayerCache:
        if layer not in caches:
            caches[layer] = LayerCache(n_experts, SimPool(min(slots, n_experts)), policy)
        return caches[layer]

    out = {p: {"requests": 0, "hits": 0} for p in PHASES}
    for c in calls:
        cache = layer_cache(c.layer)
        h, r = cache.stats.hits, cache.stats.requests
        serve(cache, c.experts, *((set(c.prefetched), c.filled) if as_run else ()))
        out[c.phase]["hits"] += cache.stats.hits - h
        out[c.phase]["requests"] += cache.stats.requests - r
        for layer, e in c.lent if as_run else ():
            lender = layer_cache(layer)
            if e in lender.where:
                lender.drop(lender.where[e])
    return out


def belady(calls: list[Call], slots: int) -> dict[str, dict]:
    """Requests and hits per phase of `calls` under the offline optimum (per layer, furthest next use).

    A request for more experts than slots is served in tiles of `slots`, as the engine does.
    """
    out = {p: {"requests": 0, "hits": 0} for p in PHASES}
    by_layer: dict[int, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for c in calls:
        ex = c.experts
        for i in range(0, len(ex), slots):
            by_layer[c.layer].append((c.phase, ex[i : i + slots]))
    for reqs in by_layer.values():
        future: dict[int, deque] = defaultdict(deque)  # expert → indices of its requests, in order
        for i, (_, ex) in enumerate(reqs):
            for e in ex:
                future[e].append(i)
        cached: set[int] = set()
        for phase, ex in reqs:
            for e in ex:
                future[e].popleft()
            miss = [e for e in ex if e not in cached]
            out[phase]["requests"] += len(ex)
            out[phase]["hits"] += len(ex) - len(miss)
            over = len(cached) + len(miss) - slots
            if over > 0:
                now = set(ex)
                victims = sorted(
                    (e for e in cached if e not in now),
                    key=lambda e: future[e][0] if future[e] else float("inf"),
                    reverse=True,
                )
                cached.difference_update(victims[:over])
            cached.update(miss)
    return out


def hit_rate(counts: dict, phase: str = "decode") -> float:
    c = counts[phase]
    return c["hits"] / c["requests"] if c["requests"] else 0.0


def sweep(calls: list[Call], n_experts: int, sizes=(8, 16, 24, 32), policies=("lfu", "lru")) -> dict:
    """Decode hit rate for each cache size under each policy and under Belady's optimum."""
    out = {"slots": list(sizes)}
    for p in policies:
        out[p] = [hit_rate(replay(calls, n_experts, s, p)) for s in sizes]
    out["belady"] = [hit_rate(belady(calls, s)) for s in sizes]
    return out


def popularity(calls: list[Call], n_experts: int, phase: str = "decode", seed: int = 0) -> dict:
    """How concentrated routing is: the share of a layer's requests its most requested eighth of the
    experts take (16 of 128; mean over layers), next to the share the same number of uniformly
    random picks would give (above 1/8 in short runs: the busiest experts of a small sample)."""
    top = max(1, n_experts // 8)
    rng = np.random.default_rng(seed)
    counts: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(n_experts, np.int64))
    uniform: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(n_experts, np.int64))
    for c in calls:
        if c.phase == phase:
            counts[c.layer][list(c.experts)] += 1
            uniform[c.layer][rng.choice(n_experts, len(c.experts), replace=False)] += 1

    def share(by_layer) -> float | None:
        s = [np.sort(v)[::-1][:top].sum() / max(1, v.sum()) for v in by_layer.values()]
        return float(np.mean(s)) if s else None

    return {"top": top, "share": share(counts), "uniform_share": share(uniform)}
