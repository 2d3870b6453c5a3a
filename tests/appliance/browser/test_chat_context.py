"""Long conversations, the model picker and Verify in real Chromium against the real stack (the demo model,
context 512): a conversation past the context is answered and the page marks where the model's view begins,
live and after a reload; an imported conversation whose model is missing opens with the picker, and the
installed model picked there answers the next message; a second model pulled on the panel (the demo GGUF
again, from the import directory) answers a conversation switched to it from the badge; Verify on the
panel's Models page shows its result, OK or the tensor whose digest does not match, which the model's page
keeps with its time.

Screenshots at 1280 × 900 and 360 × 740: the marker, the picker (a missing model, and two installed), a
verify's result and the model's page after it, a failed verify."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from playwright.sync_api import expect

from .conftest import PHONE, SHOTS, shot, sign_in
from .test_chat_page import store

WIDE = {"width": 1280, "height": 900}
EDGE_TEXT = "earlier messages are outside the model's context"
MAX_TOKENS = 24  # the conversation's answer length: the room the worker keeps free when it trims


def long_conversation(user, turns: int = 14):
    """`turns` questions with their answers, about 1,400 tokens: more than twice the stack's context."""
    pairs = []
    for i in range(turns):
        pairs.append(("user", f"Question {i}: " + " ".join(f"word{j}" for j in range(20))))
        pairs.append(("assistant", f"Answer {i}: " + " ".join(f"reply{j}" for j in range(20))))
    s = store(user, pairs, title="A conversation longer than the context")
    s.params = {"max_tokens": MAX_TOKENS}
    s.save()
    return s


# records, as the page changes, when the marker appeared and whether the answer was still being written
WATCH_EDGE = """() => {
  window.edgeSeen = null;
  new MutationObserver(() => {
    if (window.edgeSeen === null && document.querySelector("#context-edge")) {
      window.edgeSeen = {streaming: !!document.querySelector("li.msg.streaming")};
    }
  }).observe(document.querySelector("#messages"), {childList: true, subtree: true});
}"""


