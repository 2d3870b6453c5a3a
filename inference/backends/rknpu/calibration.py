"""The NPU calibration file: where `rkmojo npu calibrate` (`calibrate.py`) keeps its measurement and where
`backend="auto"`/`"rknpu"` read it (`inference.backends.select`).

The file (`calibration_path()`: the data directory's `npu-calibration.json`, beside `models/`) is
written to a temp name and renamed. Its whole contract:

    {"format": 1,
     "entries": {"<library sha256>|<driver version>|<precision>": {
         "library": path, "library_sha256": hex, "runtime": version, "driver": version,
         "precision": "fp16" | "int8", "chunk": M of the dense contexts, "repeats": n, "created": ISO time,
         "rows": [1, 8, ...],
         "shapes": [{"name", "kind": "dense" | "expert", "dims", "cpu_s": [per rows], "npu_s": [...]}],
         "min_rows": int | null, "expert_min_rows": int | null}}}

An entry holds for one library file (by content), one driver and one precision; another library or
driver makes it stale: ignored, with one log line. `min_rows`: dense matmuls of at least that many rows
run on the NPU; `expert_min_rows`: routed experts with at least that many rows of a chunk; null: never.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import RkmojoError
from ...models_dir import models_dir

log = logging.getLogger("inference.backends")
FORMAT = 1
FILE_NAME = "npu-calibration.json"
DENSE, EXPERT = "dense", "expert"


def calibration_path() -> Path:
    """The data directory's calibration file: $RKMOJO_HOME/npu-calibration.json (~/.local/share/rkmojo)."""
    return models_dir().parent / FILE_NAME


def library_sha256(library: str) -> str:
    h = hashlib.sha256()
    with open(os.path.realpath(library), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_key(sha256: str, driver: str, precision: str) -> str:
    return f"{sha256}|{driver}|{precision}"


@dataclass
class Timing:
    name: str
    kind: str
    dims: str
    cpu_s: list[float]  # per row count: median seconds
    npu_s: list[float]


@dataclass
class Calibration:
    library: str
    library_sha256: str
    runtime: str
    driver: str
    precision: str
    chunk: int
    repeats: int
    rows: list[int]
    shapes: list[Timing] = field(default_factory=list)
    min_rows: int | None = None
    expert_min_rows: int | None = None
    created: str = ""

    @property
    def key(self) -> str:
        return entry_key(self.library_sha256, self.driver, self.precision)

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        d = dict(d)
        d["shapes"] = [Timing(**t) for t in d.get("shapes", [])]
        return cls(**d)


def read_entries(path: Path) -> dict[str, dict]:
    """The file's entries ({} when there is none).

    Raises:
        RkmojoError: the file exists but is not a calibration file of this format (names it and the fix).
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise RkmojoError(
            f"{path}: not a readable NPU calibration ({e}); delete it and run `rkmojo npu calibrate`"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise RkmojoError(
            f"{path}: not an NPU calibration of format {FORMAT}; delete it and run `rkmojo npu calibrate`"
        )
    return data["entries"]


def write_entries(path: Path, entries: dict[str, dict]) -> None:
    """Write the file to a temp name beside it and rename: a failed write leaves the old file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def lookup(path: Path, library: str, driver: str, precision: str) -> Calibration | None:
    """This board's entry for (library file, driver, precision), or None. A file with entries for the
    precision but none for this library and driver is stale: one log line says so; an unreadable file
    is one log line too (the engine starts on the defaults either way)."""
    try:
        entries = read_entries(path)
    except RkmojoError as e:
        log.warning("backend: NPU calibration ignored: %s", e)
        return None
    if not entries:
        return None
    got = entries.get(entry_key(library_sha256(library), driver, precision))
    if got is not None:
        try:
            return Calibration.from_dict(got)
        except TypeError as e:
            log.warning(
                "backend: NPU calibration ignored: %s: a malformed entry (%s); re-run `rkmojo npu calibrate`", path, e
            )
            return None
    stale = [e for e in entries.values() if e.get("precision") == precision]
    if stale:
        log.warning(
            "backend: NPU calibration in %s ignored: it is for another librknnrt or driver (%s, driver %s), "
            "this is %s, driver %s; re-run `rkmojo npu calibrate`",
            path,
            stale[0].get("library_sha256", "?")[:12],
            stale[0].get("driver", "?"),
            library_sha256(library)[:12],
            driver,
        )
    return None
