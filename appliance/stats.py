"""A worker's once-a-second summary for the live view: `events.WorkerStats`.

`Sampler(board).sample()` builds one: what the worker does (and how far its prefill is), its models'
queue, tokens per second, the last time to first token, the expert cache's hit rate and disk reads
over the last second, where its memory goes, the machine (CPU, load, temperatures, clock) and the
expert heatmap of a loaded model whose experts stream. `Sampler.run(stop)` is the worker's
`rkmojo-stats` thread: it samples once a second, writes the summary to `bus.k_stats` (EX 5) and sends it
to the Channels group `bus.LIVE_GROUP` as `{"type": "live.stats", "stats": <the encoded event>}`. It also
appends the charted fields (`CHARTED`) to a ring of the last `HISTORY` samples (`bus.k_stats_history`, a
capped list), which the live view sends a browser at load so that its charts start with two minutes.

The sampler only reads: the board's fields and the loaded engines' counters, never under the engine
lock, so a running generation never waits for it (a counter may be one request behind). Rates are
the difference of two samples over the time between them. A sample that fails is logged and the next
one tried: the live view never stops a worker.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from . import bus
from .events import Heatmap, MemoryBudget, WorkerStats, encode

log = logging.getLogger("rkmojo.stats")
INTERVAL = 1.0  # seconds between samples
TTL = 5  # seconds `stats:NAME` outlives its worker's last sample
HALF_LIFE = 30.0  # seconds: the heatmap's counts halve over this long
HISTORY = 120  # samples in the charts' ring: two minutes at one a second
# the WorkerStats fields the live view charts: a ring entry is the JSON object of these (no heatmap: small)
CHARTED = ("at", "tokens_per_s", "ttft", "expert_hit_rate", "disk_mb_per_s")
THROTTLE = 0.9  # a busy core below this share of its maximum clock counts as throttled


# --- the machine: /sys --------------------------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    temperatures: dict[str, float] = field(default_factory=dict)  # thermal zone type → °C
    cpu_mhz: float | None = None  # the first core's current and maximum clock
    cpu_max_mhz: float | None = None


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def machine(sysfs: Path = Path("/sys")) -> Machine:
    """Thermal zones and the first core's clock from `sysfs` (a fake root in tests); what is absent is left out."""
    temps = {}
    for zone in sorted((sysfs / "class" / "thermal").glob("thermal_zone*")):
        milli = _read_number(zone / "temp")
        try:
            kind = (zone / "type").read_text().strip() or zone.name
        except OSError:
            kind = zone.name
        if milli is not None:
            temps[kind if kind not in temps else f"{kind}.{zone.name}"] = milli / 1000
    freq = sysfs / "devices" / "system" / "cpu" / "cpu0" / "cpufreq"
    cur, top = _read_number(freq / "scaling_cur_freq"), _read_number(freq / "cpuinfo_max_freq")  # kHz
    return Machine(temps, cur / 1000 if cur else None, top / 1000 if top else None)


# --- the loaded engines ------------------------------------------------------------------------
def streamed(engine):
    """The engine's streaming expert provider (`inference.experts.StreamingExperts`), or None."""
    experts = getattr(getattr(engine, "model", None), "experts", None)
    return experts if hasattr(experts, "snapshot") else None


def memory_budget(engines: list, rss: int, total: int) -> MemoryBudget:
    """Where the memory goes: the engines' weights, KV and slots, the rest of the process's RSS, what is free."""
    dense = kv = slots = prefetch = 0
    for eng in engines:
        store = eng.store
        dense += store.manifest["dense"].get("size", 0)
        experts = streamed(eng)
        if experts is None:  # resident experts are mapped weights
            dense += sum(lay.stride * lay.n_experts for lay in store.expert_layers.values())
        else:
            cache_bytes, prefetch_bytes = experts.slot_bytes()
            slots, prefetch = slots + cache_bytes, prefetch + prefetch_bytes
        kv += eng.kv_held()  # its own cache and its batcher's slots
    held = dense + kv + slots + prefetch
    runtime = max(0, rss - held)
    return MemoryBudget(
        total=total,
        dense=dense,
        kv=kv,
        expert_slots=slots,
        prefetch_slots=prefetch,
        runtime=runtime,
        free=max(0, total - held - runtime),
    )


