""" "Summarize and continue" through Django's test client against the stack's worker (its context is 512
tokens): a conversation that outgrew the context is summarized by the model, later prompts hold the summary
in place of the messages it covers, and those messages stay; the summary survives export and import."""

import json

import pytest
from test_chat_views import client_of, conversation, download


@pytest.fixture
def ann(django_for_stack):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username="summary-ann")[0]


def long_turns(n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        out.append(("user", f"Question {i} about the garden: " + " ".join(f"tomato{j}" for j in range(20))))
        out.append(("assistant", f"Answer {i}: " + " ".join(f"water{j}" for j in range(20))))
    return out


def outgrown(owner):
    """A conversation past the context, answered once: its last answer's prompt left the oldest turns out."""
    s = conversation(owner, long_turns(12), title="garden")
    s.params = {"temperature": 0, "max_tokens": 16}
    s.save()
    assert client_of(owner).post(f"/chat/{s.pk}/act/", {"action": "send", "text": "And the roses?"}).status_code == 302
    last = s.messages.order_by("-index").first()
    assert last.role == "assistant" and last.dropped > 0 and last.dropped % 2 == 0, last.dropped
    return s, last


def test_summarize_folds_the_left_out_turns_and_later_prompts_hold_the_summary(ann, stack):
    from webui.chat import conversations as conv

    s, before = outgrown(ann)
    c = client_of(ann)
    page = c.get(f"/chat/{s.pk}/").content.decode()
    assert page.count("Summarize and continue") == 2  # the marker, and the page's template of it for the script
    r = c.post(f"/chat/{s.pk}/summarize/")
    assert r.status_code == 302 and r["Location"].endswith("#summary")
    s.refresh_from_db()
    assert s.summary.strip() and s.summary_upto == before.dropped - 1
    assert s.messages.count() == 26  # nothing deleted
    page = c.get(f"/chat/{s.pk}/").content.decode()
    assert f"Summary of the {before.dropped} messages above" in page
    assert page.index('id="summary"') < page.index(f'id="m{before.dropped}"')
    # the next prompt: the summary after the system prompt, then the messages past it
    turn = conv.regenerate(s)
    assert turn.messages[0]["role"] == "system" and s.summary in turn.messages[0]["content"]
    assert turn.messages[1]["content"].startswith(f"Question {before.dropped // 2} ")
    assert c.post(f"/chat/{s.pk}/act/", {"action": "regenerate"}).status_code == 302
    after = s.messages.order_by("-index").first()
    assert after.role == "assistant" and after.content and after.prompt_tokens < 512
    # what the summary replaced is no longer "outside the context": no marker unless more was left out
    shown = c.get(f"/chat/{s.pk}/").content.decode().split('<template id="edge-template">')[0]
    assert ('id="context-edge"' in shown) == (after.dropped > s.summary_upto + 1)
    stack.idle(10)


def test_there_is_nothing_to_summarize_in_a_conversation_that_fits(ann, stack):
    s = conversation(ann)
    r = client_of(ann).post(f"/chat/{s.pk}/summarize/", follow=True)
    assert "nothing is outside the model&#x27;s context yet" in r.content.decode()
    s.refresh_from_db()
    assert s.summary_upto is None


def test_editing_a_summarized_question_drops_the_summary(ann):
    from webui.chat import conversations as conv

    s = conversation(ann, long_turns(3))
    s.summary, s.summary_upto = "They talked about tomatoes.", 1
    s.save()
    assert "They talked about tomatoes." in conv.send(s, "more?").messages[0]["content"]
    s.refresh_from_db()
    conv.edit(s, 2, "a new second question")  # past the summary: it stays
    assert s.summary_upto == 1
    conv.edit(s, 0, "a new first question")
    s.refresh_from_db()
    assert s.summary_upto is None and s.summary == ""


def test_the_summary_survives_export_and_import_and_a_bad_one_is_named(ann):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from webui.models import ChatSession

    s = conversation(ann, long_turns(2), title="exported")
    ChatSession.objects.filter(pk=s.pk).update(summary="About tomatoes.", summary_upto=1)
    c = client_of(ann)
    data = json.loads(download(c, f"/chat/{s.pk}/export/"))
    got = data["conversations"][0]
    assert got["summary"] == "About tomatoes." and got["summary_upto"] == 1
    assert (
        "## Summary of the messages above\n\nAbout tomatoes." in download(c, f"/chat/{s.pk}/export/?format=md").decode()
    )
    r = c.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())})
    copy = ChatSession.objects.get(pk=r["Location"].split("/")[2])
    assert (copy.summary, copy.summary_upto) == ("About tomatoes.", 1)
    got["summary_upto"] = 9
    r = c.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())}, follow=True)
    assert "summary_upto 9 needs a summary and a message after it (the conversation has 4)" in r.content.decode()
