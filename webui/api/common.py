"""What every API view shares: the error type, JSON in and out, API-key checks, the view decorator, and
`Answer`, a generation's answer gathered from its events.

Views are plain async functions under `api_view(flavor, methods)`, which checks the method and the API
key, parses the JSON body, and turns every failure into the flavor's error format — OpenAI's
`{"error": {"message", "type", "param", "code"}}` or Ollama's `{"error": "..."}` — with the right
status. An unexpected exception is logged and answered 500 in the same format, never as HTML.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
from datetime import timedelta

import kombu.exceptions
import pydantic
import redis.exceptions
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from appliance.events import Delta, Error, Final, ToolCallDelta, logprob_dicts
from inference.errors import disk_full

log = logging.getLogger("rkmojo.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    507: "server_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "server_error",
}


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


class ApiError(Exception):
    """A request that cannot be served; `status` is the HTTP status, `param` the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}

    @classmethod
    def from_event(cls, ev: Error) -> "ApiError":
        return cls(ev.status, ev.message, param=ev.param, code=ev.code)


DISK_FULL = ApiError(
    507,
    "the appliance's data disk is full; nothing was saved. Free space in its data directory "
    "(remove a model with `rkmojo rm`, or old prompt caches) and retry",
    code="disk_full",
)


def openai_error_body(e: ApiError) -> dict:
    return {
        "error": {
            "message": str(e),
            "type": _TYPES.get(e.status, "server_error" if e.status >= 500 else "invalid_request_error"),
            "param": e.param,
            "code": e.code,
        }
    }


def error_response(flavor: str, e: ApiError) -> JsonResponse:
    body = openai_error_body(e) if flavor == "openai" else {"error": str(e)}
    resp = JsonResponse(body, status=e.status)
    for k, v in e.headers.items():
        resp[k] = v
    return resp


def validation_error(e: pydantic.ValidationError) -> ApiError:
    """The first pydantic error as an ApiError naming the field as OpenAI does (`messages[0].content`)."""
    err = e.errors()[0]
    loc = err.get("loc", ())
    # a union reports each member's failure under the member's type name: keep the field path only
    parts = [p for p in loc if isinstance(p, int) or (p not in _UNION_TAGS and not any(c in p for c in "[]-"))]
    param = ""
    for p in parts:
        param += f"[{p}]" if isinstance(p, int) else (f".{p}" if param else str(p))
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param or None)
    if err.get("type") == "missing":
        return ApiError(
            400, f"Missing required parameter: '{param}'", param=param or None, code="missing_required_parameter"
        )
    got = err.get("input")
    shown = json.dumps(got)[:80] if not isinstance(got, dict) else "an object"
    return ApiError(
        400,
        f"Invalid value for '{param}': {msg} (got {shown})",
        param=param or None,
        code="invalid_value" if "type" not in err.get("type", "") else "invalid_type",
    )


def parse_json(request: HttpRequest) -> dict:
    body = getattr(request, "json_body", None)  # parsed and checked by webui.door.LanDoorMiddleware
    if body is None:
        try:
            body = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


