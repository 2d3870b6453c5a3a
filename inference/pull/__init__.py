"""`rkmojo pull`: install a model from a Hugging Face-style repository (or one GGUF file) over HTTP(S).

For a repository, nothing but the small files (config, tokenizer) lands on disk unconverted: each
safetensors header is read with a Range request, then each tensor's byte range, straight into the
converter (`convert.hf.convert_hf` with remote shards), one tensor at a time — bounded memory, no
second copy of the checkpoint. URL layout `{endpoint}/{repo}/resolve/{revision}/{file}`; the
endpoint from `--endpoint`, `$HF_ENDPOINT`, or huggingface.co; `$HF_TOKEN` is sent as a bearer token
(to the endpoint only, not along redirects).

Resumable at any point. Everything lives in `.NAME.pull/` beside the models (`staging.py`): a lock
(flock: two pulls of one name cannot run at once; a killed pull holds nothing), `journal.jsonl` (the
source and the digest of each shard header; then a line per downloaded 8 MiB chunk with the xxh3
digest of its bytes, and a line per tensor written into the store with the index entries it added),
the partial store, and the spool of the tensor in flight. A new run checks the source and headers
against the journal and the committed dense tensors against their digests (else it starts over),
trusts the store up to the last committed tensor (later bytes are cut off), keeps the spooled chunks
of the tensor in flight whose digests still match, and goes on from there (`repo.py`). The store is
renamed into the models directory in the last step (`StoreWriter.finish`), then the staging
directory is removed.

HTTP (`http.py`): transient failures are retried with exponential backoff; 401/403/404 stop at once
with an error naming the file; a server that ignores Range requests is a clear error. A single GGUF
file (`rkmojo pull https://…/x.gguf`, `gguf.py`) is downloaded the same resumable way (the one place a
whole source file lands on disk, since the GGUF reader maps a local file), converted, then deleted.
A failure that left nothing to resume from removes the staging directory (`staging.staged`).

Where it may connect (`policy.py`): `pull(..., policy=PullPolicy(lan=...))` checks the resolved address of
every connection and redirect, and connects to the checked one; a service pulling for network clients (the
appliance's worker) passes one. The command line passes none: its user owns the machine and may pull from
a server on it or on the LAN, as curl would.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from pathlib import Path

from . import hfgguf
from .gguf import pull_gguf
from .http import DownloadFailed, PullCancelled, PullError, Remote
from .policy import FAILED, REFUSED, PullPolicy, PullRefused
from .repo import DEFAULT_ENDPOINT, pull_repo
from .staging import PullLock

__all__ = [
    "pull",
    "pull_repo",
    "pull_gguf",
    "PullError",
    "PullCancelled",
    "DownloadFailed",
    "PullPolicy",
    "PullRefused",
    "REFUSED",
    "FAILED",
    "PullLock",
    "Remote",
    "describe_partial",
    "default_name",
    "DEFAULT_ENDPOINT",
]


def default_name(spec: str) -> str:
    """The models-directory name for a repo id ("Qwen/Qwen3-30B-A3B" → "qwen3-30b-a3b") or a GGUF URL."""
    if hfgguf.is_hf_gguf(spec):
        return hfgguf.default_name(spec)
    if is_url(spec):
        stem = urllib.parse.urlsplit(spec).path.rsplit("/", 1)[-1]
        return stem[: -len(".gguf")].lower() if stem.lower().endswith(".gguf") else stem.lower()
    return spec.rstrip("/").rsplit("/", 1)[-1].lower()


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def pull(spec: str, models: Path, *, name: str | None = None, **kw) -> Path:
    """`rkmojo pull SPEC`: a repository id (with `revision`, `endpoint`) or a GGUF URL, into `models/NAME`.

    Args:
        policy: `PullPolicy`, the addresses it may connect to (None: any).
    Raises:
        PullRefused: the policy refused an address of the URL or of a redirect.
        PullError: a bad spec, or any failure of the download (what a resume can use is kept).
    """
    token = kw.pop("token", None) or os.environ.get("HF_TOKEN") or None
    file = kw.pop("file", None)
    if hfgguf.is_hf_gguf(spec) or file is not None:  # one GGUF file of a repository
        repo, quant = hfgguf.parse(spec)
        endpoint = (kw.pop("endpoint", None) or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        revision = kw.pop("revision", None) or "main"
        kw.pop("quant", None)
        url, path = hfgguf.resolve(
            repo,
            quant,
            file,
            endpoint=endpoint,
            revision=revision,
            token=token,
            policy=kw.get("policy"),
            retries=kw.get("retries", 6),
            cancel=kw.get("cancel"),
        )
        name = name or (hfgguf.file_name(path) if file is not None else hfgguf.default_name(spec))
        return pull_gguf(url, models / _checked(name), token=token, **kw)
    name = _checked(name or default_name(spec))
    if is_url(spec):
        if not urllib.parse.urlsplit(spec).path.lower().endswith(".gguf"):
            raise PullError(f"{spec}: a URL must point at a .gguf file; for a repository give its id (owner/name)")
        for repo_only in ("revision", "endpoint", "quant"):
            kw.pop(repo_only, None)
        return pull_gguf(spec, models / name, token=token, **kw)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        raise PullError(f"{spec!r}: give a repository id like Qwen/Qwen3-30B-A3B, or the URL of a .gguf file")
    return pull_repo(spec, models / name, token=token, **kw)


def _checked(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise PullError(f"model name {name!r}: give a plain name with --name")
    return name


def describe_partial(staging: Path) -> dict | None:
    """What `rkmojo list` says about an interrupted pull: name, source and bytes done (None if unreadable)."""
    try:
        first = json.loads((staging / "journal.jsonl").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    done = 0
    for line in (staging / "journal.jsonl").read_text().splitlines()[1:]:
        try:
            rec = json.loads(line)
        except ValueError:
            break
        done += rec.get("len", 0) if rec.get("t") == "chunk" else 0
    source = first.get("url") or f"{first.get('repo')}@{first.get('revision')}"
    if first.get("type") == "gguf-url":
        done = min(done, first.get("size") or done)
    return {"name": staging.name[1 : -len(".pull")], "source": source, "done": done, "total": first.get("size")}
