"""`rkmojo synth`: real shapes, valid random values, stores the engine opens and runs."""

import numpy as np
import pytest

from inference import models
from inference.bench.cachesim import TraceRecorder, popularity
from inference.bench.measure import Workload, run_workload
from inference.cli import main
from inference.engine import Engine
from inference.errors import RkmojoError
from inference.store import Store
from inference.synth import SHAPES, _kind, _nbytes, dense_shapes, shape_config, synth_store


@pytest.mark.parametrize("shape", ["tiny-gemma4", "tiny-qwen3-moe"])
@pytest.mark.parametrize("router", ["uniform", "skewed"])
def test_a_synthetic_store_verifies_and_the_engine_runs_it_with_finite_logits(tmp_path, shape, router):
    path = synth_store(tmp_path / "s", shape, router=router, progress=False)
    st = Store(path)
    st.verify()
    assert st.manifest["source"]["router"] == router and st.manifest["source"]["type"] == "synthetic"
    e = Engine.open(path, expert_slots=3)
    ids = np.random.default_rng(0).integers(0, e.args.vocab_size, 24)
    logits = e.forward(ids, last_only=False)
    for t in range(8):
        logits = np.concatenate([logits, e.forward([t])])
    assert np.isfinite(logits).all()
    assert 0.1 < logits.std() < 30  # neither vanished nor blown up


def test_the_gemma4_shape_has_the_design_numbers():
    arch_name, cfg = shape_config("gemma4-26b-a4b")
    arch = models.get(arch_name)
    a = arch.Args.from_dict(cfg)
    blob = sum(_nbytes("q4", s) for s in a.expert_shapes().values())
    assert blob == 3_345_408 and a.num_hidden_layers == 30 and a.num_experts == 128 and a.top_k_experts == 8
    assert 12.8e9 < blob * 128 * 30 < 13.0e9
    dense = sum(_nbytes(_kind(n, s), s) for n, s in dense_shapes(arch, a, cfg).items())
    assert 1.33e9 < dense < 1.37e9
    assert [a.attn_dims(i) for i in (0, 5, 29)] == [(256, 8), (512, 2), (512, 2)]
    assert a.layer_types.count("full_attention") == 5 and a.k_eq_v(5) and not a.k_eq_v(0)


def test_the_real_shapes_agree_with_transformers_configs():
    transformers = pytest.importorskip("transformers")
    _, g = shape_config("gemma4-26b-a4b")
    ref = transformers.Gemma4TextConfig(**{k: v for k, v in g.items() if k != "model_type"})
    ours = models.get("gemma4").Args.from_dict(g)
    assert ref.layer_types == ours.layer_types and ref.rope_parameters == ours.rope_parameters
    layers = ref.per_layer_config  # one config view per layer, with the full-attention overrides applied
    assert [ours.attn_dims(i) for i in range(30)] == [(c.head_dim, c.num_key_value_heads) for c in layers]
    _, q = shape_config("qwen3-30b-a3b")
    ref = transformers.Qwen3MoeConfig(**{k: v for k, v in q.items() if k != "model_type"})
    assert (ref.num_hidden_layers, ref.num_experts, ref.moe_intermediate_size, ref.head_dim) == (48, 128, 768, 128)


def test_uniform_and_skewed_stores_of_one_seed_differ_only_in_the_router(tmp_path):
    u = Store(synth_store(tmp_path / "u", "tiny-qwen3-moe", progress=False))
    s = Store(synth_store(tmp_path / "s", "tiny-qwen3-moe", router="skewed", progress=False))
    assert all(u.expert_layers[l].digests == s.expert_layers[l].digests for l in u.expert_layers)
    differ = {
        n
        for n, t in u.manifest["dense"]["tensors"].items()
        if t["digest"] != s.manifest["dense"]["tensors"][n]["digest"]
    }
    assert differ == {f"layers.{i}.router" for i in range(4)}
    scales = s.dense("layers.0.router").parts["scales"]
    assert scales.max() / scales.min() > 5  # the power law spreads the router rows


@pytest.mark.parametrize("shape,layers", [("tiny-qwen3-moe", 24), ("tiny-gemma4", 12)])
def test_a_uniform_router_routes_about_uniformly_and_a_skewed_one_does_not(tmp_path, shape, layers):
    share = {}
    for router in ("uniform", "skewed"):
        # a steep power law: among 16 experts the default exponent moves the top-2 share only 1.3×
        e = Engine.open(
            synth_store(tmp_path / router, shape, layers=layers, router=router, skew=1.5, progress=False),
            expert_slots=4,
        )
        rec = e.model.experts = TraceRecorder(e.model.experts)
        run_workload(e, Workload(prompt_tokens=16, prefill_tokens=(16,), decode_tokens=64, runs=1), rec)
        share[router] = popularity(rec.calls, 16)
    # deep layers included: random attention must not wash the tokens into one shared direction
    assert share["uniform"]["share"] < 1.2 * share["uniform"]["uniform_share"]
    assert share["skewed"]["share"] > 1.35 * share["skewed"]["uniform_share"]


def test_layers_override_makes_a_smaller_variant_with_a_full_attention_last_layer():
    _, cfg = shape_config("gemma4-26b-a4b", layers=4)
    assert cfg["num_hidden_layers"] == 4 and cfg["layer_types"][-1] == "full_attention"


def test_bad_shape_layers_or_router_are_refused(tmp_path):
    with pytest.raises(RkmojoError, match="choose one of"):
        shape_config("gemma9")
    with pytest.raises(RkmojoError, match="at least 1 layer"):
        shape_config("tiny-gemma4", layers=0)
    with pytest.raises(RkmojoError, match="--router"):
        synth_store(tmp_path / "x", "tiny-gemma4", router="zipf", progress=False)
    assert not (tmp_path / "x").exists()


def test_the_cli_writes_a_store(tmp_path, capsys):
    assert (
        main(["synth", "--shape", "tiny-gemma4", "--layers", "2", "--router", "skewed", "-q", str(tmp_path / "cli")])
        == 0
    )
    assert str(tmp_path / "cli") in capsys.readouterr().out
    assert Store(tmp_path / "cli").manifest["source"]["layers"] == 2
    assert set(SHAPES) >= {"gemma4-26b-a4b", "qwen3-30b-a3b", "tiny-gemma4", "tiny-qwen3-moe"}
