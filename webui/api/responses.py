"""/v1/responses: OpenAI's Responses API (`client.responses.create`), stateless, on the chat engine.

A request is read once, at the edge, into what a chat completion gets: `instructions` and the `input`
items become chat messages, the flat function tools become chat tools, `text.format` the JSON schema
the answer must match, `reasoning.effort` thinking on or off. The shared checks (`params`) validate
them and the worker gets the same payload as /v1/chat/completions. A bad field is named as this API
spells it (`input[2].call_id`, `tools[0].parameters.type`, `text.format.schema`).

State — this server stores no response:
- `store` is accepted (true or false) and every response says `"store": false`;
- `previous_response_id`, `conversation` and `item_reference` input items are refused with 400: send
  the whole conversation in `input`, earlier output items included, as `store: false` clients do;
- `background: true` is refused: a response runs while its request is open.

`truncation: "auto"` leaves the oldest whole turns after the instructions and system messages out of an
input longer than the context (`params.TRUNCATE`; never the last turn); "disabled", the default, makes
it a 400 context_length_exceeded. The response echoes which.

Input items: messages (text parts only), and the items of earlier turns as a model answered them —
`reasoning` (sent back as the turn's `reasoning_content`), `message`, `function_call` — with
`function_call_output` results. Other items (images, files, built-in tools) are refused naming
`input[k]`. Tools are function tools; `tool_choice` none, auto, required, a function, or
`allowed_tools` (the tools filtered to those, its mode kept). `include` honours
message.output_text.logprobs (with `top_logprobs`) and accepts the values that ask for what never
appears here (reasoning.encrypted_content: reasoning items carry their text in `content`).

The output items and the stream of events are `webui.api.response_items`'. Streaming is server-sent
events, `event: <type>` and `data: {…, "sequence_number": n}` from 0: response.created,
response.in_progress, the items' events, last response.completed — response.incomplete when
`max_output_tokens` cut the answer, or an `error` event then response.failed when the worker failed
after the start. There is no `[DONE]` line (OpenAI sends none).
"""

from __future__ import annotations

import functools
import json
import re
import time
from typing import Any

from django.http import JsonResponse, StreamingHttpResponse
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from appliance.events import Delta, Error, Final, ToolCallDelta
from inference.options import Surface

from . import jobs, priority
from . import response_items as items
from .common import Answer, ApiError, api_view, collect, event_stream, record, validation_error
from .openai import THINK_OFF
from .params import (
    Tool,
    Truncation,
    chat_messages,
    check_sampling,
    check_schema,
    check_tool_choice,
    check_tools,
    sampling_field,
    seed_value,
    trimming,
)

