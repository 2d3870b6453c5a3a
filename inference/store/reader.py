"""Reads a `.rkmojo` store: the manifest, dense tensors (memory-mapped), expert blobs, digests."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import ModelFormatError
from ..quant import QTensor
from .format import FORMAT_NAME, FORMAT_VERSION, digest_bytes, sha256_file


@dataclass(frozen=True)
class ExpertLayout:
    """Where one MoE layer's experts live: file, stride, blob size and sub-tensor layout."""

    layer: int
    path: Path
    n_experts: int
    stride: int
    blob_size: int
    tensors: dict  # name → {"kind", "shape", "parts": {part: {"dtype", "shape", "offset"}}}
    digests: list[str]

    @functools.cached_property
    def _plan(self) -> tuple:
        """(name, kind, shape, ((part, dtype, start, end, shape), ...)) per sub-tensor, parsed once."""
        plan = []
        for name, spec in self.tensors.items():
            parts = []
            for pname, p in spec["parts"].items():
                dt = np.dtype(p["dtype"])
                start = int(p["offset"])
                parts.append((pname, dt, start, start + int(np.prod(p["shape"])) * dt.itemsize, tuple(p["shape"])))
            plan.append((name, spec["kind"], tuple(spec["shape"]), tuple(parts)))
        return tuple(plan)

    def view(self, blob: np.ndarray) -> dict[str, QTensor]:
        """Sub-tensors of one expert as views into `blob` (uint8, at least blob_size bytes)."""
        blob = np.asarray(blob)  # plain ndarray views: a memmap subclass costs µs per slice
        return {
            name: QTensor(kind, shape, {pname: blob[a:b].view(dt).reshape(shp) for pname, dt, a, b, shp in parts})
            for name, kind, shape, parts in self._plan
        }


