"""`rkmojo pull` against a local Hugging Face-style server: an interrupted pull resumes to a store
bit-identical to an offline `rkmojo convert`; HTTP failures give clear errors; the pull policy refuses this
machine by any name, after DNS and on every redirect, and its errors tell nothing about the port.

The server listens on 127.0.0.1 (the command line's default policy checks nothing), or, for the policy's
LAN tests, inside a network namespace as a LAN neighbour (root only), allowed by `PullPolicy(lan=True)`."""

import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from inference.convert import convert
from inference.pull import (
    FAILED,
    REFUSED,
    DownloadFailed,
    PullCancelled,
    PullError,
    PullLock,
    PullPolicy,
    PullRefused,
    pull,
)
from inference.pull.policy import Kind, kind, resolve_host
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


def test_transient_errors_are_retried_and_each_retry_is_told(server, tmp_path):
    server.fail = 2
    told = []
    out = pull(REPO, tmp_path / "models", endpoint=server.url, progress=False, on_retry=told.append)
    assert (out / "manifest.json").is_file()
    assert [re.sub(r"in [\d.]+ s$", "in T s", t) for t in told] == [
        "HTTP 503, retry 1 of 6 in T s",
        "HTTP 503, retry 2 of 6 in T s",
    ]


def test_a_pull_waiting_to_retry_is_cancelled_at_once(server, tmp_path):
    server.fail = 100
    asked = time.monotonic()
    with pytest.raises(PullCancelled):
        pull(
            REPO, tmp_path / "models", endpoint=server.url, progress=False, cancel=lambda: time.monotonic() > asked + 1
        )
    assert time.monotonic() - asked < 3  # not after the backoff's 30 s


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


def _gguf_repo(server, smollm2_gguf, repo: str, names: list[str]) -> None:
    """A repository on the test hub holding the demo GGUF under each of `names` (and a README)."""
    (server.root / repo).mkdir(parents=True, exist_ok=True)
    (server.root / repo / "README.md").write_text("a GGUF repository\n")
    for n in names:
        link = server.root / repo / n
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(smollm2_gguf, link)


def test_hf_co_with_a_quant_picks_that_gguf_of_the_repository(server, tmp_path, smollm2_gguf, smollm2_store):
    """`hf.co/OWNER/REPO:QUANT` as Ollama spells it: the repository's file list read, the one GGUF whose name
    holds the quant as a word pulled (not Q4_K_S, not the vision projector) and converted as its URL would be."""
    names = ["Demo-Q4_K_M.gguf", "Demo-Q4_K_S.gguf", "Demo-Q8_0.gguf", "mmproj-Demo-Q4_K_M.gguf"]
    _gguf_repo(server, smollm2_gguf, "files/demo-gguf", names)
    out = pull("hf.co/files/demo-gguf:q4_k_m", tmp_path, endpoint=server.url, progress=False)
    assert out.name == "demo-gguf-q4_k_m"
    assert (out / "dense.bin").read_bytes() == (smollm2_store / "dense.bin").read_bytes()
    assert Store(out).manifest["source"]["url"] == f"{server.url}/files/demo-gguf/resolve/main/Demo-Q4_K_M.gguf"
    # no quant: Q4_K_M, as Ollama's default; --file names any
    assert pull("hf.co/files/demo-gguf", tmp_path, name="dflt", endpoint=server.url, progress=False).name == "dflt"
    picked = pull("files/demo-gguf", tmp_path, file="Demo-Q8_0.gguf", endpoint=server.url, progress=False)
    assert picked.name == "demo-q8_0" and Store(picked).manifest["source"]["url"].endswith("/Demo-Q8_0.gguf")