RESPONSES = Surface("responses", str, {"max_tokens": "max_output_tokens"})
# `include` values: the one honoured, and those that ask for what never appears here (no such tools, no
# encrypted reasoning: reasoning items carry their text in `content`)
LOGPROBS = "message.output_text.logprobs"
INCLUDE_NOOP = {
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str
    input: str | list[Any] = Field(
        description="a user message, or items: messages, and earlier turns' reasoning, message, function_call "
        "and function_call_output items"
    )
    instructions: str | None = Field(None, description="the system message")
    stream: bool | None = False
    stream_options: dict | None = None  # include_obfuscation: nothing is obfuscated here
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: sampling_field("temperature") = None
    top_p: sampling_field("top_p") = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = Field(None, description='function tools: {"type": "function", "name", "parameters"}')
    tool_choice: str | dict | None = Field(
        None, description='none, auto, required, {"type": "function", "name"} or {"type": "allowed_tools", …}'
    )
    parallel_tool_calls: bool | None = None
    text: dict | None = Field(None, description='{"format": text, json_object or json_schema {name, schema}}')
    reasoning: dict | None = Field(None, description='{"effort": none or minimal (thinking off), low … xhigh (on)}')
    include: list[str] | None = Field(None, description="message.output_text.logprobs is honoured")
    store: bool | None = Field(None, description="accepted; nothing is stored (every response says false)")
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Truncation = None
    previous_response_id: str | None = Field(None, description="refused: this server stores no responses")
    conversation: Any = Field(None, description="refused: this server stores no conversations")
    background: bool | None = Field(None, description="true is refused")
    max_tool_calls: int | None = None
    prompt: Any = None
    # extensions, as /v1/chat/completions takes them
    seed: int | None = None
    top_k: sampling_field("top_k") = None
    min_p: sampling_field("min_p") = None
    repetition_penalty: sampling_field("repetition_penalty") = None


def _named(value: Any) -> str:
    """A client's value in a message: quoted when it is a short string (never a dump cut short)."""
    return repr(value) if isinstance(value, str) and len(value) <= 40 else "such"


def _refuse(field: str, why: str, code: str = "unsupported_value") -> ApiError:
    return ApiError(400, f"{field}: {why}", param=field, code=code)


def _refuse_state(req: ResponsesRequest) -> None:
    stateless = (
        "this server stores no responses; send the whole conversation in `input` (earlier output items included)"
    )
    if req.previous_response_id is not None:
        raise _refuse("previous_response_id", stateless)
    if req.conversation is not None:
        raise _refuse("conversation", stateless)
    if req.background:
        raise _refuse("background", "background responses are not supported; a response runs while its request is open")
    if req.prompt is not None:
        raise _refuse("prompt", "stored prompt templates are not supported; send instructions and input")
    if req.max_tool_calls is not None:
        raise _refuse("max_tool_calls", "not supported; limit tool calls with tool_choice or parallel_tool_calls")
    if req.service_tier not in (None, "auto", "default"):
        raise _refuse("service_tier", f"{_named(req.service_tier)} is not supported; use auto or default")
    unknown = [v for v in req.include or () if v != LOGPROBS and v not in INCLUDE_NOOP]
    if unknown:
        raise _refuse("include", f"{_named(unknown[0])} is not supported; this server honours {LOGPROBS}")


# --- the request as the engine's chat ---------------------------------------------------------------
class _Spelling:
    """Where each chat message and tool came from, to name a field the shared checks reject as sent."""

    def __init__(self):
        self.message_at: list[str] = []  # chat message i → "instructions" or "input[k]"
        self.call_at: dict[tuple[int, int], str] = {}  # (chat message i, its tool call j) → "input[k]"
        self.tool_at: list[int] = []  # chat tool i → k of tools[k]

    def rename(self, param: str | None) -> str | None:
        if not param:
            return param
        if m := re.match(r"messages\[(\d+)\](?:\.tool_calls\[(\d+)\](?:\.function)?)?(.*)", param):
            i, j, rest = int(m.group(1)), m.group(2), m.group(3)
            src = self.message_at[i] if i < len(self.message_at) else "input"
            if j is not None:  # a function_call item is flat: input[k].arguments
                src = self.call_at.get((i, int(j)), src)
            return "instructions" if src == "instructions" else src + rest.replace(".tool_call_id", ".call_id")
        if m := re.match(r"tools\[(\d+)\]\.function(.*)", param):
            i = int(m.group(1))
            return f"tools[{self.tool_at[i] if i < len(self.tool_at) else i}]{m.group(2)}"
        if param == "format" or param.startswith(("format.", "format[")):  # the engine's: the JSON schema
            return "text.format.schema" + param[len("format") :]
        return {"prompt": "input", "messages": "input", "max_tokens": "max_output_tokens"}.get(param, param)

    def error(self, e: ApiError) -> ApiError:
        param = self.rename(e.param)
        if param == e.param:
            return e
        return ApiError(e.status, str(e).replace(e.param, param), param=param, code=e.code, headers=e.headers)


def _text(content: Any, where: str) -> str | list[dict]:
    """A Responses message's content as chat content: a string, or its text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"{where}.content", "must be a string or a list of content parts", "invalid_value")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "refusal") or not isinstance(text, str):
            raise _refuse(f"{where}.content[{j}].type", f"only text parts are supported, got {kind!r}")
        parts.append({"type": "text", "text": text})
    return parts


def _messages(req: ResponsesRequest, spelling: _Spelling) -> list[dict]:
    """`instructions` and `input` as chat messages. The items of one model turn (reasoning, message,
    function_call) join into one assistant message, its reasoning as `reasoning_content`."""
    chat: list[dict] = []
    turn: dict | None = None  # the model turn being read

    def add(msg: dict, src: str) -> dict:
        chat.append(msg)
        spelling.message_at.append(src)
        return msg

    def model_turn(src: str) -> dict:
        nonlocal turn
        if turn is None:
            turn = add({"role": "assistant", "content": ""}, src)
        return turn

    if req.instructions:
        add({"role": "system", "content": req.instructions}, "instructions")
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for k, item in enumerate(items):
        where = f"input[{k}]"
        if not isinstance(item, dict):
            raise _refuse(where, "must be an object (a message or an item)", "invalid_value")
        kind, role = item.get("type", "message"), item.get("role")
        if kind == "reasoning":
            key = "content" if item.get("content") else "summary"
            parts = item.get(key) or []
            if not isinstance(parts, list) or not all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts
            ):
                raise _refuse(f"{where}.{key}", "a reasoning item's parts are {type, text} objects", "invalid_value")
            text = "".join(p["text"] for p in parts)
            model_turn(where)["reasoning_content"] = model_turn(where).get("reasoning_content", "") + text
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _refuse(f"{where}.{key}", "a function_call item needs it as a string", "invalid_value")
            calls = model_turn(where).setdefault("tool_calls", [])
            spelling.call_at[(len(chat) - 1, len(calls))] = where
            fn = {"name": item["name"], "arguments": item["arguments"]}
            calls.append({"id": item["call_id"], "type": "function", "function": fn})
        elif kind == "message" and role == "assistant":
            if turn is not None and (turn["content"] or "tool_calls" in turn):
                turn = None  # a second message: a new turn
            if "content" not in item:
                raise _refuse(f"{where}.content", "a message needs content", "missing_required_parameter")
            model_turn(where)["content"] = _text(item["content"], where)
        elif kind == "message":
            turn = None
            if role not in ("user", "system", "developer"):
                raise _refuse(
                    f"{where}.role", f"{_named(role)} is not one of user, system, developer, assistant", "invalid_value"
                )
            if "content" not in item:
                raise _refuse(f"{where}.content", "a message needs content", "missing_required_parameter")
            add({"role": role, "content": _text(item["content"], where)}, where)
        elif kind == "function_call_output":
            turn = None
            if not isinstance(item.get("call_id"), str):
                raise _refuse(f"{where}.call_id", "a function_call_output names the call it answers", "invalid_value")
            output = _text(item["output"], where) if item.get("output") is not None else ""
            add({"role": "tool", "tool_call_id": item["call_id"], "content": output}, where)
        elif kind == "item_reference":
            raise _refuse(f"{where}.type", "this server stores no items to refer to; send the item itself")
        else:
            raise _refuse(
                f"{where}.type",
                f"{_named(kind)} items are not supported; send messages, function_call and function_call_output items",
            )
    return chat


def _tools(req: ResponsesRequest, spelling: _Spelling) -> tuple[list[dict] | None, Any]:
    """The function tools and tool_choice in the chat shape the shared checks take."""
    tools = []
    for i, t in enumerate(req.tools or ()):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise _refuse(f"tools[{i}].type", f"{_named(kind)} tools are not supported; give function tools")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        try:
            tools.append((i, Tool.model_validate({"type": "function", "function": fn})))
        except pydantic.ValidationError as e:  # it names `function.name`: a Responses tool is flat
            err = validation_error(e)
            param = f"tools[{i}]" + (err.param or "").removeprefix("function")
            message = str(err).replace(err.param, param, 1) if err.param else f"{param}: {err}"
            raise ApiError(400, message, param=param, code=err.code) from None
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        if not isinstance(choice.get("tools"), list):
            raise _refuse("tool_choice.tools", "allowed_tools needs a list of tools", "invalid_value")
        allowed = {c.get("name") for c in choice["tools"] if isinstance(c, dict)}
        tools = [(i, t) for i, t in tools if t.function.name in allowed]
        choice = choice.get("mode", "auto")
    elif isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, dict):
        raise _refuse(
            "tool_choice",
            f"{_named(choice.get('type'))} is not supported; use none, auto, required, a function or allowed_tools",
        )
    spelling.tool_at = [i for i, _ in tools]
    checked = check_tools([t for _, t in tools])
    return checked, check_tool_choice(choice, checked)


def _format(text: dict | None) -> tuple[dict | None, dict]:
    """`text.format` as the engine's `format` schema (None: free text), and the format to echo."""
    fmt = (text or {}).get("format") or {"type": "text"}
    if (text or {}).get("verbosity") not in (None, "medium"):
        raise _refuse("text.verbosity", "only medium is supported")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None, fmt
    if kind == "json_object":
        return {"type": "object"}, fmt
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str):
            raise _refuse("text.format.name", "a json_schema format needs a name", "missing_required_parameter")
        return check_schema(fmt.get("schema"), "text.format.schema"), fmt
    raise _refuse("text.format.type", f"{_named(kind)} is not one of text, json_object, json_schema", "invalid_value")


