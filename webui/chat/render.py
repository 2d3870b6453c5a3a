"""Stored chat messages as HTML, on the server: markdown-it-py, Pygments, then nh3's allow-list.

A message is untrusted text (the model writes what a prompt asks for). Raw HTML in it is escaped by
the parser (`html=False`), and what the renderer itself produced still passes `nh3.clean` with the
allow-list below, so neither a `<script>` nor an `<img onerror=…>` survives as markup. The page hands
the same allow-list to DOMPurify for the message being streamed (`ALLOWED`), so both sides agree.
Code blocks are coloured by Pygments (CSS classes, `static/webui/pygments.css`); the page's script
adds the copy buttons.
"""

from __future__ import annotations

import functools
from html import escape

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# tag → the attributes it may keep; no images, forms, styles or scripts, ever
ALLOWED: dict[str, set[str]] = {
    **{
        t: set()
        for t in (
            "p",
            "br",
            "hr",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "strong",
            "em",
            "del",
            "s",
            "blockquote",
            "ul",
            "li",
            "table",
            "thead",
            "tbody",
            "tr",
            "sup",
            "sub",
            "kbd",
        )
    },
    "a": {"href", "title"},
    "ol": {"start"},
    "th": {"align"},
    "td": {"align"},
    "pre": {"class"},
    "code": {"class"},
    "span": {"class"},
    "div": {"class"},
}
URL_SCHEMES = {"http", "https", "mailto"}
_FORMATTER = HtmlFormatter(nowrap=True)


def _highlight(code: str, info: str, _attrs) -> str:
    lang = info.split()[0].lower() if info.split() else ""
    try:
        body = highlight(code, get_lexer_by_name(lang), _FORMATTER) if lang else escape(code)
    except ClassNotFound:
        body = escape(code)
    cls = f' class="language-{escape(lang)}"' if lang else ""
    return f'<pre class="pyg"><code{cls}>{body}</code></pre>'


_MD = MarkdownIt("commonmark", {"html": False, "highlight": _highlight}).enable(["table", "strikethrough"])


@functools.lru_cache(maxsize=2048)  # a long conversation's page re-renders the same messages
def markdown(text: str) -> SafeString:
    """`text` (markdown from a person or a model) as sanitized HTML."""
    html = _MD.render(text)
    clean = nh3.clean(
        html, tags=set(ALLOWED), attributes=ALLOWED, url_schemes=URL_SCHEMES, link_rel="noopener noreferrer nofollow"
    )
    return mark_safe(clean)


def message(session, m) -> str:
    """One stored message as the page shows it (`_message.html`), for a page that replaces it live."""
    from django.template.loader import render_to_string

    m.html = markdown(m.content)
    return render_to_string("webui/chat/_message.html", {"m": m, "session": session})


def pygments_css() -> str:
    """The style sheet of `static/webui/pygments.css` (light, and dark under prefers-color-scheme): the
    token colours only; the code's background and font are the page's."""

    def rules(style: str) -> str:
        defs = HtmlFormatter(style=style).get_style_defs(".pyg").splitlines()
        return "\n".join(line for line in defs if line.startswith(".pyg ."))

    return (
        f"/* made by webui.chat.render.pygments_css(): Pygments' default and github-dark styles */\n"
        f"{rules('default')}\n@media (prefers-color-scheme: dark) {{\n{rules('github-dark')}\n}}\n"
    )
