"""The panel in Chromium against the real stack: the live charts start with the worker's last two minutes
(the page hands the script each worker's ring), and the Sessions page names each conversation's owner.

Screenshots at 1280 × 900 and 360 × 740."""

from __future__ import annotations

import time

from live_samples import sample, store

from .conftest import shot, sign_in

WIDE = {"width": 1280, "height": 900}


def test_the_live_charts_are_full_right_after_load(page, users, stack):
    from appliance import bus
    from appliance.stats import HISTORY, remember

    r = stack.r()
    stack.wait_until(lambda: r.llen(bus.k_stats_history("board-a")) >= 10, timeout=15)  # the real worker's ring
    r.delete(bus.k_stats_history("board-demo"))
    t0 = time.time() - HISTORY
    for step in range(HISTORY):  # two minutes of a busy MoE worker
        remember(r, sample("board-demo", step).model_copy(update={"at": t0 + step}))
    store(r, sample("board-demo", HISTORY))
    page.set_viewport_size(WIDE)
    sign_in(page, "admin", next_path="/panel/")
    page.goto("/panel/")
    points = page.evaluate("() => window.rkmojoLive.points")  # drawn at load, before any live update
    assert points["board-a"] >= 10 and points["board-demo"] == HISTORY, points
    assert page.locator('[data-worker="board-demo"] .uplot').count() == 4
    shot(page, "panel-live-history")
    r.delete(bus.k_stats("board-demo"), bus.k_stats_history("board-demo"))


def test_the_live_charts_are_full_on_a_phone_too(phone, users, stack):
    from appliance import bus

    stack.wait_until(lambda: stack.r().llen(bus.k_stats_history("board-a")) >= 10, timeout=15)
    sign_in(phone, "admin", next_path="/panel/")
    phone.goto("/panel/")
    assert phone.evaluate("() => window.rkmojoLive.points['board-a']") >= 10
    width = phone.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 362, f"the live view is {width} px wide on a 360 px phone"
    shot(phone, "phone-panel-live-history")


def _sessions(users):
    from webui.models import ApiKey, ChatMessage, ChatSession

    key, _ = ApiKey.create("Home Assistant")
    made = [
        ChatSession.objects.create(model="smollm2", source="web", owner=users["alice"], title="Plan a trip to Lisbon"),
        ChatSession.objects.create(model="smollm2", source="openai", api_key=key, title="Turn on the lights"),
        ChatSession.objects.create(model="smollm2", source="ollama", title="What is an expert cache?"),
        ChatSession.objects.create(model="smollm2", source="web", visitor="v", title="A visitor's question"),
    ]
    for s in made:
        ChatMessage.objects.create(session=s, index=0, role="user", content=s.title)
    return key, made


def test_the_sessions_page_names_each_owner(page, phone, users, stack):
    key, made = _sessions(users)
    try:
        page.set_viewport_size(WIDE)
        sign_in(page, "admin", next_path="/panel/")
        page.goto("/panel/sessions/")
        owners = {
            row.locator("td").first.inner_text(): row.locator("td[data-owner]").inner_text()
            for row in page.locator("tbody tr").all()
        }
        assert owners["Plan a trip to Lisbon"] == "alice"
        assert owners["Turn on the lights"] == "API key Home Assistant"
        assert owners["What is an expert cache?"] == "API"
        assert owners["A visitor's question"] == "visitor (no sign-in)"
        shot(page, "panel-sessions-owner")
        sign_in(phone, "admin", next_path="/panel/sessions/")
        width = phone.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 362, f"the Sessions page is {width} px wide on a 360 px phone"
        shot(phone, "phone-panel-sessions-owner")
    finally:
        for s in made:
            s.delete()
        key.delete()
