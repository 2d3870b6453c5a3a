"""One GGUF file of a Hugging Face repository: `rkmojo pull hf.co/OWNER/REPO[:QUANT]` (as Ollama spells it) or
`rkmojo pull OWNER/REPO --file NAME.gguf`.

The repository's file list (the Hub's `GET /api/models/OWNER/REPO/tree/REVISION?recursive=true`) is read,
and one `.gguf` file picked:
- `--file NAME` names it (a path in the repository);
- `:QUANT` (case-insensitive, e.g. `Q4_K_M`, `q8_0`) picks the one file whose name holds it as a word
  (between `-`, `_`, `.` or `/`), vision projectors (`mmproj…`) left out;
- neither: `Q4_K_M` when the repository has it (Ollama's default), else the only GGUF there is.

Then that file's URL (`…/resolve/REVISION/PATH`) is pulled as any GGUF URL is (`pull_gguf`: resumable,
converted as it lands). A split GGUF (`…-00001-of-00003.gguf`) is refused with the way to merge it; several
matches are refused listing them.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse

from .http import PullError, Remote

PREFIXES = ("hf.co/", "huggingface.co/")
DEFAULT_QUANT = "Q4_K_M"
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def is_hf_gguf(spec: str) -> bool:
    return spec.startswith(PREFIXES)


def parse(spec: str) -> tuple[str, str | None]:
    """`hf.co/OWNER/REPO[:QUANT]` → (OWNER/REPO, QUANT or None).

    Raises:
        PullError: not of that form.
    """
    rest = spec.split("/", 1)[1] if is_hf_gguf(spec) else spec
    repo, _, quant = rest.partition(":")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo) or (quant and not re.fullmatch(r"[\w.-]+", quant)):
        raise PullError(
            f"{spec!r}: give hf.co/OWNER/REPO or hf.co/OWNER/REPO:QUANT, e.g. hf.co/unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M"
        )
    return repo, quant or None


def pick(files: list[str], repo: str, quant: str | None, file: str | None) -> str:
    """The GGUF of `files` (paths in `repo`) that `quant` or `file` names (see the module's docstring).

    Raises:
        PullError: none, several, or a split file.
    """
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if file is not None:
        if file not in files:
            raise PullError(f"{repo}: has no file {file!r}; its GGUF files: {', '.join(ggufs) or 'none'}")
        chosen = [file]
    else:
        models = [f for f in ggufs if not os.path.basename(f).lower().startswith("mmproj")]
        want = quant or DEFAULT_QUANT
        word = re.compile(rf"(^|[-_./]){re.escape(want)}([-_./]|$)", re.IGNORECASE)
        chosen = [f for f in models if word.search(f[: -len(".gguf")] + ".")]
        if not chosen and quant is None and len(models) == 1:
            chosen = models
        if not chosen:
            raise PullError(
                f"{repo}: no GGUF file for {want}; its GGUF files: {', '.join(models) or 'none'}; "
                "name one with :QUANT or --file"
            )
    if any(SPLIT.search(f) for f in chosen):
        raise PullError(
            f"{repo}: {chosen[0]} is one part of a split GGUF, which rkmojo does not read yet; merge the parts with "
            "llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf` and convert OUT.gguf"
        )
    if len(chosen) > 1:
        raise PullError(f"{repo}: several GGUF files match: {', '.join(chosen)}; name one with --file")
    return chosen[0]


def resolve(
    repo: str,
    quant: str | None,
    file: str | None,
    *,
    endpoint: str,
    revision: str = "main",
    token: str | None = None,
    policy=None,
    retries: int = 6,
    cancel=None,
) -> tuple[str, str]:
    """(the URL of the picked GGUF, its path in the repository)."""
    rev = urllib.parse.quote(revision, safe="")
    listing = Remote(
        f"{endpoint}/api/models/{repo}/tree/{rev}?recursive=true",
        f"{repo}@{revision}",
        token=token,
        retries=retries,
        cancel=cancel,
        policy=policy,
    )
    raw = listing.get("")
    try:
        files = [e["path"] for e in json.loads(raw) if e.get("type") == "file"]
    except (ValueError, TypeError, KeyError) as e:
        raise PullError(f"{repo}@{revision}: the file list is unreadable ({e})") from None
    path = pick(files, repo, quant, file)
    return f"{endpoint}/{repo}/resolve/{rev}/{urllib.parse.quote(path)}", path


def default_name(spec: str) -> str:
    """The models-directory name of `hf.co/OWNER/REPO[:QUANT]`: REPO-QUANT, lowercased, the quant Q4_K_M when
    none is given ("hf.co/unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M" → "qwen3-30b-a3b-gguf-q4_k_m"); known before the
    file list is read, as the panel names an install before it starts."""
    repo, quant = parse(spec)
    return f"{repo.rsplit('/', 1)[-1]}-{quant or DEFAULT_QUANT}".lower()


def file_name(path: str) -> str:
    """The models-directory name of a file picked by `--file`: its stem, lowercased."""
    return os.path.basename(path)[: -len(".gguf")].lower()
