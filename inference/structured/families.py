"""Tool-call and thinking formats per model family, found in the model's own chat template.

A family says how the model writes (and the template renders) a tool call and its reasoning:

- `hermes` (Qwen3, Qwen2.5, Hermes): `<tool_call>\\n{"name": N, "arguments": {…}}\\n</tool_call>`, one
  block per call; reasoning in `<think>…</think>`.
- `gemma4`: `<|tool_call>call:N{key:value,…}<tool_call|>`, strings quoted by `<|"|>`, keys bare;
  reasoning in the `<|channel>thought…<channel|>` channel.
- `generic`, for templates without tools (the demo SmolLM2): the answer is one JSON object, either
  `{"tool_calls": [{"name": N, "arguments": {…}}]}` or `{"response": "…"}`, constrained from its first
  token (llama.cpp's generic handler is the model for it); the tools and this format are described to
  the model in a system message (`GENERIC_INSTRUCTIONS`).

`lark_marker` writes a marker as the single token it is in the vocabulary when it is one, else as text.
The argument grammars come from each tool's JSON schema: `%json` for the JSON families, and
`gemma_value` for Gemma 4's own syntax (types, enums, arrays, nested objects, anyOf; other keywords
are refused with a `StructureError` naming them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .grammar import StructureError

GENERIC_INSTRUCTIONS = (
    "You can call these tools:\n{tools}\n\n"
    "Answer with one JSON object: either "
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}} to call tools, '
    'or {{"response": "<your answer>"}} to answer the user directly.'
)
MAX_PARALLEL = 8  # calls in one generic answer: a small model may otherwise repeat one call to the end of the context
# compact and fixed, as the templates render JSON: the parser may then stream `{"response": "` text
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class Family:
    name: str  # "hermes", "gemma4" or "generic"
    call_open: str | None  # the text that opens one call (None: generic, the whole answer is JSON)
    call_close: str | None
    reasoning: tuple[str, str] | None  # (open, close) markers of a reasoning block; None: no thinking mode
    thinks_by_default: bool


HERMES = Family("hermes", "<tool_call>", "</tool_call>", None, False)
GEMMA4 = Family("gemma4", "<|tool_call>", "<tool_call|>", None, False)
GENERIC = Family("generic", None, None, None, False)


def detect(template: str) -> Family:
    """The family of the chat template `template` (its source text)."""
    reasoning, default = None, False
    if "<think>" in template and "</think>" in template:
        reasoning = ("<think>", "</think>")
        default = "enable_thinking" not in template or "default(false)" not in template.replace(" ", "")
    elif "<|channel>" in template and "<channel|>" in template:
        reasoning = ("<|channel>thought", "<channel|>")
        default = "default(false)" not in template.replace(" ", "")
    if "<|tool_call>" in template and "tools" in template:
        base = GEMMA4
    elif "<tool_call>" in template and "tools" in template:
        base = HERMES
    else:
        base = GENERIC
    return Family(base.name, base.call_open, base.call_close, reasoning, default)


def lark_marker(text: str, token_id) -> str:
    """`text` in a Lark rule: its one token `<[id]>` when `token_id(text)` names one, else the literal."""
    i = token_id(text)
    return f"<[{i}]>" if i is not None else json.dumps(text)


def tool_names(tools: list[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def _params(tool: dict) -> dict:
    """A tool's parameter schema, closed to properties it does not declare (a call with made-up keys fails)."""
    schema = dict(tool["function"].get("parameters") or {"type": "object", "properties": {}})
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return schema


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema):
    """`schema` with every object that lists `properties` and says nothing of `additionalProperties` closed
    to the properties it lists, at any depth, as llama.cpp's and Ollama's schema grammars read it: a model
    asked for {"summary": …} writes that object, not the summary followed by keys it made up."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(v) for v in out[key]]
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    return out


def json_schema_lark(schema: dict) -> str:
    """The `%json` rule of a JSON schema (objects closed as `closed` says), in the templates' compact style."""
    return "%json " + json.dumps({**closed(schema), "x-guidance": JSON_STYLE})


