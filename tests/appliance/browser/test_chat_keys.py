"""The chat page's keyboard in real Chromium against the real stack: Esc stops a real answer, Ctrl+Shift+O
opens a new chat, `/` goes to the search, `?` (or the "?" button) opens the list of shortcuts, a modal
dialog that Esc, its Close button or a click beside it closes."""

from __future__ import annotations

import time

from playwright.sync_api import expect

from .conftest import SHOTS, shot, sign_in
from .test_chat_page import ANSWERED, new_chat, store


def test_esc_stops_the_answer_and_frees_the_worker(page, users, stack):
    sign_in(page, "alice")
    new_chat(page, "Write a very long story about a dragon and a knight.", max_tokens=400)
    page.wait_for_function("() => window.chatStats.renders >= 2", timeout=60000)
    page.keyboard.press("Escape")  # the focus is still in the message box
    pressed = time.monotonic()
    stack.idle(timeout=5)
    freed = time.monotonic() - pressed
    page.wait_for_selector(ANSWERED)
    assert freed < 1.0, f"the worker was still busy {freed:.2f} s after Esc"
    assert "stopped" in page.locator(ANSWERED).inner_text()
    expect(page.locator("#stop")).to_be_hidden()
    page.keyboard.press("Escape")  # nothing to stop: nothing happens
    expect(page.locator("#status")).to_have_text("")


def test_slash_goes_to_the_search_and_ctrl_shift_o_to_a_new_chat(page, users, stack):
    s = store(users["alice"], [("user", "Hello"), ("assistant", "Hi!")], title="keys")
    sign_in(page, "alice")
    page.goto(f"/chat/{s.pk}/")
    box = page.locator("#composer textarea[name=text]")
    box.fill("a/b")
    box.press("/")  # typing: a slash like any other
    assert box.input_value() == "a/b/"
    page.locator("li.msg.assistant .body").click()
    page.keyboard.press("/")
    search = page.locator(".chats input[name=q]")
    expect(search).to_be_focused()
    assert search.input_value() == ""
    search.fill("keys")
    search.press("Control+Shift+O")  # from anywhere, even a field
    page.wait_for_url("**/chat/")
    expect(page.locator("#new-chat h1")).to_have_text("New chat")


def test_the_shortcuts_dialog_opens_with_a_key_or_its_button_and_closes_with_esc_close_or_a_click_beside(
    page, users, stack
):
    s = store(users["alice"], [("user", "Hello"), ("assistant", "Hi!")], title="shortcuts")
    sign_in(page, "alice")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/chat/{s.pk}/")
    dialog = page.locator("dialog#shortcuts")
    expect(dialog).to_be_hidden()
    page.keyboard.press("?")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("heading")).to_have_text("Keyboard shortcuts")
    expect(dialog.locator("tr")).to_have_count(6)
    expect(dialog.locator("tr", has_text="stop the answer")).to_contain_text("Esc")
    expect(dialog.get_by_role("button", name="Close")).to_be_focused()
    shot(page, "chat-shortcuts")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    opener = page.locator("#shortcuts-open")
    opener.click()
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Close").press("Enter")
    expect(dialog).to_be_hidden()
    expect(opener).to_be_focused()  # back where it was opened from
    opener.click()
    page.mouse.click(10, 450)  # the backdrop, beside the dialog
    expect(dialog).to_be_hidden()


def test_the_shortcuts_dialog_and_the_search_key_on_a_phone(phone, users, stack):
    s = store(users["alice"], [("user", "Hello"), ("assistant", "Hi!")], title="phone keys")
    sign_in(phone, "alice")
    phone.goto(f"/chat/{s.pk}/")
    phone.locator("#shortcuts-open").click()
    dialog = phone.locator("dialog#shortcuts")
    expect(dialog).to_be_visible()
    box = dialog.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 360, box
    phone.screenshot(path=str(SHOTS / "chat-shortcuts-phone.png"))  # the screen as it is: a modal dialog
    phone.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(phone.locator("aside.chats")).to_be_hidden()
    phone.keyboard.press("/")  # a phone with a keyboard: the folded list opens at its search
    expect(phone.locator(".chats input[name=q]")).to_be_focused()
