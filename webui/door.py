"""The LAN door: what every request passes before a view runs. The LAN is hostile: every way in is
authenticated or deliberately public (`docs/appliance.md`, "What the door refuses").

Two layers, outermost first:
- `BodyLimit` (ASGI, around Django): a body over `RKMOJO_MAX_REQUEST_BYTES` is answered 413 from its
  Content-Length header, before Django reads it; a chunked body is read only up to the limit.
  (daphne itself buffers a body before it calls the application; `appliance.serve` stops that at the
  header too.) A page's form (`TOO_LARGE_PAGES`: the chat's import) is sent back to its page instead,
  303, which says so where the page shows its errors.
- `LanDoorMiddleware` (Django, after SecurityMiddleware):
  - a present `Origin` that is not one of this machine's names (`ALLOWED_HOSTS`, `appliance.hosts`) →
    403, on every path: a page of another site, or a DNS-rebinding page, gets nothing;
  - the JSON endpoints (`/v1/…`, `/api/…`) take bodies as `Content-Type: application/json` only → 415:
    the content types a browser may send cross-origin without asking (text/plain, forms) never run;
  - a JSON body is parsed once here: invalid JSON, nesting deeper than `MAX_DEPTH` and strings that are
    not text (lone UTF-16 surrogates such as "\\ud800") → 400 naming the field. The view reads
    `request.json_body`.
Errors use the OpenAI error format under /v1/ and Ollama's elsewhere (`webui.api.common`). A view
that fails on a full disk (SQLite's "database or disk is full", ENOSPC) is answered 507 saying so.
"""

from __future__ import annotations

import json
import urllib.parse

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.http.request import validate_host

from inference.errors import disk_full

from .api.common import DISK_FULL, ApiError, error_response

MAX_DEPTH = 64  # objects and arrays inside each other; no API body needs more than ~6
JSON_PATHS = ("/v1/", "/api/")
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def flavor(path: str) -> str:
    return "openai" if path.startswith("/v1/") else "ollama"


# --- JSON bodies -------------------------------------------------------------------------------------
def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _not_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # only lone surrogates fail: json.loads makes them from "\ud800" escapes
        return True
    return False


def check_shape(value, limit: int = MAX_DEPTH) -> None:
    """Raise a 400 naming the first field nested deeper than `limit` or holding a string that is not text."""
    todo = [(value, "", 0)]
    while todo:
        v, path, depth = todo.pop()
        if isinstance(v, str):
            if _not_text(v):
                raise ApiError(
                    400,
                    f"{path or 'the body'} holds a lone surrogate escape (\\ud800–\\udfff), "
                    "which is not text; send UTF-8 text",
                    param=path or None,
                    code="invalid_string",
                )
        elif isinstance(v, (dict, list)):
            if depth >= limit:
                raise _too_deep(path, limit)
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str) and _not_text(k):
                    raise ApiError(
                        400,
                        f"a key in {path or 'the body'} holds a lone surrogate escape, which is not text",
                        param=path or None,
                        code="invalid_string",
                    )
                todo.append((x, _join(path, k), depth + 1))


def _too_deep(path: str, limit: int) -> ApiError:
    return ApiError(
        400,
        f"{path or 'the body'} nests objects and arrays deeper than {limit} levels",
        param=path or None,
        code="too_deep",
    )


def _deep_path(text: str, limit: int) -> str:
    """The field at which `text` (JSON that broke the parser's recursion) first nests past `limit`."""
    stack: list = []  # one [key] per open container: the key or index being filled
    i, n, key = 0, len(text), None
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            key = text[i + 1 : j]
            i = j
        elif c in "{[":
            if len(stack) >= limit:
                break
            if stack and isinstance(stack[-1][0], str) and key is not None:
                stack[-1][0] = key
            stack.append([0 if c == "[" else "", c])
        elif c in "}]" and stack:
            stack.pop()
        elif c == "," and stack and stack[-1][1] == "[":
            stack[-1][0] += 1
        i += 1
    path = ""
    for k, _ in stack:
        path = _join(path, k)
    return path


def load_json(raw: bytes | str, limit: int = MAX_DEPTH):
    """Parse a request body and check its shape (`check_shape`).

    Raises:
        ApiError 400: not JSON, too deep, or a string that is not text, naming the field.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        raise _too_deep(_deep_path(text, limit), limit) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
    check_shape(value, limit)
    return value


# --- origins -----------------------------------------------------------------------------------------
def origin_allowed(origin: str) -> bool:
    """Whether a browser's Origin header names this machine (any port: the service may sit behind a proxy)."""
    u = urllib.parse.urlsplit(origin)
    if u.scheme not in ("http", "https") or not u.hostname:
        return False  # "null" (sandboxed frames, file: pages) included
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return validate_host(host, settings.ALLOWED_HOSTS)


class LanDoorMiddleware:
    async_capable = True
    sync_capable = False

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest):
        origin = request.headers.get("Origin")
        api = request.path.startswith(JSON_PATHS)
        try:
            if origin is not None and not origin_allowed(origin):
                if not api:
                    return HttpResponseForbidden(f"Origin {origin} is not this appliance\n", content_type="text/plain")
                raise ApiError(
                    403,
                    f"Origin {origin!r} is not one of this appliance's names; requests from "
                    "other sites' pages are refused",
                    code="origin_refused",
                )
            if api and request.method in BODY_METHODS:
                if request.content_type != "application/json":
                    raise ApiError(
                        415,
                        f"send the body as JSON with `Content-Type: application/json` (got "
                        f"{request.content_type or 'none'!r})",
                        code="unsupported_media_type",
                    )
                request.json_body = load_json(request.body or b"null")
        except ApiError as e:
            return error_response(flavor(request.path), e)
        return await self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception):
        """A page (setup, admin) that hit a full disk: a 507 saying so instead of a bare 500."""
        if not disk_full(exception):
            return None
        if request.path.startswith(JSON_PATHS):
            return error_response(flavor(request.path), DISK_FULL)
        return HttpResponse(str(DISK_FULL) + "\n", status=507, content_type="text/plain")


# --- body size (ASGI) --------------------------------------------------------------------------------
# a form whose file may be too large → the page that shows why (the view reads `?refused=too-large`)
TOO_LARGE_PAGES = {"/chat/import/": "/chat/?refused=too-large"}


def too_large_response(path: str, limit: int) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The answer to a body over `limit`: (status, headers, body); `Connection: close` is the caller's."""
    if path in TOO_LARGE_PAGES:
        return 303, [(b"location", TOO_LARGE_PAGES[path].encode()), (b"content-length", b"0")], b""
    e = ApiError(
        413,
        f"the request body is larger than {limit} bytes, the most this server takes (RKMOJO_MAX_REQUEST_BYTES)",
        code="request_too_large",
    )
    body = error_response(flavor(path), e).content
    return 413, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, decided from Content-Length before reading it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.limit:
                return await self._refuse(scope, send)
            return await self.app(scope, receive, send)
        # no length (chunked): read up to the limit, then hand the messages on
        held, size = [], 0
        while True:
            msg = await receive()
            held.append(msg)
            if msg["type"] != "http.request":
                break
            size += len(msg.get("body", b""))
            if size > self.limit:
                return await self._refuse(scope, send)
            if not msg.get("more_body"):
                break

        async def replay():
            return held.pop(0) if held else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, scope, send):
        status, headers, body = too_large_response(scope.get("path", ""), self.limit)
        await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
