"""The admin panel in Chromium against the real stack: a pull from a Range-serving server on the LAN (its
progress bar moving), then its deletion; an API key made on the page and used by the openai client; the
queue limit changed on the page and enforced by the API; the live view with moving numbers and the heatmap;
a phone.

The live view's update rate is measured (not asserted) and printed: run with `-s` to see it.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import openai
import pytest

from hub_server import HubServer
from live_samples import push, sample, store

from .conftest import shot, sign_in


@pytest.fixture
def admin(page, users):
    sign_in(page, "admin", next_path="/panel/")
    return page


@pytest.fixture
def clean_settings(django_for_stack):
    from webui import config
    from webui.models import Setting

    yield
    Setting.objects.all().delete()
    config.save({})


@pytest.fixture
def gguf_server(smollm2_gguf, tmp_path, lan, pull_from_lan):
    """A file server on the LAN (the worker's pull policy refuses this machine), the switch allowing it on."""
    shutil.copy(smollm2_gguf, tmp_path / "smollm2-copy.gguf")
    server = HubServer(tmp_path, lan=lan)
    server.rate = 24 * 2**20  # bytes/s: the 98 MB download takes about four seconds
    pull_from_lan(True)
    yield server
    server.close()


def test_a_pull_shows_its_progress_then_the_model_is_deleted(admin, gguf_server, stack):
    page = admin
    page.goto("/panel/models/")
    shot(page, "panel-models")
    page.fill("#id_source", f"{gguf_server.url}/cdn/smollm2-copy.gguf")
    page.click("#pull-form button[type=submit]")
    page.wait_for_selector("#job")
    page.wait_for_function("() => window.rkmojoJob && window.rkmojoJob.progress.length >= 3", timeout=60000)
    assert "MiB/s" in page.inner_text("#job-numbers") and "ETA" in page.inner_text("#job-numbers")
    shot(page, "panel-pull-progress")
    values = page.evaluate("window.rkmojoJob.progress")
    assert values == sorted(values) and values[-1] > values[0], values  # the bar moved forward
    page.wait_for_url("**/panel/models/", timeout=120000)  # reloaded after success
    page.wait_for_selector('tr[data-model="smollm2-copy"]')
    page.click('tr[data-model="smollm2-copy"] a:has-text("smollm2-copy")')
    assert "llama" in page.inner_text("dl.facts")
    shot(page, "panel-model-detail")
    page.goto("/panel/models/smollm2-copy/delete/")
    shot(page, "panel-delete-confirm")
    page.click("button.danger")
    page.wait_for_selector(".messages >> text=Deleted smollm2-copy")
    assert page.locator('tr[data-model="smollm2-copy"]').count() == 0
    assert not (stack.data / "models" / "smollm2-copy").exists()


def test_a_pull_can_be_cancelled_and_fails_with_one_clear_message(admin, gguf_server, stack):
    page = admin
    gguf_server.rate = 4 * 2**20
    page.goto("/panel/models/")
    page.fill("#id_source", f"{gguf_server.url}/cdn/smollm2-copy.gguf")
    page.click("#pull-form button[type=submit]")
    page.wait_for_function("() => window.rkmojoJob && window.rkmojoJob.progress.length >= 1", timeout=60000)
    page.click("#job-cancel")
    page.wait_for_selector("#job-error:not([hidden])", timeout=30000)
    assert page.inner_text("#job-error") == "cancelled"
    shutil.rmtree(stack.data / "models" / ".smollm2-copy.pull", ignore_errors=True)
    page.goto("/panel/models/")
    page.fill("#id_source", f"{gguf_server.url}/cdn/missing.gguf")
    page.click("#pull-form button[type=submit]")
    page.wait_for_selector("#job-error:not([hidden])", timeout=60000)
    assert "404" in page.inner_text("#job-error")
    shot(page, "panel-pull-error")


def test_an_api_key_made_on_the_page_works_from_the_openai_client(admin, stack):
    page = admin
    page.goto("/panel/keys/")
    page.fill("#id_name", "browser-made")
    page.click("form.card button[type=submit]")
    key = page.inner_text("#new-key-value")
    page.click("#copy-key")
    shot(page, "panel-keys")
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key)
    out = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert out.choices[0].message.content is not None
    page.goto("/panel/keys/")  # not a reload: that would post the form again
    row = page.locator("tr", has_text="browser-made")
    assert "never" not in row.inner_text()  # last use recorded
    row.locator("button:has-text('Revoke')").click()
    page.wait_for_selector(".messages >> text=Revoked the key browser-made")
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_the_queue_limit_set_on_the_page_is_enforced_by_the_api(admin, stack, clean_settings):
    page = admin
    page.goto("/panel/settings/")
    page.fill("#id_queue_limit", "0")
    page.click("form.settings button[type=submit]")
    page.wait_for_selector(".messages >> text=Saved")
    shot(page, "panel-settings")
    assert page.locator('[data-setting="api_keys"] .badge.env').count() == 1  # the stack's RKMOJO_API_KEYS
    time.sleep(2.2)  # the web side's settings cache (webui.config.CACHE)
    oai = stack.openai(max_retries=0)
    started = threading.Event()

    def long_answer():
        stream = oai.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Tell a story."}], max_tokens=200, stream=True
        )
        for _ in stream:
            started.set()

    t = threading.Thread(target=long_answer)
    t.start()
    try:
        assert started.wait(60)
        with pytest.raises(openai.RateLimitError, match="retry after"):
            oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    finally:
        t.join(120)
    stack.idle()


