"""Every response carries the Content-Security-Policy, the pages that show a secret `no-store`, and the
favicon is served; no template holds what the policy refuses (inline scripts, styles, handlers)."""

import re
from pathlib import Path

import httpx
import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "webui" / "templates"
POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self' ws://{host} wss://{host}; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)


@pytest.fixture
def staff(django_for_stack):
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.update_or_create(username="headers-staff", defaults={"is_staff": True})
    return user


def client_of(user=None):
    from django.test import Client

    c = Client(HTTP_HOST="127.0.0.1")
    if user is not None:
        c.force_login(user)
    return c


def test_every_page_api_answer_and_static_file_carries_the_policy(stack, session_cookie):
    cookie = {"Cookie": session_cookie("headers-user")}
    host = stack.url.removeprefix("http://")
    for path, headers in [
        ("/login/", {}),
        ("/chat/", cookie),
        ("/admin/login/", {}),
        ("/static/webui/chat.js", {}),
        ("/static/webui/favicon.svg", {}),
        ("/api/version", {}),
    ]:
        r = httpx.get(stack.url + path, headers=headers)
        assert r.status_code == 200, path
        assert r.headers["Content-Security-Policy"] == POLICY.format(host=host), path


def test_the_pages_that_show_a_secret_are_never_stored(staff, stack):
    r = client_of(staff).post("/panel/keys/", {"name": "headers-key"})
    assert 'id="new-key-value">rkm-' in r.content.decode()
    assert "no-store" in r["Cache-Control"] and "private" in r["Cache-Control"]
    for path in ("/panel/keys/", "/panel/users/", "/panel/sessions/"):
        assert "no-store" in client_of(staff).get(path)["Cache-Control"], path
    setup = httpx.get(f"{stack.url}/setup/?token=anything")  # 404, 410 or the form: never kept
    assert "no-store" in setup.headers["Cache-Control"]
    assert "no-store" not in client_of(staff).get("/chat/").get("Cache-Control", "")


def test_the_favicon_is_linked_and_served(stack):
    login = httpx.get(f"{stack.url}/login/").text
    assert '<link rel="icon" href="/static/webui/favicon.svg" type="image/svg+xml">' in login
    r = httpx.get(f"{stack.url}/favicon.ico")  # what a page without a link (the admin's) asks for
    assert r.status_code == 301 and r.headers["Location"] == "/static/webui/favicon.svg"
    svg = httpx.get(f"{stack.url}/static/webui/favicon.svg")
    assert svg.status_code == 200 and svg.headers["Content-Type"].startswith("image/svg+xml")
    assert "<script" not in svg.text


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I), "a <script> with code"),
    (re.compile(r"<style\b", re.I), "a <style> block"),
    (re.compile(r"\sstyle=", re.I), "a style attribute"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "an on… handler"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
]


def test_no_template_holds_what_the_policy_refuses():
    found = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        text = path.read_text()
        for pattern, what in INLINE:
            found += [f"{path.relative_to(TEMPLATES)}: {what}: {m.group(0)!r}" for m in pattern.finditer(text)]
    assert not found, "\n".join(found)


def test_the_memory_bar_is_drawn_with_classes_not_style_attributes():
    from types import SimpleNamespace

    from webui.templatetags.panel import membar

    mem = SimpleNamespace(total=1000, dense=500, kv=250, expert_slots=0, prefetch_slots=0, runtime=4, free=246)
    html = str(membar(mem))
    assert "style=" not in html and 'class="mem mem-dense w50"' in html and 'class="mem mem-runtime w0"' in html
