"""Tool conversations render exactly as transformers' `apply_chat_template` renders them (issue 44).

On the Qwen3 and Gemma 4 fixture templates, with two function tools as Home Assistant and an OpenAI
client send them: the tool list with a user question; one call, its result and a follow-up answer; two
parallel calls and their two results; an assistant turn carrying `reasoning_content`; the OpenAI shape
where `arguments` is a JSON string; each with `enable_thinking` on, off and unset. Both sides read the
same store (see `test_templates.make_store`), and the text must be identical, token ids too.

The last tests spell out what each family's model is shown: Qwen3's `<tools>` JSON lines and
`<tool_call>` JSON, Gemma 4's `<|tool>declaration:…` and `<|tool_call>call:NAME{…}<tool_call|>`.
"""

import json
from pathlib import Path

import jinja2
import pytest
from test_templates import TEMPLATES, make_store
from transformers import AutoTokenizer

from inference.store import Store
from inference.templates import ChatTemplateError
from inference.tokenizer import StoreTokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"

HASS_TURN_ON = {
    "type": "function",
    "function": {
        "name": "HassTurnOn",
        "description": "Turns on/opens a device or entity",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Name of the device or entity"},
                "area": {"type": "string", "description": "Area the device is in"},
                "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch", "fan"]}},
            },
            "required": ["name"],
        },
    },
}
GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TOOLS = [HASS_TURN_ON, GET_WEATHER]

WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}
LIGHT_ARGS = {"name": "kitchen light", "area": "Kitchen", "domain": ["light"]}
RESULTS = {
    "call_1": ("get_weather", '{"temperature": 21, "condition": "sunny"}'),
    "call_2": ("HassTurnOn", '{"success": true, "targets": ["light.kitchen"]}'),
}


def call(call_id: str, name: str, arguments: dict, *, as_json_string: bool = False) -> dict:
    """One entry of an assistant's `tool_calls`; the OpenAI wire shape has `arguments` as a JSON string."""
    args = json.dumps(arguments, ensure_ascii=False) if as_json_string else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def calls(n: int, *, as_json_string: bool = False) -> list[dict]:
    both = [
        call("call_1", "get_weather", WEATHER_ARGS, as_json_string=as_json_string),
        call("call_2", "HassTurnOn", LIGHT_ARGS, as_json_string=as_json_string),
    ]
    return both[:n]


def tool_conversation(
    n_calls: int,
    *,
    answered: bool = True,
    as_json_string: bool = False,
    reasoning: str | None = None,
    reasoning_key: str = "reasoning_content",
    content="",
    system: bool = False,
) -> list[dict]:
    """A user question, an assistant turn making `n_calls` parallel calls, one `tool` message per call;
    when `answered`, then the assistant's follow-up answer and a new user turn (else the prompt is the one
    the model answers the results from). The calling turn's reasoning goes under `reasoning_key`: OpenAI
    servers say `reasoning_content`, Ollama `thinking`, newer vLLM `reasoning` (both sides alias them)."""
    messages = [{"role": "system", "content": "You control the house."}] if system else []
    messages.append({"role": "user", "content": "What's the weather in Paris? And turn on the kitchen light."})
    turn = {"role": "assistant", "content": content, "tool_calls": calls(n_calls, as_json_string=as_json_string)}
    if reasoning is not None:
        turn[reasoning_key] = reasoning
    messages.append(turn)
    for tc in turn["tool_calls"]:
        name, result = RESULTS[tc["id"]]
        messages.append({"role": "tool", "tool_call_id": tc["id"], "name": name, "content": result})
    if answered:
        messages.append({"role": "assistant", "content": "It is 21 °C and sunny in Paris; the kitchen light is on."})
        messages.append({"role": "user", "content": "Thanks! Turn it off at ten."})
    return messages


THOUGHT = "The user wants the weather and a light: call both tools."
CONVERSATIONS = {
    "a question": [{"role": "user", "content": "Is it raining in Paris?"}],
    "a system prompt and a question": [
        {"role": "system", "content": "You control the house."},
        {"role": "user", "content": "Turn on the kitchen light."},
    ],
    "one call awaiting its answer": tool_conversation(1, answered=False),
    "one call answered": tool_conversation(1),
    "one call with a system prompt": tool_conversation(1, system=True),
    "one call with text before it": tool_conversation(1, content="Let me check."),
    "two parallel calls awaiting their answer": tool_conversation(2, answered=False),
    "two parallel calls answered": tool_conversation(2),
    "one call with reasoning awaiting its answer": tool_conversation(1, answered=False, reasoning=THOUGHT),
    "one call with reasoning answered": tool_conversation(1, reasoning=THOUGHT),
    "two calls with reasoning awaiting their answer": tool_conversation(2, answered=False, reasoning=THOUGHT),
    "two calls with reasoning answered": tool_conversation(2, reasoning=THOUGHT),
    "one call with reasoning named thinking awaiting its answer": tool_conversation(
        1, answered=False, reasoning=THOUGHT, reasoning_key="thinking"
    ),
    "one call with reasoning named reasoning awaiting its answer": tool_conversation(
        1, answered=False, reasoning=THOUGHT, reasoning_key="reasoning"
    ),
    "one call with json string arguments": tool_conversation(1, as_json_string=True),
    "two calls with json string arguments awaiting their answer": tool_conversation(
        2, answered=False, as_json_string=True
    ),
    "two calls with json string arguments answered": tool_conversation(2, as_json_string=True),
    "a call with non-ascii arguments and result": [
        {"role": "user", "content": "Wetter in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("c1", "get_weather", {"unit": "celsius", "city": "Zürich"})],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"Temperatur": "21 °C", "Zustand": "☀️"}'},
    ],
    "a tool result given as content parts": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": calls(1)},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny, 21 °C"}]},
    ],
}
THINKING = {"thinking unset": {}, "thinking on": {"enable_thinking": True}, "thinking off": {"enable_thinking": False}}
FAMILIES = ["qwen3", "gemma4"]


