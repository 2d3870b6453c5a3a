"""`rkmojo up` on a PC as a LAN user meets it: what it says at start, the first administrator through the
printed setup URL, private files, clients in another network namespace, and Redis killed mid-stream.

The LAN client runs in a network namespace joined to this one by a veth pair on a private /30 that the
fixture creates and removes; nothing leaves this machine. Needs root (ip netns); skipped otherwise.
"""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from appliance import processes

ROOT = Path(__file__).resolve().parents[2]
DEMO = "smollm2-135m-instruct"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the LAN client's network namespace needs root"),
]


class Up:
    def __init__(self, data: Path, port: int):
        self.data, self.port, self.url = data, port, f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "RKMOJO_", "DJANGO_"))}
        self.env = {
            **env,
            "RKMOJO_DATA": str(data),
            "RKMOJO_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "RKMOJO_WORKER_NAME": "lan-test",
            "RKMOJO_CONTEXT": "512",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inference.cli", "up", "--host", "0.0.0.0", "--port", str(port)],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=lambda: [self.lines.append(line) for line in self.proc.stdout], daemon=True).start()
        self.wait_line("Ctrl-C stops", 180)

    def wait_line(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.lines if text in line]
            if found:
                return found[-1]
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.1)

    def child(self, word: str) -> psutil.Process:
        return next(p for p in psutil.Process(self.proc.pid).children(recursive=True) if word in " ".join(p.cmdline()))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def up(lan, smollm2_store, tmp_path_factory):
    data = tmp_path_factory.mktemp("up-lan") / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / DEMO).symlink_to(smollm2_store)  # the demo model, without converting it again
    u = Up(data, processes.free_port())
    try:
        yield u
    finally:
        u.stop()


def test_start_up_says_where_it_listens_who_needs_a_key_and_the_setup_url(up, lan):
    out = "".join(up.lines)
    assert "listening on all addresses (0.0.0.0)" in out and f"http://{lan.host_ip}:{up.port}" in out
    assert "clients on other machines need an API key" in out and "rkmojo up --create-api-key NAME" in out
    assert re.search(rf"open http://127\.0\.0\.1:{up.port}/setup/\?token=\S+ to create one", out)


def test_the_data_directory_and_its_secrets_are_private(up):
    assert stat.S_IMODE(up.data.stat().st_mode) == 0o700
    for name in ("db.sqlite3", "secret_key", "setup-token"):
        assert stat.S_IMODE((up.data / name).stat().st_mode) == 0o600, name


def form_post(client: httpx.Client, path: str, **fields) -> httpx.Response:
    page = client.get(path)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return client.post(path, data={"csrfmiddlewaretoken": token, **fields})


