"""The shared request pieces without the stack: messages with tool calls and results, tools, tool_choice,
JSON schemas and logit_bias, each refusal naming the field as the client sent it."""

import sys

import pytest

from webui.api.common import ApiError
from webui.api.params import Tool, chat_messages, check_logit_bias, check_schema, check_tool_choice, check_tools

USER = {"role": "user", "content": "Weather in Paris and Rome?"}


def call(cid, name, arguments):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def refused(fn, *args, **kw) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(*args, **kw)
    assert e.value.status == 400
    return e.value


def test_openai_tool_calls_are_parsed_and_results_named_by_their_call():
    out = chat_messages(
        [
            USER,
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Two cities.",
                "tool_calls": [call("c1", "weather", '{"city": "Paris"}'), call("c2", "weather", '{"city": "Rome"}')],
            },
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "18"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "21"},
        ]
    )
    assert out[1] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two cities.",
        "tool_calls": [call("c1", "weather", {"city": "Paris"}), call("c2", "weather", {"city": "Rome"})],
    }
    assert out[2] == {"role": "tool", "content": "18", "tool_call_id": "c2", "name": "weather"}
    assert out[3]["tool_call_id"] == "c1"


def test_ollama_calls_get_ids_and_results_answer_the_earliest_unanswered_call_of_their_tool():
    calls = [{"function": {"name": "weather", "arguments": {"city": c}}} for c in ("Paris", "Rome")]
    out = chat_messages(
        [
            USER,
            {"role": "assistant", "content": "", "thinking": "Two cities.", "tool_calls": calls},
            {"role": "tool", "tool_name": "weather", "content": "21"},
            {"role": "tool", "tool_name": "weather", "content": "18"},
            {"role": "tool", "tool_name": "clock", "content": "noon"},
        ],
        flavor="ollama",
    )
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert len(set(ids)) == 2 and out[1]["reasoning_content"] == "Two cities."
    assert [m.get("tool_call_id") for m in out[2:]] == [ids[0], ids[1], None]
    assert out[4]["name"] == "clock"  # Ollama's own server does not match results to calls either


@pytest.mark.parametrize(
    "message, param",
    [
        (
            {"role": "assistant", "tool_calls": [call("c1", "f", "{not json")]},
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [call("c1", "f", "[1, 2]")]},
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
            "messages[1].tool_calls[0].function.name",
        ),
        ({"role": "tool", "tool_call_id": "nope", "content": "1"}, "messages[1].tool_call_id"),
        ({"role": "tool", "content": "1"}, "messages[1].tool_call_id"),
        ({"role": "user", "content": "x", "tool_calls": [call("c1", "f", "{}")]}, "messages[1].tool_calls"),
        ({"role": "function", "content": "x"}, "messages[1].role"),
    ],
)
def test_a_malformed_call_or_result_is_refused_naming_it(message, param):
    assert refused(chat_messages, [USER, message]).param == param


def test_tools_need_unique_names_and_valid_schemas():
    tools = [Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})]
    assert check_tools(tools) == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert refused(check_tools, tools * 2).param == "tools[1].function.name"
    bad = Tool.model_validate({"function": {"name": "g", "parameters": {"properties": {"a": {"type": 5}}}}})
    assert refused(check_tools, [bad]).param == "tools[0].function.parameters.properties.a.type"


@pytest.mark.parametrize("without_jsonschema", [False, True])
def test_a_bad_schema_names_the_keyword_with_or_without_jsonschema(monkeypatch, without_jsonschema):
    if without_jsonschema:
        monkeypatch.setitem(sys.modules, "jsonschema", None)  # import fails: the structural checks run
    assert check_schema({"type": "object", "properties": {"a": {"type": "string"}}}, "format")
    e = refused(check_schema, {"properties": {"a": {"type": "strin"}}}, "format")
    assert e.param == "format.properties.a.type" and "strin" in str(e)
    assert refused(check_schema, {"required": "a"}, "format").param == "format.required"
    assert refused(check_schema, [1], "format").param == "format"


def test_tool_choice_names_a_known_function_or_a_mode():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert check_tool_choice("required", tools) == "required"
    assert check_tool_choice({"type": "function", "function": {"name": "f"}}, tools)["function"]["name"] == "f"
    e = refused(check_tool_choice, {"type": "function", "function": {"name": "g"}}, tools)
    assert e.param == "tool_choice" and "'g'" in str(e) and "'f'" in str(e)
    assert refused(check_tool_choice, "always", tools).param == "tool_choice"
    assert refused(check_tool_choice, "required", None).param == "tool_choice"
    assert check_tool_choice("auto", None) == "auto"


def test_logit_bias_takes_token_ids_as_strings_and_biases_in_range():
    assert check_logit_bias({"15": 5, "7": -100}, 100) == {15: 5.0, 7: -100.0}
    for bad in ({"x": 1}, {"-1": 1}, {"100": 1}, {"5": 101}, {"5": True}, {"5": "1"}):
        assert refused(check_logit_bias, bad, 100).param == "logit_bias"
