"""The OpenAI-compatible API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

Requests are validated once, at the edge, into pydantic models (strict types, unknown fields refused
as OpenAI does: "Unrecognized request argument supplied"). Fields OpenAI defines that the engine
cannot honour (image parts, audio, predicted outputs, …) are refused with 400 naming the field, never
ignored. Streaming answers are server-sent events in OpenAI's chunk format ending with `data: [DONE]`.

Chat completions take, besides the sampling fields:
- `tools`, `tool_choice`, `parallel_tool_calls`: the model's answer may be tool calls, in
  `message.tool_calls` [{id, type: "function", function: {name, arguments: JSON text}}] with
  finish_reason "tool_calls" (content null when the answer is only calls); streamed as `delta.tool_calls`
  chunks: {index, id, type, function: {name, arguments: ""}} first, then {index, function: {arguments}}
  pieces, as the openai SDK's stream helpers accumulate them;
- `response_format` json_object / json_schema (strict or not: the answer always matches the schema);
- `reasoning_effort` ("none", "minimal": thinking off; the others on) and `chat_template_kwargs`
  (vLLM's and llama.cpp's: `{"enable_thinking": false}`, other template variables); a thinking
  model's thoughts come as `message.reasoning_content` / `delta.reasoning_content`, never in the content,
  and are counted in `usage.completion_tokens_details.reasoning_tokens`;
- `logit_bias` {"token id": -100..100}, added to those tokens' logits;
- `n` > 1: the choices are computed one after another, one job each (the board runs one generation at a
  time), choice i with seed + i when a seed is given; streamed, choice 0's chunks come first, then 1's;
- `truncation` (the Responses API's field): "auto" leaves the oldest whole turns after the system messages
  out of a conversation longer than the context (`params.TRUNCATE`), for every choice; "disabled" (the
  default) makes it a 400 context_length_exceeded, as OpenAI's chat completions do.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Literal

import numpy as np
from django.http import JsonResponse, StreamingHttpResponse
from pydantic import BaseModel, ConfigDict, Field

from appliance.events import Delta, Embeddings, Error, Final, ToolCallDelta, Usage, logprob_dicts

from . import jobs, priority
from .common import Answer, ApiError, api_view, collect, event_stream, openai_error_body, record
from inference.options import OPENAI

from .params import (
    Tool,
    Truncation,
    chat_messages,
    check_embed_batch,
    check_logit_bias,
    check_sampling,
    check_schema,
    check_tool_choice,
    check_tools,
    sampling_field,
    seed_value,
    trimming,
)

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop", "tool_calls": "tool_calls", "repetition": "stop"}
MAX_CHOICES = 8  # n: computed one after another on one board
THINK_OFF = ("none", "minimal")  # reasoning_effort values that turn thinking off
TEMPLATE_RESERVED = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class JsonSchemaFormat(_Strict):
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema", description="the JSON schema the answer matches")
    strict: bool | None = None  # the answer always matches the schema here


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_Strict):
    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # sampling options: their ranges are the engine's schema (`SamplingParams`), checked in `_sampling`
    max_tokens: sampling_field("max_tokens") = None
    temperature: sampling_field("temperature") = None
    top_p: sampling_field("top_p") = None
    seed: int | None = None  # any 64-bit integer, as OpenAI's
    stop: str | list[str] | None = None
    presence_penalty: sampling_field("presence_penalty") = None
    frequency_penalty: sampling_field("frequency_penalty") = None
    user: str | None = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    logit_bias: dict[str, Any] | None = Field(None, description='{"token id": bias in [-100, 100]}')
    store: bool | None = None
    metadata: dict | None = None
    service_tier: str | None = None
    # extensions that llama.cpp's and vLLM's servers take too
    top_k: sampling_field("top_k") = None
    min_p: sampling_field("min_p") = None
    repetition_penalty: sampling_field("repetition_penalty") = None


class ChatRequest(_Sampling):
    messages: list[Any]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict | None = Field(
        None, description='none, auto, required or {"type": "function", "function": {"name": ...}}'
    )
    parallel_tool_calls: bool | None = None
    functions: list | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    web_search_options: Any = None
    # vLLM's and llama.cpp's: chat template variables, e.g. {"enable_thinking": false}
    chat_template_kwargs: dict | None = None
    truncation: Truncation = None  # the Responses API's, as an extension


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    suffix: str | None = None
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None


class EmbeddingRequest(_Strict):
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


def _refuse_unsupported(req: BaseModel, allowed: dict[str, Any]) -> None:
    """400 for every field set to something other than what `allowed` says the engine can do."""
    for name, ok in allowed.items():
        value = getattr(req, name, None)
        if value is None:
            continue
        good = ok(value) if callable(ok) else value == ok
        if not good:
            raise ApiError(
                400, f"'{name}' = {_shown(value)} is not supported by this server", param=name, code="unsupported_value"
            )


def _shown(value: Any) -> str:
    """A value for an error message: whole when it is short, else its kind (never a dump cut short)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_none=True)
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= 60:
        return text
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return "an object" if isinstance(value, dict) else f"a value of {len(text)} characters"


