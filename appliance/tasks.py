"""Celery tasks run by a worker. Each writes its progress as events to the request's Redis stream.

The events they emit (`bus.emit`) are the contract in `appliance.events`; a generation's, in order:

    Claim, Loading (only when the model was not loaded), Start, PrefillProgress…, Delta… and ToolCallDelta…, Final

or Claim, [Loading], Error when the request is refused (an Error may also end the stream after Start).
`PrefillProgress` {done, total} counts the prompt tokens computed of those to compute (tokens reused
from the KV cache are in neither): (0, total) first, then after each prefill chunk, at most
`1 / PREFILL_EVENT_INTERVAL` a second, and always the last (done == total). An embedding sends Claim,
[Loading], Start, Embeddings, Final. (`Queued` is the web side's: `webui.api.jobs`.) A chat's Deltas carry
their channel (content or reasoning), its tool calls come as ToolCallDelta pieces and, parsed, in Final.

A generation's payload: {id, kind (chat, complete, embed, load, unload), model, messages (chat) or prompt,
params (`SamplingParams` fields), session?, keep_alive?, template?, defaults?, truncate?}. `defaults` are the chat
page's (`tunables.chat_defaults`: repetition_guard, max_tokens) for the fields `params` leave unset, over
the worker's own (`RKMOJO_<FIELD>`); its max_tokens is a cap, fitted to the room the prompt leaves in the
context, where an explicit max_tokens that does not fit is refused. `truncate: "oldest_turns"` (a chat;
the chat page's, and the APIs' opt-in) leaves the oldest whole turns after the system messages out of a
prompt that would overflow the context with the answer's room (`_fit`); `Start.dropped_messages` says how
many messages. Without it an overlong prompt is a 400 context_length_exceeded.

While a task computes it keeps the board's live-view fields current (`Board.state`: loading, prefill with
`Board.prefill`, decoding, embedding; `Board.tokens`; `Board.last_ttft`) for the stats thread.

`generate` serves the model queues: chat, complete, embed, load, unload. `install`, `delete` and
`verify` serve the board queue.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import shutil
import threading
import time
from pathlib import Path

import numpy as np
from celery import shared_task
from django.conf import settings

from inference.options import ENV, OptionError

from . import bus
from .events import (
    Claim,
    Delta,
    Embeddings,
    Error,
    Final,
    Loading,
    Logprob,
    PrefillProgress,
    Progress,
    Start,
    Timings,
    ToolCallDelta,
    ToolCallOut,
    Usage,
)
from .promptcache import common_prefix
from .sources import SourceError, local_path
from .worker import board

log = logging.getLogger("rkmojo.tasks")
PREFILL_EVENT_INTERVAL = 0.25  # seconds between two prefill progress events (the last one always goes)
VERIFY_EVENT_INTERVAL = 0.1  # seconds between two verify progress events (a new group always goes)


class RequestError(Exception):
    """A request the engine refused: becomes an `error` event with an HTTP status."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param

    def event(self) -> Error:
        return Error(status=self.status, code=self.code, param=self.param, message=str(self))


@shared_task(name="rkmojo.generate", ignore_result=True)
def generate(req: dict) -> None:
    """Run one request on this worker's engine for `req["model"]`."""
    b = board()
    rid = req["id"]
    bus.claimed(b.r, rid)
    bus.emit(b.r, rid, Claim(worker=b.name, boot=b.boot))
    try:
        if bus.cancelled_at(b.r, rid) is not None:
            bus.emit(b.r, rid, Final(finish_reason="cancelled"))
            return
        batched = req["kind"] in ("chat", "complete") and b.parallel() > 1
        with contextlib.nullcontext() if batched else b.lock:  # batched: the model's batcher takes turns
            b.running, b.running_model = rid, req["model"]
            if batched:
                b.active[rid] = req["model"]
            b.heartbeat()  # /api/ps shows it running now, not at the next beat
            try:
                _run(b, req)
            finally:
                b.active.pop(rid, None)
                if b.active:  # the others still run: the board shows one of them
                    b.running, b.running_model = next(iter(b.active.items()))
                else:
                    b.running = b.running_model = None
                    b.state, b.prefill = "idle", None
                b.heartbeat()
    except RequestError as e:
        bus.emit(b.r, rid, e.event())
    except OptionError as e:  # the engine names the option; this worker's operator set it as RKMOJO_*
        bus.emit(
            b.r,
            rid,
            Error(
                status=500, code="engine_options", message=f"worker {b.name} cannot open {req['model']}: {ENV.error(e)}"
            ),
        )
    except Exception as e:  # a bug or a broken store: the client gets an error event, the worker lives on
        log.exception("request %s failed", rid)
        bus.emit(
            b.r, rid, Error(status=500, code="internal_error", message=f"the worker failed: {type(e).__name__}: {e}")
        )
    finally:
        b.r.zrem(bus.k_queue(req["model"]), rid)


