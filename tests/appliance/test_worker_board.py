"""The worker's model management without Celery: the memory budget decides what stays loaded."""

from appliance.worker import Board


def board(stack, tmp_path, budget_factor: float) -> Board:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        (models / name).symlink_to(stack.store)
    cfg = {
        "ENGINE": {"threads": 1, "context": 512},
        "KEEP_ALIVE": 60,
        "HEARTBEAT_TTL": 2,
        "PROMPT_CACHE_DIR": str(tmp_path / "pc"),
        "PROMPT_CACHE_MAX": 2**30,
        "PROMPT_CACHE_DAYS": 7,
    }
    b = Board("unit", "host", stack.redis_url.replace("db=0", "db=5"), models, cfg)  # a DB the stack does not read
    b.scan()
    b.cfg["ENGINE"]["memory_budget"] = int(b.models["a"]["footprint"] * budget_factor)
    return b


def test_loading_a_model_unloads_what_does_not_fit_the_budget(stack, tmp_path):
    b = board(stack, tmp_path, 1.5)
    b.engine("a")
    eng, load_s = b.engine("b")
    assert list(b.loaded) == ["b"] and load_s > 0
    assert b.engine("b") == (eng, 0.0)  # kept loaded between requests


def test_models_that_fit_stay_loaded_together_until_idle(stack, tmp_path):
    b = board(stack, tmp_path, 2.5)
    b.engine("a")
    b.engine("b", keep_alive=0.01)
    assert set(b.loaded) == {"a", "b"}
    import time

    time.sleep(0.05)
    b.unload_idle()
    assert list(b.loaded) == ["a"]


def test_a_reloaded_moe_model_warms_its_expert_caches_from_the_popularity_it_saved(stack, tmp_path, moe_store):
    models = tmp_path / "models"
    models.mkdir()
    (models / "moe").symlink_to(moe_store)
    cfg = {
        "ENGINE": {"threads": 1, "context": 256, "expert_slots": 4},
        "KEEP_ALIVE": 60,
        "HEARTBEAT_TTL": 2,
        "PROMPT_CACHE_DIR": str(tmp_path / "pc"),
        "POPULARITY_DIR": str(tmp_path / "pop"),
        "PROMPT_CACHE_MAX": 2**30,
        "PROMPT_CACHE_DAYS": 7,
    }
    b = Board("unit", "host", stack.redis_url.replace("db=0", "db=5"), models, cfg)
    b.scan()
    eng, _ = b.engine("moe")
    b.unload_idle()  # nothing saved yet: warming reads nothing
    assert all(not c.where for c in eng.model.experts.caches.values())
    eng.forward(list(range(10, 40)))
    b.touch("moe", None)
    assert b.unload("moe")
    assert (tmp_path / "pop" / "moe.npz").exists()

    eng, _ = b.engine("moe")
    assert all(not c.where for c in eng.model.experts.caches.values())  # loading itself reads no expert
    b.unload_idle()  # the heartbeat, idle: the saved favourites come in
    assert all(len(c.where) == 4 and c.stats.warmed == 4 for c in eng.model.experts.caches.values())
    b.unload("moe")