_COMMON_UNSUPPORTED = {
    "store": False,
    "metadata": lambda v: not v,
    "service_tier": lambda v: v in ("auto", "default"),
}


async def _sampling(req: _Sampling, max_tokens: int | None, **extra) -> dict:
    """The request's `SamplingParams` fields, checked (`extra`: the chat's tools, format, think, …)."""
    vocab = None
    if req.logit_bias:
        _, desc = await jobs.find_model(req.model)
        vocab = desc.get("vocab")
    params = {
        "max_tokens": max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "seed": seed_value(req.seed),
        "stop": [req.stop] if isinstance(req.stop, str) else (req.stop or []),
        "logit_bias": check_logit_bias(req.logit_bias, vocab),
        **extra,
    }
    return check_sampling(params, OPENAI)


def _client(request) -> str | None:
    return request.META.get("REMOTE_ADDR")


# --- /v1/chat/completions -------------------------------------------------------------------------
@api_view("openai")
async def chat_completions(request, body):
    req = ChatRequest.model_validate(body)
    _refuse_unsupported(
        req,
        {
            **_COMMON_UNSUPPORTED,
            "functions": lambda v: not v,  # the deprecated spelling of tools
            "function_call": lambda v: v == "none",
            "modalities": lambda v: v == ["text"],
            "audio": lambda v: False,
            "prediction": lambda v: False,
            "web_search_options": lambda v: False,
        },
    )
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    messages = chat_messages(req.messages)
    tools = check_tools(req.tools)
    choice = check_tool_choice(req.tool_choice, tools)  # without tools: none and auto only, meaning nothing
    think, template = _thinking(req)
    params = await _sampling(
        req,
        req.max_completion_tokens or req.max_tokens,
        tools=tools,
        tool_choice=choice if tools else None,
        parallel_tool_calls=req.parallel_tool_calls if tools else None,
        format=_format(req.response_format),
        think=think,
        template=template,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
    )
    payloads = [
        {
            "kind": "chat",
            "model": req.model,
            "messages": messages,
            "params": _choice_params(params, req.seed, i),
            **trimming(req.truncation == "auto"),
        }
        for i in range(req.n or 1)
    ]
    names = {
        "prompt": "messages",
        "think": "reasoning_effort" if req.reasoning_effort else "chat_template_kwargs.enable_thinking",
    }
    run = _Run("chatcmpl", request, req.model, names, _format_param(req.response_format), bool(req.stream))
    meta = await run.start(payloads[0])
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse(run, _chat_chunks(run, meta, payloads, usage, messages, bool(req.logprobs), bool(tools)))
    answers = []
    try:
        for i, payload in enumerate(payloads):
            if i:
                await run.start(payload)
            answers.append(await collect(run.job))
    finally:
        await run.close()
    await record("openai", req.model, messages, answers[0], request.api_key)
    return JsonResponse(
        {
            **meta,
            "object": "chat.completion",
            "choices": [
                {
                    "index": i,
                    "message": _message(a),
                    "logprobs": {"content": a.lps, "refusal": None} if req.logprobs else None,
                    "finish_reason": FINISH.get(a.final.finish_reason, "stop"),
                }
                for i, a in enumerate(answers)
            ],
            "usage": _usage([a.final for a in answers]),
        }
    )


def _thinking(req: ChatRequest) -> tuple[bool | None, dict | None]:
    """(think, the other template variables) from reasoning_effort and chat_template_kwargs."""
    think = None if req.reasoning_effort is None else req.reasoning_effort not in THINK_OFF
    kwargs = dict(req.chat_template_kwargs or {})
    for key in TEMPLATE_RESERVED:
        if key in kwargs:
            raise ApiError(
                400,
                f"chat_template_kwargs.{key} is set by the server; give it through the request's own fields",
                param=f"chat_template_kwargs.{key}",
            )
    if "enable_thinking" in kwargs:
        think = kwargs.pop("enable_thinking")
        if not isinstance(think, bool):
            raise ApiError(
                400,
                "chat_template_kwargs.enable_thinking must be true or false",
                param="chat_template_kwargs.enable_thinking",
            )
    return think, kwargs or None


