"""Prompt-cache files on a worker: save a conversation's KV state, find the best one for a new prompt.

Layout: `prompt-cache/MODEL/HASH.kv` (the engine's own file format, `inference.prompt_cache`) beside
`HASH.json` (its token ids, the session it came from). A new prompt reuses the file that shares the
longest token prefix with it, when that beats what the engine's KV already holds — so a request
whose messages extend an earlier conversation continues from its cache, whichever requests ran in
between. Files expire after N days and the directory is capped in total size, oldest first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.prompt_cache import PromptCacheError

log = logging.getLogger(__name__)
MIN_TOKENS = 16  # shorter sequences are cheaper to recompute than to save


@dataclass
class Entry:
    tokens: np.ndarray  # int64 [T]
    path: Path  # the .kv file
    session: str | None = None


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


class PromptCache:
    """The prompt-cache files of one model on this worker.

    Args:
        root: the prompt-cache directory (shared by all models; expiry and cap apply to all of it).
        model: the model's name (its subdirectory).
        max_bytes: cap on the whole directory; max_age: seconds a file lives unused.
    """

    def __init__(self, root: Path, model: str, *, max_bytes: int, max_age: float):
        self.root = root
        self.dir = root / model
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.entries: dict[str, Entry] = {}
        self.prune()
        self._scan()

    def _scan(self) -> None:
        self.entries.clear()
        if not self.dir.is_dir():
            return
        for meta in self.dir.glob("*.json"):
            kv = meta.with_suffix(".kv")
            try:
                info = json.loads(meta.read_text())
                self.entries[meta.stem] = Entry(np.asarray(info["tokens"], np.int64), kv, info.get("session"))
            except (OSError, ValueError, KeyError):
                continue
            if not kv.is_file():
                del self.entries[meta.stem]

    def best(self, ids: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest token prefix with `ids`, and that length."""
        a = np.asarray(ids, np.int64)
        best, n = None, 0
        for e in self.entries.values():
            k = common_prefix(a, e.tokens)
            if k > n:
                best, n = e, k
        return best, n

    def restore(self, engine, ids: list[int]) -> int:
        """Load the best file into `engine` when it shares more of `ids` than the engine's KV does.

        Returns the prefix length the engine now shares with `ids` (its prefill reuses at most that).
        """
        have = common_prefix(np.asarray(ids, np.int64), np.asarray(engine.tokens, np.int64))
        entry, n = self.best(ids)
        if entry is None or n <= have:
            return have
        try:
            engine.load_prompt_cache(entry.path)
        except (PromptCacheError, FileNotFoundError) as e:  # broken, or cleared from the panel meanwhile
            log.warning("dropping prompt cache %s: %s", entry.path, e)
            self._drop(entry)
            return have
        os.utime(entry.path)  # recently used: the cap drops it last
        return n

    def save(self, engine, session: str | None = None) -> Path | None:
        """Write the engine's current sequence (unless short or already saved)."""
        tokens = np.asarray(engine.tokens, np.int64)
        if len(tokens) < MIN_TOKENS:
            return None
        key = hashlib.sha256(tokens.tobytes()).hexdigest()[:32]
        kv = self.dir / f"{key}.kv"
        if key in self.entries and kv.is_file():
            os.utime(kv)
            return kv
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        engine.save_prompt_cache(kv)
        meta = self.dir / f"{key}.json"
        tmp = meta.with_name(f".{meta.name}.tmp")
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(json.dumps({"tokens": tokens.tolist(), "session": session, "saved": time.time()}))
            os.replace(tmp, meta)
        except BaseException:  # a full disk: neither a half-written index nor a .kv file without one
            tmp.unlink(missing_ok=True)
            kv.unlink(missing_ok=True)
            raise
        self.entries[key] = Entry(tokens, kv, session)
        self.prune()
        return kv

    def prune(self) -> None:
        """Drop files unused for `max_age` seconds, then the oldest until the directory fits `max_bytes`."""
        if not self.root.is_dir():
            return
        files = []
        for kv in self.root.glob("*/*.kv"):
            try:
                st = kv.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, kv))
        files.sort()
        now, total = time.time(), sum(f[1] for f in files)
        for mtime, size, kv in files:
            if now - mtime <= self.max_age and total <= self.max_bytes:
                break
            total -= size
            self._unlink(kv)

    def _drop(self, entry: Entry) -> None:
        self._unlink(entry.path)

    def _unlink(self, kv: Path) -> None:
        kv.unlink(missing_ok=True)
        kv.with_suffix(".json").unlink(missing_ok=True)
        if kv.parent == self.dir:
            self.entries.pop(kv.stem, None)
