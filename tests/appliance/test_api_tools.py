"""Tool calling through the real `openai` and `ollama` clients against the real stack (the demo model: its
template has no tools, so the generic JSON format, constrained by a grammar)."""

import json
from typing import Literal

import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "max_tokens": 80}


class GetWeather(BaseModel):
    """The current weather in a city"""

    city: str
    unit: Literal["celsius", "fahrenheit"]


def check_call(call, tool=WEATHER) -> dict:
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


@pytest.mark.slow
def test_a_required_tool_call_comes_back_valid_with_finish_reason_tool_calls(oai):
    r = oai.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required", **GREEDY)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0])
    named = oai.chat.completions.create(
        model="smollm2",
        messages=ASK,
        tools=[WEATHER, {"type": "function", "function": {"name": "get_time"}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,  # the tiny model would call it again and again
        **GREEDY,
    )
    check_call(named.choices[0].message.tool_calls[0])


@pytest.mark.slow
def test_a_streamed_tool_call_is_accumulated_by_the_sdk(oai):
    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    whole = oai.chat.completions.create(model="smollm2", messages=ASK, tools=[tool], tool_choice="required", **GREEDY)
    with oai.chat.completions.stream(
        model="smollm2", messages=ASK, tools=[tool], tool_choice="required", **GREEDY
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds and "tool_calls.function.arguments.done" in kinds
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert call.id.startswith("call_") and call.id.count("call_") == 1  # sent once, not concatenated
    assert json.loads(call.function.arguments) == json.loads(whole.choices[0].message.tool_calls[0].function.arguments)


@pytest.mark.slow
def test_a_tool_result_turn_gets_an_answer(oai):
    first = oai.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required", **GREEDY
    )
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    r = oai.chat.completions.create(model="smollm2", messages=history, tools=[WEATHER], tool_choice="none", **GREEDY)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    assert not r.choices[0].message.tool_calls


@pytest.mark.slow
def test_ollama_returns_tool_calls_with_object_arguments_streamed_whole(oll):
    options = {"temperature": 0, "num_predict": 80}
    r = oll.chat(model="smollm2", messages=ASK, tools=[WEATHER], options=options)
    assert r.done_reason == "stop" and r.message.tool_calls
    call = r.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    parts = list(oll.chat(model="smollm2", messages=ASK, tools=[WEATHER], options=options, stream=True))
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done  # the call whole in one line, before the last
    assert [dict(c.function.arguments) for c in with_calls[0].message.tool_calls] == [dict(call.function.arguments)]
    # the result goes back named by tool_name, as Home Assistant and the ollama client send it
    history = ASK + [r.message, {"role": "tool", "tool_name": "get_weather", "content": "21 degrees, clear"}]
    answer = oll.chat(model="smollm2", messages=history, tools=[WEATHER], options=options)
    assert answer.done and (answer.message.content or answer.message.tool_calls)


def test_show_says_tools_for_a_chat_model_and_thinking_only_where_the_template_has_it(oll):
    caps = oll.show("smollm2").capabilities
    assert "tools" in caps and "completion" in caps and "thinking" not in caps


BAD_SCHEMA = {"type": "object", "properties": {"unit": {"type": "strin"}}}
UNSUPPORTED = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}


@pytest.mark.parametrize(
    "extra, param, names",
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD_SCHEMA}}]},
            "tools[0].function.parameters.properties.unit.type",
            "'strin'",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": UNSUPPORTED}}]},
            "tools",
            "uniqueItems",
        ),
        (
            {
                "messages": ASK
                + [{"role": "assistant", "content": "ok"}, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]
            },
            "messages[2].tool_call_id",
            "'call_x'",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "fly"}}},
            "tool_choice",
            "'fly'",
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_tools_are_a_400_naming_the_field_before_anything_is_written(oai, extra, param, names, stream):
    body = {"messages": ASK, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", max_tokens=4, stream=stream, **body)
    err = e.value.body
    assert err["param"].startswith(param) and names in err["message"], err


def test_ollama_refuses_a_bad_tool_schema_naming_it(oll):
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(
            model="smollm2",
            messages=ASK,
            tools=[{"type": "function", "function": {"name": "f", "parameters": BAD_SCHEMA}}],
        )
    assert e.value.status_code == 400 and "tools[0].function.parameters" in e.value.error


@pytest.mark.slow
def test_the_curl_examples_of_the_docs_answer_on_the_demo_model(stack):
    import re
    import subprocess
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    examples = [e for e in re.findall(r"```\n(curl .*?)```", docs, re.S) if '"model": "smollm2"' in e]
    assert len(examples) == 4
    for example in examples:
        command = example.replace("http://BOARD:8000", stack.url).replace("curl ", "curl -sS --fail-with-body ", 1)
        out = subprocess.run(
            ["bash", "-c", command],
            env={"KEY": stack.key, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, (example, out.stdout, out.stderr)
        answer = json.loads(out.stdout)
        message = answer["choices"][0]["message"] if "choices" in answer else answer["message"]
        assert message.get("tool_calls") or json.loads(message["content"]), answer