def _think(reasoning: dict | None) -> bool | None:
    """`reasoning.effort` as thinking, as chat completions read it (none, minimal: off); absent: the model's default."""
    effort = (reasoning or {}).get("effort")
    if effort is None:
        return None
    if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise _refuse(
            "reasoning.effort",
            f"{_named(effort)} is not one of none, minimal, low, medium, high, xhigh",
            "invalid_value",
        )
    return effort not in THINK_OFF


def _payload(req: ResponsesRequest, spelling: _Spelling) -> tuple[dict, dict]:
    """The worker payload, and the `text.format` to echo."""
    messages = chat_messages(_messages(req, spelling))
    tools, tool_choice = _tools(req, spelling)
    schema, fmt = _format(req.text)
    sampling = {
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "seed": seed_value(req.seed),
    }
    params = check_sampling(sampling, RESPONSES)
    if LOGPROBS in (req.include or ()):
        params["logprobs"] = req.top_logprobs or 0
    structure = {
        "tools": tools,
        "tool_choice": tool_choice if tools else None,
        "parallel_tool_calls": req.parallel_tool_calls if tools else None,
        "format": schema,
        "think": _think(req.reasoning),
    }
    params.update({k: v for k, v in structure.items() if v is not None})
    payload = {"kind": "chat", "model": req.model, "messages": messages, "params": params}
    return payload | trimming(req.truncation == "auto"), fmt


