"""Tool calls, JSON formats and thinking at the engine (inference.structured): on the demo model (generic
format), the tiny random Qwen3-MoE with Qwen3's template (Hermes calls, <think>), and the tiny random
Gemma 4 with Gemma 4's template (its own call syntax). The random models write nonsense, so the schemas
here keep their strings to enums: what a grammar allows is then finite and every answer completes."""

import json
import shutil
from pathlib import Path

import pytest

from inference.engine import Engine
from inference.generate import TextDelta, ToolCallDelta
from inference.structured import StructureError
from inference.structured.families import GEMMA4, HERMES, Family, parse_call
from inference.structured.stream import OutputParser

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}
LIGHT = {
    "type": "function",
    "function": {
        "name": "HassTurnOn",
        "parameters": {
            "type": "object",
            "properties": {"domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch"]}}},
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _with_template(src: Path, tmp: Path, name: str) -> Path:
    out = tmp / name
    shutil.copytree(src, out)
    shutil.copy(TEMPLATES / f"{name}.jinja", out / "chat_template.jinja")
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory, smollm2_store, moe_text_store, gemma4_store):
    tmp = tmp_path_factory.mktemp("structured")
    opened = {
        "smollm2": Engine.open(smollm2_store),
        "qwen3": Engine.open(_with_template(moe_text_store, tmp, "qwen3")),
        "gemma4": Engine.open(_with_template(gemma4_store, tmp, "gemma4")),
    }
    yield opened
    for e in opened.values():
        e.close()


def _run(engine, messages=ASK, **params):
    events = list(engine.chat(messages, {"temperature": 0.8, "seed": 3, "max_tokens": 120, **params}))
    return events, events[-1]


def _valid(args: dict, tool: dict) -> None:
    import jsonschema

    jsonschema.validate(args, {**tool["function"]["parameters"], "additionalProperties": False})


@pytest.mark.parametrize("model", ["smollm2", "qwen3", "gemma4"])
def test_a_required_tool_call_is_valid_against_its_schema(engines, model):
    events, final = _run(engines[model], tools=[WEATHER, LIGHT], tool_choice="required")
    assert final.finish_reason == "tool_calls"
    assert final.tool_calls and final.text == ""
    for call in final.tool_calls:
        _valid(call.arguments, WEATHER if call.name == "get_weather" else LIGHT)
    # the deltas of each call: id and name first, then pieces that concatenate to its arguments
    for i, call in enumerate(final.tool_calls):
        deltas = [e for e in events if isinstance(e, ToolCallDelta) and e.index == i]
        assert deltas[0].name == call.name and all(d.id == call.id for d in deltas)
        assert json.loads("".join(d.arguments for d in deltas)) == call.arguments


@pytest.mark.parametrize("model", ["smollm2", "qwen3", "gemma4"])
def test_a_named_function_is_the_one_called(engines, model):
    _, final = _run(
        engines[model], tools=[WEATHER, LIGHT], tool_choice={"type": "function", "function": {"name": "HassTurnOn"}}
    )
    assert [c.name for c in final.tool_calls][:1] == ["HassTurnOn"]


@pytest.mark.parametrize("model", ["qwen3", "gemma4"])
def test_without_parallel_calls_the_answer_ends_after_one(engines, model):
    _, final = _run(engines[model], tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert len(final.tool_calls) == 1 and final.finish_reason == "tool_calls"


@pytest.mark.parametrize("model", ["smollm2", "qwen3", "gemma4"])
def test_a_json_schema_format_gives_json_that_validates(engines, model):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    _, final = _run(engines[model], format=schema, think=False if model != "smollm2" else None)
    jsonschema.validate(json.loads(final.text), schema)


def test_the_demo_model_answers_in_the_generic_format_and_the_answer_is_content(engines):
    events, final = _run(engines["smollm2"], tools=[WEATHER], temperature=0, max_tokens=400)
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert streamed == final.text
    assert final.tool_calls or final.text  # either a call or an answer, never the raw JSON
    assert not final.text.startswith("{")


def test_a_tool_result_turn_renders_and_answers(engines):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    for name in ("smollm2", "qwen3", "gemma4"):
        _, final = _run(engines[name], messages, tools=[WEATHER], max_tokens=8)
        assert final.usage.prompt_tokens > 0


def test_thinking_on_puts_the_reasoning_apart_from_the_answer():
    p = OutputParser(Family("hermes", "<tool_call>", "</tool_call>", ("<think>", "</think>"), True), tools=True)
    text = '<think>\nThe user wants\n the weather.\n</think>\n\nLet me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events = []
    for i in range(0, len(text), 3):  # any split of the text gives the same events
        events += p.feed(text[i : i + 3])
    events += p.finish()
    assert (
        "".join(e.text for e in events if isinstance(e, TextDelta) and e.channel == "reasoning")
        == "The user wants\n the weather."
    )
    assert "".join(e.text for e in events if isinstance(e, TextDelta) and e.channel == "content") == "Let me check."
    assert [(c.name, c.arguments) for c in p.calls] == [("get_weather", {"city": "Paris"})]


def test_a_thinking_model_never_leaks_its_reasoning_into_the_content(engines):
    events, final = _run(engines["qwen3"], think=True, max_tokens=40)
    assert "<think>" not in final.text and "</think>" not in final.text
    assert all("<think>" not in e.text for e in events if isinstance(e, TextDelta))


def test_think_false_closes_the_thinking_block_in_the_template(engines):
    ids = engines["qwen3"].chat_prompt(ASK, {"think": False})
    assert engines["qwen3"].tokenizer.decode(ids, skip_special_tokens=False).endswith("<think>\n\n</think>\n\n")
    ids = engines["gemma4"].chat_prompt(ASK, {"think": True})
    assert "<|think|>" in engines["gemma4"].tokenizer.decode(ids, skip_special_tokens=False)


def test_think_on_a_template_without_thinking_names_the_field(engines):
    with pytest.raises(StructureError) as e:
        _run(engines["smollm2"], think=True)
    assert e.value.field == "think"


def test_gemma4_call_syntax_reads_back_as_json_arguments():
    body = 'call:HassTurnOn{area:<|"|>Kitchen, left<|"|>,brightness:40,domain:[<|"|>light<|"|>],on:true}'
    assert parse_call(GEMMA4, body) == (
        "HassTurnOn",
        {"area": "Kitchen, left", "brightness": 40, "domain": ["light"], "on": True},
    )
    assert parse_call(HERMES, '{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}') == ("f", {"a": [1, {"b": "}"}]})


@pytest.mark.parametrize(
    "params, field",
    [
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": "frob"}}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"format": {"type": "object", "properties": {"a": {"if": {}, "then": {}}}}}, "format"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        ({"logit_bias": {"999999": 5}}, "logit_bias"),
    ],
)
def test_bad_structure_is_refused_before_any_compute_naming_the_field(engines, params, field):
    with pytest.raises(StructureError) as e:
        engines["smollm2"].chat(ASK, params)
    assert e.value.field == field
    assert str(e.value)


def test_an_unsupported_keyword_in_gemma4_syntax_is_named(engines):
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}},
        },
    }
    with pytest.raises(StructureError, match="pattern"):
        engines["gemma4"].chat(ASK, {"tools": [tool], "tool_choice": "required"})


