"""`rkmojo repack STORE`: a store's q4 experts rewritten in the kernels' repacked layout (q4r), so an
expert read from disk is ready to compute as it lands: no repack on the engine's cores (~0.66 ms per Gemma
4 expert, 2.5 s of CPU in a 128-token prompt), and an all-resident engine maps them as they are instead of
copying every expert at load.

q4r is the layout `inference.quant.repack_q4` defines (16 rows side by side), the same on every CPU, so
a store repacked on a PC runs on the board. A matrix is rewritten where its rows fill whole panels, in
the bytes it held (its parts keep their shapes and offsets); the others stay q4 and are repacked as they
land, as before. Every product keeps its bits: the kernels read a q4r matrix the same way wherever it was
repacked, and float calls unpack it into the store layout.

Layer by layer, each step whole or not at all: the layer's experts go to a new file, its digests are
computed from what was written, the manifest naming the new file replaces the old one (temp name,
rename), then the old file is deleted. An interrupted run leaves a store whose manifest matches its files
(some layers repacked, some not), and running it again finishes the job. The extra disk space is one
layer file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError
from ..quant import REPACKED_Q4
from .format import digest_bytes
from .reader import Store


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(json.dumps(obj, indent=1).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def repack_store(path: str | os.PathLike, progress=None) -> dict:
    """Rewrite the store's repackable q4 experts as q4r, layer by layer (see the module docstring).

    Args:
        path: the store directory.
        progress: optional callable(nbytes) called as experts are written.
    Returns:
        {"layers": layers rewritten now, "already": layers that were repacked before, "experts", "bytes",
        "seconds"}.
    Raises:
        ModelFormatError: a blob does not match its digest (the store is damaged: nothing of that layer
        is written).
    """
    from ..kernels import repack_q4
    from ..kernels.repack import repackable_kind

    st = Store(path)
    root = st.path
    t0 = time.perf_counter()
    done = already = experts = nbytes = 0
    for layer, lay in sorted(st.expert_layers.items()):
        entry = st.manifest["experts"]["layers"][str(layer)]
        todo = [name for name, spec in entry["tensors"].items() if repackable_kind(spec["kind"], spec["shape"])]
        if not todo:
            already += any(spec["kind"] == REPACKED_Q4 for spec in entry["tensors"].values())
            continue
        old = root / entry["file"]
        new_rel = str(Path(entry["file"]).with_suffix("")) + ".q4r.bin"
        new = root / new_rel
        part = new.with_name(new.name + ".part")
        spec_r = {
            name: {**spec, "kind": REPACKED_Q4} if name in todo else spec for name, spec in entry["tensors"].items()
        }
        digests = []
        buf = np.empty(lay.blob_size, np.uint8)
        blob = buf[: lay.blob_size]
        with open(old, "rb", buffering=0) as src, open(part, "wb") as dst:
            os.ftruncate(dst.fileno(), lay.stride * lay.n_experts)
            for e in range(lay.n_experts):
                n = os.preadv(src.fileno(), [memoryview(blob)], e * lay.stride)
                if n < lay.blob_size or digest_bytes(memoryview(blob)).hexdigest() != lay.digests[e]:
                    part.unlink(missing_ok=True)
                    raise ModelFormatError(
                        f"{old.relative_to(root)}: expert {e} digest mismatch; re-run `rkmojo pull` or "
                        "`rkmojo convert` (nothing of this layer was rewritten)"
                    )
                w = lay.view(blob)
                for name in todo:
                    repack_q4(w[name], in_place=True)
                digests.append(digest_bytes(memoryview(blob)).hexdigest())
                os.pwrite(dst.fileno(), memoryview(blob), e * lay.stride)
                if progress:
                    progress(lay.blob_size)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(part, new)
        entry.update(file=new_rel, tensors=spec_r, digests=digests)
        _write_json_atomic(root / "manifest.json", st.manifest)
        if old != new:
            old.unlink(missing_ok=True)
        done += 1
        experts += lay.n_experts
        nbytes += lay.n_experts * lay.blob_size
    return {
        "layers": done,
        "already": already,
        "experts": experts,
        "bytes": nbytes,
        "seconds": time.perf_counter() - t0,
    }
