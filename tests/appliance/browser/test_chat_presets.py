"""Presets and the conversation list in real Chromium against the real stack: a preset made on its page,
picked for a new chat (the script fills the fields) and applied to an existing conversation, each proved by
the next answer's request as the worker saw it (its max tokens reached, its system prompt in the prompt's
token count); pinning without a reload; ticking conversations to export and delete them.

Screenshots at 1280 × 900 and 360 × 740: the presets page, a new chat with a preset picked, a conversation's
"Settings and presets", the list with a pinned conversation and the bulk actions."""

from __future__ import annotations

import json

from .conftest import shot, sign_in
from .test_chat_page import ANSWERED, store

WIDE = {"width": 1280, "height": 900}
PIRATE = (
    "You are Captain Tokenbeard, a pirate of the seven seas. Answer every question the way an old pirate "
    "would: say arr, speak of your ship, your crew and the treasure you buried on a faraway island."
)


def _preset(owner, name="Pirate, briefly", max_tokens=3):
    from webui.models import Preset

    Preset.objects.filter(owner=owner).delete()
    return Preset.objects.create(
        owner=owner, name=name, system=PIRATE, params={"temperature": 0.0, "max_tokens": max_tokens}
    )


def _answer(session):
    return session.messages.filter(role="assistant").order_by("-index").first()


def test_a_preset_made_on_its_page_and_picked_for_a_new_chat_reaches_the_worker(page, users, stack):
    from webui.models import ChatSession, Preset

    Preset.objects.filter(owner=users["alice"]).delete()
    page.set_viewport_size(WIDE)
    sign_in(page, "alice")
    page.goto("/chat/presets/")
    page.fill("#id_name", "Pirate, briefly")
    page.fill("#id_system", PIRATE)
    page.fill("#id_temperature", "0")
    page.fill("#id_max_tokens", "3")
    page.click("#preset-form button[type=submit]")
    page.wait_for_selector(".messages >> text=saved the preset")
    mine = Preset.objects.get(owner=users["alice"], name="Pirate, briefly")
    assert mine.params == {"temperature": 0.0, "max_tokens": 3}
    assert page.locator("#my-presets li").count() == 1 and page.locator("#builtin-presets li").count() == 3
    shot(page, "chat-presets")

    page.goto("/chat/")
    page.click("details.settings summary")
    assert not page.locator("#preset-pick-apply").is_visible()  # the script fills the fields at once
    page.select_option("#preset-pick", str(mine.pk))
    assert page.locator("#id_system").input_value() == PIRATE
    assert page.locator("#id_max_tokens").input_value() == "3" and page.locator("#id_temperature").input_value() == "0"
    page.select_option("#preset-pick", "creative")  # another one replaces every field
    assert page.locator("#id_max_tokens").input_value() == "1024" and page.locator("#id_min_p").input_value() == "0.05"
    page.select_option("#preset-pick", str(mine.pk))
    assert page.locator("#id_min_p").input_value() == ""
    shot(page, "chat-preset-picked")
    page.fill("#composer textarea[name=text]", "Where is the treasure?")
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_selector(ANSWERED, timeout=60000)
    s = ChatSession.objects.filter(owner=users["alice"]).latest("created")
    assert s.system == PIRATE and s.params == {"temperature": 0.0, "max_tokens": 3}
    a = _answer(s)
    assert (a.completion_tokens, a.finish_reason) == (3, "length")  # the worker had the preset's max tokens
    assert "cut off at max tokens" in page.locator(ANSWERED).inner_text()