def view(page, name: str) -> None:
    """A screenshot of what the viewport shows (the docs' crop), beside `shot`'s full pages."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def edge_before(page) -> int:
    """The index of the message right after the marker, which must be a message."""
    return int(page.locator("#context-edge + li.msg").get_attribute("data-index"))


def test_a_conversation_past_the_context_is_answered_and_the_page_marks_where_the_model_s_view_begins(
    page, users, stack
):
    s = long_conversation(users["alice"])
    page.set_viewport_size(WIDE)
    sign_in(page, "alice")
    page.goto(f"/chat/{s.pk}/")
    assert page.locator("li.msg").count() == 28 and page.locator("#context-edge").count() == 0
    page.evaluate(WATCH_EDGE)
    page.fill("#composer textarea[name=text]", "And the last question?")
    page.press("#composer textarea[name=text]", "Enter")
    marker = page.locator("#context-edge")
    expect(marker).to_be_visible(timeout=60000)
    expect(marker).to_contain_text(EDGE_TEXT)
    page.wait_for_selector("#m29:not(.streaming) .metrics", timeout=90000)
    assert page.evaluate("window.edgeSeen") == {"streaming": True}  # shown at the start, not after a reload

    answer = s.messages.get(index=29)
    assert answer.content.strip() and answer.finish_reason in ("stop", "length"), (answer.content, answer.finish_reason)
    assert page.locator("#m29 .body").inner_text().strip()
    edge = edge_before(page)
    assert edge == answer.dropped  # the page's marker and the stored answer agree
    assert 0 < edge < 28 and edge % 2 == 0, edge  # whole turns left out: the model's view begins at a question
    assert page.locator(f"#m{edge}").get_attribute("data-role") == "user"
    assert answer.prompt_tokens + MAX_TOKENS <= 512, answer.prompt_tokens  # what was sent fits the context
    used, context = re.fullmatch(r"(\d+) / (\d+) tokens", page.locator("#gauge-text").inner_text()).groups()
    assert int(context) == 512 and int(used) == answer.prompt_tokens + answer.completion_tokens
    assert page.locator(".context-edge").count() == 1

    page.reload()  # the server renders the same marker in the same place
    expect(page.locator("#context-edge")).to_be_visible()
    expect(page.locator("#context-edge")).to_contain_text(EDGE_TEXT)
    assert edge_before(page) == edge and page.locator(".context-edge").count() == 1
    shot(page, "chat-context-trimmed-full")
    page.evaluate("document.querySelector('#context-edge').scrollIntoView({block: 'center'})")
    view(page, "chat-context-trimmed")  # the part around the marker

    page.set_viewport_size(PHONE)
    page.evaluate("document.querySelector('#context-edge').scrollIntoView({block: 'center'})")
    width = page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= 360, f"the page is {width} px wide on a 360 px screen"
    view(page, "chat-context-trimmed-phone")


def import_missing_model(page, tmp_path) -> str:
    """A conversation exported from another appliance, whose model this one does not have, imported through
    the chat page's Import; returns its page's path."""
    export = {
        "format": "rkmojo-chat",
        "version": 1,
        "conversations": [
            {
                "title": "Brought from another board",
                "model": "qwen3-30b-a3b",
                "params": {"max_tokens": 12},
                "messages": [
                    {"role": "user", "content": "What is the capital of France?"},
                    {"role": "assistant", "content": "Paris."},
                ],
            }
        ],
    }
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    page.goto("/chat/")
    page.set_input_files(".chat-io input[type=file]", str(path))
    page.click(".chat-io button[type=submit]")
    page.wait_for_url(re.compile(r".*/chat/[0-9a-f-]{36}/$"))
    return urlpath(page.url)


def urlpath(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def test_an_imported_conversation_whose_model_is_missing_opens_with_the_picker_and_the_model_picked_answers(
    page, users, stack, tmp_path
):
    from webui.models import ChatSession

    page.set_viewport_size(WIDE)
    sign_in(page, "alice")
    where = import_missing_model(page, tmp_path)
    picker = page.locator("#model-switch")
    expect(picker).to_have_attribute("open", "")
    expect(picker.locator("summary")).to_have_text("qwen3-30b-a3b")
    expect(picker.locator(".warn")).to_have_text(
        "qwen3-30b-a3b is not installed: pick a model to go on with this conversation."
    )
    expect(page.locator("#switch-model")).to_be_visible()
    assert page.locator("#switch-model option").all_inner_texts() == ["smollm2"]  # what the stack serves
    assert page.locator("#gauge-text").inner_text() == "0 / ? tokens"  # no context known for a missing model
    view(page, "chat-model-missing")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 360
    view(page, "chat-model-missing-phone")
    page.set_viewport_size(WIDE)

    page.select_option("#switch-model", "smollm2")
    picker.locator("button[type=submit]").click()
    page.wait_for_url(f"**{where}")
    expect(page.locator(".messages")).to_contain_text("this conversation now uses smollm2")
    expect(picker.locator("summary")).to_have_text("smollm2")
    expect(picker).not_to_have_attribute("open", "")
    expect(page.locator("#switch-model")).to_be_hidden()
    expect(picker.locator("summary")).to_have_attribute("title", re.compile(r"context 512 tokens \(configured 512;"))
    assert page.locator("#gauge-text").inner_text() == "0 / 512 tokens"
    assert ChatSession.objects.get(pk=where.split("/")[2]).model == "smollm2"

    page.fill("#composer textarea[name=text]", "And of Italy?")
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_selector("#m3:not(.streaming) .metrics", timeout=60000)
    answer = ChatSession.objects.get(pk=where.split("/")[2]).messages.get(index=3)
    assert answer.content.strip() and answer.finish_reason in ("stop", "length")
    assert page.locator("#m3 .body").inner_text().strip() and page.locator("#status").inner_text() == ""
    assert not page.locator("#gauge-text").inner_text().startswith("0 ")

    picker.locator("summary").click()  # the badge opens the picker on a conversation whose model is there
    expect(page.locator("#switch-model")).to_be_visible()
    expect(page.locator("#switch-model")).to_have_value("smollm2")
    expect(picker.locator(".warn")).to_have_count(0)


def test_verify_on_the_models_page_shows_its_result_and_the_model_s_page_keeps_it(page, phone, users, stack):
    page.set_viewport_size(WIDE)
    sign_in(page, "admin", next_path="/panel/")
    page.goto("/panel/models/")
    clicked = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    page.locator('tr[data-model="smollm2"] form[action$="/verify/board-a/"] button').click()
    page.wait_for_url(re.compile(r".*/panel/models/\?job=.*what=verify"))
    status = page.locator("#job-status")
    expect(status).to_have_text(
        re.compile(r"^verified: \d+ tensors match their digests \(\d+ MiB in [\d.]+ s\)$"), timeout=60000
    )
    expect(status).to_have_class("ok")
    expect(page.locator("#job-error")).to_be_hidden()
    expect(page.locator("#job-cancel")).to_be_hidden()
    assert page.evaluate("document.querySelector('#job-bar').value === document.querySelector('#job-bar').max")
    page.wait_for_timeout(1500)  # a pull's page reloads the list 0.8 s after its end; a verify's result stays
    assert "job=" in page.url and status.inner_text().startswith("verified: ")
    result = status.inner_text()
    shot(page, "panel-verify-result")
    job = urlpath(page.url)

    page.goto("/panel/models/smollm2/")
    verified = page.locator("#verified")
    expect(verified.locator(".ok")).to_have_text("OK")
    expect(verified).to_contain_text(result)  # the worker's own words, kept
    expect(verified.locator("time")).to_have_text("just now")  # a verify less than a minute old
    assert datetime.datetime.fromisoformat(verified.locator("time").get_attribute("datetime")) >= clicked  # this one
    shot(page, "panel-model-verified")

    sign_in(phone, "admin", next_path="/panel/")
    phone.goto(job)  # the job's events replayed from the first: the same result
    expect(phone.locator("#job-status")).to_have_text(result)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 362
    shot(phone, "phone-panel-verify-result")
    phone.goto("/panel/models/smollm2/")
    expect(phone.locator("#verified .ok")).to_have_text("OK")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 362
    shot(phone, "phone-panel-model-verified")


@pytest.fixture
def twin(stack, smollm2_gguf):
    """A second model for the stack: the demo GGUF in the import directory as `smollm2-twin.gguf`, for the
    panel's Pull; deleted after the test if it was installed."""
    imports = stack.data / "import"
    imports.mkdir(exist_ok=True)
    link = imports / "smollm2-twin.gguf"
    if not link.exists():
        link.symlink_to(smollm2_gguf)
    yield "smollm2-twin"
    import ollama

    try:
        stack.ollama().delete("smollm2-twin")
    except ollama.ResponseError:  # never installed, or the test deleted it
        pass


