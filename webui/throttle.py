"""Guessing, throttled: wrong passwords, setup tokens and API keys counted in Redis, per address and per user name.

Our own module rather than django-axes: the web processes already share Redis (`appliance.bus`), where
a counter with an expiry is the whole mechanism and outlives a restart of daphne. Axes would bring its
own database tables, middleware and authentication backend (or a cache backend this project does not
configure), and still leave the API keys, the setup token and a 429 for the locked to be written here.

The rules (the numbers are settings: `RKMOJO_LOGIN_FAILURES`, `RKMOJO_API_KEY_FAILURES`, `RKMOJO_LOCKOUT`):
- Sign-in (`/login/`, `/admin/login/`): each try counts against the client's address and the user name
  given, before the password is checked, and is forgiven if it was right. Counting first means a burst
  of parallel guesses cannot all slip in while the slow password hash of the first is computed.
  `/setup/` counts its tries against the address only: its secret is the board's token, not an account's
  password, and the user name there is the one being made.
- An address or user name with `LOGIN_FAILURES` failures is locked for `LOCKOUT` from the failure that
  reached the limit: every try is refused, the right password too, with a 429, `Retry-After`, and a
  message saying when to retry. A refused try is not counted, so a lock does not grow.
- API keys (`/v1/…`, `/api/…`): a wrong `Authorization: Bearer` key counts against the address; at
  `API_KEY_FAILURES` every key from there is a 429 until the lock ends, the right one too. A key's try is
  checked against the lock but counted only once found wrong: a burst of right keys from one busy client
  must not lock it (and nobody guesses 32 random bytes in a burst).
- Failures are forgotten `LOCKOUT` after the first of them. An administrator sees the counts and clears
  a lock on the panel's Users page (`counts`, `clear`).
- The address is the client's (REMOTE_ADDR: daphne takes no forwarded headers); an IPv6 client counts per
  /64, the block one host can give itself new addresses from.

Keys (under `rkmojo:`, beside `appliance.bus`'s), each an integer count of failures whose TTL is the time
left (of the window, or of the lock once the count reaches the limit):
- `throttle:signin:address:ADDRESS` and `throttle:signin:user:NAME` (the name casefolded);
- `throttle:key:address:ADDRESS`.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import math
from dataclasses import dataclass
from typing import Callable, Literal

import redis.exceptions
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from appliance import bus

THROTTLE = f"{bus.PREFIX}throttle:"

# KEYS: the counters of one try's subjects; ARGV: limit, lockout (ms), 1 to count this try (0: only look).
# Returns {ms left of the longest lock among them, its key's index from 1}, or {0, 0} when none is locked.
_TRY = """
local limit, lockout = tonumber(ARGV[1]), tonumber(ARGV[2])
local wait, which = 0, 0
for i, k in ipairs(KEYS) do
  if tonumber(redis.call('GET', k) or '0') >= limit then
    local left = redis.call('PTTL', k)
    if left < 0 then redis.call('PEXPIRE', k, lockout); left = lockout end
    if left > wait then wait, which = left, i end
  end
end
if wait > 0 or ARGV[3] ~= '1' then return {wait, which} end
for _, k in ipairs(KEYS) do
  local n = redis.call('INCR', k)
  if n == 1 or n == limit then redis.call('PEXPIRE', k, lockout) end
end
return {0, 0}
"""
_FORGIVE = """
for _, k in ipairs(KEYS) do
  local n = tonumber(redis.call('GET', k) or '0')
  if n > 1 then redis.call('DECR', k) elseif n == 1 then redis.call('DEL', k) end
end
"""


@dataclass(frozen=True)
class Rule:
    kind: Literal["signin", "key"]  # the first part of its Redis keys
    setting: str  # the RKMOJO setting that holds its limit
    what: str  # a lock's message: "too many {what}"

    @property
    def limit(self) -> int:
        return settings.RKMOJO[self.setting]


SIGNIN = Rule("signin", "LOGIN_FAILURES", "failed sign-ins")
API_KEY = Rule("key", "API_KEY_FAILURES", "wrong API keys")
RULES = {r.kind: r for r in (SIGNIN, API_KEY)}


@dataclass(frozen=True)
class Subject:
    """What failures count against: an address, or a user name, under one rule."""

    rule: Rule
    field: Literal["address", "user"]
    value: str

    @property
    def name(self) -> str:
        """`signin:user:admin`: the key without its prefix, as the panel's clear button posts it."""
        return f"{self.rule.kind}:{self.field}:{self.value}"

    @property
    def key(self) -> str:
        return THROTTLE + self.name

    @classmethod
    def parse(cls, name: str) -> Subject:
        """The subject a `name` spells. Raises: ValueError, for anything else."""
        kind, field, value = (name.split(":", 2) + ["", ""])[:3]
        if kind not in RULES or field not in ("address", "user") or not value:
            raise ValueError(f"{name!r} is not a throttle subject (signin:address:…, signin:user:…, key:address:…)")
        return cls(RULES[kind], field, value)

    def describe(self) -> str:
        if self.field == "user":
            return f"sign-ins as {self.value}"
        return f"{'sign-ins' if self.rule is SIGNIN else 'API keys'} from {self.value}"


class Locked(Exception):
    """A try refused: `subject` is locked for `seconds` more."""

    def __init__(self, subject: Subject, seconds: float):
        self.subject, self.seconds = subject, seconds
        whom = "for this user name" if subject.field == "user" else "from this address"
        super().__init__(
            f"Too many {subject.rule.what} {whom}; try again in {in_words(seconds)}. "
            "An administrator can lift the lock on the panel's Users page."
        )

    @property
    def retry_after(self) -> str:
        return str(math.ceil(self.seconds))


