"""Interactive requests before background ones (`webui.api.priority`): which is which, and the stack's one
worker taking a streamed answer before a background request that waited longer, through the real Celery
queue; the queue positions count what goes first."""

import asyncio
import threading
import time

import pytest
from test_open_webui_shapes import task_prompt

from webui.api.priority import BACKGROUND, INTERACTIVE, of

EOS_BANNED = {"2": -100}  # SmolLM2's <|im_end|>: the answer runs to its max tokens
LONG_RUN = {"temperature": 0, "max_tokens": 400, "logit_bias": EOS_BANNED}
LONG_RUN_SDK = {"temperature": 0, "max_tokens": 400, "logit_bias": EOS_BANNED}


def chat(text: str, **params) -> dict:
    return {"kind": "chat", "messages": [{"role": "user", "content": text}], "params": params}


@pytest.mark.parametrize(
    "payload, streamed, expected",
    [
        (chat("hi"), True, INTERACTIVE),  # a streamed answer: someone watches it
        (chat("hi"), False, BACKGROUND),  # not streamed, no limit: may run to the context's end
        (chat("hi", max_tokens=1000), False, BACKGROUND),
        (chat("hi", max_tokens=64), False, INTERACTIVE),  # a short answer
        (chat("turn the light on", tools=[{"type": "function", "function": {"name": "light"}}]), False, INTERACTIVE),
        (
            {"kind": "chat", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "ok"}]},
            False,
            INTERACTIVE,  # a tool-call turn: the answer from the tool's result
        ),
        (chat(task_prompt("title"), max_tokens=1000), True, BACKGROUND),
        ({"kind": "embed", "input": ["a"]}, False, INTERACTIVE),
    ],
)
def test_which_requests_are_background_work(payload, streamed, expected):
    assert of(payload, streamed=streamed) == expected


def claimed_at(stack, rid: str) -> float:
    return float(stack.r().get(f"rkmojo:claimed:{rid}"))


def test_a_streamed_answer_goes_before_a_background_request_that_waited_longer(stack, django_for_stack):
    from webui.api.jobs import Job

    async def scenario():
        running = await Job.submit(
            "rkmojo.generate", "smollm2", {"model": "smollm2", **chat("Tell a story.", **LONG_RUN)}
        )
        await running.started()  # the worker is busy with it
        waiting = await Job.submit(
            "rkmojo.generate",
            "smollm2",
            {"model": "smollm2", **chat("Another story.", **LONG_RUN)},
            priority=BACKGROUND,
        )
        await asyncio.sleep(0.3)
        watched = await Job.submit("rkmojo.generate", "smollm2", {"model": "smollm2", **chat("Hi.", max_tokens=4)})
        positions = {}
        for name, job in (("waiting", waiting), ("watched", watched)):
            async for ev in job.events(statuses=True):
                positions[name] = ev.position
                break
        done = []
        try:
            for job in (running, watched, waiting):
                async for ev in job.events():
                    last = ev
                done.append(last)
        finally:
            for job in (running, waiting, watched):
                await job.close()
        return positions, [j.id for j in (running, waiting, watched)], done

    positions, (running, waiting, watched), done = asyncio.run(scenario())
    assert all(type(ev).__name__ == "Final" for ev in done), done
    # the streamed one went ahead: one request (the running one) before it, two before the background one
    assert positions == {"waiting": 2, "watched": 1}
    assert claimed_at(stack, running) < claimed_at(stack, watched) < claimed_at(stack, waiting)


def test_through_the_apis_a_background_request_waits_for_a_streamed_one(stack, oai):
    """The openai SDK: a non-streamed request for 400 tokens sent before a streamed one is served after it
    while the worker is busy (a response's id is its request's)."""
    story = [{"role": "user", "content": "A story."}]
    first = threading.Thread(
        target=lambda: oai.chat.completions.create(model="smollm2", messages=story, **LONG_RUN_SDK)
    )
    first.start()
    stack.wait_until(lambda: stack.registration("board-a").get("running"), timeout=30)  # the worker is busy
    got = {}
    background = threading.Thread(
        target=lambda: got.setdefault(
            "background",
            oai.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "More."}], **LONG_RUN_SDK
            ),
        )
    )
    background.start()
    stack.wait_until(lambda: stack.r().zcard("rkmojo:queue:smollm2") == 2)
    time.sleep(0.3)
    stream = oai.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi."}], max_tokens=4, temperature=0, stream=True
    )
    chunks = list(stream)
    background.join(120)
    first.join(120)
    streamed_id = chunks[0].id.removeprefix("chatcmpl-")
    background_id = got["background"].id.removeprefix("chatcmpl-")
    assert claimed_at(stack, streamed_id) < claimed_at(stack, background_id)
