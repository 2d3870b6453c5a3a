"""The chat page's views through Django's test client, against the stack's database, Redis and worker."""

import json
import re
import warnings

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


def download(client, path: str) -> bytes:
    """An export, which streams: read whole here (Django warns that its sync test client must)."""
    r = client.get(path)
    assert r.status_code == 200 and r.streaming, path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return b"".join(r)


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
    assert "ann's secret" not in download(bob, "/chat/export/").decode()
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
    md = download(ann, f"/chat/{s.pk}/export/?format=md").decode()
    assert "# sums" in md and "## User\n\nwhat is 2+2?" in md and "## Assistant\n\n**4**" in md
    data = json.loads(download(ann, f"/chat/{s.pk}/export/"))
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


TOOL_CONVERSATION = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning": "The user wants **weather**; <img src=x onerror=alert(1)> I should call the tool.",
        "tool_calls": [
            {
                "id": "call_0123",
                "name": "get_weather",
                "arguments": {"city": "Paris <script>alert(1)</script>", "days": 2, "units": {"temp": "C"}},
            }
        ],
        "finish_reason": "tool_calls",
    },
    {
        "role": "tool",
        "content": '{"temperature": 21, "sky": "clear"}',
        "tool_call_id": "call_0123",
        "name": "get_weather",
    },
    {"role": "assistant", "content": "It is **21 °C** and clear.", "finish_reason": "stop"},
]


def stored(owner, rows=TOOL_CONVERSATION, title="tools"):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(owner=owner, source="web", model="smollm2", title=title)
    ChatMessage.objects.bulk_create([ChatMessage(session=s, index=i, **row) for i, row in enumerate(rows)])
    return s


def test_thinking_tool_calls_and_tool_results_render_as_readable_blocks(people):
    from django.test import SimpleTestCase

    s = stored(people["ann"])
    r = client_of(people["ann"]).get(f"/chat/{s.pk}/")
    page = r.content.decode()
    thread = page[page.index('id="messages"') : page.index('id="status"')]
    t = SimpleTestCase()
    # the thinking: collapsed, above the answer, its markdown rendered and its markup inert
    t.assertContains(
        r,
        '<details class="thinking"><summary>Thinking…</summary><div class="md"><p>The user wants <strong>weather</strong>',
    )
    assert '<details class="thinking" open' not in thread and thread.index("thinking") < thread.index('class="calls"')
    # the call: the tool's name and its arguments as a table, nested ones as indented JSON
    t.assertContains(r, '<span class="tool-label">Tool call</span> <code class="tool-name">get_weather</code>')
    t.assertContains(r, "<tr><th>city</th><td>Paris &lt;script&gt;alert(1)&lt;/script&gt;</td></tr>")
    t.assertContains(r, "<tr><th>days</th><td>2</td></tr>")
    assert '<th>units</th><td><pre class="pyg"><code class="language-json">' in thread
    # the result: labelled with the tool's name, its JSON object as a table
    t.assertContains(r, "Tool result · <code>get_weather</code>")
    t.assertContains(r, "<tr><th>temperature</th><td>21</td></tr><tr><th>sky</th><td>clear</td></tr>")
    # no raw JSON, no live markup, no edit form on a tool's message
    assert '{"city"' not in thread and '{"temperature"' not in thread and "&quot;temperature&quot;" not in thread
    assert "<script" not in thread and "<img" not in thread
    assert thread.count('name="action" value="edit"') == 1


def test_an_api_conversation_with_tool_calls_is_recorded_in_one_session_and_shown_in_the_panel(people):
    """The worker's spelling in (OpenAI's tool message names only the call's id), the stored one out."""
    from asgiref.sync import async_to_sync
    from django.contrib.auth import get_user_model

    from webui import sessions
    from webui.models import ChatSession

    ask = [{"role": "user", "content": "Weather in Oslo? (api tools test)"}]
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    first = async_to_sync(sessions.record)(
        "openai", "smollm2", ask, "", {"prompt_tokens": 9}, reasoning="Call the tool.", tool_calls=[call]
    )
    follow_up = ask + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {**call["function"], "arguments": '{"city": "Oslo"}'}}],
        },
        {"role": "tool", "content": "-3 °C, snow", "tool_call_id": "call_9"},
    ]
    second = async_to_sync(sessions.record)("openai", "smollm2", follow_up, "It snows: -3 °C.", None)
    assert first == second
    s = ChatSession.objects.get(pk=first)
    rows = [
        (m.role, m.content, m.reasoning, m.tool_calls, m.tool_call_id, m.name) for m in s.messages.order_by("index")
    ]
    assert rows == [
        ("user", "Weather in Oslo? (api tools test)", "", [], "", ""),
        (
            "assistant",
            "",
            "Call the tool.",
            [{"id": "call_9", "name": "get_weather", "arguments": {"city": "Oslo"}}],
            "",
            "",
        ),
        ("tool", "-3 °C, snow", "", [], "call_9", "get_weather"),
        ("assistant", "It snows: -3 °C.", "", [], "", ""),
    ]
    staff, _ = get_user_model().objects.get_or_create(username="views-staff", defaults={"is_staff": True})
    page = client_of(staff).get(f"/panel/sessions/{s.pk}/").content.decode()
    assert '<details class="thinking"><summary>Thinking…</summary>' in page
    assert '<code class="tool-name">get_weather</code>' in page and "<tr><th>city</th><td>Oslo</td></tr>" in page
    assert "<b>tool</b> <code>get_weather</code>" in page


def test_export_and_import_carry_thinking_tool_calls_and_tool_results(people):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from webui.models import ChatSession

    s = stored(people["ann"], title="tools round trip")
    ann = client_of(people["ann"])
    data = json.loads(download(ann, f"/chat/{s.pk}/export/"))
    msgs = data["conversations"][0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1]["reasoning"].startswith("The user wants") and msgs[1]["tool_calls"][0]["arguments"]["days"] == 2
    assert msgs[2]["tool_call_id"] == "call_0123"
    md = download(ann, f"/chat/{s.pk}/export/?format=md").decode()
    assert "> **Thinking**\n>\n> The user wants **weather**" in md
    assert '**Tool call** `get_weather`\n\n```json\n{\n  "city": "Paris' in md
    assert '## Tool result (get_weather)\n\n```json\n{\n  "temperature": 21,' in md

    bob = client_of(people["bob"])
    r = bob.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())})
    copy = ChatSession.objects.filter(owner=people["bob"], title="tools round trip").latest("created")
    assert r.status_code == 302
    fields = ("role", "content", "reasoning", "tool_calls", "tool_call_id", "name", "finish_reason")
    as_rows = lambda session: [tuple(getattr(m, f) for f in fields) for m in session.messages.order_by("index")]  # noqa: E731
    assert as_rows(copy) == as_rows(s)
    # the engine's spelling of a call is read too, and a result without its tool's name gets the call's
    msgs[1]["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    msgs[2].update(tool_call_id="c", name="")
    bob.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())})
    again = ChatSession.objects.filter(owner=people["bob"], title="tools round trip").latest("created")
    assert again.messages.get(index=1).tool_calls == [{"id": "c", "name": "f", "arguments": {"a": 1}}]
    assert again.messages.get(index=2).name == "f"
    # a part on the wrong role is refused, naming it
    msgs[0]["tool_calls"] = msgs[1]["tool_calls"]
    bad = bob.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())}, follow=True)
    assert (
        "conversations.0.messages.0: Value error, tool_calls belongs on a message of role assistant, not user"
        in bad.content.decode()
    )
