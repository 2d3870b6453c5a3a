"""The MoE switch shared by every MoE architecture: routing helpers and the expert mixture.

Routers differ per architecture (they live in the architecture files); what happens after the
top-k choice is the same: each chosen expert runs once on all the rows that chose it, and the
weighted outputs are combined in top-k slot order, a fixed order, so the result does not depend
on which experts happened to be loaded first.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..backends import CPU
from ..kernels import linear, linear_grouped, linear_many, matrix_fields, moe_combine, moe_experts
from ..quant import QTensor


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the k largest entries per row, largest first (ties: lower index)."""
    idx = np.argsort(-scores, axis=-1, kind="stable")[:, :k]  # [T, K]
    return idx, np.take_along_axis(scores, idx, axis=-1)


def expert_mlp(x: np.ndarray, w: dict[str, QTensor], act: Callable, ops=None) -> np.ndarray:
    """One gated MLP: down(act(gate(x)) × up(x)). x [n, H] → [n, H]. `ops`: a backend
    (`inference.backends`) for the matmuls; the CPU kernels when None."""
    if ops is not None:
        g, u = ops.linear_many(x, (w["gate"], w["up"]))
        return ops.linear(act(g) * u, w["down"])
    g, u = linear_many(x, (w["gate"], w["up"]))  # one kernel call: both read the same x
    return linear(act(g) * u, w["down"])


def experts_mlp(pairs: list[tuple[np.ndarray, dict[str, QTensor]]], act: Callable) -> list[np.ndarray]:
    """expert_mlp for several experts, each on its own rows, in two kernel calls (gate and up of all,
    then all downs); each result has the bits expert_mlp gives it alone (with the same activations)."""
    gu = linear_grouped([(x, w[name]) for x, w in pairs for name in ("gate", "up")])
    h = [act(g) * u for g, u in zip(gu[0::2], gu[1::2])]  # per expert, as expert_mlp does
    return linear_grouped([(hi, w["down"]) for hi, (_, w) in zip(h, pairs)])


def mixture(
    x: np.ndarray,
    idx: np.ndarray,
    weights: np.ndarray,
    layer: int,
    source,
    act: Callable,
    during_io: Callable | None = None,
    ops=CPU,
):
    """Σ_k weights[t, k] · expert_{idx[t, k]}(x[t]) for every row t, and during_io()'s result.

    x [T, H], idx [T, K] int, weights [T, K] float32 → ([T, H], extra). `source` (resident or
    streaming experts) decides when each expert's weights are at hand and hands them over in batches
    (all at hand together: one grouped kernel call per matrix role); `during_io` is work that needs no
    routed expert (a shared expert), run while missing experts are read. `ops` (a backend): an expert
    with at least `ops.expert_min_rows` rows runs through `ops.expert_mlp` (the NPU), the rest on the CPU.
    """
    T, K = idx.shape
    y = np.zeros((T, K, x.shape[1]), np.float32)  # [T, K, H]
    npu_rows = ops.expert_min_rows

    def compute(batch: list[tuple[int, dict[str, QTensor]]]) -> None:
        where = [np.nonzero(idx == e) for e, _ in batch]  # (rows, slots) of each expert
        on_cpu = []
        for (rows, slots), (e, w) in zip(where, batch):
            o = None
            if npu_rows is not None and len(rows) >= npu_rows:
                o = ops.expert_mlp(x[rows], w, act, (layer, e))  # None: the NPU declined it
            if o is None:
                on_cpu.append(((rows, slots), w))
            else:
                y[rows, slots] = o
        xs = {}  # one array per row set: the kernels prepare shared activations once (decode: all experts)
        pairs = [(xs.setdefault(rows.tobytes(), x[rows]), w) for (rows, _), w in on_cpu]
        outs = experts_mlp(pairs, act) if pairs else []
        for ((rows, slots), _), o in zip(on_cpu, outs):
            y[rows, slots] = o

    extra = source.run(layer, np.unique(idx).tolist(), compute, during_io)
    y *= weights[:, :, None].astype(np.float32)
    out = y[:, 0].copy()
    for k in range(1, K):  # fixed order: the result never depends on which expert arrived first
        out += y[:, k]
    return out, extra


def expert_fields(w: dict[str, QTensor], memo: dict | None = None) -> list[int]:
    """The kernel fields (`matrix_fields`) of an expert's gate, up and down. `memo`: id(weights) → (the
    weights, their fields), for sources that hand over the same weight objects each time (resident
    experts); an entry holds its weights, so no other object can take their id meanwhile."""
    got = memo.get(id(w)) if memo is not None else None
    if got is not None and got[0] is w:
        return got[1]
    fields = [f for n in ("gate", "up", "down") for f in matrix_fields(w[n])]
    if memo is not None:
        memo[id(w)] = (w, fields)
    return fields


