"""Made-up worker statistics for the live view's tests: a `WorkerStats` with memory, machine state and an expert
heatmap, as a worker writes them (`bus.k_stats`, the `bus.LIVE_GROUP` message)."""

from __future__ import annotations

import time

import numpy as np

from appliance import bus
from appliance.events import Heatmap, MemoryBudget, WorkerStats, encode


def sample(worker: str = "board-x", step: int = 0, layers: int = 12, experts: int = 32) -> WorkerStats:
    """Sample `step` of a worker decoding an MoE model: numbers that move from one step to the next."""
    rng = np.random.default_rng(step)
    hits = rng.gamma(0.6, 4.0, (layers, experts)) * np.linspace(1.5, 0.3, layers)[:, None]  # [L, E]
    misses = rng.gamma(0.5, 2.0, (layers, experts))  # [L, E]
    residency = (rng.random((layers, experts)) < 0.25).astype(int) + (rng.random((layers, experts)) < 0.05)
    rate = hits.sum(1) / (hits.sum(1) + misses.sum(1))  # [L]
    gib = 2**30
    return WorkerStats(
        worker=worker,
        boot="boot-1",
        at=time.time(),
        state="decoding",
        running="req-1",
        running_model="tiny-moe",
        loaded=["tiny-moe"],
        active=1,
        queue_depth=2,
        oldest_wait=1.5 + step,
        tokens_per_s=4.0 + (step % 5),
        ttft=0.8 + 0.1 * (step % 3),
        expert_hit_rate=float(rate.mean()),
        disk_mb_per_s=120.0 + 10 * (step % 7),
        memory=MemoryBudget(
            total=8 * gib,
            dense=int(1.4 * gib),
            kv=int(0.3 * gib),
            expert_slots=3 * gib,
            prefetch_slots=int(0.5 * gib),
            runtime=int(0.4 * gib),
            free=int(2.4 * gib),
        ),
        cpu_percent=63.0,
        load_average=3.2,
        temperatures={"soc-thermal": 61.5, "bigcore0-thermal": 63.0},
        cpu_mhz=1800.0,
        cpu_max_mhz=2400.0,
        throttled=True,
        heatmap=Heatmap(
            model="tiny-moe",
            layer_ids=list(range(1, layers + 1)),
            experts=experts,
            half_life=30.0,
            hits=hits.round(2).tolist(),
            misses=misses.round(2).tolist(),
            residency=residency.tolist(),
            layer_hit_rate=[float(x) for x in rate],
        ),
    )


def store(r, stats: WorkerStats, ttl: int = 60) -> None:
    """Write it as the worker does (sync Redis client)."""
    r.set(bus.k_stats(stats.worker), encode(stats), ex=ttl)


async def push(stats: WorkerStats) -> None:
    """Send it to the live group as the worker does."""
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(bus.LIVE_GROUP, {"type": "live.stats", "stats": encode(stats)})
