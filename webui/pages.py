"""The browser's way in: `/` for people and for Ollama's probe, sign-in and sign-out.

`GET /` with a browser's `Accept: text/html` goes to the chat page, or to `/login/` without a session
(unless `RKMOJO_CHAT_OPEN` lets the LAN chat without signing in); anything else, such as an Ollama client's probe, gets the plain text it checks for.
Sign-in is Django's own (`LoginView`, CSRF on the form, a session cookie), its tries throttled
(`webui.throttle`); there is no default account.
"""

from __future__ import annotations

from django.contrib.auth import views as auth
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_GET

from . import config, throttle

OLLAMA_PROBE = "Ollama is running (rkmojo)"


def wants_html(request: HttpRequest) -> bool:
    return "text/html" in request.headers.get("Accept", "")


@require_GET
def root(request: HttpRequest) -> HttpResponse:
    if wants_html(request):
        if request.user.is_authenticated or config.current()["chat_open"]:
            return HttpResponseRedirect("/chat/")
        return HttpResponseRedirect("/login/?next=/chat/")
    return HttpResponse(OLLAMA_PROBE, content_type="text/plain")


login = throttle.sign_in(  # tries counted per address and user name; locked: 429 saying when to retry
    auth.LoginView.as_view(
        template_name="webui/registration/login.html",
        authentication_form=throttle.SignInForm,
        redirect_authenticated_user=True,
    )
)
logout = auth.LogoutView.as_view()  # POST only (Django 5): a link or an <img> elsewhere cannot sign anyone out