def test_the_printed_setup_url_makes_the_first_administrator_once(up):
    url = re.search(r"(http://\S+/setup/\?token=(\S+))", "".join(up.lines))
    token = url.group(2)
    with httpx.Client(base_url=up.url) as c:
        assert token in c.get(url.group(1)).text  # the link fills the token in
        no_csrf = c.post("/setup/", data={"token": token, "username": "x", "password1": "p", "password2": "p"})
        assert no_csrf.status_code == 403  # forms carry CSRF tokens
        r = form_post(
            c, "/setup/", token=token, username="admin", password1="a long pass 42", password2="a long pass 42"
        )
        assert r.status_code == 302 and r.headers["location"] == "/panel/"
        assert c.get("/setup/").status_code == 410
        # /setup/ signed the administrator in: the admin index itself, with its style sheet
        assert "base.css" in c.get("/admin/").text and c.get("/static/admin/css/base.css").status_code == 200
    spent = subprocess.run(
        [sys.executable, "-m", "django", "setuptoken"],
        env={**up.env, "DJANGO_SETTINGS_MODULE": "appliance.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert spent.stdout.strip() == "" and not (up.data / "setup-token").exists()


LAN_CLIENT = r"""
import asyncio, json, re, sys
import httpx, websockets
a = json.loads(sys.argv[1])
url, out = a["url"], {}
out["no_key"] = httpx.get(url + "/v1/models").status_code
out["bad_key"] = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer anything"}).status_code
out["foreign_host"] = httpx.get(url + "/v1/models", headers={"Host": "attacker.example"}).status_code
r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": "Bearer " + a["key"]}, timeout=60,
               json={"model": a["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
out["with_key"] = r.status_code
auth = {"Authorization": "Bearer " + a["key"]}
out["foreign_origin"] = httpx.post(url + "/api/pull", json={"model": "owner/name"},
                                   headers={**auth, "Origin": "http://evil.example"}).status_code
out["text_plain"] = httpx.post(url + "/api/pull", content=b'{"model": "owner/name"}',
                               headers={**auth, "Content-Type": "text/plain"}).status_code
out["pull_etc_passwd"] = httpx.post(url + "/api/pull", json={"model": "/etc/passwd", "stream": False},
                                    headers=auth).status_code
inside = "http://127.0.0.1:" + url.rsplit(":", 1)[1] + "/x.gguf"  # the appliance's own web port, from inside
r = httpx.post(url + "/api/pull", json={"model": inside, "stream": False}, headers=auth, timeout=60)
out["pull_this_machine"] = [r.status_code, r.json()["error"]]
async def socket(headers):
    try:
        async with websockets.connect(url.replace("http", "ws") + "/ws/chat/", additional_headers=headers) as ws:
            await ws.send(json.dumps({"action": "send", "text": "hi", "new": {"model": a["model"], "max_tokens": 2}}))
            while True:
                ev = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if ev["t"] in ("final", "error"):
                    return ev["t"]
    except websockets.InvalidStatus as e:
        return e.response.status_code
out["socket_no_session"] = asyncio.run(socket({"Origin": url}))
with httpx.Client(base_url=url) as c:
    page = c.get("/admin/login/")
    tok = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    c.post("/admin/login/?next=/admin/", data={"csrfmiddlewaretoken": tok, "username": "admin",
                                             "password": "a long pass 42"})
    cookie = "sessionid=" + c.cookies["sessionid"]
out["socket_session_foreign_origin"] = asyncio.run(socket({"Origin": "http://evil.example", "Cookie": cookie}))
out["socket_session"] = asyncio.run(socket({"Origin": url, "Cookie": cookie}))
print(json.dumps(out))
"""


def test_a_lan_client_needs_a_key_for_the_api_and_a_session_for_the_chat_socket(up, lan):
    """Runs after the setup test, which made the administrator this client logs in as."""
    key = (
        subprocess.run(
            [sys.executable, "-m", "inference.cli", "up", "--create-api-key", "lan", "--scope", "admin"],
            env=up.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    got = lan.python(LAN_CLIENT, url=f"http://{lan.host_ip}:{up.port}", key=key, model=DEMO)
    assert got == {
        "no_key": 401,
        "bad_key": 401,
        "foreign_host": 400,
        "with_key": 200,
        "foreign_origin": 403,
        "text_plain": 415,
        "pull_etc_passwd": 400,
        "pull_this_machine": [403, "could not download from URL: refused by the pull policy"],
        "socket_no_session": 403,
        "socket_session_foreign_origin": 403,
        "socket_session": "final",
    }


def test_redis_killed_mid_stream_ends_the_stream_with_an_error_then_the_service_recovers(up):
    ask = {
        "model": DEMO,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 400,
        "stream": True,
    }
    events, killed, waiting = [], None, {}

    def queued():  # admitted behind the running one (the worker runs one at a time)
        r = httpx.post(
            f"{up.url}/api/chat", timeout=60, json={"model": DEMO, "messages": ask["messages"], "stream": False}
        )
        waiting.update(status=r.status_code, body=r.json(), at=time.monotonic())

    with httpx.stream("POST", f"{up.url}/v1/chat/completions", json=ask, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 2:
                second = threading.Thread(target=queued)
                second.start()
                time.sleep(0.5)
                up.child("redis-server").kill()
                killed = time.monotonic()
        ended = time.monotonic()
    second.join(30)
    print(
        f"\nstream: error event {ended - killed:.2f} s after the kill, after {len(events) - 1} chunks; "
        f"queued request: {waiting.get('status')} {waiting.get('at', killed) - killed:.2f} s after the kill"
    )
    assert killed is not None and "error" in events[-1], (len(events), events[-2:])
    assert "Redis" in events[-1]["error"]["message"]
    assert waiting["status"] == 503 and "Redis" in waiting["body"]["error"]
    tries = 0
    while True:
        tries += 1
        r = httpx.post(
            f"{up.url}/v1/chat/completions",
            timeout=30,
            json={"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        )
        if r.status_code == 200:
            break
        assert time.monotonic() - killed < 10, r.text
        time.sleep(0.2)
    recovered = time.monotonic() - killed
    print(f"\nrecovered {recovered:.1f} s after the kill ({tries} requests)")
    assert recovered < 10
    assert "the redis-server exited with status" in "".join(up.lines) and up.proc.poll() is None


def test_everything_the_service_wrote_is_private(up):
    """After the requests above: logs, database, prompt caches, the socket — nothing for other users."""
    seen = []
    for dirpath, dirnames, filenames in os.walk(up.data):  # the models/ link to the shared store is not followed
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink():
                assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
        for f in filenames:
            p = Path(dirpath) / f
            if p.is_file() and not p.is_symlink():
                assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
                seen.append(p.relative_to(up.data).as_posix())
    assert {"db.sqlite3", "secret_key", "logs/daphne.log", "logs/worker.log"} <= set(seen), seen
    print("\nprivate:", sorted(seen))