def expert_totals(engines: dict) -> dict:
    """{key: (hits, requests, bytes read)} summed over the layers of each streaming engine."""
    out = {}
    for key, eng in engines.items():
        experts = streamed(eng)
        if experts is not None:
            layers = [c.stats for c in list(experts.caches.values())]
            out[key] = (sum(s.hits for s in layers), sum(s.requests for s in layers), sum(s.bytes_read for s in layers))
    return out


class HeatmapWindow:
    """Per (layer, expert) hits and misses of one model, decayed with a half-life, from whole-run counters."""

    def __init__(self, half_life: float = HALF_LIFE):
        self.half_life = half_life
        self.key = None  # the engine the window follows; another one starts it afresh
        self.seen = self.hits = self.misses = None  # [2, L, E] whole-run counts last time; [L, E] decayed

    def update(self, model: str, key, snaps: dict, dt: float) -> Heatmap:
        """The window after `dt` more seconds, given `StreamingExperts.snapshot()` now."""
        layers = sorted(snaps)
        n = max(len(s.hits) for s in snaps.values())
        counts = np.zeros((2, len(layers), n))  # hits, misses [L, E]
        residency = np.zeros((len(layers), n), np.int64)
        for i, layer in enumerate(layers):
            s = snaps[layer]
            counts[0, i, : len(s.hits)], counts[1, i, : len(s.misses)] = s.hits, s.misses
            residency[i, s.cached] = 1
            residency[i, list(s.prefetching)] = 2
        if key != self.key or self.seen is None or self.seen.shape != counts.shape:
            self.key, self.seen = key, np.zeros_like(counts)
            self.hits, self.misses = np.zeros(counts.shape[1:]), np.zeros(counts.shape[1:])
        new = np.maximum(counts - self.seen, 0)  # reset counters start again from zero
        decay = 0.5 ** (dt / self.half_life)
        self.hits = self.hits * decay + new[0]
        self.misses = self.misses * decay + new[1]
        self.seen = counts
        h, req = self.hits.sum(axis=1), (self.hits + self.misses).sum(axis=1)  # [L]
        rate = [round(float(a / b), 4) if b > 1e-9 else None for a, b in zip(h, req)]
        return Heatmap(
            model=model,
            layer_ids=layers,
            experts=n,
            half_life=self.half_life,
            hits=np.round(self.hits, 2).tolist(),
            misses=np.round(self.misses, 2).tolist(),
            residency=residency.tolist(),
            layer_hit_rate=rate,
        )


# --- the charts' ring --------------------------------------------------------------------------
def remember(r, stats: WorkerStats) -> None:
    """Append `stats`' charted fields to its worker's ring, kept to the last `HISTORY` (`r`: a sync Redis
    client or pipeline). The ring outlives its worker by as long as it spans."""
    key = bus.k_stats_history(stats.worker)
    r.rpush(key, json.dumps({f: getattr(stats, f) for f in CHARTED}))
    r.ltrim(key, -HISTORY, -1)
    r.expire(key, int(HISTORY * INTERVAL) + TTL)


def history(raw: list) -> list[dict]:
    """A ring as read from Redis (`LRANGE`): its points, oldest first, each with the `CHARTED` fields; an
    unreadable entry is left out."""
    out = []
    for item in raw:
        try:
            point = json.loads(item)
        except ValueError:
            continue
        if isinstance(point, dict) and isinstance(point.get("at"), (int, float)):
            out.append({f: point.get(f) for f in CHARTED})
    return out


