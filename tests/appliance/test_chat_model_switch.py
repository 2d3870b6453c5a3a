"""Switching a conversation's model from its header (`views.switch_model`) and its answer length
(`views.answer_length`), through Django's test client: an imported conversation whose model is not installed
opens with the picker showing and can be switched to the stack's smollm2; a model no worker serves is refused."""

import json

import pytest

from test_chat_views import client_of, conversation


@pytest.fixture
def ann(django_for_stack):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username="switch-ann")[0]


def imported(client) -> str:
    data = {"conversations": [{"model": "missing-model", "messages": [{"role": "user", "content": "hi"}]}]}
    from django.core.files.uploadedfile import SimpleUploadedFile

    r = client.post("/chat/import/", {"file": SimpleUploadedFile("c.json", json.dumps(data).encode())})
    assert r.status_code == 302
    return r["Location"]


def test_an_imported_conversation_with_a_missing_model_opens_with_the_picker_and_switches(ann):
    c = client_of(ann)
    where = imported(c)
    page = c.get(where).content.decode()
    assert '<details class="model-switch" id="model-switch" open>' in page
    assert "missing-model is not installed" in page and '<option value="smollm2">smollm2</option>' in page
    r = c.post(where + "model/", {"model": "smollm2"})
    assert r.status_code == 302
    page = c.get(where).content.decode()
    assert '<details class="model-switch" id="model-switch">' in page and "is not installed" not in page
    assert "context 512 tokens (configured 512;" in page  # the gauge recomputed for the new model


def test_a_model_no_worker_serves_is_refused_and_the_form_needs_its_token(ann):
    s = conversation(ann)
    c = client_of(ann)
    c.post(f"/chat/{s.pk}/model/", {"model": "nothing-here"})
    s.refresh_from_db()
    assert s.model == "smollm2"
    assert client_of(ann, csrf=True).post(f"/chat/{s.pk}/model/", {"model": "smollm2"}).status_code == 403


def test_the_answer_length_is_shown_and_set_per_conversation(ann):
    s = conversation(ann)
    c = client_of(ann)
    assert 'placeholder="1024"' in c.get(f"/chat/{s.pk}/").content.decode()
    c.post(f"/chat/{s.pk}/length/", {"max_tokens": "200"})
    s.refresh_from_db()
    assert s.params["max_tokens"] == 200
    c.post(f"/chat/{s.pk}/length/", {"max_tokens": "-3"})
    s.refresh_from_db()
    assert s.params["max_tokens"] == 200
    c.post(f"/chat/{s.pk}/length/", {"max_tokens": ""})
    s.refresh_from_db()
    assert "max_tokens" not in s.params


def test_the_marker_shows_where_the_model_s_view_begins(ann):
    from webui.models import ChatMessage

    s = conversation(ann, messages=[("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")])
    ChatMessage.objects.filter(session=s, index=3).update(dropped=2)
    page = client_of(ann).get(f"/chat/{s.pk}/").content.decode()
    edge = page.index('id="context-edge"')
    assert page.index('id="m1"') < edge < page.index('id="m2"')
    assert "earlier messages are outside the model&#x27;s context" in page or "outside the model's context" in page
