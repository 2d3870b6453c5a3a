"""Continuous batching: several conversations on one engine, their generated tokens stepped together.

    batcher = Batcher(engine, slots=4)
    a = batcher.chat([{"role": "user", "content": "Hi"}], {"max_tokens": 64})
    b = batcher.chat([{"role": "user", "content": "Hello"}], {"max_tokens": 64})
    batcher.start()                    # a thread runs the rounds; or call `batcher.round()` yourself
    for ev in a: ...                   # each sequence's events, as `Engine.chat` yields them

The batcher holds `slots` sequences at once, each in a slot with its own KV cache and compiled step; a
request beyond them waits (interactive ones first, then by age). Each round:

1. admits waiting requests into free slots. A background request (`priority` > 0) never takes the last
   free slot while the batcher has more than one: an interactive request that arrives next finds it free.
   A slot whose cache holds a prefix of the new prompt (the same conversation's last turn) keeps it; with
   saved states (`saved`, the worker's prompt cache) a conversation cut from its slot is saved first, and a
   new one starts from the saved state that holds more of its prompt than its slot.
2. prefills one chunk (`EngineConfig.chunk` rows) of the oldest prompt still prefilling. One chunk per
   round bounds how long the sequences already streaming wait for their next token: a chunk's prefill
   time, not a whole prompt's.
3. samples the next token of every sequence whose prompt is in (`generate.TokenLoop`, as a lone
   generation does), ends the ones that stopped (their slot is free at once), and runs the rest through
   the model together (`Transformer.decode_batch`): each dense matrix read once for all their rows, each
   MoE layer's experts the union of theirs, each expert run on the rows that chose it.

Exactness: every sequence's tokens, log-probabilities and text are those it gets alone on the engine
(`Engine.chat`), bit for bit: its prompt's chunks are the ones a lone prefill computes, and each row of a
batched step has the bits of the one-row step (the kernels' results do not depend on the rows beside
them). A sequence's expert hit rate (`Final.timings.expert_hit_rate`) counts its own requests: its
prefill chunks' and, in each batched step, its experts that were cached when the step asked for them.

Cancel a sequence with `seq.cancel()`; it ends before its next token or prefill chunk, and the others
go on unchanged.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Iterator

import numpy as np

from . import kernels, prompt_cache
from .events import Event, Final
from .generate import TokenLoop, _expert_counts, _is_set
from .sampler import SamplingParams


class Sequence:
    """One request in a batcher: iterate it for its events (they end with one `Final`)."""

    _order = itertools.count()

    def __init__(self, ids: list[int], p: SamplingParams, max_tokens: int, plan, priority: int, progress):
        self.ids, self.p, self.max_tokens, self.plan = ids, p, max_tokens, plan
        self.priority = priority
        self.progress = progress
        self.session: str | None = None  # the conversation's name, kept with its saved state
        self.order = next(self._order)
        self.cancelled = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.loop: TokenLoop | None = None
        self.slot: _Slot | None = None
        self.done = 0  # prompt tokens in the slot's cache
        self.logits: np.ndarray | None = None  # the model's row after the last token, not yet sampled
        self.next: int | None = None  # the token to run through the model in this round's step
        self.finished = False
        self.experts = [0, 0]  # [hits, requests] of its own expert requests: its prefill's and its steps'
        self.tally_at: list[int] | None = None  # its slot step's tally when it was placed

    def cancel(self) -> None:
        """End this sequence before its next token (or prefill chunk); safe from any thread."""
        self.cancelled.set()

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set() or _is_set(self.p.cancel)

    def __iter__(self) -> Iterator[Event]:
        """The events as they come; raises what failed the batcher's round (a kernel's ValueError, …)."""
        while True:
            ev = self.events.get()
            if isinstance(ev, _Failure):
                raise ev.error
            yield ev
            if isinstance(ev, Final):
                return


class _Failure:
    """In a sequence's events: the round it was in failed with `error`."""

    def __init__(self, error: Exception):
        self.error = error


class _Slot:
    """A sequence's place in the batch: its KV cache, the token ids it holds, and its own compiled step."""

    def __init__(self, model):
        self.cache = model.new_cache()
        self.tokens: list[int] = []
        self.step = model.step_class(model) if model.step_class is not None else None
        self.seq: Sequence | None = None
        self.unsaved = False  # it holds a sequence the saved states (`saved`) do not have yet
        self.prompt = 0  # how many of its tokens were its last sequence's prompt
        self.session: str | None = None


class SlotState:
    """A slot as a prompt-cache store (`appliance.promptcache.PromptCache`) sees an engine: the token ids and
    KV cache it holds, copied out (`snapshot_prompt_cache`) and loaded in (`load_prompt_cache`)."""

    def __init__(self, engine, slot: _Slot):
        self.engine, self.slot = engine, slot

    @property
    def tokens(self) -> list[int]:
        return self.slot.tokens

    @property
    def cache(self):
        return self.slot.cache

    def snapshot_prompt_cache(self) -> prompt_cache.Snapshot:
        return prompt_cache.snapshot(self.engine.store.digest, self.slot.tokens, self.slot.cache)

    def load_prompt_cache(self, source) -> int:
        self.slot.cache, self.slot.tokens = self.engine.read_prompt_cache(source)
        return len(self.slot.tokens)


