"""The first administrator, created once through `/setup/` with the board's one-time setup token.

A flashed board has no account and no password. At first boot `rkmojo-firstboot` (provisioning's
firstboot role) writes a random token to the file `RKMOJO_SETUP_TOKEN_FILE` names and shows it on the
console. Whoever holds it opens `/setup/`, gives it with a user name and a password, and gets a
superuser for the admin pages. The page then closes for good: it answers 410 once any superuser exists
(however it was made) or `DATA_DIR/setup-done` is there, which it writes so that the next boot
removes the token file and stops showing it; the page stays a 410 after that. On a PC, `rkmojo up`
writes the token into the data directory and prints the setup URL (`manage.py setuptoken`) while no
administrator exists; `/setup/?token=…` fills it in. Without a token file the page is a 404.

The password must pass Django's validators (`AUTH_PASSWORD_VALIDATORS`), whose messages the page shows.
Wrong tokens count against the client's address and lock it as wrong passwords do (`webui.throttle`).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.contrib.auth.forms import UserCreationForm
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from . import throttle

DONE_MARKER = "setup-done"


class SetupForm(UserCreationForm):
    token = forms.CharField(
        label="Setup token",
        strip=True,
        help_text="as the board's console showed it",
        widget=forms.TextInput(attrs={"autocomplete": "off", "autofocus": True}),
    )
    field_order = ["token", "username", "password1", "password2"]


def _token() -> str | None:
    """The setup token from its file; None when setup by token is off or the file is gone."""
    name = settings.RKMOJO["SETUP_TOKEN_FILE"]
    if not name:
        return None
    try:
        token = Path(name).read_text().strip()
    except FileNotFoundError:
        return None
    return token or None


def closed() -> bool:
    """Setup is over once a superuser exists; the marker tells rkmojo-firstboot to drop the token."""
    marker = settings.DATA_DIR / DONE_MARKER
    if get_user_model().objects.filter(is_superuser=True).exists():
        marker.touch(exist_ok=True)
        return True
    return marker.exists()


def _page(request: HttpRequest, form: SetupForm, status: int = 200) -> HttpResponse:
    return render(request, "webui/setup.html", {"form": form}, status=status)


@require_http_methods(["GET", "POST"])
def setup(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: with the right token, create the superuser, sign them in and go to the panel."""
    if not settings.RKMOJO["SETUP_TOKEN_FILE"]:
        raise Http404(
            "this appliance has no setup page; create an administrator with "
            "`python -m django createsuperuser` (settings: appliance.settings)"
        )
    if closed():  # also once the next boot has removed the spent token
        return render(request, "webui/setup.html", {"closed": True}, status=410)
    token = _token()
    if token is None:
        raise Http404(
            "this appliance has no setup token; `rkmojo up` prints the setup URL with a new one "
            "while no administrator exists"
        )
    if request.method == "GET":
        return _page(request, SetupForm(initial={"token": request.GET.get("token", "")}))
    form = SetupForm(request.POST)
    tries = throttle.signin_subjects(request, None)  # the address: the token is the secret here, not an account
    try:
        throttle.attempt(tries)
    except throttle.Locked as e:
        page = render(request, "webui/setup.html", {"form": SetupForm(), "locked": str(e)}, status=429)
        page["Retry-After"] = e.retry_after
        return page
    except throttle.RedisUnavailable:  # tries could not be counted: refuse rather than let guesses through
        return render(request, "webui/setup.html", {"form": form, "locked": throttle.REDIS_DOWN}, status=503)
    if not secrets.compare_digest(request.POST.get("token", "").strip().encode(), token.encode()):
        form.add_error("token", "This is not the setup token shown on the board's console.")
        return _page(request, form, 403)  # the try stays counted
    throttle.forgive(tries)
    if not form.is_valid():  # Django's password validators (settings.AUTH_PASSWORD_VALIDATORS) say what is wrong
        return _page(request, form, 400)
    with transaction.atomic():  # an IMMEDIATE transaction on SQLite: one of two racing requests wins
        if closed():
            return render(request, "webui/setup.html", {"closed": True}, status=410)
        user = form.save(commit=False)
        user.is_staff = user.is_superuser = True
        user.save()
    (settings.DATA_DIR / DONE_MARKER).touch(exist_ok=True)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")  # signed in: on to the panel
    return redirect("/panel/")
