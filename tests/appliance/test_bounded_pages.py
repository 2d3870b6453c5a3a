"""A long conversation costs what a short one does: its page shows the newest messages with "Load earlier
messages" (htmx, or a plain link), exports stream, and an import is refused past its limits, naming them."""

import json
import re

import httpx
import pytest
from asgiref.sync import async_to_sync

LAST = 100  # webui.chat.conversations.LAST


@pytest.fixture
def people(django_for_stack):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    ann, _ = User.objects.get_or_create(username="bounded-ann")
    staff, _ = User.objects.update_or_create(username="bounded-staff", defaults={"is_staff": True})
    return {"ann": ann, "staff": staff}


def client_of(user):
    from django.test import Client

    c = Client(HTTP_HOST="127.0.0.1")
    c.force_login(user)
    return c


def long_conversation(owner, n: int, title="long"):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=owner, source="web", model="smollm2", title=title)
    ChatMessage.objects.bulk_create(
        [
            ChatMessage(session=s, index=i, role=("user", "assistant")[i % 2], content=f"message number {i}")
            for i in range(n)
        ],
        batch_size=2000,
    )
    return s


def shown(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<li class="msg [a-z]+" id="m(\d+)"', html)]


def test_a_long_conversation_shows_its_newest_messages_and_a_link_to_the_ones_before(people):
    s = long_conversation(people["ann"], 250)
    r = client_of(people["ann"]).get(f"/chat/{s.pk}/")
    page = r.content.decode()
    from webui.chat import conversations

    assert conversations.LAST == LAST and shown(page) == list(range(150, 250))
    assert '<a href="?before=150" hx-get="?before=150" hx-target="closest li" hx-swap="outerHTML">' in page
    assert "htmx-2.0.4.min.js" in page and "Newest messages" not in page
    assert "HX-Request" in r["Vary"]


def test_load_earlier_answers_the_messages_before_alone_until_the_first(people):
    s = long_conversation(people["ann"], 250)
    ann = client_of(people["ann"])
    part = ann.get(f"/chat/{s.pk}/?before=150", headers={"HX-Request": "true"}).content.decode()
    assert shown(part) == list(range(50, 150)) and "<html" not in part and 'href="?before=50"' in part
    assert 'name="csrfmiddlewaretoken"' in part  # its messages' edit forms post like the others
    first = ann.get(f"/chat/{s.pk}/?before=50", headers={"HX-Request": "true"}).content.decode()
    assert shown(first) == list(range(50)) and "Load earlier" not in first


def test_without_javascript_the_link_is_a_page_of_its_own(people):
    from webui.models import ChatMessage

    s = long_conversation(people["ann"], 250)
    ChatMessage.objects.filter(session=s, index=249).update(prompt_tokens=40, completion_tokens=2)
    page = client_of(people["ann"]).get(f"/chat/{s.pk}/?before=150").content.decode()
    assert shown(page) == list(range(50, 150)) and 'href="?before=50"' in page
    assert f'<a href="/chat/{s.pk}/">Newest messages</a>' in page and 'id="composer"' in page
    assert 'id="gauge-text">42 / ' in page  # the context used is the conversation's, not this window's
    for odd in ("x", "-5", "9" * 40):  # not a number, below the first, past any index
        assert client_of(people["ann"]).get(f"/chat/{s.pk}/?before={odd}").status_code == 200, odd


def test_the_panels_transcript_is_bounded_the_same_way(people):
    s = long_conversation(people["ann"], 250)
    staff = client_of(people["staff"])
    page = staff.get(f"/panel/sessions/{s.pk}/").content.decode()
    assert page.count('<li class="msg msg-') == LAST and "message number 249" in page
    assert "message number 149<" not in page and 'hx-get="?before=150"' in page
    part = staff.get(f"/panel/sessions/{s.pk}/?before=150", headers={"HX-Request": "true"}).content.decode()
    assert part.count('<li class="msg msg-') == LAST and "message number 50<" in part and "<html" not in part


def pieces(user, path: str) -> list[bytes]:
    """What an export streams, piece by piece."""

    async def read(content):
        return [chunk async for chunk in content]

    r = client_of(user).get(path)
    assert r.status_code == 200 and r.streaming and r.is_async, path  # async: Django under ASGI streams it
    return async_to_sync(read)(r.streaming_content)


def test_exports_stream_in_pieces_and_read_back(people):
    s = long_conversation(people["ann"], 5000, title="streamed")
    chunks = pieces(people["ann"], f"/chat/{s.pk}/export/")
    assert len(chunks) > 3 and max(map(len, chunks)) < 80 * 1024  # ~64 KiB at a time, never the whole
    data = json.loads(b"".join(chunks))
    msgs = data["conversations"][0]["messages"]
    assert data["format"] == "rkmojo-chat" and data["conversations"][0]["title"] == "streamed"
    assert len(msgs) == 5000 and msgs[4999]["content"] == "message number 4999"
    md = pieces(people["ann"], f"/chat/{s.pk}/export/?format=md")
    assert len(md) > 1 and b"".join(md).decode().count("\n## ") == 5000
    everything = pieces(people["ann"], "/chat/export/")
    assert len(everything) > 3 and any(
        c["title"] == "streamed" for c in json.loads(b"".join(everything))["conversations"]
    )


def _import(user, data) -> str:
    from django.core.files.uploadedfile import SimpleUploadedFile

    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    r = client_of(user).post("/chat/import/", {"file": SimpleUploadedFile("c.json", raw)})
    assert r.status_code == 400, r.status_code
    return r.content.decode()


def export_of(*sizes: int) -> dict:
    msg = {"role": "user", "content": "x"}
    return {"conversations": [{"model": "smollm2", "messages": [msg] * n} for n in sizes]}


def test_an_import_over_a_limit_is_refused_naming_the_limit_and_the_fix(people):
    from webui.models import ChatSession

    ann = people["ann"]
    before = ChatSession.objects.filter(owner=ann).count()
    page = _import(ann, export_of(10, 10_001))
    assert "conversations.1 holds 10,001 messages; an import takes at most 10,000 per conversation: split" in page
    assert 'class="messages"' in page and "New chat" in page  # the chat page, saying so where it says errors
    assert "holds 50,001 messages; an import takes at most 50,000 in all: import it in parts" in _import(
        ann, export_of(*[10_000] * 5, 1)
    )
    assert "holds 1,001 conversations; an import takes at most 1,000" in _import(ann, export_of(*[0] * 1001))
    assert ChatSession.objects.filter(owner=ann).count() == before


def test_an_import_nested_too_deep_is_a_400_naming_where(people):
    deep = export_of(1)
    deep["conversations"][0]["params"] = {"a": json.loads("[" * 40 + "]" * 40)}
    assert "conversations[0].params.a" in _import(people["ann"], deep) and "deeper than 32 levels" in _import(
        people["ann"], deep
    )
    page = _import(people["ann"], b'{"conversations": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")  # RecursionError
    assert "that file is not a chat export: conversations" in page and "deeper than 32 levels" in page


def test_a_file_over_the_body_limit_comes_back_to_the_chat_page_saying_so(stack, session_cookie):
    cookie = session_cookie("bounded-big")
    big = b'{"conversations": [' + b" " * (17 * 2**20) + b"]}"
    r = httpx.post(
        f"{stack.url}/chat/import/",
        files={"file": ("chats.json", big, "application/json")},
        headers={"Cookie": cookie},
        timeout=60,
    )
    assert r.status_code == 303 and r.headers["Location"] == "/chat/?refused=too-large"
    page = httpx.get(f"{stack.url}/chat/?refused=too-large", headers={"Cookie": cookie}).text
    assert (
        "that file is larger than 16 MiB, the most this appliance takes in one request (RKMOJO_MAX_REQUEST_BYTES)"
        in page
    )
