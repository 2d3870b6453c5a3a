"""The compiled per-token steps: a generated token on the CPU through C calls that stand in for an
architecture's Python layers at one row, the layers staying the reference (and running prompts).

One module per family, each a `DecodeStep` built on its model (`step = DecodeStep(model)`, then
`step(h, cache, positions)` → h for one position) over one descriptor (descriptor.py), the layout its C
file exports: dense.py (Llama, rkdecode.c), moe.py (Qwen3-MoE, OLMoE; rkmoedecode.c), gemma4.py
(rkgemma4.c). A step knows its model; a model does not know its step: the loader
(`inference.model.load_model`) asks `for_model` and hands the class to the model (`step_class`), which
builds it at its first generated token.
"""

from __future__ import annotations

import importlib

from ..models import canonical

# architecture (models.ALIASES' names) → the module of its step
STEPS = {
    "llama": "dense",
    "qwen3_moe": "moe",
    "olmoe": "moe",
    "gemma4": "gemma4",
}


def for_model(model) -> type | None:
    """The step class of `model`'s architecture (its store's), or None when it has none."""
    name = STEPS.get(canonical(model.store.architecture))
    return None if name is None else importlib.import_module(f"{__name__}.{name}").DecodeStep