def test_a_preset_applied_to_a_conversation_carries_its_system_prompt_into_the_next_prompt(page, users, stack):
    from webui.models import ChatSession

    mine = _preset(users["alice"])
    pairs = [("user", "Hello."), ("assistant", "Hello! How can I help?")]
    plain, twin = store(users["alice"], pairs, title="without preset"), store(users["alice"], pairs, title="pirate")
    page.set_viewport_size(WIDE)
    sign_in(page, "alice")

    def ask(session):
        page.goto(f"/chat/{session.pk}/")
        page.fill("#composer textarea[name=text]", "Where is the treasure?")
        page.press("#composer textarea[name=text]", "Enter")
        page.wait_for_function(
            "() => document.querySelectorAll('li.msg.assistant:not(.streaming) .metrics').length == 2"
        )
        return _answer(ChatSession.objects.get(pk=session.pk))

    plain.params = {"temperature": 0.0, "max_tokens": 3}
    plain.save()
    before = ask(plain)

    page.goto(f"/chat/{twin.pk}/")
    page.click("#conv-settings summary")
    assert page.locator("#current-sampling").inner_text() == "model defaults"
    page.select_option("#apply-preset", str(mine.pk))
    page.click(".preset-apply button")
    page.wait_for_selector(".messages >> text=applied the preset")
    page.click("#conv-settings summary")
    assert page.locator("#current-sampling").inner_text() == "temperature 0.0 · max tokens 3"
    assert page.locator("#current-system").inner_text().startswith("You are Captain Tokenbeard")
    page.evaluate("() => window.scrollTo(0, 0)")  # the page scrolls to the newest message; the shot shows the top
    shot(page, "chat-conversation-settings")
    after = ask(twin)
    twin.refresh_from_db()
    assert twin.system == PIRATE and twin.params == {"temperature": 0.0, "max_tokens": 3}
    assert (after.completion_tokens, after.finish_reason) == (3, "length")
    # the same messages with the preset's system prompt in front (SmolLM2's template has a short default one)
    assert after.prompt_tokens >= before.prompt_tokens + 25, (before.prompt_tokens, after.prompt_tokens)

    page.click("#conv-settings summary")
    page.fill("#save-preset", "Pirate copy")
    page.click(".preset-save button")
    page.wait_for_selector(".messages >> text=saved the preset “Pirate copy”")
    assert users["alice"].presets.get(name="Pirate copy").system == PIRATE


def test_a_conversation_is_pinned_without_a_reload_and_ticked_ones_are_exported_and_deleted(page, users, stack):
    from webui.models import ChatSession

    ChatSession.objects.filter(owner=users["alice"]).delete()
    pair = [("user", "Hi."), ("assistant", "Hello!")]
    old, mid, new = (store(users["alice"], pair, title=t) for t in ("Oldest chat", "Middle chat", "Newest chat"))
    page.set_viewport_size(WIDE)
    sign_in(page, "alice")
    page.goto(f"/chat/{new.pk}/")
    titles = page.locator("#chat-list li .item-text a")
    assert titles.all_inner_texts() == ["Newest chat", "Middle chat", "Oldest chat"]
    page.evaluate("() => { window.notReloaded = true; }")
    page.locator(f'li[data-chat="{old.pk}"] .pin-button').click()
    page.wait_for_function("() => document.querySelector('#chat-list li').classList.contains('pinned')")
    assert titles.all_inner_texts() == ["Oldest chat", "Newest chat", "Middle chat"]
    assert page.evaluate("() => window.notReloaded === true")
    assert ChatSession.objects.get(pk=old.pk).pinned is not None

    page.click("label.select-chats")
    assert page.locator(f'li[data-chat="{mid.pk}"] input.pick').is_visible()
    page.locator(f'li[data-chat="{mid.pk}"] input.pick').check()
    page.locator(f'li[data-chat="{new.pk}"] input.pick').check()
    assert page.locator("#bulk-count").inner_text() == "2 ticked:"
    shot(page, "chat-list-pinned-select")
    with page.expect_download() as dl:
        page.click("#chat-bulk button[value=export-json]")
    data = json.loads(open(dl.value.path()).read())
    assert [c["title"] for c in data["conversations"]] == ["Newest chat", "Middle chat"]
    page.click("#chat-bulk details.delete summary")
    page.click("#chat-bulk button[value=delete]")
    page.wait_for_selector(".messages >> text=deleted 2 conversations")
    assert page.url.endswith("/chat/")  # the page it was on is gone
    assert titles.all_inner_texts() == ["Oldest chat"]


def test_presets_and_the_list_fit_a_phone(phone, users, stack):
    from webui.models import ChatSession

    ChatSession.objects.filter(owner=users["alice"]).delete()
    _preset(users["alice"])
    pinned = store(users["alice"], [("user", "Hi."), ("assistant", "Hello!")], title="A pinned conversation")
    store(users["alice"], [("user", "Hi."), ("assistant", "Hello!")], title="Another conversation")
    pinned.pinned = pinned.created
    pinned.save()
    sign_in(phone, "alice")
    for path, name, act in (
        ("/chat/presets/", "chat-phone-presets", None),
        (f"/chat/{pinned.pk}/", "chat-phone-conversation-settings", "#conv-settings summary"),
        (f"/chat/{pinned.pk}/", "chat-phone-list-select", "label.show-chats"),
    ):
        phone.goto(path)
        if act:
            phone.click(act)
        if name == "chat-phone-list-select":
            phone.click("label.select-chats")
            phone.locator("#chat-list input.pick").first.check()
        phone.evaluate("() => window.scrollTo(0, 0)")
        width = phone.evaluate("() => document.scrollingElement.scrollWidth")
        assert width <= 360, f"{path} is {width} px wide on a 360 px screen"
        shot(phone, name)