def _run(b, req: dict) -> None:
    from inference.generate import ContextLengthError
    from inference.structured import StructureError
    from inference.templates import ChatTemplateError

    rid, name, kind = req["id"], req["model"], req["kind"]
    if name not in b.models and name not in b.scan():
        raise RequestError(
            404, f"model {name!r} is not installed on worker {b.name}", code="model_not_found", param="model"
        )
    if kind == "unload":
        unloaded = b.unload(name)
        bus.emit(b.r, rid, Start())
        bus.emit(b.r, rid, Final(finish_reason="unload" if unloaded else "stop"))
        return
    if name not in b.loaded:
        bus.emit(b.r, rid, Loading(model=name))
    eng, load_s = b.engine(name, req.get("keep_alive"))
    try:
        if kind == "load":
            bus.emit(b.r, rid, Start(load_duration=load_s))
            bus.emit(b.r, rid, Final(finish_reason="load", load_duration=load_s))
        elif kind == "embed":
            _embed(b, eng, req, load_s)
        else:
            try:
                _generate(b, eng, req, load_s)
            except ContextLengthError as e:
                raise RequestError(400, str(e), code="context_length_exceeded", param="prompt") from None
            except OptionError as e:
                raise RequestError(400, str(e), code="invalid_value", param=e.field) from None
            except StructureError as e:  # tools, tool_choice, format, think: the engine names the field
                raise RequestError(400, str(e), code="invalid_value", param=e.field) from None
            except (ChatTemplateError, ValueError) as e:
                raise RequestError(400, str(e), param="prompt") from None
    finally:
        b.touch(name, req.get("keep_alive"))


def _embed(b, eng, req: dict, load_s: float) -> None:
    from inference.generate import ContextLengthError

    texts = req["input"]
    b.state = "embedding"
    try:
        counts = [len(eng.tokenizer.encode(t)) for t in texts]
        vecs = eng.embed(texts, wait=True)  # [N, H] float32, L2-normalised (between a batcher's rounds)
    except ContextLengthError as e:
        raise RequestError(400, str(e), code="context_length_exceeded", param="input") from None
    except ValueError as e:
        raise RequestError(400, str(e), param="input") from None
    bus.emit(b.r, req["id"], Start(prompt_tokens=sum(counts), load_duration=load_s))
    bus.emit(
        b.r,
        req["id"],
        Embeddings(
            shape=vecs.shape,
            prompt_tokens=sum(counts),
            data=base64.b64encode(np.ascontiguousarray(vecs, "<f4").tobytes()).decode(),
        ),
    )
    bus.emit(b.r, req["id"], Final(finish_reason="stop", load_duration=load_s, usage=Usage(prompt_tokens=sum(counts))))


