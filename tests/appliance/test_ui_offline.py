"""The pages are offline: every page, style sheet and script refers only to this server, and the vendored
libraries are exactly the files `webui/static/webui/vendor/VENDORED.md` lists (name, sha256)."""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

STATIC = Path(__file__).resolve().parents[2] / "webui" / "static" / "webui"
VENDOR = STATIC / "vendor"
URL_ATTRS = {
    "src",
    "href",
    "action",
    "formaction",
    "poster",
    "data",
    "srcset",
    "hx-get",
    "hx-post",
    "hx-put",
    "hx-delete",
    "hx-patch",
    "manifest",
    "background",
}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""")


def local(url: str) -> bool:
    """Same server: a path, a fragment, or a relative reference; never a scheme other than data: or a //host."""
    url = url.strip()
    if url.startswith("//"):
        return False
    scheme = urllib.parse.urlsplit(url).scheme
    return scheme in ("", "data", "blob", "javascript") and not (scheme == "javascript" and len(url) > 11)


class Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls, self.links, self.styles = [], [], []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in URL_ATTRS and v:
                self.urls.append((tag, k, v))
                if tag == "a" and k == "href":
                    self.links.append(v)
            if k == "style" and v:
                self.styles.append(v)
        self._in_style = tag == "style"

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def crawl(client: httpx.Client, start: list[str], limit: int = 60) -> dict[str, Refs]:
    """GET pages from `start`, following same-server links below them, as the client's user sees them."""
    seen: dict[str, Refs] = {}
    todo = list(start)
    while todo and len(seen) < limit:
        path = todo.pop(0)
        if path in seen:
            continue
        r = client.get(path)
        if r.status_code != 200 or "text/html" not in r.headers.get("content-type", ""):
            continue
        refs = Refs()
        refs.feed(r.text)
        seen[path] = refs
        for link in refs.links:
            u = urllib.parse.urlsplit(link)
            if not u.scheme and u.path.startswith("/") and not u.path.startswith(("/static/", "/logout/", "/admin/")):
                todo.append(u.path)
    return seen


def test_every_vendored_file_is_listed_with_its_sha256():
    table = (VENDOR / "VENDORED.md").read_text()
    listed = dict(re.findall(r"^\| (\S+) \|.*\| ([0-9a-f]{64}) \|$", table, re.M))
    present = {p.relative_to(VENDOR).as_posix() for p in VENDOR.rglob("*") if p.suffix in (".js", ".css", ".woff2")}
    assert present == set(listed), f"vendor/ and VENDORED.md disagree: {present ^ set(listed)}"
    for name, digest in listed.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, f"{name} differs from VENDORED.md"
    assert len(list((VENDOR / "licences").iterdir())) >= 5


def test_our_own_scripts_and_style_sheets_name_no_other_server():
    own = [p for p in STATIC.rglob("*") if p.suffix in (".js", ".css") and VENDOR not in p.parents]
    assert own, "no page scripts or style sheets found"
    for p in own:
        text = p.read_text()
        assert not re.search(r"https?://|wss?://", text), f"{p.name} names a URL with a scheme"
        for m in CSS_URL.finditer(text):
            assert local(m.group(1) or m.group(2)), f"{p.name}: {m.group(0)}"


@pytest.mark.parametrize("who", ["admin", "alice", None])
def test_every_page_refers_only_to_this_server(stack, session_cookie, who):
    headers = {"Accept": "text/html"}
    if who == "admin":
        from django.contrib.auth import get_user_model

        get_user_model().objects.update_or_create(
            username="panel-crawler", defaults={"is_staff": True, "is_superuser": True}
        )
        headers["Cookie"] = session_cookie("panel-crawler")
    elif who == "alice":
        headers["Cookie"] = session_cookie("chat-crawler")
    with httpx.Client(base_url=stack.url, headers=headers, timeout=30, follow_redirects=True) as c:
        pages = crawl(c, ["/", "/login/", "/chat/", "/panel/", "/setup/"])
    assert pages, "no page answered 200"
    for path, refs in pages.items():
        for tag, attr, url in refs.urls:
            assert local(url), f"{path}: <{tag} {attr}={url!r}> leaves this server"
        for css in refs.styles:
            for m in CSS_URL.finditer(css):
                assert local(m.group(1) or m.group(2)), f"{path}: inline style {m.group(0)}"