def in_words(seconds: float) -> str:
    s = max(1, math.ceil(seconds))
    return f"{s} second{'s' * (s != 1)}" if s < 90 else f"{math.ceil(s / 60)} minutes"


def client_address(request) -> str:
    raw = (request.META.get("REMOTE_ADDR") or "").split("%")[0]
    try:
        ip = ipaddress.ip_address(raw)
    except ValueError:
        return raw or "unknown"
    if ip.version == 6 and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    if ip.version == 6 and not ip.is_loopback:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def signin_subjects(request, username: str | None) -> list[Subject]:
    """The address, and the user name when one is given (`/setup/` gives none)."""
    subjects = [Subject(SIGNIN, "address", client_address(request))]
    if username:
        subjects.append(Subject(SIGNIN, "user", username.casefold()[:150]))
    return subjects


def key_subjects(request) -> list[Subject]:
    return [Subject(API_KEY, "address", client_address(request))]


# --- counting: sync for the sign-in forms and the panel, async for the API ---------------------------
_REDIS: list = []
_AREDIS: dict = {}


def _redis():
    if not _REDIS:
        _REDIS.append(bus.connect(settings.REDIS_URL))
    return _REDIS[0]


def _aredis():
    """The running loop's async client, as `webui.api.jobs.redis` (which imports the API code that imports this)."""
    loop = asyncio.get_running_loop()
    if loop not in _AREDIS:
        _AREDIS.clear()  # a new loop (tests, reloads): the old client belongs to a closed loop
        _AREDIS[loop] = bus.connect_async(settings.REDIS_URL)
    return _AREDIS[loop]


def _try_args(subjects: list[Subject], count: bool) -> tuple:
    rule = subjects[0].rule
    assert all(s.rule is rule for s in subjects), "one try, one rule"
    lockout_ms = int(settings.RKMOJO["LOCKOUT"] * 1000)
    return (_TRY, len(subjects), *(s.key for s in subjects), rule.limit, lockout_ms, int(count))


def _settle(subjects: list[Subject], reply: list) -> None:
    wait_ms, which = (int(v) for v in reply)
    if wait_ms > 0:
        raise Locked(subjects[which - 1], wait_ms / 1000)


RedisUnavailable = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def attempt(subjects: list[Subject]) -> None:
    """Count a try before it is checked; `forgive` it if it was right. Raises: Locked, counting nothing."""
    _settle(subjects, _redis().eval(*_try_args(subjects, True)))


def forgive(subjects: list[Subject]) -> None:
    _redis().eval(_FORGIVE, len(subjects), *(s.key for s in subjects))


async def check(subjects: list[Subject]) -> None:
    """Raises: Locked, while any subject is."""
    _settle(subjects, await _aredis().eval(*_try_args(subjects, False)))


async def failed(subjects: list[Subject]) -> None:
    """Count a wrong try (one `check` let through)."""
    await _aredis().eval(*_try_args(subjects, True))


# --- the panel -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Count:
    subject: Subject
    failures: int
    seconds: float  # left: of the lock, or until the failures are forgotten

    @property
    def locked(self) -> bool:
        return self.failures >= self.subject.rule.limit

    @property
    def left(self) -> str:
        return in_words(self.seconds)


def limits() -> dict:
    """The rules as the panel states them."""
    return {"signin": SIGNIN.limit, "key": API_KEY.limit, "lockout": in_words(settings.RKMOJO["LOCKOUT"])}


def counts() -> list[Count]:
    """Every address and user name with failures on record, locked ones first."""
    r = _redis()
    out = []
    for key in r.scan_iter(match=THROTTLE + "*", count=200):
        try:
            subject = Subject.parse(key[len(THROTTLE) :])
        except ValueError:
            continue
        n, ttl = r.get(key), r.pttl(key)
        if n and int(n) > 0 and ttl > 0:
            out.append(Count(subject, int(n), ttl / 1000))
    return sorted(out, key=lambda c: (not c.locked, c.subject.name))


def clear(subject: Subject) -> bool:
    """Forget a subject's failures (lifting its lock); whether there were any."""
    return bool(_redis().delete(subject.key))


# --- the sign-in forms ---------------------------------------------------------------------------------
REDIS_DOWN = "The appliance's Redis does not answer (restarting?); retry in a few seconds."


def _throttled(form: AuthenticationForm, check: Callable[[], dict]) -> dict:
    """`form.clean()` with the try counted first (`check`: the form's own clean, which authenticates)."""
    username, password = form.cleaned_data.get("username"), form.cleaned_data.get("password")
    if not username or not password:
        return check()  # a field is missing: no password is checked, so nothing counts
    subjects = signin_subjects(form.request, username)
    try:
        attempt(subjects)
    except Locked as e:
        form.locked = e
        raise ValidationError(str(e), code="locked") from None
    except RedisUnavailable:
        raise ValidationError(REDIS_DOWN, code="redis_unavailable") from None
    cleaned = check()  # a wrong password raises here, and its try stays counted
    forgive(subjects)
    return cleaned


class SignInForm(AuthenticationForm):
    """/login/'s form."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That user name and password do not match an active account.",
    }
    locked: Locked | None = None

    def clean(self):
        return _throttled(self, super().clean)


class AdminSignInForm(AdminAuthenticationForm):
    """/admin/login/'s form (`admin.site.login_form`)."""

    locked: Locked | None = None

    def clean(self):
        return _throttled(self, super().clean)


def sign_in(view):
    """A sign-in view (`LoginView`, the admin's login) whose form refused a locked try: 429 and `Retry-After`."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        form = (getattr(response, "context_data", None) or {}).get("form")
        locked = getattr(form, "locked", None)
        if locked is not None:
            response.status_code = 429
            response["Retry-After"] = locked.retry_after
        return response

    return wrapped
