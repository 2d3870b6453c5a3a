"""API key scopes on the real stack: a chat key chats and lists but may not pull, delete, load or unload
(403 naming its scope); an admin key may; the panel and `rkmojo up --create-api-key --scope` set the scope."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture
def key(django_for_stack):
    """`key(scope)`: a new API key of that scope, as its plain text."""
    from webui.models import ApiKey

    made = []

    def make(scope: str) -> str:
        k, plain = ApiKey.create(f"scopes-{scope}-{len(made)}", scope)
        made.append(k.pk)
        return plain

    yield make
    ApiKey.objects.filter(pk__in=made).delete()


def client(stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def loaded(stack) -> list[str]:
    with client(stack, stack.key) as c:
        return [m["model"] for m in c.get("/api/ps").json()["models"]]


def test_a_chat_key_is_refused_pull_and_delete_with_a_403_naming_its_scope(stack, key):
    with client(stack, key("chat")) as c:
        r = c.post("/api/pull", json={"model": "owner/name", "stream": False})
        assert r.status_code == 403
        assert r.json()["error"].startswith("this API key has scope chat; pull needs an admin key")
        r = c.request("DELETE", "/api/delete", json={"model": "smollm2"})
        assert r.status_code == 403 and "delete needs an admin key" in r.json()["error"]
        assert any(m["model"] == "smollm2" for m in c.get("/api/tags").json()["models"])  # still there


def test_a_chat_key_chats_and_lists_with_its_keep_alive_but_an_explicit_load_or_unload_needs_admin(stack, key):
    with client(stack, key("chat")) as c:
        # Home Assistant's and Open WebUI's chats carry keep_alive: a chat key's to set
        r = c.post("/api/chat", json={"model": "smollm2", "messages": ASK, "stream": False, "keep_alive": -1})
        assert r.status_code == 200 and r.json()["done"]
        r = c.post("/v1/chat/completions", json={"model": "smollm2", "messages": ASK, "max_tokens": 2})
        assert r.status_code == 200
        for path in ("/api/tags", "/api/ps", "/v1/models", "/api/version"):
            assert c.get(path).status_code == 200, path
        assert c.post("/api/show", json={"model": "smollm2"}).status_code == 200
        r = c.post("/api/generate", json={"model": "smollm2", "prompt": "", "stream": False})
        assert r.status_code == 403 and r.json()["error"].startswith("this API key has scope chat; load")
        r = c.post("/api/chat", json={"model": "smollm2", "messages": [], "keep_alive": 0, "stream": False})
        assert r.status_code == 403 and r.json()["error"].startswith("this API key has scope chat; unload")
    assert "smollm2" in loaded(stack)  # the refused unload did nothing


def create_api_key(stack, name: str, scope: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "inference.cli", "up", "--create-api-key", name, "--scope", scope]
    return subprocess.run(argv, env=stack.env, cwd=ROOT, capture_output=True, text=True)


def test_an_admin_key_made_by_rkmojo_up_may_load_unload_pull_and_delete(stack, django_for_stack):
    from webui.models import ApiKey

    made = create_api_key(stack, "ops", "admin")
    assert made.returncode == 0, made.stderr
    plain = made.stdout.strip().splitlines()[-1]
    assert ApiKey.objects.get(name="ops").scope == "admin"
    try:
        with client(stack, plain) as c:
            r = c.post("/api/generate", json={"model": "smollm2", "prompt": "", "keep_alive": 0, "stream": False})
            assert r.status_code == 200 and r.json()["done_reason"] == "unload"
            r = c.post("/api/generate", json={"model": "smollm2", "prompt": "", "stream": False})
            assert r.status_code == 200 and r.json()["done_reason"] == "load"
            # past the scope check, to the model's own answers
            r = c.post("/api/pull", json={"model": "no-such-file.gguf", "stream": False})
            assert r.status_code == 400 and "import" in r.json()["error"]
            r = c.request("DELETE", "/api/delete", json={"model": "no-such-model"})
            assert r.status_code == 404
    finally:
        ApiKey.objects.filter(name="ops").delete()
    bad = create_api_key(stack, "ops", "root")
    assert bad.returncode != 0 and "'chat', 'admin'" in bad.stderr
    assert not ApiKey.objects.filter(name="ops").exists()


def test_the_panel_sets_a_keys_scope_and_the_api_follows_it(stack, django_for_stack):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webui.models import ApiKey

    staff, _ = get_user_model().objects.get_or_create(username="scopes-admin", defaults={"is_staff": True})
    panel = Client(HTTP_HOST="127.0.0.1")
    panel.force_login(staff)
    try:
        r = panel.post("/panel/keys/", {"name": "scopes-panel", "scope": "admin"})
        plain = r.content.decode().split('id="new-key-value">')[1].split("<")[0]
        k = ApiKey.objects.get(name="scopes-panel")
        assert k.scope == "admin"
        page = panel.get("/panel/keys/").content.decode()
        row = page.split(f'data-key="{k.prefix}"')[1].split("</tr>")[0]
        assert "<option selected>admin</option>" in row
        with client(stack, plain) as c:
            assert c.post("/api/generate", json={"model": "smollm2", "prompt": "", "stream": False}).status_code == 200
            assert panel.post(f"/panel/keys/{k.pk}/scope/", {"scope": "chat"}).status_code == 302
            r = c.post("/api/pull", json={"model": "owner/name", "stream": False})
            assert r.status_code == 403 and "scope chat" in r.json()["error"]
        assert panel.post(f"/panel/keys/{k.pk}/scope/", {"scope": "root"}).status_code == 302
        assert ApiKey.objects.get(pk=k.pk).scope == "chat"  # refused, with a message
        assert panel.post("/panel/keys/", {"name": "scopes-bad", "scope": "root"}).status_code == 400
    finally:
        ApiKey.objects.filter(name__startswith="scopes-").delete()
        staff.delete()


def test_a_new_key_is_a_chat_key(django_for_stack):
    from webui.models import ApiKey

    k, _ = ApiKey.create("scopes-default")
    try:
        assert k.scope == "chat" and not k.allows("admin") and k.allows("chat")
    finally:
        k.delete()
