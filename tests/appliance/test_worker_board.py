"""The worker's model management without Celery: the memory budget decides what stays loaded."""

from appliance.worker import Board


def unit_board(stack, tmp_path, stores: dict, name: str = "unit", **engine) -> Board:
    """A worker's Board outside Celery over `stores` (model name → store), on a Redis database the stack does
    not read, with its prompt cache and expert popularity under `tmp_path`."""
    models = tmp_path / "models"
    models.mkdir()
    for model, store in stores.items():
        (models / model).symlink_to(store)
    cfg = {
        "ENGINE": {"threads": 1, "context": 512, **engine},
        "KEEP_ALIVE": 60,
        "HEARTBEAT_TTL": 2,
        "PROMPT_CACHE_DIR": str(tmp_path / "pc"),
        "POPULARITY_DIR": str(tmp_path / "pop"),
        "PROMPT_CACHE_MAX": 2**30,
        "PROMPT_CACHE_DAYS": 7,
    }
    return Board(name, "host", stack.redis_url.replace("db=0", "db=5"), models, cfg)


def board(stack, tmp_path, budget_factor: float) -> Board:
    b = unit_board(stack, tmp_path, {"a": stack.store, "b": stack.store})
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
    b = unit_board(stack, tmp_path, {"moe": moe_store}, context=256, expert_slots=4)
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
    ex = eng.model.experts
    assert 0 < len(ex.landing.verified) < sum(lay.n_experts for lay in ex.layouts.values())  # those warmed only
    for _ in range(100):  # the next beats check the digests of the others, a slice each
        b.unload_idle()
        if b.loaded["moe"].unchecked == 0:
            break
    assert b.loaded["moe"].unchecked == 0 and len(ex.landing.verified) == sum(
        lay.n_experts for lay in ex.layouts.values()
    )
    b.unload("moe")