# --- one call's grammar, from its opening marker to its closing one ---------------------------------
def call_grammar(family: Family, tools: list[dict], token_id) -> list[str]:
    """Lark rules whose rule `call` is one tool call of `tools` in `family`'s syntax, markers included."""
    if family.name == "hermes":
        rules = [
            f'call: {lark_marker(family.call_open, token_id)} "\\n" ({" | ".join(f"f{i}" for i in range(len(tools)))})'
            f' "\\n" {lark_marker(family.call_close, token_id)}'
        ]
        for i, t in enumerate(tools):
            head = json.dumps('{"name": ' + json.dumps(t["function"]["name"]) + ', "arguments": ')
            rules.append(f'f{i}: {head} a{i} "}}"')
            rules.append(f"a{i}: {json_schema_lark(_params(t))}")
        return rules
    if family.name == "gemma4":
        g = _GemmaGrammar(token_id)
        alts = []
        for i, t in enumerate(tools):
            rule = g.value(_params(t), f"tools[{i}].function.parameters", top=True)
            alts.append(f"{json.dumps('call:' + t['function']['name'])} {rule}")
        return [
            f"call: {lark_marker(family.call_open, token_id)} ({' | '.join(alts)}) {lark_marker(family.call_close, token_id)}",
            *g.rules,
        ]
    raise AssertionError(family.name)