# --- the view ---------------------------------------------------------------------------------------
@api_view("openai")
async def responses(request, body):
    req = ResponsesRequest.model_validate(body)
    _refuse_state(req)
    spelling = _Spelling()
    try:
        payload, fmt = _payload(req, spelling)
        names = {"prompt": "input", "think": "reasoning.effort"}
        job = await jobs.Job.submit(
            "rkmojo.generate",
            req.model,
            payload,
            client=request.META.get("REMOTE_ADDR"),
            names=names,
            priority=priority.of(payload, streamed=bool(req.stream)),
        )
        await job.started()
    except ApiError as e:
        raise spelling.error(e) from None
    echo = functools.partial(
        items.response_object,
        items.item_id("resp"),
        int(time.time()),
        req,
        fmt,
        truncation=req.truncation or "disabled",  # over the object's own "disabled"
    )
    logprobs = LOGPROBS in (req.include or ())
    if req.stream:
        return _sse(job, _stream(job, echo, logprobs, spelling, req.model, payload["messages"], request.api_key))
    try:
        answer = await collect(job)
    except ApiError as e:
        raise spelling.error(e) from None
    finally:
        await job.close()
    await record("openai", req.model, payload["messages"], answer, request.api_key)
    status = "incomplete" if items.incomplete(answer.final) else "completed"
    done = echo(status, items.output(answer, logprobs), usage=items.usage(answer.final), completed_at=int(time.time()))
    return JsonResponse(done)


async def _stream(job, echo, logprobs: bool, spelling: _Spelling, model: str, messages: list[dict], key=None):
    """The response's stream events, numbered; the exchange recorded at the end (with the request's API `key`)."""
    seq, answer, stream = 0, Answer(), items.ItemStream(logprobs)

    def event(ev: dict) -> dict:
        nonlocal seq
        seq += 1
        return {**ev, "sequence_number": seq - 1}

    yield event({"type": "response.created", "response": echo("in_progress", [])})
    yield event({"type": "response.in_progress", "response": echo("in_progress", [])})
    async for ev in job.events():
        if isinstance(ev, Error):
            err = spelling.error(ApiError.from_event(ev))
            yield event({"type": "error", "code": ev.code, "message": str(err), "param": err.param})
            error = {"code": ev.code or "server_error", "message": str(err)}
            yield event({"type": "response.failed", "response": echo("failed", stream.output(), error=error)})
            return
        if not isinstance(ev, (Delta, ToolCallDelta, Final)):
            continue
        answer.add(ev)
        for e in stream.feed(ev) if not isinstance(ev, Final) else stream.finish(ev):
            yield event(e)
        if isinstance(ev, Final):
            status = "incomplete" if items.incomplete(ev) else "completed"
            done = echo(status, stream.output(), usage=items.usage(ev), completed_at=int(time.time()))
            yield event({"type": f"response.{status}", "response": done})
            await record("openai", model, messages, answer, key)
            return


def _sse(job, events) -> StreamingHttpResponse:
    async def body():
        try:
            async for ev in events:
                yield f"event: {ev['type']}\ndata: {json.dumps(ev, ensure_ascii=False, separators=(',', ':'))}\n\n"
        finally:
            await events.aclose()
            await job.close()  # before the end: the client went away, and the worker stops at its next token

    return event_stream(body())
