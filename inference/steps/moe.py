"""The compiled one-token step of the MoE architectures, Qwen3-MoE and OLMoE (rkmoedecode.c): per layer
its attention half and router in one C call (`kernels.moe_decode_layer`), then its routed experts as the
expert source hands them over (`models.moe.mixture_row`), the T = 1 case of
`inference.models.qwen3_moe.Model.layer`.

Its descriptor extends the Llama step's (dense.py) with the router's fields, the q/k norms and where the
routed layers' outputs go (x, ids, wts); an architecture with this attention and this routing needs only
its model's flags (`qk_norm_whole`, `clip_qkv`) and a line in `inference.steps.STEPS`.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..experts import ResidentExperts
from ..models import qwen3_moe
from ..models.base import KVCache, rms_norm
from ..models.moe import lookahead, mixture_row, mixture_rows
from . import dense


class DecodeStep(dense.DecodeStep):
    """`step(h, cache, positions)`: h [1, H] at the one position through every layer of `model`, each
    layer's attention half in one call, then its experts through `model.experts`; a new [1, H]."""

    kind = "moe"

    def __init__(self, model: qwen3_moe.Model):
        super().__init__(model)  # the Llama step's fields, and every matrix the layers have (router too)
        a = model.args
        clip = getattr(a, "clip_qkv", None)
        H, K = a.hidden_size, a.num_experts_per_tok
        self.x = np.zeros(H, np.float32)  # the routed layers' outputs: normed MLP input, top-k ids, weights
        self.ids = np.zeros(K, np.int64)
        self.wts = np.zeros(K, np.float32)
        self.y = np.zeros((K, H), np.float32)  # each chosen expert's output, by top-k slot
        self.desc.set(
            experts=a.num_experts,
            top_k=K,
            norm_topk=int(bool(a.norm_topk_prob)),
            qk_whole=int(model.qk_norm_whole),
            clip_on=int(clip is not None),
            clip=float(clip or 0.0),
            x=self.x,
            ids=self.ids,
            wts=self.wts,
        )
        for i, L in enumerate(model.layers):
            self.desc.set_layer(i, q_norm=L["q_norm"], k_norm=L["k_norm"], routed=int("router" in L))
        self.routed = [("router" in L) for L in model.layers]
        self.fields: dict = {}  # resident experts' kernel fields (moe.expert_fields)
        self.expert_tally = [0, 0]  # [hits, requests] of this step's sequence in batched steps (`mixture_rows`)

    def __call__(self, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        h, _held = self.prepare(h, cache, positions)
        flag = kernels.moe_decode_flags(self.desc.array)
        model = self.model
        a, experts = model.args, model.experts
        memo = self.fields if isinstance(experts, ResidentExperts) else None
        prefetching = getattr(experts, "wants_prefetch", False)
        eps, inter = a.rms_norm_eps, a.moe_intermediate_size
        row = h[0]
        for i, routed in enumerate(self.routed):
            kernels.moe_decode_layer(self.desc.array, i)
            if not routed:
                continue
            if prefetching:
                lookahead(model, i, lambda j: rms_norm(h, model.layers[j]["mlp_norm"], eps))
            mixture_row(self.x, self.ids, self.wts, i, experts, row, self.y, inter, flag, memo)
        return h

    @classmethod
    def batch(cls, steps: list["DecodeStep"], h: np.ndarray, caches: list[KVCache]) -> np.ndarray:
        """Row s of h [M, H] (sequence s's token, at its cache's next position) through every layer with
        the others: each layer's attention half for all M rows in one call (`moe_decode_layer_batch`: the
        dense matrices and router read once), then the union of the experts they chose, each handed over by
        the expert source once and run on the rows that chose it (`mixture_rows`). A new [M, H] whose row s
        has the bits `steps[s](h[s:s+1], …)` gives."""
        rows, held = dense.prepare_all(steps, h, caches)
        descs = [st.desc.array for st in steps]
        flag = 0
        for d in descs:
            flag = kernels.moe_decode_flags(d)
        first = steps[0]
        model = first.model
        a, experts = model.args, model.experts
        memo = first.fields if isinstance(experts, ResidentExperts) else None
        prefetching = getattr(experts, "wants_prefetch", False)
        eps, inter = a.rms_norm_eps, a.moe_intermediate_size
        for i, routed in enumerate(first.routed):
            kernels.moe_decode_layer_batch(descs, i)
            if not routed:
                continue
            if prefetching:  # every row's guesses for the next layer, rank by rank
                lookahead(
                    model,
                    i,
                    lambda j: np.concatenate([rms_norm(r, model.layers[j]["mlp_norm"], eps) for r in rows]),
                    tokens=True,
                )
            seqs = [(st.x, st.ids, st.wts, r[0], st.y) for st, r in zip(steps, rows)]
            mixture_rows(seqs, i, experts, inter, flag, memo, tally=[st.expert_tally for st in steps])
        del held
        return np.concatenate(rows)
