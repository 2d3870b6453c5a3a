"""Stored messages as the server renders them (`webui.chat.render`, `webui.chat.texmath`), through Django's
test client: TeX math kept as its source in spans the page typesets, code blocks labelled with their
language or file name. The cut of text into math, case by case and against the page's own rules, is in
`browser/test_chat_math.py`."""

import pytest


@pytest.fixture
def ann(django_for_stack):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username="render-ann")[0]


def page_of(user, answer: str, question: str = "?"):
    from django.test import Client

    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=user, source="web", model="smollm2", title="render")
    ChatMessage.objects.bulk_create(
        [
            ChatMessage(session=s, index=0, role="user", content=question),
            ChatMessage(session=s, index=1, role="assistant", content=answer),
        ]
    )
    c = Client(HTTP_HOST="127.0.0.1")
    c.force_login(user)
    return c.get(f"/chat/{s.pk}/")


def test_math_is_kept_as_tex_in_spans_and_prices_stay_text(ann):
    from django.test import SimpleTestCase

    r = page_of(ann, "So $E = mc^2$; it costs $5 and $10.\n\n$$\n\\frac{a}{b} < 1\n$$\n\nand \\(\\alpha\\).")
    t = SimpleTestCase()
    t.assertContains(r, '<span class="math">E = mc^2</span>; it costs $5 and $10.')
    t.assertContains(r, '<div class="math display">\\frac{a}{b} &lt; 1</div>')  # the TeX, escaped
    t.assertContains(r, '<span class="math">\\alpha</span>')
    t.assertContains(r, 'src="/static/webui/vendor/katex-0.19.1/katex.min.js"')
    t.assertContains(r, 'href="/static/webui/vendor/katex-0.19.1/katex.min.css"')


def test_code_is_never_math_and_math_carries_no_markup(ann):
    from django.test import SimpleTestCase

    r = page_of(ann, "`$x$` and\n\n```\n$y$\n```\n\n$<img src=x onerror=alert(1)>$")
    t = SimpleTestCase()
    t.assertContains(r, "<code>$x$</code>")
    t.assertContains(r, '<div class="code"><pre class="pyg"><code>$y$\n</code></pre>')  # no language: no label
    t.assertContains(r, '<span class="math">&lt;img src=x onerror=alert(1)&gt;</span>')
    t.assertNotContains(r, "<img")


def test_a_fenced_block_is_labelled_with_its_language_or_its_file_name(ann):
    from django.test import SimpleTestCase

    r = page_of(
        ann,
        "```python\nimport os\n```\n\n```plain\nno lexer\n```\n\n    indented",
        question="```server.py\ndef f():\n    pass\n```\n\nWhat does it do?",
    )
    t = SimpleTestCase()
    t.assertContains(
        r, '<div class="code"><span class="lang">python</span><pre class="pyg"><code class="language-python">'
    )
    # an attachment's fence names its file: the label, and the lexer by the extension
    t.assertContains(
        r,
        '<div class="code"><span class="lang">server.py</span><pre class="pyg"><code class="language-server.py">'
        '<span class="k">def</span>',
    )
    t.assertContains(r, '<span class="lang">plain</span><pre class="pyg"><code class="language-plain">no lexer')
    t.assertContains(r, "<pre><code>indented\n</code></pre>")  # no fence, no label (the page wraps it)


def test_the_composer_offers_attachments_and_the_page_its_shortcuts(ann):
    from django.test import Client, SimpleTestCase

    c = Client(HTTP_HOST="127.0.0.1")
    c.force_login(ann)
    r = c.get("/chat/")
    t = SimpleTestCase()
    # hidden until the page's scripts run: without them there is nothing to attach with
    t.assertContains(r, 'id="attach" class="attach" title="Attach a text file')
    t.assertContains(r, '<input type="file" id="attach-file" data-max-bytes="262144"')
    t.assertContains(r, '<dialog id="shortcuts" class="shortcuts" aria-labelledby="shortcuts-title">')
    t.assertContains(r, "<td><kbd>Esc</kbd></td><td>stop the answer</td>")
    t.assertContains(r, 'src="/static/webui/chat-attach.js"')
