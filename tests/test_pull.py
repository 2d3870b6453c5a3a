"""`rkmojo pull` against a local Hugging Face-style server (127.0.0.1 only): an interrupted pull resumes
to a store bit-identical to an offline `rkmojo convert`; HTTP failures give clear errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from inference.convert import convert
from inference.pull import PullError, PullLock, pull
from inference.store import Store
from hub_server import HubServer
from tiny_models import tiny_qwen3_moe

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/tiny-moe"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    tiny_qwen3_moe(root / REPO, dtype=torch.bfloat16)
    # a bigger one in shards: its embedding and head span several download chunks
    tiny_qwen3_moe(root / "acme/sharded-moe", vocab=65536, hidden=128, shard="10MB", dtype=torch.bfloat16)
    server = HubServer(root)
    yield server
    server.close()


@pytest.fixture
def server(hub):
    hub.ranges, hub.token, hub.rate, hub.fail, hub.down_after, hub.served = True, None, None, 0, None, 0
    hub.cdn, hub.cdn_auth = False, 0
    return hub


def cli(*args, home: Path, **popen):
    env = dict(os.environ, RKMOJO_HOME=str(home))
    env.pop("HF_TOKEN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "inference.cli", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def same_store(a: Path, b: Path) -> None:
    """Bit-identical stores: dense.bin, every expert file, tokenizer files; manifests equal but for the source."""
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    ma.pop("source")
    mb.pop("source")
    assert ma == mb
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        if f.name != "manifest.json":
            assert (a / f).read_bytes() == (b / f).read_bytes(), f


def records(journal: Path) -> list[dict]:
    out = []
    for line in journal.read_text().splitlines() if journal.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def in_flight_chunk(journal: Path) -> bool:
    recs = records(journal)
    done = {(r["file"], r["tensor"]) for r in recs if r["t"] == "tensor"}
    return any(r["t"] == "chunk" and (r["file"], r["tensor"]) not in done for r in recs)


def test_a_killed_pull_resumes_to_the_same_store_as_an_offline_convert(server, tmp_path):
    repo = "acme/sharded-moe"
    offline = convert(server.root / repo, tmp_path / "offline", "q4", progress=False)
    home = tmp_path / "home"
    total = sum(p.stat().st_size for p in (server.root / repo).glob("*.safetensors"))
    server.rate = 8 * 2**20  # bytes/s: the first run takes a few seconds
    proc = cli("pull", repo, "--endpoint", server.url, "--name", "moe", "-q", home=home)
    models = home / "models"
    journal = models / ".moe.pull" / "journal.jsonl"
    deadline = time.time() + 120
    # kill it half way through a tensor: a chunk of it is journaled, the tensor is not committed
    while not in_flight_chunk(journal) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = sum(r["len"] for r in records(journal) if r["t"] == "chunk")
    assert 0 < kept < total
    assert not (models / "moe").exists() and (models / ".moe.pull" / "journal.jsonl").is_file()
    listing = cli("list", home=home).communicate()[0]
    assert "moe" in listing and "(partial)" in listing

    server.rate, server.served = None, 0
    out, err = cli("pull", repo, "--endpoint", server.url, "--name", "moe", "-q", home=home).communicate(timeout=300)
    assert out.strip() == str(models / "moe"), err
    assert server.served <= total - kept + 2**20  # it went on from where it was killed (+ headers)
    assert not (models / ".moe.pull").exists()
    same_store(models / "moe", offline)
    st = Store(models / "moe")
    st.verify()
    assert st.manifest["source"] == {
        "type": "hf",
        "endpoint": server.url,
        "repo": repo,
        "revision": "main",
        "model_type": "qwen3_moe",
    }


def test_a_pull_whose_partial_store_was_damaged_starts_over(server, tmp_path, capsys):
    repo = "acme/sharded-moe"
    offline = convert(server.root / repo, tmp_path / "offline", "q4", progress=False)
    server.down_after = 20 * 2**20
    with pytest.raises(PullError, match="gave up after 1 attempts, run `rkmojo pull` again to resume"):
        pull(repo, tmp_path / "models", name="moe", endpoint=server.url, progress=False, retries=0)
    staging = tmp_path / "models" / ".moe.pull"
    assert any(r["t"] == "tensor" for r in records(staging / "journal.jsonl"))
    with open(staging / "store" / "dense.bin", "r+b") as f:  # damage a committed tensor
        f.write(b"\x55" * 64)
    server.down_after, server.served = None, 0
    out = pull(repo, tmp_path / "models", name="moe", endpoint=server.url, progress=False)
    assert "starting over" in capsys.readouterr().err
    same_store(out, offline)


def test_a_pull_in_process_matches_the_offline_convert(server, tmp_path):
    offline = convert(server.root / REPO, tmp_path / "offline", "q8", progress=False)
    out = pull(REPO, tmp_path / "models", endpoint=server.url, quant="q8", progress=False)
    same_store(out, offline)


def test_a_server_without_range_support_is_a_clear_error(server, tmp_path):
    server.ranges = False
    proc = cli("pull", REPO, "--endpoint", server.url, "-q", home=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.count("\n") == 1 and "Range" in err and "HTTP 200" in err
    assert not (tmp_path / "models" / "tiny-moe").exists()


def test_http_errors_name_the_file(server, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(PullError, match=r"acme/missing@main: config.json not found \(HTTP 404"):
        pull("acme/missing", tmp_path / "m1", endpoint=server.url, progress=False)
    server.token = "s3cret"
    with pytest.raises(PullError, match=r"config.json: HTTP 401 .*set HF_TOKEN"):
        pull(REPO, tmp_path / "m2", endpoint=server.url, progress=False)
    monkeypatch.setenv("HF_TOKEN", "s3cret")
    assert Store(pull(REPO, tmp_path / "m3", endpoint=server.url, progress=False)).architecture == "qwen3_moe"


def test_the_token_follows_no_redirect_to_another_host(server, tmp_path, monkeypatch):
    server.token, server.cdn = "s3cret", True
    monkeypatch.setenv("HF_TOKEN", "s3cret")
    offline = convert(server.root / REPO, tmp_path / "offline", "q4", progress=False)
    same_store(pull(REPO, tmp_path / "models", endpoint=server.url, progress=False), offline)
    assert server.cdn_auth == 0 and any(r.startswith("/cdn/") for r in server.requests)


def test_transient_errors_are_retried(server, tmp_path):
    server.fail = 2
    out = pull(REPO, tmp_path / "models", endpoint=server.url, progress=False)
    assert (out / "manifest.json").is_file()


def test_two_pulls_of_one_name_cannot_run_at_once(server, tmp_path):
    models = tmp_path / "models"
    with PullLock(models / ".tiny-moe.pull", "tiny-moe"):
        with pytest.raises(PullError, match="another `rkmojo pull` is installing tiny-moe"):
            pull(REPO, models, endpoint=server.url, progress=False)


def test_an_installed_name_is_not_pulled_twice(server, tmp_path):
    pull(REPO, tmp_path, endpoint=server.url, progress=False)
    with pytest.raises(PullError, match="already installed; `rkmojo rm tiny-moe` first"):
        pull(REPO, tmp_path, endpoint=server.url, progress=False)


def test_a_gguf_url_is_downloaded_and_converted(server, tmp_path, smollm2_gguf, smollm2_store):
    (server.root / "files/demo").mkdir(parents=True, exist_ok=True)
    link = server.root / "files/demo" / smollm2_gguf.name
    if not link.exists():
        os.symlink(smollm2_gguf, link)
    url = f"{server.url}/files/demo/resolve/main/{smollm2_gguf.name}"
    out = pull(url, tmp_path, progress=False)
    assert out.name == "smollm2-135m-instruct.q4_1"
    assert (out / "dense.bin").read_bytes() == (smollm2_store / "dense.bin").read_bytes()
    assert Store(out).manifest["source"]["url"] == url
    assert not (tmp_path / ".smollm2-135m-instruct.q4_1.pull").exists()
