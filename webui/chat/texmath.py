r"""TeX math in chat messages: which text is math. The rules, the same on both sides of the page.

The server (markdown-it-py, `use(texmath)`) and the page's streamed answer (`static/webui/chat-math.js`, a
`marked` extension) cut a message into math the same way, and mark it up the same way; KaTeX typesets
it in the page (`chat-math.js`, `typeset`). Without JavaScript the TeX source shows as it was written.

    $…$       inline: the opening `$` is not followed by a space (nor by `$`); the closing `$` is the
              next one, and it is math only if that one is not preceded by a space and not followed
              by a digit (pandoc's rule: "$5 and $10" is no math, "$x$" is)
    \(…\)     inline
    $$…$$     display, inside a paragraph
    \[…\]     display, inside a paragraph
    a block   a line that starts with `$$` (or `\[`) up to a line that ends with `$$` (or `\]`),
              no blank line between; it does not interrupt a paragraph (there the inline rule takes it)

A backslash inside math escapes the next character (`$\$5$` is math), an escaped `\$` outside it is
a dollar sign, and code (fenced, indented or inline) is never math: code spans and escapes are
consumed before the math rules see their `$`, and inline math holds no backtick, so a `$` inside a
later code span closes nothing ("$10 and `$x$`" is no math). Empty math is text: `$$` alone.

Markup: `<span class="math">TeX</span>` inline, `<span class="math display">TeX</span>` display in
a paragraph, `<div class="math display">TeX</div>` a block; the TeX escaped, classes only (the
allow-list in `render.py` keeps them).

mdit-py-plugins' dollarmath was tried first: set to refuse "$5 and $10", its check of the character
before an opening `$` reads the paragraph's last character when the `$` comes first (`src[-1]`), so
"$x$ is 5" was not math; and the browser needs the same rules written for marked in any case.
"""

from __future__ import annotations

from html import escape

from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline

# opener → (closer, display); tried in this order at a `$` or a `\`
INLINE = (("$$", "$$", True), ("\\[", "\\]", True), ("\\(", "\\)", False), ("$", "$", False))
BLOCK = (("$$", "$$"), ("\\[", "\\]"))


def closing(src: str, start: int, end: int, closer: str) -> int:
    """Where `closer` first occurs in src[start:end], a backslash skipping the character after it; -1 if not,
    or if a backtick comes first (inline math holds none, so a code span's `$` closes nothing)."""
    i = start
    while i < end:
        if src.startswith(closer, i):
            return i
        if src[i] == "`":
            return -1
        i += 2 if src[i] == "\\" else 1
    return -1


def inline_math(src: str, pos: int, end: int) -> tuple[str, bool, int] | None:
    """The math that starts at src[pos] (and ends by `end`): (TeX, display, position after it), else None."""
    for opener, closer, display in INLINE:
        if not src.startswith(opener, pos):
            continue
        start = pos + len(opener)
        if opener == "$" and (start >= end or src[start].isspace() or src[start] == "$"):
            return None
        stop = closing(src, start, end, closer)
        if stop < 0:
            return None
        after = stop + len(closer)
        if opener == "$" and (src[stop - 1].isspace() or (after < end and src[after] in "0123456789")):
            return None
        tex = src[start:stop].strip()
        return (tex, display, after) if tex else None
    return None


def _inline_rule(state: StateInline, silent: bool) -> bool:
    found = inline_math(state.src, state.pos, state.posMax)
    if not found:
        return False
    tex, display, after = found
    if not silent:
        token = state.push("math_display" if display else "math_inline", "span", 0)
        token.content = tex
    state.pos = after
    return True


def _block_rule(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
    if state.is_code_block(start_line):
        return False
    begin = state.bMarks[start_line] + state.tShift[start_line]
    first = state.src[begin : state.eMarks[start_line]].rstrip()
    opener, closer = next(((o, c) for o, c in BLOCK if first.startswith(o)), ("", ""))
    if not opener:
        return False
    rest = first[len(opener) :]
    lines = []
    line = start_line
    if rest.endswith(closer) and len(rest) >= len(closer):  # on one line: $$ x $$
        lines.append(rest[: -len(closer)])
    elif closer in rest:  # `$$x$$ and more`: a paragraph's
        return False
    else:
        lines.append(rest)
        while True:
            line += 1
            if line >= end_line:
                return False
            text = state.src[state.bMarks[line] + state.tShift[line] : state.eMarks[line]].rstrip()
            if not text or state.sCount[line] < state.blkIndent:
                return False  # a blank line, or the container ended: no block
            if text.endswith(closer):
                lines.append(text[: -len(closer)])
                break
            lines.append(text)
    tex = "\n".join(lines).strip()
    if not tex:
        return False
    if not silent:
        token = state.push("math_block", "div", 0)
        token.block = True
        token.content = tex
        token.map = [start_line, line + 1]
    state.line = line + 1
    return True


def texmath(md: MarkdownIt) -> None:
    """The rules above as a markdown-it plugin: `MarkdownIt(...).use(texmath)`."""
    md.inline.ruler.before("escape", "math", _inline_rule)
    md.block.ruler.before("fence", "math_block", _block_rule)
    md.add_render_rule(
        "math_inline", lambda self, tokens, idx, *_: f'<span class="math">{escape(tokens[idx].content)}</span>'
    )
    md.add_render_rule(
        "math_display", lambda self, tokens, idx, *_: f'<span class="math display">{escape(tokens[idx].content)}</span>'
    )
    md.add_render_rule(
        "math_block", lambda self, tokens, idx, *_: f'<div class="math display">{escape(tokens[idx].content)}</div>\n'
    )
