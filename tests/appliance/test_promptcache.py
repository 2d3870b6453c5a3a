"""A worker's prompt-cache files (`appliance.promptcache`) without the stack: the longest shared prefix
restored, writes off the request's path, one file per conversation, the directory within its cap."""

import os
import time
from types import SimpleNamespace

import numpy as np

from appliance.promptcache import PromptCache
from inference.prompt_cache import LayerRows, Snapshot


class FakeEngine:
    """What `PromptCache` uses of an engine: its tokens, a snapshot of its KV rows (`nbytes` of them), and
    whether its cache can be cut back."""

    def __init__(self, tokens, nbytes=1000, truncates=True):
        self.tokens, self.nbytes, self.loaded = list(tokens), nbytes, None
        self.cache = SimpleNamespace(can_truncate=lambda n: truncates)

    def snapshot_prompt_cache(self):
        k = np.zeros((1, 1, self.nbytes // 4), np.float16)
        rows = LayerRows(None, np.zeros(1, np.int64), k, k)
        return Snapshot("digest", np.asarray(self.tokens, np.int64), len(self.tokens), (rows,))

    def load_prompt_cache(self, source):
        self.loaded = source


def saved(pc, engine, prompt=0):
    path = pc.save(engine, prompt=prompt)
    pc.flush()
    return path


def test_the_prompt_cache_restores_the_longest_shared_prefix(tmp_path):
    pc = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)
    a = list(range(100, 140))
    b = list(range(100, 120)) + list(range(500, 530))
    saved(pc, FakeEngine(a))
    saved(pc, FakeEngine(b))
    pc.save(FakeEngine(a[:5]))  # too short to be worth a file
    assert len(pc.entries) == 2
    eng = FakeEngine(range(100, 110))
    assert pc.restore(eng, b + [7, 8, 9]) == len(b) and eng.loaded.name.endswith(".kv")
    eng = FakeEngine(a + [1])  # the engine already holds more of the prompt than any file: nothing loaded
    assert pc.restore(eng, a + [1, 2]) == len(a) + 1 and eng.loaded is None
    again = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)  # a restarted worker finds them
    assert again.best(a + [1])[1] == len(a)
    assert pc.counts.restored == 1 and pc.counts.dropped == 0


def test_a_sequence_not_yet_written_restores_from_its_copy_in_memory(tmp_path):
    pc = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)
    a = list(range(100, 140))
    gate = pc._writer.submit(time.sleep, 0.5)  # the writer is busy
    pc.save(FakeEngine(a))
    eng = FakeEngine([])
    assert pc.restore(eng, a + [1]) == len(a)
    assert isinstance(eng.loaded, Snapshot) and not gate.done()
    pc.flush()
    eng = FakeEngine([])
    pc.restore(eng, a + [1])
    assert eng.loaded == tmp_path / "m" / eng.loaded.name  # written now: from the file


def test_a_prompt_cache_file_cleared_meanwhile_is_forgotten_not_an_error(tmp_path):
    class ReadingEngine(FakeEngine):
        def load_prompt_cache(self, path):
            self.loaded = path.read_bytes()  # as Engine.load_prompt_cache opens the file

    pc = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)
    a = list(range(100, 140))
    saved(pc, FakeEngine(a)).unlink()  # the panel's "Clear" while this worker still lists the file
    eng = ReadingEngine(a[:10])
    assert pc.restore(eng, a + [1]) == 10 and eng.loaded is None and not pc.entries
    assert pc.counts.dropped == 0  # cleared is not broken: no load was tried


def test_a_growing_conversation_keeps_one_file(tmp_path):
    pc = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)
    prompt, answer = list(range(100, 130)), list(range(200, 210))
    first = saved(pc, FakeEngine(prompt + answer), prompt=len(prompt))
    # the next prompt re-sends the answer tokenized its own way: the older file's prompt is what counts
    second = saved(pc, FakeEngine(prompt + [7] + answer[1:] + list(range(300, 320))), prompt=len(prompt) + 25)
    assert not first.exists() and second.exists() and pc.counts.superseded == 1
    # a ring that can no longer be cut back that far keeps the shorter file
    third = saved(pc, FakeEngine(prompt + [7] + answer[1:] + list(range(300, 360)), truncates=False))
    assert second.exists() and third.exists()
    other = saved(pc, FakeEngine(list(range(400, 430))))  # another conversation is not covered
    assert sorted(p.name for p in (tmp_path / "m").glob("*.kv")) == sorted([second.name, third.name, other.name])
    again = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)  # the prompt lengths are kept
    assert again.entries[second.stem].prompt == len(prompt) + 25


def test_prompt_cache_files_expire_and_are_capped_least_recently_used_first(tmp_path):
    pc = PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)
    paths = [saved(pc, FakeEngine(range(k * 100, k * 100 + 20))) for k in range(3)]
    size = paths[0].stat().st_size + paths[0].with_suffix(".json").stat().st_size
    for i, p in enumerate(paths):
        os.utime(p, (time.time() - 100 + i, time.time() - 100 + i))
    pc.restore(FakeEngine([]), list(range(0, 20)) + [1])  # the oldest file is used again: now the newest
    pc.limit(int(3.5 * size), 3600)  # the administrator lowers the cap
    saved(pc, FakeEngine(range(900, 920)))  # 4 files > 3.5: the least recently used goes
    assert [p.exists() for p in paths] == [True, False, True]
    old = time.time() - 8 * 86400
    os.utime(paths[2], (old, old))
    PromptCache(tmp_path, "m", max_bytes=10**6, max_age=7 * 86400)  # a week unused: expired
    assert not paths[2].exists() and not paths[2].with_suffix(".json").exists()
    assert len(list(tmp_path.glob("m/*.kv"))) == 2


def test_a_crash_s_temporary_files_are_removed_after_an_hour(tmp_path):
    (tmp_path / "m").mkdir()
    stale, fresh = tmp_path / "m" / ".a.kv.tmp-123", tmp_path / "m" / ".b.kv.tmp-456"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    PromptCache(tmp_path, "m", max_bytes=10**6, max_age=3600)
    assert not stale.exists() and fresh.exists()