def test_hf_co_refuses_a_missing_quant_several_matches_and_split_files_naming_them(server, tmp_path, smollm2_gguf):
    names = ["a/M-Q4_0.gguf", "b/M-Q4_0.gguf", "M-Q6_K-00001-of-00002.gguf", "M-Q6_K-00002-of-00002.gguf"]
    _gguf_repo(server, smollm2_gguf, "files/multi-gguf", names)
    cases = {
        "hf.co/files/multi-gguf:Q2_K": "no GGUF file for Q2_K",
        "hf.co/files/multi-gguf:Q4_0": "several GGUF files match: a/M-Q4_0.gguf, b/M-Q4_0.gguf",
        "hf.co/files/multi-gguf:Q6_K": "split GGUF",
        "hf.co/files/multi-gguf": "no GGUF file for Q4_K_M",
        "hf.co/nobody": "give hf.co/OWNER/REPO",
    }
    for spec, said in cases.items():
        with pytest.raises(PullError, match=re.escape(said)):
            pull(spec, tmp_path, endpoint=server.url, progress=False)
    with pytest.raises(PullError, match="has no file 'M.gguf'"):
        pull("files/multi-gguf", tmp_path, file="M.gguf", endpoint=server.url, progress=False)
    assert nothing_in(tmp_path)


# --- the pull policy (`inference.pull.policy`): what a pull for network clients may connect to -------------
def nothing_in(models: Path) -> bool:
    return not models.exists() or not any(models.iterdir())


class Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it (and closes each)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            c.close()


@pytest.mark.parametrize("lan", [False, True])
def test_the_policy_refuses_this_machine_by_any_name_before_connecting(server, tmp_path, lan):
    redis_like, closed = Listener(), Listener()
    closed.sock.close()
    stub = {"models.example": ["127.0.0.1"], "mixed.example": ["93.184.215.14", "127.0.0.1"]}
    policy = PullPolicy(lan=lan, resolve=lambda host, port: stub.get(host) or resolve_host(host, port))
    urls = [
        f"{server.url}/files/demo/resolve/main/x.gguf",  # the open port of a real HTTP server
        f"http://127.0.0.1:{redis_like.port}/x.gguf",  # an open port that is not HTTP
        f"http://127.0.0.1:{closed.port}/x.gguf",  # a closed one
        f"http://localhost:{server.port}/x.gguf",  # a name (the hosts file) for 127.0.0.1
        f"http://models.example:{server.port}/x.gguf",  # a name the resolver gives as 127.0.0.1
        f"http://mixed.example:{server.port}/x.gguf",  # a public address and this machine's
        f"http://2130706433:{server.port}/x.gguf",  # 127.0.0.1 as one number
        f"http://0.0.0.0:{server.port}/x.gguf",
        f"http://[::ffff:127.0.0.1]:{server.port}/x.gguf",
        f"http://[::1]:{server.port}/x.gguf",
    ]
    asked = len(server.requests)
    for url in urls:
        with pytest.raises(PullRefused) as e:
            pull(url, tmp_path / "models", progress=False, policy=policy)
        assert str(e.value) == REFUSED, url
    assert len(server.requests) == asked and redis_like.accepted == 0  # nothing was sent anywhere
    assert nothing_in(tmp_path / "models")


@pytest.mark.parametrize(
    "address, expected",
    [
        ("8.8.8.8", Kind.PUBLIC),
        ("2606:4700::1111", Kind.PUBLIC),
        ("192.168.1.10", Kind.LAN),
        ("::ffff:192.168.1.10", Kind.LAN),
        ("100.100.1.1", Kind.LAN),  # carrier-grade NAT: Tailscale's peers
        ("fd00::1", Kind.LAN),
        ("127.0.0.2", Kind.MACHINE),
        ("::7f00:1", Kind.MACHINE),  # IPv4-compatible
        ("64:ff9b::7f00:1", Kind.MACHINE),  # NAT64
        ("2002:7f00:1::", Kind.MACHINE),  # 6to4
        ("169.254.169.254", Kind.MACHINE),  # link-local: a cloud's metadata service
        ("fe80::1", Kind.MACHINE),
        ("::", Kind.MACHINE),
        ("224.0.0.1", Kind.OTHER),
        ("255.255.255.255", Kind.OTHER),
        ("192.0.2.1", Kind.OTHER),  # documentation
    ],
)
def test_each_address_has_one_kind_whatever_its_spelling(address, expected):
    assert kind(ipaddress.ip_address(address), own=set()) == expected
    assert kind(ipaddress.ip_address("192.168.1.10"), own={ipaddress.ip_address("192.168.1.10")}) == Kind.MACHINE


