"""Stored chat messages as HTML, on the server: markdown-it-py, Pygments, then nh3's allow-list.

A message is untrusted text (the model writes what a prompt asks for). Raw HTML in it is escaped by
the parser (`html=False`), and what the renderer itself produced still passes `nh3.clean` with the
allow-list below, so neither a `<script>` nor an `<img onerror=…>` survives as markup. The page hands
the same allow-list to DOMPurify for the message being streamed (`ALLOWED`), so both sides agree.
Code blocks are coloured by Pygments (CSS classes, `static/webui/pygments.css`), by the lexer their
fence names, or by the file name it gives (```` ```app.py ````, as an attachment is inserted); a fenced
block comes in a `<div class="code">` with that name as its label (`<span class="lang">`), beside which
the page's script puts a Copy button. TeX math (`$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]`, the rules in
`texmath`) is kept as its source in `<span class="math">` (or `math display`), which the page typesets
with KaTeX.

A message's other parts (`prepare`): an assistant's thinking (markdown, as above) in a collapsed
`<details class="thinking">` above its answer; each tool call it made as a block with the tool's name and
its arguments as a key/value table (`_tool_call.html`: scalars as text, objects and lists as indented
JSON); a tool's result labelled with the tool's name (stored named: `webui.sessions.name_tool_results`),
a JSON object shown as the same table, other JSON indented, anything else as markdown. The
tables are made by the template engine (escaped) and still pass `nh3.clean`. The page's script builds
a streamed tool call into the same markup (`static/webui/chat.js`, `tool-call-template`).
"""

from __future__ import annotations

import functools
import json
from html import escape

import nh3
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.util import ClassNotFound

from .texmath import texmath

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
            "thead",
            "tbody",
            "tr",
            "sup",
            "sub",
            "kbd",
        )
    },
    "a": {"href", "title"},
    "table": {"class"},
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


def _lexer(lang: str):
    """Pygments' lexer for a fence's language (`python`) or file name (`app.py`), else None."""
    try:
        return get_lexer_by_name(lang.lower())
    except ClassNotFound:
        pass
    try:
        return get_lexer_for_filename(lang) if "." in lang else None
    except ClassNotFound:
        return None


def _highlight(code: str, info: str, _attrs) -> str:
    lang = info.split()[0] if info.split() else ""
    lexer = _lexer(lang) if lang else None
    body = highlight(code, lexer, _FORMATTER) if lexer else escape(code)
    cls = f' class="language-{escape(lang)}"' if lang else ""
    return f'<pre class="pyg"><code{cls}>{body}</code></pre>'


def _fence(self, tokens, idx, options, env) -> str:
    """A fenced block in its `div.code`, labelled with the language or file name its fence gives."""
    lang = tokens[idx].info.split()[0] if tokens[idx].info.split() else ""
    label = f'<span class="lang">{escape(lang)}</span>' if lang else ""
    return f'<div class="code">{label}{RendererHTML.fence(self, tokens, idx, options, env)}</div>\n'


_MD = MarkdownIt("commonmark", {"html": False, "highlight": _highlight}).enable(["table", "strikethrough"]).use(texmath)
_MD.add_render_rule("fence", _fence)


def clean(html: str) -> SafeString:
    """HTML made here (or by the parser) through the allow-list."""
    return mark_safe(
        nh3.clean(
            html,
            tags=set(ALLOWED),
            attributes=ALLOWED,
            url_schemes=URL_SCHEMES,
            link_rel="noopener noreferrer nofollow",
        )
    )


@functools.lru_cache(maxsize=2048)  # a long conversation's page re-renders the same messages
def markdown(text: str) -> SafeString:
    """`text` (markdown from a person or a model) as sanitized HTML."""
    return clean(_MD.render(text))


def _json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def fields(obj: dict) -> SafeString:
    """An object (a tool call's arguments, a tool's JSON result) as a key/value table."""

    def cell(value) -> str:
        if isinstance(value, (dict, list)) and value:
            return mark_safe(_highlight(_json(value), "json", None))
        return value if isinstance(value, str) and value else _json(value)  # 3, true, null, "" as JSON

    rows = [(key, cell(value)) for key, value in obj.items()]
    return clean(render_to_string("webui/chat/_fields.html", {"rows": rows}))


def tool_call_block(call: dict) -> SafeString:
    """One stored tool call ({id, name, arguments}) as its block."""
    args = call.get("arguments")
    body = fields(args) if isinstance(args, dict) else mark_safe(_highlight(_json(args), "json", None))
    return clean(render_to_string("webui/chat/_tool_call.html", {"call": call, "arguments": body}))


def tool_result(content: str) -> SafeString:
    """A tool's result: a JSON object as a table, other JSON indented, anything else as markdown."""
    try:
        value = json.loads(content)
    except ValueError:
        return markdown(content)
    if isinstance(value, dict) and value:
        return fields(value)
    if isinstance(value, (dict, list)):
        return clean(_highlight(_json(value), "json", None))
    return markdown(value if isinstance(value, str) else content)  # a JSON string: its text


def prepare(msgs: list) -> list:
    """Give each stored message what `_message.html` shows: `html` (its text), `thinking` (its reasoning),
    `calls` (its tool calls' blocks) and `tool` (a tool result's tool, else "")."""
    for m in msgs:
        m.thinking = markdown(m.reasoning) if m.reasoning else ""
        m.calls = [tool_call_block(c) for c in m.tool_calls or ()]
        m.tool = m.name if m.role == "tool" else ""
        m.html = tool_result(m.content) if m.role == "tool" else markdown(m.content)
    return msgs


def message(session, m) -> str:
    """One stored message as the page shows it (`_message.html`), for a page that replaces it live."""
    prepare([m])
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
