"""Architectures by Hugging Face `model_type`, each a module with `Args`, `Model`, `HF_NAMES` and
`expected_shapes`; aliases map checkpoint model types onto the module that runs them."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import ConvertError

ALIASES = {
    "llama": "llama",
    "qwen3_moe": "qwen3_moe",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "olmoe": "olmoe",
}


def get(model_type: str) -> ModuleType:
    """The architecture module for `model_type`.

    Raises:
        ConvertError: naming the unsupported type and the supported ones.
    """
    name = ALIASES.get(model_type)
    if name is None:
        raise ConvertError(f"architecture {model_type!r} is not supported; supported: {', '.join(sorted(ALIASES))}")
    return importlib.import_module(f"{__name__}.{name}")


def canonical(model_type: str) -> str:
    return ALIASES.get(model_type, model_type)
