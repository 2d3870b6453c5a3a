"""Presets through Django's test client (`webui.chat.presets`): the built-ins, one's own made, edited and
deleted on the presets page, a new chat filled from one, a conversation given one or saved as one; another
user's preset is never listed, filled in, applied, edited or deleted; forms need their CSRF token."""

import re

import pytest

from test_chat_views import client_of, conversation


@pytest.fixture
def people(django_for_stack):
    from django.contrib.auth import get_user_model

    from webui.models import Preset

    User = get_user_model()
    made = {name: User.objects.get_or_create(username=f"presets-{name}")[0] for name in ("ann", "bob")}
    Preset.objects.filter(owner__in=made.values()).delete()
    return made


def preset(owner, name="Terse", system="Be terse.", params=None):
    from webui.models import Preset

    return Preset.objects.create(owner=owner, name=name, system=system, params=params or {"temperature": 0.1})


def test_the_built_ins_are_offered_to_every_user_and_pass_the_forms_checks(people):
    from inference.options import OPENAI
    from webui.api.params import check_sampling
    from webui.chat.presets import BUILTIN

    assert [p.key for p in BUILTIN] == ["concise", "code", "creative"]
    for p in BUILTIN:
        assert check_sampling(dict(p.params), OPENAI) == p.params and p.system
    page = client_of(people["bob"]).get("/chat/presets/").content.decode()
    for p in BUILTIN:
        assert f'href="/chat/?preset={p.key}"' in page and f'href="/chat/presets/?from={p.key}' in page
    new = client_of(people["bob"]).get("/chat/").content.decode()
    assert '<option value="code">Code</option>' in new and 'id="preset-data"' in new


def test_a_preset_is_made_on_its_page_with_the_new_chat_forms_checks(people):
    from webui.models import Preset

    ann = client_of(people["ann"])
    r = ann.post(
        "/chat/presets/",
        {"name": "Short", "system": "One line.", "temperature": "0.4", "max_tokens": "64", "stop": "END\nSTOP"},
    )
    assert r.status_code == 302 and r["Location"] == "/chat/presets/"
    p = Preset.objects.get(owner=people["ann"], name="Short")
    assert p.system == "One line." and p.params == {"temperature": 0.4, "max_tokens": 64, "stop": ["END", "STOP"]}
    bad = ann.post("/chat/presets/", {"name": "Hot", "temperature": "5"})
    assert bad.status_code == 400 and "temperature=5.0 is out of range" in bad.content.decode()
    assert not Preset.objects.filter(owner=people["ann"], name="Hot").exists()


def test_a_built_in_cannot_be_changed_but_copy_and_edit_fills_a_form_of_ones_own(people):
    ann = client_of(people["ann"])
    page = ann.get("/chat/presets/?from=code").content.decode()
    assert 'value="Code (mine)"' in page and 'value="0.2"' in page and 'action="/chat/presets/"' in page
    assert ann.get("/chat/presets/code/").status_code == 404  # no edit page for a built-in
    assert ann.post("/chat/presets/code/delete/").status_code == 404


def test_a_new_chat_is_filled_from_a_preset(people):
    p = preset(people["ann"], params={"temperature": 0.1, "top_k": 7, "stop": ["###"]})
    page = client_of(people["ann"]).get(f"/chat/?preset={p.pk}").content.decode()
    assert re.search(r'<textarea name="system"[^>]*>\s*Be terse.</textarea>', page)
    assert re.search(r'name="temperature" value="0.1"', page) and re.search(r'name="top_k" value="7"', page)
    assert "###</textarea>" in page and f'<option value="{p.pk}" selected>Terse</option>' in page
    builtin = client_of(people["ann"]).get("/chat/?preset=creative").content.decode()
    assert re.search(r'name="temperature" value="1.0"', builtin) and re.search(r'name="min_p" value="0.05"', builtin)


def test_a_preset_applied_to_a_conversation_sets_its_system_prompt_and_all_its_sampling(people):
    s = conversation(people["ann"])
    s.params = {"seed": 3, "temperature": 1.5}
    s.save()
    ann = client_of(people["ann"])
    r = ann.post(f"/chat/{s.pk}/preset/", {"preset": "code"})
    assert r.status_code == 302 and r["Location"] == f"/chat/{s.pk}/"
    s.refresh_from_db()
    assert s.system.startswith("You are a careful programming assistant")
    assert s.params == {"temperature": 0.2, "top_p": 0.95, "max_tokens": 2048}  # the seed went: all of it
    page = ann.get(f"/chat/{s.pk}/").content.decode()
    assert "applied the preset “Code”" in page and "temperature 0.2 · top p 0.95 · max tokens 2048" in page


