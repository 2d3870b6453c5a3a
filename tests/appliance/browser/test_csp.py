"""Every page in Chromium under its Content-Security-Policy (`webui/headers.py`) with nothing refused.

The browser reports what the policy refuses twice: a `securitypolicyviolation` event in the page (watched
from before the page's first script) and a console message "… violates the following Content Security
Policy directive …". Each page is opened, used where it has something to use (the setup form, "Load earlier
messages" with math that KaTeX typesets, a chat answer streamed over the socket, the shortcuts dialog, an
attached file, the live panel's socket, a new API key, the admin's forms), and fails its test on either
report.
"""

from __future__ import annotations

import pytest

from .conftest import PASSWORD, sign_in

WATCH = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.cspViolations.push(`${e.violatedDirective} refused ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
});
"""


class Watch:
    def __init__(self, page):
        self.page, self.console = page, []
        page.add_init_script(WATCH)  # run by the browser itself, not subject to the policy
        page.on("console", self._console)

    def _console(self, msg):
        if "Content Security Policy" in msg.text:
            self.console.append(f"{self.page.url}: {msg.text}")

    def check(self, what: str = "") -> None:
        """Fail on anything refused on the current page so far."""
        self.page.wait_for_timeout(150)  # a refusal is reported as a task after the thing refused
        events = self.page.evaluate("window.cspViolations || []")
        assert not events and not self.console, f"{what or self.page.url}: {events} {self.console}"

    def visit(self, path: str) -> None:
        response = self.page.goto(path)
        assert response.status < 400 or response.status == 410, (path, response.status)
        self.page.wait_for_load_state("load")
        self.check(path)


@pytest.fixture
def watch(page):
    return Watch(page)


def store(user, n: int, title: str):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=user, source="web", model="smollm2", title=title)
    ChatMessage.objects.bulk_create(
        [
            ChatMessage(
                session=s,
                index=i,
                role=("user", "assistant")[i % 2],
                content=f"message {i}, $x_{{{i}}}^2$\n\n```python\nprint({i})\n```" if i % 2 else f"question {i}",
            )
            for i in range(n)
        ]
    )
    return s


def test_the_signed_out_pages_and_the_setup_form(watch, django_for_stack, stack):
    from django.contrib.auth import get_user_model

    get_user_model().objects.all().delete()  # a fresh appliance; `users` makes them again for the next test
    (stack.data / "setup-done").unlink(missing_ok=True)
    token = stack.base / "setup-token"
    token.write_text("Zq3vR8kTn2WcY5hLp7Xa\n")
    try:
        watch.visit("/login/")
        watch.visit("/admin/login/")
        watch.visit("/setup/?token=Zq3vR8kTn2WcY5hLp7Xa")
        page = watch.page
        page.fill("#id_username", "csp-admin")
        page.fill("#id_password1", PASSWORD)
        page.fill("#id_password2", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url("**/panel/")
        watch.check("the panel after setup")
        watch.visit("/setup/")  # closed now: 410, the same page's other face
    finally:
        token.unlink(missing_ok=True)


def test_the_chat_pages_load_earlier_and_stream_an_answer(watch, users):
    page = watch.page
    long = store(users["alice"], 250, "a long one")
    sign_in(page, "alice")
    watch.check("/chat/")
    watch.visit(f"/chat/{long.pk}/")
    assert page.locator("#messages li.msg").count() == 100 and page.locator("button.copy").count() == 50
    page.click("text=Load earlier messages")
    page.wait_for_selector("#m149")
    assert page.locator("#messages li.msg").count() == 200 and "?before=" not in page.url
    assert page.locator("#m149 .math .katex").count() == 1  # typeset on htmx:load
    watch.check("load earlier")
    page.keyboard.press("?")
    page.get_by_role("button", name="Close").click()
    page.set_input_files("#attach-file", files=[{"name": "a.log", "mimeType": "text/plain", "buffer": b"ok\n" * 400}])
    page.wait_for_function("() => document.querySelector('#composer textarea').value.startsWith('```a.log')")
    watch.check("the shortcuts dialog and an attachment")
    watch.visit("/chat/")
    page.click("details.settings summary")
    page.fill("#id_max_tokens", "8")
    page.fill("#composer textarea[name=text]", "Say hello.")
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_selector("li.msg.assistant:not(.streaming) .metrics", timeout=60000)
    watch.check("a streamed answer")


def test_the_panel_pages_and_their_sockets(watch, users):
    page = watch.page
    long = store(users["alice"], 150, "for the transcript")
    sign_in(page, "admin", next_path="/panel/")
    page.wait_for_timeout(1500)  # the live view's socket and a few samples
    watch.check("/panel/")
    for path in (
        "/panel/models/",
        "/panel/models/smollm2/",
        "/panel/models/smollm2/delete/",
        "/panel/settings/",
        "/panel/users/",
        f"/panel/users/{users['alice'].pk}/password/",
        "/panel/sessions/",
    ):
        watch.visit(path)
    watch.visit(f"/panel/sessions/{long.pk}/")
    page.click("text=Load earlier messages")
    page.wait_for_function("() => document.querySelectorAll('.transcript li.msg').length === 150")
    watch.check("the transcript's earlier messages")
    watch.visit("/panel/keys/")
    page.fill("#id_name", "csp-key")
    page.click("form.card button[type=submit]")
    page.wait_for_selector("#new-key-value")
    page.click("#copy-key")
    watch.check("a new key")


def test_djangos_admin_under_the_same_policy(watch, users):
    page = watch.page
    chat = store(users["alice"], 4, "in the admin")
    sign_in(page, "admin", next_path="/admin/")
    watch.check("/admin/")
    for path in (
        "/admin/auth/user/",
        f"/admin/auth/user/{users['alice'].pk}/change/",
        "/admin/auth/user/add/",
        "/admin/webui/apikey/add/",
        "/admin/webui/chatsession/",
        f"/admin/webui/chatsession/{chat.pk}/change/",  # its messages inline (inlines.js)
    ):
        watch.visit(path)
    page.goto(f"/admin/auth/user/{users['alice'].pk}/change/")
    page.click("text=Save and continue editing")
    page.wait_for_selector(".messagelist")
    watch.check("an admin form saved")
