"""The chat page in real Chromium against the real stack: streaming, stop, regenerate, edit, code, phone.

The page counts its renders of the answer being written (`window.chatStats`: renders, the text's length
at each, the time each took). The measurements at the end are printed and written to
`$RKMOJO_TEST_OUTPUT/chat-measurements.json`, not asserted.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
from playwright.sync_api import expect

from .conftest import SHOTS, shot, sign_in

ANSWERED = "li.msg.assistant:not(.streaming) .metrics"


def store(user, pairs, title="stored", model="smollm2"):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=user, source="web", model=model, title=title)
    ChatMessage.objects.bulk_create(
        [
            ChatMessage(
                session=s, index=i, role=role, content=text, finish_reason="stop" if role == "assistant" else ""
            )
            for i, (role, text) in enumerate(pairs)
        ]
    )
    return s


def new_chat(page, text: str, max_tokens: int | None = None, temperature: str | None = None):
    page.goto("/chat/")
    if max_tokens is not None or temperature is not None:
        page.click("details.settings summary")
        if max_tokens is not None:
            page.fill("#id_max_tokens", str(max_tokens))
        if temperature is not None:
            page.fill("#id_temperature", temperature)
    page.fill("#composer textarea[name=text]", text)
    page.press("#composer textarea[name=text]", "Enter")


def answers(page) -> int:
    return page.locator(ANSWERED).count()


def test_a_prompt_streams_over_several_renders_and_ends_rendered_by_the_server(page, users, stack):
    sign_in(page, "alice")
    page.goto("/chat/")
    page.click("details.settings summary")
    page.fill("#id_system", "You are a storyteller.")
    shot(page, "chat-new")
    new_chat(page, "Tell a short story about a cat.", max_tokens=60)
    page.wait_for_function("() => window.chatStats.renders >= 4", timeout=60000)
    shot(page, "chat-streaming")
    page.wait_for_selector(ANSWERED, timeout=60000)
    lengths = page.evaluate("window.chatStats.lengths")
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), lengths  # it grew, render by render
    assert "/chat/" in page.url and page.url.rstrip("/").split("/")[-1] != "chat"
    metrics = page.locator(ANSWERED).inner_text()
    assert "TTFT" in metrics and "decode" in metrics and "prompt" in metrics
    # the new-chat form became the conversation's header, and the list shows it
    gauge = page.locator("#gauge-text").inner_text()
    assert gauge.endswith("/ 512 tokens") and not gauge.startswith("0 ")
    assert page.locator("#chat-list li[aria-current] a").inner_text() == "Tell a short story about a cat."
    page.reload()  # the same conversation, rendered on the server
    assert page.locator("li.msg").count() == 2 and "/ 512 tokens" in page.locator("#gauge-text").inner_text()
    shot(page, "chat-answered")


def test_stop_frees_the_worker_within_a_second_and_the_next_prompt_works(page, users, stack):
    sign_in(page, "alice")
    new_chat(page, "Write a very long story about a dragon and a knight.", max_tokens=400)
    page.wait_for_function("() => window.chatStats.renders >= 2", timeout=60000)
    page.click("#stop")
    clicked = time.monotonic()
    stack.idle(timeout=5)
    freed = time.monotonic() - clicked
    page.wait_for_selector(ANSWERED)
    assert freed < 1.0, f"the worker was still busy {freed:.2f} s after Stop"
    assert "stopped" in page.locator(ANSWERED).inner_text()
    assert page.locator("#continue").is_visible() and not page.locator("#stop").is_visible()
    shot(page, "chat-stopped")
    page.fill("#composer textarea[name=text]", "Now say hello.")
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_function(f"() => document.querySelectorAll({ANSWERED!r}).length == 2", timeout=60000)
    assert page.locator("li.msg").count() == 4


def test_regenerate_replaces_the_answer_and_edit_resends_dropping_what_followed(page, users, stack):
    sign_in(page, "alice")
    new_chat(page, "Name a colour.", max_tokens=8)
    page.wait_for_selector(ANSWERED, timeout=60000)
    page.evaluate("document.querySelector('li.msg.assistant').dataset.old = '1'")
    page.click("#regenerate")
    page.wait_for_function(
        f"() => !document.querySelector('li.msg.assistant[data-old]') && document.querySelectorAll({ANSWERED!r}).length == 1",
        timeout=60000,
    )
    assert page.locator("li.msg").count() == 2
    box = page.locator("#composer textarea[name=text]")
    box.fill("And a fruit?")
    box.press("Shift+Enter")  # a new line, not a send
    box.type("Just one.")
    assert box.input_value() == "And a fruit?\nJust one." and page.locator("li.msg").count() == 2
    box.press("Enter")
    page.wait_for_function(f"() => document.querySelectorAll({ANSWERED!r}).length == 2", timeout=60000)
    first = page.locator("li.msg.user").first
    first.locator("summary").click()
    first.locator("textarea").fill("Name an animal.")
    shot(page, "chat-editing")
    first.locator("textarea").press("Enter")
    page.wait_for_function(
        f"() => document.querySelectorAll('li.msg').length == 2 && document.querySelectorAll({ANSWERED!r}).length == 1",
        timeout=60000,
    )
    assert "Name an animal." in page.locator("li.msg.user .body").inner_text()
    page.reload()
    assert page.locator("li.msg").count() == 2 and "Name an animal." in page.locator("li.msg.user .body").inner_text()
    shot(page, "chat-edited")


def test_while_it_waits_the_page_shows_the_queue_position_loading_and_prefill_progress(page, users, stack):
    """A request waits behind an API client's long answer; its status events are written into its stream
    as a worker writes them (the worker's own emission of them is tested on the worker's side)."""
    from appliance import bus
    from appliance.events import Loading, PrefillProgress, Queued

    sign_in(page, "alice")
    long = stack.openai().chat.completions.create(
        model="smollm2", max_tokens=300, stream=True, messages=[{"role": "user", "content": "Tell a long story."}]
    )
    next(iter(long))
    running = stack.registration("board-a")["running"]
    new_chat(page, "Hi!", max_tokens=4)
    r = stack.r()
    rid = stack.wait_until(lambda: [i for i in r.zrange("rkmojo:queue:smollm2", 0, -1) if i != running])[0]
    for ev, text in (
        (Queued(position=2), "2 requests ahead…"),
        (Loading(model="smollm2"), "Loading smollm2…"),
        (PrefillProgress(done=512, total=1800), "prompt 512 / 1800"),
    ):
        bus.emit(r, rid, ev)
        page.wait_for_function("t => document.querySelector('#status').textContent === t", arg=text)
        if ev.t != "loading":
            shot(page, f"chat-waiting-{ev.t}")
    long.close()  # the API client leaves: the worker takes the page's request
    page.wait_for_selector(ANSWERED, timeout=60000)
    assert page.locator("#status").inner_text() == ""


def test_a_code_block_is_highlighted_and_copied(page, users, stack):
    code = "def add(a, b):\n    return a + b"
    s = store(
        users["alice"],
        [("user", "Write add in Python."), ("assistant", f"Here:\n\n```python\n{code}\n```\n")],
        title="code",
    )
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, "alice")
    page.goto(f"/chat/{s.pk}/")
    block = page.locator("li.msg.assistant .code")
    assert block.locator("pre.pyg span.k").first.inner_text() == "def"  # coloured on the server
    block.locator("button.copy").click()
    expect(block.locator("button.copy")).to_have_text("Copied")  # once the clipboard's promise resolves
    assert page.evaluate("navigator.clipboard.readText()").strip() == code
    # the page's own renderer (the one streaming uses) highlights with highlight.js and adds the button
    page.evaluate("""() => { const li = document.querySelector('#answer-template').content.firstElementChild.cloneNode(true);
        li.querySelector('.body').innerHTML = DOMPurify.sanitize(marked.parse('```python\\nimport os\\n```'));
        li.querySelectorAll('pre code').forEach(c => hljs.highlightElement(c)); li.id = 'probe';
        document.querySelector('#messages').append(li); }""")
    assert page.locator("#probe code.hljs .hljs-keyword").inner_text() == "import"
    shot(page, "chat-code")


def test_the_page_fits_a_phone(phone, users, stack):
    s = store(
        users["alice"],
        [
            ("user", "Hello on a phone, with a long word: " + "x" * 80),
            ("assistant", "A table:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\n" + "y" * 120 + "\n```"),
        ],
        title="phone",
    )
    sign_in(phone, "alice")
    phone.goto(f"/chat/{s.pk}/")
    width = phone.evaluate("document.scrollingElement.scrollWidth")
    assert width <= 360, f"the page is {width} px wide on a 360 px screen"
    assert phone.locator("#composer textarea").is_visible() and not phone.locator("aside.chats").is_visible()
    shot(phone, "chat-phone")
    phone.click("label.show-chats")
    assert phone.locator("aside.chats").is_visible()
    shot(phone, "chat-phone-list")
    new_chat(phone, "Hi!", max_tokens=10)
    phone.wait_for_selector(ANSWERED, timeout=60000)
    assert phone.evaluate("document.scrollingElement.scrollWidth") <= 360
    shot(phone, "chat-phone-answer")


def test_measure_ttfb_with_200_conversations_and_render_time_at_the_end_of_200_messages(page, users, stack):
    from webui.models import ChatSession

    alice = users["alice"]
    ChatSession.objects.filter(owner=alice).delete()
    ChatSession.objects.bulk_create(
        [ChatSession(owner=alice, source="web", model="smollm2", title=f"chat {i}") for i in range(198)]
    )
    body = (
        "Some **markdown** with `code`, a list:\n\n- one\n- two\n\n```python\nfor i in range(3):\n    print(i)\n```\n"
    )
    long = store(
        alice, [("user" if i % 2 == 0 else "assistant", f"message {i}. {body}") for i in range(200)], title="long"
    )
    sign_in(page, "alice")
    cookie = {c["name"]: c["value"] for c in page.context.cookies()}
    ttfb = {}
    with httpx.Client(base_url=stack.url, cookies=cookie, headers={"Accept": "text/html"}) as c:
        for path in ("/chat/", f"/chat/{long.pk}/"):
            times = []
            for _ in range(6):
                t0 = time.perf_counter()
                with c.stream("GET", path) as r:
                    times.append(time.perf_counter() - t0)  # the status line and headers are in
                    assert r.status_code == 200
                    r.read()
            ttfb[path] = times[1:]  # the first warms the template and markdown caches
    # the worker's context (512) cannot hold 200 messages: a proxy between the page and the real socket
    # points the page's request at a short conversation and its answer back at the long page
    short = store(alice, [], title="short")
    short.params = {"max_tokens": 120}
    short.save()
    shift = 200

    def proxy(ws):
        server = ws.connect_to_server()

        def from_page(text):
            server.send(json.dumps({**json.loads(text), "session": str(short.pk)}))

        def from_server(text):
            ev = json.loads(text)
            if ev["t"] == "turn":
                ev.update(session=str(long.pk), index=ev["index"] + shift)
                ev["user"]["index"] += shift
            ws.send(json.dumps(ev))

        ws.on_message(from_page)
        server.on_message(from_server)

    page.route_web_socket("**/ws/chat/", proxy)
    page.goto(f"/chat/{long.pk}/")
    assert page.locator("li.msg").count() == 100  # the newest 100; the 100 before them on asking
    page.click("text=Load earlier messages")
    page.wait_for_selector("#m99")
    assert page.locator("li.msg").count() == 200
    page.fill("#composer textarea[name=text]", "Write a few sentences about the sea.")
    page.press("#composer textarea[name=text]", "Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('li.msg').length == 202 && !document.querySelector('.streaming')",
        timeout=90000,
    )
    ms = page.evaluate("window.chatStats.renderMs")
    out = {
        "chat_list_ttfb_ms_median (200 conversations)": round(statistics.median(ttfb["/chat/"]) * 1000, 1),
        "conversation_200_messages_ttfb_ms_median": round(statistics.median(ttfb[f"/chat/{long.pk}/"]) * 1000, 1),
        "renders": len(ms),
        "render_ms_median": round(statistics.median(ms), 2),
        "render_ms_p95": round(sorted(ms)[int(len(ms) * 0.95) - 1 if len(ms) > 1 else 0], 2),
        "render_ms_max": round(max(ms), 2),
    }
    print("\nchat measurements:", json.dumps(out, indent=1))
    (SHOTS.parent / "chat-measurements.json").write_text(json.dumps(out, indent=1) + "\n")
    page.screenshot(path=str(SHOTS / "chat-200-messages.png"))  # the end of it: a full page is 40,000 px tall


def test_without_javascript_the_forms_send_continue_and_regenerate(chromium, users, stack):
    """Plain form posts: each returns when the answer is complete, and the server renders everything."""
    from .conftest import DESKTOP, Guard

    ctx = chromium.new_context(viewport=DESKTOP, base_url=stack.url, java_script_enabled=False)
    guard = Guard("127.0.0.1")
    ctx.route("**/*", guard.route)
    page = ctx.new_page()
    page.set_default_timeout(90000)
    try:
        sign_in(page, "alice")
        page.click("details.settings summary")
        page.fill("#id_max_tokens", "6")
        page.fill("#id_temperature", "0")
        page.fill("#composer textarea[name=text]", "Tell a story about a cat.")
        page.click("#composer button[type=submit]")
        page.wait_for_url("**/chat/*/#m1")
        from webui.models import ChatMessage

        sid = page.url.split("/")[-2]
        first = ChatMessage.objects.get(session_id=sid, index=1).content
        assert "cut off" in page.locator("li.msg.assistant .metrics").inner_text()
        page.click("#continue")
        page.wait_for_load_state()
        longer = ChatMessage.objects.get(session_id=sid, index=1).content
        assert longer.startswith(first) and len(longer) > len(first), (first, longer)
        assert page.locator("li.msg").count() == 2
        assert " ".join(longer.split()) == " ".join(page.locator("li.msg.assistant .body").inner_text().split())
        shot(page, "chat-no-js")
        page.click("#regenerate")
        page.wait_for_load_state()
        assert page.locator("li.msg").count() == 2 and page.locator("li.msg.assistant .metrics").count() == 1
    finally:
        ctx.close()
    guard.check()
