"""Ollama model store → `.rkmojo` store: `rkmojo import ollama:NAME[:TAG]`.

What is read (Ollama's directory is only ever read: no file there is written, moved or locked):

- the manifest `DIR/manifests/HOST/NAMESPACE/MODEL/TAG` (JSON, OCI-like): `llama3.2` is
  `registry.ollama.ai/library/llama3.2/latest`, `USER/NAME:TAG` is `registry.ollama.ai/USER/NAME/TAG`,
  `hf.co/OWNER/REPO:TAG` is `hf.co/OWNER/REPO/TAG`. An exact path is tried first, then the same path
  matched case-insensitively, part by part (Ollama treats names case-insensitively).
- its one `application/vnd.ollama.image.model` layer, the blob `DIR/blobs/sha256-<hex>`: a GGUF, converted in
  place by `convert.convert` (the blob is never copied). Its sha256 is computed by a thread that streams the
  blob once, front to back, while the converter maps it; the page cache serves both readers. A digest that
  differs from the manifest's is reported in preference to any error of the converter (a corrupt blob explains
  a refused GGUF better than the converter can).
- the `application/vnd.ollama.image.params` layer (JSON), when there is one: `temperature`, `top_k`, `top_p`,
  `min_p` and `repeat_penalty` (as `repetition_penalty`) become the store's `generation` defaults, over
  the GGUF's own `general.sampling.*`, as Ollama applies them. `stop` and the runner options (`num_ctx`, …)
  have no place in a store's generation defaults and are skipped: the GGUF's end-of-generation ids end an
  answer.

Refused: a missing manifest or blob, a manifest with no model layer or with several, a model blob of the
wrong size or digest, and an `adapter` (LoRA) or `projector` (vision) layer, which the engine cannot apply.

Ignored: the `template` layer (a Go template; the GGUF's `tokenizer.chat_template` is the model's Jinja
template and is what the store keeps), `system`, `messages`, `license` and the config blob.

The store is converted into a hidden directory beside the models (`.NAME.import-XXXXXXXX`), its manifest gets
the Ollama source and the generation defaults, and it is renamed to `NAME` once the digest matched; a refused
or failed import leaves nothing in the models directory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConvertError, ModelFormatError
from ..store.relayout import _write_json_atomic
from . import convert
from .gguf import SAMPLING_KEYS

log = logging.getLogger(__name__)

SCHEME = "ollama:"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MEDIA = "application/vnd.ollama.image."
MODEL_LAYER, PARAMS_LAYER = MEDIA + "model", MEDIA + "params"
REFUSED_LAYERS = {MEDIA + "adapter": "a LoRA adapter", MEDIA + "projector": "a vision projector"}
# params key → generation key (the names the GGUF converter's `general.sampling.*` map to)
PARAM_KEYS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
}
assert set(PARAM_KEYS.values()) <= set(SAMPLING_KEYS.values())
HASH_CHUNK = 8 * 2**20
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class OllamaRef:
    """A model name as Ollama spells it, every part filled in."""

    host: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, name: str) -> "OllamaRef":
        """`MODEL[:TAG]`, `NAMESPACE/MODEL[:TAG]` or `HOST/NAMESPACE/MODEL[:TAG]`.

        Raises:
            ConvertError: any other shape.
        """
        path, tag = name.rsplit(":", 1) if ":" in name.rsplit("/", 1)[-1] else (name, DEFAULT_TAG)
        parts = path.split("/")
        ok = all(re.fullmatch(r"[\w.-]+", p) for p in [*parts, tag])
        if not ok or len(parts) > 3 or any(p in (".", "..") for p in [*parts, tag]):
            raise ConvertError(
                f"ollama:{name}: not an Ollama model name; give one as `ollama list` shows it, "
                "like ollama:qwen3:30b-a3b or ollama:hf.co/OWNER/REPO:TAG"
            )
        prefix = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(parts)]
        host, namespace, model = [*prefix, *parts]
        return cls(host, namespace, model, tag)

    def __str__(self) -> str:
        """The name as `ollama list` shows it (default host and namespace left out)."""
        name = f"{self.host}/{self.namespace}/{self.model}"
        return name.removeprefix(f"{DEFAULT_HOST}/").removeprefix(f"{DEFAULT_NAMESPACE}/") + f":{self.tag}"

    def manifest(self, root: Path) -> Path:
        """The manifest file under Ollama's models directory `root` (not checked to exist)."""
        return root / "manifests" / self.host / self.namespace / self.model / self.tag

    def default_name(self) -> str:
        """The models-directory name: the model, then the tag unless it is `latest` (`qwen3:30b-a3b` →
        `qwen3-30b-a3b`), lowercased."""
        return (self.model if self.tag == DEFAULT_TAG else f"{self.model}-{self.tag}").lower()


