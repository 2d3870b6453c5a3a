"""Prompt-cache files: the token ids and KV state of a sequence, to continue it later.

Layout: magic `RKMJPC\\0\\1`, u32 header length, JSON header (format version, store digest,
token count, per-layer shapes), then the token ids (int64), then per layer the row positions
(int64) and K and V (float32), and last an xxh3-128 digest of everything before it. Written to a
temporary file, fsynced and renamed: a reader sees a whole file or none. A file from another store,
truncated or corrupted, is refused with an error and never used.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from .errors import DiskFullError, RkmojoError, disk_full
from .store.format import digest_bytes

MAGIC = b"RKMJPC\x00\x01"
VERSION = 2  # 2: the KV precision is part of the layer header
DIGEST_BYTES = 16


class PromptCacheError(RkmojoError):
    """A prompt-cache file that cannot be used (wrong store, truncated, corrupted, other settings)."""


def _layer_header(l) -> dict:
    return {"window": l.window, "cap": l.cap, "k": list(l.k.shape), "v": list(l.v.shape), "dtype": l.k.dtype.name}


def save(path: str | os.PathLike, store_digest: str, tokens: list[int], cache) -> Path:
    """Write `tokens` and the KV `cache` that holds them to `path` atomically."""
    path = Path(path)
    arrays: list[np.ndarray] = [np.asarray(tokens, np.int64)]
    layers = []
    for l in cache.layers:
        layers.append(_layer_header(l))
        arrays += [l.pos, l.k, l.v]
    header = json.dumps(
        {"version": VERSION, "store": store_digest, "tokens": len(tokens), "offset": cache.offset, "layers": layers}
    ).encode()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    h = digest_bytes()
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:  # conversations: private
            for chunk in [
                MAGIC,
                struct.pack("<I", len(header)),
                header,
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


def load(path: str | os.PathLike, store_digest: str, cache) -> list[int]:
    """Fill the fresh KV `cache` from `path`; returns the token ids it holds.

    Raises:
        PromptCacheError: naming the file and why it cannot be used; `cache` is untouched then.
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
        raise PromptCacheError(f"{path}: prompt-cache version {hdr['version']} is not {VERSION}")
    if hdr["store"] != store_digest:
        raise PromptCacheError(f"{path}: prompt cache belongs to another model store; it cannot be used with this one")
    want = [_layer_header(l) for l in cache.layers]
    if hdr["layers"] != want:
        raise PromptCacheError(
            f"{path}: prompt cache was written with other KV settings (prefill chunk size or "
            "KV precision); prefill again"
        )

    def take(dtype, shape):
        nonlocal pos
        a = np.frombuffer(data, dtype, int(np.prod(shape)), pos).reshape(shape)
        pos += a.nbytes
        return a

    tokens = take(np.int64, (hdr["tokens"],)).tolist()
    restored = [
        (take(np.int64, (l.cap,)), take(l.k.dtype, l.k.shape), take(l.v.dtype, l.v.shape)) for l in cache.layers
    ]
    for l, (p, k, v) in zip(cache.layers, restored):
        l.pos[:], l.k[...], l.v[...] = p, k, v
    cache.offset = hdr["offset"]
    return tokens
