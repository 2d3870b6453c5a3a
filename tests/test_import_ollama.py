"""`rkmojo import ollama:NAME[:TAG]`: a fake Ollama store laid out as Ollama lays it out, made read-only, imported;
the store must be the one `rkmojo convert` makes of the same GGUF, and Ollama's directory must be unchanged."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
from test_convert_gguf import write_tiny_gguf

from inference.cli import main
from inference.convert import convert
from inference.convert.ollama import OllamaRef, find_ollama_dir, import_ollama
from inference.errors import ConvertError, ModelFormatError
from inference.store import Store

MEDIA = "application/vnd.ollama.image."
PARAMS = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "repeat_penalty": 1.1, "stop": ["<|im_end|>"]}


def put_blob(root: Path, data: bytes, media: str) -> dict:
    """Store `data` as Ollama does (named by its sha256); its layer entry."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}


def make_ollama(root: Path, name: str, gguf: Path | None, *, params: dict | None = PARAMS, extra=()) -> Path:
    """An Ollama models directory at `root` holding `name` (as `ollama list` shows it); its manifest path."""
    ref = OllamaRef.parse(name)
    layers = [put_blob(root, gguf.read_bytes(), MEDIA + "model")] if gguf else []
    layers.append(put_blob(root, b"{{ .Prompt }}", MEDIA + "template"))
    if params is not None:
        layers.append(put_blob(root, json.dumps(params).encode(), MEDIA + "params"))
    layers.append(put_blob(root, b"Apache-2.0", MEDIA + "license"))
    layers += [put_blob(root, data, MEDIA + kind) for kind, data in extra]
    config = put_blob(root, json.dumps({"model_format": "gguf", "model_family": "llama"}).encode(), "")
    config["mediaType"] = "application/vnd.docker.container.image.v1+json"
    manifest = ref.manifest(root)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": config,
                "layers": layers,
            }
        )
    )
    return manifest


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


@pytest.fixture
def read_only():
    """Make directories read-only (chmod -R a-w) for the test; writable again afterwards, for cleanup."""
    roots = []

    def freeze(root: Path) -> dict:
        roots.append(root)
        for p in [root, *root.rglob("*")]:
            p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
        return snapshot(root)

    yield freeze
    for root in roots:
        for p in [root, *root.rglob("*")]:
            p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def assert_same_store(imported: Path, converted: Path) -> None:
    a, b = Store(imported), Store(converted)
    a.verify()
    for key in ("architecture", "config", "quantization", "tokenizer", "dense", "experts"):
        assert a.manifest[key] == b.manifest[key], key
    files = sorted(str(p.relative_to(b.path)) for p in b.path.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(a.path)) for p in a.path.rglob("*") if p.is_file())
    for f in files:
        if f != "manifest.json":
            assert (a.path / f).read_bytes() == (b.path / f).read_bytes(), f


# --- importing --------------------------------------------------------------------------------
def test_an_imported_model_is_the_store_convert_makes_and_ollama_is_left_untouched(tmp_path, tiny_gguf, read_only):
    ollama, models = tmp_path / "ollama", tmp_path / "models"
    make_ollama(ollama, "tiny:q4", tiny_gguf)
    before = read_only(ollama)
    out = import_ollama("tiny:q4", models, ollama_dir=ollama, progress=False)
    assert out == models / "tiny-q4"
    assert snapshot(ollama) == before
    assert [p.name for p in models.iterdir()] == ["tiny-q4"]
    assert_same_store(out, convert(tiny_gguf, tmp_path / "converted", progress=False))
    man = Store(out).manifest
    digest = json.loads((ollama / "manifests/registry.ollama.ai/library/tiny/q4").read_text())["layers"][0]["digest"]
    assert man["source"]["type"] == "ollama" and man["source"]["ollama_model"] == "tiny:q4"
    assert man["source"]["digest"] == digest
    gen = man["generation"]
    assert (gen["temperature"], gen["top_k"], gen["top_p"], gen["repetition_penalty"]) == (0.6, 20, 0.95, 1.1)
    assert "stop" not in gen and "min_p" not in gen
    assert gen["eos_token_id"] == [2]  # the converter's own defaults stay


def test_a_moe_model_in_a_user_namespace_imports_with_its_experts(tmp_path, read_only):
    from test_convert_gguf_moe import OVERRIDES, write_moe_gguf
    from tiny_models import tiny_parity_model

    ckpt = tiny_parity_model("olmoe", tmp_path / "hf", **OVERRIDES["olmoe"][1])
    write_moe_gguf("olmoe", ckpt, tmp_path / "olmoe.gguf")
    ollama = tmp_path / "ollama"
    make_ollama(ollama, "someone/OLMoE-Tiny:Q4_K_M", tmp_path / "olmoe.gguf", params=None)
    before = read_only(ollama)
    # Ollama matches names case-insensitively; the default local name is lowercase
    out = import_ollama("someone/olmoe-tiny:q4_k_m", tmp_path / "models", ollama_dir=ollama, progress=False)
    assert out.name == "olmoe-tiny-q4_k_m" and snapshot(ollama) == before
    assert Store(out).expert_layers
    assert_same_store(out, convert(tmp_path / "olmoe.gguf", tmp_path / "converted", progress=False))