def test_the_command_line_default_checks_no_address(server, tmp_path):
    """`rkmojo pull` passes no policy: its user may pull from a server on this machine (as these tests do)."""
    out = pull(REPO, tmp_path / "models", endpoint=server.url, progress=False)
    assert (out / "manifest.json").is_file()


@pytest.fixture
def lan_hub(hub, lan):
    """The hub's files served by a LAN neighbour (a private address, not this machine's)."""
    server = HubServer(hub.root, lan=lan)
    yield server
    server.close()


def test_a_lan_server_is_reached_only_when_the_policy_allows_the_lan(lan_hub, tmp_path):
    with pytest.raises(PullRefused):
        pull(REPO, tmp_path / "models", endpoint=lan_hub.url, progress=False, policy=PullPolicy())
    assert lan_hub.requests == [] and nothing_in(tmp_path / "models")
    out = pull(REPO, tmp_path / "models", endpoint=lan_hub.url, progress=False, policy=PullPolicy(lan=True))
    assert Store(out).architecture == "qwen3_moe"


def test_a_redirect_from_an_allowed_host_to_this_machine_is_refused(lan_hub, tmp_path):
    inside = Listener()
    lan_hub.cdn, lan_hub.redirect_to = True, f"http://127.0.0.1:{inside.port}"
    with pytest.raises(PullRefused) as e:
        pull(REPO, tmp_path / "models", endpoint=lan_hub.url, progress=False, policy=PullPolicy(lan=True))
    assert str(e.value) == REFUSED
    assert lan_hub.requests and inside.accepted == 0  # the allowed host was asked, the redirect not followed
    assert nothing_in(tmp_path / "models")


def test_a_name_is_resolved_once_per_connection_and_the_checked_address_is_the_one_connected(lan_hub, tmp_path):
    """A DNS rebind (a public answer for the check, 127.0.0.1 for the connect) has no second lookup to use."""
    looked_up = []

    def resolver(host, port):
        looked_up.append(host)
        return [lan_hub.host] if host == "nas.example" else resolve_host(host, port)

    endpoint = f"http://nas.example:{lan_hub.port}"
    out = pull(REPO, tmp_path / "models", endpoint=endpoint, progress=False, policy=PullPolicy(True, resolver))
    assert Store(out).architecture == "qwen3_moe"
    assert looked_up == ["nas.example"] * len(lan_hub.requests)  # one lookup per request, none after a check


def test_an_open_and_a_closed_port_fail_with_one_message_and_leave_nothing(lan, tmp_path):
    not_http = lan.listen()  # answers like Redis to an HTTP request, then hangs up

    def serve():
        while True:
            try:
                c, _ = not_http.accept()
            except OSError:
                return
            c.recv(4096)
            c.sendall(b"-ERR unknown command 'GET'\r\n")
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    closed = lan.listen()
    closed_port = closed.getsockname()[1]
    closed.close()
    errors, told = [], []
    for port in (not_http.getsockname()[1], closed_port):
        with pytest.raises(DownloadFailed) as e:
            pull(
                f"http://{lan.ns_ip}:{port}/x.gguf",
                tmp_path / "models",
                progress=False,
                retries=1,
                policy=PullPolicy(lan=True),
                on_retry=lambda t: told.append(re.sub(r"in [\d.]+ s$", "in T s", t)),
            )
        errors.append(str(e.value))
    not_http.close()
    assert errors == [FAILED, FAILED]
    assert told == ["connection failed, retry 1 of 1 in T s"] * 2  # the retries tell nothing of the port either
    assert nothing_in(tmp_path / "models")
