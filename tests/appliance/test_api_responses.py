"""/v1/responses driven by the unmodified `openai` SDK (`client.responses`) against the real stack.

The demo model's template has no tools: its calls use the engine's generic JSON format, constrained to
each tool's schema, so the arguments must validate whatever the 135M model would rather write.
"""

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

LAMP = {
    "type": "function",
    "name": "set_lamp",
    "description": "Switch a lamp on or off.",
    "parameters": {
        "type": "object",
        "properties": {"room": {"type": "string"}, "on": {"type": "boolean"}},
        "required": ["room", "on"],
        "additionalProperties": False,
    },
    "strict": True,
}
QUESTION = "What is the capital of France?"


def lamp_call(oai, request, tool_choice="required", **kw):
    """A request with the lamp tool, one call at most (the tiny model would go on calling)."""
    one_call = {"parallel_tool_calls": False, "max_output_tokens": 80, "temperature": 0}
    return oai.responses.create(model="smollm2", input=request, tools=[LAMP], tool_choice=tool_choice, **one_call, **kw)


def test_it_answers_text_input_with_instructions(oai):
    r = oai.responses.create(
        model="smollm2", instructions="Answer in one word.", input=QUESTION, max_output_tokens=12, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.store is False and r.instructions == "Answer in one word."
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert r.output_text == message.content[0].text and r.output_text.strip()
    assert 0 < r.usage.output_tokens <= 12 and r.usage.input_tokens > 10
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_message_items_and_a_string_input_mean_the_same(oai):
    plain = oai.responses.create(model="smollm2", input=QUESTION, max_output_tokens=8, temperature=0)
    items = oai.responses.create(
        model="smollm2",
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
        max_output_tokens=8,
        temperature=0,
    )
    assert items.output_text == plain.output_text


def test_it_streams_the_event_sequence_the_sdk_accumulates(oai):
    with oai.responses.stream(model="smollm2", input=QUESTION, max_output_tokens=12, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if final.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == next(e.text for e in events if e.type == "response.output_text.done")
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    plain = oai.responses.create(model="smollm2", input=QUESTION, max_output_tokens=12, temperature=0)
    assert final.output_text == plain.output_text and final.usage.output_tokens == plain.usage.output_tokens


def test_max_output_tokens_makes_an_incomplete_response(oai):
    r = oai.responses.create(model="smollm2", input="Count from 1 to 50.", max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


@pytest.mark.slow
def test_a_required_function_call_has_arguments_that_match_its_schema(oai):
    r = lamp_call(oai, "Turn on the lamp in the kitchen.")
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls and all(c.name == "set_lamp" and c.call_id.startswith("call_") for c in calls)
    jsonschema.validate(json.loads(calls[0].arguments), LAMP["parameters"])
    assert r.status == "completed"


@pytest.mark.slow
def test_a_function_call_output_turn_gets_the_final_answer(oai):
    ask = [{"role": "user", "content": "Turn on the lamp in the kitchen."}]
    first = lamp_call(oai, ask, tool_choice={"type": "function", "name": "set_lamp"})
    call = next(i for i in first.output if i.type == "function_call")
    history = [*ask, *first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": '{"ok": true}'})
    second = oai.responses.create(
        model="smollm2", input=history, tools=[LAMP], tool_choice="none", max_output_tokens=20, temperature=0
    )
    assert [i.type for i in second.output] == ["message"] and second.output_text.strip()


@pytest.mark.slow
def test_a_streamed_function_call_arrives_in_pieces_that_make_its_arguments(oai):
    stream = lamp_call(oai, "Switch off the lamp in the bedroom.", stream=True)
    events = list(stream)
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    item = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call")
    assert pieces == done.arguments == item.arguments and item.name == "set_lamp"
    jsonschema.validate(json.loads(pieces), LAMP["parameters"])
    assert events[-1].type == "response.completed"
    assert [o.type for o in events[-1].response.output][-1] == "function_call"


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    is_capital: bool


@pytest.mark.slow
def test_parse_with_a_pydantic_model_returns_the_object(oai):
    r = oai.responses.parse(
        model="smollm2", input="Describe Paris as JSON.", text_format=City, max_output_tokens=80, temperature=0
    )
    assert isinstance(r.output_parsed, City)
    assert r.text.format.type == "json_schema"


@pytest.mark.slow
def test_a_json_object_format_gives_a_json_object(oai):
    r = oai.responses.create(
        model="smollm2",
        input='Give a JSON object with the key "city" set to "Paris".',
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed", r.output_text  # not cut at max_output_tokens: what is cut is no object
    assert isinstance(json.loads(r.output_text), dict)


def test_logprobs_come_with_the_text_when_included(oai):
    r = oai.responses.create(
        model="smollm2",
        input=QUESTION,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        max_output_tokens=4,
        temperature=0,
    )
    lps = r.output[0].content[0].logprobs
    assert len(lps) == r.usage.output_tokens and all(len(lp.top_logprobs) == 2 for lp in lps)


def test_reasoning_items_and_encrypted_content_requests_are_accepted(oai):
    r = oai.responses.create(
        model="smollm2",
        include=["reasoning.encrypted_content"],
        store=False,
        input=[
            {"role": "user", "content": "Hi"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "A greeting."}],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
            {"role": "user", "content": QUESTION},
        ],
        max_output_tokens=4,
        temperature=0,
    )
    assert r.output_text and r.store is False


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{**LAMP, "parameters": {"type": "objekt"}}]}, "tools[0].parameters.type"),
        ({"tools": [LAMP], "tool_choice": {"type": "function", "name": "set_fan"}}, "tool_choice"),
        ({"input": [{"type": "function_call_output", "call_id": "call_nothing", "output": "1"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 3}}}}, "text.format.schema.type"),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(**{"model": "smollm2", "input": QUESTION, **extra})
    assert e.value.status_code == 400 and e.value.body["param"] == param
    message = e.value.body["message"]
    assert message.count('"') % 2 == 0  # never cut inside a quoted value


def test_the_openapi_document_describes_the_endpoint(http):
    doc = http.get("/openapi.json").json()
    body = doc["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    schema = doc["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
    assert {"input", "instructions", "tools", "text", "previous_response_id"} <= set(schema["properties"])