def test_the_cli_imports_into_the_models_directory_and_show_reads_it(tmp_path, tiny_gguf, monkeypatch, capsys):
    ollama = tmp_path / "ollama"
    make_ollama(ollama, "hf.co/owner/tiny-GGUF:Q8_0", tiny_gguf)
    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    assert main(["import", "ollama:hf.co/owner/tiny-GGUF:Q8_0", "--name", "tiny", "-q"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'home' / 'models' / 'tiny'}\n"
    assert main(["show", "tiny"]) == 0
    shown = capsys.readouterr().out
    assert "type ollama" in shown and "temperature 0.6" in shown and "repetition_penalty 1.1" in shown
    assert main(["import", "ollama:hf.co/owner/tiny-GGUF:Q8_0", "--name", "tiny", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a model of that name is installed" in err and "rkmojo rm tiny" in err
    assert main(["import", str(tiny_gguf)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ollama:NAME[:TAG]" in err and "rkmojo convert" in err


@pytest.mark.parametrize(
    "name, path, local",
    [
        ("qwen3", "registry.ollama.ai/library/qwen3/latest", "qwen3"),
        ("qwen3:30b-a3b", "registry.ollama.ai/library/qwen3/30b-a3b", "qwen3-30b-a3b"),
        ("someone/mix:v2", "registry.ollama.ai/someone/mix/v2", "mix-v2"),
        ("hf.co/Owner/Repo-GGUF:Q4_K_M", "hf.co/Owner/Repo-GGUF/Q4_K_M", "repo-gguf-q4_k_m"),
    ],
)
def test_a_name_finds_its_manifest_where_ollama_keeps_it(name, path, local):
    ref = OllamaRef.parse(name)
    assert ref.manifest(Path("/o")) == Path("/o/manifests") / path
    assert ref.default_name() == local


@pytest.mark.parametrize("name", ["a/b/c/d", "qwen3:", "../x", "x:..", "x y"])
def test_a_malformed_name_is_refused_with_an_example(name):
    with pytest.raises(ConvertError, match="not an Ollama model name.*ollama:qwen3:30b-a3b"):
        OllamaRef.parse(name)


def test_the_ollama_directory_is_the_first_that_exists(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    if (Path("/usr/share/ollama/.ollama/models") / "manifests").is_dir():
        pytest.skip("this machine has Ollama's service directory")
    with pytest.raises(ConvertError, match="no Ollama models directory found.*nowhere.*--ollama-dir"):
        find_ollama_dir()
    (home / ".ollama" / "models" / "manifests").mkdir(parents=True)
    assert find_ollama_dir() == home / ".ollama" / "models"
    (tmp_path / "nowhere" / "manifests").mkdir(parents=True)
    assert find_ollama_dir() == tmp_path / "nowhere"
    with pytest.raises(ConvertError, match="no manifests/"):
        find_ollama_dir(tmp_path)


# --- bad input: one line naming the file and the fix, nothing left in the models directory -----
def refused(exc_type, name: str, ollama: Path, models: Path, *needles: str) -> str:
    with pytest.raises(exc_type) as e:
        import_ollama(name, models, ollama_dir=ollama, progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    assert not models.exists() or list(models.iterdir()) == []
    return msg


def test_a_model_ollama_does_not_have_is_refused(tmp_path, tiny_gguf):
    ollama = tmp_path / "ollama"
    make_ollama(ollama, "tiny", tiny_gguf)
    refused(ConvertError, "other:7b", ollama, tmp_path / "models", "other/7b", "no such Ollama manifest", "ollama list")


def test_a_missing_blob_is_refused(tmp_path, tiny_gguf):
    ollama = tmp_path / "ollama"
    man = make_ollama(ollama, "tiny", tiny_gguf)
    blob = ollama / "blobs" / json.loads(man.read_text())["layers"][0]["digest"].replace(":", "-")
    blob.unlink()
    refused(ConvertError, "tiny", ollama, tmp_path / "models", str(blob), "blob missing", "ollama pull tiny:latest")


@pytest.mark.parametrize("where", ["in a tensor", "in the header"])
def test_a_blob_that_is_not_what_its_digest_says_is_refused(tmp_path, tiny_gguf, where):
    ollama, models = tmp_path / "ollama", tmp_path / "models"
    man = make_ollama(ollama, "tiny", tiny_gguf)
    blob = ollama / "blobs" / json.loads(man.read_text())["layers"][0]["digest"].replace(":", "-")
    data = bytearray(blob.read_bytes())
    at = len(data) - 10 if where == "in a tensor" else 0  # a tensor converts fine; a bad magic is refused at once
    data[at] ^= 0xFF
    blob.write_bytes(bytes(data))
    refused(ModelFormatError, "tiny", ollama, models, str(blob), "sha256 is", "ollama rm tiny:latest")


def test_a_projector_layer_is_refused(tmp_path, tiny_gguf):
    ollama = tmp_path / "ollama"
    make_ollama(ollama, "llava", tiny_gguf, extra=[("projector", b"GGUF mmproj")])
    refused(ConvertError, "llava", ollama, tmp_path / "models", "vision projector", "llava:latest", "cannot apply")


def test_a_manifest_without_a_model_layer_is_refused(tmp_path):
    ollama = tmp_path / "ollama"
    man = make_ollama(ollama, "empty", None)
    refused(ConvertError, "empty", ollama, tmp_path / "models", str(man), "no model layer")


def test_a_model_ollama_stores_read_only_leaves_no_trace_when_refused(tmp_path, tiny_gguf, read_only):
    ollama, models = tmp_path / "ollama", tmp_path / "models"
    make_ollama(ollama, "tiny", tiny_gguf, extra=[("adapter", b"lora")])
    before = read_only(ollama)
    refused(ConvertError, "tiny", ollama, models, "LoRA adapter")
    assert snapshot(ollama) == before
