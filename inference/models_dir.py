"""The models directory: what `rkmojo list`, `show` and `rm` read and change.

Named models live in `models_dir()` (default ~/.local/share/rkmojo/models; `$RKMOJO_HOME/models`),
one store directory each. An interrupted `rkmojo pull NAME` leaves `.NAME.pull/` beside them; `list`
shows it as partial and `rm NAME` removes it.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelFormatError, RkmojoError
from .store import Store


def models_dir() -> Path:
    """Where named models live: $RKMOJO_HOME/models, default ~/.local/share/rkmojo/models."""
    home = os.environ.get("RKMOJO_HOME")
    base = Path(home) if home else Path.home() / ".local" / "share" / "rkmojo"
    return base / "models"


def resolve_model(name: str) -> Path:
    """A store path from a name in the models directory or a path.

    Raises:
        RkmojoError: neither exists.
    """
    p = Path(name)
    if (p / "manifest.json").is_file():
        return p
    q = models_dir() / name
    if (q / "manifest.json").is_file():
        return q
    hint = "`rkmojo list` shows the installed ones" if models_dir().is_dir() else "install one with `rkmojo pull`"
    raise RkmojoError(f"model {name!r} not found as a path or in {models_dir()}; {hint}")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def fmt_count(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(int(n))


@dataclass
class ModelInfo:
    """What `list` and `show` print about one store."""

    name: str
    path: Path
    architecture: str
    quantization: dict
    disk_bytes: int
    params: int  # every weight
    active_params: int  # weights one token uses (MoE: the routed top-k experts only)
    context: int
    layers: int
    hidden: int
    vocab: int
    experts: dict = field(default_factory=dict)  # {"layers", "per_layer", "top_k", "blob_bytes"} for MoE stores
    source: dict = field(default_factory=dict)
    has_template: bool = False
    generation: dict = field(default_factory=dict)

    @property
    def quant(self) -> str:
        q = self.quantization
        return str(q.get("default", "?")) + (f" (experts {q['expert']})" if "expert" in q else "")


def describe(path: Path) -> ModelInfo:
    """Read a store's manifest into a `ModelInfo` (no tensor is read).

    Raises:
        ModelFormatError: not a readable store.
    """
    st = Store(path)
    cfg, man = st.config, st.manifest
    dense = sum(math.prod(t["shape"]) for t in man["dense"]["tensors"].values())
    experts, per_token = {}, dense
    expert_params = 0
    if st.expert_layers:
        lay = next(iter(st.expert_layers.values()))
        per_expert = sum(math.prod(t["shape"]) for t in lay.tensors.values())
        top_k = int(cfg.get("num_experts_per_tok") or cfg.get("top_k_experts") or 0)
        expert_params = per_expert * sum(l.n_experts for l in st.expert_layers.values())
        per_token += per_expert * top_k * len(st.expert_layers)
        experts = {
            "layers": len(st.expert_layers),
            "per_layer": lay.n_experts,
            "top_k": top_k,
            "blob_bytes": lay.blob_size,
        }
    if "embed" in man["dense"]["tensors"]:
        per_token -= math.prod(man["dense"]["tensors"]["embed"]["shape"])  # a lookup, not a matmul
        if "lm_head" not in man["dense"]["tensors"]:
            per_token += math.prod(man["dense"]["tensors"]["embed"]["shape"])  # tied: used as the head
    disk = sum(f.stat().st_size for f in st.path.rglob("*") if f.is_file())
    template = bool(man.get("tokenizer", {}).get("chat_template")) or (st.path / "chat_template.jinja").is_file()
    return ModelInfo(
        name=st.path.name,
        path=st.path,
        architecture=st.architecture,
        quantization=dict(man.get("quantization", {})),
        disk_bytes=disk,
        params=dense + expert_params,
        active_params=per_token,
        context=int(cfg.get("max_position_embeddings") or 0),
        layers=int(cfg.get("num_hidden_layers") or 0),
        hidden=int(cfg.get("hidden_size") or 0),
        vocab=int(cfg.get("vocab_size") or 0),
        experts=experts,
        source=dict(man.get("source", {})),
        has_template=template,
        generation=dict(man.get("generation", {})),
    )


def quick_check(path: Path) -> str | None:
    """None when every file a store names is present at its full size; else what is wrong."""
    st = Store(path)
    dense = st.path / st.manifest["dense"]["file"]
    want = st.manifest["dense"].get("size", 0)
    if not dense.is_file() or dense.stat().st_size < want:
        return f"{dense.name} is missing or truncated"
    for lay in st.expert_layers.values():
        if not lay.path.is_file() or lay.path.stat().st_size < lay.stride * lay.n_experts:
            return f"{lay.path.relative_to(st.path)} is missing or truncated"
    for f in st.manifest.get("tokenizer", {}).get("files", []):
        if not (st.path / f).is_file():
            return f"{f} is missing"
    return None


def list_models(root: Path | None = None) -> tuple[list[ModelInfo], list[dict]]:
    """(installed stores, partial pulls) in the models directory, by name.

    A directory that is not a readable store is skipped; partial pulls are dicts with "name",
    "source" and "done"/"total" bytes.
    """
    root = root or models_dir()
    models, partial = [], []
    if not root.is_dir():
        return models, partial
    for d in sorted(root.iterdir()):
        if d.name.startswith("."):
            if d.name.endswith(".pull") and d.is_dir():
                from .pull import describe_partial

                info = describe_partial(d)
                if info:
                    partial.append(info)
            continue
        if (d / "manifest.json").is_file():
            try:
                models.append(describe(d))
            except (ModelFormatError, KeyError, ValueError):
                continue
    return models, partial


def remove(name: str) -> Path:
    """Delete a model (a name in the models directory, or a store path) or a partial pull of that name.

    Raises:
        RkmojoError: nothing by that name, or a pull of it is running.
    """
    root = models_dir()
    staging = root / f".{name}.pull"
    p = Path(name)
    if (p / "manifest.json").is_file():  # the same precedence as `resolve_model`
        target = p
    elif (root / name / "manifest.json").is_file():
        target = root / name
    elif staging.is_dir():
        target = None
    else:
        raise RkmojoError(
            f"model {name!r} not found in {root} (nor as a store path); `rkmojo list` shows the installed ones"
        )
    if staging.is_dir():
        from .pull import PullLock

        with PullLock(staging, name):  # refuses while a pull of this name runs
            pass
        shutil.rmtree(staging)
    if target is None:
        return staging
    if target.is_symlink():
        target.unlink()  # a name linked to a store elsewhere: drop the name, not the store
    else:
        shutil.rmtree(target)
    return target
