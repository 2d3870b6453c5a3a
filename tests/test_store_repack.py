"""`rkmojo repack`: a store's q4 experts stored repacked give the same bits, streamed and resident, land
without a repack, and the rewrite is whole per layer (an interrupted run leaves a working store)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import inference.kernels as kernels
from inference.convert import convert
from inference.engine import Engine
from inference.errors import ModelFormatError
from inference.store import Store
from inference.store.relayout import repack_store
from parity import build_checkpoint
from test_parity import gemma4, qwen3_moe
from test_streaming import run_tokens

ARCHS = {"gemma4": gemma4, "qwen3_moe": qwen3_moe}


@pytest.fixture(scope="module", params=list(ARCHS))
def stores(request, tmp_path_factory):
    """(the q4 store, a copy of it repacked)."""
    model_cls, cfg = ARCHS[request.param]()
    d = tmp_path_factory.mktemp(request.param)
    store = convert(build_checkpoint(model_cls, cfg, d / "hf"), d / "store", "q4", progress=False, repack=False)
    rp = shutil.copytree(store, d / "repacked")
    r = repack_store(rp)
    assert r["layers"] == len(Store(rp).expert_layers) > 0 and r["already"] == 0
    return store, rp


def test_convert_writes_what_repack_makes_of_a_plain_store(stores, tmp_path):
    """The default convert stores the experts repacked: the same layout, kinds and bytes (digests) as
    `rkmojo repack` run on the plain store, layer file names aside."""
    plain, rp = stores
    src = plain.parent / "hf"
    direct = convert(src, tmp_path / "direct", "q4", progress=False)
    got, want = Store(direct).manifest["experts"]["layers"], Store(rp).manifest["experts"]["layers"]
    assert got.keys() == want.keys()
    for layer in want:
        assert {k: v for k, v in got[layer].items() if k != "file"} == {
            k: v for k, v in want[layer].items() if k != "file"
        }
    assert Store(direct).manifest["dense"] == Store(plain).manifest["dense"]
    assert repack_store(direct)["layers"] == 0  # nothing left to repack
    Store(direct).verify()


def kinds(store) -> set[str]:
    return {spec["kind"] for lay in Store(store).expert_layers.values() for spec in lay.tensors.values()}


@pytest.mark.parametrize("activations", ["f32", "decode"])
def test_a_repacked_store_gives_the_stores_bits_streamed_and_resident(stores, activations, monkeypatch):
    store, rp = stores
    assert kinds(store) == {"q4"} and "q4r" in kinds(rp)
    Store(rp).verify()
    ids = np.random.default_rng(3).integers(0, Engine.open(store).args.vocab_size, 56)
    want = run_tokens(Engine.open(store, chunk=16, activations=activations), ids, 40)
    assert np.array_equal(want, run_tokens(Engine.open(rp, chunk=16, activations=activations), ids, 40))
    e = Engine.open(rp, chunk=16, activations=activations, expert_slots=3, prefetch=2)
    repacks = []  # from here on: the dense matrices were repacked at load, through the same function
    compiled = kernels.repack_q4
    monkeypatch.setattr(
        kernels, "repack_q4", lambda w, in_place=False: repacks.append(w.shape) or compiled(w, in_place)
    )
    assert np.array_equal(want, run_tokens(e, ids, 40))
    t = e.expert_stats["total"]
    assert t["misses"] > 0 and t["prefetch_hits"] > 0
    assert repacks == []  # every expert landed ready to compute


def test_an_interrupted_repack_leaves_a_working_store_and_running_it_again_finishes(tmp_path, stores, monkeypatch):
    store, _ = stores
    s = shutil.copytree(store, tmp_path / "s")
    layers = sorted(Store(s).expert_layers)
    real_replace, calls = os.replace, []

    def replace(a, b):  # the second layer's file is written, then the power goes
        calls.append(b)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        repack_store(s)
    monkeypatch.setattr(os, "replace", real_replace)
    st = Store(s)
    st.verify()  # the manifest names the files there are: the first layer repacked, the others not
    assert [lay.path.name.endswith(".q4r.bin") for _, lay in sorted(st.expert_layers.items())] == [True] + [False] * (
        len(layers) - 1
    )
    ids = np.arange(1, 30)
    assert np.array_equal(Engine.open(store).forward(ids), Engine.open(s, expert_slots=2).forward(ids))
    r = repack_store(s)
    assert r["layers"] == len(layers) - 1 and r["already"] == 1
    names = sorted(p.name for p in (s / "experts").iterdir())
    assert names == sorted(f"layer_{i:02d}.q4r.bin" for i in layers)  # no old file, no .part left
    assert repack_store(s)["layers"] == 0
    Store(s).verify()


def test_a_damaged_expert_stops_the_repack_of_its_layer_and_names_it(tmp_path, stores):
    store, _ = stores
    s = shutil.copytree(store, tmp_path / "s")
    st = Store(s)
    layer, lay = sorted(st.expert_layers.items())[0]
    with open(lay.path, "r+b") as f:
        f.seek(2 * lay.stride + 100)
        f.write(b"\xff\x00\xff")
    before = json.loads((s / "manifest.json").read_text())
    with pytest.raises(ModelFormatError, match=rf"layer_{layer:02d}.bin: expert 2 digest mismatch.*rkmojo pull"):
        repack_store(s)
    assert json.loads((s / "manifest.json").read_text()) == before
    assert not list((s / "experts").glob("*.q4r.*"))


def test_the_cli_repacks_once_and_says_so(tmp_path, stores):
    store, _ = stores
    s = shutil.copytree(store, tmp_path / "s")
    cmd = [sys.executable, "-m", "inference.cli", "repack", str(s), "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "experts in" in out and "layers repacked" in out
    again = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "nothing to repack" in again


def test_the_cli_converts_repacked_unless_told_not_to(tmp_path, stores):
    store, _ = stores
    src = store.parent / "hf"
    for flags, want in (([], {"q4r"}), (["--no-repack"], {"q4"})):
        out = tmp_path / ("plain" if flags else "repacked")
        cmd = [sys.executable, "-m", "inference.cli", "convert", str(src), str(out), "-q", *flags]
        subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert kinds(out) == want
