"""`rkmojo list`, `show` and `rm` over a models directory (RKMOJO_HOME)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inference.convert import convert
from inference.errors import RkmojoError
from inference.models_dir import describe, list_models, models_dir, remove, resolve_model
from inference.pull import PullLock
from tiny_models import tiny_qwen3_moe

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def moe_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    return convert(tiny_qwen3_moe(tmp / "hf"), tmp / "store", "q4", progress=False)


@pytest.fixture
def home(tmp_path, monkeypatch, moe_store, smollm2_store):
    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path))
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(moe_store, models / "tiny-moe")
    (models / "smollm2-135m-instruct").symlink_to(smollm2_store)
    staging = models / ".half-done.pull"
    staging.mkdir()
    (staging / "journal.jsonl").write_text(
        json.dumps({"t": "start", "type": "hf", "repo": "acme/big", "revision": "main", "size": 1000})
        + "\n"
        + json.dumps({"t": "chunk", "file": "a", "tensor": "x", "off": 0, "len": 400})
        + "\n"
    )
    return tmp_path


def cli(*args, home):
    return subprocess.run(
        [sys.executable, "-m", "inference.cli", *map(str, args)],
        cwd=ROOT,
        env=dict(os.environ, RKMOJO_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_models_dir_follows_rkmojo_home(home):
    assert models_dir() == home / "models"
    assert resolve_model("tiny-moe") == home / "models" / "tiny-moe"
    with pytest.raises(RkmojoError, match="model 'nope' not found .*`rkmojo list`"):
        resolve_model("nope")


def test_list_shows_every_model_and_the_interrupted_pull(home):
    models, partial = list_models()
    assert [m.name for m in models] == ["smollm2-135m-instruct", "tiny-moe"]
    assert partial == [{"name": "half-done", "source": "acme/big@main", "done": 400, "total": 1000}]
    out = cli("list", home=home).stdout.splitlines()
    assert out[0].split() == ["NAME", "ARCH", "PARAMS", "ACTIVE", "SIZE", "QUANT"]
    assert out[1].split()[:3] == ["smollm2-135m-instruct", "llama", "134.5M"]
    assert out[2].split()[:2] == ["tiny-moe", "qwen3_moe"]
    assert "half-done" in out[3] and "(partial)" in out[3] and "resume" in out[3]


def test_describe_counts_moe_parameters_and_active_ones(home):
    m = describe(home / "models" / "tiny-moe")
    per_expert = 3 * 64 * 64
    assert m.experts == {"layers": 2, "per_layer": 16, "top_k": 4, "blob_bytes": m.experts["blob_bytes"]}
    assert m.params - m.active_params == 2 * (16 - 4) * per_expert + 256 * 64  # idle experts + the embedding lookup


def test_show_reports_architecture_sizes_quant_and_digests(home):
    r = cli("show", "tiny-moe", home=home)
    assert r.returncode == 0, r.stderr
    assert "architecture   qwen3_moe" in r.stdout
    assert "16 per layer in 2 layers, top-4" in r.stdout
    assert "quantization   default q4" in r.stdout
    assert "digests        files complete; digests not checked" in r.stdout
    r = cli("show", "tiny-moe", "--verify", home=home)
    assert "ok (every tensor and expert digest verified)" in r.stdout
    layer = home / "models" / "tiny-moe" / "experts" / "layer_01.bin"
    with open(layer, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    r = cli("show", "tiny-moe", "--verify", home=home)
    assert r.returncode == 1 and "experts/layer_01.bin: expert 0 digest mismatch" in r.stderr
    os.truncate(layer, 4096)
    r = cli("show", "tiny-moe", home=home)
    assert r.returncode == 1 and "INCOMPLETE: experts/layer_01.bin is missing or truncated" in r.stdout


def test_rm_deletes_a_model_a_link_or_an_interrupted_pull(home, smollm2_store):
    r = cli("rm", "tiny-moe", "smollm2-135m-instruct", home=home)
    assert r.returncode == 0, r.stderr
    assert not (home / "models" / "tiny-moe").exists()
    assert not (home / "models" / "smollm2-135m-instruct").is_symlink()
    assert (smollm2_store / "manifest.json").is_file()  # a linked store itself is left alone
    with PullLock(home / "models" / ".half-done.pull", "half-done"):
        with pytest.raises(RkmojoError, match="another `rkmojo pull` is installing half-done"):
            remove("half-done")
    assert remove("half-done") == home / "models" / ".half-done.pull"
    assert list_models() == ([], [])
    r = cli("rm", "tiny-moe", home=home)
    assert r.returncode == 1 and r.stderr.startswith("rkmojo: error: model 'tiny-moe' not found")