class Store:
    """An opened store. Cheap to open: dense.bin and expert files are memory-mapped lazily.

    Raises:
        ModelFormatError: the directory is not a store, or its manifest is unreadable or of a newer format.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise ModelFormatError(
                f"{self.path}: not an rkmojo store (no manifest.json); convert a model with `rkmojo convert`"
            )
        try:
            self.manifest = json.loads(mpath.read_text())
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{mpath}: unreadable manifest ({e}); re-run `rkmojo convert`") from None
        if self.manifest.get("format") != FORMAT_NAME:
            raise ModelFormatError(f"{mpath}: not an rkmojo manifest")
        if self.manifest.get("version", 0) > FORMAT_VERSION:
            raise ModelFormatError(
                f"{mpath}: store format version {self.manifest['version']} is newer than this rkmojo "
                f"({FORMAT_VERSION}); upgrade rkmojo"
            )
        self.architecture: str = self.manifest["architecture"]
        self.config: dict = self.manifest["config"]
        self._dense_map: np.ndarray | None = None
        self._expert_maps: dict[int, np.ndarray] = {}
        self.expert_layers: dict[int, ExpertLayout] = {
            int(k): ExpertLayout(
                layer=int(k),
                path=self.path / v["file"],
                n_experts=v["n_experts"],
                stride=v["stride"],
                blob_size=v["blob_size"],
                tensors=v["tensors"],
                digests=v["digests"],
            )
            for k, v in self.manifest["experts"]["layers"].items()
        }

    @property
    def digest(self) -> str:
        """One digest for the whole store (over the manifest, which holds every tensor digest)."""
        return digest_bytes((self.path / "manifest.json").read_bytes()).hexdigest()

    # --- dense -----------------------------------------------------------------------------
    def _dense(self) -> np.ndarray:
        if self._dense_map is None:
            path = self.path / self.manifest["dense"]["file"]
            size = path.stat().st_size if path.exists() else -1
            want = self.manifest["dense"].get("size", size)
            if size < want:
                raise ModelFormatError(f"{path}: truncated ({size} of {want} bytes); re-run `rkmojo convert`")
            self._dense_map = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else np.zeros(0, np.uint8)
        return self._dense_map

    def load_dense(self) -> int:
        """Read dense.bin into anonymous memory (resident for good, not page cache that a memory
        limit could evict and re-read). Call before building a model. Returns the bytes loaded."""
        path = self.path / self.manifest["dense"]["file"]
        size = path.stat().st_size
        want = self.manifest["dense"].get("size", size)
        if size < want:
            raise ModelFormatError(f"{path}: truncated ({size} of {want} bytes); re-run `rkmojo convert`")
        buf = np.empty(size, np.uint8)
        with open(path, "rb", buffering=0) as f:
            view, got = memoryview(buf), 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    raise ModelFormatError(f"{path}: shorter than expected; re-run `rkmojo convert`")
                got += n
        self._dense_map = buf
        return size

    def dense_names(self) -> list[str]:
        return list(self.manifest["dense"]["tensors"])

    def has(self, name: str) -> bool:
        return name in self.manifest["dense"]["tensors"]

    def dense(self, name: str) -> QTensor:
        """One resident tensor as views into the mapped dense.bin.

        Raises:
            ModelFormatError: the store has no tensor `name`.
        """
        spec = self.manifest["dense"]["tensors"].get(name)
        if spec is None:
            raise ModelFormatError(f"{self.path}: tensor {name} missing from the store; re-run `rkmojo convert`")
        m = self._dense()
        parts = {}
        for pname, p in spec["parts"].items():
            dt = np.dtype(p["dtype"])
            n = int(np.prod(p["shape"]))
            parts[pname] = m[p["offset"] : p["offset"] + n * dt.itemsize].view(dt).reshape(p["shape"])
        return QTensor(spec["kind"], tuple(spec["shape"]), parts)

    # --- experts ---------------------------------------------------------------------------
    def expert_map(self, layer: int) -> np.ndarray:
        """The whole layer file, memory-mapped (the all-resident path; streaming reads blobs instead)."""
        if layer not in self._expert_maps:
            lay = self.expert_layers[layer]
            want = lay.stride * lay.n_experts
            size = lay.path.stat().st_size if lay.path.exists() else -1
            if size < want:
                raise ModelFormatError(f"{lay.path}: truncated ({size} of {want} bytes); re-run `rkmojo convert`")
            self._expert_maps[layer] = np.memmap(lay.path, dtype=np.uint8, mode="r")
        return self._expert_maps[layer]

    def drop_expert_map(self, layer: int) -> None:
        """Unmap the layer file (its views must be gone: e.g. every expert copied out); a later
        `expert_map` maps it again."""
        self._expert_maps.pop(layer, None)

    def expert(self, layer: int, e: int) -> dict[str, QTensor]:
        lay = self.expert_layers[layer]
        m = self.expert_map(layer)
        return lay.view(m[e * lay.stride : e * lay.stride + lay.blob_size])

    # --- verification ----------------------------------------------------------------------
    def verify(self, progress=None, group=None) -> None:
        """Check every dense tensor and expert blob against its digest.

        Args:
            progress: optional callable(nbytes) called as data is checked.
            group: optional callable(what) called as each group starts: "dense tensors", then each
                expert file ("experts/layer_07.bin"), then "NPU graphs".
        Raises:
            ModelFormatError: naming the first tensor or layer/expert that does not match.
        """
        m = self._dense()
        if group:
            group("dense tensors")
        for name, spec in self.manifest["dense"]["tensors"].items():
            h = digest_bytes()
            for p in spec["parts"].values():
                n = int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize
                h.update(memoryview(m[p["offset"] : p["offset"] + n]))
                if progress:
                    progress(n)
            if h.hexdigest() != spec["digest"]:
                raise ModelFormatError(
                    f"{self.path}: dense tensor {name} digest mismatch; re-run `rkmojo pull` or `rkmojo convert`"
                )
        for layer, lay in sorted(self.expert_layers.items()):
            fm = self.expert_map(layer)
            if group:
                group(str(lay.path.relative_to(self.path)))
            for e in range(lay.n_experts):
                blob = fm[e * lay.stride : e * lay.stride + lay.blob_size]
                if digest_bytes(memoryview(blob)).hexdigest() != lay.digests[e]:
                    raise ModelFormatError(
                        f"{lay.path.relative_to(self.path)}: expert {e} digest mismatch; "
                        "re-run `rkmojo pull` or `rkmojo convert`"
                    )
                if progress:
                    progress(lay.blob_size)
        if group and any(True for _ in self.npu_files()):
            group("NPU graphs")
        self.verify_npu(progress)

    def npu_files(self) -> Iterator[tuple[Path, str]]:
        """(path, sha256) of every NPU graph file (`rkmojo npu build`), all targets."""
        for target, section in sorted(self.manifest.get("npu", {}).items()):
            for g in section["graphs"].values():
                for name, digest in g["digests"].items():
                    yield self.path / "npu" / target / name, digest

    def verify_npu(self, progress=None) -> None:
        """Check the NPU graph files against their sha256.

        Raises:
            ModelFormatError: naming the first graph file that is missing or changed.
        """
        for path, digest in self.npu_files():
            rel = path.relative_to(self.path)
            if not path.is_file():
                raise ModelFormatError(f"{rel}: missing; re-run `rkmojo npu build`")
            if sha256_file(path) != digest:
                raise ModelFormatError(f"{rel}: digest mismatch; re-run `rkmojo npu build`")
            if progress:
                progress(path.stat().st_size)

    def total_bytes(self) -> int:
        n = self.manifest["dense"].get("size", 0)
        n += sum(l.stride * l.n_experts for l in self.expert_layers.values())
        return n + sum(p.stat().st_size for p, _ in self.npu_files() if p.is_file())

    def iter_tokenizer_files(self) -> Iterator[Path]:
        for f in self.manifest["tokenizer"]["files"]:
            yield self.path / f
