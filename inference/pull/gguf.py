"""Pulling one GGUF file by URL: a resumable download into the staging directory, then `convert_gguf`."""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path

from ..convert.gguf import convert_gguf
from ..convert.progress import progress_bar
from .http import Remote
from .policy import PullPolicy
from .repo import staging_dir
from .staging import Spool, staged


def pull_gguf(
    url: str,
    out: Path,
    *,
    token: str | None = None,
    progress: bool = True,
    retries: int = 6,
    cancel=None,
    policy: PullPolicy | None = None,
    on_retry=None,
) -> Path:
    """Download one GGUF file by URL (resumable, chunk digests), convert it into `out`, drop the download."""
    parsed = urllib.parse.urlsplit(url)
    label = parsed.path.rsplit("/", 1)[-1] or url
    remote = Remote(url, label, token=token, retries=retries, cancel=cancel, policy=policy, on_retry=on_retry)
    staging = staging_dir(out)
    with staged(staging, out.name) as journal:
        size, etag = remote.size("")
        start = {"t": "start", "type": "gguf-url", "url": url, "size": size, "etag": etag, "name": out.name}
        if not journal.records or journal.records[0] != start:
            journal.reset(start)
            (staging / "model.gguf").unlink(missing_ok=True)
        with progress_bar(size, f"pull {remote.label}", progress) as bar:
            Spool(staging / "model.gguf", journal, {"file": "model.gguf"}, size, bar).fill(remote, "", 0)
        journal.close()
        result = convert_gguf(staging / "model.gguf", out, progress=progress)
        _patch_source(out, {"type": "gguf-url", "url": url})
    return result


def _patch_source(store: Path, source: dict) -> None:
    """Record where a pulled GGUF came from (its manifest named the staging file)."""
    path = store / "manifest.json"
    man = json.loads(path.read_text())
    man["source"] = {**man.get("source", {}), **source}
    man["source"].pop("path", None)
    tmp = path.with_name("manifest.json.part")
    tmp.write_text(json.dumps(man, indent=1))
    os.replace(tmp, path)
