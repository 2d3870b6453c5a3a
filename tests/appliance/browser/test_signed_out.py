"""Signing out in one tab closes the other tabs' sockets (close code 4401, `webui.socket_auth`): the chat
page and the live view say "Signed out — sign in again" with a link to the login page, and stop there."""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from .conftest import shot, sign_in


def test_signing_out_in_one_tab_signs_the_chat_and_live_tabs_out_and_stops_the_answer(page, users, stack):
    sign_in(page, "admin")
    live = page.context.new_page()
    with live.expect_websocket() as socket:
        live.goto("/panel/")
    socket.value.wait_for_event("framereceived", timeout=15000)  # stats come each second: it is open
    page.fill("#composer textarea[name=text]", "Write a very long story about a dragon and a knight.")
    page.press("#composer textarea[name=text]", "Enter")
    streaming = page.locator("li.msg.assistant.streaming .body")
    expect(streaming).to_contain_text(re.compile(r"\w+ \w+"), timeout=60000)  # (no page scripts: the CSP)

    other = page.context.new_page()
    other.goto("/chat/")
    other.click("text=Sign out")
    other.wait_for_url("**/login/")
    signed_out = time.monotonic()
    stack.idle(timeout=5)
    freed = time.monotonic() - signed_out

    expect(page.locator("#status")).to_have_text("Signed out — sign in again.", timeout=2000)
    link = page.locator("#status a")
    assert link.get_attribute("href") == "/login/?next=" + page.url.split(stack.url)[1].replace("/", "%2F")
    assert not page.locator("#stop").is_visible() and page.locator("li.msg.assistant.streaming").count() == 0
    expect(live.locator("#live-status")).to_have_text("Signed out — sign in again", timeout=2000)
    assert freed < 1.0, f"the worker still ran the answer {freed:.2f} s after signing out"
    # the page sends nothing more; what was typed stays
    page.fill("#composer textarea[name=text]", "Are you there?")
    page.press("#composer textarea[name=text]", "Enter")
    assert page.locator("#composer textarea[name=text]").input_value() == "Are you there?"
    shot(page, "chat-signed-out")
    live.wait_for_timeout(1000)  # no reconnecting
    expect(live.locator("#live-status")).to_have_text("Signed out — sign in again")
    link.click()
    page.wait_for_url("**/login/?next=*")