# --- API keys --------------------------------------------------------------------------------------
def is_loopback(addr: str | None) -> bool:
    try:
        return ipaddress.ip_address((addr or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def key_required(policy: str, client_addr: str | None) -> bool:
    """Whether a client must show a key: "always", "never", or "remote" (all but loopback clients)."""
    return policy == "always" or (policy == "remote" and not is_loopback(client_addr))


async def check_api_key(request: HttpRequest):
    """The request's API key (None when it needs none and shows none of ours). Raise 401 unless the request carries a valid key or needs none (see RKMOJO_API_KEYS); 429 while its
    address is locked out.

    A client that needs no key may send none or a placeholder (`api_key="ollama"`), as Ollama serves it. A
    key that looks like ours (`rkm-…`) is checked whoever sends it, so a wrong or revoked one is a 401 from
    loopback too. Wrong keys count against the client's address (`webui.throttle`): after
    `RKMOJO_API_KEY_FAILURES` every key from there is a 429 until the lockout ends, the right one too.
    """
    from webui import config, throttle
    from webui.models import KEY_PREFIX, ApiKey, hash_key

    header = request.headers.get("Authorization", "")
    key = header[7:].strip() if header[:7].lower() == "bearer " else ""
    policy = (await config.acurrent())["api_keys"]
    if not key.startswith(KEY_PREFIX) and not key_required(policy, request.META.get("REMOTE_ADDR")):
        return
    if not key:
        raise ApiError(
            401,
            "You didn't provide an API key. Give it as `Authorization: Bearer KEY`; create one "
            "with `rkmojo up --create-api-key NAME` or in the admin pages.",
            code="missing_api_key",
        )
    tries = throttle.key_subjects(request)
    try:
        await throttle.check(tries)
    except throttle.Locked as e:
        raise ApiError(429, str(e), code="too_many_wrong_keys", headers={"Retry-After": e.retry_after}) from None
    found = await ApiKey.objects.filter(digest=hash_key(key), revoked=None).afirst()
    if found is None:
        await throttle.failed(tries)
        raise ApiError(
            401, f"Incorrect API key provided: {key[:6]}…; check it or create a new one.", code="invalid_api_key"
        )
    now = timezone.now()
    if found.last_used is None or now - found.last_used > timedelta(minutes=1):
        await ApiKey.objects.filter(pk=found.pk).aupdate(last_used=now)
    return found


def check_scope(request: HttpRequest, scope: str, what: str) -> None:
    """Raise 403 naming the key's scope unless its key has `scope` (`webui.models.Scope`). A client served
    without a key (loopback under "remote", or "never") has every scope, as it had before scopes existed.
    """
    key = getattr(request, "api_key", None)
    if key is not None and not key.allows(scope):
        raise ApiError(
            403,
            f"this API key has scope {key.scope}; {what} needs an {scope} key (make one with `rkmojo up "
            f"--create-api-key NAME --scope {scope}`, or give this key that scope on the panel's API keys page)",
            code="insufficient_scope",
        )


def api_view(flavor: str, methods: tuple[str, ...] = ("POST",), *, auth: bool = True, scope: str = "chat"):
    """Decorate an async view `fn(request, body)` (body: the parsed JSON object for POST/DELETE, else {}).

    The key (`request.api_key`, None when none was needed) must have `scope`, else 403 naming it (the view's
    name says what needed it: "pull needs an admin key"). A view that needs a scope for some bodies only
    calls `check_scope` itself.
    """

    def wrap(fn):
        @csrf_exempt
        @functools.wraps(fn)
        async def view(request: HttpRequest, *args, **kwargs):
            try:
                if request.method not in methods:
                    raise ApiError(
                        405,
                        f"{request.method} is not allowed on {request.path}; use {' or '.join(methods)}",
                        headers={"Allow": ", ".join(methods)},
                    )
                request.api_key = await check_api_key(request) if auth else None
                check_scope(request, scope, fn.__name__)
                body = parse_json(request) if request.method in ("POST", "DELETE") else {}
                return await fn(request, body, *args, **kwargs)
            except ApiError as e:
                return error_response(flavor, e)
            except pydantic.ValidationError as e:
                return error_response(flavor, validation_error(e))
            except (redis.exceptions.ConnectionError, kombu.exceptions.OperationalError) as e:
                log.warning("%s %s: Redis does not answer (%s)", request.method, request.path, e)
                return error_response(
                    flavor,
                    ApiError(
                        503,
                        "the appliance's Redis does not answer (restarting?); retry in a few seconds",
                        code="redis_unavailable",
                        headers={"Retry-After": "2"},
                    ),
                )
            except Exception as e:
                if disk_full(e):
                    log.error("%s %s: the data disk is full (%s)", request.method, request.path, e)
                    return error_response(flavor, DISK_FULL)
                log.exception("%s %s failed", request.method, request.path)
                return error_response(flavor, ApiError(500, "internal error; the server log has the details"))

        return view

    return wrap


def ollama_model_name(name: str) -> str:
    """Ollama clients say `name:latest`; our models have no tags."""
    return name[: -len(":latest")] if name.endswith(":latest") else name


# --- answers -----------------------------------------------------------------------------------------
class Answer:
    """One generation's answer as its events arrive (`add`): content, reasoning, tool calls, log-probabilities.

    Tool calls come as `ToolCallDelta` pieces (the first with id and name); the final event carries them
    parsed, and `tool_calls()` prefers those.
    """

    def __init__(self):
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}  # index → {"id", "name", "arguments": [pieces of JSON text]}
        self.lps: list[dict] = []
        self.final: Final | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def thinking(self) -> str:
        return "".join(self.reasoning)

    def add(self, ev: Delta | ToolCallDelta | Final) -> None:
        if isinstance(ev, Delta):
            (self.reasoning if ev.channel == "reasoning" else self.content).append(ev.text)
        elif isinstance(ev, ToolCallDelta):
            call = self.calls.setdefault(ev.index, {"id": ev.id, "name": ev.name or "", "arguments": []})
            call["arguments"].append(ev.arguments)
        else:
            self.final = ev
        self.lps += logprob_dicts(ev) if not isinstance(ev, ToolCallDelta) else []

    def whole_call(self, index: int) -> dict | None:
        """Call `index`'s arguments once its pieces make a whole JSON object (a proper prefix never parses)."""
        text = "".join(self.calls[index]["arguments"])
        try:
            args = json.loads(text) if text.strip() else None
        except ValueError:
            return None
        return args if isinstance(args, dict) else None

    def tool_calls(self) -> list[tuple[str, str, dict]]:
        """(id, name, arguments) of each whole call, in the order the model wrote them."""
        if self.final is not None and self.final.tool_calls:
            return [(c.id, c.name, c.arguments) for c in self.final.tool_calls]
        whole = ((c, self.whole_call(i)) for i, c in sorted(self.calls.items()))
        return [(c["id"], c["name"], args) for c, args in whole if args is not None]  # a call cut short is left out


async def collect(job) -> Answer:
    """A started job's whole answer (to its final event).

    Raises:
        ApiError: the worker's error event, or a stream that ended without a final event.
    """
    answer = Answer()
    async for ev in job.events():
        if isinstance(ev, (Delta, ToolCallDelta, Final)):
            answer.add(ev)
            if isinstance(ev, Final):
                return answer
        elif isinstance(ev, Error):
            raise ApiError.from_event(ev)
    raise ApiError(500, "the worker's stream ended without a final event")


async def record(source: str, model: str, messages: list[dict], answer: Answer, key=None) -> None:
    """Store the exchange as an API chat session (`webui.sessions`), with the request's API key (`request.api_key`,
    which the panel names as the session's owner); a failure is logged, never raised."""
    from webui import sessions

    final = answer.final
    try:
        await sessions.record(
            source,
            model,
            messages,
            answer.text,
            final.usage_dict() if final else None,
            reasoning=answer.thinking,
            tool_calls=final.tool_calls or () if final else (),
            api_key=key,
        )
    except Exception:  # the answer is delivered; a full disk must not turn it into an error
        log.exception("could not record the chat session")


def event_stream(body) -> StreamingHttpResponse:
    """Server-sent events from the async iterator of text `body`, never buffered by a proxy or a cache."""
    resp = StreamingHttpResponse(body, content_type="text/event-stream")
    resp["Cache-Control"] = "no-cache"
    resp["X-Accel-Buffering"] = "no"
    return resp
