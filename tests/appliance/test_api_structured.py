"""Structured output, n > 1, logit_bias and the thinking switches through the real `openai` and `ollama`
clients against the real stack (the demo model)."""

import json

import jsonschema
import openai
import ollama
import pytest
from pydantic import BaseModel, ConfigDict, Field


class City(BaseModel):
    # bounded: the tiny demo model would write on and on where the schema lets it
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population: int = Field(ge=0, le=10**8)


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.mark.slow
def test_parse_with_a_pydantic_model_returns_the_parsed_object(oai):
    r = oai.chat.completions.parse(
        model="smollm2", messages=ask("Describe Paris."), response_format=City, max_tokens=120, temperature=0
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City) and r.choices[0].finish_reason == "stop"
    assert City.model_validate_json(r.choices[0].message.content) == parsed


@pytest.mark.slow
def test_json_object_output_is_a_json_object(oai):
    r = oai.chat.completions.create(
        model="smollm2",
        messages=ask('What is the capital of France? Answer in JSON with the key "answer".'),
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.slow
def test_ollama_format_takes_a_schema_or_json(oll):
    options = {"temperature": 0, "num_predict": 120}
    r = oll.chat(model="smollm2", messages=ask("Describe Paris."), format=City.model_json_schema(), options=options)
    City.model_validate_json(r.message.content)
    g = oll.generate(model="smollm2", prompt="Describe Paris.", format=City.model_json_schema(), options=options)
    jsonschema.validate(json.loads(g.response), City.model_json_schema())
    question = ask('What is the capital of France? Answer in JSON with the key "answer".')
    r = oll.chat(model="smollm2", messages=question, format="json", options=options)
    assert isinstance(json.loads(r.message.content), dict)


@pytest.mark.slow
def test_n_choices_run_one_after_another_each_with_its_own_seed(oai):
    kw = {"model": "smollm2", "messages": ask("Tell me a word."), "max_tokens": 8, "temperature": 1.0, "top_p": 1.0}
    r = oai.chat.completions.create(n=2, seed=7, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    one = [oai.chat.completions.create(seed=s, **kw) for s in (7, 8)]
    assert [c.message.content for c in r.choices] == [o.choices[0].message.content for o in one]
    assert r.usage.completion_tokens == sum(o.usage.completion_tokens for o in one)
    chunks = list(oai.chat.completions.create(n=2, seed=7, stream=True, **kw))
    texts = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
        for i in (0, 1)
    ]
    assert texts == [c.message.content for c in r.choices]
    assert len({c.id for c in chunks}) == 1


@pytest.mark.slow
def test_logit_bias_pushes_a_token_in_or_out(oai, stack):
    from inference.store import Store
    from inference.tokenizer import StoreTokenizer

    tok = StoreTokenizer(Store(stack.store))
    kw = {"model": "smollm2", "messages": ask("What is the capital of France?"), "max_tokens": 3, "temperature": 0}
    free = oai.chat.completions.create(**kw).choices[0].message.content
    first = tok.encode(free, add_special_tokens=False)[0]
    banned = oai.chat.completions.create(logit_bias={str(first): -100}, **kw).choices[0].message.content
    assert tok.encode(banned, add_special_tokens=False)[0] != first
    banana = tok.encode("Banana", add_special_tokens=False)[0]
    forced = oai.chat.completions.create(logit_bias={str(banana): 100}, **kw).choices[0].message.content
    assert forced.startswith(tok.decode([banana]))


def test_the_thinking_switches_are_accepted_on_a_model_without_thinking(oai, oll):
    for extra in ({"reasoning_effort": "none"}, {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}):
        r = oai.chat.completions.create(model="smollm2", messages=ask("Hi"), max_tokens=4, **extra)
        assert r.choices[0].message.content and getattr(r.choices[0].message, "reasoning_content", None) is None
        assert r.usage.completion_tokens_details.reasoning_tokens == 0
    r = oll.chat(model="smollm2", messages=ask("Hi"), think=False, options={"num_predict": 4})
    assert r.message.content and not r.message.thinking


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
            "response_format.json_schema.schema.type",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"logit_bias": {"hello": 5}}, "logit_bias"),
        ({"logit_bias": {"50": 500}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"n": 9}, "n"),
        ({"reasoning_effort": "maximal"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_structure_fields_are_a_400_naming_them(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ask("hi"), max_tokens=2, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_ollama_names_a_bad_format_or_think(oll):
    for kw, field in (
        ({"format": {"type": "object", "not": {}}}, "format"),
        ({"think": "max"}, "think"),
    ):
        with pytest.raises(ollama.ResponseError) as e:
            oll.chat(model="smollm2", messages=ask("hi"), options={"num_predict": 2}, **kw)
        assert e.value.status_code == 400 and field in e.value.error, e.value.error
    r = oll._client.post("/api/chat", json={"model": "smollm2", "messages": ask("hi"), "format": "yaml"})
    assert r.status_code == 400 and "format" in r.json()["error"]  # the client itself refuses to send it
