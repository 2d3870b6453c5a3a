"""Prompt-cache files on a worker: save a conversation's KV state, find the best one for a new prompt.

Layout: `prompt-cache/MODEL/HASH.kv` (the engine's own file format, `inference.prompt_cache`) beside
`HASH.json` (its token ids, the session it came from). A new prompt reuses the file that shares the
longest token prefix with it, when that beats what the engine's KV already holds — so a request
whose messages extend an earlier conversation continues from its cache, whichever requests ran in
between. A file restores into the engine whatever KV capacity or precision it was written with.

Saving costs the request that cuts a conversation short only a copy of the rows its KV holds
(`Engine.snapshot_prompt_cache`): a writer thread writes the file, and until it has, the copy in memory
is what a returning conversation restores from. A file that a newer one of the same conversation
covers is deleted when the newer one is written, so a conversation keeps one file, not one per turn:
covered when the newer one holds the older one's whole prompt (the answer generated after it is what
the next prompt re-sends, tokenized its own way) and its cache can be cut back to that length.

The directory is capped in total size (`.kv` and `.json` files of every model): past the cap the
least recently used files go first (a restore touches its file's mtime), and any file unused for
`max_age` seconds goes too; temporary files a crash left behind are removed after an hour.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.prompt_cache import PromptCacheError, Snapshot, write

log = logging.getLogger(__name__)
MIN_TOKENS = 16  # shorter sequences are cheaper to recompute than to save
STALE_TMP = 3600.0  # s after which a temporary file is a crash's leftover


@dataclass
class Entry:
    tokens: np.ndarray  # int64 [T]
    path: Path  # the .kv file
    session: str | None = None
    snap: Snapshot | None = None  # the rows in memory until the writer has written `path`
    prompt: int = 0  # how many of `tokens` were the request's prompt (the rest: its answer); 0: all


@dataclass
class Counts:
    """What restores did since the cache was opened (the soak's measure: loads that worked)."""

    restored: int = 0  # from a file or a snapshot not yet written
    dropped: int = 0  # a file that could not be used
    saved: int = 0
    superseded: int = 0  # files a newer one of the same conversation replaced
    evicted: int = 0  # files the cap or the age limit removed


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
        self.counts = Counts()
        self._lock = threading.Lock()  # entries: the engine's thread restores and saves, the writer writes
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"rkmojo-prompt-cache-{model}")
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
                self.entries[meta.stem] = Entry(
                    np.asarray(info["tokens"], np.int64), kv, info.get("session"), prompt=info.get("prompt", 0)
                )
            except (OSError, ValueError, KeyError):
                continue
            if not kv.is_file():
                del self.entries[meta.stem]

    def best(self, ids: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest token prefix with `ids`, and that length."""
        a = np.asarray(ids, np.int64)
        best, n = None, 0
        with self._lock:
            entries = list(self.entries.values())
        for e in entries:
            k = common_prefix(a, e.tokens)
            if k > n:
                best, n = e, k
        return best, n

    def restore(self, engine, ids: list[int]) -> int:
        """Load the best file into `engine` when it shares more of `ids` than the engine's KV does.

        Returns the prefix length the engine now shares with `ids` (its prefill reuses at most that).
        """
        have = common_prefix(np.asarray(ids, np.int64), np.asarray(engine.tokens, np.int64))
        while True:
            entry, n = self.best(ids)
            if entry is None or n <= have:
                return have
            if entry.snap is not None or entry.path.is_file():
                break
            with self._lock:  # removed behind this worker's back (the panel's Clear): forget it, try the next
                if self.entries.get(entry.path.stem) is entry:
                    del self.entries[entry.path.stem]
        snap = entry.snap  # read once: the writer clears it when the file is written
        t0 = time.perf_counter()
        try:
            engine.load_prompt_cache(snap if snap is not None else entry.path)
        except (PromptCacheError, FileNotFoundError) as e:  # broken, or cleared from the panel meanwhile
            log.warning("dropping prompt cache %s: %s", entry.path, e)
            self.counts.dropped += 1
            self._drop(entry)
            return have
        self.counts.restored += 1
        log.info(
            "restored prompt cache %s (%d tokens, %s) in %.3f s",
            entry.path.name,
            len(engine.tokens),
            "memory" if snap is not None else "file",
            time.perf_counter() - t0,
        )
        if snap is None:
            try:
                os.utime(entry.path)  # recently used: the cap drops it last
            except FileNotFoundError:
                pass
        return n

    def save(self, engine, session: str | None = None, prompt: int = 0) -> Path | None:
        """Save the engine's current sequence (unless short or already saved): its rows are copied now and
        written by the writer thread; a restore meanwhile takes the copy. `prompt`: how many of its tokens
        were the last request's prompt (0: all of them)."""
        tokens = np.asarray(engine.tokens, np.int64)
        if len(tokens) < MIN_TOKENS:
            return None
        key = hashlib.sha256(tokens.tobytes()).hexdigest()[:32]
        kv = self.dir / f"{key}.kv"
        with self._lock:
            known = self.entries.get(key)
        if known is not None:
            if known.snap is None:
                try:
                    os.utime(kv)
                except FileNotFoundError:
                    pass
            return kv
        entry = Entry(tokens, kv, session, engine.snapshot_prompt_cache(), prompt)
        with self._lock:  # files of this conversation that the new one covers
            older = [e for e in self.entries.values() if self._covers(tokens, e, engine.cache)]
            self.entries[key] = entry
        self._writer.submit(self._write, entry, older)
        return kv

    @staticmethod
    def _covers(tokens: np.ndarray, e: Entry, cache) -> bool:
        """Whether a sequence of `tokens` held by `cache` makes `e` useless: it holds e's whole prompt and
        can be cut back to it, and is longer."""
        prompt = e.prompt or len(e.tokens)
        return len(tokens) > prompt and common_prefix(e.tokens, tokens) >= prompt and cache.can_truncate(prompt)

    def _write(self, entry: Entry, older: list[Entry]) -> None:
        """The writer thread: the .kv file, then its index; then the files it covers go, and the cap applies."""
        kv = entry.path
        meta = kv.with_suffix(".json")
        tmp = meta.with_name(f".{meta.name}.tmp")
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            write(kv, entry.snap)
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                info = {"tokens": entry.tokens.tolist(), "prompt": entry.prompt, "session": entry.session}
                f.write(json.dumps({**info, "saved": time.time()}))
            os.replace(tmp, meta)
        except Exception as e:  # a full disk: neither a half-written index nor a .kv file without one
            tmp.unlink(missing_ok=True)
            kv.unlink(missing_ok=True)
            with self._lock:
                if self.entries.get(kv.stem) is entry:
                    del self.entries[kv.stem]
            log.warning("could not save the prompt cache %s: %s", kv, e)
            return
        entry.snap = None
        self.counts.saved += 1
        for e in older:
            self.counts.superseded += 1
            self._drop(e)
        try:
            self.prune()
        except OSError as e:
            log.warning("could not prune the prompt cache: %s", e)

    def limit(self, max_bytes: int, max_age: float) -> None:
        """New limits (the administrator saved them): the writer thread prunes to them."""
        self.max_bytes, self.max_age = max_bytes, max_age
        self._writer.submit(self.prune)

    def flush(self) -> None:
        """Wait until every saved sequence is written (before the directory is removed, or at shutdown)."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)

    def prune(self) -> None:
        """Drop files unused for `max_age` seconds, then the least recently used until the directory fits
        `max_bytes`; and temporary files older than an hour (a crash's)."""
        if not self.root.is_dir():
            return
        files, now = [], time.time()
        for kv in self.root.glob("*/*.kv"):
            try:
                st = kv.stat()
                size = st.st_size + kv.with_suffix(".json").stat().st_size
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, size, kv))
        for tmp in self.root.glob("*/.*.tmp*"):
            try:
                if now - tmp.stat().st_mtime > STALE_TMP:
                    tmp.unlink()
            except FileNotFoundError:
                pass
        files.sort()
        total = sum(f[1] for f in files)
        for mtime, size, kv in files:
            if now - mtime <= self.max_age and total <= self.max_bytes:
                break
            total -= size
            self.counts.evicted += 1
            self._unlink(kv)

    def _drop(self, entry: Entry) -> None:
        self._unlink(entry.path)

    def _unlink(self, kv: Path) -> None:
        """Remove a file and its index, and forget it: a later restore must not pick a file that is gone."""
        if kv.parent == self.dir:
            with self._lock:
                if (e := self.entries.get(kv.stem)) is not None and e.snap is None:
                    del self.entries[kv.stem]
        kv.unlink(missing_ok=True)
        kv.with_suffix(".json").unlink(missing_ok=True)
        if kv.parent == self.dir:
            with self._lock:
                self.entries.pop(kv.stem, None)
