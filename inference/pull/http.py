"""HTTP for `rkmojo pull`: whole and ranged GETs under one base URL, with retries and clear errors.

Transient failures (connection errors, timeouts, 408/425/429/5xx) are retried with exponential backoff
(and `Retry-After`); a broken transfer goes on from the byte where it stopped. 401/403/404 stop at once
with an error naming the file. A bearer token goes to the endpoint's host only, never along a redirect
to another host (the hub's CDN links are signed). urllib (stdlib) suffices: one connection at a time.

Under a `PullPolicy` (`policy.py`) every connection, redirects included, goes to a checked address, a
refused one raises `PullRefused` at once (no retry), and a connection that failed, was reset, timed out
or did not speak HTTP gives up with `policy.FAILED`, one message whatever the port behind it; the reason
goes to stderr (the worker's log) only. Without a policy the give-up names the reason.

Each retry is told to `on_retry(message)` before the wait: "connection failed, retry 2 of 6 in 1.1 s"
("HTTP 503, retry …" for a status; without a policy a connection failure names its reason,
"connection refused, retry …"), so a caller can show that a pull is waiting, not stuck.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from ..errors import DiskFullError, RkmojoError, disk_full
from .policy import FAILED, PullPolicy

BLOCK = 2**20  # socket read size
CANCEL_POLL = 0.25  # seconds between two questions to `cancel`
RETRIABLE = {408, 425, 429, 500, 502, 503, 504}


class PullError(RkmojoError):
    """A pull cannot go on (HTTP error, server without Range support, changed source, …)."""


class PullCancelled(PullError):
    """The caller's `cancel()` said stop; the part downloaded so far is kept for a resume."""


class DownloadFailed(PullError):
    """A transient failure outlasted the retries; the chunks downloaded so far are kept for a resume."""


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Keeps the bearer token on redirects within the endpoint's host, drops it elsewhere (CDN links are signed)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if (
            new is not None
            and auth
            and urllib.parse.urlsplit(new.full_url).netloc == urllib.parse.urlsplit(req.full_url).netloc
        ):
            new.add_unredirected_header("Authorization", auth)
        return new


