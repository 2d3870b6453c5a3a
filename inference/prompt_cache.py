"""Prompt-cache files: the token ids and KV state of a sequence, to continue it later.

A file holds what a KV cache *holds*, not how it was laid out: per layer the rows that stand for a
position, in position order. So it restores into any KV cache of the same store that can hold its
tokens, whatever capacity either had (a full layer grown to 512 rows, a ring sized by another prefill
chunk), and in either KV precision: the rows are converted on load (f32 → f16 rounds exactly as an f16
cache rounds what it appends; f16 → f32 widens, the history keeping f16's rounding).

Layout: magic `RKMJPC\\0\\1`, u32 header length, JSON header (format version, store digest, token
count, KV offset, dtype, per layer its window, row count and head shapes), then the token ids (int64),
then per layer the positions of its rows (int64, ascending) and K [n_kv, rows, D] and V [n_kv, rows, Dv]
in the header's dtype, and last an xxh3-128 digest of everything before it. Written to a temporary file,
fsynced and renamed: a reader sees a whole file or none. A file from another store, truncated or
corrupted, is refused with an error and never used; so is one of an earlier version (2 held every row
of the cache as it was laid out: the capacity it had was part of the file).

Saving is two steps, so that a server can copy the state on its engine's thread and write it from
another: `snapshot(store_digest, tokens, cache)` copies the held rows (fast), `write(path, snap)` writes
them.
Loading is `read` then `restore`; `save` and `load` do both at once.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DiskFullError, RkmojoError, disk_full
from .store.format import digest_bytes

MAGIC = b"RKMJPC\x00\x01"
VERSION = 3  # 3: the held rows only, in position order (2: the whole cache as laid out)
DIGEST_BYTES = 16
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}


class PromptCacheError(RkmojoError):
    """A prompt-cache file that cannot be used (wrong store, truncated, corrupted, another model's shapes)."""


@dataclass(frozen=True)
class LayerRows:
    """The rows one attention layer holds: `pos` [R] ascending, `k` [n_kv, R, D], `v` [n_kv, R, Dv]."""

    window: int | None
    pos: np.ndarray
    k: np.ndarray
    v: np.ndarray


@dataclass(frozen=True)
class Snapshot:
    """A sequence's token ids and the KV rows that hold them; its own copies (the cache may change after)."""

    store: str  # the digest of the store whose model computed them
    tokens: np.ndarray  # int64 [T]
    offset: int  # positions the cache held
    layers: tuple[LayerRows, ...]

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + sum(l.pos.nbytes + l.k.nbytes + l.v.nbytes for l in self.layers)


def snapshot(store_digest: str, tokens: list[int], cache) -> Snapshot:
    """Copy the rows `cache` holds (a `KVCache`) for the sequence `tokens`."""
    layers = []
    for l in cache.layers:
        rows = np.flatnonzero(l.pos >= 0)
        rows = rows[np.argsort(l.pos[rows], kind="stable")]  # a ring's rows in position order
        layers.append(LayerRows(l.window, l.pos[rows], l.k[:, rows], l.v[:, rows]))
    return Snapshot(store_digest, np.asarray(tokens, np.int64), int(cache.offset), tuple(layers))


def write(path: str | os.PathLike, snap: Snapshot) -> Path:
    """Write `snap` to `path` atomically (a temporary file renamed)."""
    path = Path(path)
    dtype = snap.layers[0].k.dtype.name if snap.layers else "float32"
    header = {
        "version": VERSION,
        "store": snap.store,
        "tokens": len(snap.tokens),
        "offset": snap.offset,
        "dtype": dtype,
        "layers": [
            {
                "window": l.window,
                "rows": len(l.pos),
                "k": [l.k.shape[0], l.k.shape[2]],
                "v": [l.v.shape[0], l.v.shape[2]],
            }
            for l in snap.layers
        ],
    }
    raw = json.dumps(header).encode()
    arrays = [snap.tokens] + [a for l in snap.layers for a in (l.pos, l.k, l.v)]
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    h = digest_bytes()
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:  # conversations: private
            for chunk in [
                MAGIC,
                struct.pack("<I", len(raw)),
                raw,
                *(memoryview(np.ascontiguousarray(a)).cast("B") for a in arrays),
            ]:
                f.write(chunk)
                h.update(chunk)
            f.write(h.digest())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if disk_full(e):
            raise DiskFullError(
                f"{path}: the disk is full; the prompt cache was not saved (nothing "
                f"half-written); free space in {path.parent}"
            ) from e
        raise
    return path


def read(path: str | os.PathLike, store_digest: str) -> Snapshot:
    """The snapshot in the file at `path`, checked whole against its digest and `store_digest`.

    Raises:
        PromptCacheError: naming the file and why it cannot be used.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PromptCacheError(f"{path}: cannot read prompt cache ({e.strerror})") from None
    if len(data) < len(MAGIC) + 4 + DIGEST_BYTES or data[: len(MAGIC)] != MAGIC:
        raise PromptCacheError(f"{path}: not an rkmojo prompt-cache file")
    if digest_bytes(memoryview(data)[:-DIGEST_BYTES]).digest() != data[-DIGEST_BYTES:]:
        raise PromptCacheError(f"{path}: truncated or corrupted prompt cache; delete it and prefill again")
    (n,) = struct.unpack_from("<I", data, len(MAGIC))
    pos = len(MAGIC) + 4
    hdr = json.loads(data[pos : pos + n])
    pos += n
    if hdr["version"] != VERSION:
        raise PromptCacheError(f"{path}: prompt-cache version {hdr['version']} is not {VERSION}; prefill again")
    if hdr["store"] != store_digest:
        raise PromptCacheError(f"{path}: prompt cache belongs to another model store; it cannot be used with this one")

    def take(dtype, shape):
        nonlocal pos
        a = np.frombuffer(data, dtype, int(np.prod(shape)), pos).reshape(shape)
        pos += a.nbytes
        return a

    tokens = take(np.int64, (hdr["tokens"],))
    layers = []
    for l in hdr["layers"]:
        dtype, r = DTYPES[hdr["dtype"]], l["rows"]
        p = take(np.int64, (r,))
        k = take(dtype, (l["k"][0], r, l["k"][1]))
        v = take(dtype, (l["v"][0], r, l["v"][1]))
        layers.append(LayerRows(l["window"], p, k, v))
    return Snapshot(hdr["store"], tokens, int(hdr["offset"]), tuple(layers))


def restore(snap: Snapshot, cache, where: str = "prompt cache") -> None:
    """Fill the fresh KV `cache` with `snap`'s rows, converted to the cache's dtype.

    A ring smaller than the rows saved keeps the latest ones (never fewer than its window: a new
    position sees all it would have seen); a full layer grows to hold every position.

    Raises:
        PromptCacheError: the cache's layers are not the snapshot's (another architecture's shapes);
            `cache` is untouched then.
    """
    if len(snap.layers) != len(cache.layers):
        raise PromptCacheError(
            f"{where}: holds {len(snap.layers)} layers and this model has {len(cache.layers)}; prefill again"
        )
    for i, (s, l) in enumerate(zip(snap.layers, cache.layers)):
        mine = (l.window, l.k.shape[0], l.k.shape[2], l.v.shape[2])
        theirs = (s.window, s.k.shape[0], s.k.shape[2], s.v.shape[2])
        if mine != theirs:
            raise PromptCacheError(
                f"{where}: layer {i} holds (window, KV heads, K dim, V dim) {theirs} and this model's has {mine}; "
                "prefill again"
            )
    for s, l in zip(snap.layers, cache.layers):
        p, k, v = s.pos, s.k, s.v
        if not len(p):
            continue
        if l.window:
            p, k, v = p[-l.cap :], k[:, -l.cap :], v[:, -l.cap :]
            rows = p % l.cap
        else:
            l.reserve(int(p[-1]) + 1)
            rows = p
        l.k[:, rows] = k  # numpy casts to the cache's dtype (round to nearest even, as `append` does)
        l.v[:, rows] = v
        l.pos[rows] = p
    cache.offset = snap.offset


def save(path: str | os.PathLike, store_digest: str, tokens: list[int], cache) -> Path:
    """Write `tokens` and the KV `cache` that holds them to `path` atomically."""
    return write(path, snapshot(store_digest, tokens, cache))


def load(path: str | os.PathLike, store_digest: str, cache) -> list[int]:
    """Fill the fresh KV `cache` from `path`; returns the token ids it holds.

    Raises:
        PromptCacheError: naming the file and why it cannot be used; `cache` is untouched then.
    """
    snap = read(path, store_digest)
    restore(snap, cache, str(path))
    return snap.tokens.tolist()