def test_a_second_model_pulled_in_the_panel_answers_a_conversation_switched_to_it_and_a_bad_blob_fails_verify(
    page, users, stack, twin
):
    from webui.models import ChatSession

    page.set_viewport_size(WIDE)
    sign_in(page, "admin", next_path="/panel/")
    page.goto("/panel/models/")
    page.fill("#id_source", f"{twin}.gguf")
    page.click("#pull-form button[type=submit]")
    page.wait_for_selector(f'tr[data-model="{twin}"]', timeout=180000)  # the list reloaded after the install

    s = store(users["admin"], [("user", "Hello!"), ("assistant", "Hi there.")], title="Two models")
    s.params = {"max_tokens": 8}
    s.save()
    page.goto(f"/chat/{s.pk}/")
    picker = page.locator("#model-switch")
    expect(picker).not_to_have_attribute("open", "")
    expect(page.locator("#switch-model")).to_be_hidden()
    picker.locator("summary").click()  # the badge
    expect(page.locator("#switch-model")).to_be_visible()
    assert page.locator("#switch-model option").all_inner_texts() == ["smollm2", twin]
    expect(page.locator("#switch-model")).to_have_value("smollm2")
    page.select_option("#switch-model", twin)
    view(page, "chat-model-picker")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 360
    view(page, "chat-model-picker-phone")
    page.set_viewport_size(WIDE)
    picker.locator("button[type=submit]").click()
    page.wait_for_url(f"**/chat/{s.pk}/")
    expect(page.locator(".messages")).to_contain_text(f"this conversation now uses {twin}")
    expect(picker.locator("summary")).to_have_text(twin)
    assert ChatSession.objects.get(pk=s.pk).model == twin

    page.fill("#composer textarea[name=text]", "Say hello again.")
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_selector("#m3:not(.streaming) .metrics", timeout=90000)
    assert page.locator("#m3 .body").inner_text().strip()
    loaded = [m["name"] for m in stack.registration("board-a")["loaded"]]
    assert twin in loaded, loaded  # the worker loaded the second model to answer

    # one byte of one tensor changed on disk: Verify names that tensor, and the model's page keeps it
    store_dir = stack.data / "models" / twin
    spec = json.loads((store_dir / "manifest.json").read_text())["dense"]["tensors"]["layers.0.attn_norm"]
    with open(store_dir / "dense.bin", "r+b") as f:
        f.seek(spec["parts"]["w"]["offset"] + 7)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    page.goto("/panel/models/")
    page.locator(f'tr[data-model="{twin}"] form[action$="/verify/board-a/"] button').click()
    error = page.locator("#job-error")
    expect(error).to_be_visible(timeout=60000)
    expect(error).to_contain_text("dense tensor layers.0.attn_norm digest mismatch")
    expect(page.locator("#job-status")).to_have_text("failed")
    shot(page, "panel-verify-failed")
    page.goto(f"/panel/models/{twin}/")
    expect(page.locator("#verified .error")).to_have_text("failed")
    expect(page.locator("#verified")).to_contain_text("layers.0.attn_norm digest mismatch")