# --- the sampler ---------------------------------------------------------------------------------
class Sampler:
    """Builds a board's `WorkerStats` (see the module docstring); `sysfs` is /sys unless a test fakes it."""

    def __init__(self, board, *, sysfs: Path = Path("/sys"), half_life: float = HALF_LIFE):
        self.board = board
        self.sysfs = sysfs
        self.heatmap = HeatmapWindow(half_life)
        self.process = psutil.Process(os.getpid())
        psutil.cpu_percent(None)  # the first call starts psutil's interval
        self.at = time.monotonic()
        self.tokens = board.tokens
        self.experts: dict = {}

    def sample(self) -> WorkerStats:
        b, now = self.board, time.monotonic()
        dt, self.at = max(now - self.at, 1e-3), now
        state, prefill, running_model = b.state, b.prefill, b.running_model
        loaded = dict(list(b.loaded.items()))
        engines = {(name, id(ld.engine)): ld.engine for name, ld in loaded.items()}
        tokens, self.tokens = b.tokens - self.tokens, b.tokens
        hits, requests, read = self._experts_since(engines)
        queue = [q for m in list(b.models) for q in bus.queued_now(b.r, m)]
        oldest = min((q.get("created", time.time()) for q in queue), default=None)
        m = machine(self.sysfs)
        busy = state != "idle"
        return WorkerStats(
            worker=b.name,
            boot=b.boot,
            at=time.time(),
            state=state,
            running=b.running,
            running_model=running_model,
            prefill_done=prefill[0] if state == "prefill" and prefill else None,
            prefill_total=prefill[1] if state == "prefill" and prefill else None,
            loaded=sorted(loaded),
            active=len(b.active) if b.active else int(b.running is not None),
            parallel=b.parallel(),
            queue_depth=len(queue),
            oldest_wait=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
            tokens_per_s=tokens / dt,
            ttft=b.last_ttft,
            expert_hit_rate=hits / requests if requests else None,
            disk_mb_per_s=read / dt / 1e6,
            memory=memory_budget(list(engines.values()), self.process.memory_info().rss, b.budget()),
            cpu_percent=psutil.cpu_percent(None),
            load_average=os.getloadavg()[0],
            temperatures=m.temperatures,
            cpu_mhz=m.cpu_mhz,
            cpu_max_mhz=m.cpu_max_mhz,
            throttled=None if not (m.cpu_mhz and m.cpu_max_mhz) else busy and m.cpu_mhz < THROTTLE * m.cpu_max_mhz,
            heatmap=self._heatmap(loaded, running_model, dt),
        )

    def _experts_since(self, engines: dict) -> tuple[int, int, int]:
        """Expert cache hits, requests and bytes read since the last sample, over the streaming engines
        (an engine loaded since counts from its load; counters reset under us count from zero)."""
        totals = expert_totals(engines)
        new = np.zeros(3, np.int64)
        for key, now in totals.items():
            new += np.maximum(np.subtract(now, self.experts.get(key, (0, 0, 0))), 0)
        self.experts = totals
        return int(new[0]), int(new[1]), int(new[2])

    def _heatmap(self, loaded: dict, running_model: str | None, dt: float) -> Heatmap | None:
        """The window of the running model if its experts stream, else of the first loaded one that streams."""
        order = sorted(loaded, key=lambda n: (n != running_model, n))
        for name in order:
            experts = streamed(loaded[name].engine)
            if experts is not None and experts.caches:
                return self.heatmap.update(name, (name, id(experts)), experts.snapshot(), dt)
        return None

    def publish(self, stats: WorkerStats) -> None:
        """Write the summary to `bus.k_stats` and its charted fields to the ring, and send it to the live
        view's Channels group."""
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        text = encode(stats)
        pipe = self.board.r.pipeline()
        pipe.set(bus.k_stats(stats.worker), text, ex=TTL)
        remember(pipe, stats)
        pipe.execute()
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(bus.LIVE_GROUP, {"type": "live.stats", "stats": text})

    def run(self, stop: threading.Event) -> None:
        """Sample and publish once a second until `stop` is set; a failure is logged and the next second tried."""
        failing = False
        next_at = time.monotonic() + INTERVAL
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = max(next_at + INTERVAL, time.monotonic())
            try:
                self.publish(self.sample())
                failing = False
            except Exception as e:  # Redis restarting, an engine closing under us: the next second tries again
                log.warning(
                    "live stats of %s failed: %s: %s", self.board.name, type(e).__name__, e, exc_info=not failing
                )
                failing = True
