"""The chat page's views through Django's test client, against the stack's database, Redis and worker."""

import json
import re

import pytest


@pytest.fixture
def people(django_for_stack):
    from django.contrib.auth import get_user_model

    User = get_user_model()
    return {name: User.objects.get_or_create(username=f"views-{name}")[0] for name in ("ann", "bob")}


def client_of(user=None, csrf=False):
    from django.test import Client

    c = Client(enforce_csrf_checks=csrf, HTTP_HOST="127.0.0.1")
    if user is not None:
        c.force_login(user)
    return c


def conversation(owner, messages=(("user", "hi"), ("assistant", "hello")), title="a chat"):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=owner, source="web", model="smollm2", title=title)
    ChatMessage.objects.bulk_create(
        [ChatMessage(session=s, index=i, role=r, content=c) for i, (r, c) in enumerate(messages)]
    )
    return s


def test_an_anonymous_visitor_is_sent_to_sign_in(people):
    s = conversation(people["ann"])
    for path in ("/chat/", f"/chat/{s.pk}/", f"/chat/{s.pk}/export/", "/chat/export/"):
        r = client_of().get(path)
        assert r.status_code == 302 and r["Location"].startswith("/login/?next="), path
    assert client_of().post(f"/chat/{s.pk}/delete/").status_code == 302
    assert s.__class__.objects.filter(pk=s.pk).exists()


def test_one_user_cannot_see_rename_export_or_delete_anothers_conversation(people):
    s = conversation(people["ann"], title="ann's secret")
    bob = client_of(people["bob"])
    assert bob.get(f"/chat/{s.pk}/").status_code == 404
    assert bob.get(f"/chat/{s.pk}/export/?format=md").status_code == 404
    assert bob.post(f"/chat/{s.pk}/rename/", {"title": "mine"}).status_code == 404
    assert bob.post(f"/chat/{s.pk}/delete/").status_code == 404
    assert bob.post(f"/chat/{s.pk}/act/", {"action": "regenerate"}).status_code == 302  # refused, said on the page
    assert "ann&#x27;s secret" not in bob.get("/chat/").content.decode()
    assert "ann's secret" not in bob.get("/chat/export/").content.decode()
    s.refresh_from_db()
    assert s.title == "ann's secret" and s.messages.count() == 2
    assert client_of(people["ann"]).get(f"/chat/{s.pk}/").status_code == 200


def test_a_post_without_the_csrf_token_is_refused(people):
    s = conversation(people["ann"])
    ann = client_of(people["ann"], csrf=True)
    assert ann.post(f"/chat/{s.pk}/delete/").status_code == 403
    assert ann.post(f"/chat/{s.pk}/rename/", {"title": "x"}).status_code == 403
    assert s.__class__.objects.filter(pk=s.pk).exists()
    page = ann.get(f"/chat/{s.pk}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert ann.post(f"/chat/{s.pk}/delete/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert not s.__class__.objects.filter(pk=s.pk).exists()


def test_html_in_a_stored_message_comes_out_inert(people):
    evil = (
        "look <img src=x onerror=alert(1)> and <script>alert(2)</script>\n\n"
        '[click](javascript:alert(3)) <a href="#" onclick="alert(4)">x</a>\n\n```html\n<script>alert(5)</script>\n```'
    )
    s = conversation(people["ann"], (("user", evil), ("assistant", evil)))
    page = client_of(people["ann"]).get(f"/chat/{s.pk}/").content.decode()
    thread = page[page.index('id="messages"') : page.index('id="status"')]
    assert (
        "<img" not in thread
        and "<script" not in thread
        and "onerror=" not in thread.replace("onerror=alert(1)&gt;", "")
    )
    assert "javascript:" not in re.sub(r">[^<]*<", "><", thread)  # not in any attribute
    assert "onclick" not in re.sub(r">[^<]*<", "><", thread)
    assert "&lt;img src=x onerror=alert(1)&gt;" in thread  # shown as the text it is


def test_a_code_block_is_coloured_on_the_server(people):
    s = conversation(people["ann"], (("user", "code?"), ("assistant", "```python\ndef f(x):\n    return x\n```")))
    page = client_of(people["ann"]).get(f"/chat/{s.pk}/").content.decode()
    assert '<pre class="pyg"><code class="language-python"><span class="k">def</span>' in page


def test_the_list_is_limited_searchable_and_shows_only_ones_own(people):
    from webui.models import ChatSession

    ChatSession.objects.filter(owner=people["ann"]).delete()
    ChatSession.objects.bulk_create(
        [ChatSession(owner=people["ann"], source="web", model="smollm2", title=f"topic {i}") for i in range(75)]
    )
    conversation(people["bob"], title="topic bob")
    ann = client_of(people["ann"])
    page = ann.get("/chat/").content.decode()
    assert page.count('href="/chat/') - page.count('href="/chat/export') >= 60 and "Older conversations" in page
    assert "topic bob" not in page
    found = ann.get("/chat/", {"q": "topic 7"}).content.decode()
    assert "topic 7<" in found and "topic 71" in found and "topic 8<" not in found


def test_export_and_import_round_trip(people):
    from webui.models import ChatSession

    s = conversation(people["ann"], (("user", "what is 2+2?"), ("assistant", "**4**")), title="sums")
    ann = client_of(people["ann"])
    md = ann.get(f"/chat/{s.pk}/export/?format=md").content.decode()
    assert "# sums" in md and "## User\n\nwhat is 2+2?" in md and "## Assistant\n\n**4**" in md
    data = json.loads(ann.get(f"/chat/{s.pk}/export/").content)
    assert data["format"] == "rkmojo-chat" and data["conversations"][0]["messages"][1]["content"] == "**4**"
    from django.core.files.uploadedfile import SimpleUploadedFile

    bob = client_of(people["bob"])
    r = bob.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())})
    copy = ChatSession.objects.filter(owner=people["bob"], title="sums").latest("created")
    assert r.status_code == 302 and r["Location"] == f"/chat/{copy.pk}/"
    assert [m.content for m in copy.messages.order_by("index")] == ["what is 2+2?", "**4**"]
    bad = bob.post("/chat/import/", {"file": SimpleUploadedFile("c.json", b'{"conversations": 3}')}, follow=True)
    assert "not a chat export" in bad.content.decode()


