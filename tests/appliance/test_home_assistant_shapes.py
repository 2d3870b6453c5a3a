"""Home Assistant's own request shape, replayed with the real `ollama.AsyncClient` against the stack.

Home Assistant's `ollama` integration (homeassistant/components/ollama/entity.py, read 2026-12) calls, per
turn of its tool loop (at most 10 a request):

    await client.chat(model=..., messages=[...], tools=[...], stream=True, keep_alive=-1,
                      options={"num_ctx": 8192}, think=False, format=None)

- tools: one per intent of the house (`HassTurnOn`, `HassTurnOff`, `HassLightSet`, …), each
  {"type": "function", "function": {"name", "parameters", "description"}}, the parameters its intent's slot
  schema turned into an OpenAPI-style JSON schema (name, area, floor strings; domain and device_class
  arrays of strings; HassLightSet's brightness an integer 0-100);
- messages: its system prompt (instructions and the house's exposed devices), the history, the user's
  request; an answer's calls come back as an assistant message whose `tool_calls` have no id, and each
  result as {"role": "tool", "content": <the intent response as JSON>} with neither `tool_call_id` nor
  `tool_name`: results answer the calls in order;
- `keep_alive` -1 (forever) as an integer; `num_ctx` 8192 by default (the user may set 2048-131072);
  `think` the option's value (False by default); `format` a schema only for its AI tasks.

Home Assistant itself needs Python 3.13 or newer; this machine has 3.11, so its integration cannot run
here: the tests replay its calls. The house's tool schemas are written here after that shape, not copied.
They run on a stack of their own at the appliance's default context (4096 tokens): the shared stack's
512 tokens hold neither the house's tools nor its prompt.
"""

import asyncio
import json
from unittest import mock

import jsonschema
import ollama
import pytest

from appliance import processes

MODEL = "smollm2"
TARGET = {
    "name": {"type": "string"},
    "area": {"type": "string"},
    "floor": {"type": "string"},
    "domain": {"type": "array", "items": {"type": "string"}},
    "device_class": {"type": "array", "items": {"type": "string", "enum": ["tv", "speaker", "outlet", "switch"]}},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "HassTurnOn",
            "parameters": {"type": "object", "properties": TARGET, "required": []},
            "description": "Turns on, opens or activates a device or entity.",
        },
    },
    {
        "type": "function",
        "function": {
            "name": "HassTurnOff",
            "parameters": {"type": "object", "properties": TARGET, "required": []},
            "description": "Turns off, closes or deactivates a device or entity.",
        },
    },
    {
        "type": "function",
        "function": {
            "name": "HassLightSet",
            "parameters": {
                "type": "object",
                "properties": {
                    **TARGET,
                    "color": {"type": "string"},
                    "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
                },
                "required": [],
            },
            "description": "Sets the brightness or color of a light.",
        },
    },
]
SYSTEM = (
    "You are a voice assistant for Home Assistant.\n"
    "Answer questions about the world truthfully.\n"
    "Answer in plain text. Keep it simple and to the point.\n"
    "When controlling Home Assistant always call the intent tools. When controlling a device, prefer "
    "passing just name and domain.\n"
    "Static Context: An overview of the areas and the devices in this smart home:\n"
    "- names: Kitchen Light\n  domain: light\n  areas: Kitchen\n"
    "- names: Bedroom Lamp\n  domain: light\n  areas: Bedroom\n"
    "- names: Coffee Maker\n  domain: switch\n  areas: Kitchen\n"
)
DEFAULT_CALL = {"stream": True, "keep_alive": -1, "options": {"num_ctx": 8192}, "think": False, "format": None}


@pytest.fixture(scope="module")
def appliance(stack, smollm2_store, tmp_path_factory):
    """A stack of its own at the appliance's default context (RKMOJO_CONTEXT unset: 4096 tokens)."""
    base_env = processes.base_env

    def default_context(**env):
        env.pop("RKMOJO_CONTEXT", None)
        return base_env(**env)

    with mock.patch.object(processes, "base_env", default_context):
        s = type(stack)(tmp_path_factory.mktemp("home-apps"), smollm2_store)
    try:
        yield s
    finally:
        s.stop()


class House:
    """The integration's client for one test: `turn(messages, **call)` runs one call of its loop."""

    def __init__(self, stack):
        self.stack = stack

    def turn(self, messages: list, tools=TOOLS, **call) -> dict:
        async def one() -> dict:  # a client per event loop, as httpx's async clients are bound to theirs
            c = ollama.AsyncClient(host=self.stack.url, headers={"Authorization": f"Bearer {self.stack.key}"})
            return await turn(c, messages, tools, **call)

        return asyncio.run(one())


