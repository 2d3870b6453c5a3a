"""Per-layer expert cache: a fixed set of preallocated, page-aligned slots and the eviction policy.

LFU as turbo-fieldfare does it: one count per (layer, expert), bumped on every request (hit or
miss), kept for the whole run and across evictions; a victim is an empty slot first, then the
lowest count, ties broken by least recent use. LRU (least recent use alone) as an option.
Slots pinned by the computation in progress are never evicted.

Besides the layer's totals (`LayerStats`), hits and misses are counted per expert (`hit_counts`,
`miss_counts`) for the live view's heatmap; `snapshot()` copies them without a lock (another thread
may read while the engine counts: a copy may be one request behind, never torn across experts).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

PAGE = 4096
POLICIES = ("lfu", "lru")


@dataclass
class LayerStats:
    requests: int = 0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0  # the engine waiting for reads to land
    land_seconds: float = 0.0  # the engine waiting for a demand read's landing (digest check, repack)
    evictions: int = 0
    prefetched: int = 0
    prefetch_hits: int = 0
    prefetch_cancelled: int = 0  # prefetches dropped before their read started
    borrowed: int = 0  # a prompt's lookahead reads into slots other layers lent (`lending.Lending.borrow`)
    lent: int = 0  # cached experts dropped to lend their slot to a prompt's lookahead (`LayerCache.drop`)
    warmed: int = 0  # experts read ahead of any request from saved popularity (`StreamingExperts.warm`)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def add(self, o: "LayerStats") -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(o, k))

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["hit_rate"] = self.hit_rate
        return d


@dataclass(frozen=True)
class CacheSnapshot:
    """One layer's per-expert whole-run counts and residency at one moment (`LayerCache.snapshot`)."""

    hits: np.ndarray  # [E] int64
    misses: np.ndarray  # [E] int64
    cached: np.ndarray  # expert ids in cache slots
    prefetching: tuple[int, ...] = ()  # expert ids in prefetch slots, read or being read


class SlotPool:
    """`n` page-aligned buffers of `slot_bytes` each, in one anonymous mapping (no per-token allocation),
    in transparent huge pages where the kernel has them (`huge`): an O_DIRECT read into 4 KiB pages goes
    out in pieces of at most the queue's max_segments pages, into 2 MiB pages whole."""

    def __init__(self, n: int, slot_bytes: int, *, huge: bool = True):
        self.slot_bytes = -(-slot_bytes // PAGE) * PAGE
        self.n = n
        self._map = mmap.mmap(-1, max(1, n * self.slot_bytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.huge = huge and hasattr(mmap, "MADV_HUGEPAGE")
        if self.huge:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.array[::PAGE] = 0  # touch every page now: the budget is taken up front, not mid-run

    def view(self, i: int) -> np.ndarray:
        return self.array[i * self.slot_bytes : (i + 1) * self.slot_bytes]

    def memoryview(self, i: int) -> memoryview:
        return memoryview(self._map)[i * self.slot_bytes : (i + 1) * self.slot_bytes]


@dataclass
class LayerCache:
    """Which expert sits in which slot of one layer, and whom to evict."""

    n_experts: int
    pool: SlotPool
    policy: str = "lfu"
    stats: LayerStats = field(default_factory=LayerStats)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"cache policy {self.policy!r}: choose one of {', '.join(POLICIES)}")
        self.counts = np.zeros(self.n_experts, np.int64)  # whole-run request counts (LFU)
        self.hit_counts = np.zeros(self.n_experts, np.int64)  # whole-run, per expert (the heatmap)
        self.miss_counts = np.zeros(self.n_experts, np.int64)
        self.slot_expert = np.full(self.pool.n, -1, np.int64)
        self.slot_used = np.zeros(self.pool.n, np.int64)  # tick of last use
        self.where: dict[int, int] = {}
        self.pinned: set[int] = set()
        self.tick = 0

    def request(self, experts) -> tuple[dict[int, int], list[int]]:
        """Count a request for each expert; (hits: expert → slot, misses in request order)."""
        self.tick += 1
        hits, misses = {}, []
        for e in experts:
            e = int(e)
            self.counts[e] += 1
            self.stats.requests += 1
            s = self.where.get(e)
            if s is None:
                self.stats.misses += 1
                self.miss_counts[e] += 1
                misses.append(e)
            else:
                self.stats.hits += 1
                self.hit_counts[e] += 1
                hits[e] = s
                self.slot_used[s] = self.tick
        return hits, misses

    def snapshot(self) -> "CacheSnapshot":
        """Copies of the per-expert counts and of which experts sit in slots (safe from another thread)."""
        held = self.slot_expert.copy()
        return CacheSnapshot(self.hit_counts.copy(), self.miss_counts.copy(), held[held >= 0])

    def _victim(self, free: list[int]) -> int:
        """The slot of `free` (unpinned) that the policy empties first."""
        empty = [s for s in free if self.slot_expert[s] < 0]
        if empty:
            return empty[0]
        if self.policy == "lfu":
            return min(free, key=lambda s: (self.counts[self.slot_expert[s]], self.slot_used[s]))
        return min(free, key=lambda s: self.slot_used[s])

    def assign(self, e: int) -> int:
        """A slot for expert e (evicting per the policy); the slot is pinned and holds no valid data yet.

        Raises:
            RuntimeError: every slot is pinned (the caller asked for more experts at once than slots).
        """
        free = [s for s in range(self.pool.n) if s not in self.pinned]
        if not free:
            raise RuntimeError("expert cache: every slot is pinned (internal error: tile larger than the slot count)")
        s = self._victim(free)
        old = int(self.slot_expert[s])
        if old >= 0:
            del self.where[old]
            self.stats.evictions += 1
        self.slot_expert[s] = -1
        self.pinned.add(s)
        self.slot_used[s] = self.tick
        return s

    def drop(self, s: int) -> None:
        """Empty unpinned slot s (lent to another layer's reads: `lending.Lending.borrow`)."""
        old = int(self.slot_expert[s])
        if old >= 0:
            del self.where[old]
            self.stats.lent += 1
        self.slot_expert[s] = -1

    def fill(self, e: int, s: int) -> None:
        """Record that slot s now holds expert e (after its read and digest check)."""
        self.slot_expert[s] = e
        self.where[e] = s

    def pin(self, slots) -> None:
        self.pinned.update(slots)

    def unpin_all(self) -> None:
        self.pinned.clear()
