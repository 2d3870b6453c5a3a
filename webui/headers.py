"""The headers every response carries beside what `SecurityMiddleware` sets: the page policy and caching.

- `Content-Security-Policy` (`POLICY`), on every response, static files included (an SVG opened on its
  own is a page too). The pages load scripts, styles, images and fonts from this server only, and
  nothing inline: no `<script>` with code, no `<style>`, no `style="…"`, no `on…=` handler in any
  template (data reaches the scripts through `data-*` attributes and `json_script`). A stored message
  that carried markup past the server's allow-list (`webui.chat.render`) would still not run.
  `connect-src` names this host's `ws:` and `wss:` (the chat and panel sockets) beside `'self'`, which
  older browsers do not stretch to WebSockets. Django's admin (5.2) keeps to the same policy: its
  scripts are files, their data in `data-*` attributes; `tests/appliance/browser/test_csp.py` opens its
  pages and the ones below with a listener for violations, so one that appears fails a test.
- `Cache-Control: no-store` (`add_never_cache_headers`) on the pages that show a secret (`NO_STORE`): a
  new API key (`/panel/keys/`), the setup token (`/setup/?token=…` fills it in), the panel's users and
  everybody's conversations. The admin's own views already send it.

htmx, where a page loads it, is configured in `base.html` (`htmx-config`) not to add a `<style>` of its
own nor to evaluate attribute code, both of which the policy would refuse.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self'",  # + ws://HOST wss://HOST (`policy`)
    "object-src": "'none'",
    "frame-ancestors": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
}
NO_STORE = ("/setup/", "/panel/")


def policy(request: HttpRequest) -> str:
    """`POLICY` as the header's text, with this request's host in `connect-src`."""
    try:
        host = request.get_host()  # validated against ALLOWED_HOSTS; a foreign one was refused already
    except DisallowedHost:  # the response is that refusal, which needs no sockets
        host = ""
    parts = {**POLICY}
    if host:
        parts["connect-src"] += f" ws://{host} wss://{host}"
    return "; ".join(f"{k} {v}" for k, v in parts.items())


def apply(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if "Content-Security-Policy" not in response:
        response["Content-Security-Policy"] = policy(request)
    if request.path.startswith(NO_STORE):
        add_never_cache_headers(response)
    return response


class PageHeadersMiddleware:
    """`apply` on every response; first after `SecurityMiddleware`, so WhiteNoise's static files get it too."""

    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        return apply(request, self.get_response(request))

    async def _acall(self, request: HttpRequest):
        return apply(request, await self.get_response(request))
