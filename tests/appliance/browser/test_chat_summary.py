""" "Summarize and continue" in real Chromium against the real stack (a 512-token context): a message sent in
a conversation that outgrew the context brings the marker with its button while the answer streams; the
button has the model write a summary, shown in place of the messages it covers, and the next answer
arrives from a prompt that holds it. Screenshots (of the viewport) at 1280 × 900 and 360 × 740 of the
summary."""

from __future__ import annotations

from .conftest import SHOTS, sign_in
from test_chat_summary import long_turns

from .test_chat_page import ANSWERED, store

WIDE = {"width": 1280, "height": 900}


def _send(page, text: str, answers_before: int) -> None:
    page.fill("#composer textarea[name=text]", text)
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_function(
        "n => document.querySelectorAll('li.msg.assistant:not(.streaming) .metrics').length > n",
        arg=answers_before,
        timeout=90000,
    )


def test_summarize_and_continue_from_the_marker(page, users, stack):
    s = store(users["alice"], long_turns(12), title="a long garden chat")
    s.params = {"temperature": 0, "max_tokens": 12}
    s.save()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(WIDE)
    sign_in(page, "alice", next_path=f"/chat/{s.pk}/")
    assert page.locator("#context-edge").count() == 0  # nothing sent yet
    _send(page, "And the roses?", page.locator(ANSWERED).count())
    edge = page.locator("#context-edge")
    edge.wait_for()
    last = s.messages.order_by("-index").first()
    assert last.role == "assistant" and last.dropped > 0
    # the marker sits right before the first message the prompt held
    first_in_view = edge.evaluate("li => li.nextElementSibling.dataset.index")
    assert int(first_in_view) == last.dropped
    assert "earlier messages are outside the model's context" in edge.inner_text()

    edge.get_by_role("button", name="Summarize and continue").click()
    page.wait_for_url(f"**/chat/{s.pk}/#summary", timeout=90000)
    block = page.locator("#summary")
    assert f"Summary of the {last.dropped} messages above" in block.inner_text()
    block.locator("summary").click()
    s.refresh_from_db()
    assert s.summary_upto == last.dropped - 1 and block.locator(".summary-text").inner_text().strip() == s.summary
    assert page.locator("#context-edge").count() == 0  # what was outside is now in the summary
    block.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "chat-summary.png"))

    _send(page, "Thanks. What about the beans?", page.locator(ANSWERED).count())
    answer = s.messages.order_by("-index").first()
    assert answer.role == "assistant" and answer.content and answer.prompt_tokens + 12 <= 512
    assert page.locator(ANSWERED).last.inner_text().strip()
    page.set_viewport_size({"width": 360, "height": 740})
    page.reload()
    page.locator("#summary").scroll_into_view_if_needed()
    assert page.locator("#summary").is_visible()
    page.screenshot(path=str(SHOTS / "chat-summary-phone.png"))