def test_logit_bias_moves_a_greedy_answer(engines):
    e = engines["smollm2"]
    target = e.tokenizer.encode(" banana", add_special_tokens=False)[0]
    _, final = _run(e, temperature=0, max_tokens=1, logit_bias={str(target): 100})
    assert final.text.strip() == "banana"


def test_a_lazy_call_grammar_starts_at_the_opening_marker(engines):
    """Free text first, then the grammar from `<tool_call>` on: the next token must continue the call."""
    from inference.sampler import SamplingParams
    from inference.structured import Plan

    e = engines["qwen3"]
    plan = Plan(e.grammars, e.family, e.tokenizer, SamplingParams(tools=[WEATHER]), chat=True)
    ids = e.tokenizer.encode("Sure, checking.<tool_call>", add_special_tokens=False)
    for t in ids[:-1]:
        plan.accept(t)
        assert plan.active is None
    plan.accept(ids[-1])
    assert plan.active is not None
    import numpy as np

    logits = np.zeros(e.model.args.vocab_size, np.float32)
    plan.mask(logits)
    allowed = [e.tokenizer.decode([int(i)]) for i in np.nonzero(np.isfinite(logits))[0]]
    assert allowed and all('\n{"name": "get_weather", "arguments": '.startswith(a) for a in allowed)


@pytest.mark.parametrize("mostly_allowed", [True, False])
def test_the_mask_refuses_exactly_the_tokens_the_grammar_refuses(mostly_allowed):
    """The word-wise mask against a plain boolean unpacking of llguidance's bitmask."""
    import numpy as np

    from inference.structured.grammar import Constraint

    rng = np.random.default_rng(int(mostly_allowed))
    n = 1000 + 17
    bits = np.full((n + 31) // 32, -1 if mostly_allowed else 0, np.int32)
    bits[rng.integers(len(bits), size=5)] = rng.integers(-(2**31), 2**31 - 1, size=5)

    class Matcher:  # llguidance's matcher as the constraint calls it: the mask is written into `bits`
        def unsafe_compute_mask_ptr(self, ptr, nbytes):
            pass

        def is_accepting(self):
            return False

    c = Constraint(Matcher(), n, [0])
    c._bits[:] = bits
    logits = rng.random(n).astype(np.float32)
    want = logits.copy()
    want[~np.unpackbits(bits.view(np.uint8), bitorder="little", count=n).view(bool)] = -np.inf
    c.apply(logits)
    assert np.array_equal(logits, want)


def test_objects_that_do_not_mention_extra_keys_are_closed_at_every_depth():
    from inference.structured.families import closed

    inner = {"type": "object", "properties": {"a": {"type": "string"}}}
    schema = {
        "type": "object",
        "properties": {"x": inner, "list": {"type": "array", "items": inner}, "either": {"anyOf": [inner]}},
        "$defs": {"d": inner},
    }
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["x"]["additionalProperties"] is False
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert out["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in inner  # the caller's schema is left as it was
    kept = closed({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}})
    assert kept["additionalProperties"] == {"type": "integer"}


@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
def test_a_format_that_does_not_mention_extra_keys_gets_only_its_own(engines, model):
    """The random models write keys at will where a grammar lets them: here it must not."""
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "inner": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}},
        },
        "required": ["ok", "inner"],
    }
    for seed in range(3):
        _, final = _run(
            engines[model], format=schema, think=False if model != "smollm2" else None, seed=seed, temperature=1.0
        )
        obj = json.loads(final.text)
        assert set(obj) == {"ok", "inner"} and set(obj["inner"]) <= {"n"}
