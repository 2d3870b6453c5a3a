"""The engine: one opened store, its model, the expert cache and the KV state of one conversation.

`Engine.open(store, ...)` once per process. `engine.forward(ids)` continues the current sequence;
`engine.prefill(ids)` reuses the longest common prefix with what the KV cache already holds and
computes only the rest.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import prompt_cache
from .errors import RkmojoError
from .experts import StreamingExperts
from .experts.cache import PAGE
from .generate import GenerationMixin
from .model import load_model
from .store import Store

# Python, numpy, kernels and activations: what the process needs besides weights, KV and slots
RUNTIME_OVERHEAD = 384 * 2**20
MIN_SLOTS = 8

@dataclass
class EngineConfig:
    """Everything `Engine.open` was asked for (passed down; the engine has no global state)."""

    memory_budget: int | None = None
    expert_slots: int | None = None
    policy: str = "lfu"
    io: str = "auto"
    verify_experts: str = "first"
    prefetch: int = 0  # gate-lookahead prefetch slots per layer (0: off)
    threads: int | None = None
    chunk: int = 128
    backend: str = "auto"
    context: int = 4096
    kv_dtype: str = "f16"  # KV cache precision: "f16" (half the memory and bandwidth) or "f32"
    activations: str | None = None  # "f32" (exact), "q8" (int8 dot products), "experts" (int8 in MoE experts)


class Engine(GenerationMixin):
    def __init__(self, store: Store, cfg: EngineConfig):
        self.store = store
        self.cfg = cfg
        if isinstance(cfg.memory_budget, str):
            cfg.memory_budget = parse_size(cfg.memory_budget)
        if cfg.threads:
            from .kernels import set_threads
            set_threads(cfg.threads)
        if cfg.activations is not None:
            from .kernels import ACTIVATIONS, set_activations
            if cfg.activations not in ACTIVATIONS:
                raise RkmojoError(f"--activations {cfg.activations}: choose one of {', '.join(ACTIVATIONS)}")
            set_activations(cfg.activations)
        if cfg.backend not in ("auto", "cpu"):
            raise RkmojoError(f"backend {cfg.backend!r} is not available on this machine; use 'cpu' or 'auto'")
        streaming = bool(store.expert_layers) and (cfg.memory_budget is not None or cfg.expert_slots is not None)
        if streaming:
            store.load_dense()
        if cfg.kv_dtype not in ("f16", "f32"):
            raise RkmojoError(f"--kv-dtype {cfg.kv_dtype}: choose f16 or f32")
        self.model = load_model(store, chunk=cfg.chunk, kv_dtype=cfg.kv_dtype)
        self.cache = self.model.new_cache()
        self.tokens: list[int] = []  # the ids whose K/V the cache holds, in order
        self.slots = None
        if streaming:
            self.slots = plan_slots(store, kv_bytes(self.cache, cfg.context), cfg.memory_budget, cfg.expert_slots,
                                    int(cfg.prefetch))
            self.model.experts = StreamingExperts(store, self.slots, policy=cfg.policy, io=cfg.io,
                                                  verify=cfg.verify_experts, prefetch=int(cfg.prefetch))

    @property
    def expert_stats(self) -> dict:
        """Cache and IO statistics per layer and in total (empty when all experts are resident)."""
        return self.model.experts.stats() if hasattr(self.model, "experts") else {}

    def save_prompt_cache(self, path) -> None:
        """Write the current token ids and KV state to `path` (atomic)."""
        prompt_cache.save(path, self.store.digest, self.tokens, self.cache)

    def load_prompt_cache(self, path) -> int:
        """Restore the token ids and KV state from `path`; returns how many tokens it holds.

        Raises:
            PromptCacheError: another store's file, truncated or corrupted; the current state is kept.
        """
        fresh = self.model.new_cache()
        tokens = prompt_cache.load(path, self.store.digest, fresh)
        self.cache, self.tokens = fresh, tokens
        return len(tokens)

    def close(self) -> None:
        if hasattr(self.model, "experts"):
            self.model.experts.close()

    @classmethod
    def open(cls, store: str | os.PathLike | Store, **kw) -> "Engine":
        """Open a store. Keyword options are the fields of `EngineConfig`."""
        st = store if isinstance(store, Store) else Store(store)
        return cls(st, EngineConfig(**kw))

    @property
    def args(self):
        return self.model.args

    def reset(self) -> None:
        """Forget the current sequence."""
        self.cache = self.model.new_cache()
        self.tokens = []

    def forward(self, ids, *, last_only: bool = True) -> np.ndarray:
        """Append `ids` to the current sequence; logits [T or 1, vocab]."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        logits = self.model.forward(np.array(ids), self.cache, last_only=last_only)
        self.tokens.extend(ids)
        return logits

    def prefill(self, ids) -> tuple[np.ndarray, int]:
        """Make the cache hold exactly `ids`, reusing the common prefix; (last logits [vocab], reused count)."""
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
        return self.forward(ids[n:])[-1], n


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


def plan_slots(store, kv: int, budget: int | None, slots: int | None, prefetch: int = 0) -> int:
    """Expert slots per layer: given, or derived from the budget after dense + KV + runtime overhead
    (and the `prefetch` slots per layer, when gate-lookahead prefetch is on).

    Raises:
        RkmojoError: the budget cannot hold dense + KV + 8 slots per layer (states the minimum).
    """
    dense = store.manifest["dense"].get("size", 0)
    per_slot = expert_slot_bytes(store)  # one slot in every MoE layer
    n_experts = max(l.n_experts for l in store.expert_layers.values())
    need = min(MIN_SLOTS, n_experts)
    fixed = dense + kv + RUNTIME_OVERHEAD + prefetch * per_slot
    if budget is not None:
        fit = (budget - fixed) // per_slot
        if slots is None and fit < need:
            raise RkmojoError(
                f"memory budget {budget / 2**30:.2f} GiB cannot hold this store's dense weights, KV cache and "
                f"{need} expert slots per layer{f' (+ {prefetch} prefetch slots)' if prefetch else ''}; "
                f"the minimum for {store.path.name} is "
                f"{(fixed + need * per_slot) / 2**30:.2f} GiB"
            )
        if slots is not None and slots > fit:
            raise RkmojoError(
                f"--expert-slots {slots} does not fit the memory budget {budget / 2**30:.2f} GiB "
                f"(at most {max(fit, 0)} slots per layer fit); lower the slots or raise the budget"
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
