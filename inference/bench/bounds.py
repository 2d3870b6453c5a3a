"""The IO bound of expert streaming, measured with the engine's own reader, and page-cache helpers.

Read bandwidth is measured the way the engine reads: the same reader class (`open_reader`: io_uring
or the preadv pool), the same O_DIRECT files, page-aligned slot buffers, blob-sized reads, and the
same batches (one per layer step, as many reads as that step missed in the decode run) — only the
expert ids are random, so nothing is served from a cache the decode run warmed. O_DIRECT bypasses
the page cache; caches are also dropped first when we are allowed to (root).

The engine's pattern drains the queue at the end of every layer step, and a prefetching engine keeps
more reads in flight than that. So the disk is also measured with a queue kept full
(`sustained_bandwidth`) at every depth from 1 to 64 reads in flight (`best_bandwidth`), and the IO
bound uses the fastest depth: the bound is what the disk can do, not what one read pattern gets
out of it. (A fixed depth of 16 gave a bound the engine beat by 1.47x on one disk.) A depth's rate is
the median of several windows spread over the sweep, so one burst does not become the bound.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_COMPLETED, wait

import numpy as np

from ..experts.cache import PAGE, SlotPool
from ..experts.io import LayerFiles, ReadRequest, ThreadReader, open_reader

DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_caches() -> bool:
    """Drop the page cache (root only); False when not allowed."""
    try:
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def read_bandwidth(
    store,
    batches: list[tuple[int, int]],
    *,
    io: str = "auto",
    seconds: float = 10.0,
    seed: int = 0,
    direct: bool = True,
) -> dict:
    """Bytes per second reading random expert blobs in `batches` of (layer, reads in flight).

    Returns:
        {"bytes_per_s", "bytes", "seconds", "reads", "io", "direct", "batches"}.
    """
    if not batches:
        return {"bytes_per_s": None, "bytes": 0, "seconds": 0.0, "reads": 0, "io": io, "direct": direct, "batches": 0}
    layouts = store.expert_layers
    width = max(k for _, k in batches)
    pool = SlotPool(width, max(lay.blob_size for lay in layouts.values()))
    reader = open_reader(store, io, direct=direct)
    rng = np.random.default_rng(seed)
    total = reads = steps = 0
    t0 = time.perf_counter()
    try:
        # whole cycles over `batches`, so the rate is that of the given mix of batch sizes even when
        # `seconds` runs out within the first cycle (a slow or busy disk)
        while True:
            for layer, k in batches:
                lay = layouts[layer]
                length = -(-lay.blob_size // PAGE) * PAGE  # as StreamingExperts reads a blob
                experts = rng.choice(lay.n_experts, k, replace=False)
                reqs = [
                    ReadRequest(layer, int(e), i, pool.memoryview(i), int(e) * lay.stride, length)
                    for i, e in enumerate(experts)
                ]
                for r in reader.submit(reqs).completed():
                    total += r.length
                    reads += 1
                steps += 1
            if time.perf_counter() - t0 >= seconds:
                break
        dt = time.perf_counter() - t0
        name, is_direct = reader.name, all(reader.files.is_direct(l) for l in layouts)
    finally:
        reader.close()
        reader.files.close()
    return {
        "bytes_per_s": total / dt,
        "bytes": total,
        "seconds": dt,
        "reads": reads,
        "io": name,
        "direct": is_direct,
        "batches": steps,
        "mean_batch": reads / max(1, steps),
    }


def sustained_bandwidth(
    store, depth: int = 16, *, seconds: float = 10.0, seed: int | tuple[int, ...] = 0, direct: bool = True
) -> dict:
    """Bytes per second reading random expert blobs of random MoE layers with `depth` reads always in
    flight (a preadv thread per read; a new read starts as soon as one lands).

    Returns:
        {"bytes_per_s", "bytes", "seconds", "reads", "depth", "direct"}.
    """
    layouts = store.expert_layers
    if not layouts:
        return {"bytes_per_s": None, "bytes": 0, "seconds": 0.0, "reads": 0, "depth": depth, "direct": direct}
    layers = sorted(layouts)
    pool = SlotPool(depth, max(lay.blob_size for lay in layouts.values()))
    reader = ThreadReader(LayerFiles(store, direct), workers=depth)
    rng = np.random.default_rng(seed)

    def start(slot: int):
        lay = layouts[layers[int(rng.integers(len(layers)))]]
        e = int(rng.integers(lay.n_experts))
        r = ReadRequest(lay.layer, e, slot, pool.memoryview(slot), e * lay.stride, -(-lay.blob_size // PAGE) * PAGE)
        return reader.pool.submit(reader._one, r)

    total = reads = 0
    t0 = time.perf_counter()
    try:
        flying = {start(i) for i in range(depth)}
        while True:
            done, flying = wait(flying, return_when=FIRST_COMPLETED)
            for f in done:
                r = f.result()
                total += r.length
                reads += 1
                if time.perf_counter() - t0 < seconds:
                    flying.add(start(r.slot))
            if not flying:
                break
        dt = time.perf_counter() - t0
        is_direct = all(reader.files.is_direct(l) for l in layouts)
    finally:
        reader.close()
        reader.files.close()
    return {
        "bytes_per_s": total / dt,
        "bytes": total,
        "seconds": dt,
        "reads": reads,
        "depth": depth,
        "direct": is_direct,
    }


def warm(store) -> int:
    """Read dense.bin into the page cache and fault every page of the expert files into the store's
    own mappings, so a resident run measures compute, not disk. Returns the bytes touched."""
    n = 0
    with open(store.path / store.manifest["dense"]["file"], "rb", buffering=0) as f:
        buf = bytearray(64 * 2**20)
        while k := f.readinto(buf):
            n += k
    for layer in sorted(store.expert_layers):
        m = store.expert_map(layer)
        for s in range(0, len(m), 256 * 2**20):
            int(m[s : s + 256 * 2**20 : PAGE].sum())  # one byte per page
        n += len(m)
    return n


SWEEP_DEPTHS = (1, 2, 4, 8, 16, 32, 64)  # reads in flight tried for the disk's best rate
# windows per depth, in rounds that each visit every depth: a depth's rate is the median of its windows. With
# one window per depth (1.4 s), a sweep's fastest window put depth 2 at 3.64 GB/s on a disk that read 2.1-2.3
# GB/s at that depth and at most 2.97 at any depth in the 28 windows of four sweeps after it: the best of 14
# single windows is the noise's best, not the disk's (benchmarks/README.md at 9362a58, "the sweep's windows").
SWEEP_ROUNDS = 3


def best_bandwidth(
    store, *, seconds: float = 10.0, seed: int = 0, depths=SWEEP_DEPTHS, rounds: int = SWEEP_ROUNDS, direct: bool = True
) -> dict:
    """The disk's best rate for random expert-sized reads: `sustained_bandwidth` at each depth of
    `depths`, `rounds` windows each (the time split evenly), the best depth's median kept. A bound must be
    what the disk can do, and the depth that reaches it differs per disk (a prefetching engine keeps more
    than one layer's reads in flight). Each round visits the depths in a new order, so a disk whose rate
    drifts does not favour one depth; every window reads its own random blobs (`seed`, round, depth), so no
    window re-reads the blobs another just read.

    Returns:
        The best depth's {"bytes_per_s" (its median), "bytes", "seconds", "reads" (its windows' sums),
        "depth", "direct"} plus "sweep": [{"depth", "bytes_per_s" (median), "windows": [bytes_per_s, ...]}]
        for every depth tried, and "fastest_window": {"depth", "bytes_per_s"}, the single fastest window.
    """
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: a sweep needs at least one window per depth")
    depths = tuple(depths)
    windows: dict[int, list[dict]] = {d: [] for d in depths}
    window_s = seconds / (len(depths) * rounds)
    for k in range(rounds):
        shift = (k * len(depths)) // rounds
        for d in depths[shift:] + depths[:shift]:
            windows[d].append(sustained_bandwidth(store, d, seconds=window_s, seed=(seed, k, d), direct=direct))
    sweep = []
    for d in depths:
        rates = [w["bytes_per_s"] or 0.0 for w in windows[d]]
        sweep.append({"depth": d, "bytes_per_s": float(np.median(rates)), "windows": rates})
    best = max(sweep, key=lambda s: s["bytes_per_s"])
    ws = windows[best["depth"]]
    fastest = max(((d, w["bytes_per_s"] or 0.0) for d in depths for w in windows[d]), key=lambda t: t[1])
    return {
        "bytes_per_s": best["bytes_per_s"] or None,
        "bytes": sum(w["bytes"] for w in ws),
        "seconds": sum(w["seconds"] for w in ws),
        "reads": sum(w["reads"] for w in ws),
        "depth": best["depth"],
        "direct": all(w["direct"] for w in ws),
        "sweep": sweep,
        "fastest_window": {"depth": fastest[0], "bytes_per_s": fastest[1]},
    }