class Batcher:
    """Continuous batching of up to `slots` sequences on `engine` (see the module's docstring). A round holds
    the engine's lock: the engine's own generations and embeddings run between rounds, not during one."""

    def __init__(self, engine, slots: int | None = None, *, saved=None):
        self.engine = engine
        # saved KV states (`appliance.promptcache.PromptCache`: restore(state, ids), save(state, session,
        # prompt)): a slot's conversation is saved before another takes its slot, and a new sequence starts
        # from the saved state that holds the longest prefix of its prompt when its slot holds less
        self.saved = saved
        n = slots if slots is not None else engine.cfg.parallel
        if n < 1:
            raise ValueError(f"slots must be at least 1, got {n}")
        self.slots = [_Slot(engine.model) for _ in range(n)]
        engine.batchers.add(self)  # its slots' KV counts in `Engine.kv_held`
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []  # in the order they were admitted
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stop = False
        self.steps = 0  # decode steps run (for tests and statistics)
        self.rows = 0  # sequence-tokens those steps computed

    # --- requests ---------------------------------------------------------------------------------------
    def chat(self, messages: list[dict], params=None, *, priority: int = 0, progress=None, **overrides) -> Sequence:
        """Queue a conversation's answer, as `Engine.chat` would run it. Raises as `Engine.chat` does."""
        p = self.engine._params(params, overrides)
        return self._submit(self.engine._chat_ids(messages, p), p, True, priority, progress)

    def generate(
        self,
        ids: list[int],
        params=None,
        *,
        chat: bool = False,
        priority: int = 0,
        progress=None,
        session: str | None = None,
        **overrides,
    ) -> Sequence:
        """Queue the continuation of token ids, as `Engine.generate` would run it. `session`: the
        conversation's name, kept with its saved state."""
        p = self.engine._params(params, overrides)
        return self._submit([int(i) for i in ids], p, chat, priority, progress, session)

    def complete(self, prompt: str, params=None, *, priority: int = 0, progress=None, **overrides) -> Sequence:
        """Queue the continuation of raw text, as `Engine.complete` would run it."""
        p = self.engine._params(params, overrides)
        return self._submit(self.engine.tokenizer.encode(prompt), p, False, priority, progress)

    def _submit(self, ids, p, chat, priority, progress, session=None) -> Sequence:
        max_tokens, plan = self.engine.plan_run(ids, p, chat=chat)
        seq = Sequence(ids, p, max_tokens, plan, priority, progress)
        seq.session = session
        with self._wake:
            self.waiting.append(seq)
            self._wake.notify()
        return seq

    @property
    def active(self) -> int:
        """Slots in use."""
        with self._lock:
            return len(self.running)

    # --- the rounds -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Run rounds in a thread of the batcher's own until `stop`, sleeping while there is nothing to do."""
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._serve, name="rkmojo-batch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (the sequences still running end as cancelled)."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for seq in list(self.running) + list(self.waiting):
            seq.cancel()
        while self.round():
            pass
        self.save_all()

    def save_all(self) -> None:
        """Save every idle slot's sequence the saved states do not have yet (`saved`)."""
        if self.saved is None:
            return
        for slot in self.slots:
            if slot.unsaved and slot.seq is None:
                self.saved.save(SlotState(self.engine, slot), slot.session, slot.prompt)
                slot.unsaved = False

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self.waiting and not self.running:
                    self._wake.wait()
                if self._stop:
                    return
            try:
                self.round()
            except Exception as e:  # a kernel's refusal, memory: the sequences in the round fail with it
                self._fail(e)

    def _fail(self, error: Exception) -> None:
        """End every running sequence with `error` (its iteration raises it); their slots start empty."""
        with self._lock:
            failed, self.running = self.running, []
        for seq in failed:
            seq.finished = True
            seq.events.put(_Failure(error))
            seq.slot.seq = None
            seq.slot.cache, seq.slot.tokens, seq.slot.unsaved = self.engine.model.new_cache(), [], False

    def run_until_idle(self) -> None:
        """Run rounds in this thread until no sequence waits or runs."""
        while self.round():
            pass

    def round(self) -> bool:
        """One round (admit, one prefill chunk, one decode step); False when there was nothing to do."""
        engine = self.engine
        with engine._lock, kernels.configured(engine.cfg.threads, engine.cfg.activations):  # between others' uses
            self._admit()
            if not self.running:
                return False
            self._prefill_chunk()
            self._decode_step()
            return True

    def _admit(self) -> None:
        with self._lock:
            for seq in [s for s in self.waiting if s.is_cancelled()]:  # never started: ends at once
                self.waiting.remove(seq)
                self._finish_unstarted(seq)
            self.waiting.sort(key=lambda s: (s.priority, s.order))
            while self.waiting:
                free = [s for s in self.slots if s.seq is None]
                seq = self.waiting[0]
                if not free or (seq.priority > 0 and len(free) == 1 and len(self.slots) > 1):
                    break
                self.waiting.pop(0)
                # the slot holding most of its prompt; else one whose state is saved (or empty)
                slot = max(free, key=lambda s: (_common(s.tokens, seq.ids), not s.unsaved))
                self._place(seq, slot)

    def _place(self, seq: Sequence, slot: _Slot) -> None:
        """Give `seq` the slot, keeping the part of the slot's cache that holds a prefix of its prompt, or
        starting from a saved state that holds more of it (the slot's own state saved first)."""
        if self.saved is not None:
            state = SlotState(self.engine, slot)
            if slot.unsaved and _common(slot.tokens, seq.ids) < len(slot.tokens):  # about to be cut
                self.saved.save(state, slot.session, slot.prompt)
                slot.unsaved = False
            self.saved.restore(state, seq.ids)
        n = min(_common(slot.tokens, seq.ids), len(seq.ids) - 1)  # at least one row computed, for logits
        if n < len(slot.tokens) and not slot.cache.truncate(n):
            slot.cache = self.engine.model.new_cache()
            n = 0
        del slot.tokens[n:]
        slot.seq, seq.slot, seq.done = seq, slot, n
        seq.tally_at = list(slot.step.expert_tally) if hasattr(slot.step, "expert_tally") else None
        slot.unsaved, slot.prompt, slot.session = True, len(seq.ids), seq.session
        seq.loop = TokenLoop(self.engine, seq.ids, seq.p, seq.max_tokens, seq.is_cancelled, plan=seq.plan)
        seq.loop.reused = n
        if seq.progress is not None:
            seq.progress(0, len(seq.ids) - n)
        self.running.append(seq)

    def _prefill_chunk(self) -> None:
        seq = next((s for s in self.running if s.logits is None), None)
        if seq is None:
            return
        if seq.is_cancelled():
            seq.loop.reason = "cancelled"
            self._end(seq)
            return
        model, slot, chunk = self.engine.model, seq.slot, self.engine.cfg.chunk
        part = seq.ids[seq.done : seq.done + chunk]
        before = _expert_counts(self.engine.expert_stats)  # a chunk runs alone: the totals' change is its own
        logits = model.forward(np.array(part), slot.cache, last_only=True, prompt=True)
        after = _expert_counts(self.engine.expert_stats)
        if before is not None and after is not None:
            seq.experts[0] += after[0] - before[0]
            seq.experts[1] += (after[0] + after[1]) - (before[0] + before[1])
        slot.tokens.extend(part)
        seq.done += len(part)
        if seq.progress is not None:
            seq.progress(seq.done - seq.loop.reused, len(seq.ids) - seq.loop.reused)
        if seq.done == len(seq.ids):
            seq.loop.prefilled(seq.loop.reused)
            seq.logits = logits[-1]

    def _decode_step(self) -> None:
        stepping: list[Sequence] = []
        for seq in [s for s in self.running if s.logits is not None]:
            events: list[Event] = []
            nxt = seq.loop.token(seq.logits, events)
            for ev in events:
                seq.events.put(ev)
            if nxt is None:
                self._end(seq)
            else:
                seq.next = nxt
                stepping.append(seq)
        if not stepping:
            return
        model = self.engine.model
        logits = model.decode_batch(
            [s.next for s in stepping], [s.slot.cache for s in stepping], [s.slot.step for s in stepping]
        )
        self.steps += 1
        self.rows += len(stepping)
        for seq, row in zip(stepping, logits):
            seq.slot.tokens.append(seq.next)
            seq.logits = row

    def _end(self, seq: Sequence) -> None:
        if seq.tally_at is not None:  # its own hit rate, not the engine's over every sequence beside it
            now = seq.slot.step.expert_tally
            hits, requests = seq.experts[0] + now[0] - seq.tally_at[0], seq.experts[1] + now[1] - seq.tally_at[1]
            if requests:
                seq.loop.expert_requests = (hits, requests)
        for ev in seq.loop.finish():
            seq.events.put(ev)
        seq.finished = True
        with self._lock:
            self.running.remove(seq)
        seq.slot.seq = None

    def _finish_unstarted(self, seq: Sequence) -> None:
        loop = TokenLoop(self.engine, seq.ids, seq.p, seq.max_tokens, lambda: True, plan=seq.plan)
        loop.reason = "cancelled"
        for ev in loop.finish():
            seq.events.put(ev)
        seq.finished = True


def _common(a: list[int], b: list[int]) -> int:
    """The length of the common prefix of a and b."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