class Remote:
    """GET and ranged GET of files under one base URL, with retries.

    Args:
        base: e.g. "https://huggingface.co/Qwen/Qwen3-30B-A3B/resolve/main"; a file's URL is base/file.
        label: how errors name the source ("Qwen/Qwen3-30B-A3B@main").
        token: bearer token, sent to `base`'s host only.
        retries: attempts after the first for transient failures.
        cancel: asked between blocks (at most every `CANCEL_POLL` s); True stops with `PullCancelled`.
        policy: the addresses it may connect to (None: any).
        on_retry: called with a one-line message before each retry's wait (see the module docstring).
    """

    def __init__(
        self,
        base: str,
        label: str,
        *,
        token: str | None = None,
        retries: int = 6,
        backoff: float = 0.5,
        timeout: float = 60.0,
        cancel: Callable[[], bool] | None = None,
        policy: PullPolicy | None = None,
        on_retry: Callable[[str], None] | None = None,
    ):
        self.base = base.rstrip("/")
        self.on_retry = on_retry
        self.label = label
        self.token = token
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.policy = policy
        self.opener = policy.opener(_SameHostAuth()) if policy else urllib.request.build_opener(_SameHostAuth)
        self.cancel = cancel
        self._asked = 0.0

    def check_cancel(self) -> None:
        if self.cancel is None or time.monotonic() - self._asked < CANCEL_POLL:
            return
        self._asked = time.monotonic()
        if self.cancel():
            raise PullCancelled(f"{self.label}: cancelled; the part downloaded so far is kept, pull again to resume")

    def url(self, file: str) -> str:
        return f"{self.base}/{urllib.parse.quote(file)}" if file else self.base

    def _open(self, file: str, rng: tuple[int, int] | None):
        req = urllib.request.Request(self.url(file), headers={"User-Agent": "rkmojo", "Accept-Encoding": "identity"})
        if rng is not None:
            req.add_header("Range", f"bytes={rng[0]}-{rng[1] - 1}")
        if self.token:
            req.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return self.opener.open(req, timeout=self.timeout)

    def _fail(self, file: str, e: urllib.error.HTTPError) -> PullError:
        what = file or self.url(file)
        if e.code in (401, 403):
            hint = "set HF_TOKEN to a token with access" if not self.token else "HF_TOKEN has no access to it"
            return PullError(f"{self.label}: {what}: HTTP {e.code} (access denied); {hint}")
        if e.code == 416:
            return PullError(
                f"{self.label}: {what} is shorter than its header says (HTTP 416); the remote file "
                "is damaged or changed"
            )
        if e.code == 404:
            return PullError(
                f"{self.label}: {what} not found (HTTP 404 at {self.url(file)}); check the repository, "
                "revision and file name"
            )
        return PullError(f"{self.label}: {what}: HTTP {e.code} {e.reason}")

    def _retry(
        self, attempt: int, file: str, why: str, retry_after: str | None = None, *, connection: bool = False
    ) -> None:
        """Sleep before attempt `attempt + 1`, or give up; `connection`: the failure is below HTTP."""
        if attempt >= self.retries:
            if connection and self.policy is not None:
                print(f"rkmojo pull: {self.url(file)}: {why}; gave up after {attempt + 1} attempts", file=sys.stderr)
                raise DownloadFailed(FAILED)
            raise DownloadFailed(
                f"{self.label}{': ' + file if file else ''}: {why}; gave up after {attempt + 1} attempts, "
                "run `rkmojo pull` again to resume"
            )
        delay = min(30.0, self.backoff * 2**attempt) * (0.75 + 0.5 * random.random())
        if retry_after and retry_after.isdigit():
            delay = max(delay, min(float(retry_after), 120.0))
        print(f"rkmojo pull: {file}: {why}; retrying in {delay:.1f} s", file=sys.stderr)
        if self.on_retry is not None:
            said = "connection failed" if connection and self.policy is not None else _short(why)
            self.on_retry(f"{said}, retry {attempt + 1} of {self.retries} in {delay:.1f} s")
        self._sleep(delay)

    def _sleep(self, delay: float) -> None:
        """Wait `delay` s before a retry, asking `cancel` meanwhile: a pull waiting to retry cancels at once."""
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, CANCEL_POLL))
            self._asked = 0.0
            self.check_cancel()

    def _call(self, file: str, rng, read, *, optional: bool = False):
        """`read(response)` of a GET (ranged when `rng()` gives (start, end)), retried on transient failures."""
        attempt = 0
        while True:
            try:
                with self._open(file, rng() if rng else None) as r:
                    return read(r)
            except urllib.error.HTTPError as e:
                if e.code == 404 and optional:
                    return None
                if e.code not in RETRIABLE:
                    raise self._fail(file, e) from None
                self._retry(attempt, file, f"HTTP {e.code}", e.headers.get("Retry-After"))
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                if disk_full(e):  # local, not transient: retrying cannot help
                    raise DiskFullError(
                        f"{self.label}{': ' + file if file else ''}: the disk is full; nothing is installed "
                        "and the part downloaded so far is kept: free space, then run the same "
                        "`rkmojo pull` again to resume"
                    ) from e
                self._retry(attempt, file, _why(e), connection=True)
            attempt += 1

    def get(self, file: str, *, optional: bool = False) -> bytes | None:
        """A whole (small) file; None for a missing optional one."""
        return self._call(file, None, lambda r: r.read(), optional=optional)

    def read_range(self, file: str, start: int, end: int, sink) -> None:
        """Stream bytes [start, end) of `file` into `sink(bytes)`; a broken transfer goes on where it stopped.

        Raises:
            PullError: the server ignores Range requests, or a non-transient HTTP error.
        """
        pos = start

        def read(r):
            nonlocal pos
            _check_partial(r, self.url(file), pos, end)
            while pos < end:
                block = r.read(min(BLOCK, end - pos))
                if not block:
                    raise http.client.IncompleteRead(b"", end - pos)
                sink(block)
                pos += len(block)
                self.check_cancel()

        if start < end:
            self._call(file, lambda: (pos, end), read)

    def size(self, file: str) -> tuple[int, str | None]:
        """(size in bytes, ETag) of a file, from a one-byte Range request (which also proves Range support)."""

        def read(r):
            _check_partial(r, self.url(file), 0, 1)
            total = r.headers.get("Content-Range", "").rpartition("/")[2]
            if not total.isdigit():
                raise PullError(
                    f"{self.url(file)}: no total size in Content-Range; the server's Range support is incomplete"
                )
            return int(total), r.headers.get("ETag")

        return self._call(file, lambda: (0, 1), read)


def _short(why: str) -> str:
    """A failure's reason in a few words for a progress line: "connection refused", "timed out", "HTTP 503"."""
    low = why.lower()
    for words in ("connection refused", "connection reset", "name or service not known", "timed out"):
        if words in low:
            return words
    return why.split(": ", 1)[-1] if why.startswith(("URLError", "OSError")) else why


def _why(e: Exception) -> str:
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, Exception) else e
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    return f"{type(e).__name__}: {e}".rstrip(": ")


def _check_partial(r, url: str, start: int, end: int) -> None:
    if r.status == 200:
        raise PullError(
            f"{url}: the server ignored the Range request (HTTP 200, whole file) — `rkmojo pull` "
            "needs HTTP Range support; use another server, or download the files and run `rkmojo convert`"
        )
    m = re.match(r"bytes (\d+)-(\d+)/", r.headers.get("Content-Range", ""))
    if r.status != 206 or not m or int(m.group(1)) != start:
        raise PullError(
            f"{url}: unexpected answer to a Range request for bytes {start}-{end - 1} "
            f"(HTTP {r.status}, Content-Range {r.headers.get('Content-Range')!r})"
        )
