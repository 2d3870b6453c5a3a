"""Writes a `.rkmojo` store: into a temporary directory beside the target, renamed at the end.

A store either verifies or does not exist: `StoreWriter` is a context manager whose exit without
`finish()` (or with an exception) removes the temporary directory and leaves the target untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConvertError
from ..quant import REPACKED_Q4, QTensor, part_layout
from .format import (
    ALIGN,
    EXPERT_STRIDE_ALIGN,
    FORMAT_NAME,
    FORMAT_VERSION,
    digest_bytes,
    round_up,
)


class StoreWriter:
    """Builds one store. Dense tensors are appended as they come; experts are written in place.

    Args:
        out: the store directory to create; must not exist.
        architecture: the model_type the engine dispatches on (`gemma4`, `qwen3_moe`, `llama`, …).
        config: the model's full (text) config, stored as given.
        repack_experts: store the q4 expert matrices whose rows fill whole panels in the kernels' repacked
            layout (kind q4r, `inference.quant.repack_q4`; same parts, shapes and offsets), so a streamed
            expert lands ready to compute and a resident engine maps it as it is (what `rkmojo repack`
            does to an older store). False: plain q4, as the checkpoint's rows come.
    """

    def __init__(
        self,
        out: str | os.PathLike,
        architecture: str,
        config: dict,
        *,
        workdir: str | os.PathLike | None = None,
        resume: "ResumePoint | None" = None,
        repack_experts: bool = True,
    ):
        self.out = Path(out)
        self.repack_experts = repack_experts
        if self.out.exists():
            raise ConvertError(f"{self.out}: output path exists; remove it or choose another path")
        if not self.out.parent.is_dir():
            raise ConvertError(f"{self.out.parent}: output directory does not exist; create it first")
        # workdir: a caller-owned directory that survives abort() (resumable installs); else a
        # temporary directory beside the target, removed on abort()
        self.keep_on_abort = workdir is not None
        self.tmp = Path(workdir) if workdir else self.out.parent / f".{self.out.name}.tmp-{uuid.uuid4().hex[:8]}"
        if resume is None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        (self.tmp / "experts").mkdir(exist_ok=True)
        self.manifest: dict = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "architecture": architecture,
            "config": config,
            "quantization": {},
            "tokenizer": {"files": []},
            "generation": {},
            "dense": {"file": "dense.bin", "tensors": {}},
            "experts": {"layers": {}},
        }
        self._resumed_experts: set[tuple[int, int, str]] = set()
        if resume is None:
            self._dense = open(self.tmp / "dense.bin", "wb")
        else:
            # adopt what an interrupted run committed: dense.bin up to its last committed tensor
            self._dense = open(self.tmp / "dense.bin", "r+b")
            self._dense.truncate(resume.dense_size)
            self._dense.seek(resume.dense_size)
            self.manifest["dense"]["tensors"].update(resume.dense)
            self._resumed_experts = set(resume.experts)
        self._expert_fds: dict[int, int] = {}
        self._expert_written: dict[int, set] = {}
        self._finished = False

    # --- context manager: abort on error -------------------------------------------------------
    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._finished:
            self.abort()

    def abort(self) -> None:
        """Stop; the target path stays absent. The work directory is removed unless it is the
        caller's (`workdir=`), which keeps it for a resumed run."""
        self.close()
        if not self.keep_on_abort:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def close(self) -> None:
        """Close the open files, deleting nothing."""
        if not self._dense.closed:
            self._dense.close()
        for fd in self._expert_fds.values():
            os.close(fd)
        self._expert_fds.clear()

    def sync(self) -> int:
        """fsync everything written so far; returns the committed size of dense.bin (a resume point)."""
        self._dense.flush()
        os.fsync(self._dense.fileno())
        for fd in self._expert_fds.values():
            os.fsync(fd)
        return self._dense.tell()

    # --- metadata --------------------------------------------------------------------------
    def set_quantization(self, classes: dict[str, str]) -> None:
        """Record the kind chosen for each tensor class (e.g. {"default": "q4", "router": "q8"})."""
        self.manifest["quantization"] = dict(classes)

    def set_generation(self, defaults: dict) -> None:
        self.manifest["generation"] = dict(defaults)

    def set_source(self, source: dict) -> None:
        self.manifest["source"] = dict(source)

    def add_tokenizer_file(self, name: str, data: bytes) -> None:
        """Copy a tokenizer file (tokenizer.json, tokenizer_config.json, chat_template.jinja, …)."""
        self._write_atomic(self.tmp / name, data)
        if name not in self.manifest["tokenizer"]["files"]:
            self.manifest["tokenizer"]["files"].append(name)

    def set_tokenizer_info(self, **info) -> None:
        self.manifest["tokenizer"].update(info)

    # --- dense tensors ---------------------------------------------------------------------
    def add_dense(self, name: str, t: QTensor) -> None:
        """Append one resident tensor to dense.bin with its index entry and digest."""
        if name in self.manifest["dense"]["tensors"]:
            raise ConvertError(f"tensor {name} written twice; the source checkpoint maps two tensors to it")
        layout = part_layout(t.kind, t.shape)
        entry = {"kind": t.kind, "shape": list(t.shape), "parts": {}}
        h = digest_bytes()
        for pname, (dtype, pshape) in layout.items():
            arr = np.ascontiguousarray(t.parts[pname])
            if str(arr.dtype) != dtype or tuple(arr.shape) != pshape:
                raise ConvertError(
                    f"tensor {name}: part {pname} is {arr.dtype}{list(arr.shape)}, expected {dtype}{list(pshape)}"
                )
            pos = self._dense.tell()
            pad = round_up(pos, ALIGN) - pos
            if pad:
                self._dense.write(b"\0" * pad)
            entry["parts"][pname] = {"dtype": dtype, "shape": list(pshape), "offset": pos + pad}
            data = memoryview(arr).cast("B")
            self._dense.write(data)
            h.update(data)
        entry["digest"] = h.hexdigest()
        self.manifest["dense"]["tensors"][name] = entry

    # --- experts ---------------------------------------------------------------------------
    def begin_expert_layer(self, layer: int, n_experts: int, tensors: dict[str, tuple[str, tuple[int, int]]]) -> None:
        """Declare layer `layer`'s expert file: `tensors` maps sub-tensor name → (kind, shape).

        Every expert of the layer has the same sub-tensors; their parts are laid out back to back
        (each aligned to 64 bytes) inside one blob, and blobs sit at `e × stride`.
        """
        from ..kernels.repack import repackable_kind

        layout, pos = {}, 0
        for tname, (kind, shape) in tensors.items():
            parts = {}
            for pname, (dtype, pshape) in part_layout(kind, shape).items():
                pos = round_up(pos, ALIGN)
                nbytes = int(np.prod(pshape)) * np.dtype(dtype).itemsize
                parts[pname] = {"dtype": dtype, "shape": list(pshape), "offset": pos}
                pos += nbytes
            if self.repack_experts and repackable_kind(kind, shape):
                kind = REPACKED_Q4  # the same parts: rows that fill whole panels need no padding
            layout[tname] = {"kind": kind, "shape": list(shape), "parts": parts}
        blob = pos
        stride = round_up(blob, EXPERT_STRIDE_ALIGN)
        fname = f"experts/layer_{layer:02d}.bin"
        resumed = {(e, t) for (l, e, t) in self._resumed_experts if l == layer}
        # a resumed layer keeps the blobs already written; a fresh one starts empty
        fd = os.open(self.tmp / fname, os.O_RDWR | os.O_CREAT | (0 if resumed else os.O_TRUNC), 0o644)
        os.ftruncate(fd, stride * n_experts)
        self._expert_fds[layer] = fd
        self._expert_written[layer] = resumed
        self.manifest["experts"]["layers"][str(layer)] = {
            "file": fname,
            "n_experts": n_experts,
            "blob_size": blob,
            "stride": stride,
            "tensors": layout,
            "digests": [None] * n_experts,
        }

    def add_expert_tensor(self, layer: int, expert: int, tname: str, t: QTensor) -> None:
        """Write one sub-tensor of one expert into its place in the layer file."""
        entry = self.manifest["experts"]["layers"].get(str(layer))
        if entry is None:
            raise ConvertError(f"layer {layer}: expert tensor before begin_expert_layer (internal error)")
        spec = entry["tensors"].get(tname)
        if spec is not None and spec["kind"] == REPACKED_Q4 and t.kind == "q4":
            from ..kernels import repack_q4

            t = repack_q4(t)
        if spec is None or spec["kind"] != t.kind or list(t.shape) != spec["shape"]:
            raise ConvertError(
                f"layer {layer} expert {expert} {tname}: got {t.kind}{list(t.shape)}, "
                f"expected {spec and spec['kind']}{spec and spec['shape']}; the checkpoint disagrees with its config"
            )
        if not 0 <= expert < entry["n_experts"]:
            raise ConvertError(f"layer {layer}: expert index {expert} out of range 0..{entry['n_experts'] - 1}")
        base = expert * entry["stride"]
        for pname, p in spec["parts"].items():
            arr = np.ascontiguousarray(t.parts[pname])
            if str(arr.dtype) != p["dtype"] or list(arr.shape) != p["shape"]:
                raise ConvertError(
                    f"layer {layer} expert {expert} {tname}.{pname}: wrong dtype/shape {arr.dtype}{list(arr.shape)}"
                )
            _pwrite_all(self._expert_fds[layer], memoryview(arr).cast("B"), base + p["offset"])
        self._expert_written[layer].add((expert, tname))

    # --- finish ----------------------------------------------------------------------------
    def finish(self) -> Path:
        """Digest the expert blobs, write the manifest, fsync, and rename into place.

        Raises:
            ConvertError: an expert sub-tensor was never written (the checkpoint misses it).
        """
        self._dense.flush()
        os.fsync(self._dense.fileno())
        self.manifest["dense"]["size"] = self._dense.tell()
        self._dense.close()
        for layer, fd in sorted(self._expert_fds.items()):
            entry = self.manifest["experts"]["layers"][str(layer)]
            need = {(e, t) for e in range(entry["n_experts"]) for t in entry["tensors"]}
            missing = sorted(need - self._expert_written[layer])
            if missing:
                e, t = missing[0]
                raise ConvertError(
                    f"layer {layer}: expert {e} tensor {t} missing from the checkpoint ({len(missing)} missing); "
                    "check that every shard is present"
                )
            os.fsync(fd)
            for e in range(entry["n_experts"]):
                data = os.pread(fd, entry["blob_size"], e * entry["stride"])
                entry["digests"][e] = digest_bytes(data).hexdigest()
            os.close(fd)
        self._expert_fds.clear()
        self._write_atomic(self.tmp / "manifest.json", json.dumps(self.manifest, indent=1).encode())
        _fsync_dir(self.tmp / "experts")
        _fsync_dir(self.tmp)
        if self.out.exists():
            raise ConvertError(f"{self.out}: output path appeared during the conversion; nothing was replaced")
        os.rename(self.tmp, self.out)
        _fsync_dir(self.out.parent)
        self._finished = True
        return self.out

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        write_atomic(path, data)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp name and a rename: readers see the old file or the new."""
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


@dataclass
class ResumePoint:
    """What an interrupted write had committed: dense.bin's size and index entries, and the
    (layer, expert, sub-tensor) triples already in the expert files."""

    dense_size: int
    dense: dict = field(default_factory=dict)
    experts: list = field(default_factory=list)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
