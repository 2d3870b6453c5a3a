"""TeX math and code labels on the chat page in real Chromium: stored messages as the server marks them up
(`webui.chat.texmath`, `render.py`) and the page typesets them with KaTeX, streamed ones as the page's own
marked extension (`static/webui/chat-math.js`) does, both under the Content-Security-Policy.

The demo model writes no math, so the streamed answer is synthetic, as in `test_chat_thinking.py`: the
page's socket is answered by the test with a worker's events and, at the end, the server's rendering.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from playwright.sync_api import expect

from .conftest import AnsweredSocket, shot, sign_in
from .test_csp import Watch

# (markdown, the math in it as (TeX, display) in order): both sides must cut it the same way
CASES = [
    ("$x$ is 5", [("x", False)]),
    ("It costs $5 and $10.", []),
    ("$5-$10 and $20,000", []),
    ("Euler: $e^{i\\pi} + 1 = 0$, done.", [("e^{i\\pi} + 1 = 0", False)]),
    ("inline $$x^2$$ display", [("x^2", True)]),
    ("$$\n\\int_0^1 x^2\\,dx = \\frac{1}{3}\n$$", [("\\int_0^1 x^2\\,dx = \\frac{1}{3}", True)]),
    ("$$ a+b $$", [("a+b", True)]),
    ("\\(a+b\\) and \\[c\\]", [("a+b", False), ("c", True)]),
    ("\\[\n\\sum_i i\n\\]", [("\\sum_i i", True)]),
    ("`$x$` and $y$", [("y", False)]),
    ("$10 and `$x$` here", []),
    ("```\n$x$\n```", []),
    ("    $x$ indented code", []),
    ("\\$5 and $a$", [("a", False)]),
    ("$\\$5$", [("\\$5", False)]),
    ("$a $ b$", []),
    ("$x$5", []),
    ("text\n$$\na\n$$\nmore", [("a", True)]),
    ("- item $a_1$\n- $$b$$", [("a_1", False), ("b", True)]),
    ("$$\n\nx\n$$", []),
    ("unclosed $x and $$y", []),
]


def store(user, pairs, title):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=user, source="web", model="smollm2", title=title)
    ChatMessage.objects.bulk_create(
        [
            ChatMessage(
                session=s, index=i, role=role, content=text, finish_reason="stop" if role == "assistant" else ""
            )
            for i, (role, text) in enumerate(pairs)
        ]
    )
    return s


MATH = (
    "The energy is $E = mc^2$, and a price of $5 and $10 stays text; `$x$` is code.\n\n"
    "$$\n\\int_0^1 x^2\\,dx = \\frac{1}{3}\n$$\n\n"
    "With \\(\\alpha\\) and \\[\\sqrt{2} \\approx 1.414\\]\n\n"
    "```python\nprice = '$5'\n```\n"
)


def math_in(html: str) -> list:
    """The math the server marked in `html`: [(TeX, display)]."""
    return [
        (unescape(tex), "display" in cls)
        for cls, tex in re.findall(r'<(?:span|div) class="(math[^"]*)">(.*?)</(?:span|div)>', html, re.S)
    ]


@pytest.mark.parametrize("text, expected", CASES)
def test_the_server_cuts_math_by_the_rules(text, expected):
    from webui.chat.render import markdown

    assert math_in(markdown(text)) == expected


def test_the_page_cuts_math_as_the_server_does(page, users, stack):
    sign_in(page, "alice")
    got = page.evaluate(
        """cases => cases.map(text => {
            const div = document.createElement('div');
            div.innerHTML = DOMPurify.sanitize(marked.parse(text));
            return Array.from(div.querySelectorAll('.math')).map(e => [e.textContent, e.classList.contains('display')]);
        })""",
        [text for text, _ in CASES],
    )
    for (text, expected), math in zip(CASES, got):
        assert [tuple(m) for m in math] == expected, text


def test_a_stored_answer_shows_typeset_math_and_a_labelled_code_block(page, users, stack):
    watch = Watch(page)
    s = store(users["alice"], [("user", "Some math, and a price: $5 or $10?"), ("assistant", MATH)], "math, stored")
    sign_in(page, "alice")
    page.set_viewport_size({"width": 1280, "height": 900})
    watch.visit(f"/chat/{s.pk}/")
    body = page.locator("li.msg.assistant .body")
    expect(body.locator(".math .katex")).to_have_count(4)
    expect(body.locator(".math.display .katex-display")).to_have_count(2)
    assert "a price of $5 and $10 stays text" in body.inner_text()
    expect(body.locator("p code")).to_have_text("$x$")
    expect(body.locator(".code .lang")).to_have_text("python")
    expect(body.locator(".code button.copy")).to_have_count(1)
    assert body.locator(".code pre").inner_text().strip() == "price = '$5'"
    assert page.evaluate("document.fonts.ready.then(() => document.fonts.check('1em KaTeX_Main'))")
    watch.check("typeset math")
    shot(page, "chat-math")
    page.set_viewport_size({"width": 360, "height": 740})  # a phone: a wide equation scrolls in its own box
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 360
    shot(page, "chat-math-phone")


def test_constructs_that_set_a_style_attribute_render_under_the_policy(page, users, stack):
    """KaTeX sets \\pmb's and \\fcolorbox's MathML style and \\oiint's SVG width with setAttribute, which the
    policy refuses; the page routes them through the CSSOM. A TeX error is shown by the page, not KaTeX."""
    watch = Watch(page)
    hard = "$\\pmb{x}$ $\\fcolorbox{red}{white}{y}$ $\\oiint z$ $\\color{red} q$ $\\frac{1}{0$"
    s = store(users["alice"], [("user", "Hard math"), ("assistant", hard)], "math, hard")
    sign_in(page, "alice")
    watch.visit(f"/chat/{s.pk}/")
    body = page.locator("li.msg.assistant .body")
    expect(body.locator(".katex")).to_have_count(4)
    assert "border" in body.locator("mpadded").get_attribute("style")  # \\fcolorbox's, applied
    error = body.locator(".math.math-error")
    expect(error).to_have_text("\\frac{1}{0")
    assert "KaTeX parse error" in error.get_attribute("title")
    watch.check("KaTeX's style attributes")


def test_a_streamed_answer_typesets_its_math_as_it_comes_and_keeps_what_it_typeset(page, users, stack):
    from appliance.events import Delta, Start
    from webui.chat.render import message
    from webui.models import ChatMessage

    s = store(users["alice"], [("user", "Hi"), ("assistant", "Hello!")], "math, streamed")

    watch = Watch(page)
    sign_in(page, "alice")
    socket = AnsweredSocket(page)
    sent, emit = socket.sent, socket.emit
    page.goto(f"/chat/{s.pk}/")
    page.fill("#composer textarea[name=text]", "Some math?")
    page.press("#composer textarea[name=text]", "Enter")
    while not sent:
        page.wait_for_timeout(20)  # the sync API delivers the socket's messages while it waits
    asked = ChatMessage(session=s, index=2, role="user", content="Some math?")
    emit(
        {
            "t": "turn",
            "session": str(s.pk),
            "index": 3,
            "prefix": "",
            "model": "smollm2",
            "user": {"index": 2, "html": message(s, asked)},
        }
    )
    emit(Start(prompt_tokens=30))
    live = page.locator("li.msg.assistant.streaming .body")
    emit(Delta(text="The energy is $E = m", tokens=1))
    expect(live).to_contain_text("$E = m")  # not closed yet: the text as it is
    expect(live.locator(".katex")).to_have_count(0)
    emit(Delta(text="c^2$, for $5 or $10.", tokens=2))
    expect(live.locator(".math .katex")).to_have_count(1)
    expect(live).to_contain_text("for $5 or $10.")
    live.locator(".math").evaluate("el => { el.querySelector('.katex').probe = 1; }")
    emit(Delta(text="\n\n$$\n\\int_0^1 x^2\\,dx = \\frac{1}{3}\n$$\n\n```python\nprint(1)\n```\n", tokens=3))
    expect(live.locator(".math.display .katex-display")).to_have_count(1)
    expect(live.locator(".code .lang")).to_have_text("python")
    expect(live.locator(".code button.copy")).to_have_count(1)
    # the equation typeset in an earlier frame was moved into this one, not typeset again
    assert live.locator(".math").first.evaluate("el => el.querySelector('.katex').probe") == 1
    page.set_viewport_size({"width": 1280, "height": 900})
    shot(page, "chat-math-streaming")

    text = "The energy is $E = mc^2$, for $5 or $10.\n\n$$\n\\int_0^1 x^2\\,dx = \\frac{1}{3}\n$$\n\n```python\nprint(1)\n```\n"
    answer = ChatMessage(session=s, index=3, role="assistant", content=text, finish_reason="stop", prompt_tokens=30)
    emit({"t": "final", "finish_reason": "stop", "message": {"index": 3, "html": message(s, answer)}})
    done = page.locator("li#m3.msg.assistant:not(.streaming) .body")
    expect(done.locator(".math .katex")).to_have_count(2)  # the server's rendering, typeset by the page
    expect(done.locator(".code .lang")).to_have_text("python")
    expect(done).to_contain_text("for $5 or $10.")
    watch.check("a streamed answer with math")
