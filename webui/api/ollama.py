"""The Ollama-compatible API: /api/chat, /api/generate, /api/embed(dings), /api/tags, /api/ps, /api/show,
/api/version, /api/delete, /api/pull.

Streaming answers are NDJSON, one object a line, the last with `done: true`, `done_reason` and the
durations in nanoseconds; a failure after the first line is a line `{"error": "..."}` (the ollama
client raises it). Like Ollama, fields it does not know are ignored; values the engine cannot honour
(images, mirostat, …) are refused with 400.

/api/chat and /api/generate take, as Ollama does:
- `tools` (chat): the answer's calls come as `message.tool_calls` [{id, function: {index, name,
  arguments: object}}]; streamed, each call comes whole in one line once the model has written it.
  Tool results are `tool` messages naming the tool (`tool_name`), answering its earliest unanswered call;
- `format`: "json" (any JSON object) or a JSON schema object; the answer matches it (constrained decoding);
- `think`: true or false (or "low", "medium", "high": on); a thinking model's thoughts come apart, as
  `message.thinking` (chat) or `thinking` (generate), never in the content. Unset: the model's default.
/api/chat takes Ollama's `truncate` (absent means true, as in Ollama): a conversation longer than the
context is answered with its oldest whole turns after the system messages left out (`params.TRUNCATE`);
false makes it a 400. /api/generate has no turns to leave out: an overlong prompt is always a 400.
/api/show's capabilities say "tools" for every chat model and "thinking" where the template has a mode.

/api/pull, /api/delete and an explicit load or unload (an empty prompt or no messages) need an admin key;
the rest a chat key (`webui.models.Scope`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Literal

import pydantic
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from pydantic import BaseModel, ConfigDict, Field

from appliance.events import Delta, Error, Final, Progress, ToolCallDelta, Usage, logprob_dicts

from . import board, jobs, priority
from .common import Answer, ApiError, api_view, check_scope, ollama_model_name, record
from .openai import embedding_result
from inference.options import OLLAMA

from .params import Tool, chat_messages, check_embed_batch, check_sampling, check_schema, check_tools, sampling_field
from .params import seed_value, trimming

VERSION = "0.9.0"  # the Ollama API level these endpoints follow; clients gate features on it

# options that tune Ollama's own runtime: accepted and without effect here (the worker owns its engine)
_RUNTIME_OPTIONS = {
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "num_keep",
    "repeat_last_n",
    "penalize_newline",
    "vocab_only",
    "logits_all",
    "embedding_only",
    "f16_kv",
}


class _Req(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class Options(_Req):
    """Ollama's `options`. Sampling ranges are the engine's schema, checked in `sampling` and reported under
    Ollama's names (`inference.options.OLLAMA`); fields where Ollama gives 0 or -1 a meaning of its own
    ("unset", "no limit") are declared here with that meaning."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _drop_runtime_options(cls, data):
        return {k: v for k, v in data.items() if k not in _RUNTIME_OPTIONS} if isinstance(data, dict) else data

    num_predict: int | None = None  # -1: no limit
    # Ollama's KV size; the worker's context is fixed (RKMOJO_CONTEXT) and a larger value is served within it,
    # as Ollama serves one past a model's limit (Home Assistant sends 8192 by default)
    num_ctx: int | None = Field(None, ge=1)
    temperature: sampling_field("temperature") = None
    top_k: sampling_field("top_k") = None
    top_p: float | None = Field(None, ge=0, le=1)  # 0: unset
    min_p: sampling_field("min_p") = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(None, ge=0)  # 0: unset
    presence_penalty: sampling_field("presence_penalty") = None
    frequency_penalty: sampling_field("frequency_penalty") = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    tfs_z: float | None = None
    typical_p: float | None = None


class _Generation(_Req):
    model: str
    stream: bool | None = True
    options: Options | None = None
    keep_alive: float | int | str | None = None
    format: str | dict | None = Field(None, description='"json" or a JSON schema the answer matches')
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class ChatRequest(_Generation):
    messages: list[Any] | None = None
    tools: list[Tool] | None = None
    truncate: bool | None = Field(
        None,
        description="true or absent: leave the oldest whole turns after the system messages out of a conversation "
        "longer than the context; false: such a conversation is a 400",
    )


class GenerateRequest(_Generation):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list | None = None


