"""Repacking of q4, q4_1 and q8_0 matrices for the kernels' int8 path: resident dense ones at model load,
q4 experts where they land.

A q4 matrix repacked (`inference.quant.repack_q4`, kind "q4r") holds 16 output rows side by side, so an
int8 product computes 16 rows per vector instruction with no horizontal sums, each activation row with
the bits it has alone ("repacked q4" in rkkernels.c). A q4_1 matrix (a GGUF model's) repacked ("q4_1r",
`quant.repack_q4_1`) is the same layout with groups of one block of 32, and a q8_0 matrix ("q8_0r",
`quant.repack_q8_0`: a GGUF model's Q8_0 matrices, its tied LM head) too, with int8 weights. Float calls on it (prompts in the decode mode)
unpack 16 rows at a time into the store layout and get the bits the store's matrix gives; the int8
results agree with the row-major kernel within float rounding.

Routed experts are repacked wherever they are held, since their grouped calls take int8 activations in
every mode but "f32", prompts included (`repack_experts`): an expert read into a cache slot is repacked
in place as it lands (the compiled `kernels.repack_q4`), an all-resident expert into a copy at load. Both hold the same layout, so streamed output stays bit-identical to
all-resident output; an all-resident engine whose copies would not fit in the available memory keeps
its experts memory-mapped in the store layout (`ResidentExperts.not_repacked`), and its bits then are
the row-major kernel's. Int8 calls on a repacked matrix run in lanes for any number of activation rows
(a row's bits are those it has alone).

Dense matrices: the repacked copy replaces the model's reference to the store's matrix (an mmap the
kernels then stop touching), so the weights are not held twice. A tied LM head is repacked like the
rest. Where that was in place (a store read into memory: the streaming engine), the embedding's lookups
unpack the panels holding their rows (`QTensor.rows`), so a 262144-row head is not held twice; from a
memory map the embedding keeps the store's rows, which a lookup reads faster than it unpacks panels.

Which dense matrices: those whose one-row products use int8 activations in the engine's mode (`_lib.ACTIVATIONS`):
"q8", every resident dense q4, q4_1 and q8_0 matrix (q4_1, q8_0: a GGUF model's, repacked into new arrays);
"decode", the layers of a model whose generated tokens take int8 in their dense products
(`Transformer.int8_decode`: the compiled steps `llama_decode` and `moe_decode_layer`, or Gemma 4's
`gemma4_attn` and layer calls; their attention and dense MLP matrices) and its LM head (int8 for a generated token,
`Transformer.forward`), whose other calls (prompts) are float; "f32" and "experts", none.

Experts: in "q8", "experts" and "decode" (their grouped calls' int8), matrices whose rows fill whole panels.

The engine calls `repack_model` unless its `repack` option is off, which keeps the store layout everywhere.
"""

from __future__ import annotations

import numpy as np

from ..quant import REPACKED, REPACKED_Q4, RP, QTensor, repack_q4, repack_q4_1, repack_q8_0


def repack(w, in_place: bool = False):
    """`w` repacked when it is a q4 matrix (a new QTensor; `in_place`: in `w`'s memory where it can be,
    see `repack_q4`) or a q4_1 or q8_0 one (new arrays, `repack_q4_1`, `repack_q8_0`), else `w` itself."""
    if isinstance(w, QTensor) and w.kind == "q4" and len(w.shape) == 2:
        if w.shape[0] % RP == 0:  # the compiled copy: in place, panel by panel (a 262144-row head in 3 GiB)
            from . import repack_q4 as compiled  # the package imports this module's users; import late

            return compiled(w, in_place and all(p.flags.writeable and p.flags.c_contiguous for p in w.parts.values()))
        return repack_q4(w, in_place)
    if isinstance(w, QTensor) and w.kind == "q4_1" and len(w.shape) == 2:
        return repack_q4_1(w)
    if isinstance(w, QTensor) and w.kind == "q8_0" and len(w.shape) == 2:
        return repack_q8_0(w)
    return w


def repackable_kind(kind: str, shape) -> bool:
    """Whether an expert matrix of this kind and shape is repacked: q4 whose rows fill whole panels (in
    place, no padding). Also what `rkmojo repack` rewrites on disk (`inference.store.relayout`)."""
    return kind == "q4" and len(shape) == 2 and shape[0] % RP == 0


def expert_repackable(w) -> bool:
    """Whether an expert matrix is repacked (`repackable_kind`)."""
    return isinstance(w, QTensor) and repackable_kind(w.kind, w.shape)


def repack_expert(weights: dict, in_place: bool) -> dict:
    """One expert's matrices ({name: QTensor}) with the repackable ones repacked (`in_place`: in their own
    memory, e.g. a cache slot just read; else new arrays)."""
    from . import repack_q4 as compiled  # the package imports this module's users; import late

    return {n: compiled(w, in_place) if expert_repackable(w) else w for n, w in weights.items()}


def as_repacked(weights: dict) -> dict:
    """The views of an expert whose memory `repack_expert` already rewrote (a cache hit), as q4r."""
    return {n: QTensor(REPACKED_Q4, w.shape, w.parts) if expert_repackable(w) else w for n, w in weights.items()}


def _same_memory(a: QTensor, b: QTensor) -> bool:
    """Whether `a` was made in `b`'s own memory (an in-place repacking)."""
    return all(np.shares_memory(a.parts[n], p) for n, p in b.parts.items() if n in a.parts)


def repack_model(model, mode: str) -> int:
    """Repacks `model`'s resident dense q4 matrices in place for activation mode `mode` (see above); the
    bytes repacked (0 when nothing applies). Call before the first forward.

    Memory: a store read into anonymous memory (`Store.load_dense`, the streaming engine) is rewritten in
    place, matrix by matrix, so the weights stay one copy; the memory-mapped store file is read-only, so
    there the repacked arrays are new and the file's pages, no longer touched, are the kernel's to drop.
    The model's matrices must be its own (an engine's store): in place, the store's views become stale."""
    experts = getattr(model, "experts", None)
    if mode in ("q8", "experts", "decode") and hasattr(experts, "repack_experts"):
        experts.repack_experts()  # the grouped calls' int8: every expert, as it lands or at first use
    if mode not in ("q8", "decode"):
        return 0
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not all(isinstance(L, dict) for L in layers):
        return 0
    if mode == "decode" and not getattr(model, "int8_decode", False):
        return 0  # no int8 one-row dense products (`Transformer.int8_decode`)
    done: dict[int, QTensor] = {}  # id of a matrix -> its repacked one (a matrix held twice is repacked once)

    def one(w):
        if id(w) not in done:
            done[id(w)] = repack(w, in_place=True)
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
    embed = getattr(model, "embed", None)
    if id(embed) in done and _same_memory(done[id(embed)], embed):  # tied, rewritten in place: lookups
        model.embed = done[id(embed)]  # read the repacked rows (`QTensor.rows`); else the store's rows
    return sum(new.nbytes for new in done.values() if new.kind in REPACKED)