def ollama_dirs() -> list[Path]:
    """Where Ollama keeps its models, in the order looked at: $OLLAMA_MODELS, ~/.ollama/models, and the
    Linux service's /usr/share/ollama/.ollama/models."""
    env = os.environ.get("OLLAMA_MODELS")
    found = [Path(env)] if env else []
    return found + [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def find_ollama_dir(given: str | Path | None = None) -> Path:
    """`given`, else the first of `ollama_dirs()` that exists.

    Raises:
        ConvertError: `given` has no manifests/ folder, or none of the usual places exists.
    """
    if given is not None:
        root = Path(given)
        if not (root / "manifests").is_dir():
            raise ConvertError(
                f"{root}: not an Ollama models directory (no manifests/ in it); "
                "give the folder that holds manifests/ and blobs/ with --ollama-dir"
            )
        return root
    for root in ollama_dirs():
        if (root / "manifests").is_dir():
            return root
    tried = ", ".join(str(p) for p in ollama_dirs())
    raise ConvertError(f"no Ollama models directory found (looked in {tried}); give one with --ollama-dir")


def import_ollama(
    name: str,
    models: Path,
    *,
    ollama_dir: str | Path | None = None,
    local_name: str | None = None,
    progress: bool = True,
) -> Path:
    """Convert Ollama's model `name` (`MODEL[:TAG]`, without the `ollama:` scheme) into `models/LOCAL_NAME`.

    Args:
        name: the model as `ollama list` shows it.
        models: the models directory.
        ollama_dir: Ollama's models directory (default: `find_ollama_dir`).
        local_name: the name in `models` (default: `OllamaRef.default_name`).
        progress: show the converter's progress bar.
    Returns:
        the installed store.
    Raises:
        ConvertError: a missing manifest or blob, an unusable manifest, an existing store of that name, or
            what the GGUF converter refuses.
        ModelFormatError: a blob whose size or sha256 is not the manifest's, or a GGUF the converter cannot read.
    """
    ref = OllamaRef.parse(name)
    root = find_ollama_dir(ollama_dir)
    local_name = local_name or ref.default_name()
    if not local_name or "/" in local_name or local_name.startswith("."):
        raise ConvertError(f"model name {local_name!r}: give a plain name with --name")
    out = Path(models) / local_name
    if out.exists():
        raise ConvertError(f"{out}: a model of that name is installed; `rkmojo rm {local_name}` it or give --name")
    mpath = _find_manifest(ref, root)
    layers = _layers(mpath, ref)
    model = _model_layer(layers, mpath, ref)
    blob = _blob(root, model, mpath, ref)
    generation = _params(root, layers, mpath)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{local_name}.import-{uuid.uuid4().hex[:8]}")
    digest = _Sha256(blob)
    digest.start()
    try:
        try:
            convert(blob, staging, progress=progress)
        except (ConvertError, ModelFormatError):
            digest.join()
            _check_digest(digest, blob, model["digest"], ref)
            raise
        digest.join()
        _check_digest(digest, blob, model["digest"], ref)
        _annotate(staging, ref, model["digest"], generation)
        try:
            os.rename(staging, out)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            raise ConvertError(f"{out}: a model of that name was installed meanwhile; give another --name") from None
    finally:
        digest.stop()
        shutil.rmtree(staging, ignore_errors=True)
    return out


# --- the manifest -------------------------------------------------------------------------------
def _find_manifest(ref: OllamaRef, root: Path) -> Path:
    exact = ref.manifest(root)
    if exact.is_file():
        return exact
    path = root / "manifests"
    for part in exact.relative_to(path).parts:
        lower = part.lower()
        match = next((p for p in _entries(path) if p.name.lower() == lower), None)
        if match is None:
            break
        path = match
    else:
        if path.is_file():
            return path
    raise ConvertError(
        f"{exact}: no such Ollama manifest; `ollama list` shows the models in {root} "
        f"(`ollama pull {ref}` fetches this one), or give another directory with --ollama-dir"
    )


def _entries(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _layers(mpath: Path, ref: OllamaRef) -> list[dict]:
    try:
        man = json.loads(mpath.read_bytes())
        layers = man["layers"]
        if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
            raise TypeError("layers is not a list of objects")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelFormatError(
            f"{mpath}: unreadable Ollama manifest ({type(e).__name__}: {e}); `ollama pull {ref}` again"
        ) from None
    for layer in layers:
        what = REFUSED_LAYERS.get(layer.get("mediaType"))
        if what:
            raise ConvertError(
                f"{mpath}: {ref} has {what} layer ({layer['mediaType']}), which rkmojo cannot apply; "
                "import the base model without it"
            )
    return layers


def _model_layer(layers: list[dict], mpath: Path, ref: OllamaRef) -> dict:
    found = [x for x in layers if x.get("mediaType") == MODEL_LAYER]
    if len(found) != 1:
        what = "no model layer" if not found else f"{len(found)} model layers (a split model)"
        raise ConvertError(f"{mpath}: {ref} has {what}; rkmojo imports a model stored as one GGUF layer")
    layer = found[0]
    if not _DIGEST.fullmatch(str(layer.get("digest"))):
        raise ModelFormatError(
            f"{mpath}: model layer digest {layer.get('digest')!r} is not sha256:<64 hex digits>; "
            f"`ollama pull {ref}` again"
        )
    return layer


def _blob_path(root: Path, digest: str) -> Path:
    return root / "blobs" / digest.replace(":", "-", 1)


def _blob(root: Path, layer: dict, mpath: Path, ref: OllamaRef) -> Path:
    blob = _blob_path(root, layer["digest"])
    if not blob.is_file():
        raise ConvertError(f"{blob}: blob missing (the model layer of {mpath}); `ollama pull {ref}` restores it")
    size = blob.stat().st_size
    if isinstance(layer.get("size"), int) and layer["size"] != size:
        raise ModelFormatError(
            f"{blob}: {size} bytes but the manifest says {layer['size']}; the blob is damaged, "
            f"`ollama rm {ref}` and pull it again"
        )
    return blob


def _params(root: Path, layers: list[dict], mpath: Path) -> dict:
    """The generation defaults the params layer sets (`PARAM_KEYS`); {} without one."""
    layer = next((x for x in layers if x.get("mediaType") == PARAMS_LAYER), None)
    if layer is None:
        return {}
    path = _blob_path(root, str(layer.get("digest")))
    try:
        params = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        log.warning("%s: params layer unreadable (%s); the GGUF's sampling defaults are kept", path, e)
        return {}
    out = {}
    for key, gen_key in PARAM_KEYS.items():
        v = params.get(key) if isinstance(params, dict) else None
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            log.warning("%s: params %s=%r is not a number; skipped", path, key, v)
            continue
        out[gen_key] = v
    return out


# --- the blob's digest --------------------------------------------------------------------------
class _Sha256(threading.Thread):
    """sha256 of one file, streamed front to back once; `stop` ends it early (the result is then None)."""

    def __init__(self, path: Path):
        super().__init__(name=f"sha256 {path.name}", daemon=True)
        self.path = path
        self.hexdigest: str | None = None
        self.error: OSError | None = None
        self._cancel = threading.Event()

    def run(self) -> None:
        h, buf = hashlib.sha256(), bytearray(HASH_CHUNK)
        view = memoryview(buf)
        try:
            with open(self.path, "rb", buffering=0) as f:
                while not self._cancel.is_set():
                    n = f.readinto(buf)
                    if not n:
                        self.hexdigest = h.hexdigest()
                        return
                    h.update(view[:n])  # hashlib drops the GIL for large buffers: this runs beside the converter
        except OSError as e:
            self.error = e

    def stop(self) -> None:
        self._cancel.set()
        if self.is_alive():
            self.join()


def _check_digest(d: _Sha256, blob: Path, want: str, ref: OllamaRef) -> None:
    if d.error is not None:
        raise ModelFormatError(f"{blob}: unreadable ({d.error.strerror}); check the disk, then import again")
    got = f"sha256:{d.hexdigest}"
    if got != want:
        raise ModelFormatError(
            f"{blob}: sha256 is {got[7:19]}…, not the manifest's {want[7:19]}…; the blob is damaged, "
            f"`ollama rm {ref}` and pull it again"
        )


# --- the store's manifest -----------------------------------------------------------------------
def _annotate(store: Path, ref: OllamaRef, digest: str, generation: dict) -> None:
    """Record the Ollama source, and the params layer's defaults over the GGUF's, in the store's manifest."""
    path = store / "manifest.json"
    man = json.loads(path.read_text())
    man["source"] = {**man.get("source", {}), "type": "ollama", "ollama_model": str(ref), "digest": digest}
    man["generation"] = {**man.get("generation", {}), **generation}
    _write_json_atomic(path, man)
