"""Reading an answer as it streams: content, reasoning and tool calls apart, in the family's syntax.

`OutputParser.feed(text)` takes the answer's text as the detokenizer releases it (special tokens kept,
so the markers are visible) and returns the events it completes: `TextDelta` with channel "content"
or "reasoning", and `ToolCallDelta`. Text that could be the start of a marker is held back until it is
known not to be one. Whitespace at the edges of a reasoning block, and between a block or a call and
the content after it, is dropped, as the templates drop it when they render the turn back.

Tool calls stream as their family allows: a Hermes call sends its name as soon as it is written and
then its arguments' JSON text piece by piece (a string-aware brace count finds where they end); a
Gemma 4 call sends its name, then its arguments (converted to JSON) when the call closes; a generic
answer streams `{"response": "…"}` text as content while it is written and sends its calls at the end.
A call the parser cannot read (possible only where no grammar held the model) is passed on as content.
"""

from __future__ import annotations

import json
import secrets

from ..events import TextDelta, ToolCall, ToolCallDelta
from .families import _HERMES_HEAD, Family, parse_call

_GENERIC_RESPONSE = '{"response": "'
_GENERIC_CALLS = '{"tool_calls": ['
_DECODER = json.JSONDecoder()


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class OutputParser:
    """Splits one answer into content, reasoning and tool calls (see the module docstring).

    Args:
        family: the model's format.
        tools: parse tool calls (False: a call marker is plain text).
        in_reasoning: the prompt ended inside a reasoning block (the template opened it).
        generic_json: the whole answer is the generic format's JSON object.
    """

    def __init__(self, family: Family, *, tools: bool, in_reasoning: bool = False, generic_json: bool = False):
        self.family = family
        self.tools = tools and family.call_open is not None
        self.state = "generic" if generic_json else ("reasoning" if in_reasoning else "content")
        self.pending = ""  # text not yet classified
        self.strip_lead = True
        self.held_ws = ""  # trailing whitespace held back in the current channel
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self._current: dict | None = None  # the call being read: {id, name, sent, depth}
        self._generic_sent = 0

    # --- public ---------------------------------------------------------------------------------
    def feed(self, text: str) -> list:
        self.pending += text
        out: list = []
        while True:
            before = (self.state, len(self.pending))
            step = self._step()
            out += step(final=False)
            if (self.state, len(self.pending)) == before:
                return out

    def finish(self) -> list:
        """Everything still held back, at the end of the answer."""
        out = self._step()(final=True)
        self.held_ws = ""  # trailing whitespace of the answer is dropped
        return out

    @property
    def text(self) -> str:
        return "".join(self.content)

    # --- states -----------------------------------------------------------------------------------
    def _step(self):
        return {
            "content": self._content,
            "reasoning": self._reasoning,
            "call": self._call_state,
            "generic": self._generic,
        }[self.state]

    def _markers(self) -> dict[str, str]:
        if self.state == "content":
            m = {}
            if self.family.reasoning:
                m[self.family.reasoning[0]] = "reasoning"
            if self.tools:
                m[self.family.call_open] = "call"
            return m
        return {self.family.reasoning[1]: "content"}

    def _content(self, final: bool) -> list:
        return self._channel("content", final)

    def _reasoning(self, final: bool) -> list:
        return self._channel("reasoning", final)

    def _channel(self, channel: str, final: bool) -> list:
        markers = self._markers()
        hits = [(self.pending.find(m), m) for m in markers if m in self.pending]
        if hits:
            at, marker = min(hits)
            out = self._emit(channel, self.pending[:at], boundary=True)
            self.pending = self.pending[at + len(marker) :]
            self.state = markers[marker]
            self.strip_lead = True
            if self.state == "call":
                self._current = {"id": new_call_id(), "name": None, "sent": 0, "depth": None}
            return out
        keep = 0 if final else max((_prefix_overlap(self.pending, m) for m in markers), default=0)
        text, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return self._emit(channel, text, boundary=final)

    def _emit(self, channel: str, text: str, boundary: bool) -> list:
        if self.strip_lead:
            text = text.lstrip()
            if text:
                self.strip_lead = False
        text = self.held_ws + text
        stripped = text.rstrip()
        self.held_ws = "" if boundary else text[len(stripped) :]
        if not stripped:
            return []
        (self.content if channel == "content" else self.reasoning).append(stripped)
        return [TextDelta(stripped, channel)]

    def _generic(self, final: bool) -> list:
        buf = self.pending
        if buf.startswith(_GENERIC_RESPONSE):
            text, done = _json_string_prefix(buf[len(_GENERIC_RESPONSE) :])
            out = []
            if len(text) > self._generic_sent:
                piece = text[self._generic_sent :]
                self._generic_sent = len(text)
                out = self._emit("content", piece, boundary=done or final)
            return out
        if buf.startswith(_GENERIC_CALLS):  # each call is sent as soon as its object is complete
            out = []
            while True:
                at = len(_GENERIC_CALLS) + self._generic_sent
                at += len(buf[at:]) - len(buf[at:].lstrip(", "))
                try:
                    c, end = _DECODER.raw_decode(buf, at)
                except ValueError:
                    break
                self._generic_sent = end - len(_GENERIC_CALLS)
                if isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict):
                    out += self._add_call(new_call_id(), c["name"], c["arguments"], name_sent=False)
            return out  # calls cut short by the length limit are dropped, never shown as JSON text
        if not final or _GENERIC_RESPONSE.startswith(buf) or _GENERIC_CALLS.startswith(buf):
            return []
        return self._emit("content", buf, boundary=True)

    def _call_state(self, final: bool) -> list:
        """The `call` state: text after a call's opening marker, up to its closing one."""
        c, close = self._current, self.family.call_close
        out = []
        end = self.pending.find(close)
        body = self.pending if end < 0 else self.pending[:end]
        index = len(self.calls)
        if self.family.name == "hermes":
            if c["name"] is None and (m := _HERMES_HEAD.match(body)):
                c["name"], c["args_at"] = json.loads(f'"{m.group(1)}"'), m.end()
                out.append(ToolCallDelta(index, c["id"], c["name"], ""))
            if c["name"] is not None and c["depth"] != 0:
                piece, c["depth"], used = _json_object_piece(body[c["args_at"] + c["sent"] :], c["depth"])
                if piece:
                    c["sent"] += used
                    out.append(ToolCallDelta(index, c["id"], None, piece))
        elif self.family.name == "gemma4" and c["name"] is None and "{" in body:
            c["name"] = body[: body.index("{")].strip().removeprefix("call:")
            out.append(ToolCallDelta(index, c["id"], c["name"], ""))
        if end < 0 and not final:
            return out
        self.pending = "" if end < 0 else self.pending[end + len(close) :]
        self.state, self.strip_lead = "content", True
        try:
            name, args = parse_call(self.family, body)
        except ValueError:
            return out + self._emit("content", self.family.call_open + body, boundary=True)
        streamed = c["sent"] > 0
        return out + self._add_call(
            c["id"], name, args, name_sent=c["name"] is not None, args_sent="x" if streamed else ""
        )

    def _add_call(self, call_id: str, name: str, args: dict, *, name_sent: bool, args_sent: str = "") -> list:
        index = len(self.calls)
        self.calls.append(ToolCall(call_id, name, args))
        out = [] if name_sent else [ToolCallDelta(index, call_id, name, "")]
        rest = json.dumps(args, ensure_ascii=False) if not args_sent else ""
        if rest:
            out.append(ToolCallDelta(index, call_id, None, rest))
        return out


