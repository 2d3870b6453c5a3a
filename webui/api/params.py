"""Request pieces both APIs share, checked at the edge: chat messages (tool calls and tool results
included), tools and tool_choice, JSON schemas, logit_bias, and sampling parameters.

What the worker gets (`appliance.tasks`) is the engine's shape (`inference.sampler.SamplingParams`,
`Engine.chat_prompt`), whatever the API:

- messages: {"role": "system"|"user"|"assistant"|"tool", "content": str}; an assistant turn may add
  "tool_calls" [{"id", "type": "function", "function": {"name", "arguments": dict}}] and
  "reasoning_content"; a tool turn adds "tool_call_id" and "name" (the function it answers);
- tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}];
- tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}};
- truncate: `TRUNCATE` in a chat whose client opted in (Ollama's `truncate`, OpenAI's `truncation: "auto"`):
  the worker leaves the oldest whole turns after the system messages out of a prompt that would overflow
  the context (`appliance.tasks._fit`); without it an overlong prompt is a 400 context_length_exceeded.

A bad value is a 400 naming the field as the client sent it (`messages[3].tool_calls[0].function.arguments`,
`tools[1].function.parameters.properties.unit.type`), its message whole (never a value cut short).
JSON schemas are checked against their meta-schema with `jsonschema` when it is installed; without it,
the structural checks below, and the engine's grammar compiler refuses the rest (its `StructureError`
names the field too).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inference.options import OptionError, Surface, api_type
from inference.sampler import SamplingParams

from .common import ApiError

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
TRUNCATE = "oldest_turns"  # the worker's trimming policy (`appliance.tasks`), the payload's `truncate`
# OpenAI's `truncation` (the Responses API's name and values), which chat completions take too
Truncation = Annotated[
    Literal["auto", "disabled"] | None,
    Field(
        description='"auto": leave the oldest whole turns after the system messages out of a prompt longer than '
        'the context; "disabled" (the default): such a prompt is a 400 context_length_exceeded'
    ),
]


class FunctionDef(BaseModel):
    """A function the model may call. Unknown keys are ignored (clients add their own)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict | None = Field(None, description="a JSON schema of the arguments object")
    strict: bool | None = None  # OpenAI's; arguments always follow the schema here


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionDef


# --- messages ----------------------------------------------------------------------------------------
def chat_messages(messages: list[Any], *, flavor: Literal["openai", "ollama"] = "openai") -> list[dict]:
    """OpenAI or Ollama messages in the engine's shape (see the module docstring).

    Content is a string or a list of text parts; image or audio parts are refused with 400 naming the
    field, e.g. `messages[2].content[1].type`. OpenAI tool calls carry their arguments as a JSON string,
    Ollama's as an object (either is taken from either). A tool result names the call it answers by
    `tool_call_id` (OpenAI: required) or by `tool_name` (Ollama: the earliest unanswered call of that name).
    """
    if not messages:
        raise ApiError(400, "messages must hold at least one message", param="messages")
    out: list[dict] = []
    calls: dict[str, str] = {}  # tool call id → function name, of the assistant turns so far
    answered: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object with a role and content", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(
                400, f"{where}.role {role!r} is not supported; use one of {', '.join(ROLES)}", param=f"{where}.role"
            )
        for key in ("images", "audio", "function_call"):
            if m.get(key):
                raise ApiError(
                    400,
                    f"{where}.{key} is not supported by this server",
                    param=f"{where}.{key}",
                    code="unsupported_value",
                )
        msg = {"role": "system" if role == "developer" else role, "content": _content(m.get("content"), role, where)}
        if role == "assistant":
            if m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls", i)
                calls.update((c["id"], c["function"]["name"]) for c in msg["tool_calls"])
            key = (
                "thinking"
                if flavor == "ollama"
                else next((k for k in ("reasoning_content", "reasoning") if k in m), None)
            )
            if key and m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise ApiError(400, f"{where}.{key} must be a string", param=f"{where}.{key}")
                msg["reasoning_content"] = m[key]
        elif m.get("tool_calls"):
            raise ApiError(
                400, f"{where}.tool_calls: only assistant messages carry tool calls", param=f"{where}.tool_calls"
            )
        if role == "tool":
            msg.update(_answered_call(m, where, flavor, calls, answered))
        out.append(msg)
    return out