def _generate(b, eng, req: dict, load_s: float) -> None:
    """A chat or completion: `req["params"]` are `SamplingParams` fields as JSON (tools, tool_choice,
    parallel_tool_calls, format, think and logit_bias among them; logit_bias's token ids arrive as
    strings); a chat's prompt is rendered by `eng.chat_prompt` (the template with tools and thinking)
    and its answer parsed by the model's family format into reasoning, content and tool calls."""
    from inference.generate import Final as EngineFinal
    from inference.generate import TextDelta, TokenEvent
    from inference.generate import ToolCallDelta as EngineToolCallDelta
    from inference.sampler import SamplingParams

    rid, name, chat = req["id"], req["model"], req["kind"] == "chat"
    cancel_seen: dict = {}

    def cancelled() -> bool:
        if b.shutting_down:
            return True
        if "at" not in cancel_seen:
            at = bus.cancelled_at(b.r, rid)
            if at is None:
                return False
            cancel_seen["at"], cancel_seen["tokens"], cancel_seen["seen"] = at, n_tokens, time.time()
        return True

    page = dict(req.get("defaults") or {})  # the chat page's, for what its conversation leaves unset
    cap = page.pop("max_tokens", None)
    params = SamplingParams.from_any(_params({**b.cfg.get("SAMPLING", {}), **page}, req), cancel=cancelled)
    tok = eng.tokenizer
    dropped = 0
    if chat and req.get("truncate") == "oldest_turns":
        ids, dropped = _fit(eng, req["messages"], params, _reserve(eng, req, cap))
    else:
        ids = eng.chat_prompt(req["messages"], params) if chat else tok.encode(req["prompt"])
    if cap and (req.get("params") or {}).get("max_tokens") is None and len(ids) < eng.context_length:
        params.max_tokens = min(int(cap), eng.context_length - len(ids))  # a default fits what is left
    if b.parallel() > 1:
        # stepped with the model's other generations; a slot keeps its last conversation for the next prompt
        # that extends it, and saves it as a prompt-cache file before another takes the slot (checks the
        # parameters and the context before any compute)
        events = b.batcher(name).generate(
            ids,
            params,
            chat=chat,
            priority=int(req.get("priority") or 0),
            progress=_prefill_reporter(b, rid),
            session=req.get("session"),
        )
    else:
        ld = b.loaded[name]
        shared = common_prefix(np.asarray(ids), np.asarray(eng.tokens))
        # another conversation (or an earlier point of this one) is about to cut the engine's short: keep it
        # for later. A prompt that extends the last one continues its conversation: the state it leaves covers it.
        if ld.dirty and shared < min(ld.prompt, len(eng.tokens)):
            b.save_state(name)
        b.prompt_cache(name).restore(eng, ids)
        # checks the parameters and the context before any compute
        events = eng.generate(ids, params, progress=_prefill_reporter(b, rid), chat=chat)
        ld.dirty, ld.session, ld.prompt = True, req.get("session"), len(ids)
    bus.emit(b.r, rid, Start(prompt_tokens=len(ids), load_duration=load_s, dropped_messages=dropped or None))
    # tokens are counted as reasoning when the text they complete is (the first TextDelta after them)
    n_tokens, counted, reasoning_tokens, pending_lp = 0, 0, 0, []
    for ev in events:
        if isinstance(ev, TokenEvent):
            if not n_tokens:
                b.state, b.prefill = "decoding", None
            n_tokens += 1
            b.tokens += 1
            if ev.logprob is not None:
                pending_lp.append(_logprob(tok, ev))
        elif isinstance(ev, TextDelta):
            if ev.channel == "reasoning":
                reasoning_tokens += n_tokens - counted
            counted = n_tokens
            bus.emit(b.r, rid, Delta(text=ev.text, tokens=n_tokens, channel=ev.channel, logprobs=pending_lp or None))
            pending_lp = []
        elif isinstance(ev, EngineToolCallDelta):
            bus.emit(b.r, rid, ToolCallDelta(index=ev.index, id=ev.id, name=ev.name, arguments=ev.arguments))
        elif isinstance(ev, EngineFinal):
            if n_tokens or ev.finish_reason != "cancelled":
                b.last_ttft = ev.timings.ttft
            if ev.finish_reason == "cancelled" and "at" not in cancel_seen:
                raise RequestError(503, f"the worker {b.name} is stopping; retry the request", code="worker_stopping")
            cancel = {}
            if "at" in cancel_seen:
                cancel = {
                    "cancel_latency": cancel_seen["seen"] - cancel_seen["at"],
                    "tokens_after_cancel": n_tokens - cancel_seen["tokens"],
                }
            calls = [ToolCallOut(id=c.id, name=c.name, arguments=c.arguments) for c in ev.tool_calls]
            usage = Usage.model_validate(ev.usage, from_attributes=True)
            bus.emit(
                b.r,
                rid,
                Final(
                    finish_reason=ev.finish_reason,
                    load_duration=load_s,
                    usage=usage.model_copy(update={"reasoning_tokens": reasoning_tokens}),
                    timings=Timings.model_validate(ev.timings, from_attributes=True),
                    logprobs=pending_lp or None,
                    tool_calls=calls or None,
                    **cancel,
                ),
            )