def test_the_live_view_updates_its_numbers_and_heatmap(admin, stack):
    page = admin
    r = stack.r()
    store(r, sample("board-demo", 0))
    page.goto("/panel/")
    card = page.locator('[data-worker="board-demo"]')
    assert card.locator('[data-f="state"]').inner_text().startswith("decoding")
    stop = threading.Event()

    def feed():  # the worker's once-a-second push, faster here (4 Hz) to show the throttle
        async def run():
            step = 1
            while not stop.is_set():
                s = sample("board-demo", step)
                store(r, s)
                await push(s)
                step += 1
                await asyncio.sleep(0.25)

        asyncio.run(run())

    t = threading.Thread(target=feed)
    t.start()
    try:
        count = "window.rkmojoLive.perWorker['board-demo'] || 0"
        page.wait_for_function(f"() => ({count}) >= 2", timeout=15000)
        before = card.locator('[data-f="queue"]').inner_text()
        t0 = page.evaluate(count)
        time.sleep(6)
        msgs = page.evaluate(count) - t0
        after = card.locator('[data-f="queue"]').inner_text()
    finally:
        stop.set()
        t.join()
    print(f"\nlive view: {msgs} updates of board-demo in 6 s = {msgs / 6:.2f} Hz (pushed at 4 Hz)")
    assert before != after
    assert card.locator(".heatmap canvas").count() == 1 and card.locator(".heatmap li.worst").count() == 3
    assert card.locator(".uplot").count() == 4
    shot(page, "panel-live")
    card.locator("input[value=residency]").check()
    shot(page, "panel-live-residency")
    r.delete("rkmojo:stats:board-demo")


def test_the_panel_works_at_phone_size(phone, users, stack):
    store(stack.r(), sample("board-demo", 3))
    sign_in(phone, "admin", next_path="/panel/")
    for path, name in (
        ("/panel/", "phone-panel-live"),
        ("/panel/models/", "phone-panel-models"),
        ("/panel/settings/", "phone-panel-settings"),
        ("/panel/sessions/", "phone-panel-sessions"),
        ("/panel/users/", "phone-panel-users"),
    ):
        phone.goto(path)
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 362, f"{path} is {width} px wide on a 360 px phone"
        shot(phone, name)
    stack.r().delete("rkmojo:stats:board-demo")


def test_the_people_and_sessions_pages(admin, stack):
    from webui.models import ChatMessage, ChatSession

    s = ChatSession.objects.create(model="smollm2", title="What is an expert cache?", source="web", digest="tour")
    ChatMessage.objects.create(session=s, index=0, role="user", content="What is an expert cache?")
    ChatMessage.objects.create(
        session=s,
        index=1,
        role="assistant",
        content="A few experts kept in memory.",
        prompt_tokens=12,
        cached_tokens=0,
        completion_tokens=8,
    )
    page = admin
    for path, name in (
        ("/panel/users/", "panel-users"),
        ("/panel/sessions/", "panel-sessions"),
        (f"/panel/sessions/{s.pk}/", "panel-session"),
    ):
        page.goto(path)
        shot(page, name)
    page.click("text=Delete this conversation")
    page.wait_for_selector(".messages >> text=Deleted the conversation")


def test_the_live_view_follows_the_real_worker(admin, stack):
    """The stack's own worker feeds its card."""
    stack.wait_until(lambda: stack.r().exists("rkmojo:stats:board-a"), timeout=5)
    page = admin
    page.goto("/panel/")
    card = page.locator('[data-worker="board-a"]')
    page.wait_for_function("() => (window.rkmojoLive.perWorker['board-a'] || 0) >= 1", timeout=15000)
    oai = stack.openai()
    t0 = page.evaluate("window.rkmojoLive.perWorker['board-a']")
    started = time.monotonic()
    oai.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Tell a story."}], max_tokens=120
    )
    page.wait_for_timeout(2500)  # the next samples carry the answer's rate and TTFT
    n = page.evaluate("window.rkmojoLive.perWorker['board-a']") - t0
    seconds = time.monotonic() - started
    print(f"\nlive view from the real worker: {n} updates in {seconds:.1f} s = {n / seconds:.2f} Hz")
    assert card.locator('[data-f="loaded"]').inner_text() == "smollm2"
    assert card.locator('[data-f="ttft"]').inner_text() != "—"
    shot(page, "panel-live-real-worker")


