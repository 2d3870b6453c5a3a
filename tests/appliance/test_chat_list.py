"""The chat page's conversation list through Django's test client: pinned conversations stay on top and
keep their place by use, the pins are limited, several conversations are deleted or exported (as one
streamed file, the same JSON or Markdown as Export) at once, and only one's own."""

import json
import warnings

import pytest

from test_chat_views import client_of, conversation


@pytest.fixture
def people(django_for_stack):
    from django.contrib.auth import get_user_model

    from webui.models import ChatSession

    User = get_user_model()
    made = {name: User.objects.get_or_create(username=f"list-{name}")[0] for name in ("ann", "bob")}
    ChatSession.objects.filter(owner__in=made.values()).delete()
    return made


def titles(page: str) -> list[str]:
    """The list's titles, top to bottom."""
    import re

    items = page[page.index('id="chat-list"') : page.index("</ul>", page.index('id="chat-list"'))]
    return re.findall(r'<a href="/chat/[0-9a-f-]+/">([^<]*)</a>', items)


def streamed(r) -> bytes:
    assert r.status_code == 200 and r.streaming
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return b"".join(r)


def test_a_pinned_conversation_stays_on_top_until_unpinned(people):
    old, mid, new = (conversation(people["ann"], title=t) for t in ("old", "mid", "new"))
    ann = client_of(people["ann"])
    assert titles(ann.get("/chat/").content.decode()) == ["new", "mid", "old"]
    r = ann.post(f"/chat/{old.pk}/pin/", {"pin": "1", "next": f"/chat/{mid.pk}/"})
    assert r.status_code == 302 and r["Location"] == f"/chat/{mid.pk}/"
    ann.post(f"/chat/{mid.pk}/pin/", {"pin": "1"})
    page = ann.get("/chat/").content.decode()
    assert titles(page) == ["mid", "old", "new"]  # the latest pinned first
    assert page.count('class="pinned"') == 2 and page.count('aria-pressed="true"') == 2
    updated = type(old).objects.get(pk=old.pk).updated
    assert updated == old.updated  # a pin is not a use: its place among the others stays
    r = ann.post(f"/chat/{mid.pk}/pin/", {"pin": "0"}, HTTP_ACCEPT="application/json")
    assert r.json() == {"pinned": False}
    assert titles(ann.get("/chat/").content.decode()) == ["old", "new", "mid"]
    assert titles(ann.get("/chat/", {"q": "mi"}).content.decode()) == ["mid"]


def test_pins_are_limited_and_the_refusal_says_what_to_do(people, monkeypatch):
    from webui.chat import conversations

    monkeypatch.setattr(conversations, "MAX_PINNED", 2)
    chats = [conversation(people["ann"], title=f"c{i}") for i in range(3)]
    ann = client_of(people["ann"])
    for c in chats[:2]:
        ann.post(f"/chat/{c.pk}/pin/", {"pin": "1"})
    r = ann.post(f"/chat/{chats[2].pk}/pin/", {"pin": "1"}, HTTP_ACCEPT="application/json")
    assert r.status_code == 409 and "unpin one first" in r.json()["error"]
    page = ann.post(f"/chat/{chats[2].pk}/pin/", {"pin": "1"}, follow=True).content.decode()
    assert "2 conversations are pinned" in page


def test_ticked_conversations_are_deleted_together_and_anothers_are_left_alone(people):
    from webui.models import ChatSession

    a, b, keep = (conversation(people["ann"], title=t) for t in ("a", "b", "keep"))
    theirs = conversation(people["bob"], title="bob's")
    ann = client_of(people["ann"])
    ids = [str(a.pk), str(b.pk), str(theirs.pk), "not-an-id"]
    r = ann.post("/chat/bulk/", {"action": "delete", "ids": ids, "next": f"/chat/{a.pk}/"}, follow=True)
    assert r.redirect_chain[-1][0] == "/chat/"  # the page it was on is gone
    assert "deleted 2 conversations" in r.content.decode()
    assert set(ChatSession.objects.filter(owner__in=people.values()).values_list("title", flat=True)) == {
        "keep",
        "bob's",
    }
    nothing = ann.post("/chat/bulk/", {"action": "delete", "ids": [str(theirs.pk)]}, follow=True)
    assert "tick one or more conversations" in nothing.content.decode()
    assert ChatSession.objects.filter(pk=theirs.pk).exists() and ChatSession.objects.filter(pk=keep.pk).exists()


def test_ticked_conversations_are_exported_as_one_file_that_imports_back(people):
    from webui.models import ChatSession

    a = conversation(people["ann"], (("user", "first?"), ("assistant", "one")), title="a")
    b = conversation(people["ann"], (("user", "second?"), ("assistant", "two")), title="b")
    conversation(people["ann"], title="not ticked")
    theirs = conversation(people["bob"], title="bob's")
    ann = client_of(people["ann"])
    ids = [str(a.pk), str(b.pk), str(theirs.pk)]
    r = ann.post("/chat/bulk/", {"action": "export-json", "ids": ids})
    assert r["Content-Disposition"] == 'attachment; filename="chats.json"'
    data = json.loads(streamed(r))
    assert [c["title"] for c in data["conversations"]] == ["b", "a"]  # newest first, only one's own
    md = streamed(ann.post("/chat/bulk/", {"action": "export-md", "ids": ids})).decode()
    assert "# a" in md and "# b" in md and "second?" in md and "bob's" not in md and "not ticked" not in md
    from django.core.files.uploadedfile import SimpleUploadedFile

    client_of(people["bob"]).post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())})
    assert set(ChatSession.objects.filter(owner=people["bob"]).values_list("title", flat=True)) == {"a", "b", "bob's"}


def test_list_actions_need_their_csrf_token_and_refuse_an_unknown_action(people):
    s = conversation(people["ann"])
    ann = client_of(people["ann"], csrf=True)
    assert ann.post(f"/chat/{s.pk}/pin/", {"pin": "1"}).status_code == 403
    assert ann.post("/chat/bulk/", {"action": "delete", "ids": [str(s.pk)]}).status_code == 403
    s.refresh_from_db()
    assert s.pinned is None
    r = client_of(people["ann"]).post("/chat/bulk/", {"action": "shred", "ids": [str(s.pk)]}, follow=True)
    assert "unknown action &#x27;shred&#x27;" in r.content.decode() and type(s).objects.filter(pk=s.pk).exists()
    assert client_of(people["bob"]).post(f"/chat/{s.pk}/pin/", {"pin": "1"}).status_code == 404
