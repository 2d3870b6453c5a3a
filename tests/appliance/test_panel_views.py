"""The admin panel's pages through Django's test client (the stack's database and Redis): who may see them, CSRF,
the settings form's checks and where a saved setting goes, the pages' content."""

import html
import json

import pytest

PAGES = [
    "/panel/",
    "/panel/models/",
    "/panel/models/smollm2/",
    "/panel/models/smollm2/delete/",
    "/panel/settings/",
    "/panel/keys/",
    "/panel/users/",
    "/panel/users/{pk}/password/",
    "/panel/sessions/",
]
POSTS = [
    "/panel/models/pull/",
    "/panel/models/smollm2/delete/",
    "/panel/models/smollm2/load/",
    "/panel/models/smollm2/default/",
    "/panel/models/smollm2/verify/board-a/",
    "/panel/settings/",
    "/panel/keys/",
    "/panel/keys/{pk}/revoke/",
    "/panel/keys/{pk}/scope/",
    "/panel/users/",
    "/panel/users/{pk}/active/",
    "/panel/sessions/prompt-cache/clear/",
]


@pytest.fixture
def people(django_for_stack):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    staff, _ = User.objects.update_or_create(username="panel-staff", defaults={"is_staff": True, "is_active": True})
    plain, _ = User.objects.update_or_create(username="panel-plain", defaults={"is_staff": False, "is_active": True})
    return staff, plain


@pytest.fixture
def clean_settings(django_for_stack, stack):
    from webui import config
    from webui.models import Setting

    yield
    Setting.objects.all().delete()
    config.save({})


def paths(people, which):
    return [p.format(pk=people[0].pk) for p in which]


def client(user=None, csrf=False):
    from django.test import Client

    c = Client(enforce_csrf_checks=csrf, HTTP_HOST="127.0.0.1")
    if user is not None:
        c.force_login(user)
    return c


def test_a_visitor_without_a_session_is_sent_to_the_login_page(people):
    for path in paths(people, PAGES) + paths(people, POSTS):
        r = client().post(path) if path in paths(people, POSTS) else client().get(path)
        assert r.status_code == 302 and r["Location"].startswith("/login/?next="), path


def test_a_signed_in_user_who_is_not_staff_gets_403_everywhere(people):
    _, plain = people
    for path in paths(people, PAGES) + paths(people, POSTS):
        r = client(plain).post(path) if path in paths(people, POSTS) else client(plain).get(path)
        assert r.status_code == 403, path


def test_staff_see_every_page(people):
    staff, _ = people
    for path in paths(people, PAGES):
        r = client(staff).get(path)
        assert r.status_code == 200, (path, r.status_code)
        assert b'href="/panel/settings/"' in r.content


def test_a_form_posted_without_its_csrf_token_is_refused(people):
    from webui.models import ApiKey

    staff, _ = people
    before = ApiKey.objects.count()
    r = client(staff, csrf=True).post("/panel/keys/", {"name": "forged"})
    assert r.status_code == 403 and ApiKey.objects.count() == before


def test_a_new_api_key_is_shown_once_and_stored_hashed(people):
    from webui.models import ApiKey, hash_key

    staff, _ = people
    r = client(staff).post("/panel/keys/", {"name": "panel-made"})
    key = r.content.decode().split('id="new-key-value">')[1].split("<")[0]
    assert key.startswith("rkm-") and ApiKey.objects.get(name="panel-made").digest == hash_key(key)
    assert key not in client(staff).get("/panel/keys/").content.decode()


def test_the_settings_form_refuses_what_the_environment_variable_would(people, clean_settings):
    staff, _ = people
    r = client(staff).post("/panel/settings/", {"queue_limit": "-3", "expert_slots": "0", "keep_alive": "soon"})
    page = html.unescape(r.content.decode())
    assert r.status_code == 400
    assert "must be at least 0" in page and "expert_slots='0' is out of range; allowed: an integer ≥ 1" in page
    assert "duration 'soon': write it like 30s" in page


def test_saved_settings_reach_the_web_side_and_redis_for_the_workers(people, clean_settings, stack, monkeypatch):
    from appliance import bus
    from webui import config

    monkeypatch.setenv("RKMOJO_API_KEYS", "always")  # as the stack's daphne has it
    staff, _ = people
    r = client(staff).post(
        "/panel/settings/",
        {
            "queue_limit": "3",
            "keep_alive": "5m",
            "expert_slots": "16",
            "memory_budget": "6G",
            "chat_open": "on",
            "api_keys": "",
        },
    )
    assert r.status_code == 302
    saved = json.loads(stack.r().get(bus.K_SETTINGS))
    assert saved == {
        "queue_limit": 3,
        "keep_alive": 300.0,
        "expert_slots": 16,
        "memory_budget": 6 * 2**30,
        "chat_open": True,
    }
    eff = config.current()
    assert eff["queue_limit"] == 3 and eff.values["queue_limit"].source == "saved"
    assert eff["api_keys"] == "always" and eff.values["api_keys"].source == "env"  # the stack sets RKMOJO_API_KEYS
    page = client(staff).get("/panel/settings/").content.decode()
    assert 'value="6G"' in page and 'value="5m"' in page and "RKMOJO_API_KEYS=always" in page


