"""Workers: one killed (SIGKILL) or stopped (SIGTERM) mid-stream and restarted; several boards behind one API."""

import os
import signal
import time

import openai
import pytest


def streaming(stack):
    """A client and a long streaming answer it has started to read."""
    client = stack.openai(max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    for _ in range(3):
        next(stream)
    return client, stream


def test_a_worker_killed_mid_stream_gives_an_error_not_a_hang_and_its_restart_serves(stack):
    client, stream = streaming(stack)
    old = stack.workers["board-a"]
    os.kill(old.pid, signal.SIGKILL)
    old.proc.wait()
    t0 = time.monotonic()
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    noticed = time.monotonic() - t0
    assert "board-a" in str(e.value.message) and "retry" in e.value.message
    print(f"\nthe client got its error {noticed:.1f} s after the worker was killed")
    assert noticed < 10

    new = stack.start_worker("board-a", stack.env, wait=False)
    # sent while no worker runs: it waits in the queue for the restarted worker
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    assert r.usage.completion_tokens >= 1
    stack.wait_registered("board-a", new)
    oll = stack.ollama()
    assert oll.chat(model="smollm2", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2}).done


def test_two_workers_with_two_stores_serve_their_own_model_behind_one_api(stack, tmp_path):
    data = tmp_path / "board-b"
    (data / "models").mkdir(parents=True)
    (data / "logs").mkdir()
    (data / "models" / "smollm2-b").symlink_to(stack.store)
    env = {**stack.env, "RKMOJO_DATA": str(data), "RKMOJO_PRELOAD": "smollm2-b"}
    b = stack.start_worker("board-b", env)
    try:
        oai = stack.openai()
        ids = {m.id for m in oai.models.list()}
        assert {"smollm2", "smollm2-b"} <= ids
        assert {"smollm2", "smollm2-b"} <= {m.model for m in stack.ollama().list().models}
        for model, board in (("smollm2", "board-a"), ("smollm2-b", "board-b")):
            r = oai.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
            )
            assert r.system_fingerprint == f"rkmojo-{board}" and r.model == model
        loaded = {m.model: m for m in stack.ollama().ps().models}
        assert {"smollm2", "smollm2-b"} <= set(loaded)
    finally:
        b.stop()
        del stack.workers["board-b"]
    # a stopped worker unregisters: its model leaves the lists
    stack.wait_until(lambda: "smollm2-b" not in {m.id for m in stack.openai().models.list()}, 10)
    with pytest.raises(openai.NotFoundError):
        stack.openai().chat.completions.create(model="smollm2-b", messages=[{"role": "user", "content": "hi"}])


def test_a_worker_stopped_with_sigterm_mid_stream_ends_the_stream_with_an_error_at_once(stack):
    client, stream = streaming(stack)
    old = stack.workers["board-a"]
    t0 = time.monotonic()
    old.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    noticed = time.monotonic() - t0
    assert "stopping" in e.value.message
    assert old.proc.wait(15) == 0
    print(
        f"\nthe client got its error {noticed:.2f} s after SIGTERM; the worker exited "
        f"{time.monotonic() - t0:.1f} s after it"
    )
    assert noticed < 2
    stack.start_worker("board-a", stack.env)
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens >= 1
