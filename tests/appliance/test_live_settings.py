"""Saved settings as a worker applies them: the schema checks them, the environment wins, and the
registration tells what applied and what waits for a reload."""

import json

from appliance.live_settings import resolve
from inference.engine import EngineConfig

BASE = {
    "KEEP_ALIVE": 1800.0,
    "ENGINE": {"threads": 1},
    "PROMPT_CACHE_DAYS": 7,
    "PROMPT_CACHE_MAX": 2 * 2**30,
    "PULL_FROM_LAN": False,
}


def saved(**values) -> str:
    return json.dumps(values)


def test_saved_keep_alive_and_engine_options_replace_the_defaults():
    r = resolve(saved(keep_alive="2h", expert_slots=12, memory_budget="6G", kv_dtype="f32", queue_limit=3), BASE, {})
    assert r.keep_alive == 7200 and r.engine == {
        "threads": 1,
        "expert_slots": 12,
        "memory_budget": 6 * 2**30,
        "kv_dtype": "f32",
    }
    assert r.saved == ("keep_alive", "expert_slots", "memory_budget", "kv_dtype") and not r.invalid


def test_an_environment_variable_that_is_set_wins_over_a_saved_value():
    r = resolve(
        saved(keep_alive=5, threads=4, context=1024),
        BASE,
        {"RKMOJO_KEEP_ALIVE": "30m", "RKMOJO_THREADS": "1", "RKMOJO_CONTEXT": " "},
    )
    assert r.keep_alive == 1800 and r.engine == {"threads": 1, "context": 1024}
    assert r.environment == ("keep_alive", "threads") and r.saved == ("context",)


def test_an_invalid_value_is_ignored_with_its_reason_and_the_others_still_apply():
    r = resolve(saved(expert_slots=0, prefetch="many", kv_dtype="f8", keep_alive="soon", context=2048), BASE, {})
    assert r.engine == {"threads": 1, "context": 2048} and r.keep_alive == 1800 and r.saved == ("context",)
    assert set(r.invalid) == {"expert_slots", "prefetch", "kv_dtype", "keep_alive"}
    assert "expert_slots=0 is out of range" in r.invalid["expert_slots"] and "f16, f32" in r.invalid["kv_dtype"]
    broken = resolve("[1, 2", BASE, {})
    assert broken.engine == BASE["ENGINE"] and broken.keep_alive == 1800 and "not a JSON object" in broken.invalid["*"]


def test_engine_options_wait_for_a_reload_while_a_loaded_engine_runs_with_others():
    r = resolve(saved(keep_alive=60, context=1024), BASE, {})
    running = EngineConfig(threads=1)  # opened before the setting was saved
    assert r.status([running]) == {"applied": ["keep_alive"], "pending": ["context"], "environment": [], "invalid": {}}
    assert r.status([EngineConfig(threads=1, context=1024)])["pending"] == []
    assert r.status([])["applied"] == ["keep_alive", "context"]  # nothing loaded: the next load takes them
    back = resolve(None, BASE, {})  # the setting removed: a model opened with it waits for a reload too
    assert back.status([EngineConfig(threads=1, context=1024)])["pending"] == ["context"]


def test_saved_prompt_cache_limits_apply_and_the_environment_still_wins():
    r = resolve(saved(prompt_cache_days=2, prompt_cache_max="512M"), BASE, {})
    assert r.prompt_cache == {"PROMPT_CACHE_DAYS": 2, "PROMPT_CACHE_MAX": 512 * 2**20} and not r.invalid
    r = resolve(saved(prompt_cache_days=2, prompt_cache_max="lots"), BASE, {"RKMOJO_PROMPT_CACHE_DAYS": "9"})
    assert r.prompt_cache == {"PROMPT_CACHE_DAYS": 7, "PROMPT_CACHE_MAX": 2 * 2**30}  # the board's own values
    assert r.environment == ("prompt_cache_days",) and "size like 512M" in r.invalid["prompt_cache_max"]


def test_the_pull_from_lan_switch_is_taken_as_saved_unless_the_environment_sets_it():
    assert resolve(saved(pull_from_lan=True), BASE, {}).pull_from_lan is True
    assert resolve(None, BASE, {}).pull_from_lan is False  # the default: public addresses only
    r = resolve(saved(pull_from_lan=True), BASE, {"RKMOJO_PULL_FROM_LAN": "off"})
    assert r.pull_from_lan is False and r.environment == ("pull_from_lan",)
    r = resolve(saved(pull_from_lan="yes please"), BASE, {})
    assert r.pull_from_lan is False and "on or off" in r.invalid["pull_from_lan"]