def _format(rf: ResponseFormat | None) -> dict | None:
    """response_format as the engine's `format`: the JSON schema the whole answer matches (None: free text)."""
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return {"type": "object"}
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise ApiError(
            400,
            "response_format json_schema needs json_schema.schema: the JSON schema the answer must match",
            param="response_format.json_schema.schema",
        )
    return check_schema(rf.json_schema.schema_, "response_format.json_schema.schema")


def _format_param(rf: ResponseFormat | None) -> str:
    """How this API spells the engine's `format` field."""
    return "response_format.json_schema.schema" if rf is not None and rf.type == "json_schema" else "response_format"


def _choice_params(params: dict, seed: int | None, i: int) -> dict:
    return params if seed is None or not i else {**params, "seed": seed_value(seed + i)}


class _Run:
    """The jobs of one request's choices, one after another: `start` submits the next and waits for its start."""

    def __init__(self, prefix: str, request, model: str, names: dict, format_param="response_format", streamed=False):
        self.prefix, self.request, self.model, self.names, self.streamed = prefix, request, model, names, streamed
        self.format_param = format_param
        self.job = None
        self.meta: dict | None = None

    async def start(self, payload: dict) -> dict:
        """Run `payload`; the fields every response carries (the first job's id)."""
        await self.close()
        try:
            job, _, meta = await _start(
                self.prefix,
                self.request,
                self.model,
                dict(payload),
                self.names,
                priority.of(payload, streamed=self.streamed),
            )
        except ApiError as e:
            if e.param and (e.param == "format" or e.param.startswith(("format.", "format["))):
                e.param = self.format_param + e.param[len("format") :]
            raise
        self.job = job
        self.meta = self.meta or meta
        return self.meta

    async def close(self) -> None:
        if self.job is not None:
            await self.job.close()


def _delta(ev: Delta | ToolCallDelta) -> dict:
    """The streamed `delta` of one event: content, reasoning_content, or a tool call's piece."""
    if isinstance(ev, Delta):
        return {"reasoning_content" if ev.channel == "reasoning" else "content": ev.text}
    if ev.name is not None:  # a call's first piece: id, type and name (the SDK concatenates strings after it)
        fn = {"name": ev.name, "arguments": ev.arguments}
        return {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function", "function": fn}]}
    return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]}


def _message(answer: Answer) -> dict:
    """A whole answer as OpenAI's `message`: content null when the answer is only tool calls."""
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
        for i, n, a in answer.tool_calls()
    ]
    text = answer.text
    msg = {"role": "assistant", "content": text if text.strip() or not calls else None, "refusal": None}
    if calls:
        msg["tool_calls"] = calls
    if answer.reasoning:
        msg["reasoning_content"] = answer.thinking
    return msg


async def _chat_chunks(run: _Run, meta, payloads, include_usage: bool, messages, logprobs: bool, tools: bool):
    def chunk(i: int, delta: dict, finish=None, lps=None) -> dict:
        c = {
            **meta,
            "object": "chat.completion.chunk",
            "choices": [
                {
                    "index": i,
                    "delta": delta,
                    "logprobs": {"content": lps, "refusal": None} if lps else None,
                    "finish_reason": finish,
                }
            ],
        }
        if include_usage:
            c["usage"] = None
        return c

    finals = []
    for i, payload in enumerate(payloads):
        if i:
            await run.start(payload)
        answer = Answer()
        # content null rather than "" where the answer may be only tool calls (as OpenAI streams them)
        yield chunk(i, {"role": "assistant", "content": None if tools else "", "refusal": None})
        async for ev in run.job.events():
            if isinstance(ev, (Delta, ToolCallDelta)):
                answer.add(ev)
                yield chunk(i, _delta(ev), lps=logprob_dicts(ev) if logprobs and isinstance(ev, Delta) else None)
            elif isinstance(ev, Final):
                answer.add(ev)
                finals.append(ev)
                yield chunk(i, {}, FINISH.get(ev.finish_reason, "stop"), lps=logprob_dicts(ev) if logprobs else None)
                if not i:
                    await record("openai", meta["model"], messages, answer, getattr(run.request, "api_key", None))
            elif isinstance(ev, Error):
                raise ApiError.from_event(ev)
    if include_usage:
        yield {**meta, "object": "chat.completion.chunk", "choices": [], "usage": _usage(finals)}