def test_a_model_of_an_unsupported_architecture_fails_with_one_clear_message(admin, gguf_server, stack):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(gguf_server.root / "mamba-tiny.gguf"), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    page = admin
    page.goto("/panel/models/")
    page.fill("#id_source", f"{gguf_server.url}/cdn/mamba-tiny.gguf")
    page.click("#pull-form button[type=submit]")
    page.wait_for_selector("#job-error:not([hidden])", timeout=60000)
    assert "architecture 'mamba' is not supported" in page.inner_text("#job-error")
    assert page.locator(".error:visible").count() == 1
    shot(page, "panel-pull-unsupported")
    shutil.rmtree(stack.data / "models" / ".mamba-tiny.pull", ignore_errors=True)


def test_a_real_moe_worker_streaming_experts_fills_the_heatmap_as_it_computes(admin, stack, moe_store, tmp_path):
    """A second worker serves a tiny random MoE with 4 of 16 expert slots per layer (experts stream from disk):
    its card's heatmap, hit rates, disk rate and tok/s come from the real engine's counters."""
    data = tmp_path / "board-moe"
    (data / "models").mkdir(parents=True)
    (data / "logs").mkdir()
    (data / "models" / "tiny-moe").symlink_to(moe_store)
    env = {**stack.env, "RKMOJO_DATA": str(data), "RKMOJO_PRELOAD": "tiny-moe", "RKMOJO_EXPERT_SLOTS": "4"}
    worker = stack.start_worker("board-moe", env)
    try:
        page = admin
        page.goto("/panel/")
        card = page.locator('[data-worker="board-moe"]')
        canvas = card.locator(".heatmap canvas")
        canvas.wait_for()
        idle = canvas.evaluate("c => c.toDataURL()")
        assert card.locator(".heatmap ol li").count() == 2  # the store's two MoE layers
        oai, seen = stack.openai(), set()
        for i in range(3):
            # digits and spaces are single-byte tokens: ids below the tiny model's vocabulary of 256
            oai.completions.create(
                model="tiny-moe", prompt=" ".join("3141592653589793"[i : i + 9]), max_tokens=24, temperature=1.0, seed=i
            )
            page.wait_for_timeout(1300)  # the next once-a-second sample
            seen.add(canvas.evaluate("c => c.toDataURL()"))
        assert idle not in seen and len(seen) >= 2, "the heatmap did not change as the worker computed"
        rates = card.locator(".heatmap ol li").all_inner_texts()
        assert all("%" in r for r in rates), rates  # every layer has a hit rate over the window now
        # (the card's own hit rate is the last second's: "—" again once the worker is idle, so not checked here)
        shot(page, "panel-live-moe-worker")
        card.locator("input[value=residency]").check()
        shot(page, "panel-live-moe-worker-residency")
    finally:
        worker.stop()
        del stack.workers["board-moe"]


def test_the_live_view_shows_the_generations_a_parallel_worker_runs_at_once(admin, stack, smollm2_store, tmp_path):
    """A second worker with RKMOJO_PARALLEL=4 serving the demo model under another name: while three requests
    run on it, its card says how many of its four slots are in use."""
    data = tmp_path / "board-par"
    (data / "models").mkdir(parents=True)
    (data / "logs").mkdir()
    (data / "models" / "smollm2-par").symlink_to(smollm2_store)
    env = {**stack.env, "RKMOJO_DATA": str(data), "RKMOJO_PRELOAD": "smollm2-par", "RKMOJO_PARALLEL": "4"}
    worker = stack.start_worker("board-par", env)
    try:
        page = admin
        page.goto("/panel/")
        card = page.locator('[data-worker="board-par"]')
        card.wait_for()
        assert card.locator('[data-f="slots"]').inner_text() == "0 of 4"

        def ask(i: int) -> None:
            stack.openai().chat.completions.create(
                model="smollm2-par",
                messages=[{"role": "user", "content": f"Tell story number {i}."}],
                max_tokens=400,
                logit_bias={"2": -100},  # no end of text: each runs its 400 tokens
            )

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        page.wait_for_function(
            '() => /^[23] of 4$/.test(document.querySelector(\'[data-worker="board-par"] [data-f="slots"]\').textContent)',
            timeout=30000,
        )
        shot(page, "panel-live-parallel")
        for t in threads:
            t.join(120)
    finally:
        worker.stop()
        stack.workers.pop("board-par", None)
