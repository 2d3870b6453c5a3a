"""The chat page's defaults (Settings: chat_max_tokens, chat_repetition_guard) as the worker applies them from
a request's payload: for what the conversation leaves unset, the answer cap fitted to the context left."""

import asyncio

import pytest

from appliance.events import Error, Final
from appliance.tunables import SERVICE, chat_defaults

LOOPING = "The cat sat on the mat. " * 12  # the demo model goes on saying it
PAGE = chat_defaults({"chat_max_tokens": 1024, "chat_repetition_guard": True})


def run_job(payload: dict) -> Final | Error:
    from webui.api.jobs import Job

    async def scenario():
        job = await Job.submit("rkmojo.generate", "smollm2", {"model": "smollm2", **payload})
        try:
            return [ev async for ev in job.events()][-1]
        finally:
            await job.close()

    return asyncio.run(scenario())


def test_the_settings_give_the_payload_its_defaults_and_refuse_nonsense():
    assert PAGE == {"repetition_guard": True, "max_tokens": 1024}
    assert chat_defaults({"chat_max_tokens": 0, "chat_repetition_guard": False}) == {"repetition_guard": False}
    assert SERVICE["chat_max_tokens"].default == 1024 and SERVICE["chat_repetition_guard"].default is True
    assert SERVICE["chat_max_tokens"].parse("2048") == 2048 and SERVICE["chat_repetition_guard"].parse("off") is False
    with pytest.raises(ValueError):
        SERVICE["chat_max_tokens"].parse("-1")


def test_the_page_s_repetition_guard_stops_a_loop_unless_the_conversation_turns_it_off(django_for_stack, stack):
    final = run_job({"kind": "complete", "prompt": LOOPING, "params": {"temperature": 0}, "defaults": PAGE})
    assert isinstance(final, Final) and final.finish_reason == "repetition"
    assert 128 <= final.usage.completion_tokens < 140
    own = {"temperature": 0, "repetition_guard": False, "max_tokens": 150}
    final = run_job({"kind": "complete", "prompt": LOOPING, "params": own, "defaults": PAGE})
    assert final.finish_reason == "length" and final.usage.completion_tokens == 150


def test_the_page_s_answer_length_is_a_cap_that_fits_the_context_left(django_for_stack, stack):
    long = " ".join(f"item {i}" for i in range(100))  # ~470 of the stack's 512 tokens
    msgs = [{"role": "user", "content": long + " Count on."}]
    final = run_job({"kind": "chat", "messages": msgs, "params": {"temperature": 0}, "defaults": PAGE})
    assert isinstance(final, Final), final
    assert final.usage.prompt_tokens > 400 and final.usage.prompt_tokens + final.usage.completion_tokens <= 512
    small = {**PAGE, "max_tokens": 5}
    final = run_job({"kind": "chat", "messages": msgs, "params": {"temperature": 0}, "defaults": small})
    assert final.finish_reason == "length" and final.usage.completion_tokens == 5
    # an explicit max_tokens that does not fit is refused, as the APIs refuse it
    final = run_job({"kind": "chat", "messages": msgs, "params": {"temperature": 0, "max_tokens": 1024}})
    assert isinstance(final, Error) and final.status == 400 and "exceeds the context of 512" in final.message
