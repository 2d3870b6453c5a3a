"""Cache slots lent to a prompt's lookahead by the layers its pass has finished.

A prompt's lookahead reads the next layer's experts beyond its pool into cache slots of other layers: the
layers this pass has finished first (only a later pass or token needs their experts), then, where those are
too few (the pass's first layers), the layers it reaches last. A lent slot's cached expert leaves its cache.
Contract: a lender's next `run` takes its slots back first (`reclaim`), and every slot lent is empty again
once the borrowing layer has computed its expert, so what a layer caches never depends on a loan.
"""

from __future__ import annotations

from .cache import LayerCache, SlotPool

# lender layer -> [(slot, the read's batch, borrowing layer, expert)]
Loans = dict[int, list[tuple[int, object, int, int]]]


class Lending:
    """The loans of every MoE layer's cache slots.

    Args:
        caches: each MoE layer's cache.
        pending: the lookahead's reads per borrowing layer ({layer: {expert: (request, batch)}}), from which
            an ended loan's read is forgotten (`forget`).
    """

    def __init__(self, caches: dict[int, LayerCache], pending: dict[int, dict[int, tuple]]):
        self.caches = caches
        self.pending = pending
        self.order = sorted(caches)
        self.place = {layer: k for k, layer in enumerate(self.order)}
        self.loans: Loans = {}
        self.observer = None  # told each cached expert a loan drops (`cachesim.TraceRecorder.lent`)

    def borrow(self, layer: int, n: int, length: int) -> list[tuple[SlotPool, int, int]]:
        """Up to `n` cache slots of at least `length` bytes, as (pool, slot, lender), lent by the layers
        before the one running now (`layer` is the next one). Empty slots first, then the least requested
        experts (LFU counts), which leave the cache. Where those are too few, the layers after `layer` lend
        too, the last to run first: their experts that leave the cache are read again when they run, late
        in the pass, where the prompt waits for the CPU and the disk has time. A slot lent to a layer that
        has run since is lent again once no read is landing in it. The caller records each loan (`lend`)."""
        place = self.place[layer]
        later = self.order[place + 1 :][::-1]
        offers = []
        for lender in self.order[: max(place - 1, 0)] + later:
            cache = self.caches[lender]
            rank = later.index(lender) + 1 if self.place[lender] > place else 0  # finished layers first
            if cache.pool.slot_bytes < length:
                continue
            loans = self.loans.get(lender, [])
            for loan in list(loans):
                _, batch, borrower, _ = loan
                if self.place[borrower] < place - 1:  # it has run: the slot is free once its read ended
                    batch.cancel()
                    if not batch.pending:
                        loans.remove(loan)
                        self.forget(loan)
            lent = {s for s, *_ in loans}
            for s in range(cache.pool.n):
                if s not in lent:
                    e = int(cache.slot_expert[s])
                    offers.append((rank, -1 if e < 0 else int(cache.counts[e]), lender, s))
        offers.sort()
        out = []
        for *_, lender, s in offers[:n]:
            e = int(self.caches[lender].slot_expert[s])
            self.caches[lender].drop(s)
            if e >= 0 and self.observer is not None:
                self.observer.lent(lender, e)
            out.append((self.caches[lender].pool, s, lender))
        return out

    def lend(self, lender: int, slot: int, batch, layer: int, expert: int) -> None:
        """Record that `lender`'s `slot` reads `expert` of `layer` in `batch`."""
        self.loans.setdefault(lender, []).append((slot, batch, layer, expert))

    def reclaim(self, lender: int) -> None:
        """Take back the slots `lender` lent: reads not started are dropped, running ones waited for, and a
        borrowing layer that has not computed its expert yet forgets it (it reads it itself)."""
        for loan in self.loans.pop(lender, ()):
            loan[1].cancel()
            loan[1].abandon()
            self.forget(loan)

    def reclaim_all(self) -> None:
        for lender in list(self.loans):
            self.reclaim(lender)

    def forget(self, loan) -> None:
        """A borrowing layer that has not computed the expert of an ended loan (its run failed) reads it itself."""
        _, batch, layer, e = loan
        got = self.pending.get(layer, {}).get(e)
        if got is not None and got[1] is batch:
            del self.pending[layer][e]