# --- /v1/completions ---------------------------------------------------------------------------
@api_view("openai")
async def completions(request, body):
    req = CompletionRequest.model_validate(body)
    _refuse_unsupported(
        req,
        {
            **_COMMON_UNSUPPORTED,
            "n": 1,
            "suffix": lambda v: v == "",
            "echo": False,
            "best_of": 1,
            "logprobs": lambda v: False,
        },
    )
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(
                400,
                f"prompt: a list of {len(prompt)} prompts is not supported; send one at a time",
                param="prompt",
                code="unsupported_value",
            )
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt")
    payload = {
        "kind": "complete",
        "model": req.model,
        "prompt": prompt,
        "params": await _sampling(req, req.max_tokens or 16),
    }  # OpenAI's default is 16
    run = _Run("cmpl", request, req.model, {}, streamed=bool(req.stream))
    meta = await run.start(payload)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse(run, _completion_chunks(run.job, meta, usage))
    try:
        answer = await collect(run.job)
    finally:
        await run.close()
    finish = FINISH.get(answer.final.finish_reason, "stop")
    return JsonResponse(
        {
            **meta,
            "object": "text_completion",
            "choices": [{"index": 0, "text": answer.text, "logprobs": None, "finish_reason": finish}],
            "usage": _usage([answer.final]),
        }
    )


async def _completion_chunks(job, meta, include_usage: bool):
    def chunk(text: str, finish=None) -> dict:
        c = {
            **meta,
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            c["usage"] = None
        return c

    async for ev in job.events():
        if isinstance(ev, Delta):
            yield chunk(ev.text)
        elif isinstance(ev, Final):
            yield chunk("", FINISH.get(ev.finish_reason, "stop"))
            if include_usage:
                yield {**meta, "object": "text_completion", "choices": [], "usage": _usage([ev])}
        elif isinstance(ev, Error):
            raise ApiError.from_event(ev)


# --- /v1/embeddings ----------------------------------------------------------------------------
@api_view("openai")
async def embeddings(request, body):
    req = EmbeddingRequest.model_validate(body)
    _refuse_unsupported(req, {"dimensions": lambda v: False})
    texts = [req.input] if isinstance(req.input, str) else req.input
    if not texts or any(not t for t in texts):
        raise ApiError(400, "input must be a non-empty string or a list of non-empty strings", param="input")
    check_embed_batch(texts)
    job = await jobs.Job.submit(
        "rkmojo.generate", req.model, {"kind": "embed", "model": req.model, "input": texts}, client=_client(request)
    )
    try:
        await job.started()
        vecs, tokens = await embedding_result(job)
    finally:
        await job.close()
    data = []
    for i, v in enumerate(vecs):
        emb = base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64" else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return JsonResponse(
        {"object": "list", "data": data, "model": req.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )


async def embedding_result(job) -> tuple[np.ndarray, int]:
    """The vectors [N, H] float32 and the token count of an embed job (after its start event)."""
    async for ev in job.events():
        if isinstance(ev, Embeddings):
            return np.frombuffer(base64.b64decode(ev.data), "<f4").reshape(ev.shape), ev.prompt_tokens
        if isinstance(ev, Error):
            raise ApiError.from_event(ev)
    raise ApiError(500, "the worker sent no embeddings")


# --- /v1/models --------------------------------------------------------------------------------
@api_view("openai", ("GET",))
async def models(request, body):
    cat = await jobs.catalog()
    return JsonResponse(
        {"object": "list", "data": [_model_entry(name, entries[0][1]) for name, entries in sorted(cat.items())]}
    )


@api_view("openai", ("GET",))
async def model_detail(request, body, name):
    _, desc = await jobs.find_model(name)
    return JsonResponse(_model_entry(name, desc))


def _model_entry(name: str, desc: dict) -> dict:
    return {"id": name, "object": "model", "created": int(desc.get("modified") or 0), "owned_by": "rkmojo"}


# --- shared ------------------------------------------------------------------------------------
async def _start(prefix: str, request, model: str, payload: dict, names: dict | None, at: int) -> tuple:
    """Submit a generation at priority `at` and wait for its start: (job, start event, the fields every
    response carries)."""
    job = await jobs.Job.submit("rkmojo.generate", model, payload, client=_client(request), names=names, priority=at)
    start = await job.started()
    meta = {
        "id": f"{prefix}-{job.id}",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"rkmojo-{job.claim.worker if job.claim else 'unknown'}",
    }
    return job, start, meta


def _usage(finals: list[Final]) -> dict:
    """OpenAI's usage of one request's choices: the prompt once, the completions summed."""
    first = (finals[0].usage or Usage()) if finals else Usage()
    completion = sum((f.usage or Usage()).completion_tokens for f in finals)
    reasoning = sum((f.usage or Usage()).reasoning_tokens for f in finals)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def _sse(run: _Run, chunks) -> StreamingHttpResponse:
    async def body():
        try:
            async for c in chunks:
                yield f"data: {json.dumps(c, ensure_ascii=False, separators=(',', ':'))}\n\n"
            yield "data: [DONE]\n\n"
        except ApiError as e:
            yield f"data: {json.dumps(openai_error_body(e))}\n\n"
        finally:
            await chunks.aclose()
            await run.close()  # before the end: the client went away, and the worker stops at its next token

    return event_stream(body())