@pytest.fixture(scope="module")
def pairs(smollm2_store, tmp_path_factory) -> dict:
    """{family: (family, our tokenizer, transformers' tokenizer)}, both over one store holding the fixture template."""
    out = {}
    for name in FAMILIES:
        template = (FIXTURES / f"{name}.jinja").read_text()
        tj = (smollm2_store / "tokenizer.json").read_bytes()
        path = make_store(tmp_path_factory.mktemp(name), template, TEMPLATES[name], tj)
        ours = StoreTokenizer(Store(path))
        hf = AutoTokenizer.from_pretrained(str(path))
        assert hf.chat_template == ours.template_source
        out[name] = (name, ours, hf)
    return out


@pytest.fixture(params=FAMILIES)
def pair(request, pairs):
    return pairs[request.param]


def both(pair, messages, add_generation_prompt=True, **kw) -> tuple[str, str]:
    """(ours, transformers') text; the two disagree on the default of `add_generation_prompt`, so it is given."""
    _, ours, hf = pair
    kw["add_generation_prompt"] = add_generation_prompt
    return ours.render_chat(messages, **kw), hf.apply_chat_template(messages, tokenize=False, **kw)


@pytest.mark.parametrize("thinking", list(THINKING))
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_a_tool_conversation_renders_exactly_as_transformers_renders_it(pair, conversation, thinking):
    name, ours, hf = pair
    messages = CONVERSATIONS[conversation]
    kw = {"tools": TOOLS, "add_generation_prompt": True, **THINKING[thinking]}
    got, want = both(pair, messages, **kw)
    assert got == want, f"{name} / {conversation} / {thinking}"
    assert ours.encode_chat(messages, **kw) == hf.apply_chat_template(messages, tokenize=True, **kw)["input_ids"]


@pytest.mark.parametrize("conversation", ["one call answered", "two parallel calls answered"])
def test_a_finished_tool_conversation_without_a_generation_prompt_renders_as_transformers_does(pair, conversation):
    messages = CONVERSATIONS[conversation][:-1]  # ending on the assistant's answer, as a training sample does
    got, want = both(pair, messages, tools=TOOLS, add_generation_prompt=False)
    assert got == want


def test_calls_and_results_render_as_transformers_does_when_no_tool_list_is_given(pair):
    """A client may send the history of calls and results without `tools` (none offered this turn)."""
    messages = CONVERSATIONS["two parallel calls answered"]
    got, want = both(pair, messages, add_generation_prompt=True)
    assert got == want


def test_json_string_arguments_render_like_dict_arguments_on_qwen3_but_not_on_gemma4(pair):
    """Qwen3 writes a string verbatim and a dict through `tojson`: the same text when the string is
    `json.dumps` of the dict. Gemma 4 writes a dict in its own `key:<|"|>value<|"|>` syntax but a string
    verbatim inside `call:NAME{…}`, so a JSON string is shown doubly braced, as transformers shows it too:
    a server should hand Gemma 4 the arguments parsed into a dict."""
    name, _, _ = pair
    as_dict, _ = both(pair, CONVERSATIONS["two parallel calls answered"], tools=TOOLS)
    as_string, want = both(pair, CONVERSATIONS["two calls with json string arguments answered"], tools=TOOLS)
    assert as_string == want
    if name == "qwen3":
        assert as_string == as_dict
    else:
        assert as_string != as_dict
        assert '<|tool_call>call:get_weather{{"city": "Paris", "unit": "celsius"}}<tool_call|>' in as_string
        assert '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>' in as_dict


