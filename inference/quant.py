"""Weight formats: the offline quantizers (numpy) and the in-memory quantized tensor.

A `QTensor` is a 2-D weight `[out, in]` kept in one of these kinds:

- ``f32`` / ``f16``: part ``w`` with the plain values.
- ``q8``: int8 symmetric per output channel; parts ``q`` int8 ``[out, in]`` and ``scales`` f32 ``[out]``.
- ``q4``: 4-bit affine, group 64 (the MLX affine layout); parts ``q`` uint8 ``[out, in/2]`` (element
  ``2j`` in the low nibble, ``2j+1`` in the high one), ``scales`` and ``biases`` f16 ``[out, in/64]``;
  value = q × scale + bias.
- ``q4_0``, ``q4_1``, ``q8_0``: GGUF blocks of 32 kept byte for byte; part ``blocks`` uint8
  ``[out, in/32 × block bytes]``.

A ``q4`` matrix may be held repacked in memory (``q4r``, `repack_q4`: 16 rows side by side for the
kernels' int8 path; see "repacked q4" in inference/kernels/rkkernels.c): resident dense ones from load,
experts from when they land in a cache slot, or on disk where `rkmojo repack` rewrote a store's experts
(docs/store-format.md). A ``q4_1`` matrix likewise (``q4_1r``, `repack_q4_1`: a GGUF model's resident dense
matrices, from load; groups of one block, its d and m as scales and biases), and a ``q8_0`` one
(``q8_0r``, `repack_q8_0`: a GGUF model's Q8_0 matrices and tied LM head; int8 weights, d as scales, and
each block's weight sum per row). `quantize` never makes these, so they are not among `KINDS`.

The runtime half (fused dequantize-and-multiply) lives in `inference.kernels`; `dequantize` here is
the reference the kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Q4_GROUP = 64
GGUF_BLOCK = 32
# bytes per 32-element GGUF block
GGUF_BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
KINDS = ("f32", "f16", "q8", "q4", "q4_0", "q4_1", "q8_0")
REPACKED_Q4 = "q4r"  # q4 repacked in panels of RP rows (in memory; experts also on disk, `rkmojo repack`)
REPACKED_Q4_1 = "q4_1r"  # q4_1 repacked likewise (in memory only)
REPACKED_Q8_0 = "q8_0r"  # q8_0 repacked likewise (in memory only)
REPACKED = (REPACKED_Q4, REPACKED_Q4_1, REPACKED_Q8_0)
RP = 16
QUANT_CHOICES = ("f16", "q8", "q4")


@dataclass
class QTensor:
    """A weight matrix `[out, in]` (or a vector, for f32/f16) in one storage kind."""

    kind: str
    shape: tuple[int, ...]
    parts: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts.values())

    def dense(self) -> np.ndarray:
        """The float32 values (a copy for quantized kinds). Reference path, not for the hot loop."""
        return dequantize(self)

    def rows(self, idx) -> "QTensor":
        """The rows `idx` of this matrix (used for embedding lookups): in the same kind, or for a repacked
        matrix in the kind it was made from, with only the panels holding those rows unpacked (a tied
        embedding repacked for the LM head serves its lookups from the same memory)."""
        idx = self._row_ids(idx)
        if self.kind in REPACKED:
            panels, at = np.unique(idx // RP, return_inverse=True)
            sel = (panels[:, None] * RP + np.arange(RP)).reshape(-1)
            sub = QTensor(self.kind, (len(sel), *self.shape[1:]), {k: v[sel] for k, v in self.parts.items()})
            return unrepack(sub).rows(at.reshape(-1) * RP + idx % RP)
        return QTensor(self.kind, (len(idx), *self.shape[1:]), {k: v[idx] for k, v in self.parts.items()})

    def _row_ids(self, idx) -> np.ndarray:
        """`idx` (ids, or a slice) as row numbers [n], negatives from the end, without an arange of every
        row (a 262144-row embedding: 75 us per lookup). Raises IndexError for a row out of range."""
        if isinstance(idx, slice):
            return np.arange(self.shape[0])[idx]
        i, n = np.atleast_1d(np.asarray(idx, dtype=np.int64)), self.shape[0]
        if i.size and (i.min() < -n or i.max() >= n):
            raise IndexError(f"row {int(i.max() if i.max() >= n else i.min())} of a matrix of {n} rows")
        return np.where(i < 0, i + n, i)


def quantize(w: np.ndarray, kind: str) -> QTensor:
    """Quantize a float matrix `[out, in]` (or a vector for f32/f16) into `kind`.

    Raises:
        ValueError: `kind` is unknown or the shape does not fit its grouping.
    """
    w = np.asarray(w)
    if kind == "f32":
        return QTensor("f32", w.shape, {"w": np.ascontiguousarray(w, dtype=np.float32)})
    if kind == "f16":
        return QTensor("f16", w.shape, {"w": np.ascontiguousarray(w, dtype=np.float16)})
    if w.ndim != 2:
        raise ValueError(f"{kind} quantizes matrices, got shape {w.shape}")
    w = w.astype(np.float32, copy=False)
    if kind == "q8":
        return _quantize_q8(w)
    if kind == "q4":
        return _quantize_q4(w)
    if kind in GGUF_BLOCK_BYTES:
        return _quantize_gguf(w, kind)
    raise ValueError(f"unknown quantization {kind!r}; choose one of {', '.join(KINDS)}")


def _quantize_q8(w: np.ndarray) -> QTensor:
    amax = np.abs(w).max(axis=1)
    scales = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scales[:, None]), -127, 127).astype(np.int8)
    return QTensor("q8", w.shape, {"q": q, "scales": scales})


def _quantize_q4(w: np.ndarray) -> QTensor:
    out, inn = w.shape
    if inn % Q4_GROUP:
        raise ValueError(f"q4 needs the input dimension to be a multiple of {Q4_GROUP}, got {inn}")
    g = w.reshape(out, inn // Q4_GROUP, Q4_GROUP)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scales = ((hi - lo) / 15.0).astype(np.float16)
    biases = lo.astype(np.float16)
    s = scales.astype(np.float32)[..., None]
    b = biases.astype(np.float32)[..., None]
    q = np.where(s > 0, np.rint((g - b) / np.where(s > 0, s, 1.0)), 0.0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(out, inn)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return QTensor("q4", w.shape, {"q": packed, "scales": scales, "biases": biases})


def _quantize_gguf(w: np.ndarray, kind: str) -> QTensor:
    out, inn = w.shape
    if inn % GGUF_BLOCK:
        raise ValueError(f"{kind} needs the input dimension to be a multiple of {GGUF_BLOCK}, got {inn}")
    nb = inn // GGUF_BLOCK
    g = w.reshape(out, nb, GGUF_BLOCK)
    if kind == "q8_0":
        d = (np.abs(g).max(axis=2) / 127.0).astype(np.float16)
        df = d.astype(np.float32)[..., None]
        q = np.clip(np.rint(np.where(df > 0, g / np.where(df > 0, df, 1), 0)), -127, 127).astype(np.int8)
        blocks = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=2)
    elif kind == "q4_0":
        # ggml: d = max / -8 where max is the signed value of largest magnitude
        idx = np.abs(g).argmax(axis=2)
        mx = np.take_along_axis(g, idx[..., None], axis=2)[..., 0]
        d = (mx / -8.0).astype(np.float16)
        df = d.astype(np.float32)[..., None]
        q = np.clip(np.rint(np.where(df != 0, g / np.where(df != 0, df, 1), 0)) + 8, 0, 15).astype(np.uint8)
        qs = q[..., :16] | (q[..., 16:] << 4)
        blocks = np.concatenate([d[..., None].view(np.uint8), qs], axis=2)
    else:  # q4_1
        lo, hi = g.min(axis=2), g.max(axis=2)
        d = ((hi - lo) / 15.0).astype(np.float16)
        m = lo.astype(np.float16)
        df = d.astype(np.float32)[..., None]
        q = np.where(df > 0, np.rint((g - m.astype(np.float32)[..., None]) / np.where(df > 0, df, 1)), 0)
        q = np.clip(q, 0, 15).astype(np.uint8)
        qs = q[..., :16] | (q[..., 16:] << 4)
        blocks = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), qs], axis=2)
    return QTensor(kind, w.shape, {"blocks": np.ascontiguousarray(blocks.reshape(out, -1))})


def dequantize(t: QTensor) -> np.ndarray:
    """The float32 values of `t` (the numpy reference for every kernel)."""
    if t.kind in ("f32", "f16"):
        return t.parts["w"].astype(np.float32)
    if t.kind in REPACKED:
        return dequantize(unrepack(t))
    out, inn = t.shape
    if t.kind == "q8":
        return t.parts["q"].astype(np.float32) * t.parts["scales"][:, None]
    if t.kind == "q4":
        p = t.parts["q"]
        q = np.empty((p.shape[0], p.shape[1] * 2), np.float32)
        q[:, 0::2] = p & 0x0F
        q[:, 1::2] = p >> 4
        s = np.repeat(t.parts["scales"].astype(np.float32), Q4_GROUP, axis=1)
        b = np.repeat(t.parts["biases"].astype(np.float32), Q4_GROUP, axis=1)
        return q * s + b
    if t.kind in GGUF_BLOCK_BYTES:
        bb = GGUF_BLOCK_BYTES[t.kind]
        blk = t.parts["blocks"].reshape(out, inn // GGUF_BLOCK, bb)
        d = blk[..., 0:2].copy().view(np.float16).astype(np.float32)  # [out, nb, 1]
        if t.kind == "q8_0":
            q = blk[..., 2:].copy().view(np.int8).astype(np.float32)
            return (q * d).reshape(out, inn)
        qs = blk[..., 4:] if t.kind == "q4_1" else blk[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.float32)
        if t.kind == "q4_0":
            return ((q - 8.0) * d).reshape(out, inn)
        m = blk[..., 2:4].copy().view(np.float16).astype(np.float32)
        return (q * d + m).reshape(out, inn)
    raise ValueError(f"unknown tensor kind {t.kind!r}")


def part_layout(kind: str, shape: tuple[int, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The parts a tensor of `kind` and logical `shape` is stored as: name → (dtype, shape)."""
    if kind in ("f32", "f16"):
        return {"w": ("float32" if kind == "f32" else "float16", tuple(shape))}
    out, inn = shape
    if kind == "q8":
        return {"q": ("int8", (out, inn)), "scales": ("float32", (out,))}
    if kind in ("q4", REPACKED_Q4):
        rows = out if kind == "q4" else -(-out // RP) * RP  # q4r: padded to whole panels
        return {
            "q": ("uint8", (rows, inn // 2)),
            "scales": ("float16", (rows, inn // Q4_GROUP)),
            "biases": ("float16", (rows, inn // Q4_GROUP)),
        }
    if kind == REPACKED_Q4_1:
        rows, nb = -(-out // RP) * RP, inn // GGUF_BLOCK
        return {"q": ("uint8", (rows, inn // 2)), "scales": ("float16", (rows, nb)), "biases": ("float16", (rows, nb))}
    if kind == REPACKED_Q8_0:
        rows, nb = -(-out // RP) * RP, inn // GGUF_BLOCK
        return {"q": ("int8", (rows, inn)), "scales": ("float16", (rows, nb)), "sums": ("int16", (rows, nb))}
    if kind in GGUF_BLOCK_BYTES:
        return {"blocks": ("uint8", (out, inn // GGUF_BLOCK * GGUF_BLOCK_BYTES[kind]))}
    raise ValueError(f"unknown tensor kind {kind!r}")


def repack_q4(t: QTensor, in_place: bool = False) -> QTensor:
    """`t` (q4) as q4r: rows padded with zeros to a multiple of RP, then per panel of RP rows and group of
    64, the 32 bytes of each row cut in 4-byte pieces, piece c of the panel's 16 rows side by side (64
    bytes), and the group's 16 scales (biases) side by side. New arrays; or with `in_place`, where the rows
    fill whole panels and `t`'s parts are writable, `t`'s own memory rewritten (`t` itself is then stale)."""
    if t.kind != "q4":
        raise ValueError(f"repack_q4 takes q4 matrices, got {t.kind}")
    out, inn = t.shape
    ng, rows = inn // Q4_GROUP, -(-out // RP) * RP
    if in_place and rows == out and all(p.flags.writeable and p.flags.c_contiguous for p in t.parts.values()):
        new = repack_q4(t)
        for name, p in t.parts.items():
            np.copyto(p, new.parts[name])
        return QTensor(REPACKED_Q4, (out, inn), dict(t.parts))
    parts = {}
    for name, per_group, width in (("q", 8, 4), ("scales", 1, 1), ("biases", 1, 1)):
        src = t.parts[name]
        padded = np.zeros((rows, src.shape[1]), src.dtype)
        padded[:out] = src
        # [panel, row, group, piece, bytes] -> [panel, group, piece, row, bytes]
        lay = padded.reshape(rows // RP, RP, ng, per_group, width).transpose(0, 2, 3, 1, 4)
        parts[name] = np.ascontiguousarray(lay).reshape(rows, src.shape[1])
    return QTensor(REPACKED_Q4, (out, inn), parts)


def unrepack_q4(t: QTensor) -> QTensor:
    """The q4 matrix a q4r one was made from (`repack_q4` undone; a new array)."""
    out, inn = t.shape
    ng, rows = inn // Q4_GROUP, -(-out // RP) * RP
    parts = {}
    for name, per_group, width in (("q", 8, 4), ("scales", 1, 1), ("biases", 1, 1)):
        src = t.parts[name]
        lay = src.reshape(rows // RP, ng, per_group, RP, width).transpose(0, 3, 1, 2, 4)
        parts[name] = np.ascontiguousarray(lay.reshape(rows, src.shape[1])[:out])
    return QTensor("q4", (out, inn), parts)


# A GGUF kind's repacked parts cut from its blocks: (part, first byte, end byte, pieces, piece bytes); each
# piece of a panel's 16 rows lies side by side, piece after piece, block after block.
_GGUF_PIECES = {
    "q4_1": (REPACKED_Q4_1, (("scales", 0, 2, 1, 2), ("biases", 2, 4, 1, 2), ("q", 4, 20, 4, 4))),
    "q8_0": (REPACKED_Q8_0, (("scales", 0, 2, 1, 2), ("q", 2, 34, 8, 4))),
}


def _repack_gguf(t: QTensor, kind: str) -> QTensor:
    if t.kind != kind:
        raise ValueError(f"repack_{kind} takes {kind} matrices, got {t.kind}")
    new_kind, pieces_of = _GGUF_PIECES[kind]
    out, inn = t.shape
    nb, rows = inn // GGUF_BLOCK, -(-out // RP) * RP
    blk = np.zeros((rows, nb, GGUF_BLOCK_BYTES[kind]), np.uint8)
    blk[:out] = t.parts["blocks"].reshape(out, nb, -1)
    parts = {}
    for name, first, end, pieces, width in pieces_of:
        src = np.ascontiguousarray(blk[..., first:end])  # [rows, nb, bytes]
        # [panel, row, block, piece, bytes] -> [panel, block, piece, row, bytes]
        lay = src.reshape(rows // RP, RP, nb, pieces, width).transpose(0, 2, 3, 1, 4)
        parts[name] = np.ascontiguousarray(lay).reshape(rows, -1)
    parts["scales"] = parts["scales"].view(np.float16)
    if "biases" in parts:
        parts["biases"] = parts["biases"].view(np.float16)
    if kind == "q8_0":
        q = blk[..., 2:].view(np.int8).astype(np.int16).sum(axis=-1, dtype=np.int16)  # [rows, nb]
        parts["q"] = parts["q"].view(np.int8)
        parts["sums"] = np.ascontiguousarray(q.reshape(rows // RP, RP, nb).transpose(0, 2, 1)).reshape(rows, nb)
    return QTensor(new_kind, (out, inn), parts)


def repack_q4_1(t: QTensor) -> QTensor:
    """`t` (q4_1) as q4_1r (new arrays): rows padded with zeros to a multiple of RP, then per panel of RP
    rows and block of 32, the block's 16 nibble bytes of each row cut in 4-byte pieces, piece c of the
    panel's 16 rows side by side (64 bytes), and the blocks' d (scales) and m (biases) of 16 rows side by
    side: q4r's layout with a group of one block ("repacked q4" in inference/kernels/rkkernels.c)."""
    return _repack_gguf(t, "q4_1")


def repack_q8_0(t: QTensor) -> QTensor:
    """`t` (q8_0) as q8_0r (new arrays): as `repack_q4_1`, with each block's 32 int8 weights of a row in 8
    pieces of 4 bytes (8 lines of 64 bytes per block and panel), d as scales, and per block and row the sum
    of its 32 weights (int16 "sums", side by side like the scales; the VNNI kernel's correction)."""
    return _repack_gguf(t, "q8_0")


def unrepack(t: QTensor) -> QTensor:
    """The matrix a q4r, q4_1r or q8_0r one was made from (the repacking undone; new arrays)."""
    if t.kind == REPACKED_Q4:
        return unrepack_q4(t)
    kind = next((k for k, (new, _) in _GGUF_PIECES.items() if new == t.kind), None)
    if kind is None:
        raise ValueError(f"unrepack takes repacked matrices ({', '.join(REPACKED)}), got {t.kind}")
    out, inn = t.shape
    nb, rows = inn // GGUF_BLOCK, -(-out // RP) * RP
    blk = np.empty((rows, nb, GGUF_BLOCK_BYTES[kind]), np.uint8)
    for name, first, end, pieces, width in _GGUF_PIECES[kind][1]:
        src = np.ascontiguousarray(t.parts[name]).view(np.uint8)
        lay = src.reshape(rows // RP, nb, pieces, RP, width).transpose(0, 3, 1, 2, 4)
        blk[..., first:end] = lay.reshape(rows, nb, pieces * width)
    return QTensor(kind, (out, inn), {"blocks": np.ascontiguousarray(blk[:out].reshape(out, -1))})
