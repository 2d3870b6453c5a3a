"""Issue 46's loose ends on the real stack: a known model while its worker re-registers is a 503 with
Retry-After, not a 404; a pull URL that names no file is a 400; verify reports its groups and its result,
and the model page remembers it; the model page names both context figures."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from appliance.events import Error, Final, Progress, Start
from test_board_tasks import run_board_task

ASK = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.slow  # ~20 s: a stack of its own, whose Redis restarts
def test_after_redis_restarts_the_installed_model_is_503_with_retry_after_until_its_worker_registers(
    stack, smollm2_store, tmp_path
):
    import httpx

    from appliance import processes

    own = type(stack)(tmp_path / "own", smollm2_store)  # the session's stack keeps its Redis
    try:
        with httpx.Client(base_url=own.url, headers={"Authorization": f"Bearer {own.key}"}, timeout=60) as c:
            assert c.post("/v1/chat/completions", json=ASK).status_code == 200
            own.redis.stop()
            argv, _ = processes.redis_argv(own.data)  # no persistence: it comes back empty
            own.redis = processes.Child("redis", argv, processes.base_env(), own.data / "logs" / "redis.log").start()
            processes.wait_for(lambda: processes.redis_ready(own.redis_url), 10, "redis-server", child=own.redis)
            answers, deadline = [], time.monotonic() + 30
            while time.monotonic() < deadline:
                r = c.post("/v1/chat/completions", json=ASK)
                answers.append((r.status_code, r.headers.get("Retry-After"), r.json().get("error", {}).get("code")))
                if r.status_code == 200:
                    break
                time.sleep(0.05)
        statuses = [a[0] for a in answers]
        assert statuses[-1] == 200 and 404 not in statuses, answers
        assert all(a[1] and a[1].isdigit() for a in answers if a[0] == 503), answers
        assert ("model_unavailable" in {a[2] for a in answers}) or statuses == [200], answers
        print(f"\nafter the restart: {statuses.count(503)} answers 503, then 200")
    finally:
        own.stop()


def test_a_model_listed_lately_stays_known_until_its_workers_register_without_it(stack, django_for_stack, monkeypatch):
    from appliance import bus
    from webui.api import jobs
    from webui.api.common import ApiError

    listed = [{"name": "board-z", "models": [{"name": "elsewhere"}]}]

    async def workers(r):
        return listed

    monkeypatch.setattr(bus, "workers", workers)

    async def find():
        try:
            await jobs.find_model("elsewhere")
        except ApiError as e:
            return e.status

    asyncio.run(jobs.catalog())  # a remote board's model, not in this machine's models directory
    listed[:] = []  # no registration now
    monkeypatch.setattr(jobs, "RESTART_WINDOW", 0)  # and Redis did not restart: its worker stopped
    assert asyncio.run(find()) == 404
    monkeypatch.setattr(jobs, "RESTART_WINDOW", 10**9)  # Redis restarted: its worker has not registered yet
    assert asyncio.run(find()) == 503
    stack.r().set(bus.k_gone("board-z"), "elsewhere-host", ex=60)  # it stopped cleanly since
    try:
        assert asyncio.run(find()) == 404
    finally:
        stack.r().delete(bus.k_gone("board-z"))
    listed[:] = [{"name": "board-z", "models": []}]  # it registered again without it: deleted meanwhile
    assert asyncio.run(find()) == 404


@pytest.mark.parametrize("url", ["https://example.com/models/", "https://example.com"])
def test_a_pull_url_that_names_no_file_is_a_400_saying_so(http, url):
    r = http.post("/api/pull", json={"model": url, "stream": False})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == f"{url}: the URL names no file; give the .gguf file's URL"


def staff_page(path: str) -> str:
    from django.contrib.auth import get_user_model
    from django.test import Client

    staff, _ = get_user_model().objects.update_or_create(username="loose-ends-staff", defaults={"is_staff": True})
    c = Client(HTTP_HOST="127.0.0.1")
    c.force_login(staff)
    r = c.get(path)
    assert r.status_code == 200
    return r.content.decode()


def test_verify_reports_each_group_and_its_result_and_the_model_page_keeps_it(django_for_stack, stack):
    t0 = time.time()
    events = run_board_task("rkmojo.verify", "board-a", {"name": "smollm2"})
    assert isinstance(events[0], Start) and isinstance(events[-1], Final)
    statuses = [e.status for e in events if isinstance(e, Progress)]
    assert statuses[0] == "verifying dense tensors"
    assert statuses[-1].startswith("verified: ") and "tensors match their digests" in statuses[-1]
    models = stack.registration("board-a")["models"]
    verified = next(m for m in models if m["name"] == "smollm2")["verified"]
    assert verified["ok"] is True and verified["at"] >= t0 and verified["message"] == statuses[-1]
    page = staff_page("/panel/models/smollm2/")
    assert "Last verified" in page and ">OK</span>" in page and statuses[-1] in page


def test_verify_names_the_first_bad_tensor_and_the_page_says_it_failed(django_for_stack, stack, tmp_path):
    broken = stack.data / "models" / "smollm2-broken"
    shutil.copytree(stack.store, broken)
    try:
        with open(broken / "dense.bin", "r+b") as f:  # a flipped byte in the first tensor
            f.seek(64)
            b = f.read(1)
            f.seek(64)
            f.write(bytes([b[0] ^ 0xFF]))
        events = run_board_task("rkmojo.verify", "board-a", {"name": "smollm2-broken"})
        assert isinstance(events[-1], Error) and events[-1].status == 422
        assert "dense tensor" in events[-1].message and "digest mismatch" in events[-1].message
        page = staff_page("/panel/models/smollm2-broken/")
        assert ">failed</span>" in page and "digest mismatch" in page
    finally:
        run_board_task("rkmojo.delete", "board-a", {"name": "smollm2-broken"})
        shutil.rmtree(broken, ignore_errors=True)


def test_the_model_page_names_the_configured_context_and_the_model_s_maximum(django_for_stack, stack):
    from webui.api.jobs import context_of

    page = staff_page("/panel/models/smollm2/")
    assert "512 tokens" in page and "configured 512" in page and "the model's maximum 8192" in page
    reg = stack.registration("board-a")
    desc = next(m for m in reg["models"] if m["name"] == "smollm2")
    ctx = context_of(reg, desc)
    assert (ctx.configured, ctx.model, ctx.tokens) == (512, 8192, 512)
