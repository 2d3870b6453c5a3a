"""The LAN door on the real stack (webui/door.py, appliance/serve.py, appliance/hosts.py): foreign Hosts and
Origins refused, JSON endpoints JSON-only, bodies too big, too deep or not text refused before any work,
pull confined to the import directory, and the limit on embedding batches; num_ctx is served within the context."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

ASK = [{"role": "user", "content": "hi"}]


def chat(http, body: bytes, **headers) -> httpx.Response:
    return http.post("/v1/chat/completions", content=body, headers=headers)


def test_the_allowed_hosts_are_this_machines_names_and_addresses():
    from appliance.hosts import MachineHosts

    hosts = MachineHosts(["board.example"])
    host = socket.gethostname().lower()
    assert {host, f"{host}.local", "localhost", "127.0.0.1", "[::1]", "board.example"} <= set(hosts)
    assert "attacker.example" not in hosts and "*" not in hosts


def test_a_foreign_host_header_is_refused(http):
    assert http.get("/v1/models", headers={"Host": "attacker.example"}).status_code == 400
    assert http.get("/v1/models", headers={"Host": f"localhost:{http.base_url.port}"}).status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example.com", "null", "file://"])
def test_a_present_foreign_origin_is_refused(http, origin):
    r = chat(http, json.dumps({"model": "smollm2", "messages": ASK, "max_tokens": 1}).encode(), Origin=origin)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_refused"
    r = http.post("/api/pull", json={"model": "owner/name"}, headers={"Origin": origin})
    assert r.status_code == 403 and "Origin" in r.json()["error"]


def test_the_machines_own_origin_is_served(http):
    r = chat(
        http,
        json.dumps({"model": "smollm2", "messages": ASK, "max_tokens": 1}).encode(),
        Origin=str(http.base_url).rstrip("/"),
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded"])
def test_json_endpoints_take_only_json(http, ctype):
    body = json.dumps({"model": "smollm2", "messages": ASK}).encode()
    r = chat(http, body, **{"Content-Type": ctype})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = http.post("/api/pull", content=json.dumps({"model": "owner/name"}), headers={"Content-Type": ctype})
    assert r.status_code == 415


def test_a_body_over_the_limit_is_a_413_decided_at_its_header(stack):
    """20 MB against the 16 MiB limit: refused without the body reaching Django, and daphne does not grow."""
    daphne = psutil.Process(stack.daphne.pid)
    before = daphne.memory_info().rss
    big = b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"a" * (20 * 2**20) + b'"}]}'
    r = httpx.post(
        f"{stack.url}/v1/chat/completions", content=big, timeout=60, headers={"Content-Type": "application/json"}
    )  # no key either: the size is decided first
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert daphne.memory_info().rss - before < 8 * 2**20
    # a chunked body (no Content-Length) is counted as it comes and dropped past the limit
    before = daphne.memory_info().rss
    r = httpx.post(
        f"{stack.url}/api/chat",
        content=iter([big[i : i + 2**20] for i in range(0, len(big), 2**20)]),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    assert daphne.memory_info().rss - before < 8 * 2**20


def test_deep_nesting_is_a_400_naming_the_field(http):
    deep = (
        b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi", "x": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}]}"
    )
    r = chat(http, deep)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages[0].x[0][0]")
    r = http.post("/api/chat", content=b'{"a": {"b": ' + b"[" * 100 + b"]" * 100 + b"}}")
    assert r.status_code == 400 and "deeper than 64" in r.json()["error"]


def test_a_lone_surrogate_is_a_400_naming_the_field(http):
    r = chat(http, b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi \\ud800 there"}]}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    r = http.post("/api/generate", content=b'{"model": "smollm2", "prompt": "\\udfff", "stream": false}')
    assert r.status_code == 400 and "surrogate" in r.json()["error"]


def test_null_user_content_is_a_400(http):
    r = chat(http, json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": None}]}).encode())
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"


def test_an_embedding_batch_over_the_limit_is_refused_before_the_worker(http):
    t0 = time.monotonic()
    r = http.post("/v1/embeddings", json={"model": "smollm2", "input": ["word"] * 2000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and "256" in r.json()["error"]["message"]
    r = http.post("/api/embed", json={"model": "smollm2", "input": ["word"] * 2000})
    assert r.status_code == 400 and "RKMOJO_MAX_EMBED_INPUTS" in r.json()["error"]
    assert time.monotonic() - t0 < 2


def test_num_ctx_past_the_servers_context_is_served_within_it(http):
    """Home Assistant sends num_ctx 8192 by default; the worker's context stays what it is."""
    body = {"model": "smollm2", "prompt": "hi", "stream": False, "options": {"num_ctx": 10**9, "num_predict": 1}}
    assert http.post("/api/generate", json=body).status_code == 200
    body["options"]["num_ctx"] = 256
    assert http.post("/api/generate", json=body).status_code == 200


