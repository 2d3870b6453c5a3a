"""Converters into the `.rkmojo` store: local Hugging Face checkpoints and GGUF files."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConvertError, DiskFullError, disk_full


def convert(src, out, quant: str = "q4", *, progress: bool = True, repack: bool = True) -> Path:
    """Convert `src` (a checkpoint directory or a .gguf file) into a store at `out`.

    GGUF tensors keep their own types; `quant` applies to safetensors checkpoints, whose q4 experts are
    stored repacked (q4r) unless `repack` is False.
    """
    src = Path(src)
    try:
        if src.is_dir():
            from .hf import convert_hf

            return convert_hf(src, Path(out), quant, progress=progress, repack=repack)
        if src.is_file():
            from .gguf import convert_gguf

            return convert_gguf(src, Path(out), progress=progress)
    except OSError as e:
        if disk_full(e):  # the store writer removed its work directory on the way out
            raise DiskFullError(
                f"{out}: the disk filled up while converting {src.name}; nothing was left behind; "
                f"free space in {Path(out).parent} or convert into another directory"
            ) from e
        raise
    raise ConvertError(f"{src}: no such file or directory; give a checkpoint directory or a .gguf file")
