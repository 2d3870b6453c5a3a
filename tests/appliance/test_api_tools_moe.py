"""Tool calls through the real openai SDK on the tiny random Qwen3-MoE and Gemma 4 models with their own
chat templates (Hermes `<tool_call>` JSON; Gemma 4's call syntax), served by a stack of their own. The
models are random, so the schema keeps strings to enums: a required call then always completes."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import Stack

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
TOOL = {
    "type": "function",
    "function": {
        "name": "HassTurnOn",
        "description": "Turns on a device or an area's lights",
        "parameters": {
            "type": "object",
            "properties": {
                "area": {"type": "string", "enum": ["kitchen", "living room"]},
                "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch"]}},
                "brightness": {"type": "integer", "enum": [10, 50, 100]},
            },
            "required": ["area"],
        },
    },
}
ASK = [{"role": "user", "content": "Turn on the kitchen lights"}]


@pytest.fixture(scope="module")
def moe_stack(tmp_path_factory, smollm2_store, moe_text_store, gemma4_store):
    tmp = tmp_path_factory.mktemp("moe-tools")
    models = {}
    for name, src in (("qwen3", moe_text_store), ("gemma4", gemma4_store)):
        shutil.copytree(src, tmp / name)
        shutil.copy(TEMPLATES / f"{name}.jinja", tmp / name / "chat_template.jinja")
        models[f"tiny-{name}"] = tmp / name
    s = Stack(tmp / "stack", smollm2_store, more_models=models)
    try:
        yield s
    finally:
        s.stop()


def _valid(args: dict) -> None:
    import jsonschema

    jsonschema.validate(args, {**TOOL["function"]["parameters"], "additionalProperties": False})


@pytest.mark.slow  # a stack of its own, two models loaded
@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-gemma4"])
def test_a_required_call_on_a_native_template_is_valid_streamed_or_not(moe_stack, model):
    oai = moe_stack.openai()
    kw = dict(model=model, messages=ASK, tools=[TOOL], tool_choice="required", temperature=0.8, seed=2, max_tokens=200)
    r = oai.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "HassTurnOn" and call.id.startswith("call_")
        _valid(json.loads(call.function.arguments))
    with oai.chat.completions.stream(**kw) as stream:  # the SDK's own accumulation of the deltas
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and calls
    for call in calls:
        _valid(json.loads(call.function.arguments))
