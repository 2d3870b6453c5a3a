"""The staging directory of one pull (`.NAME.pull/`): its lock, its journal, and the download spool.

`staged` owns the directory's life: it is removed when the pull installs, and when a pull fails with
nothing a later run could go on from — no chunk journaled yet (a refused address, a connection that never
answered, a 404: a failed probe leaves no trace), a refusal by the pull policy, or a file that cannot be
converted (`ConvertError`, `ModelFormatError`). Any other failure (the connection gave up after its
retries, an HTTP error such as an expired token, a full disk, a cancel, Ctrl-C) keeps the downloaded
chunks for a resume.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import ConvertError, ModelFormatError
from ..store.format import digest_bytes
from .http import PullError, Remote
from .policy import PullRefused

USELESS = (PullRefused, ConvertError, ModelFormatError)  # failures after which a resume cannot help

CHUNK = 8 * 2**20  # download unit: one journal line and digest per chunk


class PullLock:
    """An exclusive flock on `staging/lock`: one pull per name at a time; released when the process dies."""

    def __init__(self, staging: Path, name: str):
        self.staging = staging
        self.name = name

    def __enter__(self):
        self.staging.mkdir(parents=True, exist_ok=True)
        self.f = open(self.staging / "lock", "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.seek(0)
            pid = self.f.read().strip() or "?"
            self.f.close()
            raise PullError(
                f"another `rkmojo pull` is installing {self.name} (pid {pid}); wait for it to finish"
            ) from None
        self.f.seek(0)
        self.f.truncate()
        self.f.write(str(os.getpid()))
        self.f.flush()
        return self

    def __exit__(self, *exc):
        self.f.close()


class Journal:
    """Append-only JSON lines, each fsynced; a torn last line (a kill mid-write) is ignored on reading."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    break
        self.f = open(path, "a")

    def append(self, rec: dict) -> None:
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.records.append(rec)

    def reset(self, first: dict) -> None:
        self.f.close()
        self.path.write_text(json.dumps(first, separators=(",", ":")) + "\n")
        self.f = open(self.path, "a")
        self.records = [first]

    def close(self) -> None:
        self.f.close()

    def downloaded(self) -> bool:
        return any(r.get("t") == "chunk" for r in self.records)


@contextmanager
def staged(staging: Path, name: str) -> Iterator[Journal]:
    """Lock `staging` (created if need be) and open its journal; remove it on success, and on a failure
    that leaves nothing a resume can use."""
    with PullLock(staging, name):
        journal = Journal(staging / "journal.jsonl")
        try:
            yield journal
        except BaseException as e:
            journal.close()
            if isinstance(e, USELESS) or not journal.downloaded():
                shutil.rmtree(staging, ignore_errors=True)
            raise
        journal.close()
        shutil.rmtree(staging, ignore_errors=True)


class Spool:
    """One byte range downloaded into a file chunk by chunk; chunks already journaled are kept if they verify."""

    def __init__(self, path: Path, journal: Journal, key: dict, size: int, bar):
        self.path, self.journal, self.key, self.size, self.bar = path, journal, key, size, bar

    def fill(self, remote: Remote, file: str, start: int) -> None:
        """Make the spool hold bytes [start, start + size) of `file`."""
        done = self._verified_prefix()
        self.bar.update(done)
        with open(self.path, "r+b" if self.path.exists() else "w+b") as f:
            f.truncate(done)
            f.seek(done)
            pos = done
            while pos < self.size:
                n = min(CHUNK, self.size - pos)
                h = digest_bytes()

                def sink(b: bytes) -> None:
                    f.write(b)
                    h.update(b)  # noqa: B023 - read_range calls it before the loop moves on
                    self.bar.update(len(b))

                remote.read_range(file, start + pos, start + pos + n, sink)
                f.flush()
                os.fsync(f.fileno())
                self.journal.append({"t": "chunk", **self.key, "off": pos, "len": n, "digest": h.hexdigest()})
                pos += n

    def _verified_prefix(self) -> int:
        chunks = sorted(
            (
                r
                for r in self.journal.records
                if r.get("t") == "chunk" and all(r.get(k) == v for k, v in self.key.items())
            ),
            key=lambda r: r["off"],
        )
        if not chunks or not self.path.exists():
            return 0
        pos = 0
        with open(self.path, "rb") as f:
            for c in chunks:
                if c["off"] != pos:
                    continue
                f.seek(pos)
                if digest_bytes(f.read(c["len"])).hexdigest() != c["digest"]:
                    break
                pos += c["len"]
        return pos
