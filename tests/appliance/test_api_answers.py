"""A thinking model's answer with tool calls, as worker events, in each API's shape — without the stack: the
events go through the views' own generators, and the OpenAI chunks through the SDK's own accumulator.

(The demo model neither thinks nor has a native tool format; the engine's tests cover the templates that
do, and test_api_tools.py the generic format end to end.)
"""

import asyncio
import json

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from appliance.events import Delta, Final, ToolCallDelta, ToolCallOut, Usage
from webui.api import ollama, openai
from webui.api.common import Answer

CID = "call_0123456789abcdef01234567"
EVENTS = [
    Delta(text="The user wants ", tokens=3, channel="reasoning"),
    Delta(text="the weather.", tokens=5, channel="reasoning"),
    Delta(text="Let me check.", tokens=9),
    ToolCallDelta(index=0, id=CID, name="get_weather"),
    ToolCallDelta(index=0, id=CID, arguments='{"city": '),
    ToolCallDelta(index=0, id=CID, arguments='"Paris"}'),
    Final(
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=20, completion_tokens=16, reasoning_tokens=5),
        tool_calls=[ToolCallOut(id=CID, name="get_weather", arguments={"city": "Paris"})],
    ),
]


class FakeJob:
    id = "j1"

    async def events(self):
        for ev in EVENTS:
            yield ev

    async def close(self):
        pass


async def _list(agen):
    return [x async for x in agen]


def test_openai_chunks_accumulate_in_the_sdk_to_reasoning_content_and_a_tool_call(monkeypatch):
    async def no_record(*a):
        pass

    monkeypatch.setattr(openai, "record", no_record)
    run = openai._Run("chatcmpl", None, "m", {})
    run.job = FakeJob()
    meta = {"id": "chatcmpl-j1", "created": 0, "model": "m", "system_fingerprint": "rkmojo-a"}
    chunks = asyncio.run(_list(openai._chat_chunks(run, meta, [{}], True, [], False, True)))
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    done = state.get_final_completion()
    msg = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and msg.content == "Let me check."
    assert msg.model_extra["reasoning_content"] == "The user wants the weather."
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        (CID, "get_weather", {"city": "Paris"})
    ]
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}


def test_openai_message_has_null_content_when_the_answer_is_only_calls():
    answer = Answer()
    for ev in EVENTS[3:]:
        answer.add(ev)
    msg = openai._message(answer)
    assert msg["content"] is None and "reasoning_content" not in msg
    assert msg["tool_calls"] == [
        {"id": CID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]


def test_ollama_streams_thinking_apart_and_each_call_whole_in_one_line():
    lines = asyncio.run(_list(ollama._answer(FakeJob(), "m", 0.0, ollama._chat_piece, True)))
    thinking = "".join(line["message"].get("thinking", "") for line in lines)
    content = "".join(line["message"]["content"] for line in lines)
    calls = [line["message"]["tool_calls"] for line in lines if "tool_calls" in line["message"]]
    assert thinking == "The user wants the weather." and content == "Let me check."
    assert calls == [[{"id": CID, "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop"
    whole = asyncio.run(_list(ollama._answer(FakeJob(), "m", 0.0, ollama._chat_piece, False)))
    assert len(whole) == 1 and whole[0]["message"]["thinking"] == thinking
    assert whole[0]["message"]["tool_calls"] == calls[0]
    generated = asyncio.run(_list(ollama._answer(FakeJob(), "m", 0.0, ollama._generate_piece, False)))
    assert generated[0]["thinking"] == thinking and generated[0]["response"] == content