def test_a_null_content_on_the_calling_turn_is_refused_by_qwen3_on_both_sides_and_renders_on_gemma4(pair):
    """OpenAI clients send `content: null` with `tool_calls`. Both sides drop None-valued keys first (as
    transformers does, for this very reason), and Qwen3's template then concatenates the missing content:
    transformers fails with jinja's UndefinedError, we refuse with the same message (so does an omitted
    content). A server must pass `""` to Qwen3. Gemma 4's template tests the content's type and renders
    the turn as with `""`, on both sides alike."""
    name, ours, hf = pair
    for n_calls, answered in ((2, True), (1, False)):
        conversation = tool_conversation(n_calls, answered=answered, content=None)
        if name == "qwen3":
            with pytest.raises(jinja2.exceptions.UndefinedError, match="no attribute 'content'"):
                hf.apply_chat_template(conversation, tools=TOOLS, tokenize=False, add_generation_prompt=True)
            with pytest.raises(ChatTemplateError, match="no attribute 'content'"):
                ours.render_chat(conversation, tools=TOOLS)
        else:
            got, want = both(pair, conversation, tools=TOOLS, add_generation_prompt=True)
            assert got == want
            assert got == both(pair, tool_conversation(n_calls, answered=answered, content=""), tools=TOOLS)[0]


# What each family's model is shown for two parallel calls with reasoning, awaiting the answer from the
# results (thinking unset): the tool declarations, the calls and the results, each in its own syntax.
QWEN3_SHOWN = (
    "<|im_start|>system\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "HassTurnOn", "description": "Turns on/opens a device or entity", '
    '"parameters": {"type": "object", "properties": {"name": {"type": "string", "description": "Name of the device or entity"}, '
    '"area": {"type": "string", "description": "Area the device is in"}, '
    '"domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch", "fan"]}}}, "required": ["name"]}}}\n'
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, '
    '"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}\n'
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "What's the weather in Paris? And turn on the kitchen light.<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<think>\n"
    "The user wants the weather and a light: call both tools.\n"
    "</think>\n"
    "\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "HassTurnOn", "arguments": {"name": "kitchen light", "area": "Kitchen", "domain": ["light"]}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    '{"temperature": 21, "condition": "sunny"}\n'
    "</tool_response>\n"
    "<tool_response>\n"
    '{"success": true, "targets": ["light.kitchen"]}\n'
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)
GEMMA4_SHOWN = (
    "<bos><|turn>system\n"
    '<|tool>declaration:HassTurnOn{description:<|"|>Turns on/opens a device or entity<|"|>,parameters:{properties:{'
    'area:{description:<|"|>Area the device is in<|"|>,type:<|"|>STRING<|"|>},'
    'domain:{items:{enum:[<|"|>light<|"|>,<|"|>switch<|"|>,<|"|>fan<|"|>],type:<|"|>STRING<|"|>},type:<|"|>ARRAY<|"|>},'
    'name:{description:<|"|>Name of the device or entity<|"|>,type:<|"|>STRING<|"|>}},'
    'required:[<|"|>name<|"|>],type:<|"|>OBJECT<|"|>}}<tool|>'
    '<|tool>declaration:get_weather{description:<|"|>Current weather in a city<|"|>,parameters:{properties:{'
    'city:{description:<|"|>City name<|"|>,type:<|"|>STRING<|"|>},'
    'unit:{enum:[<|"|>celsius<|"|>,<|"|>fahrenheit<|"|>],type:<|"|>STRING<|"|>}},'
    'required:[<|"|>city<|"|>,<|"|>unit<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n'
    "<|turn>user\n"
    "What's the weather in Paris? And turn on the kitchen light.<turn|>\n"
    "<|turn>model\n"
    "<|channel>thought\n"
    "The user wants the weather and a light: call both tools.\n"
    "<channel|>"
    '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>'
    '<|tool_call>call:HassTurnOn{area:<|"|>Kitchen<|"|>,domain:[<|"|>light<|"|>],name:<|"|>kitchen light<|"|>}<tool_call|>'
    '<|tool_response>response:get_weather{value:<|"|>{"temperature": 21, "condition": "sunny"}<|"|>}<tool_response|>'
    '<|tool_response>response:HassTurnOn{value:<|"|>{"success": true, "targets": ["light.kitchen"]}<|"|>}<tool_response|>'
)


def test_qwen3_is_shown_its_tools_as_json_lines_and_the_calls_as_tool_call_json(pairs):
    """Tools: one `tojson` line each inside `<tools>`, in the system turn. Calls: `<tool_call>` JSON in the
    assistant turn (its reasoning in `<think>`, as it comes after the last user question). Results: one
    `<tool_response>` each, together in a single user turn. The generation prompt opens an assistant turn."""
    got, want = both(pairs["qwen3"], CONVERSATIONS["two calls with reasoning awaiting their answer"], tools=TOOLS)
    assert got == want == QWEN3_SHOWN


def test_gemma4_is_shown_its_tools_as_declarations_and_the_calls_as_tool_call_tokens(pairs):
    """Tools: `<|tool>declaration:NAME{…}<tool|>` with keys sorted and strings quoted as `<|"|>`, in the
    system turn. Calls: `<|tool_call>call:NAME{key:value,…}<tool_call|>` after the reasoning's thought
    channel. Results: `<|tool_response>response:NAME{value:…}<tool_response|>` inside the same model turn,
    the name found from `tool_call_id`; the turn is left open, so the generation prompt adds nothing and
    the model goes on writing its answer right after the results."""
    got, want = both(pairs["gemma4"], CONVERSATIONS["two calls with reasoning awaiting their answer"], tools=TOOLS)
    assert got == want == GEMMA4_SHOWN
