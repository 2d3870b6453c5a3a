"""Trimming as the APIs' opt-in, through the real clients: a conversation longer than the stack's 512-token
context is answered from its newest turns where the client asked for it (Ollama's `truncate`, absent
meaning true; OpenAI's `truncation: "auto"`) and refused with context_length_exceeded where it did not.
An answered prompt and its max tokens fit the context: the oldest turns were left out."""

import openai
import pytest
from test_chat_context import SYSTEM, long_conversation

CONTEXT = 512
MAX = 8
LONG = long_conversation(12)  # ~1200 tokens


def test_api_chat_trims_an_overlong_conversation_by_default(oll):
    r = oll.chat(model="smollm2", messages=LONG, options={"temperature": 0, "num_predict": MAX})
    assert r.done and r.done_reason in ("stop", "length")
    assert 0 < r.prompt_eval_count and r.prompt_eval_count + MAX <= CONTEXT


def test_api_chat_with_truncate_false_refuses_an_overlong_conversation(http):
    body = {"model": "smollm2", "messages": LONG, "stream": False, "options": {"num_predict": MAX}}
    r = http.post("/api/chat", json={**body, "truncate": False})
    assert r.status_code == 400 and "context" in r.json()["error"], r.text


def test_api_generate_refuses_an_overlong_prompt_even_with_truncate(http):
    prompt = "\n".join(m["content"] for m in LONG)
    body = {"model": "smollm2", "prompt": prompt, "stream": False, "truncate": True, "options": {"num_predict": MAX}}
    r = http.post("/api/generate", json=body)
    assert r.status_code == 400 and "context" in r.json()["error"], r.text


def test_chat_completions_refuse_an_overlong_conversation_by_default(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=LONG, max_tokens=MAX)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "messages"


def test_chat_completions_with_truncation_auto_trim_every_choice(oai):
    r = oai.chat.completions.create(
        model="smollm2", messages=LONG, max_tokens=MAX, n=2, seed=1, extra_body={"truncation": "auto"}
    )
    assert [c.finish_reason in ("stop", "length") for c in r.choices] == [True, True]
    assert 0 < r.usage.prompt_tokens and r.usage.prompt_tokens + MAX <= CONTEXT


def test_responses_with_truncation_auto_trim_and_say_so(oai):
    kw = {"model": "smollm2", "instructions": SYSTEM["content"], "input": LONG[1:], "max_output_tokens": MAX}
    r = oai.responses.create(**kw, truncation="auto", temperature=0)
    assert r.status in ("completed", "incomplete") and r.truncation == "auto"
    assert 0 < r.usage.input_tokens and r.usage.input_tokens + MAX <= CONTEXT
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(**kw, truncation="disabled")
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "input"


def test_a_conversation_that_fits_is_answered_whole(oai):
    short = long_conversation(1)
    plain = oai.chat.completions.create(model="smollm2", messages=short, max_tokens=MAX, temperature=0)
    auto = oai.chat.completions.create(
        model="smollm2", messages=short, max_tokens=MAX, temperature=0, extra_body={"truncation": "auto"}
    )
    assert auto.usage.prompt_tokens == plain.usage.prompt_tokens  # nothing left out: the prefix stays the same


@pytest.mark.parametrize(
    "path, body, allowed",
    [
        ("/v1/chat/completions", {"messages": LONG[-1:], "truncation": "sometimes"}, "'auto' or 'disabled'"),
        ("/v1/responses", {"input": "hi", "truncation": True}, "'auto' or 'disabled'"),
        ("/api/chat", {"messages": LONG[-1:], "truncate": "yes"}, "boolean"),
    ],
)
def test_a_bad_truncation_value_is_a_400_naming_the_field_and_its_values(http, path, body, allowed):
    r = http.post(path, json={"model": "smollm2", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    message = err["message"] if path.startswith("/v1/") else err
    field = "truncation" if path.startswith("/v1/") else "truncate"
    assert f"'{field}'" in message and allowed in message
    if path.startswith("/v1/"):
        assert err["param"] == field
