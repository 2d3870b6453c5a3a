"""The chat page's thinking and tool-call blocks in real Chromium: stored ones as the server renders them,
streamed ones as the page's own script builds them from the socket's events.

The demo model neither thinks nor calls tools, so the streamed events are synthetic: the page's socket
is answered by the test (Playwright's `route_web_socket`) with the events a worker writes for a thinking
model that calls a tool (`appliance.events`), and at the end with the server's own rendering of the
answer (`webui.chat.render.message`), as the consumer sends it.
"""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from .conftest import AnsweredSocket, shot, sign_in

REASONING = ["The user asks about the weather ", "in **Paris**. ", "I should call `get_weather`."]
CALL_ID = "call_" + "b" * 24


def store(user, rows: list[dict], title: str):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=user, source="web", model="smollm2", title=title)
    ChatMessage.objects.bulk_create([ChatMessage(session=s, index=i, **row) for i, row in enumerate(rows)])
    return s


def both_schemes(page, name: str) -> None:
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        shot(page, f"{name}-{scheme}")
    page.emulate_media(color_scheme="light")


def test_a_stored_answer_shows_its_thinking_collapsed_and_its_tool_call_and_result_as_blocks(page, users, stack):
    s = store(
        users["alice"],
        [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "reasoning": "".join(REASONING),
                "tool_calls": [
                    {
                        "id": CALL_ID,
                        "name": "get_weather",
                        "arguments": {"city": "Paris", "days": 2, "units": {"temp": "C"}},
                    }
                ],
                "finish_reason": "tool_calls",
            },
            {
                "role": "tool",
                "content": '{"temperature": 21, "sky": "clear"}',
                "tool_call_id": CALL_ID,
                "name": "get_weather",
            },
            {"role": "assistant", "content": "It is **21 °C** and clear in Paris.", "finish_reason": "stop"},
        ],
        title="thinking, stored",
    )
    sign_in(page, "alice")
    page.goto(f"/chat/{s.pk}/")
    thinking = page.locator("li.msg.assistant details.thinking")
    expect(thinking).to_have_count(1)
    expect(thinking.locator("summary")).to_have_text("Thinking…")
    assert not thinking.evaluate("d => d.open")  # collapsed: the reasoning is there but not shown
    expect(thinking.locator(".md")).to_be_hidden()
    call = page.locator("li.msg.assistant .tool-call")
    expect(call.locator(".tool-name")).to_have_text("get_weather")
    expect(call.locator("table.fields tr").first).to_have_text(re.compile(r"city\s*Paris"))
    expect(call.locator("td pre code")).to_contain_text('"temp": "C"')
    expect(call.locator("button.copy")).to_have_count(0)  # a value in the table gets no copy button
    result = page.locator("li.msg.tool")
    expect(result.locator(".who")).to_have_text("Tool result · get_weather")
    expect(result.locator("table.fields")).to_have_text(re.compile(r"temperature\s*21\s*sky\s*clear"))
    both_schemes(page, "chat-thinking-stored-collapsed")
    thinking.locator("summary").click()
    expect(thinking.locator(".md strong")).to_have_text("Paris")
    both_schemes(page, "chat-thinking-stored-open")
    page.set_viewport_size({"width": 360, "height": 740})  # a phone: the blocks fit its width
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 360
    shot(page, "chat-thinking-stored-phone")