def test_a_conversations_settings_are_saved_as_a_preset_and_again_under_the_same_name(people):
    from webui.models import Preset

    s = conversation(people["ann"])
    s.system, s.params = "Answer in French.", {"temperature": 0.5}
    s.save()
    ann = client_of(people["ann"])
    assert ann.post(f"/chat/{s.pk}/preset/save/", {"name": "French"}).status_code == 302
    p = Preset.objects.get(owner=people["ann"], name="French")
    assert (p.system, p.params) == ("Answer in French.", {"temperature": 0.5})
    s.params = {"temperature": 0.9}
    s.save()
    page = ann.post(f"/chat/{s.pk}/preset/save/", {"name": "French"}, follow=True).content.decode()
    assert "updated the preset “French”" in page
    assert Preset.objects.filter(owner=people["ann"], name="French").get().params == {"temperature": 0.9}


def test_ones_preset_is_edited_and_deleted_and_a_rename_onto_another_is_refused(people):
    from webui.models import Preset

    p, other = preset(people["ann"]), preset(people["ann"], name="Other")
    ann = client_of(people["ann"])
    assert 'value="Terse"' in ann.get(f"/chat/presets/{p.pk}/").content.decode()
    r = ann.post(f"/chat/presets/{p.pk}/", {"name": "Terser", "system": "Be very terse.", "max_tokens": "32"})
    p.refresh_from_db()
    assert r.status_code == 302 and (p.name, p.system, p.params) == ("Terser", "Be very terse.", {"max_tokens": 32})
    clash = ann.post(f"/chat/presets/{p.pk}/", {"name": "Other"})
    assert clash.status_code == 400 and "you have a preset named &#x27;Other&#x27; already" in clash.content.decode()
    assert ann.post(f"/chat/presets/{other.pk}/delete/").status_code == 302
    assert list(Preset.objects.filter(owner=people["ann"]).values_list("name", flat=True)) == ["Terser"]


def test_another_users_preset_is_never_listed_filled_in_applied_edited_or_deleted(people):
    from webui.models import Preset

    secret = preset(people["ann"], name="Ann's secret", system="ann only")
    mine = conversation(people["bob"])
    bob = client_of(people["bob"])
    assert "Ann&#x27;s secret" not in bob.get("/chat/presets/").content.decode()
    assert "Ann&#x27;s secret" not in bob.get("/chat/").content.decode()
    assert "ann only" not in bob.get(f"/chat/{mine.pk}/").content.decode()
    assert bob.get(f"/chat/?preset={secret.pk}").status_code == 404
    assert bob.get(f"/chat/presets/?from={secret.pk}").status_code == 404
    assert bob.post(f"/chat/{mine.pk}/preset/", {"preset": str(secret.pk)}).status_code == 404
    assert bob.get(f"/chat/presets/{secret.pk}/").status_code == 404
    assert bob.post(f"/chat/presets/{secret.pk}/", {"name": "mine now"}).status_code == 404
    assert bob.post(f"/chat/presets/{secret.pk}/delete/").status_code == 404
    assert (
        bob.get(f"/chat/?preset={2**70}").status_code == 404 and bob.get(f"/chat/presets/{2**70}/").status_code == 404
    )
    mine.refresh_from_db()
    secret.refresh_from_db()
    assert mine.system == "" and secret.name == "Ann's secret" and secret.owner == people["ann"]
    # nor is a preset saved under the same name by two people the same one
    bob.post("/chat/presets/", {"name": "Ann's secret", "system": "bob's"})
    assert Preset.objects.get(owner=people["ann"], name="Ann's secret").system == "ann only"
    # and another's conversation takes no preset of one's own
    theirs = conversation(people["ann"])
    assert bob.post(f"/chat/{theirs.pk}/preset/", {"preset": "concise"}).status_code == 404
    assert bob.post(f"/chat/{theirs.pk}/preset/save/", {"name": "x"}).status_code == 404


def test_preset_forms_need_their_csrf_token(people):
    s = conversation(people["ann"])
    ann = client_of(people["ann"], csrf=True)
    assert ann.post("/chat/presets/", {"name": "x"}).status_code == 403
    assert ann.post(f"/chat/{s.pk}/preset/", {"preset": "concise"}).status_code == 403
    assert ann.post(f"/chat/{s.pk}/preset/save/", {"name": "x"}).status_code == 403
