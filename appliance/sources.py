"""Where `/api/pull` and the install task may take a model from: a repository id, an http(s) URL, or a
file inside the import directory (`RKMOJO_IMPORT_DIR`, default DATA_DIR/import).

The web side checks a source before it queues an install and the worker checks it again before it
opens anything: a path outside the import directory (after resolving symlinks and `..`) is refused
whether or not it exists, so the API is no oracle for the service user's files, and no error repeats
a byte of a file's content. The check is on the path as written (`..` resolved lexically): a link
placed in the import directory by the administrator may point anywhere, a caller cannot make one.

A URL's host is not judged here: its address is known only when the worker resolves it, and the worker's
pull checks that address on every connection and redirect (`inference.pull.policy`, `Settings →
pull_from_lan`).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")


class SourceError(ValueError):
    """A source the appliance does not install from; the message says what it takes."""


def local_path(source: str, import_dir: Path) -> Path | None:
    """The file a local source names (inside `import_dir`), or None for a repository id or URL.

    Raises:
        SourceError: another URL scheme, a URL that names no file (it ends in "/"), a path outside
            `import_dir`, or neither a path nor a repo id.
    """
    if source.startswith(("http://", "https://")):
        if not urllib.parse.urlsplit(source).path.rsplit("/", 1)[-1]:
            raise SourceError(f"{source}: the URL names no file; give the .gguf file's URL")
        return None
    if "://" in source or source.startswith("file:"):
        raise SourceError(f"{source.split(':', 1)[0]}: URLs are taken as http:// or https:// only")
    if REPO_ID.fullmatch(source) and not source.startswith("."):
        return None
    if source.startswith(("hf.co/", "huggingface.co/")):  # one GGUF of a repository (`inference.pull.hfgguf`)
        return None
    # a path: lexically, so that a link the administrator put in the import directory may point elsewhere
    path = Path(os.path.normpath(import_dir / Path(source).expanduser()))  # an absolute source replaces it
    if not path.is_relative_to(os.path.normpath(import_dir)):
        raise SourceError(
            f"{source}: local files are installed only from inside {import_dir}; copy or link the model there"
        )
    if path.is_file():
        return path
    if "/" in source:
        raise SourceError(f"{source}: no such file in {import_dir}")
    raise SourceError(
        f"{source!r}: give a repository id like Qwen/Qwen3-30B-A3B, hf.co/OWNER/REPO:QUANT for one of its GGUF "
        f"files, the http(s) URL of a .gguf file, or the name of a file in {import_dir}"
    )
