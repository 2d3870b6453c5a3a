"""The engine: one opened store, its model, the expert cache and the KV state of one conversation.

`Engine.open(store, ...)` once per process. `engine.forward(ids)` continues the current sequence;
`engine.prefill(ids)` reuses the longest common prefix with what the KV cache already holds and
computes only the rest.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterator

import numpy as np

from . import backends, kernels, options, prompt_cache
from .errors import RkmojoError
from .experts import TOKEN_PREFETCH, VERIFY_MODES, StreamingExperts, lookahead_pools, popularity
from .experts.cache import PAGE
from .experts.io import IO_MODES
from .options import OptionError, option
from .kernels.repack import repack_model
from . import structured
from .generate import ContextLengthError, EngineBusyError, Event, _is_set, decode, max_new_tokens
from .model import empty_cache, load_model
from .sampler import SamplingParams
from .store import Store
from .tokenizer import StoreTokenizer

# Python, numpy, kernels and activations: what the process needs besides weights, KV and slots
RUNTIME_OVERHEAD = 384 * 2**20
MIN_SLOTS = 8
Progress = Callable[[int, int], None]  # a prefill's progress callback: (tokens computed, tokens to compute)


@dataclass(frozen=True)
class EngineConfig:
    """Everything `Engine.open` was asked for, checked by its schema (`inference.options`); passed down and
    never changed (the engine has no global state). A memory budget may be given as text ("6G")."""

    memory_budget: int | None = option(
        help="stream experts within this much memory, e.g. 6G", ge=1, parse=lambda t: parse_size(t)
    )
    expert_slots: int | None = option(help="expert cache slots per layer", ge=1)
    policy: str = option("lfu", help="expert cache eviction", choices=("lfu", "lru"))
    io: str = option("auto", help="expert reads: io_uring or a preadv thread pool", choices=IO_MODES)
    hugepages: bool = option(
        True,
        help="expert slots in transparent huge pages where the kernel has them (off: 4 KiB pages, for a "
        "kernel that stalls compacting memory for them at load)",
    )
    verify_experts: str = option(
        "first", help="digest check of expert blobs (first: at the first load of each)", choices=VERIFY_MODES
    )
    prefetch: int = option(
        0,
        help="gate-lookahead prefetch slots per layer, for prompts (0: none; a generated token still reads "
        "its best token_prefetch guesses into two small pools)",
        ge=0,
    )
    token_prefetch: int = option(
        TOKEN_PREFETCH,
        help="a generated token's gate lookahead: its best guesses read ahead per layer while experts stream, "
        "each rank only while it has been right often enough (0: off)",
        ge=0,
    )
    threads: int | None = option(help="kernel threads (default: every core)", ge=1)
    chunk: int = option(128, help="prefill chunk in rows", ge=1)
    parallel: int = option(
        1,
        help="sequences a batcher (inference.batch) steps together; each holds a KV cache of the whole "
        "context, counted in the memory budget",
        ge=1,
    )
    prefill_pass: int = option(
        1024,
        help="prompt rows that go layer by layer when experts stream, so each layer's experts are read once "
        "per pass, not once per chunk (rounded down to whole chunks; one chunk or less: chunk by chunk)",
        ge=1,
    )
    backend: str = option(
        "auto",
        help="prefill's dense matmuls: rknpu (RK3588 NPU, after a self-test), cpu, "
        "or auto (the NPU where librknnrt is present)",
        choices=backends.CHOICES,
    )
    npu_library: str | None = option(help=f"librknnrt.so to load (default {backends.DEFAULT_LIBRARY})")
    npu_precision: str = option(
        "fp16",
        help="NPU matmul precision (int8: raw INT8×INT8→INT32, scales applied on the CPU)",
        choices=backends.PRECISIONS,
    )
    npu_expert_rows: int | None = option(
        help="routed experts with at least this many rows of a prefill chunk run on the NPU "
        "(default: the board's `rkmojo npu calibrate`; without one, on the CPU)",
        ge=1,
    )
    npu_graph_layers: int | None = option(
        help="layers whose NPU graphs stay loaded (default all; fewer: loaded just in time, for 8 GB boards)", ge=1
    )
    context: int = option(4096, help="KV cache length in tokens", ge=1)
    kv_dtype: str = option(
        "f16", help="KV cache precision (f16: half the memory and bandwidth of f32)", choices=("f16", "f32")
    )
    activations: str | None = option(
        help="activations of the 4- and 8-bit matmuls: f32 (exact), q8 (int8 dot "
        "products, as llama.cpp), experts (int8 in the MoE experts only), decode (and in the "
        "attention and dense matmuls of generated tokens); default: the mode the kernels were loaded with "
        "(decode unless RKMOJO_ACTIVATIONS says otherwise)",
        choices=kernels.ACTIVATIONS,
    )
    repack: bool = option(
        True,
        help="q4 matrices in the kernels' repacked layout for int8 products (resident dense ones at load, "
        "experts as they land); off: the store layout",
    )

    def __post_init__(self):
        if isinstance(self.memory_budget, str):
            object.__setattr__(self, "memory_budget", parse_size(self.memory_budget))
        options.check(self)


class Engine:
    """One opened store, its model, expert cache and the KV state of one conversation; it runs one
    generation at a time (`chat`, `complete`, `generate` yield events; `cancel` from any thread)."""

    def __init__(self, store: Store, cfg: EngineConfig):
        self.store = store
        self.cfg = cfg
        self._lock = threading.Lock()  # held while a generation or an embedding runs
        # cancel events of prepared or running generations (weak: a generator dropped unstarted leaves nothing)
        self._live: weakref.WeakSet = weakref.WeakSet()
        self.batchers: weakref.WeakSet = weakref.WeakSet()  # `inference.batch.Batcher`s stepping on this engine
        streaming = bool(store.expert_layers) and (cfg.memory_budget is not None or cfg.expert_slots is not None)
        self.cache = empty_cache(store, chunk=cfg.chunk, kv_dtype=cfg.kv_dtype)
        self.tokens: list[int] = []  # the ids whose K/V the cache holds, in order
        self.slots = None
        experts = {}
        if streaming:
            store.load_dense()
            kv, guesses = kv_bytes(self.cache, cfg.context) * cfg.parallel, cfg.token_prefetch
            self.slots = plan_slots(store, kv, cfg.memory_budget, cfg.expert_slots, cfg.prefetch, guesses)
            experts["experts"] = StreamingExperts(
                store,
                self.slots,
                policy=cfg.policy,
                io=cfg.io,
                verify=cfg.verify_experts,
                prefetch=cfg.prefetch,
                guesses=guesses,
                hugepages=cfg.hugepages,
            )
        self.model = load_model(store, chunk=cfg.chunk, kv_dtype=cfg.kv_dtype, prefill_pass=cfg.prefill_pass, **experts)
        self.backend = backends.select(
            cfg.backend,
            library=cfg.npu_library,
            precision=cfg.npu_precision,
            rows=cfg.chunk,
            expert_rows=cfg.npu_expert_rows,
            store=store,
            model=self.model,
            graph_layers=cfg.npu_graph_layers,
        )
        self.model.ops = self.backend.backend
        if cfg.repack and self.model.ops is backends.CPU:  # an NPU backend builds its graphs from the store's layout
            # resident dense q4 matrices in rows-in-lanes panels for one-row int8 products
            repack_model(self.model, cfg.activations or kernels.get_activations())

    # --- generation: check the request here, then the token loop (`generate.decode`) ------------------
    @cached_property
    def tokenizer(self) -> StoreTokenizer:
        return StoreTokenizer(self.store)

    @property
    def context_length(self) -> int:
        """Tokens a sequence may hold: the model's maximum, capped by the configured context."""
        limit = int(getattr(self.model.args, "max_position_embeddings", 0) or 0)
        return min(limit, self.cfg.context) if limit else self.cfg.context

    def chat(
        self,
        messages: list[dict],
        params: SamplingParams | dict | None = None,
        *,
        progress: Progress | None = None,
        **overrides,
    ) -> Iterator[Event]:
        """Answer a conversation with the model's chat template.

        Args:
            messages: [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...].
            params: a `SamplingParams` or a dict of its fields; keyword overrides win.
            progress: called as `progress(done, total)` during the prefill, in the generating thread:
                (0, total) before the first chunk, then after each chunk; `total` is the prompt tokens
                to compute (those reused from the KV cache not counted).
        Returns:
            An iterator of `TokenEvent`, `TextDelta`, and one final `Final`.
        Raises:
            OptionError: a parameter out of range (naming it and the range).
            ChatTemplateError: the template refused the messages.
            ContextLengthError: prompt + max_tokens exceed the context (stating both numbers).
        """
        p = self._params(params, overrides)
        return self._start(self._chat_ids(messages, p), p, progress, chat=True)

    def chat_prompt(self, messages: list[dict], params: SamplingParams | dict | None = None, **overrides) -> list[int]:
        """The token ids `chat` would prefill for `messages`: the template with tools and thinking applied.

        Pass them to `generate(ids, params, chat=True)` to run them as `chat` does (a server restores a
        saved KV state for them first). Raises as `chat` does, `StructureError` included.
        """
        return self._chat_ids(messages, self._params(params, overrides))

    def _chat_ids(self, messages: list[dict], p: SamplingParams) -> list[int]:
        tok = self.tokenizer
        tools, _, use_tools = structured.check_tools(p.tools, p.tool_choice)
        messages, shown = structured.prompt_messages(self.family, messages, tools, use_tools)
        variables = dict(p.template)
        if p.think is not None and self.family.reasoning is not None:
            variables["enable_thinking"] = bool(p.think)
        return tok.encode_chat(messages, tools=shown, **variables)

    @cached_property
    def family(self) -> structured.Family:
        """The chat template's tool-call and thinking format (`inference.structured.families`)."""
        return structured.detect(self.tokenizer.template_source)

    @cached_property
    def grammars(self) -> structured.Grammars:
        """The store's grammar compiler (its llguidance tokenizer is built on first use)."""
        tok = self.tokenizer
        return structured.Grammars(
            (self.store.path / "tokenizer.json").read_text(), self.model.args.vocab_size, sorted(tok.eos_ids)
        )

    def complete(
        self, prompt: str, params: SamplingParams | dict | None = None, *, progress: Progress | None = None, **overrides
    ) -> Iterator[Event]:
        """Continue raw text (no chat template; BOS added when the tokenizer adds it). As `chat` otherwise."""
        p = self._params(params, overrides)
        return self._start(self.tokenizer.encode(prompt), p, progress)

    def generate(
        self,
        ids: list[int],
        params: SamplingParams | dict | None = None,
        *,
        progress: Progress | None = None,
        chat: bool = False,
        **overrides,
    ) -> Iterator[Event]:
        """Continue the token ids `ids` (no template, nothing added). As `chat` otherwise.

        `chat`: the ids are a rendered conversation (`chat_prompt`): the answer is read in the model's
        format (reasoning and tool calls apart from the content).
        """
        return self._start([int(i) for i in ids], self._params(params, overrides), progress, chat=chat)

    def cancel(self) -> None:
        """Stop the running generation (and any prepared one) before its next token; safe from any thread."""
        for ev in list(self._live):
            ev.set()

    def embed(self, texts: str | list[str], *, wait: bool = False) -> np.ndarray:
        """Embeddings: the mean over tokens of the final-normed hidden states, L2-normalised.

        Each text is tokenized as by `complete` and run through a fresh KV cache, so the chat state is
        untouched. Returns float32 [len(texts), hidden_size]. `wait`: wait for a running generation (or a
        batcher's round, `inference.batch`) to end, instead of raising.

        Raises:
            ValueError: an empty text.
            ContextLengthError: a text longer than the context.
            EngineBusyError: a generation is running (and not `wait`).
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        encoded = [self.tokenizer.encode(t) for t in texts]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"texts[{i}] is empty (no tokens)")
            if len(ids) > self.context_length:
                raise ContextLengthError(
                    f"texts[{i}] has {len(ids)} tokens and the context holds {self.context_length}; shorten it"
                )
        with self._lock if wait else self._exclusive():
            out = []
            for ids in encoded:
                with kernels.configured(self.cfg.threads, self.cfg.activations):
                    h = self.model.hidden(np.array(ids), self.model.new_cache(), prompt=True)  # [T, H]
                v = h.astype(np.float32).mean(axis=0)
                out.append(v / max(float(np.linalg.norm(v)), 1e-12))
        return np.stack(out).astype(np.float32)

    def _params(self, params, overrides) -> SamplingParams:
        return SamplingParams.from_any(params, **overrides).resolve(self.store.manifest.get("generation"))

    def _start(
        self, ids: list[int], p: SamplingParams, progress: Progress | None = None, *, chat: bool = False
    ) -> Iterator[Event]:
        """Check the request against the context and the engine's state; the generator that runs it."""
        max_tokens, plan = self.plan_run(ids, p, chat=chat)
        if self._lock.locked():
            raise EngineBusyError("the engine is busy with another generation; wait for it or cancel() it")
        cancel = threading.Event()
        self._live.add(cancel)
        return self._run(ids, p, max_tokens, cancel, progress, plan)

    def plan_run(self, ids: list[int], p: SamplingParams, *, chat: bool = False) -> tuple[int, object]:
        """Check a request against the context: (the tokens it may add, its `structured.Plan` or None).

        Raises:
            ValueError: no ids. ContextLengthError, StructureError: as `chat`.
        """
        if not ids:
            raise ValueError("the prompt is empty (no tokens); give some text")
        max_tokens = max_new_tokens(len(ids), p, self.context_length)
        plan = None
        if chat or p.format is not None or p.logit_bias:
            plan = structured.Plan(
                self.grammars,
                self.family,
                self.tokenizer,
                p,
                chat=chat,
                prompt_text=self.tokenizer.decode(ids[-16:], skip_special_tokens=False) if chat else "",
            )
        return max_tokens, plan

    def _run(
        self,
        ids: list[int],
        p: SamplingParams,
        max_tokens: int,
        cancel: threading.Event,
        progress: Progress | None,
        plan,
    ) -> Iterator[Event]:
        try:
            with self._exclusive():
                yield from decode(
                    self, ids, p, max_tokens, lambda: cancel.is_set() or _is_set(p.cancel), progress=progress, plan=plan
                )
        finally:
            self._live.discard(cancel)

    @contextlib.contextmanager
    def _exclusive(self):
        if not self._lock.acquire(blocking=False):
            raise EngineBusyError("the engine is busy with another generation; wait for it or cancel() it")
        try:
            yield
        finally:
            self._lock.release()

    @property
    def expert_stats(self) -> dict:
        """Cache and IO statistics per layer and in total (empty when all experts are resident)."""
        return self.model.experts.stats() if hasattr(self.model, "experts") else {}

    def save_popularity(self, path) -> bool:
        """Write each MoE layer's expert request counts to `path` (atomic); False when experts are resident."""
        if not isinstance(getattr(self.model, "experts", None), StreamingExperts):
            return False
        popularity.save(path, self.store.digest, self.model.experts.popularity())
        return True

    def warm_experts(self, path) -> int:
        """Fill the expert caches from the counts saved at `path` (none, or another store's: nothing).
        Returns the experts read. Call while idle: it reads from disk.

        Raises:
            PopularityError: the file is unreadable (the message says to delete it).
        """
        if not isinstance(getattr(self.model, "experts", None), StreamingExperts):
            return 0
        counts = popularity.load(path, self.store.digest)
        with self._lock:
            return self.model.experts.warm(counts) if counts else 0

    def check_experts(self, seconds: float) -> int:
        """Check, for about `seconds`, the digests of experts no read has checked yet (`verify_experts`
        "first"): the first prompt after a load then need not. Returns how many are left to check (0 when
        every expert is checked, or there is nothing to check: experts resident, or another verify mode).
        Call while idle: it reads from disk."""
        if not isinstance(getattr(self.model, "experts", None), StreamingExperts):
            return 0
        with self._lock:
            return self.model.experts.check_unchecked(seconds)

    def kv_held(self) -> int:
        """Bytes of KV state held now: the engine's own cache and its batchers' slots."""
        caches = [self.cache] + [slot.cache for b in list(self.batchers) for slot in b.slots]
        return sum(layer.k.nbytes + layer.v.nbytes for c in caches for layer in list(c.layers))

    def save_prompt_cache(self, path) -> None:
        """Write the current token ids and KV state to `path` (atomic)."""
        prompt_cache.save(path, self.store.digest, self.tokens, self.cache)

    def snapshot_prompt_cache(self) -> prompt_cache.Snapshot:
        """A copy of the current token ids and the KV rows that hold them, to write later
        (`prompt_cache.write`) or restore (`load_prompt_cache`); the engine may go on meanwhile."""
        return prompt_cache.snapshot(self.store.digest, self.tokens, self.cache)

    def load_prompt_cache(self, source) -> int:
        """Restore the token ids and KV state from a file or a `prompt_cache.Snapshot`; returns how many
        tokens it holds. The file's KV capacity and precision need not be this engine's.

        Raises:
            PromptCacheError: another store's file, truncated or corrupted, or more tokens than the
                context holds; the current state is kept.
        """
        self.cache, self.tokens = self.read_prompt_cache(source)
        return len(self.tokens)

    def read_prompt_cache(self, source) -> tuple:
        """(a new KV cache, its token ids) from a prompt-cache file or `prompt_cache.Snapshot`, for this
        engine's cache or a batcher slot's (`inference.batch`). Raises as `load_prompt_cache`."""
        if isinstance(source, prompt_cache.Snapshot):
            snap, where = source, "prompt cache"
            if snap.store != self.store.digest:
                raise prompt_cache.PromptCacheError("prompt cache belongs to another model store")
        else:
            snap, where = prompt_cache.read(source, self.store.digest), str(source)
        if len(snap.tokens) > self.context_length:
            raise prompt_cache.PromptCacheError(
                f"{where}: holds {len(snap.tokens)} tokens and the context holds {self.context_length}; prefill again"
            )
        fresh = self.model.new_cache()
        prompt_cache.restore(snap, fresh, where)
        return fresh, snap.tokens.tolist()

    def close(self) -> None:
        self.backend.backend.close()
        if hasattr(self.model, "experts"):
            self.model.experts.close()

    @classmethod
    def open(cls, store: str | os.PathLike | Store, **kw) -> "Engine":
        """Open a store. Keyword options are the fields of `EngineConfig`.

        Raises:
            OptionError: an option of the wrong type or out of range, named as in `EngineConfig`.
        """
        st = store if isinstance(store, Store) else Store(store)
        return cls(st, EngineConfig(**kw))

    @property
    def args(self):
        return self.model.args

    def reset(self) -> None:
        """Forget the current sequence."""
        self.cache = self.model.new_cache()
        self.tokens = []

    def forward(
        self, ids, *, last_only: bool = True, progress: Progress | None = None, prompt: bool = False
    ) -> np.ndarray:
        """Append `ids` to the current sequence; logits [T or 1, vocab]. `progress(done, total)` after each
        chunk; `prompt`: the ids are a prompt's, computed as a prefill whatever their number (`Model.forward`)."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        with kernels.configured(self.cfg.threads, self.cfg.activations):
            logits = self.model.forward(
                np.array(ids), self.cache, last_only=last_only, progress=progress, prompt=prompt
            )
        self.tokens.extend(ids)
        return logits

    def prefill(self, ids, *, progress: Progress | None = None) -> tuple[np.ndarray, int]:
        """Make the cache hold exactly `ids`, reusing the common prefix; (last logits [vocab], reused count).

        `progress(done, total)` over the tokens it computes: (0, total) first, then after each chunk.
        """
        ids = [int(i) for i in ids]
        n = 0
        limit = min(len(ids) - 1, len(self.tokens))  # always compute at least one row for logits
        while n < limit and ids[n] == self.tokens[n]:
            n += 1
        if n < len(self.tokens) and not self.cache.truncate(n):
            self.reset()
            n = 0
        elif n < len(self.tokens):
            del self.tokens[n:]
        if progress is not None:
            progress(0, len(ids) - n)
        return self.forward(ids[n:], progress=progress, prompt=True)[-1], n


def kv_bytes(cache, context: int) -> int:
    """Bytes the KV cache takes at `context` positions (rings are fixed; full layers grow)."""
    n = 0
    for layer in cache.layers:
        if layer.window:
            n += layer.k.nbytes + layer.v.nbytes
        else:
            n += (layer.k.nbytes + layer.v.nbytes) // layer.cap * context
    return n


def expert_slot_bytes(store) -> int:
    return sum(-(-lay.blob_size // PAGE) * PAGE for lay in store.expert_layers.values())


def lookahead_bytes(store, prefetch: int, guesses: int) -> int:
    """The gate lookahead's slots (`experts.lookahead_pools`): `prefetch` per layer, or two pools of a
    generated token's `guesses`."""
    pools, n = lookahead_pools(prefetch, len(store.expert_layers), guesses)
    return pools * n * max((-(-lay.blob_size // PAGE) * PAGE for lay in store.expert_layers.values()), default=0)


def plan_slots(store, kv: int, budget: int | None, slots: int | None, prefetch: int = 0, guesses: int = 0) -> int:
    """Expert slots per layer: given, or derived from the budget after dense + KV + runtime overhead
    and the gate lookahead's slots (`prefetch` per layer, or two pools of a token's `guesses`).

    Raises:
        RkmojoError: the budget cannot hold dense + KV + 8 slots per layer (states the minimum).
    """
    dense = store.manifest["dense"].get("size", 0)
    per_slot = expert_slot_bytes(store)  # one slot in every MoE layer
    n_experts = max(l.n_experts for l in store.expert_layers.values())
    need = min(MIN_SLOTS, n_experts)
    ahead = lookahead_bytes(store, prefetch, guesses)
    fixed = dense + kv + RUNTIME_OVERHEAD + ahead
    if budget is not None:
        fit = (budget - fixed) // per_slot
        if slots is None and fit < need:
            raise RkmojoError(
                f"memory budget {budget / 2**30:.2f} GiB cannot hold this store's dense weights, KV cache and "
                f"{need} expert slots per layer{f' (+ {ahead / 2**20:.0f} MiB of lookahead slots)' if ahead else ''}; "
                f"the minimum for {store.path.name} is "
                f"{(fixed + need * per_slot) / 2**30:.2f} GiB"
            )
        if slots is not None and slots > fit:
            raise OptionError(
                "expert_slots",
                slots,
                f"at most {max(fit, 0)} slots per layer within the memory "
                f"budget of {budget / 2**30:.2f} GiB; lower the slots or raise "
                "the budget",
            )
        slots = slots if slots is not None else int(fit)
    return max(1, min(int(slots), n_experts))


def parse_size(text: str) -> int:
    """'4G', '3.5GiB', '512M', '1024' (bytes) → bytes.

    Raises:
        RkmojoError: naming the value that does not parse.
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if t[-1:] in "KMGT" else t) * mult
    except ValueError:
        raise RkmojoError(f"memory size {text!r}: write it like 4G, 3.5GiB or 512M") from None
    if value <= 0:
        raise RkmojoError(f"memory size {text!r}: must be positive")
    return int(value)