@pytest.mark.parametrize(
    "source", ["/etc/passwd", "../../../../etc/passwd", "file:///etc/passwd", "~/.bashrc", "import/../../secret_key"]
)
def test_pull_reads_no_file_outside_the_import_directory(http, source):
    r = http.post("/api/pull", json={"model": source, "stream": False})
    assert r.status_code == 400, r.text
    assert "root:" not in r.text  # /etc/passwd starts with it: nothing of a file is echoed
    assert "import" in r.json()["error"] or "http" in r.json()["error"]


def test_the_ps_context_length_is_the_one_overflow_errors_name(http, oai):
    import openai

    http.post(
        "/api/generate", json={"model": "smollm2", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
    )
    ps = http.get("/api/ps").json()["models"]
    ctx = next(m["context_length"] for m in ps if m["model"] == "smollm2")
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "word " * 600}])
    assert str(ctx) in str(e.value) and ctx == 512


def test_check_deploy_passes_for_the_lan_appliance(stack):
    r = subprocess.run(
        [sys.executable, "-m", "django", "check", "--deploy", "--fail-level", "WARNING"],
        env=stack.env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_admin_has_its_css(stack):
    r = httpx.get(f"{stack.url}/static/admin/css/base.css")
    assert r.status_code == 200 and "text/css" in r.headers["content-type"]


# --- the chat WebSocket ---------------------------------------------------------------------------
async def handshake(url: str, **headers) -> int:
    """The HTTP status of a WebSocket handshake (101: accepted)."""
    import websockets

    try:
        async with websockets.connect(url, additional_headers=headers, open_timeout=10):
            return 101
    except websockets.InvalidStatus as e:
        return e.response.status_code


def test_the_chat_socket_refuses_foreign_origins_and_clients_without_a_session(stack, session_cookie):
    ws = stack.url.replace("http", "ws") + "/ws/chat/"
    own = stack.url
    cookie = session_cookie("door-test")

    async def statuses():
        return [
            await handshake(ws, Origin="http://evil.example.com", Cookie=cookie),
            await handshake(ws, Origin="null", Cookie=cookie),
            await handshake(ws, Cookie=cookie),  # no Origin at all
            await handshake(ws, Origin=own),  # same origin, no session
            await handshake(ws, Origin=own, Cookie=cookie),
        ]

    assert asyncio.run(statuses()) == [403, 403, 403, 403, 101]


def test_under_the_remote_policy_loopback_placeholder_keys_pass_and_chat_open_lets_loopback_sockets_in(stack):
    """The stack requires keys from everyone; this daphne runs the default `remote` policy, chat open."""
    import websockets

    from appliance import processes

    port = processes.free_port()
    env = {**stack.env, "RKMOJO_API_KEYS": "remote", "RKMOJO_CHAT_OPEN": "1"}
    web = processes.Child(
        "daphne-remote",
        processes.daphne_argv("127.0.0.1", port),
        env,
        stack.data / "logs" / "daphne-remote.log",
        cwd=os.getcwd(),
    ).start()
    try:
        processes.wait_for(lambda: processes.tcp_open("127.0.0.1", port), 30, "daphne", child=web)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer anything"})
        assert r.status_code == 200 and any(m["id"] == "smollm2" for m in r.json()["data"])

        async def socket():  # no session: let in by RKMOJO_CHAT_OPEN, as a client that needs no key
            url = f"ws://127.0.0.1:{port}/ws/chat/"
            async with websockets.connect(url, additional_headers={"Origin": f"http://127.0.0.1:{port}"}) as ws:
                await ws.send('{"action": "send", "text": "\\ud800", "new": {"model": "smollm2"}}')
                return json.loads(await asyncio.wait_for(ws.recv(), 10))

        ev = asyncio.run(socket())
        assert ev["t"] == "error" and ev["status"] == 400 and ev["param"] == "text"
    finally:
        web.stop()
