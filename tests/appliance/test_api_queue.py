"""One generation at a time per worker: concurrent clients, the queue limit, cancellation by disconnect."""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

PROMPTS = [f"Write one sentence about the number {n}." for n in range(8)]


def chat_stream(client, prompt):
    """The answer of one streaming greedy request, checking that every chunk belongs to it."""
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_eight_concurrent_clients_get_what_each_gets_alone(stack):
    client = stack.openai(max_retries=0, timeout=300)
    alone = {p: chat_stream(client, p) for p in PROMPTS}
    assert len(set(alone.values())) > 1

    def one_client(prompt):
        return [chat_stream(client, prompt) for _ in range(5)]

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(PROMPTS, pool.map(one_client, PROMPTS)))
    elapsed = time.monotonic() - t0
    for prompt, answers in results.items():
        assert answers == [alone[prompt]] * 5, prompt
    print(f"\n40 requests from 8 concurrent clients in {elapsed:.1f} s")


async def _hold(url, key, body, started: asyncio.Event | None = None):
    """A streaming request held open until cancelled (the client goes away)."""
    async with httpx.AsyncClient(timeout=None) as c:
        async with c.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            async for _ in r.aiter_lines():
                if started is not None:
                    started.set()


def test_past_the_queue_limit_it_answers_429_with_retry_after_and_drains_when_clients_leave(stack):
    long = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    client = stack.openai(max_retries=0)
    result = {}

    async def scenario():
        running = asyncio.Event()
        holders = [asyncio.create_task(_hold(stack.url, stack.key, long, running))]
        await asyncio.wait_for(running.wait(), 30)
        holders += [asyncio.create_task(_hold(stack.url, stack.key, long)) for _ in range(8)]
        r = stack.r()
        await asyncio.to_thread(stack.wait_until, lambda: r.zcard("rkmojo:queue:smollm2") == 9, 15)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {stack.key}"}) as c:
            ps = (await c.get(f"{stack.url}/api/ps")).json()
        states = sorted(q["state"] for q in ps["requests"])
        try:
            await asyncio.to_thread(
                client.chat.completions.create,
                model="smollm2",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
            )
        except openai.RateLimitError as e:
            result["error"] = e
        ollama_status = (
            await httpx.AsyncClient().post(
                f"{stack.url}/api/generate",
                json={"model": "smollm2", "prompt": "hi"},
                headers={"Authorization": f"Bearer {stack.key}"},
            )
        ).status_code
        result["ollama"] = ollama_status
        result["states"] = states
        t0 = time.monotonic()
        for h in holders:
            h.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        await asyncio.to_thread(stack.idle, 20)
        result["drain"] = time.monotonic() - t0

    asyncio.run(scenario())
    e = result["error"]
    assert e.status_code == 429 and int(e.response.headers["retry-after"]) >= 1
    assert e.body["code"] == "queue_full"
    assert result["ollama"] == 503
    assert result["states"] == ["running"] + ["waiting"] * 8  # /api/ps shows the queue
    print(f"\n9 held requests (1 running, 8 waiting) drained {result['drain']:.2f} s after their clients left")
    assert result["drain"] < 10
    # the worker is free again
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_a_client_that_disconnects_frees_the_worker_within_one_token(stack):
    client = stack.openai(max_retries=0)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    first = [next(stream) for _ in range(4)]
    rid = first[0].id.removeprefix("chatcmpl-")
    stream.close()
    r = stack.r()

    def final():
        for _, fields in r.xrange(f"rkmojo:events:{rid}"):
            ev = json.loads(fields["e"])
            if ev["t"] == "final":
                return ev

    ev = stack.wait_until(final, 10)
    assert ev["finish_reason"] == "cancelled"
    assert ev["tokens_after_cancel"] <= 1
    per_token = 1 / max(ev["timings"]["decode_tps"], 1e-3)
    print(
        f"\ncancelled after {ev['usage']['completion_tokens']} tokens; the worker saw it "
        f"{ev['cancel_latency'] * 1000:.0f} ms after the disconnect (a token takes {per_token * 1000:.0f} ms)"
    )
    assert ev["usage"]["completion_tokens"] < 400
    stack.idle(5)