def test_a_new_chat_with_a_setting_out_of_range_is_refused_naming_it(people):
    from webui.models import ChatSession

    before = ChatSession.objects.filter(owner=people["ann"]).count()
    r = client_of(people["ann"]).post("/chat/act/", {"model": "smollm2", "temperature": "5", "text": "hi"}, follow=True)
    assert "temperature=5.0 is out of range" in r.content.decode()
    assert ChatSession.objects.filter(owner=people["ann"]).count() == before


def test_the_page_shows_the_models_and_sends_without_javascript(people, stack):
    ann = client_of(people["ann"])
    page = ann.get("/chat/").content.decode()
    assert '<option value="smollm2"' in page and 'id="chat-config"' in page
    r = ann.post("/chat/act/", {"model": "smollm2", "temperature": "0", "max_tokens": "5", "text": "Say hi."})
    assert r.status_code == 302
    from webui.models import ChatSession

    s = ChatSession.objects.filter(owner=people["ann"]).latest("created")
    reply = s.messages.get(index=1)
    assert s.params == {"temperature": 0.0, "max_tokens": 5} and reply.role == "assistant" and reply.content
    assert reply.finish_reason in ("stop", "length") and reply.ttft is not None and reply.prompt_tokens > 0
    shown = ann.get(f"/chat/{s.pk}/").content.decode()
    assert 'data-m="ttft"' in shown and 'data-m="decode"' in shown and "/ 512 tokens" in shown
    stack.idle(10)


@pytest.fixture
def chat_open(people):
    """Chat without sign-in switched on as the panel does (saved settings), and off again afterwards."""
    from webui import config

    config.save({"chat_open": True, "api_keys": "never"})
    yield
    config.save({"chat_open": None, "api_keys": None})


def test_with_chat_open_an_anonymous_browser_chats_and_keeps_its_conversations_to_itself(chat_open):
    from webui import config

    from webui.models import ChatSession

    visitor, other = client_of(), client_of()
    assert visitor.get("/chat/").status_code == 200 and visitor.session.session_key
    r = visitor.post("/chat/act/", {"model": "smollm2", "max_tokens": "2", "temperature": "0", "text": "Hi."})
    s = ChatSession.objects.get(pk=r["Location"].split("/")[2])
    assert s.owner is None and s.visitor == visitor.session.session_key and s.messages.count() == 2
    assert visitor.get(f"/chat/{s.pk}/").status_code == 200
    other.get("/chat/")
    assert other.get(f"/chat/{s.pk}/").status_code == 404
    config.save({"api_keys": "always"})  # a client that needs a key: sign in instead
    assert visitor.get("/chat/").status_code == 302
