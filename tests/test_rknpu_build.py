"""`rkmojo npu build`: SmolLM2's dense blocks compiled by Rockchip's rknn-toolkit2 (in .venv-rknn) into the
store's npu/rk3588/, with the manifest section, digests that `rkmojo verify` checks, and atomicity.

Kept fast: a few layers at 32 rows (the toolkit compiles and simulates each graph in 2–8 s here).
"""

import json
import shutil
import stat
from pathlib import Path

import pytest

from inference.backends.rknpu.build import W8A8_MAX_ERROR, BuildError, build
from inference.backends.rknpu.quality import MEASURED
from inference.cli import main
from inference.errors import ModelFormatError
from inference.store import Store

ROOT = Path(__file__).resolve().parents[1]
RKNN_PY = ROOT / ".venv-rknn" / "bin" / "python"
needs_toolkit = pytest.mark.skipif(not RKNN_PY.exists(), reason="no .venv-rknn: run scripts/setup --npu-build")


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def built(smollm2_store, tmp_path_factory):
    """SmolLM2 with auto-precision graphs of layer 0 at 32 rows, built through the command line."""
    store = copy_store(smollm2_store, tmp_path_factory.mktemp("npu-build") / "store")
    assert main(["npu", "build", str(store), "--rows", "32", "--layers", "0", "--keep-onnx"]) == 0
    return store


@needs_toolkit
@pytest.mark.slow
def test_the_manifest_section_describes_every_graph(built):
    section = Store(built).manifest["npu"]["rk3588"]
    assert (section["target"], section["rows"], section["toolkit"]) == ("rk3588", 32, "rknn-toolkit2 2.5.0")
    graphs = section["graphs"]
    assert set(graphs) == {"layer_00.qkv", "layer_00.o_mlp"}
    qkv = graphs["layer_00.qkv"]
    assert (qkv["kind"], qkv["layer"], qkv["file"]) == ("qkv", 0, "layer_00.qkv.rknn")
    assert qkv["inputs"] == {"x": [32, 576]} and qkv["outputs"] == {"q": [32, 576], "k": [32, 192], "v": [32, 192]}
    assert graphs["layer_00.o_mlp"]["inputs"] == {"o": [32, 576], "h": [32, 576]}
    for name, g in graphs.items():
        path = built / "npu" / "rk3588" / g["file"]
        assert path.read_bytes()[:4] == b"RKNN" and path.stat().st_size == g["size"]
        assert set(g["digests"]) == {g["file"], name + ".onnx"}
        # w8a8 fails the quality gate (quality.MEASURED: SmolLM2 +5.6 %), so auto does not even try it
        assert set(g["tried"]) == {"fp16"}
        assert g["precision"] == "fp16" and g["error"] == g["tried"]["fp16"] < 2e-3
    assert not [p for p in built.iterdir() if p.name.startswith(".npu")]  # no temp directory left


@needs_toolkit
@pytest.mark.slow
def test_verify_names_a_changed_or_missing_graph_file_and_the_fix(built, tmp_path, capsys):
    store = copy_store(built, tmp_path / "store")
    assert main(["verify", str(store), "-q"]) == 0
    assert "4 NPU files" in capsys.readouterr().out
    graph = store / "npu" / "rk3588" / "layer_00.o_mlp.rknn"
    data = bytearray(graph.read_bytes())
    data[100] ^= 1
    graph.write_bytes(bytes(data))
    with pytest.raises(
        ModelFormatError, match=r"npu/rk3588/layer_00.o_mlp.rknn: digest mismatch; re-run `rkmojo npu build`"
    ):
        Store(store).verify()
    graph.unlink()
    assert main(["verify", str(store), "-q"]) == 1
    assert "npu/rk3588/layer_00.o_mlp.rknn: missing; re-run `rkmojo npu build`" in capsys.readouterr().err


