"""Pulling a Hugging Face-style repository: remote shards feeding the converter, and a resumable store writer."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..convert.hf import DTYPES, TOKENIZER_FILES, convert_hf
from ..convert.progress import progress_bar
from ..errors import ConvertError, ModelFormatError
from ..store import StoreWriter
from ..store.writer import ResumePoint
from ..store.format import digest_bytes
from .http import PullError, Remote
from .policy import PullPolicy
from .staging import Journal, Spool, staged

DEFAULT_ENDPOINT = "https://huggingface.co"
SMALL_FILES = ("config.json",) + TOKENIZER_FILES


@dataclass
class PullState:
    """What the remote shards and the resumable writer share: the journal, what is done, the tensor in flight."""

    staging: Path
    journal: Journal
    source: dict
    bar: object = None
    writer: "ResumableWriter | None" = None
    current: tuple | None = None  # (file, tensor) being read and written

    def __post_init__(self):
        self.done = {(r["file"], r["tensor"]): r for r in self.journal.records if r.get("t") == "tensor"}
        self.pending_dense: dict = {}
        self.pending_experts: list = []

    def begin(self, file: str, tensor: str) -> None:
        """A new source tensor is about to be read: commit the previous one."""
        self.commit()
        self.current = (file, tensor)

    def commit(self) -> None:
        """Make the tensor in flight durable and journal it; its spool is no longer needed."""
        if self.current is None:
            return
        w = self.writer
        dense_size = w.sync()
        file, tensor = self.current
        rec = {
            "t": "tensor",
            "file": file,
            "tensor": tensor,
            "dense_size": dense_size,
            "dense": self.pending_dense,
            "experts": self.pending_experts,
        }
        self.journal.append(rec)
        self.done[self.current] = rec
        self.pending_dense, self.pending_experts = {}, []
        self.current = None
        (self.staging / "spool.bin").unlink(missing_ok=True)


class RemoteShard:
    """A safetensors file read over HTTP: `Shard`'s interface (`tensors`, `get`, `is_bf16`, `path`)."""

    def __init__(self, remote: Remote, file: str):
        self.remote, self.file = remote, file
        self.state: PullState | None = None  # set before the conversion starts
        self.path = Path(file)
        head = bytearray()
        remote.read_range(file, 0, 8, head.extend)
        (n,) = struct.unpack("<Q", bytes(head))
        if n > 100 * 2**20:
            raise ModelFormatError(
                f"{remote.label}: {file}: header length {n} is not plausible; not a safetensors file"
            )
        raw = bytearray()
        remote.read_range(file, 8, 8 + n, raw.extend)
        try:
            header = json.loads(bytes(raw))
        except ValueError as e:
            raise ModelFormatError(f"{remote.label}: {file}: unreadable safetensors header ({e})") from None
        self.header_digest = digest_bytes(bytes(head) + bytes(raw)).hexdigest()
        header.pop("__metadata__", None)
        self.base = 8 + n
        self.tensors = header

    def nbytes(self) -> int:
        return sum(t["data_offsets"][1] - t["data_offsets"][0] for t in self.tensors.values())

    def resumed(self, name: str) -> bool:
        return (self.file, name) in self.state.done

    def is_bf16(self, name: str) -> bool:
        return self.tensors[name]["dtype"] == "BF16"

    def get(self, name: str) -> np.ndarray:
        """The tensor, downloaded into the spool and memory-mapped from there (bf16 as its uint16 bits)."""
        t = self.tensors[name]
        dt = DTYPES.get(t["dtype"])
        if dt is None:
            raise ConvertError(
                f"{self.file}: tensor {name} has dtype {t['dtype']}; only F32/F16/BF16 checkpoints convert"
            )
        st = self.state
        st.begin(self.file, name)
        a, b = t["data_offsets"]
        key = {"file": self.file, "tensor": name}
        spool = Spool(st.staging / "spool.bin", st.journal, key, b - a, st.bar)
        spool.fill(self.remote, self.file, self.base + a)
        if b == a:
            return np.zeros(t["shape"], dt)
        return np.memmap(spool.path, dtype=dt, mode="r", shape=tuple(t["shape"]))


class ResumableWriter(StoreWriter):
    """A `StoreWriter` working in the staging area's `store/`, kept on errors and adopted by the
    next run up to the last tensor the journal committed."""

    def __init__(self, out, architecture: str, config: dict, *, state: PullState, repack_experts: bool = True):
        partial = state.staging / "store"
        resume = None
        if state.done and partial.is_dir():
            records = [r for r in state.journal.records if r.get("t") == "tensor"]
            resume = ResumePoint(
                records[-1]["dense_size"],
                {k: v for r in records for k, v in r["dense"].items()},
                [tuple(x) for r in records for x in r["experts"]],
            )
        super().__init__(out, architecture, config, workdir=partial, resume=resume, repack_experts=repack_experts)
        self.state = state
        state.writer = self

    def add_dense(self, name: str, t) -> None:
        super().add_dense(name, t)
        self.state.pending_dense[name] = self.manifest["dense"]["tensors"][name]

    def add_expert_tensor(self, layer: int, expert: int, tname: str, t) -> None:
        super().add_expert_tensor(layer, expert, tname, t)
        self.state.pending_experts.append([layer, expert, tname])

    def set_source(self, source: dict) -> None:
        super().set_source({**self.state.source, "model_type": source.get("model_type")})

    def finish(self) -> Path:
        self.state.commit()
        return super().finish()