def _reserve(eng, req: dict, cap: int | None) -> int:
    """The answer's room that trimming keeps free: the request's own max_tokens, else the default cap but at
    most a quarter of the context (a default of 1024 must not empty a 512-token context's history)."""
    explicit = (req.get("params") or {}).get("max_tokens")
    if explicit is not None:
        return int(explicit)
    quarter = eng.context_length // 4
    return min(int(cap), quarter) if cap else quarter


def _fit(eng, messages: list[dict], params, reserve: int) -> tuple[list[int], int]:
    """The prompt of `messages` with the oldest turns after the system messages left out while it and
    `reserve` overflow the context: whole turns (a user message and all that answers it: the assistant's
    messages, tool calls and their results), never the last one, and none while it fits, so the prompt's
    prefix stays the same from one send to the next (the prompt cache). Too long even so: the engine refuses.

    Returns:
        (the prompt's token ids, how many messages were left out)
    """
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    starts = [i for i in range(head, len(messages)) if messages[i]["role"] == "user"]  # each turn's first
    ids, cut = eng.chat_prompt(messages, params), head
    for nxt in starts[1:]:
        if len(ids) + reserve <= eng.context_length:
            break
        cut = nxt
        ids = eng.chat_prompt(messages[:head] + messages[cut:], params)
    return ids, cut - head


def _params(defaults: dict, req: dict) -> dict:
    """The request's `SamplingParams` fields over the worker's defaults; JSON's spellings made the engine's
    (logit_bias keys back to token ids) and the chat page's template variables (`req["template"]`) added."""
    params = {**defaults, **(req.get("params") or {})}
    if params.get("logit_bias"):
        try:
            params["logit_bias"] = {int(k): v for k, v in params["logit_bias"].items()}
        except (TypeError, ValueError, AttributeError):
            raise RequestError(
                400, "logit_bias keys must be token ids", code="invalid_value", param="logit_bias"
            ) from None
    if req.get("template"):
        params["template"] = {**(params.get("template") or {}), **req["template"]}
    return params


def _prefill_reporter(b, rid: str):
    """The engine's prefill progress callback: the board's state, and `PrefillProgress` events (throttled)."""
    last = [float("-inf")]

    def progress(done: int, total: int) -> None:
        b.prefill = (done, total)
        b.state = "prefill"
        now = time.monotonic()
        if done >= total or now - last[0] >= PREFILL_EVENT_INTERVAL:
            last[0] = now
            bus.emit(b.r, rid, PrefillProgress(done=done, total=total))

    return progress


def _logprob(tok, ev) -> Logprob:
    def entry(i: int, lp: float) -> dict:
        text = tok.decode([i], skip_special_tokens=False)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return Logprob(**entry(ev.id, ev.logprob), top_logprobs=[entry(i, lp) for i, lp in (ev.top_logprobs or ())])


