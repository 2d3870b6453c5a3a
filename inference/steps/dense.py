"""Llama's compiled one-token step: a generated token through every layer in one C call
(`kernels.llama_decode`, rkdecode.c), the T = 1 case of `inference.models.llama.Model.layer`.

The descriptor holds the weights from the step's build on, the K/V cache's arrays from the first token
that sees them (again when the cache is new or has grown), and the token's own fields per call. The MoE
step (moe.py) extends this descriptor, as its layout extends this one in rkdescriptors.h: the same header
and layer fields first, set here.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..models import llama
from ..models.base import KVCache
from .descriptor import Descriptor, cache_arrays


class DecodeStep:
    """`step(h, cache, positions)`: h [1, H] at the one position through every layer of `model`, appending
    to `cache`; a new [1, H]."""

    kind = "decode"  # the descriptor's layout (`rk_fields`)

    def __init__(self, model: llama.Model):
        a = model.args
        self.model = model
        self.desc = Descriptor(self.kind, a.num_hidden_layers)
        self.desc.set(
            layers=a.num_hidden_layers,
            hidden=a.hidden_size,
            heads=a.num_attention_heads,
            kv_heads=a.num_key_value_heads,
            head_dim=a.head_dim,
            inter=a.intermediate_size,
            rot_half=len(model.inv_freq),
            eps=a.rms_norm_eps,
            scale=a.head_dim**-0.5,
        )
        for i, L in enumerate(model.layers):
            self.desc.set_layer(i, attn_norm=L["attn_norm"], mlp_norm=L["mlp_norm"])
            for name in self.desc.matrices.names:  # a layer's dense MLP sits under "mlp"; absent ones stay 0
                w = L.get(name, L.get("mlp", {}).get(name))
                if w is not None:
                    self.desc.set_matrix(i, name, w)
        self._kv: list = []  # the cache arrays the descriptor points at

    def __call__(self, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> np.ndarray:
        h, _ = self.prepare(h, cache, positions)
        kernels.llama_decode(self.desc.array)
        return h

    @classmethod
    def batch(cls, steps: list["DecodeStep"], h: np.ndarray, caches: list[KVCache]) -> np.ndarray:
        """Row s of h [M, H] (sequence s's token, at its cache's next position) through every layer with
        the others (`kernels.llama_decode_batch`): each sequence its own step (descriptor) and cache, every
        matrix read once for all M rows; a new [M, H] whose row s has the bits `steps[s](h[s:s+1], …)` gives."""
        rows, held = prepare_all(steps, h, caches)
        kernels.llama_decode_batch([st.desc.array for st in steps])
        del held
        return np.concatenate(rows)

    def prepare(self, h: np.ndarray, cache: KVCache, positions: np.ndarray) -> tuple[np.ndarray, tuple]:
        """The descriptor for this token: the K/V arrays (when they changed), position, h, cos/sin. Returns
        the (new) h array the call updates, and this token's RoPE rows (cos, sin)."""
        pos = int(positions[0])
        held = cache_arrays(cache, pos, self._kv)
        if held is not None:
            for i, kv in enumerate(cache.layers):
                self.desc.set_layer(i, k=kv.k, v=kv.v, kpos=kv.pos)
            self.desc.set(kv_f16=int(cache.layers[0].k.dtype == np.float16), kv_cap=cache.layers[0].cap)
            self._kv = held
        cos, sin = self.model.rope(positions, self.model.inv_freq)
        h = np.array(h, dtype=np.float32, order="C")
        cos, sin = np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32)
        self.desc.set(pos=pos, h=h, cos=cos, sin=sin)
        return h, (cos, sin)


def prepare_all(steps: list, h: np.ndarray, caches: list[KVCache]) -> tuple[list[np.ndarray], list]:
    """Each step's descriptor for its sequence's token (row s of h, at caches[s].offset): the h rows the
    calls update, and the arrays the descriptors point at (RoPE rows), to keep until the calls return."""
    model = steps[0].model
    rows, held = [], []
    for s, (step, cache) in enumerate(zip(steps, caches)):
        if step.model is not model:
            raise ValueError("a batch's steps must belong to one model")
        model._rope_memo = {}  # this sequence's position's RoPE rows
        row, keep = step.prepare(h[s : s + 1], cache, np.array([cache.offset]))
        rows.append(row)
        held.append(keep)
    model._rope_memo = {}
    return rows, held
