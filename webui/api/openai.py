"""The OpenAI-compatible API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

Requests are validated once, at the edge, into pydantic models (strict types, unknown fields refused
as OpenAI does: "Unrecognized request argument supplied"). Fields OpenAI defines that the engine
cannot honour (n > 1, tools, image parts, …) are refused with 400 naming the field, never ignored.
Streaming answers are server-sent events in OpenAI's chunk format ending with `data: [DONE]`.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Literal

import numpy as np
from django.http import JsonResponse, StreamingHttpResponse
from pydantic import BaseModel, ConfigDict, Field

from appliance.events import Delta, Embeddings, Error, Final, Usage, logprob_dicts

from . import jobs
from .common import ApiError, api_view, log, openai_error_body
from inference.options import OPENAI

from .params import chat_messages, check_embed_batch, check_sampling, sampling_field, seed_value

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


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
    n: int | None = Field(None, ge=1)
    logit_bias: dict | None = None
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
    response_format: dict | None = None
    tools: list | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    web_search_options: Any = None


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
                400,
                f"'{name}' = {json.dumps(value)[:60]} is not supported by this server",
                param=name,
                code="unsupported_value",
            )


_COMMON_UNSUPPORTED = {
    "n": 1,
    "logit_bias": lambda v: not v,
    "store": False,
    "metadata": lambda v: not v,
    "service_tier": lambda v: v in ("auto", "default"),
}


def _sampling(req: _Sampling, max_tokens: int | None) -> dict:
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
            "tools": lambda v: not v,
            "functions": lambda v: not v,
            "tool_choice": lambda v: v in ("none", "auto"),
            "parallel_tool_calls": lambda v: True,
            "response_format": lambda v: v.get("type") == "text",
            "modalities": lambda v: v == ["text"],
            "audio": lambda v: False,
            "prediction": lambda v: False,
            "reasoning_effort": lambda v: False,
            "web_search_options": lambda v: False,
            "function_call": lambda v: v == "none",
        },
    )
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    messages = chat_messages(req.messages)
    params = _sampling(req, req.max_completion_tokens or req.max_tokens)
    if req.logprobs:
        params["logprobs"] = req.top_logprobs or 0
    payload = {"kind": "chat", "model": req.model, "messages": messages, "params": params}
    job, _, meta = await _start("chatcmpl", request, req.model, payload, names={"prompt": "messages"})
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse(job, _chat_chunks(job, meta, usage, messages, bool(req.logprobs)))
    try:
        text, final, lps = await _collect(job)
    finally:
        await job.close()
    await _record(req.model, messages, text, final)
    return JsonResponse(
        {
            **meta,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": {"content": lps, "refusal": None} if req.logprobs else None,
                    "finish_reason": FINISH.get(final.finish_reason, "stop"),
                }
            ],
            "usage": _usage(final),
        }
    )


async def _chat_chunks(job, meta, include_usage: bool, messages, logprobs: bool):
    def chunk(delta: dict, finish=None, lps=None) -> dict:
        c = {
            **meta,
            "object": "chat.completion.chunk",
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": {"content": lps, "refusal": None} if lps else None,
                    "finish_reason": finish,
                }
            ],
        }
        if include_usage:
            c["usage"] = None
        return c

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    parts = []
    async for ev in job.events():
        if isinstance(ev, Delta):
            parts.append(ev.text)
            yield chunk({"content": ev.text}, lps=logprob_dicts(ev) if logprobs else None)
        elif isinstance(ev, Final):
            yield chunk({}, FINISH.get(ev.finish_reason, "stop"), lps=logprob_dicts(ev) if logprobs else None)
            if include_usage:
                yield {**meta, "object": "chat.completion.chunk", "choices": [], "usage": _usage(ev)}
            await _record(meta["model"], messages, "".join(parts), ev)
        elif isinstance(ev, Error):
            raise ApiError.from_event(ev)


# --- /v1/completions ---------------------------------------------------------------------------
@api_view("openai")
async def completions(request, body):
    req = CompletionRequest.model_validate(body)
    _refuse_unsupported(
        req,
        {**_COMMON_UNSUPPORTED, "suffix": lambda v: v == "", "echo": False, "best_of": 1, "logprobs": lambda v: False},
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
        "params": _sampling(req, req.max_tokens or 16),
    }  # OpenAI's default is 16
    job, _, meta = await _start("cmpl", request, req.model, payload)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse(job, _completion_chunks(job, meta, usage))
    try:
        text, final, _ = await _collect(job)
    finally:
        await job.close()
    return JsonResponse(
        {
            **meta,
            "object": "text_completion",
            "choices": [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": FINISH.get(final.finish_reason, "stop")}
            ],
            "usage": _usage(final),
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
                yield {**meta, "object": "text_completion", "choices": [], "usage": _usage(ev)}
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
async def _start(prefix: str, request, model: str, payload: dict, names: dict | None = None) -> tuple:
    """Submit a generation and wait for its start: (job, start event, the fields every response carries)."""
    job = await jobs.Job.submit("rkmojo.generate", model, payload, client=_client(request), names=names)
    start = await job.started()
    meta = {
        "id": f"{prefix}-{job.id}",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"rkmojo-{job.claim.worker if job.claim else 'unknown'}",
    }
    return job, start, meta


async def _collect(job) -> tuple[str, Final, list]:
    parts, lps = [], []
    async for ev in job.events():
        if isinstance(ev, Delta):
            parts.append(ev.text)
            lps += logprob_dicts(ev)
        elif isinstance(ev, Final):
            lps += logprob_dicts(ev)
            return "".join(parts), ev, lps
        elif isinstance(ev, Error):
            raise ApiError.from_event(ev)
    raise ApiError(500, "the worker's stream ended without a final event")


def _usage(final: Final) -> dict:
    u = final.usage or Usage()
    prompt, completion = u.prompt_tokens, u.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


async def _record(model: str, messages: list[dict], text: str, final: Final) -> None:
    from webui import sessions

    try:
        await sessions.record("openai", model, messages, text, final.usage_dict())
    except Exception:  # the answer is delivered; a full disk must not turn it into an error
        log.exception("could not record the chat session")


def _sse(job, chunks) -> StreamingHttpResponse:
    async def body():
        try:
            async for c in chunks:
                yield f"data: {json.dumps(c, ensure_ascii=False, separators=(',', ':'))}\n\n"
            yield "data: [DONE]\n\n"
        except ApiError as e:
            yield f"data: {json.dumps(openai_error_body(e))}\n\n"
        finally:
            await chunks.aclose()
            await job.close()  # before the end: the client went away, and the worker stops at its next token

    resp = StreamingHttpResponse(body(), content_type="text/event-stream")
    resp["Cache-Control"] = "no-cache"
    resp["X-Accel-Buffering"] = "no"
    return resp
