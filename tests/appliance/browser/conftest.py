"""Real headless Chromium against the real stack (daphne, worker, Redis from `tests/appliance/conftest.py`).

Debian's `/usr/bin/chromium` (`scripts/setup --test` installs it), driven by Playwright's Python API; its own
browser download is never used. Every request to a host other than the stack's loopback address is
aborted and recorded, and a page with a JavaScript error fails its test: the pages must work offline.

- `users`: a staff user `admin` and a plain user `alice` (password `PASSWORD`), made afresh per test.
- `page`: a desktop-sized page; `phone`: 360×740. Both fail the test at teardown on a blocked request
  or an uncaught script error.
- `sign_in(page, stack, name)`: through the real login form.
- `shot(page, name)`: a full-page PNG under `$RKMOJO_TEST_OUTPUT/screenshots` (default
  `test-output/screenshots` in the checkout).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct horse battery 9"
ROOT = Path(__file__).resolve().parents[3]
SHOTS = Path(os.environ.get("RKMOJO_TEST_OUTPUT", ROOT / "test-output")) / "screenshots"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 360, "height": 740}


@pytest.fixture(autouse=True)
def orm_beside_playwright(monkeypatch):
    """Playwright's sync API keeps an event loop on this thread, and Django's ORM then refuses to run here
    unless told that no coroutine of that loop uses the ORM meanwhile, which holds for these tests."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="package")  # its event loop must be gone before other tests call asyncio.run
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `scripts/setup --test` (it installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def users(django_for_stack):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    made = {}
    for name, staff in (("admin", True), ("alice", False)):
        u, _ = User.objects.get_or_create(username=name)
        u.is_staff = u.is_superuser = staff
        u.is_active = True
        u.set_password(PASSWORD)
        u.save()
        made[name] = u
    return made


class Guard:
    """What a page tried that it must not: requests off the loopback host, uncaught script errors."""

    def __init__(self, host: str):
        self.host, self.blocked, self.errors = host, [], []

    def route(self, route):
        host = urllib.parse.urlsplit(route.request.url).hostname
        if host == self.host or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def check(self):
        assert not self.blocked, f"the page asked for non-local URLs: {self.blocked}"
        assert not self.errors, f"script errors on the page: {self.errors}"


def _page(chromium, stack, viewport):
    ctx = chromium.new_context(viewport=viewport, base_url=stack.url)
    guard = Guard(urllib.parse.urlsplit(stack.url).hostname)
    ctx.route("**/*", guard.route)
    page = ctx.new_page()
    page.on("pageerror", lambda e: guard.errors.append(str(e)))
    page.set_default_timeout(15000)
    return ctx, page, guard


@pytest.fixture
def page(chromium, stack):
    ctx, page, guard = _page(chromium, stack, DESKTOP)
    yield page
    ctx.close()
    guard.check()


@pytest.fixture
def phone(chromium, stack):
    ctx, page, guard = _page(chromium, stack, PHONE)
    yield page
    ctx.close()
    guard.check()


def sign_in(page, name: str, password: str = PASSWORD, next_path: str = "/chat/"):
    page.goto(f"/login/?next={next_path}")
    page.fill("#id_username", name)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"**{next_path}")


def shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


class AnsweredSocket:
    """The chat page's WebSocket answered by the test instead of the server: `sent` holds what the page
    sent, `emit(event)` sends it an event (an `appliance.events` model or a dict)."""

    def __init__(self, page):
        self.sockets, self.sent = [], []
        page.route_web_socket("**/ws/chat/", self._answer)

    def _answer(self, ws):
        import json

        self.sockets.append(ws)
        ws.on_message(lambda text: self.sent.append(json.loads(text)))

    def emit(self, ev) -> None:
        import json

        from appliance.events import as_dict

        self.sockets[0].send(json.dumps(ev if isinstance(ev, dict) else as_dict(ev)))
