"""Attachments on the chat page in real Chromium against the real stack (`static/webui/chat-attach.js`): a
text file goes into the message being written as a fenced block named after it, the gauge counts it
before it is sent, and the worker's prompt holds it; an image, a binary file and one over the limit are
refused with the reason."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from .conftest import SHOTS, shot, sign_in
from .test_chat_page import ANSWERED, new_chat
from .test_csp import Watch

CONF = """# rkmojo test service
[server]
listen = 0.0.0.0
port = 8471
workers = 3
log_level = debug

[storage]
path = /var/lib/example
max_size_mb = 2048
"""


def prompt_tokens(answer) -> int:
    """The worker's prompt tokens for an answer, as its final event reported them (the metrics line)."""
    return int(re.search(r"prompt (\d+)", answer.locator("[data-m=prompt]").inner_text())[1])


def test_a_text_file_goes_into_the_message_counted_in_the_gauge_and_reaches_the_worker(page, users, stack):
    from webui.models import ChatMessage

    watch = Watch(page)
    sign_in(page, "alice")
    page.set_viewport_size({"width": 1280, "height": 900})
    new_chat(page, "Say hi.", max_tokens=4, temperature="0")
    page.wait_for_selector(ANSWERED, timeout=60000)
    before = prompt_tokens(page.locator("li.msg.assistant").last)
    used = page.locator("#gauge-text").inner_text()

    with page.expect_file_chooser() as chooser:
        page.click("#attach")
    chooser.value.set_files(files=[{"name": "service.conf", "mimeType": "text/plain", "buffer": CONF.encode()}])
    box = page.locator("#composer textarea[name=text]")
    expect(box).to_have_value(f"```service.conf\n{CONF}```\n\n")
    expect(page.locator("#status")).to_have_text(re.compile(r"^Attached service\.conf \(\d+ bytes\)"))
    gauge = page.locator("#gauge-text")
    expect(gauge).to_have_text(re.compile(r"^\d+ \+ ≈\d+ / 512 tokens$"))  # counted before it is sent
    estimate = int(re.search(r"≈(\d+)", gauge.inner_text())[1])
    box.press("End")
    box.type("Which port?")
    watch.check("an attachment")
    shot(page, "chat-attach")
    box.press("Enter")
    page.wait_for_function(f"() => document.querySelectorAll({ANSWERED!r}).length == 2", timeout=60000)
    after = prompt_tokens(page.locator("li.msg.assistant").last)
    # the prompt grew by the file (and the question): the worker read it; the gauge's estimate was near
    grown = after - before
    assert grown > 60 and 0.5 < estimate / grown < 2, (before, after, estimate, used)
    sent = ChatMessage.objects.filter(role="user").order_by("-id").first().content
    assert sent == f"```service.conf\n{CONF}```\n\nWhich port?"
    expect(page.locator("li.msg.user").last.locator(".code .lang")).to_have_text("service.conf")
    expect(page.locator("#gauge-text")).not_to_contain_text("≈")  # sent: the message box is empty again
    watch.check("an attachment sent")
    shot(page, "chat-attach-sent")
    page.set_viewport_size({"width": 360, "height": 740})
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 360
    page.evaluate("document.scrollingElement.scrollTop = document.scrollingElement.scrollHeight")
    page.screenshot(path=str(SHOTS / "chat-attach-sent-phone.png"))  # the screen: the composer is sticky


def test_an_image_a_binary_file_and_one_over_the_limit_are_refused_with_the_reason(page, users, stack):
    sign_in(page, "alice")
    page.goto("/chat/")
    box = page.locator("#composer textarea[name=text]")
    box.fill("keep me")
    status = page.locator("#status")
    for name, mime, data, reason in (
        (
            "photo.png",
            "image/png",
            b"\x89PNG\r\n\x1a\n" + bytes(64),
            "images are not supported while no vision model is",
        ),
        ("core.bin", "application/octet-stream", b"ELF\x00\x01\x02", "is not a text file (it holds NUL bytes)"),
        ("latin1.txt", "text/plain", "café".encode("latin-1"), "is not a text file (it is not valid UTF-8)"),
        (
            "huge.log",
            "text/plain",
            b"x" * (256 * 1024 + 1),
            "is too large (257 KB): an attachment may be at most 256 KB",
        ),
    ):
        page.set_input_files("#attach-file", files=[{"name": name, "mimeType": mime, "buffer": data}])
        expect(status).to_contain_text(reason)
        expect(status).to_contain_text(name)
        expect(status).to_have_class(re.compile(r"\berror\b"))
        assert box.input_value() == "keep me"
    page.set_viewport_size({"width": 360, "height": 740})
    shot(page, "chat-attach-refused-phone")


def test_a_file_dropped_on_the_message_box_is_attached_at_the_caret(page, users, stack):
    sign_in(page, "alice")
    page.goto("/chat/")
    box = page.locator("#composer textarea[name=text]")
    box.fill("Explain this:")
    page.evaluate(
        """() => {
            const dt = new DataTransfer();
            dt.items.add(new File(["print('hi')\\n"], "hello world.py", { type: "text/x-python" }));
            document.querySelector('#composer textarea').dispatchEvent(
                new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
        }"""
    )
    expect(box).to_have_value("Explain this:\n\n```hello_world.py\nprint('hi')\n```\n\n")
    expect(page.locator("#model-info")).to_contain_text("this message ≈")  # a new chat: beside the model
