"""Who may use the admin panel: staff. A visitor without a session goes to the login page, a signed-in user
who is not staff gets 403. The same rule guards the panel's WebSockets (`staff_scope`)."""

from __future__ import annotations

import functools
from inspect import iscoroutinefunction

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied


def _check(request, user):
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not (user.is_active and user.is_staff):
        raise PermissionDenied("the admin panel is for staff; ask an administrator")
    return None


def staff_only(view):
    """Decorate a panel view, sync or async."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_view(request, *args, **kwargs):
            return _check(request, await request.auser()) or await view(request, *args, **kwargs)

        return async_view

    @functools.wraps(view)
    def sync_view(request, *args, **kwargs):
        return _check(request, request.user) or view(request, *args, **kwargs)

    return sync_view


def staff_scope(scope: dict) -> bool:
    """A WebSocket's session is a staff user's (Channels' auth middleware put the user in the scope)."""
    user = scope.get("user")
    return user is not None and user.is_authenticated and user.is_active and user.is_staff
