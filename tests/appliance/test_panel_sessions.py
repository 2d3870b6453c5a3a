"""The panel's Sessions page names each conversation's owner: the chat page's user, a visitor of chat without
sign-in, the API key an API session was made with (recorded by the real API, streamed or not), or "API"."""

import re

import pytest

from test_panel_views import client


@pytest.fixture
def staff(django_for_stack):
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.update_or_create(
        username="sessions-staff", defaults={"is_staff": True, "is_active": True}
    )
    return user


def owner_of(page: str, title: str) -> str:
    row = re.search(rf"<tr><td><a [^>]*>{re.escape(title)}</a></td><td data-owner>([^<]*)</td>", page)
    assert row, f"no row for {title!r}"
    return row.group(1)


def test_each_row_names_whose_conversation_it_is(staff):
    from django.contrib.auth import get_user_model

    from webui.models import ApiKey, ChatSession

    carol, _ = get_user_model().objects.get_or_create(username="carol")
    key, _ = ApiKey.create("Home Assistant")
    made = [
        ChatSession.objects.create(model="smollm2", source="web", owner=carol, title="owner carol"),
        ChatSession.objects.create(model="smollm2", source="web", visitor="abc", title="owner visitor"),
        ChatSession.objects.create(model="smollm2", source="openai", api_key=key, title="owner key"),
        ChatSession.objects.create(model="smollm2", source="ollama", title="owner api"),
    ]
    page = client(staff).get("/panel/sessions/?q=owner").content.decode()
    assert "<th>Owner</th>" in page
    assert owner_of(page, "owner carol") == "carol"
    assert owner_of(page, "owner visitor") == "visitor (no sign-in)"
    assert owner_of(page, "owner key") == "API key Home Assistant"
    assert owner_of(page, "owner api") == "API"
    by_owner = client(staff).get("/panel/sessions/?q=home+assis").content.decode()
    assert "owner key" in by_owner and "owner carol" not in by_owner
    key.delete()  # a deleted key leaves its sessions to "API"
    assert owner_of(client(staff).get("/panel/sessions/?q=owner").content.decode(), "owner key") == "API"
    for s in made:
        s.delete()


@pytest.mark.parametrize("stream", [False, True])
def test_the_api_records_the_key_a_session_was_made_with(staff, stack, stream):
    from webui.models import ApiKey, ChatSession

    _, plain = ApiKey.create(f"owner test {stream}")
    oai = stack.openai(api_key=plain)
    question = f"Owner check, streamed {stream}: say hi."
    out = oai.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=2, stream=stream
    )
    if stream:
        list(out)
    s = stack.wait_until(lambda: ChatSession.objects.filter(title=question).select_related("api_key").first())
    assert s.api_key is not None and s.api_key.name == f"owner test {stream}"
    assert owner_of(client(staff).get("/panel/sessions/", {"q": question}).content.decode(), question) == (
        f"API key owner test {stream}"
    )
    s.delete()