def generic_schema(tools: list[dict], *, required: bool, parallel: bool, response: dict | None) -> dict:
    """The JSON schema of a whole generic-format answer."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t["function"]["name"]}, "arguments": _params(t)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    calls = {"type": "array", "items": call, "minItems": 1, "maxItems": MAX_PARALLEL if parallel else 1}
    with_calls = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if required:
        return with_calls
    answer = {
        "type": "object",
        "properties": {"response": response or {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    return {"anyOf": [with_calls, answer]}


# --- Gemma 4's argument syntax --------------------------------------------------------------------
_SIMPLE = {
    "integer": r"/-?(0|[1-9][0-9]*)/",
    "number": r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/",
    "boolean": '("true" | "false")',
    "null": '"null"',
}
_ANNOTATIONS = {
    "description",
    "title",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "nullable",
    "additionalProperties",
    "strict",
}
_KNOWN = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "anyOf",
    "oneOf",
    "const",
    "minItems",
    "maxItems",
}


class _GemmaGrammar:
    """Lark rules for values in Gemma 4's call syntax, one rule per schema node."""

    def __init__(self, token_id):
        self.token_id = token_id
        self.rules: list[str] = []
        q = token_id('<|"|>')
        if q is not None:  # the quote is one token: the text between two quote tokens is free of it
            self.rules.append(f"gstr: <[{q}]> GTEXT <[{q}]>\nGTEXT: /[^\\x00]*/")
        else:
            self.rules.append('gstr: GSTR\nGSTR: "<|\\"|>" (/(?s:.*)/ & ~/(?s:.*<\\|"\\|>.*)/) "<|\\"|>"')

    def _new(self, body: str) -> str:
        name = f"g{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def value(self, schema: dict, where: str, top: bool = False) -> str:
        if not isinstance(schema, dict):
            raise StructureError(where, f"{where} must be a JSON schema object")
        unknown = sorted(set(schema) - _KNOWN)
        if unknown:
            raise StructureError(
                where, f"{where}: keyword {unknown[0]!r} is not supported in Gemma 4's tool-call syntax; remove it"
            )
        if "const" in schema:
            return self._literal(schema["const"], where)
        if "enum" in schema:
            return self._new(" | ".join(self._literal(v, where) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._new(" | ".join(self.value(s, f"{where}.{key}[{i}]") for i, s in enumerate(schema[key])))
        kind = schema.get("type", "object" if "properties" in schema else None)
        if isinstance(kind, list):
            return self._new(" | ".join(self.value({**schema, "type": k}, where) for k in kind))
        if kind == "string":
            return "gstr"
        if kind in _SIMPLE:
            return self._new(_SIMPLE[kind])
        if kind == "array":
            item = self.value(schema.get("items") or {"type": "string"}, f"{where}.items")
            return self._new(f'"[" ({item} ("," {item})*)? "]"')
        if kind == "object":
            return self._object(schema, where)
        raise StructureError(
            where, f"{where}: type {kind!r} is not supported; use string, number, integer, boolean, array or object"
        )

    def _object(self, schema: dict, where: str) -> str:
        props = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        keys = sorted(props)  # the order the template renders them in (dictsort)
        kv = {k: f"{json.dumps(k + ':')} {self.value(props[k], f'{where}.properties.{k}')}" for k in keys}
        # F[i] / R[i]: the pairs from keys[i] on, before / after the first pair is written ("": nothing)
        F, R = [""] * (len(keys) + 1), [""] * (len(keys) + 1)
        for i in range(len(keys) - 1, -1, -1):
            k = keys[i]
            take_f, take_r = f"{kv[k]} {R[i + 1]}".strip(), f'"," {kv[k]} {R[i + 1]}'.strip()
            if k in required:
                F[i], R[i] = self._new(take_f), self._new(take_r)
            else:
                F[i] = self._new(f"{take_f} | {F[i + 1]}" if F[i + 1] else f"({take_f})?")
                R[i] = self._new(f"{take_r} | {R[i + 1]}" if R[i + 1] else f"({take_r})?")
        return self._new(f'"{{" {F[0]} "}}"'.replace("  ", " "))

    def _literal(self, value, where: str) -> str:
        if isinstance(value, str):
            q = self.token_id('<|"|>')
            return f"<[{q}]> {json.dumps(value)} <[{q}]>" if q is not None else json.dumps(f'<|"|>{value}<|"|>')
        if isinstance(value, bool):
            return json.dumps("true" if value else "false")
        if value is None or isinstance(value, (int, float)):
            return json.dumps(json.dumps(value))
        raise StructureError(where, f"{where}: enum/const values must be strings, numbers, booleans or null")


# --- reading what the model wrote -------------------------------------------------------------------
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*', re.S)


def parse_call(family: Family, body: str) -> tuple[str, dict]:
    """(name, arguments) of one call's text between its markers.

    Raises:
        ValueError: the text is not a call in the family's syntax.
    """
    body = body.strip()
    if family.name == "hermes":
        obj = json.loads(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ValueError("a tool call must be a JSON object with a name")
        args = obj.get("arguments") or {}
        if isinstance(args, str):
            args = json.loads(args)
        return obj["name"], args
    if family.name == "gemma4":
        m = re.match(r"call:([^{\s]+)\s*", body)
        if not m:
            raise ValueError("a Gemma 4 tool call starts with call:NAME")
        value, end = _GemmaReader(body).value(m.end())
        if not isinstance(value, dict) or body[end:].strip():
            raise ValueError("a Gemma 4 tool call's arguments are one {…} object")
        return m.group(1), value
    raise AssertionError(family.name)


class _GemmaReader:
    """Reads Gemma 4's argument syntax: {key:value,…}, [a,…], <|"|>text<|"|>, numbers, true/false/null."""

    Q = '<|"|>'

    def __init__(self, text: str):
        self.s = text

    def value(self, i: int):
        s = self.s
        if s.startswith(self.Q, i):
            end = s.find(self.Q, i + len(self.Q))
            if end < 0:
                raise ValueError("unterminated string")
            return s[i + len(self.Q) : end], end + len(self.Q)
        if s.startswith("{", i):
            out, i = {}, i + 1
            while not s.startswith("}", i):
                if out:
                    i = self._expect(",", i)
                if s.startswith(self.Q, i):
                    key, i = self.value(i)
                else:
                    m = re.compile(r"[^:,{}\[\]]+").match(s, i)
                    if not m:
                        raise ValueError(f"a key expected at {i}")
                    key, i = m.group(0).strip(), m.end()
                i = self._expect(":", i)
                out[key], i = self.value(i)
            return out, i + 1
        if s.startswith("[", i):
            out, i = [], i + 1
            while not s.startswith("]", i):
                if out:
                    i = self._expect(",", i)
                v, i = self.value(i)
                out.append(v)
            return out, i + 1
        m = re.compile(r"true|false|null|-?\d+(\.\d+)?([eE][-+]?\d+)?").match(s, i)
        if not m:
            raise ValueError(f"a value expected at {i}")
        return json.loads(m.group(0)), m.end()

    def _expect(self, ch: str, i: int) -> int:
        if not self.s.startswith(ch, i):
            raise ValueError(f"{ch!r} expected at {i}")
        return i + 1