def test_users_are_created_disabled_and_given_a_new_password(people):
    from django.contrib.auth import get_user_model

    staff, _ = people
    User = get_user_model()
    User.objects.filter(username="bob").delete()
    c = client(staff)
    c.post("/panel/users/", {"username": "bob", "password1": "a fine passphrase 4", "password2": "a fine passphrase 4"})
    bob = User.objects.get(username="bob")
    assert not bob.is_staff and bob.check_password("a fine passphrase 4")
    c.post(f"/panel/users/{bob.pk}/active/", {"active": "0"})
    assert not User.objects.get(pk=bob.pk).is_active
    c.post(
        f"/panel/users/{bob.pk}/password/", {"new_password1": "another phrase 55", "new_password2": "another phrase 55"}
    )
    assert User.objects.get(pk=bob.pk).check_password("another phrase 55")
    r = c.post(f"/panel/users/{staff.pk}/active/", {"active": "0"}, follow=True)
    assert User.objects.get(pk=staff.pk).is_active and b"cannot disable your own" in r.content


def test_sessions_are_listed_viewed_and_deleted_with_their_text_escaped(people):
    from webui.models import ChatMessage, ChatSession

    staff, _ = people
    s = ChatSession.objects.create(model="smollm2", title="panel test <b>", source="openai", digest="x")
    ChatMessage.objects.create(session=s, index=0, role="user", content="<img src=x onerror=alert(1)>")
    c = client(staff)
    assert "panel test &lt;b&gt;" in c.get("/panel/sessions/?q=panel+test").content.decode()
    page = c.get(f"/panel/sessions/{s.pk}/").content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page
    c.post(f"/panel/sessions/{s.pk}/")
    assert not ChatSession.objects.filter(pk=s.pk).exists()


def test_the_prompt_cache_size_is_shown_and_cleared(people, stack):
    staff, _ = people
    d = stack.data / "prompt-cache" / "smollm2"
    d.mkdir(parents=True, exist_ok=True)
    (d / "abc.kv").write_bytes(b"\0" * 3 * 2**20)
    files, size = (0, 0)
    for kv in (stack.data / "prompt-cache").glob("*/*.kv"):  # the worker's own, saved by earlier tests, too
        files, size = files + 1, size + kv.stat().st_size
    c = client(staff)
    assert f"{files} file{'s' * (files != 1)}, {size / 2**20:.1f} MiB" in c.get("/panel/sessions/").content.decode()
    c.post("/panel/sessions/prompt-cache/clear/")
    assert not (d / "abc.kv").exists()
    assert "0 files, 0 B" in c.get("/panel/sessions/").content.decode()


def test_a_pull_of_an_unsupported_source_is_one_clear_message(people):
    staff, _ = people
    r = client(staff).post("/panel/models/pull/", {"source": "ftp://example.org/x.gguf"}, follow=True)
    assert r.status_code == 200 and b'<li class="error">ftp: URLs are taken as http:// or https:// only' in r.content


def test_djangos_admin_is_served_with_its_style_sheets(people, stack):
    import httpx

    staff, _ = people
    r = client(staff).get("/admin/")
    assert r.status_code == 200 and b"/static/admin/css/base.css" in r.content
    css = httpx.get(f"{stack.url}/static/admin/css/base.css", timeout=30)  # through daphne and WhiteNoise
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]


def test_a_model_is_unloaded_loaded_and_made_the_default(people, stack, clean_settings):
    from webui import config

    staff, _ = people
    c = client(staff)

    def loaded():
        return [m["name"] for m in stack.registration("board-a")["loaded"]]

    r = c.post("/panel/models/smollm2/load/", {"unload": "1"}, follow=True)
    assert b"Unloaded smollm2." in r.content and loaded() == []
    r = c.post("/panel/models/smollm2/load/", follow=True)
    assert b"Loaded smollm2." in r.content and loaded() == ["smollm2"]
    c.post("/panel/models/smollm2/default/")
    assert config.current()["default_model"] == "smollm2"
    page = c.get("/panel/models/").content.decode()
    assert '<span class="badge">default</span>' in page
    # what runs the loaded model's prefill, and why: here the CPU, as the worker registered it
    loaded = stack.registration("board-a")["loaded"][0]
    assert loaded["backend"] == "cpu" and loaded["backend_reason"]  # "auto: x86_64 has no RK3588 NPU"
    assert f'data-backend="cpu">prefill on the CPU</span> <small class="muted">({loaded["backend_reason"]})' in page


def test_the_first_administrator_lands_on_the_panel_signed_in(django_for_stack, stack):
    import re

    import httpx
    from django.contrib.auth import get_user_model

    get_user_model().objects.all().delete()  # a fresh appliance (the fixtures above make their users again)
    (stack.data / "setup-done").unlink(missing_ok=True)
    token = stack.base / "setup-token"
    token.write_text("Zq3vR8kTn2WcY5hLp7Xa\n")
    try:
        with httpx.Client(base_url=stack.url, timeout=30) as browser:
            form = browser.get("/setup/").text
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
            r = browser.post(
                "/setup/",
                data={
                    "csrfmiddlewaretoken": csrf,
                    "token": "Zq3vR8kTn2WcY5hLp7Xa",
                    "username": "first",
                    "password1": "a long passphrase 7",
                    "password2": "a long passphrase 7",
                },
            )
            assert r.status_code == 302 and r.headers["location"] == "/panel/"
            panel = browser.get("/panel/")
            assert panel.status_code == 200 and "<h1>Live" in panel.text
    finally:
        token.unlink(missing_ok=True)