def test_streamed_thinking_fills_a_collapsed_block_then_says_how_long_it_thought(page, users, stack):
    from appliance.events import Delta, Start, ToolCallDelta
    from webui.chat.render import message
    from webui.models import ChatMessage

    s = store(
        users["alice"],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "finish_reason": "stop"}],
        title="thinking, streamed",
    )

    sign_in(page, "alice")
    socket = AnsweredSocket(page)
    sent, emit = socket.sent, socket.emit
    page.goto(f"/chat/{s.pk}/")
    page.fill("#composer textarea[name=text]", "What is the weather in Paris?")
    page.press("#composer textarea[name=text]", "Enter")
    while not sent:
        page.wait_for_timeout(20)  # the sync API delivers the socket's messages while it waits
    assert len(socket.sockets) == 1 and sent[0] == {
        "action": "send",
        "session": str(s.pk),
        "text": "What is the weather in Paris?",
    }

    asked = ChatMessage(session=s, index=2, role="user", content="What is the weather in Paris?")
    user = {"index": 2, "html": message(s, asked)}
    emit({"t": "turn", "session": str(s.pk), "index": 3, "prefix": "", "model": "smollm2", "user": user})
    emit(Start(prompt_tokens=30))
    live = page.locator("li.msg.assistant.streaming")
    thinking = live.locator("details.thinking")
    expect(thinking).to_be_hidden()  # no thinking yet: no block
    began = time.monotonic()
    emit(Delta(text=REASONING[0], tokens=1, channel="reasoning"))
    expect(thinking.locator("summary")).to_be_visible()
    expect(thinking.locator("summary")).to_have_text("Thinking…")
    expect(thinking).to_have_class(re.compile(r"\bstreaming\b"))
    assert not thinking.evaluate("d => d.open")
    emit(Delta(text=REASONING[1], tokens=2, channel="reasoning"))
    page.wait_for_function(
        "t => document.querySelector('li.streaming details.thinking .md').textContent.includes(t)", arg="in Paris."
    )
    assert live.locator(".body").inner_text() == ""  # thoughts never reach the answer
    both_schemes(page, "chat-thinking-streaming-collapsed")
    thinking.locator("summary").click()  # the reader opens it: it goes on filling
    emit(Delta(text=REASONING[2], tokens=3, channel="reasoning"))
    expect(thinking.locator(".md code")).to_have_text("get_weather")
    both_schemes(page, "chat-thinking-streaming-open")

    page.wait_for_timeout(1100)
    emit(Delta(text="Let me check ", tokens=4))
    emit(Delta(text="the weather.", tokens=5))
    expect(thinking.locator("summary")).to_have_text(re.compile(r"^Thought for \d+ s$"))
    took = int(thinking.locator("summary").inner_text().split()[2])
    assert 1 <= took <= round(time.monotonic() - began) + 1  # from its first thought to its first answer text
    expect(thinking).not_to_have_class(re.compile(r"\bstreaming\b"))
    expect(live.locator(".body")).to_have_text("Let me check the weather.")

    emit(ToolCallDelta(index=0, id=CALL_ID, name="get_weather"))
    emit(ToolCallDelta(index=0, id=CALL_ID, arguments='{"city": "Par'))
    call = live.locator(".calls .tool-call")
    expect(call.locator(".tool-name")).to_have_text("get_weather")
    expect(call.locator(".tool-args pre")).to_have_text('{"city": "Par')  # not whole yet: its text so far
    emit(ToolCallDelta(index=0, id=CALL_ID, arguments='is", "days": 2}'))
    expect(call.locator("table.fields")).to_have_text(re.compile(r"city\s*Paris\s*days\s*2"))
    streamed_table = call.locator("table.fields").evaluate("t => t.outerHTML")
    both_schemes(page, "chat-thinking-tool-call-streamed")

    answer = ChatMessage(
        session=s,
        index=3,
        role="assistant",
        content="Let me check the weather.",
        reasoning="".join(REASONING),
        tool_calls=[{"id": CALL_ID, "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}],
        finish_reason="tool_calls",
        prompt_tokens=30,
        completion_tokens=40,
    )
    emit({"t": "final", "finish_reason": "tool_calls", "message": {"index": 3, "html": message(s, answer)}})
    done = page.locator("li#m3.msg.assistant:not(.streaming)")
    expect(done.locator(".metrics")).to_contain_text("prompt 30")
    # the server's rendering replaced the streamed one, keeping what the reader saw of the thinking
    expect(done.locator("details.thinking summary")).to_have_text(re.compile(r"^Thought for [12] s$"))
    assert done.locator("details.thinking").evaluate("d => d.open")
    assert done.locator("table.fields").evaluate("t => t.outerHTML") == streamed_table  # the same markup
    expect(page.locator("#stop")).to_be_hidden()
    both_schemes(page, "chat-thinking-final")