def pull_repo(
    repo: str,
    out: Path,
    *,
    revision: str = "main",
    endpoint: str | None = None,
    quant: str = "q4",
    token: str | None = None,
    progress: bool = True,
    retries: int = 6,
    cancel=None,
    policy: PullPolicy | None = None,
    on_retry=None,
) -> Path:
    """Install `repo` (a Hugging Face repository id) at `out`, converting as it downloads.

    Raises:
        PullError / ConvertError / ModelFormatError: one line naming the file and the fix.
    """
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    remote = Remote(
        f"{endpoint}/{repo}/resolve/{urllib.parse.quote(revision, safe='')}",
        f"{repo}@{revision}",
        token=token,
        retries=retries,
        cancel=cancel,
        policy=policy,
        on_retry=on_retry,
    )
    source = {"type": "hf", "endpoint": endpoint, "repo": repo, "revision": revision}
    staging = staging_dir(out)
    with staged(staging, out.name) as journal:
        src = staging / "src"
        src.mkdir(exist_ok=True)
        for f in SMALL_FILES:
            data = remote.get(f, optional=f != "config.json")
            if data is not None:
                (src / f).write_bytes(data)
            elif (src / f).exists():
                (src / f).unlink()
        shards = [RemoteShard(remote, f) for f in _shard_files(remote)]
        total = sum(s.nbytes() for s in shards)
        start = {
            "t": "start",
            **source,
            "quant": quant,
            "experts": "q4r",  # an interrupted pull by a release that wrote plain q4 experts starts over
            "name": out.name,
            "size": total,
            "headers": {s.file: s.header_digest for s in shards},
        }
        first = journal.records[0] if journal.records else None
        if first != start or not _partial_intact(staging, journal):
            if first is not None:
                print(
                    f"rkmojo pull: the interrupted pull of {out.name} does not match {repo}@{revision} "
                    "as it is now, or its files are damaged; starting over",
                    file=sys.stderr,
                )
            journal.reset(start)
            shutil.rmtree(staging / "store", ignore_errors=True)
            (staging / "spool.bin").unlink(missing_ok=True)
        state = PullState(staging, journal, source)
        for s in shards:
            s.state = state
        done = sum(
            shard.tensors[t]["data_offsets"][1] - shard.tensors[t]["data_offsets"][0]
            for shard in shards
            for t in shard.tensors
            if (shard.file, t) in state.done
        )
        with progress_bar(total, f"pull {repo}", progress) as bar:
            bar.update(done)
            state.bar = bar
            result = convert_hf(
                src,
                out,
                quant,
                progress=False,
                shards=shards,
                writer=lambda o, a, c, **kw: ResumableWriter(o, a, c, state=state, **kw),
            )
            bar.update(max(0, total - bar.n))
    return result


def _partial_intact(staging: Path, journal: Journal) -> bool:
    """The committed part of an interrupted pull's store is there: dense.bin long enough, every dense
    tensor matching the digest it was written with."""
    records = [r for r in journal.records if r.get("t") == "tensor"]
    if not records:
        return True
    dense = staging / "store" / "dense.bin"
    if not dense.is_file() or dense.stat().st_size < records[-1]["dense_size"]:
        return False
    with open(dense, "rb") as f:
        for r in records:
            for entry in r["dense"].values():
                h = digest_bytes()
                for part in entry["parts"].values():
                    f.seek(part["offset"])
                    h.update(f.read(math.prod(part["shape"]) * np.dtype(part["dtype"]).itemsize))
                if h.hexdigest() != entry["digest"]:
                    return False
    return True


def _shard_files(remote: Remote) -> list[str]:
    index = remote.get("model.safetensors.index.json", optional=True)
    if index is None:
        remote.size("model.safetensors")  # a clear 404 naming the file, and a Range check
        return ["model.safetensors"]
    try:
        return sorted(set(json.loads(index)["weight_map"].values()))
    except (ValueError, KeyError, TypeError) as e:
        raise ModelFormatError(f"{remote.label}: model.safetensors.index.json is unreadable ({e})") from None


def staging_dir(out: Path) -> Path:
    if out.exists():
        raise PullError(f"{out}: already installed; `rkmojo rm {out.name}` first to pull it again")
    if not out.parent.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
    return out.parent / f".{out.name}.pull"