async def turn(c: ollama.AsyncClient, messages: list, tools, **call) -> dict:
    """One call, its stream gathered as the integration's `_transform_stream` reads it."""
    content, thinking, calls = [], [], []
    async for chunk in await c.chat(model=MODEL, messages=list(messages), tools=tools, **{**DEFAULT_CALL, **call}):
        message = chunk["message"]
        content.append(message.get("content") or "")
        thinking.append(message.get("thinking") or "")
        calls += [
            {"name": tc["function"]["name"], "arguments": dict(tc["function"]["arguments"])}
            for tc in message.get("tool_calls") or ()
        ]
        last = chunk
    assert last["done"] and last["done_reason"] in ("stop", "length")
    reply = {
        "content": "".join(content),
        "thinking": "".join(thinking),
        "tool_calls": calls,
        "prompt_eval_count": last.get("prompt_eval_count"),
    }
    # an answer that ended by itself says something: text or calls (the tiny model may also run out of context)
    assert reply["content"].strip() or calls or last["done_reason"] == "length"
    return reply


def check_call(call: dict) -> None:
    """A call names one of the house's tools and its arguments validate against that tool's schema."""
    tool = next(t["function"] for t in TOOLS if t["function"]["name"] == call["name"])
    jsonschema.validate(call["arguments"], tool["parameters"])


def test_the_default_options_of_the_integration_are_served(appliance):
    """num_ctx 8192 (the integration's default, above this appliance's 4096) must not refuse the request,
    and the whole prompt (the house's tools and devices) is read. What the tiny model answers at the
    integration's sampling temperature varies: `turn` checks it is an answer, calls or a full context."""
    reply = House(appliance).turn([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}])
    tools_text = sum(len(json.dumps(t)) for t in TOOLS) + len(SYSTEM)
    assert reply["prompt_eval_count"] > tools_text // 6  # far more than the system text alone: tools included


@pytest.mark.slow
def test_a_house_request_goes_through_the_tool_loop_to_a_spoken_answer(appliance):
    """The integration's loop as it runs it: call, act on the calls, send the results back, until an answer."""
    house = House(appliance)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Turn on the kitchen light."}]
    for _ in range(10):  # its MAX_TOOL_ITERATIONS
        reply = house.turn(messages, options={"num_ctx": 4096})
        for call in reply["tool_calls"]:
            check_call(call)
        assistant = {"role": "assistant", "content": reply["content"]}
        if not reply["tool_calls"]:
            return  # the spoken answer (`turn` checked it says something, unless the context ran out)
        assistant["tool_calls"] = [{"function": call} for call in reply["tool_calls"]]
        messages.append(assistant)
        for call in reply["tool_calls"]:  # each result: the intent's response as JSON, nothing naming the call
            messages.append({"role": "tool", "content": json.dumps(intent_response(call))})
    # ten rounds of calls: the integration stops there too, and every round was served


def intent_response(call: dict) -> dict:
    name = call["arguments"].get("name", "the device")
    return {
        "speech": {"plain": {"speech": f"Done: {name}", "extra_data": None}},
        "response_type": "action_done",
        "data": {"success": [{"name": name, "type": "entity"}], "failed": []},
    }


OFF = {"name": "HassTurnOff", "arguments": {"name": "Bedroom Lamp", "domain": ["light"]}}


@pytest.mark.slow
def test_a_tool_result_turn_without_ids_gets_the_final_answer(appliance):
    """History as the integration sends it: a call without an id, its result without tool_call_id or name."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Turn off the bedroom lamp."},
        {"role": "assistant", "content": "", "tool_calls": [{"function": OFF}]},
        {"role": "tool", "content": json.dumps(intent_response(OFF))},
    ]
    reply = House(appliance).turn(messages, options={"num_ctx": 4096})
    for call in reply["tool_calls"]:
        check_call(call)
    assert reply["content"].strip() or reply["tool_calls"]


@pytest.mark.slow
def test_the_house_tools_get_valid_calls_when_the_model_calls_them(appliance):
    """Over three requests (the integration samples at the model's default temperature), the model calls a
    house tool at least once, and every call it makes validates against its tool's schema."""
    house = House(appliance)
    calls = []
    for request in ("Turn on the kitchen light.", "Switch off the coffee maker.", "Dim the bedroom lamp to 30%."):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}]
        calls += house.turn(messages, options={"num_ctx": 4096})["tool_calls"]
    for call in calls:
        check_call(call)
    assert calls, "the model never called a house tool in three requests"


@pytest.mark.slow
def test_the_ai_task_format_gets_a_matching_object(appliance):
    """Home Assistant's AI tasks pass a structure as `format` (a JSON schema) with the same call."""
    schema = {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 60}}, "required": ["summary"]}
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Summarise the house in a sentence."},
    ]
    reply = House(appliance).turn(messages, tools=None, options={"num_ctx": 4096}, format=schema)
    jsonschema.validate(json.loads(reply["content"]), schema)
