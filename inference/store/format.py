"""Constants of the `.rkmojo` store format (documented in docs/store-format.md)."""

from __future__ import annotations

import hashlib

import xxhash

FORMAT_NAME = "rkmojo-store"
FORMAT_VERSION = 1
# every tensor part starts on a 64-byte boundary (cache line; SIMD loads)
ALIGN = 64
# expert blobs sit at e × stride, stride a multiple of 16 KiB: one aligned O_DIRECT read per miss
EXPERT_STRIDE_ALIGN = 16 * 1024
DIGEST = "xxh3_128"


def digest_bytes(data: bytes | memoryview | None = None):
    """A fresh xxh3-128 hasher, fed `data` when given."""
    h = xxhash.xxh3_128()
    if data is not None:
        h.update(data)
    return h


def sha256_file(path) -> str:
    """The sha256 of a file (the NPU graphs' digest: `npu.<target>` in the manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a