def _prefix_overlap(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _json_object_piece(text: str, depth: int | None) -> tuple[str, int | None, int]:
    """The part of `text` (arguments' JSON, from where the last piece ended) that is surely inside the object.

    Returns (piece, depth after it, characters used). `depth` None: the object has not begun; 0: it ended.
    A string's characters are counted only when the whole string is in `text` (no escape cut in half).
    """
    i, n, in_str, start_str = 0, len(text), False, 0
    d = depth
    used = 0
    while i < n:
        ch = text[i]
        if in_str:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                in_str = False
                used = i + 1
        elif ch == '"':
            in_str, start_str = True, i
        elif ch == "{" or ch == "[":
            d = (d or 0) + 1
            used = i + 1
        elif ch == "}" or ch == "]":
            d = (d or 0) - 1
            used = i + 1
            if d == 0:
                break
        elif d is not None or not ch.isspace():
            used = i + 1
        i += 1
    if in_str:
        used = min(used, start_str) if used > start_str else used
    return text[:used], d, used


def _json_string_prefix(text: str) -> tuple[str, bool]:
    """The decoded characters of a JSON string's body `text` so far, and whether its closing quote came."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return "".join(out), True
        if ch == "\\":
            if i + 1 >= len(text):
                break
            esc = text[i + 1]
            if esc == "u":
                if i + 6 > len(text):
                    break
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(esc, esc))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out), False