class EmbedRequest(_Req):
    model: str
    input: str | list[str] = ""
    truncate: bool | None = None
    options: dict | None = None
    keep_alive: float | int | str | None = None
    dimensions: int | None = None


class ModelRequest(_Req):
    model: str | None = None
    name: str | None = None  # older clients

    def target(self) -> str:
        name = self.model or self.name
        if not name:
            raise ApiError(400, "model is required", param="model")
        return ollama_model_name(name)


class LegacyEmbeddingsRequest(ModelRequest):
    prompt: str
    keep_alive: float | int | str | None = None


class PullRequest(ModelRequest):
    stream: bool | None = True
    insecure: bool | None = None
    worker: str | None = None  # ours: which board installs it when there are several


# --- request pieces ------------------------------------------------------------------------------
def keep_alive_seconds(value) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "-1"); negative: forever."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text.lstrip("-"))
    if not parts or "".join(a + b for a, b in parts) != text.lstrip("-"):
        raise ApiError(400, f"keep_alive {value!r}: give seconds or a duration like 5m or 1h", param="keep_alive")
    scale = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    seconds = sum(float(n) * scale[u] for n, u in parts)
    return -seconds if text.startswith("-") else seconds


def sampling(req: _Generation, **extra) -> dict:
    """The request's `SamplingParams` fields, checked (`extra`: the chat's tools)."""
    o = req.options or Options()
    for name, neutral in (("mirostat", 0), ("tfs_z", 1.0), ("typical_p", 1.0)):
        if getattr(o, name) not in (None, neutral):
            raise ApiError(400, f"option {name} is not supported by this server", param=f"options.{name}")
    max_tokens = None if o.num_predict is None or o.num_predict < 0 else o.num_predict
    if o.num_predict == 0:
        raise ApiError(400, "num_predict 0 asks for nothing; give a positive number or -1", param="options.num_predict")
    params = {
        "max_tokens": max_tokens,
        "temperature": o.temperature,
        "top_k": o.top_k,
        "top_p": o.top_p if o.top_p else None,
        "min_p": o.min_p,
        "repetition_penalty": o.repeat_penalty or None,
        "presence_penalty": o.presence_penalty or 0.0,
        "frequency_penalty": o.frequency_penalty or 0.0,
        "seed": seed_value(o.seed),
        "stop": o.stop or [],
        "format": _format(req.format),
        "think": None if req.think is None else bool(req.think),  # "low", "medium", "high": on
        "logprobs": (req.top_logprobs or 0) if req.logprobs else None,
        **extra,
    }
    return check_sampling(params, OLLAMA)


