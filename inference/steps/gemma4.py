"""Gemma 4's compiled one-token step around its experts (rkgemma4.c), the T = 1 case of
`inference.models.gemma4.Model.layer`, per layer: the attention half (`kernels.gemma4_attn`); the
lookahead's guess of the next layer's experts and this layer's router (`kernels.gemma4_route`); the
experts as the expert source hands them over, the dense MLP while their reads land (`moe.mixture_row`,
`kernels.moe_experts`); the layer's end (`kernels.gemma4_ffn_out`).

The descriptor holds the weights from the step's build on, the K/V cache's arrays from the first token
that sees them (again when the cache is new or has grown), and the token's own fields per call.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..experts import ResidentExperts
from ..models import gemma4
from ..models.base import KVCache
from ..models.moe import expert_fields, lookahead, mixture_row, mixture_rows
from .descriptor import Descriptor, cache_arrays

# layer field → the model layer's vector it points at (absent from a layer without experts: 0)
VECTORS = {
    "attn_norm": "attn_norm",
    "post_attn_norm": "post_attn_norm",
    "q_norm": "attn.q_norm",
    "k_norm": "attn.k_norm",
    "router_in": "router_in",
    "expert_scale": "router_expert_scale",
    "mlp_norm": "mlp_norm",
    "moe_norm": "moe_norm",
    "post_mlp_norm": "post_mlp_norm",
    "post_moe_norm": "post_moe_norm",
    "post_ffn_norm": "post_ffn_norm",
    "layer_scalar": "layer_scalar",
}


class DecodeStep:
    """`step(h, cache, positions)`: h [1, H] at the one position through every layer of `model`, appending
    to `cache`; a new [1, H]."""

    def __init__(self, model: gemma4.Model):
        a = model.args
        self.model = model
        self.desc = Descriptor("gemma4", a.num_hidden_layers)
        H, K = a.hidden_size, max(a.top_k_experts, 1)
        self.h = np.zeros((1, H), np.float32)  # the residual stream, updated in place
        self.ids, self.wts = np.zeros(K, np.int64), np.zeros(K, np.float32)  # the router's (`route`)
        self.x_mlp, self.x_moe = np.zeros(H, np.float32), np.zeros(H, np.float32)  # the MLP's, experts' inputs
        self.mlp, self.y = np.zeros((1, H), np.float32), np.zeros((K, H), np.float32)  # their outputs
        # per RoPE kind (sliding, full): this token's cos and sin rows, written in place (`prepare`)
        self.tables = {kind: np.zeros((2, len(f)), np.float32) for kind, f in model.inv_freq.items()}
        self.desc.set(
            layers=a.num_hidden_layers,
            hidden=a.hidden_size,
            heads=a.num_attention_heads,
            eps=a.rms_norm_eps,
            h=self.h,
            experts=a.num_experts,
            top_k=a.top_k_experts,
            ids=self.ids,
            wts=self.wts,
            x_mlp=self.x_mlp,
            x_moe=self.x_moe,
            mlp=self.mlp,
            y=self.y,
        )
        for i, L in enumerate(model.layers):
            D, kv = a.attn_dims(i)
            table = self.tables[a.layer_types[i]]
            self.desc.set_layer(i, **{name: L[key] for name, key in VECTORS.items() if key in L})
            self.desc.set_layer(
                i,
                window=a.sliding_window if a.is_sliding(i) else 0,
                head_dim=D,
                kv_heads=kv,
                k_eq_v=int(L["v"] is None),
                rot_half=table.shape[1],
                cos=table[0],
                sin=table[1],
            )
            for name in self.desc.matrices.names:
                if L.get(name) is not None:
                    self.desc.set_matrix(i, name, L[name])
        # each layer's dense MLP as one rk_moe_experts row (slot 0 of `mlp`); whether it has experts
        self.mlp_rows = [np.array([[0, *expert_fields(L["mlp"])]], np.int64) for L in model.layers]
        self.routed = ["router" in L for L in model.layers]
        self.act = "silu" if a.hidden_activation == "silu" else "gelu_tanh"  # ACTIVATIONS' two kinds
        self.fields: dict = {}  # resident experts' kernel fields (moe.expert_fields)
        self.expert_tally = [0, 0]  # [hits, requests] of this step's sequence in batched steps (`mixture_rows`)
        self._kv: list = []  # the cache arrays the descriptor points at

    def prepare(self, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> None:
        """The descriptor for this token: its position, RoPE rows, activation flags, the cache's arrays (when
        they changed); h in `self.h`."""
        model = self.model
        pos = int(positions[0])
        held = cache_arrays(cache, pos, self._kv)
        if held is not None:
            for i, kv in enumerate(cache.layers):
                self.desc.set_layer(i, k=kv.k, v=kv.v, kpos=kv.pos, cap=kv.cap)
            self.desc["kv_f16"] = int(cache.layers[0].k.dtype == np.float16)
            self._kv = held
        for kind, table in self.tables.items():
            cos, sin = model.rope(positions, model.inv_freq[kind])
            table[0], table[1] = cos[0], sin[0]
        # this thread's mode: the dense products as `Model.dense` takes them, the router as `linear`, the
        # experts as `linear_grouped` (`mixture`)
        flag, self.group_flag, decode_flag = kernels.activation_flags()
        self.dense_flag = decode_flag if model.int8_decode else flag
        self.desc.set(q8a=int(self.dense_flag != 0), router_q8a=int(flag != 0), pos=pos)
        self.h[...] = h

    def __call__(self, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        self.prepare(h, cache, positions)
        model = self.model
        a, experts = model.args, model.experts
        H, inter, dense_inter = a.hidden_size, a.moe_intermediate_size, a.intermediate_size
        memo = self.fields if isinstance(experts, ResidentExperts) else None
        desc = self.desc.array
        for i, routed in enumerate(self.routed):
            kernels.gemma4_attn(desc, i)  # h += attention; x_mlp, x_moe

            def mlp(i=i) -> None:  # the dense MLP: computed while missing experts are read
                kernels.moe_experts(self.mlp_rows[i], H, dense_inter, self.dense_flag, self.x_mlp, self.mlp, self.act)

            if routed:
                # the next layer's guesses from the compiled router (ids, wts overwritten) ...
                lookahead(model, i, lambda j: self.h, route=lambda j, _x: self.route(j))
                kernels.gemma4_route(desc, i)  # ... then this layer's, which gemma4_ffn_out reads
                args = (self.x_moe, self.ids, self.wts, i, experts, self.h, self.y, inter, self.group_flag, memo)
                mixture_row(*args, act=self.act, during_io=mlp, combine=False)
            else:
                mlp()
            kernels.gemma4_ffn_out(desc, i)
        return self.h.copy()

    @classmethod
    def batch(cls, steps: list["DecodeStep"], h: np.ndarray, caches: list[KVCache]) -> np.ndarray:
        """Row s of h [M, H] (sequence s's token, at its cache's next position) through every layer with
        the others: per layer each sequence's attention half and router (its own calls), then the union of
        the experts they chose, each handed over by the expert source once and run on the rows that chose
        it, the dense MLPs while the reads land, and each sequence's layer end. A new [M, H] whose row s has
        the bits `steps[s](h[s:s+1], …)` gives."""
        first = steps[0]
        model = first.model
        for s, (st, cache) in enumerate(zip(steps, caches)):
            if st.model is not model:
                raise ValueError("a batch's steps must belong to one model")
            model._rope_memo = {}  # this sequence's position's RoPE rows
            st.prepare(h[s : s + 1], cache, np.array([cache.offset]))
        model._rope_memo = {}
        a, experts = model.args, model.experts
        H, inter, dense_inter = a.hidden_size, a.moe_intermediate_size, a.intermediate_size
        memo = first.fields if isinstance(experts, ResidentExperts) else None

        def mlps(i: int) -> None:  # every sequence's dense MLP
            for st in steps:
                kernels.moe_experts(st.mlp_rows[i], H, dense_inter, st.dense_flag, st.x_mlp, st.mlp, st.act)

        for i, routed in enumerate(first.routed):
            for st in steps:
                kernels.gemma4_attn(st.desc.array, i)
            if routed:
                guesses = lambda j, _x: tuple(np.concatenate(g) for g in zip(*(st.route(j) for st in steps)))  # noqa: E731
                lookahead(model, i, lambda j: None, route=guesses, tokens=True)  # every row's guesses, rank by rank
                for st in steps:
                    kernels.gemma4_route(st.desc.array, i)
                seqs = [(st.x_moe, st.ids, st.wts, st.h, st.y) for st in steps]
                mixture_rows(
                    seqs,
                    i,
                    experts,
                    inter,
                    first.group_flag,
                    memo,
                    act=first.act,
                    during_io=lambda i=i: mlps(i),
                    combine=False,
                    tally=[st.expert_tally for st in steps],
                )
            else:
                mlps(i)
            for st in steps:
                kernels.gemma4_ffn_out(st.desc.array, i)
        return np.concatenate([st.h for st in steps])

    def route(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's router on `self.h`: ids [1, K] and weights [1, K], as `Model.route`."""
        kernels.gemma4_route(self.desc.array, i)
        return self.ids[None].copy(), self.wts[None].copy()
