"""Prompt-cache files: continuing from one equals never stopping; a file restores into a KV cache of any
capacity and either precision; bad files are refused, never used."""

import numpy as np
import pytest

from inference.convert import convert
from inference.engine import Engine
from inference.prompt_cache import PromptCacheError
from parity import build_checkpoint
from test_parity import gemma4


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("pc")
    cls, cfg = gemma4()
    a = convert(build_checkpoint(cls, cfg, d / "hf", seed=0), d / "a", "q8", progress=False)
    b = convert(build_checkpoint(cls, cfg, d / "hf2", seed=1), d / "b", "q8", progress=False)
    return a, b


def continue_greedy(engine: Engine, logits: np.ndarray, n: int) -> list[int]:
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = engine.forward([t])[-1]
    return out


def test_generation_continued_from_a_file_equals_an_uninterrupted_run(stores, tmp_path):
    a, _ = stores
    ids = np.random.default_rng(3).integers(0, 512, 50)  # longer than the 24-token sliding window
    e1 = Engine.open(a, chunk=16)
    whole = continue_greedy(e1, e1.forward(ids)[-1], 40)

    e2 = Engine.open(a, chunk=16, expert_slots=3)
    logits = e2.forward(ids)[-1]
    first = continue_greedy(e2, logits, 10)
    e2.save_prompt_cache(tmp_path / "s.pc")
    assert not list(tmp_path.glob(".s.pc.tmp-*"))

    e3 = Engine.open(a, chunk=16)
    assert e3.load_prompt_cache(tmp_path / "s.pc") == 60
    assert e3.tokens == list(ids) + first
    # the next logits were not saved: prefill reuses all but the last token and recomputes it
    logits3, reused = e3.prefill(list(ids) + first)
    assert reused == 59
    assert first + continue_greedy(e3, logits3, 30) == whole


def test_files_from_another_store_or_damaged_are_refused_and_the_state_kept(stores, tmp_path):
    a, b = stores
    e = Engine.open(a)
    e.forward(np.arange(20))
    e.save_prompt_cache(tmp_path / "a.pc")
    other = Engine.open(b)
    other.forward(np.arange(5))
    with pytest.raises(PromptCacheError, match="belongs to another model store"):
        other.load_prompt_cache(tmp_path / "a.pc")
    assert other.tokens == list(range(5))
    data = (tmp_path / "a.pc").read_bytes()
    (tmp_path / "t.pc").write_bytes(data[: len(data) // 2])
    with pytest.raises(PromptCacheError, match="truncated or corrupted"):
        e.load_prompt_cache(tmp_path / "t.pc")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    (tmp_path / "c.pc").write_bytes(bytes(flipped))
    with pytest.raises(PromptCacheError, match="truncated or corrupted"):
        e.load_prompt_cache(tmp_path / "c.pc")


def test_a_file_restores_into_a_cache_of_another_capacity(stores, tmp_path):
    """The soak's failure: full layers grown past their first 256 rows, restored into a fresh cache (256
    rows), and rings sized by another prefill chunk."""
    a, _ = stores
    ids = np.random.default_rng(4).integers(0, 512, 300)
    e1 = Engine.open(a, chunk=16)
    logits = e1.forward(ids)[-1]
    assert any(l.cap > 256 for l in e1.cache.layers if not l.window)  # grown
    e1.save_prompt_cache(tmp_path / "s.pc")
    whole = continue_greedy(e1, logits, 12)
    for chunk in (16, 8, 64):
        e2 = Engine.open(a, chunk=chunk)
        assert e2.load_prompt_cache(tmp_path / "s.pc") == 300
        logits2, reused = e2.prefill(list(ids))
        assert reused == 299
        np.testing.assert_allclose(logits2, logits, rtol=1e-4, atol=1e-4)
        if chunk == 16:  # the same layout: bit for bit
            assert np.array_equal(logits2, logits)
        assert continue_greedy(e2, logits2, 12) == whole


def test_either_kv_precision_restores_into_the_other(stores, tmp_path):
    a, _ = stores
    ids = np.random.default_rng(5).integers(0, 512, 40)
    f32 = Engine.open(a, kv_dtype="f32")
    f32.forward(ids)
    f32.save_prompt_cache(tmp_path / "f32.pc")
    f16 = Engine.open(a, kv_dtype="f16")
    logits16 = f16.forward(ids)[-1]
    f16.save_prompt_cache(tmp_path / "f16.pc")

    # f32 → f16 rounds each row as an f16 cache rounds what it appends (the first layer's rows, computed
    # from the embeddings alone, are the f16 engine's own; later ones saw f32 keys upstream)
    e = Engine.open(a, kv_dtype="f16")
    e.load_prompt_cache(tmp_path / "f32.pc")
    assert all(l.k.dtype == np.float16 for l in e.cache.layers)
    mine, theirs = e.cache.layers[0], f16.cache.layers[0]
    assert np.array_equal(mine.pos, theirs.pos) and np.array_equal(mine.k, theirs.k)
    logits, reused = e.prefill(list(ids))
    assert reused == 39
    np.testing.assert_allclose(logits, logits16, rtol=1e-2, atol=1e-2)

    # f16 → f32 widens: the history keeps f16's rounding, the rest is computed in f32
    e = Engine.open(a, kv_dtype="f32")
    e.load_prompt_cache(tmp_path / "f16.pc")
    assert all(l.k.dtype == np.float32 for l in e.cache.layers)
    logits, reused = e.prefill(list(ids))
    assert reused == 39
    np.testing.assert_allclose(logits, logits16, rtol=1e-2, atol=1e-2)


def test_a_file_is_a_few_rows_not_the_whole_cache(stores, tmp_path):
    a, _ = stores
    e = Engine.open(a, kv_dtype="f32")
    e.forward(np.arange(20))
    e.save_prompt_cache(tmp_path / "a.pc")
    # 20 positions × 4 layers × (K + V); the rings' and the full layers' empty rows are not written
    per_token = sum(l.k.shape[0] * (l.k.shape[2] + l.v.shape[2]) * 4 + 8 for l in e.cache.layers)
    assert (tmp_path / "a.pc").stat().st_size < 20 * per_token + 4096


def test_a_file_longer_than_the_context_is_refused_naming_both(stores, tmp_path):
    a, _ = stores
    e = Engine.open(a)
    e.forward(np.arange(40))
    e.save_prompt_cache(tmp_path / "a.pc")
    small = Engine.open(a, context=32)
    with pytest.raises(PromptCacheError, match="holds 40 tokens and the context holds 32"):
        small.load_prompt_cache(tmp_path / "a.pc")
    assert small.tokens == []


def test_a_snapshot_restores_without_a_file_and_is_its_own_copy(stores):
    a, _ = stores
    e = Engine.open(a)
    ids = list(range(30))
    logits = e.forward(ids)[-1]
    snap = e.snapshot_prompt_cache()
    e.reset()
    e.forward(list(range(100, 130)))  # the engine goes on: the snapshot keeps its rows
    e.load_prompt_cache(snap)
    assert e.tokens == ids
    assert np.array_equal(e.prefill(ids)[0], logits)