def _content(content: Any, role: str, where: str) -> str:
    if content is None and role not in ("assistant", "tool"):  # an assistant turn may be empty; a question may not
        raise ApiError(
            400, f"{where}.content must be a string or a list of text parts, not null", param=f"{where}.content"
        )
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            pwhere = f"{where}.content[{j}]"
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(
                    400,
                    f"{pwhere}: only text parts are supported, got {kind!r}",
                    param=f"{pwhere}.type",
                    code="unsupported_value",
                )
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
    return content


def _tool_calls(value: Any, where: str, turn: int) -> list[dict]:
    if not isinstance(value, list):
        raise ApiError(400, f"{where} must be a list of tool calls", param=where)
    out = []
    for j, call in enumerate(value):
        cwhere = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(
                400, f"{cwhere}.function.name: a tool call names its function", param=f"{cwhere}.function.name"
            )
        if call.get("type", "function") != "function":
            raise ApiError(400, f'{cwhere}.type must be "function"', param=f"{cwhere}.type")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise ApiError(
                    400,
                    f"{cwhere}.function.arguments is not valid JSON ({e.msg} at character {e.pos}); "
                    "give the arguments object as JSON text",
                    param=f"{cwhere}.function.arguments",
                ) from None
        if not isinstance(args, dict):
            raise ApiError(
                400,
                f"{cwhere}.function.arguments must be a JSON object, not {_kind(args)}",
                param=f"{cwhere}.function.arguments",
            )
        cid = call.get("id")
        if cid is not None and (not isinstance(cid, str) or not cid):
            raise ApiError(400, f"{cwhere}.id must be a non-empty string", param=f"{cwhere}.id")
        out.append(
            {"id": cid or f"call_{turn}_{j}", "type": "function", "function": {"name": fn["name"], "arguments": args}}
        )
    return out


def _answered_call(m: dict, where: str, flavor: str, calls: dict[str, str], answered: set[str]) -> dict:
    """A tool result's {"tool_call_id", "name"}: the earlier call it answers."""
    cid = m.get("tool_call_id")
    if cid is None and flavor == "openai":
        raise ApiError(
            400,
            f"{where}.tool_call_id is required: the id of the assistant's tool call this result answers",
            param=f"{where}.tool_call_id",
            code="missing_required_parameter",
        )
    if cid is not None:
        if not isinstance(cid, str) or cid not in calls:
            raise ApiError(
                400,
                f"{where}.tool_call_id {cid!r} answers no tool call of an earlier assistant message; "
                "give the id of one of its tool_calls",
                param=f"{where}.tool_call_id",
            )
        answered.add(cid)
        return {"tool_call_id": cid, "name": calls[cid]}
    name = m.get("tool_name") or m.get("name")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, f"{where}.tool_name must be a string", param=f"{where}.tool_name")
    cid = next((c for c, n in calls.items() if c not in answered and (name is None or n == name)), None)
    if cid is None:  # Ollama's own server does not match results to calls: neither is refused here
        return {"name": name} if name else {}
    answered.add(cid)
    return {"tool_call_id": cid, "name": calls[cid]}


def _kind(value: Any) -> str:
    """A value's JSON kind in words, for messages that must not quote a value that may be long."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


# --- tools, tool_choice, JSON schemas -------------------------------------------------------------------
def check_tools(tools: list[Tool] | None, where: str = "tools") -> list[dict] | None:
    """Validated tools as the engine takes them (None for none): names unique, parameters JSON schemas."""
    if not tools:
        return None
    seen: dict[str, int] = {}
    out = []
    for i, t in enumerate(tools):
        fn = t.function
        if fn.name in seen:
            raise ApiError(
                400,
                f"{where}[{i}].function.name {fn.name!r} is also {where}[{seen[fn.name]}]'s; give each tool its own name",
                param=f"{where}[{i}].function.name",
            )
        seen[fn.name] = i
        entry = {"name": fn.name}
        if fn.description is not None:
            entry["description"] = fn.description
        if fn.parameters is not None:
            check_schema(fn.parameters, f"{where}[{i}].function.parameters")
            entry["parameters"] = fn.parameters
        out.append({"type": "function", "function": entry})
    return out


def check_tool_choice(choice: Any, tools: list[dict] | None, where: str = "tool_choice") -> str | dict | None:
    """`tool_choice` as the engine takes it; a named function must be one of `tools`."""
    if choice is None:
        return None
    names = [t["function"]["name"] for t in tools or ()]
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ApiError(
                400,
                f"{where} {choice!r} is not one of none, auto, required, "
                '{"type": "function", "function": {"name": ...}}',
                param=where,
            )
        if choice == "required" and not names:
            raise ApiError(400, f"{where} required needs tools to choose from; give tools", param=where)
        return choice
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(
            400,
            f'{where} must be none, auto, required or {{"type": "function", "function": {{"name": ...}}}}, '
            f"not {_kind(choice)} of another shape",
            param=where,
        )
    if fn["name"] not in names:
        raise ApiError(
            400,
            f"{where} names the function {fn['name']!r}, which is not among the tools "
            f"({', '.join(map(repr, names)) or 'none given'}); name one of them",
            param=where,
        )
    return {"type": "function", "function": {"name": fn["name"]}}


def check_schema(schema: Any, where: str) -> dict:
    """`schema` if it is a valid JSON schema object, else a 400 naming `where` and the bad keyword's path."""
    if not isinstance(schema, dict):
        raise ApiError(400, f"{where} must be a JSON schema object, not {_kind(schema)}", param=where)
    try:
        import jsonschema
    except ImportError:
        _check_structure(schema, where)
        return schema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        at = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path)
        raise ApiError(400, f"{at} is not a valid JSON schema: {e.message}", param=at) from None
    return schema


