"""Repacking of resident dense q4 matrices at model load, for the kernels' one-row int8 path.

A q4 matrix repacked (`inference.quant.repack_q4`, kind "q4r") holds 16 output rows side by side, so the
one-activation-row int8 product (decode) computes 16 rows per vector instruction with no horizontal sums
("repacked q4" in rkkernels.c). Every other call on it (prompts, float activations) unpacks 16 rows at a
time into the store layout and gets the bits the store's matrix gives; the int8 one-row results agree
with the row-major kernel within float rounding.

Only resident dense matrices are repacked (attention, a dense layer's MLP, the router, the LM head):
routed experts stream into cache slots in the store layout and keep the row-major kernel, so streamed
output stays bit-identical to all-resident output. The repacked copy replaces the model's reference to
the store's matrix (an mmap the kernels then stop touching), so the weights are not held twice; a tied
LM head is the one exception (the embedding keeps the store's rows for its lookups).

Which matrices: those whose one-row products use int8 activations in the engine's mode (`_lib.ACTIVATIONS`):
"q8", every resident dense q4 matrix; "decode", the layers of a model with a compiled decode step
(`llama_decode`, `moe_decode_layer`: their attention and dense MLP matrices) and its LM head (int8 for a
generated token, `Transformer.forward`), whose other calls (prompts) are float; "f32" and "experts", none.

Kill switch: RKMOJO_REPACK=0 keeps the store layout everywhere (the old kernel), e.g. to time both.
"""

from __future__ import annotations

import os

from ..quant import REPACKED_Q4, QTensor, repack_q4

ENV = "RKMOJO_REPACK"


def enabled() -> bool:
    """False when $RKMOJO_REPACK is 0 / off / no / false (the kill switch)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "no", "false")


def repack(w, in_place: bool = False):
    """`w` repacked when it is a q4 matrix (a new QTensor; `in_place`: in `w`'s memory where it can be,
    see `repack_q4`), else `w` itself."""
    if isinstance(w, QTensor) and w.kind == "q4" and len(w.shape) == 2:
        return repack_q4(w, in_place)
    return w


def repack_model(model, mode: str) -> int:
    """Repacks `model`'s resident dense q4 matrices in place for activation mode `mode` (see above); the
    bytes repacked (0 when switched off or nothing applies). Call before the first forward.

    Memory: a store read into anonymous memory (`Store.load_dense`, the streaming engine) is rewritten in
    place, matrix by matrix, so the weights stay one copy; the memory-mapped store file is read-only, so
    there the repacked arrays are new and the file's pages, no longer touched, are the kernel's to drop.
    The model's matrices must be its own (an engine's store): in place, the store's views become stale."""
    if not enabled() or mode not in ("q8", "decode"):
        return 0
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not all(isinstance(L, dict) for L in layers):
        return 0
    if mode == "decode" and not getattr(model, "fused_decode", False):
        return 0  # no compiled decode step (llama_decode, moe_decode_layer): no int8 one-row dense products
    embed = getattr(model, "embed", None)
    done: dict[int, QTensor] = {}  # id of a matrix -> its repacked one (a matrix held twice is repacked once)

    def one(w):
        if id(w) not in done:
            done[id(w)] = repack(w, in_place=w is not embed)  # the embedding keeps its rows for lookups
        return done[id(w)]

    def walk(d: dict) -> None:
        for key, value in d.items():
            if isinstance(value, dict):
                walk(value)
            elif isinstance(value, QTensor):
                d[key] = one(value)

    for L in layers:
        walk(L)
    if isinstance(getattr(model, "lm_head", None), QTensor):  # "decode": a generated token's head is int8
        model.lm_head = one(model.lm_head)
    return sum(new.nbytes for new in done.values() if new.kind == REPACKED_Q4)
