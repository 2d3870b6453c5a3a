"""Structured answers: tool calls, JSON output formats and thinking, in each model's own format.

The request side (`SamplingParams`): `tools`, `tool_choice` ("none", "auto", "required" or
{"type": "function", "function": {"name": N}}), `parallel_tool_calls`, `format` (a JSON schema the
answer must match), `think` (None: the template's default), `logit_bias`.

`prompt_messages` renders what the template needs: a template that declares tools gets them as they
are; one without (family `generic`) gets them described in a system message, and earlier calls and
results written in the generic format. `Plan` then runs beside the token loop:

- `mask(logits)` adds the logit bias and applies the active grammar;
- `accept(token)` advances the grammar, starts a lazy one when the model opens a tool call (text
  before it stays free), and says when the answer must end (a forced call or a format completed);
- `feed(text)` / `finish()` turn the detokenized text into content, reasoning and tool-call events.

When the grammar starts: a JSON `format`, the generic format and a forced call (`required` or a named
function) are constrained from the first token, with an optional reasoning block first when the model
thinks; `auto` calls in a native family are constrained from their opening marker (llama.cpp's lazy
grammars). Every grammar is compiled at `Plan` construction, so a bad schema fails before any compute.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from .families import (
    GENERIC_INSTRUCTIONS,
    _params,
    Family,
    call_grammar,
    detect,
    generic_schema,
    json_schema_lark,
    lark_marker,
    tool_names,
)
from .grammar import Constraint, Grammars, StructureError
from .stream import OutputParser

__all__ = ["Plan", "StructureError", "capabilities", "detect", "prompt_messages", "check_tools", "Grammars"]
log = logging.getLogger("rkmojo.structured")
LEAD_WS = r"/[ \n]{0,4}/"  # whitespace allowed between a reasoning block and a constrained answer


def capabilities(template: str) -> dict[str, bool]:
    """What a chat template supports: tools (native, or the generic format: always) and thinking."""
    return {"tools": True, "thinking": detect(template).reasoning is not None}


def check_tools(tools, tool_choice) -> tuple[list[dict], str | None, bool]:
    """Validated (tools, forced function name or None, tools in use) of a request.

    Raises:
        StructureError: a malformed tool, or a tool_choice that names no tool.
    """
    tools = list(tools or [])
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise StructureError(f"tools[{i}]", f'tools[{i}] must be {{"type": "function", "function": {{"name": …}}}}')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise StructureError(f"tools[{i}].function.name", f"tools[{i}].function.name must be a non-empty string")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise StructureError(
                f"tools[{i}].function.parameters",
                f"tools[{i}].function.parameters must be a JSON schema of type object",
            )
    names = tool_names(tools)
    forced = None
    choice = tool_choice if tool_choice is not None else "auto"
    if isinstance(choice, dict):
        forced = (choice.get("function") or {}).get("name") or choice.get("name")
        if forced not in names:
            raise StructureError(
                "tool_choice",
                f"tool_choice names function {forced!r}, which is not among the tools ({', '.join(names) or 'none given'})",
            )
    elif choice not in ("none", "auto", "required"):
        raise StructureError("tool_choice", f"tool_choice {choice!r} is not one of none, auto, required or a function")
    elif choice == "required" and not tools:
        raise StructureError("tool_choice", "tool_choice is required but no tools were given")
    return tools, forced, bool(tools) and choice != "none"


def prompt_messages(
    family: Family, messages: list[dict], tools: list[dict], use_tools: bool
) -> tuple[list[dict], list | None]:
    """(messages, tools) to render: as they are for a native family; the generic format's otherwise."""
    # a turn that only calls tools has no content; templates read it all the same (Qwen3's fails without it)
    messages = [{**m, "content": ""} if m.get("content") is None else m for m in messages]
    if family.name != "generic":
        return messages, (tools if use_tools else None)
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            m = {"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)}
        elif m.get("role") == "tool":
            name = m.get("name") or "tool"
            m = {
                "role": "tool",
                "content": json.dumps(
                    {"tool_response": {"name": name, "content": m.get("content")}}, ensure_ascii=False
                ),
            }
        out.append(m)
    if use_tools:
        described = GENERIC_INSTRUCTIONS.format(
            tools="\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
        )
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{described}".strip()}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out, None


class Plan:
    """One answer's grammar schedule, logit bias and output parser (see the module docstring).

    Args:
        grammars: the store's grammar compiler.
        family: the template's family.
        tokenizer: the store's `StoreTokenizer`.
        params: the resolved `SamplingParams`.
        chat: the prompt was rendered by the chat template (parse reasoning and tool calls).
        prompt_text: the rendered prompt (to see whether it ends inside a reasoning block).
    Raises:
        StructureError: a bad tool, tool choice, schema or thinking switch.
    """

    def __init__(self, grammars: Grammars, family: Family, tokenizer, params, *, chat: bool, prompt_text: str = ""):
        self.family = family
        self.tokenizer = tokenizer
        token_id = tokenizer.tok.token_to_id
        self.bias = _bias(params.logit_bias, grammars.n_vocab)
        tools, forced, use_tools = check_tools(params.tools, params.tool_choice) if chat else ([], None, False)
        if params.think and chat and family.reasoning is None:
            raise StructureError("think", "this model's chat template has no thinking mode; leave think unset or false")
        thinking = (
            chat
            and family.reasoning is not None
            and (params.think if params.think is not None else family.thinks_by_default)
        )
        in_reasoning = bool(thinking and prompt_text.rstrip().endswith(family.reasoning[0]))
        self.parallel = params.parallel_tool_calls
        if forced:
            tools = [t for t in tools if t["function"]["name"] == forced]
        required = use_tools and (forced is not None or params.tool_choice == "required")
        self.active: Constraint | None = None
        self.lazy: str | None = None  # the grammar started at a call's opening marker
        self.end_when_done = False
        generic = family.name == "generic" and use_tools
        fmt = params.format
        if fmt is not None and not isinstance(fmt, dict):
            raise StructureError("format", "format must be a JSON schema object")
        for i, t in enumerate(tools):  # each schema alone first, so an error names its tool
            grammars.constraint("start: " + json_schema_lark(_params(t)), f"tools[{i}].function.parameters")
        head = self._reasoning_rule(token_id) if thinking and not in_reasoning else ""
        if generic:
            schema = generic_schema(tools, required=required, parallel=self.parallel, response=fmt)
            self.active = grammars.constraint(self._start(head, json_schema_lark(schema)), "tools")
            self.end_when_done = True
        elif required:
            rules = call_grammar(family, tools, token_id)
            body = 'call ("\\n" call)*' if self.parallel else "call"
            self.active = grammars.constraint(self._start(head, body, rules), "tools")
            self.end_when_done = True
        elif fmt is not None:
            self.active = grammars.constraint(self._start(head, json_schema_lark(fmt)), "format")
            self.end_when_done = True
        if use_tools and not required and not generic:
            rules = call_grammar(family, tools, token_id)
            self.lazy = "\n".join(["start: callbody", *_after_open(rules)])
            grammars.constraint(self.lazy, "tools")  # compiled now: a bad schema fails before any compute
        self.grammars = grammars
        self.parser = (
            OutputParser(family, tools=use_tools, in_reasoning=in_reasoning, generic_json=generic)
            if chat and (use_tools or family.reasoning or generic)
            else None
        )
        self.keep_special = self.parser is not None and not generic
        self._raw = ""
        self._searched = 0
        self._decoder = tokenizer.decoder(skip_special_tokens=False) if self.lazy else None

    @staticmethod
    def _start(head: str, body: str, rules=()) -> str:
        first = f"start: {head} {LEAD_WS} {body}" if head else f"start: {body}"
        return "\n".join([first, *(rules or []), *([] if not head else [_RTEXT])])

    def _reasoning_rule(self, token_id) -> str:
        open_, close = self.family.reasoning
        return f"({_marker_seq(open_, token_id)} RTEXT {_marker_seq(close, token_id)})?"

    # --- the token loop's side ----------------------------------------------------------------------
    @property
    def masking(self) -> bool:
        """The next token's logits will be changed (a bias, or an active grammar)."""
        return self.bias is not None or self.active is not None

    def mask(self, logits: np.ndarray) -> None:
        if self.bias is not None:
            logits[self.bias[0]] += self.bias[1]
        if self.active is not None:
            self.active.apply(logits)

    def ends(self, token: int) -> bool:
        """The sampled `token` ends the answer: an end-of-sequence id the active grammar allows."""
        return self.active is not None and self.active.ends(token)

    def accept(self, token: int) -> bool:
        """Advance by the sampled `token`; True: the answer must end now."""
        raw_piece = self._decoder.push(token) if self._decoder is not None else ""
        if self.active is not None:
            if not self.active.accept(token):
                log.warning("the grammar refused a token it allowed; the rest of the answer is unconstrained")
                self.active = None
                return False
            if self.active.done:
                self.active = None
                return self.end_when_done or not self.parallel
            return False
        if self.lazy is None:
            return False
        self._raw += raw_piece
        at = self._raw.find(self.family.call_open, self._searched)
        if at < 0:
            self._searched = max(0, len(self._raw) - len(self.family.call_open))
            return False
        rest = self._raw[at + len(self.family.call_open) :]
        self._raw, self._searched = "", 0
        self.active = self.grammars.constraint(self.lazy, "tools")
        if rest and not self.active.accept_text(self.tokenizer.encode(rest, add_special_tokens=False)):
            self.active = None
        return False

    def feed(self, text: str) -> list:
        return self.parser.feed(text) if self.parser else []

    def finish(self) -> list:
        return self.parser.finish() if self.parser else []


_RTEXT = "RTEXT: /(?s:.*)/"


def _marker_seq(text: str, token_id) -> str:
    """A marker as Lark: its one token, or a leading special token and the text after it, or plain text."""
    if token_id(text) is not None:
        return lark_marker(text, token_id)
    for cut in range(len(text) - 1, 0, -1):
        if token_id(text[:cut]) is not None:
            return f"{lark_marker(text[:cut], token_id)} {json.dumps(text[cut:])}"
    return json.dumps(text)


def _after_open(rules: list[str]) -> list[str]:
    """`call_grammar`'s rules with a `callbody` rule: the call after its opening marker."""
    call = rules[0]
    assert call.startswith("call: ")
    first, _, rest = call[len("call: ") :].partition(" ")
    return [f"callbody: {rest}", *rules[1:]]


def _bias(logit_bias, n_vocab: int):
    if not logit_bias:
        return None
    ids, vals = [], []
    for k, v in logit_bias.items():
        try:
            i = int(k)
        except (TypeError, ValueError):
            raise StructureError("logit_bias", f"logit_bias key {k!r} is not a token id") from None
        if not 0 <= i < n_vocab:
            raise StructureError("logit_bias", f"logit_bias token id {i} is outside the vocabulary (0..{n_vocab - 1})")
        if not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise StructureError("logit_bias", f"logit_bias[{i}] must be a number in [-100, 100]")
        ids.append(i)
        vals.append(float(v))
    return np.asarray(ids, dtype=np.int64), np.asarray(vals, dtype=np.float32)