# --- board tasks: install, delete, verify ------------------------------------------------------------
@shared_task(name="rkmojo.install", ignore_result=True)
def install(req: dict) -> None:
    """Install a model from a repository id, a .gguf URL or a local path, in a background thread.

    The worker keeps serving generation meanwhile; progress goes to the request's stream.
    """
    b = board()
    rid = req["id"]
    bus.emit(b.r, rid, Claim(worker=b.name, boot=b.boot))
    if b.installing:
        bus.emit(
            b.r,
            rid,
            RequestError(409, f"worker {b.name} is already installing {b.installing['name']}; wait for it").event(),
        )
        return
    b.installing = {"name": req["name"], "source": req["source"], "started": time.time()}
    bus.emit(b.r, rid, Start())
    node = install.request.hostname or ""
    threading.Thread(target=_install, args=(b, req, node), name="rkmojo-install", daemon=True).start()


def _install(b, req: dict, node: str) -> None:
    """Install `req["source"]` as `req["name"]`. A URL pull runs under the pull policy (`PullPolicy`: public
    addresses, and LAN ones when `pull_from_lan` is on); its refusal is a 403 and a connection that failed
    a 502, each with the one message the engine gives, whatever the port behind it (the reason goes to the
    log). A refused or failed pull leaves nothing in the models directory but a download a retry resumes."""
    from inference.errors import RkmojoError, disk_full
    from inference.pull import DownloadFailed, PullCancelled, PullPolicy, PullRefused

    rid, name, source = req["id"], req["name"], req["source"]
    stop = threading.Event()
    try:
        try:
            local = local_path(source, settings.RKMOJO["IMPORT_DIR"])
        except SourceError as e:
            raise RequestError(400, str(e), param="model") from None
        if not name or "/" in name or name.startswith("."):
            raise RequestError(400, f"{source}: no model name to install it as; give the .gguf file's URL")
        out = b.models_dir / name
        if out.exists():
            raise RequestError(409, f"model {name!r} is already installed on {b.name}; delete it first")
        threading.Thread(target=_watch_pull, args=(b, rid, out, stop), daemon=True).start()
        bus.emit(b.r, rid, Progress(status=f"pulling {source}"))
        if local is not None:
            from inference.convert import convert

            convert(local, out, progress=False)
        else:
            from inference.pull import pull

            pull(
                source,
                b.models_dir,
                name=name,
                progress=False,
                cancel=lambda: bus.cancelled_at(b.r, rid) is not None,  # the panel's Cancel
                policy=PullPolicy(lan=b.cfg["PULL_FROM_LAN"]),
                # "connection failed, retry 2 of 6 in 1.1 s": one wording whatever the port (the policy's rule)
                on_retry=lambda why: bus.emit(b.r, rid, Progress(status=f"pulling {name}: {why}")),
            )
        stop.set()
        bus.emit(b.r, rid, Progress(status="verifying"))
        from inference.models_dir import quick_check

        problem = quick_check(out)
        if problem:
            raise RequestError(500, f"{name}: installed store is incomplete: {problem}")
        with b.lock:
            b.scan()
        b.heartbeat()
        b.close_caches(name)
        from .celery import app

        app.control.add_consumer(bus.model_queue(name), destination=[node], reply=False)
        bus.emit(b.r, rid, Progress(status="success"))
        bus.emit(b.r, rid, Final(finish_reason="stop"))
    except RequestError as e:
        bus.emit(b.r, rid, e.event())
    except PullCancelled:
        bus.emit(b.r, rid, Final(finish_reason="cancelled"))
    except PullRefused as e:
        log.warning("pull %s refused: %s", source, e.why)
        bus.emit(b.r, rid, RequestError(403, str(e), code="pull_refused", param="model").event())
    except DownloadFailed as e:  # a connection's failure is `FAILED`, whatever the port (the reason is logged)
        bus.emit(b.r, rid, RequestError(502, str(e), code="download_failed", param="model").event())
    except (RkmojoError, OSError, ValueError) as e:
        status = 507 if disk_full(e) else 400  # the store writer removed its half-written work
        bus.emit(
            b.r, rid, RequestError(status, f"pull {source}: {e}", code="disk_full" if status == 507 else None).event()
        )
    except Exception as e:
        log.exception("install of %s failed", source)
        bus.emit(b.r, rid, RequestError(500, f"pull {source}: {type(e).__name__}: {e}").event())
    finally:
        stop.set()
        b.installing = None


