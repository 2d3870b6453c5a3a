"""Several conversations at once through the real stack: a worker with RKMOJO_PARALLEL=4 (a pool of threads,
the model's batcher stepping their generations together, `inference.batch`), the `openai` SDK as the client.

- Four streams at once get the answers they get one after another (greedy), and the worker really ran
  them together (its live-view counter of generations at once reached 4).
- A streamed chat sent while three long background requests run starts streaming before any of them ends.
"""

import threading
import time

import pytest

from conftest import MODEL, Stack

QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "Write one sentence about the sea.",
    "What is two plus two?",
]


@pytest.fixture(scope="module")
def parallel(smollm2_store, tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("parallel"), smollm2_store, RKMOJO_PARALLEL="4", RKMOJO_THREADS="2")
    try:
        yield s
    finally:
        s.stop()


def _stream(client, question: str, max_tokens: int = 40) -> str:
    parts = []
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        stream=True,
        temperature=0,
        max_tokens=max_tokens,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def _most_active(stack: Stack, stop: threading.Event, seen: list) -> None:
    while not stop.is_set():
        reg = stack.registration("board-a") or {}
        seen.append(int(reg.get("active") or 0))
        time.sleep(0.02)


def test_four_streams_at_once_get_the_answers_they_get_one_after_another(parallel):
    client = parallel.openai()
    serial = [_stream(client, q) for q in QUESTIONS]
    assert all(serial)
    answers: list = [None] * len(QUESTIONS)
    seen: list = []
    stop = threading.Event()
    watcher = threading.Thread(target=_most_active, args=(parallel, stop, seen))
    watcher.start()

    def one(i: int) -> None:
        answers[i] = _stream(parallel.openai(), QUESTIONS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    watcher.join()
    assert answers == serial
    assert max(seen) >= 2, f"the worker never ran two generations at once (active: {sorted(set(seen))})"


def test_a_streamed_chat_starts_while_background_requests_run(parallel):
    """Three non-streamed requests with large max_tokens (background), then a streamed chat: its first text
    arrives while all three are still generating."""
    ended: list = []

    def background(i: int) -> None:
        parallel.openai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Write a long story about a dragon number {i}."}],
            temperature=0.8,
            seed=i,
            max_tokens=300,
            logit_bias={"2": -100},  # the demo model's end of text: each runs its 300 tokens
        )
        ended.append(time.monotonic())

    threads = [threading.Thread(target=background, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    parallel.wait_until(lambda: int((parallel.registration("board-a") or {}).get("active") or 0) >= 3, 30)
    first = None
    for chunk in parallel.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True, temperature=0, max_tokens=8
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic()
            break
    for t in threads:
        t.join(300)
    assert first is not None
    assert len(ended) == 3 and first < min(ended), "the chat waited for a background request to end"


def test_a_chat_page_answer_streams_while_background_requests_run(stack, socket_of, smollm2_store, tmp_path):
    """The chat page's socket (the Channels consumer) on a worker with four slots, while three long
    non-streamed requests run on it: the answer's first text arrives before any of them ends."""
    import asyncio

    data = tmp_path / "board-par"
    (data / "models").mkdir(parents=True)
    (data / "logs").mkdir()
    (data / "models" / "smollm2-par").symlink_to(smollm2_store)
    env = {**stack.env, "RKMOJO_DATA": str(data), "RKMOJO_PRELOAD": "smollm2-par", "RKMOJO_PARALLEL": "4"}
    worker = stack.start_worker("board-par", env)
    ended: list = []

    def background(i: int) -> None:
        stack.openai().chat.completions.create(
            model="smollm2-par",
            messages=[{"role": "user", "content": f"Write a long story, part {i}."}],
            max_tokens=300,
            logit_bias={"2": -100},
        )
        ended.append(time.monotonic())

    async def first_text() -> float:
        ws = socket_of("chatter")
        assert (await ws.connect())[0]
        await ws.send_json_to({"action": "send", "text": "hi", "new": {"model": "smollm2-par", "max_tokens": 8}})
        while True:
            ev = await ws.receive_json_from(timeout=60)
            assert ev["t"] != "error", ev
            if ev["t"] == "delta":
                at = time.monotonic()
                break
        while ev["t"] != "final":
            ev = await ws.receive_json_from(timeout=60)
        await ws.disconnect()
        return at

    threads = [threading.Thread(target=background, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        stack.wait_until(lambda: int((stack.registration("board-par") or {}).get("active") or 0) >= 3, 30)
        first = asyncio.run(first_text())
        for t in threads:
            t.join(300)
        assert len(ended) == 3 and first < min(ended), "the chat page's answer waited for a background request"
    finally:
        worker.stop()
        stack.workers.pop("board-par", None)


def test_past_its_slots_and_queue_a_parallel_worker_answers_429_with_retry_after(smollm2_store, tmp_path_factory):
    """Two slots and a queue of one: three requests are admitted (two run, one waits), the fourth gets 429."""
    import openai

    s = Stack(tmp_path_factory.mktemp("par-queue"), smollm2_store, RKMOJO_PARALLEL="2", RKMOJO_QUEUE_LIMIT="1")
    try:
        done: list = []

        def long(i: int) -> None:
            s.openai().chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"A long story {i}."}],
                max_tokens=300,
                logit_bias={"2": -100},
            )
            done.append(i)

        threads = [threading.Thread(target=long, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        s.wait_until(lambda: int(s.r().zcard("rkmojo:queue:" + MODEL)) >= 3, 30)
        with pytest.raises(openai.RateLimitError) as refused:
            s.openai(max_retries=0).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert refused.value.response.headers.get("retry-after")
        assert "3 requests running or waiting" in str(refused.value)
        for t in threads:
            t.join(300)
        assert sorted(done) == [0, 1, 2]
    finally:
        s.stop()