def _check_structure(schema: Any, where: str) -> None:
    """The meta-schema's rules for the keywords tools use most, for when `jsonschema` is not installed."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ApiError(400, f"{where} must be a JSON schema (an object or a boolean), not {_kind(schema)}", param=where)
    types = schema.get("type", "object")
    if not all(t in JSON_TYPES for t in (types if isinstance(types, list) else [types])):
        raise ApiError(
            400, f"{where}.type must be one of {', '.join(JSON_TYPES)} (or a list of them)", param=f"{where}.type"
        )
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ApiError(400, f"{where}.required must be a list of property names", param=f"{where}.required")
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        sub = schema.get(key, {})
        if not isinstance(sub, dict):
            raise ApiError(400, f"{where}.{key} must be an object of schemas", param=f"{where}.{key}")
        for name, s in sub.items():
            _check_structure(s, f"{where}.{key}.{name}")
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
        if key in schema:
            _check_structure(schema[key], f"{where}.{key}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                raise ApiError(400, f"{where}.{key} must be a non-empty list of schemas", param=f"{where}.{key}")
            for j, s in enumerate(schema[key]):
                _check_structure(s, f"{where}.{key}[{j}]")


# --- logit_bias, sampling ----------------------------------------------------------------------------
def check_logit_bias(bias: dict | None, vocab: int | None, where: str = "logit_bias") -> dict[int, float] | None:
    """OpenAI's logit_bias ({"token id": bias in [-100, 100]}) as {token id: bias}; `vocab` bounds the ids."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ApiError(400, f'{where} keys are token ids written as strings ("15339"), not {key!r}', param=where)
        if vocab and int(key) >= vocab:
            raise ApiError(400, f"{where}: token id {key} is outside the model's vocabulary of {vocab}", param=where)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ApiError(400, f"{where}[{key!r}] must be a number in [-100, 100], not {value!r}", param=where)
        out[int(key)] = float(value)
    return out


def check_embed_batch(texts: list[str]) -> None:
    """At most RKMOJO_MAX_EMBED_INPUTS texts per request: each is a forward pass on the only worker."""
    from django.conf import settings

    limit = settings.RKMOJO["MAX_EMBED_INPUTS"]
    if len(texts) > limit:
        raise ApiError(
            400,
            f"input holds {len(texts)} texts; this server embeds at most {limit} per request "
            "(RKMOJO_MAX_EMBED_INPUTS): split the batch",
            param="input",
            code="too_many_inputs",
        )


def trimming(on: bool) -> dict:
    """The payload's `truncate` field when the client opted in to trimming (`TRUNCATE`), else nothing."""
    return {"truncate": TRUNCATE} if on else {}


def seed_value(seed: int | None) -> int | None:
    """Any integer seed (OpenAI's are signed 64-bit) as the engine's non-negative one."""
    return None if seed is None else seed % 2**64


def check_sampling(params: dict, surface: Surface) -> dict:
    """`params` (SamplingParams fields) checked by the schema's own rules (`inference.options`).

    Raises:
        ApiError: 400 naming the field as `surface`'s clients spell it (`options.num_predict`).
    """
    params = {k: v for k, v in params.items() if v is not None}
    try:
        SamplingParams.from_any(params)
    except OptionError as e:
        raise ApiError(400, surface.error(e), param=surface.spell(e.field), code="invalid_value") from None
    return params


def sampling_field(name: str):
    """The type of a request field that is sampling option `name` (its range in the OpenAPI document)."""
    return api_type(SamplingParams, name)