def _watch_pull(b, rid: str, out: Path, stop: threading.Event) -> None:
    """Report an install's bytes done while it runs (the pull journal, or the store being written)."""
    from inference.pull import describe_partial

    staging = out.parent / f".{out.name}.pull"
    last = None
    while not stop.wait(0.5):
        info = describe_partial(staging) if staging.is_dir() else None
        if info and (info["done"], info["total"]) != last:
            last = (info["done"], info["total"])
            bus.emit(
                b.r,
                rid,
                Progress(status=f"pulling {out.name}", digest=out.name, completed=info["done"], total=info["total"]),
            )


@shared_task(name="rkmojo.delete", ignore_result=True)
def delete(req: dict) -> None:
    b = board()
    rid, name = req["id"], req["name"]
    bus.emit(b.r, rid, Claim(worker=b.name, boot=b.boot))
    with b.lock:
        if name not in b.scan():
            bus.emit(b.r, rid, RequestError(404, f"model {name!r} not found on {b.name}").event())
            return
        b.unload(name)
        b.close_caches(name)  # its writes finish before its directory goes
        path = b.models_dir / name
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path)
        shutil.rmtree(Path(settings.PROMPT_CACHE_DIR) / name, ignore_errors=True)
        b.popularity_path(name).unlink(missing_ok=True)
        b.verify_path(name).unlink(missing_ok=True)
        b.scan()
    bus.forget(b.r, name, b.name)
    b.heartbeat()
    from .celery import app

    app.control.cancel_consumer(bus.model_queue(name), destination=[delete.request.hostname or ""], reply=False)
    bus.emit(b.r, rid, Start())
    bus.emit(b.r, rid, Final(finish_reason="stop"))


@shared_task(name="rkmojo.verify", ignore_result=True)
def verify(req: dict) -> None:
    """Check every digest of a model's store: Start, Progress… ("verifying dense tensors", "verifying
    experts/layer_07.bin", bytes done of all, at most `VERIFY_EVENT_INTERVAL` apart but at each new group),
    then a last Progress saying "verified: …" and Final, or an Error 422 naming the first tensor or expert
    that does not match. The result and its time are kept (`Board.save_verify`): the model's description
    in the registration carries them as `verified`."""
    from inference.errors import RkmojoError
    from inference.store import Store

    b = board()
    rid, name = req["id"], req["name"]
    bus.emit(b.r, rid, Claim(worker=b.name, boot=b.boot))
    if name not in b.scan():
        bus.emit(b.r, rid, RequestError(404, f"model {name!r} not found on {b.name}").event())
        return
    bus.emit(b.r, rid, Start())
    st = Store(b.models[name]["path"])
    total, done, what, last = st.total_bytes(), [0], ["the store"], [float("-inf")]

    def emit(force: bool = False) -> None:
        now = time.monotonic()
        if force or now - last[0] >= VERIFY_EVENT_INTERVAL:
            last[0] = now
            bus.emit(b.r, rid, Progress(status=f"verifying {what[0]}", completed=min(done[0], total), total=total))

    def progress(n: int) -> None:
        done[0] += n
        emit()

    def group(g: str) -> None:
        what[0] = g
        emit(force=True)

    t0 = time.monotonic()
    try:
        st.verify(progress=progress, group=group)
    except RkmojoError as e:
        b.save_verify(name, st.digest, ok=False, message=str(e))
        bus.emit(b.r, rid, RequestError(422, str(e), code="verify_failed").event())
        return
    n_experts = sum(lay.n_experts for lay in st.expert_layers.values())
    result = (
        f"verified: {len(st.manifest['dense']['tensors'])} tensors"
        + (f" and {n_experts} expert blobs" if n_experts else "")
        + f" match their digests ({total / 2**20:.0f} MiB in {time.monotonic() - t0:.1f} s)"
    )
    b.save_verify(name, st.digest, ok=True, message=result)
    bus.emit(b.r, rid, Progress(status=result, completed=total, total=total))
    bus.emit(b.r, rid, Final(finish_reason="stop"))
