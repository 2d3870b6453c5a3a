"""The compiled steps' descriptors (inference/steps/descriptor.py) against the layouts the C headers
declare (`rk_fields`, from the lists their enums come from)."""

from __future__ import annotations

import numpy as np
import pytest

from inference.convert import convert
from inference.model import load_model
from inference.steps import STEPS, descriptor
from parity import build_checkpoint
from test_parity import gemma4, llama, olmoe, qwen3_moe

ARCHS = {"llama": llama, "qwen3_moe": qwen3_moe, "olmoe": olmoe, "gemma4": gemma4}
KIND = {"dense": "decode", "moe": "moe", "gemma4": "gemma4"}  # step module → its descriptor's layout


def test_the_library_describes_every_steps_layout_with_typed_fields():
    t = descriptor.tables()
    assert set(t) == {"matrix"} | {f"{k}.{part}" for k in KIND.values() for part in ("header", "layer", "matrices")}
    for name, table in t.items():
        assert len(set(table.names)) == len(table.names), name
        assert set(table.types) <= ({""} if name.endswith(".matrices") else {"int", "f32", "ptr"}), name
    # the MoE step's layout extends the Llama step's (rkdescriptors.h: RK_MOE_HEADER after RK_DECODE_HEADER, ...)
    for part in ("header", "layer", "matrices"):
        dense, moe = t[f"decode.{part}"].names, t[f"moe.{part}"].names
        assert moe[: len(dense)] == dense


def test_the_activation_flags_land_on_the_c_fields():
    """The kernels set a step's activation flags by the library's field names, nowhere else."""
    from inference import kernels

    d = descriptor.Descriptor("moe", 1)
    d.array[:] = -1
    kernels._LIB.moe_decode_flags(d.array)
    t = descriptor.tables()["moe.header"]
    changed = {t.names[j] for j in range(len(t.names)) if d.array[j] != -1}
    assert changed == {"q8a", "router_q8a"}


def test_a_field_takes_only_its_type_and_names_the_fields_it_knows():
    d = descriptor.Descriptor("decode", 2)
    d["eps"] = 1e-6
    assert d["eps"] == int(np.float32(1e-6).view(np.int32))
    d.set_layer(1, kpos=np.zeros(4, np.int64))
    assert d.array[d.layer_at(1, "kpos")] != 0
    with pytest.raises(TypeError, match="'h' takes an array"):
        d["h"] = 12345
    with pytest.raises(TypeError, match="'layers' takes an integer"):
        d["layers"] = 2.0
    with pytest.raises(KeyError, match="field 'router': not one of"):
        d["router"] = 1


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model(request, tmp_path_factory):
    model_cls, cfg = ARCHS[request.param]()
    tmp = tmp_path_factory.mktemp(request.param)
    return load_model(convert(build_checkpoint(model_cls, cfg, tmp / "hf"), tmp / "q4", "q4", progress=False))


def test_each_architectures_step_uses_the_c_layout_and_points_at_every_weight(model):
    step = model.decode_step()
    assert step is not None and type(step).__module__ == f"inference.steps.{STEPS[model.store.architecture]}"
    d, t = step.desc, descriptor.tables()
    kind = KIND[STEPS[model.store.architecture]]
    assert (d.header.names, d.layer.names, d.matrices.names) == tuple(
        t[f"{kind}.{part}"].names for part in ("header", "layer", "matrices")
    )
    assert len(d.array) == d.h0 + model.args.num_hidden_layers * d.nl
    # after one generated token, the header's addresses all point somewhere (the step owns or set each)
    cache = model.new_cache()
    model.forward(np.array([1]), cache)
    assert all(d.array[j] for j, ty in enumerate(d.header.types) if ty == "ptr")
