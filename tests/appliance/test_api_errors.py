"""Bad requests get the right 4xx in the API's own error format — never a 500 — through the real clients."""

import httpx
import ollama
import openai
import pytest

ASK = [{"role": "user", "content": "hi"}]


def openai_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def test_malformed_json_is_a_400_in_each_format(http):
    err = openai_error(http.post("/v1/chat/completions", content=b'{"model": "smollm2", "messages": ['), 400)
    assert "JSON" in err["message"]
    r = http.post("/api/chat", content=b"{nope")
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    openai_error(http.post("/v1/chat/completions", content=b'["a list"]'), 400)


def test_an_unknown_model_is_a_404(oai, oll):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="no-such-model", messages=ASK)
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    with pytest.raises(ollama.ResponseError) as e:
        oll.generate(model="no-such-model", prompt="hi")
    assert e.value.status_code == 404


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", "hot"),
        ("max_tokens", "12"),
        ("max_tokens", 1.5),
        ("stream", "yes"),
        ("messages", "hi"),
        ("stop", 5),
        ("seed", True),
        ("top_p", 0),
        ("temperature", 3),
        ("presence_penalty", -5),
    ],
)
def test_a_wrong_type_or_range_names_the_field(oai, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=2, extra_body={field: value})
    assert e.value.body["param"] == field and e.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("max_tokens", [-1, 0])
def test_a_non_positive_max_tokens_is_a_400(oai, max_tokens):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=max_tokens)
    assert e.value.body["param"] == "max_tokens"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 9}, "n"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"frobnicate": 1}, "frobnicate"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
                ]
            },
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_naming_the_field(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=2, extra_body=extra)
    assert e.value.body["param"] == param


def test_an_error_message_never_cuts_a_quoted_value_short(oai):
    tool = {"type": "function", "function": {"name": "get_current_time", "description": "The time " * 40}}
    r = oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=2, tools=[tool])  # Open WebUI's
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model="smollm2",
            messages=ASK,
            max_tokens=2,
            extra_body={"prediction": {"type": "content", "content": "x" * 200}},
        )
    message = e.value.body["message"]
    assert "'prediction' = an object" in message and message.count('"') % 2 == 0


def test_a_prompt_longer_than_the_context_is_a_400(oai, oll):
    long = "the cat sat on the mat " * 200  # > 512 tokens, the test stack's context
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": long}], max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=100000)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        oai.embeddings.create(model="smollm2", input=long)
    with pytest.raises(ollama.ResponseError) as e:
        oll.generate(model="smollm2", prompt=long, stream=True).__next__()
    assert e.value.status_code == 400 and "context" in e.value.error


def test_a_missing_or_wrong_api_key_is_a_401(stack):
    with pytest.raises(openai.AuthenticationError) as e:
        stack.openai(api_key="rkm-wrong").chat.completions.create(model="smollm2", messages=ASK)
    assert e.value.body["code"] == "invalid_api_key"
    r = httpx.post(f"{stack.url}/v1/chat/completions", json={"model": "smollm2", "messages": ASK})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=stack.url).list()
    assert e.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=stack.url, headers={"Authorization": "Bearer nope"}).chat(model="smollm2", messages=ASK)
    assert e.value.status_code == 401


def test_a_wrong_method_is_a_405_not_a_500(http):
    openai_error(http.get("/v1/chat/completions"), 405)
    assert http.post("/api/tags").status_code == 405


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/show",
        "/api/pull",
    ],
)
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"model": 5},
        {"model": "smollm2", "messages": [None]},
        {"model": "smollm2", "prompt": ["a", "b"], "input": [1, 2]},
        {"model": "smollm2", "options": {"num_predict": "x"}, "messages": ASK},
        {"model": "smollm2", "options": [], "prompt": "x"},
    ],
)
def test_junk_never_gets_a_500(http, path, body):
    r = http.post(path, json=body)
    assert r.status_code < 500, (path, body, r.status_code, r.text)
    assert r.status_code < 400 or "error" in r.json()  # Ollama ignores fields it does not know: some are fine