def _format(value: str | dict | None) -> dict | None:
    """Ollama's `format` as the engine's: "json" is any JSON object, a dict is the answer's JSON schema."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "object"}
    if isinstance(value, str):
        raise ApiError(400, f'format {value!r}: give "json" or a JSON schema object', param="format")
    return check_schema(value, "format")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _iso(ts: float | None) -> str:
    if ts is None:
        return "2318-11-30T00:00:00Z"  # kept loaded until memory is needed: Ollama's "forever"
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def _durations(final: Final, t0: float) -> dict:
    u = final.usage or Usage()
    ttft, total = (final.timings.ttft, final.timings.total) if final.timings else (0.0, 0.0)
    return {
        "total_duration": int((time.perf_counter() - t0) * 1e9),
        "load_duration": int(final.load_duration * 1e9),
        "prompt_eval_count": u.prompt_tokens,
        "prompt_eval_duration": int(ttft * 1e9),
        "eval_count": u.completion_tokens,
        "eval_duration": int(max(total - ttft, 0.0) * 1e9),
    }


def _ndjson(job, lines) -> StreamingHttpResponse:
    async def body():
        try:
            async for obj in lines:
                yield json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        except ApiError as e:
            yield json.dumps({"error": str(e)}) + "\n"
        finally:
            await lines.aclose()
            await job.close()

    return StreamingHttpResponse(body(), content_type="application/x-ndjson")


async def _answer(job, model: str, t0: float, piece, stream: bool, on_final=None):
    """The NDJSON lines of a generation (or the one JSON object when not streaming).

    `piece(content, thinking, tool_calls)` makes the flavor's fields (`message` or `response`). Streamed,
    a tool call goes out whole once its arguments are (as Ollama sends them), the rest at the end.
    """
    answer, sent = Answer(), set()

    def line(content: str = "", thinking: str = "", calls=None, **more) -> dict:
        return {"model": model, "created_at": _now(), **piece(content, thinking, calls), **more}

    async for ev in job.events():
        if isinstance(ev, (Delta, ToolCallDelta)):
            answer.add(ev)
            if not stream:
                continue
            if isinstance(ev, Delta):
                lp = {"logprobs": logprob_dicts(ev)} if ev.logprobs else {}
                reasoning = ev.channel == "reasoning"
                yield line("" if reasoning else ev.text, ev.text if reasoning else "", done=False, **lp)
            elif ev.index not in sent and (args := answer.whole_call(ev.index)) is not None:
                sent.add(ev.index)
                call = answer.calls[ev.index]
                yield line(calls=[_tool_call(ev.index, call["id"], call["name"], args)], done=False)
        elif isinstance(ev, Final):
            answer.add(ev)
            calls = [_tool_call(i, *c) for i, c in enumerate(answer.tool_calls()) if i not in sent]
            if stream and calls:
                yield line(calls=calls, done=False)
            if on_final is not None:
                await on_final(answer)
            yield line(
                "" if stream else answer.text,
                "" if stream else answer.thinking,
                None if stream else calls,
                done=True,
                done_reason=DONE_REASONS.get(ev.finish_reason, ev.finish_reason),
                **_durations(ev, t0),
                **({"logprobs": answer.lps} if answer.lps and not stream else {}),
            )
        elif isinstance(ev, Error):
            raise ApiError.from_event(ev)


# Ollama ends an answer of tool calls with "stop"; it has no word for the repetition guard's stop either
DONE_REASONS = {"cancelled": "stop", "tool_calls": "stop", "repetition": "stop"}


def _tool_call(index: int, cid: str, name: str, arguments: dict) -> dict:
    return {"id": cid, "function": {"index": index, "name": name, "arguments": arguments}}


def _chat_piece(content: str, thinking: str, calls) -> dict:
    msg = {"role": "assistant", "content": content}
    if thinking:
        msg["thinking"] = thinking
    if calls:
        msg["tool_calls"] = calls
    return {"message": msg}


def _generate_piece(content: str, thinking: str, calls) -> dict:
    return {"response": content, **({"thinking": thinking} if thinking else {})}


async def _respond(job, model: str, t0: float, piece, stream: bool, on_final=None):
    lines = _answer(job, model, t0, piece, stream, on_final)
    if stream:
        return _ndjson(job, lines)
    try:
        last = None
        async for obj in lines:
            last = obj
    finally:
        await job.close()
    return JsonResponse(last)


async def _load_or_unload(request, model: str, keep_alive: float | None, piece) -> JsonResponse:
    """Ollama's way to load a model (empty prompt/messages) or unload it (that and keep_alive 0): admin keys
    only. A chat's own keep_alive (Open WebUI's, Home Assistant's -1) is a chat key's to set."""
    kind = "unload" if keep_alive == 0 else "load"
    check_scope(request, "admin", f"{kind} (a request with an empty prompt or no messages)")
    job = await jobs.Job.submit(
        "rkmojo.generate",
        model,
        {"kind": kind, "model": model, "keep_alive": keep_alive},
        client=request.META.get("REMOTE_ADDR"),
        refused_status=503,
    )
    try:
        await job.started()
        async for ev in job.events():
            if isinstance(ev, Error):
                raise ApiError.from_event(ev)
    finally:
        await job.close()
    return JsonResponse(
        {"model": model, "created_at": _now(), **piece("", "", None), "done": True, "done_reason": kind}
    )


# --- /api/chat, /api/generate ----------------------------------------------------------------------
@api_view("ollama")
async def chat(request, body):
    t0 = time.perf_counter()
    req = ChatRequest.model_validate(body)
    model = ollama_model_name(req.model)
    params = sampling(req, tools=check_tools(req.tools))
    keep_alive = keep_alive_seconds(req.keep_alive)
    if not req.messages:
        return await _load_or_unload(request, model, keep_alive, _chat_piece)
    messages = chat_messages(req.messages, flavor="ollama")
    payload = {
        "kind": "chat",
        "model": model,
        "messages": messages,
        "params": params,
        "keep_alive": keep_alive,
        **trimming(req.truncate is not False),  # absent means true, as in Ollama
    }
    job = await _submit(request, model, payload, req.stream is not False, names={"prompt": "messages"})

    async def on_final(answer: Answer) -> None:
        await record("ollama", model, messages, answer, request.api_key)

    return await _respond(job, model, t0, _chat_piece, req.stream is not False, on_final)


@api_view("ollama")
async def generate(request, body):
    t0 = time.perf_counter()
    req = GenerateRequest.model_validate(body)
    model = ollama_model_name(req.model)
    for name in ("suffix", "template", "images", "context"):
        if getattr(req, name):
            raise ApiError(400, f"{name} is not supported by this server", param=name)
    params = sampling(req)
    keep_alive = keep_alive_seconds(req.keep_alive)
    if not req.prompt:
        return await _load_or_unload(request, model, keep_alive, _generate_piece)
    if req.raw:
        payload = {"kind": "complete", "prompt": req.prompt}
    else:
        messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": req.prompt}
        ]
        payload = {"kind": "chat", "messages": messages}
    payload.update(model=model, params=params, keep_alive=keep_alive)
    job = await _submit(request, model, payload, req.stream is not False)
    return await _respond(job, model, t0, _generate_piece, req.stream is not False)


async def _submit(request, model: str, payload: dict, streamed: bool, names: dict | None = None) -> jobs.Job:
    """A generation queued at its priority (`webui.api.priority`) and started; a full queue is a 503, as
    Ollama answers."""
    at = priority.of(payload, streamed=streamed)
    client = request.META.get("REMOTE_ADDR")
    job = await jobs.Job.submit(
        "rkmojo.generate", model, payload, client=client, refused_status=503, names=names, priority=at
    )
    await job.started()
    return job


# --- /api/embed, /api/embeddings -----------------------------------------------------------------
async def _embed(request, model: str, texts: list[str], keep_alive) -> tuple:
    if not texts or any(not isinstance(t, str) or not t for t in texts):
        raise ApiError(400, "input must be a non-empty string or a list of non-empty strings", param="input")
    check_embed_batch(texts)
    job = await jobs.Job.submit(
        "rkmojo.generate",
        model,
        {"kind": "embed", "model": model, "input": texts, "keep_alive": keep_alive_seconds(keep_alive)},
        client=request.META.get("REMOTE_ADDR"),
        refused_status=503,
    )
    try:
        start = await job.started()
        vecs, tokens = await embedding_result(job)
    finally:
        await job.close()
    return vecs, tokens, start


@api_view("ollama")
async def embed(request, body):
    t0 = time.perf_counter()
    req = EmbedRequest.model_validate(body)
    if req.dimensions:
        raise ApiError(400, "dimensions is not supported by this server", param="dimensions")
    model = ollama_model_name(req.model)
    vecs, tokens, start = await _embed(
        request, model, [req.input] if isinstance(req.input, str) else req.input, req.keep_alive
    )
    return JsonResponse(
        {
            "model": model,
            "embeddings": vecs.tolist(),
            "total_duration": int((time.perf_counter() - t0) * 1e9),
            "load_duration": int(start.load_duration * 1e9),
            "prompt_eval_count": tokens,
        }
    )


@api_view("ollama")
async def embeddings(request, body):
    req = LegacyEmbeddingsRequest.model_validate(body)
    vecs, _, _ = await _embed(request, req.target(), [req.prompt], req.keep_alive)
    return JsonResponse({"embedding": vecs[0].tolist()})


# --- models -----------------------------------------------------------------------------------
def _details(desc: dict) -> dict:
    from inference.models_dir import fmt_count

    return {
        "parent_model": "",
        "format": "rkmojo",
        "family": desc.get("family", ""),
        "families": [desc.get("family", "")],
        "parameter_size": fmt_count(desc.get("params", 0)),
        "quantization_level": desc.get("quant", ""),
    }


@api_view("ollama", ("GET",))
async def tags(request, body):
    cat = await jobs.catalog()
    return JsonResponse(
        {
            "models": [
                {
                    "name": name,
                    "model": name,
                    "modified_at": _iso(d.get("modified")),
                    "size": d.get("size", 0),
                    "digest": d.get("digest", ""),
                    "details": _details(d),
                }
                for name, entries in sorted(cat.items())
                for d in [entries[0][1]]
            ]
        }
    )


@api_view("ollama", ("GET",))
async def ps(request, body):
    from appliance import bus

    r = jobs.redis()
    workers = await bus.workers(r)
    models, requests = [], []
    running = {w["running"]: w["name"] for w in workers if w.get("running")}
    for w in workers:
        descs = {m["name"]: m for m in w.get("models", [])}
        for ld in w.get("loaded", []):
            d = descs.get(ld["name"], {})
            models.append(
                {
                    "name": ld["name"],
                    "model": ld["name"],
                    "size": ld.get("size", 0),
                    "digest": d.get("digest", ""),
                    "details": _details(d),
                    "expires_at": _iso(ld.get("expires_at")),
                    "size_vram": 0,
                    "context_length": ld.get("context") or d.get("context") or None,
                    "worker": w["name"],
                    # rkmojo's own: what computes its prefill (cpu, rknpu) and why
                    "backend": ld.get("backend"),
                    "backend_reason": ld.get("backend_reason"),
                }
            )
    for name in sorted({m["name"] for w in workers for m in w.get("models", [])}):
        for q in await bus.queued(r, name):
            requests.append(
                {**q, "state": "running" if q["id"] in running else "waiting", "worker": running.get(q["id"])}
            )
    return JsonResponse({"models": models, "requests": requests})


@api_view("ollama")
async def show(request, body):
    name = ModelRequest.model_validate(body).target()
    _, d = await jobs.find_model(name)
    arch = d.get("architecture", "")
    gen = d.get("generation") or {}
    return JsonResponse(
        {
            "modelfile": f"# rkmojo store {name}\n",
            "template": "",
            "license": "",
            "parameters": "\n".join(f"{k} {v}" for k, v in gen.items() if isinstance(v, (int, float, str))),
            "details": _details(d),
            "modified_at": _iso(d.get("modified")),
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": d.get("params", 0),
                f"{arch}.context_length": d.get("context", 0),
                f"{arch}.embedding_length": d.get("hidden", 0),
                f"{arch}.block_count": d.get("layers", 0),
                "rkmojo.active_parameter_count": d.get("active_params", 0),
            },
            "capabilities": await _capabilities(name, d),
        }
    )


async def _capabilities(name: str, desc: dict) -> list[str]:
    """Ollama's capability names: tools for every chat model (native or the generic JSON format), thinking
    where the chat template has a thinking mode (read from the store when this machine holds it)."""
    caps = ["completion", "tools"]
    if await sync_to_async(_thinks, thread_sensitive=False)(name, desc.get("digest", "")):
        caps.append("thinking")
    return caps + ["embedding"]


@functools.lru_cache(maxsize=32)
def _thinks(name: str, digest: str) -> bool:
    """Whether store `name` (at `digest`) has a thinking mode; False when this machine does not hold it."""
    from inference.errors import RkmojoError
    from inference.store import Store
    from inference.structured import capabilities
    from inference.tokenizer import StoreTokenizer

    path = settings.MODELS_DIR / name
    if not (path / "manifest.json").is_file():
        return False
    try:
        return capabilities(StoreTokenizer(Store(path)).template_source)["thinking"]
    except (RkmojoError, OSError, ValueError):
        return False


@api_view("ollama", ("GET",), auth=False)
async def version(request, body):
    return JsonResponse({"version": VERSION})


@api_view("ollama", ("DELETE",), scope="admin")
async def delete(request, body):
    await board.delete(ModelRequest.model_validate(body).target())
    return JsonResponse({})


@api_view("ollama", scope="admin")
async def pull(request, body):
    req = PullRequest.model_validate(body)
    job, _ = await board.start_install(req.model or req.name or "", req.worker)
    if job is None:  # installed already
        return _pull_done(req.stream is not False, [{"status": "success"}])
    await job.started()

    async def lines():
        yield {"status": "pulling manifest"}
        async for ev in job.events():
            if isinstance(ev, Progress):
                yield ev.model_dump(include={"status", "digest", "total", "completed"}, exclude_none=True)
            elif isinstance(ev, Error):
                raise ApiError.from_event(ev)

    if req.stream is not False:
        return _ndjson(job, lines())
    try:
        async for _ in lines():
            pass
    finally:
        await job.close()
    return JsonResponse({"status": "success"})


def _pull_done(stream: bool, objs: list[dict]):
    if not stream:
        return JsonResponse(objs[-1])
    return HttpResponse("".join(json.dumps(o) + "\n" for o in objs), content_type="application/x-ndjson")
