"""API keys (create with a scope: the key shown once; list with last use; change the scope; revoke) and users
(create, disable, reset password; see and lift sign-in and API-key lockouts).

A new key or password is shown on the page that answers the POST, never stored in plain text nor put in a
URL or a message cookie. Staff cannot disable themselves (the panel would lock its last administrator out).
Passwords pass Django's validators (`AUTH_PASSWORD_VALIDATORS`: the forms below run them), whose messages
the page shows. Failures and locks are `webui.throttle`'s, kept in Redis.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import SetPasswordForm, UserCreationForm
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from .. import throttle
from ..models import ApiKey, Scope
from .access import staff_only


@staff_only
def keys(request):
    new_key = error = None
    if request.method == "POST":
        name = request.POST.get("name", "").strip()
        scope = request.POST.get("scope", Scope.CHAT)
        if not name or len(name) > 100:
            error = "Give the key a name (up to 100 characters), e.g. the app or person using it."
        elif scope not in Scope.values:
            error = f"Choose the key's scope: {' or '.join(Scope.values)}."
        else:
            _, new_key = ApiKey.create(name, scope)
    return render(
        request,
        "webui/panel/keys.html",
        {
            "section": "panel",
            "tab": "keys",
            "keys": ApiKey.objects.all(),
            "scopes": Scope.values,
            "new_key": new_key,
            "error": error,
        },
        status=400 if error else 200,
    )


@staff_only
@require_POST
def set_key_scope(request, pk: int):
    """Give a key another scope (`webui.models.Scope`); it applies from the key's next request."""
    key = get_object_or_404(ApiKey, pk=pk, revoked=None)
    scope = request.POST.get("scope", "")
    if scope not in Scope.values:
        messages.error(request, f"Scope {scope!r}: choose {' or '.join(Scope.values)}.")
    else:
        key.scope = scope
        key.save(update_fields=["scope"])
        messages.success(request, f"The key {key.name} ({key.prefix}…) now has scope {scope}.")
    return redirect("/panel/keys/")


@staff_only
@require_POST
def revoke_key(request, pk: int):
    key = get_object_or_404(ApiKey, pk=pk, revoked=None)
    key.revoked = timezone.now()
    key.save(update_fields=["revoked"])
    messages.success(request, f"Revoked the key {key.name} ({key.prefix}…).")
    return redirect("/panel/keys/")


class NewUserForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["username"].widget.attrs.pop("autofocus", None)  # the form sits below the list


@staff_only
def users(request):
    form = NewUserForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save(commit=False)
        user.is_staff = request.POST.get("is_staff") == "on"
        user.save()
        messages.success(request, f"Created {user.username}.")
        return redirect("/panel/users/")
    return render(
        request,
        "webui/panel/users.html",
        {
            "section": "panel",
            "tab": "users",
            "form": form,
            "users": get_user_model().objects.order_by("username"),
            "failures": throttle.counts(),
            "limits": throttle.limits(),
        },
        status=400 if form.errors else 200,
    )


@staff_only
@require_POST
def clear_lock(request):
    """Forget the failures of one address or user name (`subject`: `signin:user:NAME`, …), lifting its lock."""
    try:
        subject = throttle.Subject.parse(request.POST.get("subject", ""))
    except ValueError as e:
        messages.error(request, str(e))
    else:
        throttle.clear(subject)
        messages.success(request, f"Cleared the failed {subject.describe()}.")
    return redirect("/panel/users/")


@staff_only
@require_POST
def set_active(request, pk: int):
    user = get_object_or_404(get_user_model(), pk=pk)
    active = request.POST.get("active") == "1"
    if user.pk == request.user.pk and not active:
        messages.error(request, "You cannot disable your own account.")
    else:
        user.is_active = active
        user.save(update_fields=["is_active"])
        messages.success(request, f"{'Enabled' if active else 'Disabled'} {user.username}.")
    return redirect("/panel/users/")


@staff_only
def password(request, pk: int):
    user = get_object_or_404(get_user_model(), pk=pk)
    form = SetPasswordForm(user, request.POST or None)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, f"Set a new password for {user.username}.")
        return redirect("/panel/users/")
    return render(
        request,
        "webui/panel/password.html",
        {"section": "panel", "tab": "users", "form": form, "target": user},
        status=400 if form.errors else 200,
    )
