"""Context management at the worker (`appliance.tasks._fit`): with `truncate: "oldest_turns"` a conversation
longer than the stack's 512-token context is answered from its newest turns, the system prompt kept, and
`Start.dropped_messages` says how many were left out; without it the same prompt is refused."""

import asyncio

from appliance.events import Error, Final, Start


def run_job(payload: dict) -> list:
    from webui.api.jobs import Job

    async def scenario():
        job = await Job.submit("rkmojo.generate", "smollm2", {"model": "smollm2", **payload})
        try:
            return [ev async for ev in job.events()]
        finally:
            await job.close()

    return asyncio.run(scenario())


SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def long_conversation(turns: int) -> list[dict]:
    out = [SYSTEM]
    for i in range(turns):
        out.append({"role": "user", "content": f"Question {i}: " + " ".join(f"word{j}" for j in range(20))})
        out.append({"role": "assistant", "content": f"Answer {i}: " + " ".join(f"reply{j}" for j in range(20))})
    return out + [{"role": "user", "content": "And the last question?"}]


def test_an_overlong_conversation_is_answered_from_its_newest_turns(django_for_stack, stack):
    msgs = long_conversation(12)  # ~1200 tokens
    params = {"temperature": 0, "max_tokens": 16}
    evs = run_job({"kind": "chat", "messages": msgs, "params": params, "truncate": "oldest_turns"})
    start, final = next(e for e in evs if isinstance(e, Start)), evs[-1]
    assert isinstance(final, Final), final
    assert start.dropped_messages and start.dropped_messages % 2 == 0  # whole turns: a question and its answer
    assert start.prompt_tokens + 16 <= 512 and final.usage.prompt_tokens == start.prompt_tokens
    kept = [SYSTEM] + msgs[1 + start.dropped_messages :]
    evs2 = run_job({"kind": "chat", "messages": kept, "params": params})
    assert next(e for e in evs2 if isinstance(e, Start)).prompt_tokens == start.prompt_tokens  # system prompt kept
    # one turn fewer left out would not fit: only what was needed was dropped
    one_more = [SYSTEM] + msgs[1 + start.dropped_messages - 2 :]
    refused = run_job({"kind": "chat", "messages": one_more, "params": params})[-1]
    assert isinstance(refused, Error) or refused.usage.prompt_tokens + 16 > 512


def test_without_truncate_the_same_conversation_is_refused(django_for_stack, stack):
    final = run_job({"kind": "chat", "messages": long_conversation(12), "params": {"max_tokens": 16}})[-1]
    assert isinstance(final, Error) and final.status == 400 and final.code == "context_length_exceeded"


def test_a_conversation_that_fits_is_sent_whole(django_for_stack, stack):
    evs = run_job(
        {"kind": "chat", "messages": long_conversation(1), "params": {"max_tokens": 8}, "truncate": "oldest_turns"}
    )
    assert next(e for e in evs if isinstance(e, Start)).dropped_messages is None and isinstance(evs[-1], Final)
