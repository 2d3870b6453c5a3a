"""Prompt-cache files: continuing from one equals never stopping; bad files are refused, never used."""

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
    with pytest.raises(PromptCacheError, match="other KV settings"):
        Engine.open(a, chunk=8).load_prompt_cache(tmp_path / "a.pc")
    with pytest.raises(PromptCacheError, match="KV precision"):
        Engine.open(a, kv_dtype="f32").load_prompt_cache(tmp_path / "a.pc")