@needs_toolkit
@pytest.mark.slow
def test_a_build_that_fails_midway_leaves_the_store_as_it_was(smollm2_store, tmp_path):
    # the real toolkit run writes its graphs, then the process fails: nothing of it may remain
    store = copy_store(smollm2_store, tmp_path / "store")
    before = (store / "manifest.json").read_bytes()
    failing = tmp_path / "python"
    failing.write_text(f'#!/bin/sh\n"{RKNN_PY}" "$@" && ls "$3"/*.rknn >/dev/null && echo "disk full" >&2 && exit 3\n')
    failing.chmod(failing.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(
        BuildError, match=r"rknn-toolkit2 failed \(exit 3\); the store is unchanged:\n[\s\S]*disk full$"
    ):
        build(store, rows=32, layers=[0], precision="fp16", toolkit_python=failing, log=lambda line: None)
    assert (store / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in store.iterdir()) == sorted(p.name for p in smollm2_store.iterdir())


@needs_toolkit
@pytest.mark.slow
def test_a_rebuild_replaces_the_graphs_and_keeps_the_rest_of_the_manifest(built, tmp_path):
    store = copy_store(built, tmp_path / "store")
    before = json.loads((store / "manifest.json").read_text())
    build(store, rows=32, layers=[1], precision="fp16", log=lambda line: None)
    after = json.loads((store / "manifest.json").read_text())
    assert set(after["npu"]["rk3588"]["graphs"]) == {"layer_01.qkv", "layer_01.o_mlp"}
    assert {k: v for k, v in after.items() if k != "npu"} == {k: v for k, v in before.items() if k != "npu"}
    assert sorted(p.name for p in (store / "npu" / "rk3588").iterdir()) == ["layer_01.o_mlp.rknn", "layer_01.qkv.rknn"]
    assert sorted(p.name for p in (store / "npu").iterdir()) == ["rk3588"]
    Store(store).verify_npu()


def test_a_missing_toolkit_venv_names_the_setup_option(smollm2_store, tmp_path):
    with pytest.raises(BuildError, match=r"rknn-toolkit2's venv is missing; make it with `scripts/setup --npu-build`"):
        build(smollm2_store, toolkit_python=tmp_path / "nope" / "python")


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"target": "rk3576"}, "--target 'rk3576': choose one of rk3588"),
        ({"precision": "w4a16"}, "--precision 'w4a16': choose one of auto, fp16, w8a8"),
        ({"rows": 0}, "--rows 0: give a positive number of rows"),
        ({"layers": [30]}, r"--layers \[30\]: the model has layers 0–29"),
    ],
)
def test_a_bad_option_is_refused_before_anything_is_written(smollm2_store, kw, message):
    with pytest.raises(BuildError, match=message):
        build(smollm2_store, toolkit_python=RKNN_PY if RKNN_PY.exists() else __file__, **kw)


def test_an_architecture_without_graph_hooks_is_refused_by_name(tmp_path):
    # only the manifest's head is read before the refusal: a store of an architecture without layer hooks
    store = tmp_path / "mixtral"
    store.mkdir()
    head = {"format": "rkmojo-store", "version": 1, "architecture": "mixtral", "config": {}, "experts": {"layers": {}}}
    (store / "manifest.json").write_text(json.dumps(head))
    with pytest.raises(
        BuildError, match="architecture 'mixtral' has no NPU graphs yet .only llama, qwen3_moe, olmoe, gemma4."
    ):
        build(store, toolkit_python=__file__)


@needs_toolkit
@pytest.mark.slow
def test_gemma4s_graphs_are_its_qkv_without_v_where_k_is_v_its_normed_o_and_its_dense_mlp(
    gemma4_store, tmp_path, monkeypatch
):
    # layer 0 is a sliding layer (q, k, v), layer 1 a full one whose keys are its values (q, k only).
    # As if w8a8 had passed the quality gate: auto then tries it first and keeps it per graph within its bound
    monkeypatch.setitem(MEASURED, ("graphs", "w8a8"), {"smollm2": 0.0})
    store = copy_store(gemma4_store, tmp_path / "store")
    lines = []
    section = build(store, rows=32, layers=[0, 1], log=lines.append)
    graphs = section["graphs"]
    assert sorted(graphs) == [f"layer_{i:02d}.{k}" for i in (0, 1) for k in ("mlp", "o_norm", "qkv")]
    assert graphs["layer_00.qkv"]["outputs"] == {"q": [32, 128], "k": [32, 64], "v": [32, 64]}  # 4 × 32, 2 × 32
    assert graphs["layer_01.qkv"]["outputs"] == {"q": [32, 256], "k": [32, 64]}  # 4 heads × 64, 1 × 64
    for name in ("layer_00.mlp", "layer_01.mlp"):
        assert graphs[name]["inputs"] == {"x": [32, 128]} and graphs[name]["outputs"] == {"out": [32, 128]}
    # o_norm: o [T, Hq·D] (the layer's own head size) and the residual h → h + rms_norm(o·Woᵀ) · post_attn_norm
    assert graphs["layer_00.o_norm"]["inputs"] == {"o": [32, 128], "h": [32, 128]}
    assert graphs["layer_01.o_norm"]["inputs"] == {"o": [32, 256], "h": [32, 128]}
    assert graphs["layer_01.o_norm"]["outputs"] == {"out": [32, 128]}
    for name, g in graphs.items():
        assert (store / "npu" / "rk3588" / g["file"]).read_bytes()[:4] == b"RKNN"
        # w8a8 first, kept only within its bound; fp16 measured on the simulator against the CPU layer code
        assert g["tried"]["w8a8"] > 0 and g["error"] == g["tried"][g["precision"]], name
        if g["precision"] == "w8a8":
            assert g["error"] <= W8A8_MAX_ERROR, name
        else:
            assert g["tried"]["w8a8"] > W8A8_MAX_ERROR and g["error"] < 2e-3, name
    print("\n".join(lines))
    Store(store).verify_npu()