def mixture_row(
    x: np.ndarray,
    ids: np.ndarray,
    weights: np.ndarray,
    layer: int,
    source,
    h: np.ndarray,
    y: np.ndarray,
    inter: int,
    flag: int,
    memo: dict | None = None,
    *,
    act: str = "silu",
    during_io: Callable | None = None,
    combine: bool = True,
) -> None:
    """`mixture` of one row (decode), added to h in place: h += Σ_k weights[k] · expert_{ids[k]}(x), the
    products summed in slot order as `mixture` does, through the compiled kernels (rkmoedecode.c)
    without mixture's per-row index arrays. `act`: the experts' activation ("silu", "gelu_tanh");
    `during_io`: as `mixture`'s; `combine` False: leave each expert's output in y (h unused).

    x [H], ids [K] int64 (distinct), weights [K], h [H], y [K, H] scratch (all contiguous, float32 but
    ids); `inter` the experts' width; `flag` the experts' kind-code flag (`kernels.moe_decode_flags`);
    `memo`: see `expert_fields` (None: a source whose weight objects are new each time, as streaming).
    `source` decides when each expert's weights are at hand, as for `mixture`; each expert's result
    has the same bits in whatever batch it arrives.
    """
    order = ids.tolist()
    slot = {e: k for k, e in enumerate(order)}
    H = x.shape[0]

    def compute(batch: list[tuple[int, dict[str, QTensor]]]) -> None:
        desc = np.array([[slot[e], *expert_fields(w, memo)] for e, w in batch], np.int64)
        moe_experts(desc, H, inter, flag, x, y, act)

    source.run(layer, sorted(order), compute, during_io)  # in id order, as mixture's np.unique
    if combine:
        moe_combine(y, weights, h)


def mixture_rows(
    seqs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    layer: int,
    source,
    inter: int,
    flag: int,
    memo: dict | None = None,
    *,
    act: str = "silu",
    during_io: Callable | None = None,
    combine: bool = True,
    tally: list | None = None,
) -> None:
    """`mixture_row` of several sequences' rows at once (a batched decode step): seqs[s] = (x, ids,
    weights, h, y) as mixture_row takes them (`act`, `during_io`, `combine` too). The source hands over
    the union of the experts they chose once (a streamed expert is read once for every row that chose it);
    each expert runs on each row that chose it, and each row's h (or y) gets mixture_row's bits (an
    expert's result does not depend on its batch). `tally`: per sequence a [hits, requests] pair, to which
    its experts are added (a hit: in the source's cache when asked; a streaming source's only)."""
    slots = [{e: k for k, e in enumerate(ids.tolist())} for _, ids, _, _, _ in seqs]
    cache = getattr(source, "caches", {}).get(layer)
    if tally is not None and cache is not None:
        for count, slot in zip(tally, slots):
            count[0] += sum(e in cache.where for e in slot)
            count[1] += len(slot)
    union = sorted(set().union(*slots))
    H = seqs[0][0].shape[0]

    def compute(batch: list[tuple[int, dict[str, QTensor]]]) -> None:
        for (x, _, _, _, y), slot in zip(seqs, slots):
            mine = [[slot[e], *expert_fields(w, memo)] for e, w in batch if e in slot]
            if mine:
                moe_experts(np.array(mine, np.int64), H, inter, flag, x, y, act)

    source.run(layer, union, compute, during_io)
    if combine:
        for _, _, weights, h, y in seqs:
            moe_combine(y, weights, h)


def lookahead(
    model, i: int, router_input: Callable[[int], np.ndarray], route: Callable | None = None, *, tokens: bool = False
) -> None:
    """Gate lookahead: apply layer i+1's router to what layer i sees now and start reading the
    experts it predicts (only when the expert source prefetches; off by default).

    router_input(j) gives layer j's router input computed from the current hidden state; `route(j, x)`
    the router (default `model.route`; a compiled step passes its own). `tokens`: the rows are generated
    tokens stepped together (a batched decode step), their guesses read ahead as one token's are, rank by
    rank (every row's best first, then every row's second, …); else a prompt's rows (one row: a token).
    """
    j = i + 1
    if not getattr(model.experts, "wants_prefetch", False) or j >= len(model.layers) or "router" not in model.layers[j]:
        return
    idx, _ = (route or model.route)(j, router_input(j))  # [rows, K], each row's best first
    if tokens:
        model.experts.prefetch(j, np.asarray(idx).T.reshape(-1).tolist(), rows=1)
    else:
        model.experts.prefetch(j, idx.reshape(-1).tolist(), rows=len(idx))  # rows' top-k in score order
