"""A compiled step's descriptor: the one int64 array a C step reads (rkdecode.c, rkmoedecode.c, rkgemma4.c),
written by field name.

The layout is the library's own: rkdescriptors.h lists each descriptor's fields once (`RK_DECODE_HEADER(X)`
and the like), the C enums come from those lists, and so do the names `rk_fields` hands out here, with each
field's type. So Python sets fields by name and by type and cannot place one where C does not read it:
an `int` field takes an integer, an `f32` field a float (stored as its float32 bits), a `ptr` field an
array (stored as its address; the descriptor holds the array while it points at it) or None (0).

An array is the header's fields, then per layer its fields followed by its matrices, each the `matrix`
fields (kind code and part addresses, `kernels.matrix_fields`).
"""

from __future__ import annotations

import functools
import numpy as np

from .. import kernels
from ..quant import QTensor


class Table:
    """One list of `rk_fields`: field names in order, and each field's type (int, f32, ptr; matrices: "")."""

    def __init__(self, names: tuple[str, ...], types: tuple[str, ...]):
        self.names, self.types = names, types
        self._index = {name: j for j, name in enumerate(names)}

    def index(self, name: str) -> int:
        """The field's position in the list.

        Raises:
            KeyError: naming the field and the ones the list has.
        """
        j = self._index.get(name)
        if j is None:
            raise KeyError(f"descriptor field {name!r}: not one of {', '.join(self.names)}")
        return j


@functools.cache
def tables() -> dict[str, Table]:
    """Every layout the kernel library describes (`kernels.fields`): "matrix", then "<step>.header",
    "<step>.layer" and "<step>.matrices" for the steps decode, moe and gemma4."""
    return {name: Table(names, types) for name, (names, types) in kernels.fields().items()}


def cache_arrays(cache, pos: int, pointed: list) -> list | None:
    """Makes every layer of `cache` (a `models.base.KVCache`) hold position `pos`; returns its layers' K, V
    and position arrays when they are not the ones a descriptor points at (`pointed`: a new cache, or one
    grown), else None."""
    for kv in cache.layers:
        kv.reserve(pos + 1)
    held = [x for kv in cache.layers for x in (kv.k, kv.v, kv.pos)]
    if len(held) == len(pointed) and all(x is y for x, y in zip(held, pointed)):
        return None
    return held


def f32_bits(v: float) -> int:
    """v as float32, its bits as an int (an `f32` field)."""
    return int(np.float32(v).view(np.int32))


class Descriptor:
    """The descriptor of step `kind` ("decode", "moe", "gemma4") for `n_layers` layers, zeroed.

    `array` is what the kernels take. `d["name"] = v` sets a header field, `d.set(...)` several,
    `d.set_layer(i, ...)` a layer's, `d.set_matrix(i, name, w)` a layer's matrix.
    """

    def __init__(self, kind: str, n_layers: int):
        t = tables()
        self.header, self.layer, self.matrices = (t[f"{kind}.{part}"] for part in ("header", "layer", "matrices"))
        self.matrix = t["matrix"]
        self.h0 = len(self.header.names)  # where layer 0 starts
        self.nl = len(self.layer.names) + len(self.matrices.names) * len(self.matrix.names)  # fields per layer
        self.array = np.zeros(self.h0 + n_layers * self.nl, np.int64)
        self._held: dict[int, object] = {}  # field index → the array (or matrix) its address points into

    def __setitem__(self, name: str, value) -> None:
        j = self.header.index(name)
        self._put(j, self.header.types[j], name, value)

    def __getitem__(self, name: str) -> int:
        return int(self.array[self.header.index(name)])

    def set(self, **fields) -> None:
        """Header fields by name."""
        for name, value in fields.items():
            self[name] = value

    def at(self, name: str) -> int:
        """The index of header field `name` in `array`."""
        return self.header.index(name)

    def layer_at(self, i: int, name: str) -> int:
        """The index of layer i's field `name` in `array`."""
        return self.h0 + i * self.nl + self.layer.index(name)

    def set_layer(self, i: int, **fields) -> None:
        """Layer i's fields by name."""
        for name, value in fields.items():
            j = self.layer.index(name)
            self._put(self.h0 + i * self.nl + j, self.layer.types[j], name, value)

    def set_matrix(self, i: int, name: str, w: QTensor) -> None:
        """Layer i's matrix `name`: w's kind code and part addresses (held while the descriptor lives).

        Raises:
            ValueError: a part's dtype, size or contiguity is not what the kind needs.
        """
        at = self.h0 + i * self.nl + len(self.layer.names) + self.matrices.index(name) * len(self.matrix.names)
        self.array[at : at + len(self.matrix.names)] = kernels.matrix_fields(w)
        self._held[at] = w

    def pointer_fields(self) -> list[int]:
        """The indices of every address field (the header's, the layers', their matrices' parts)."""
        n = (len(self.array) - self.h0) // self.nl
        out = [j for j, t in enumerate(self.header.types) if t == "ptr"]
        row = [j for j, t in enumerate(self.layer.types) if t == "ptr"]
        mat = [j for j, t in enumerate(self.matrix.types) if t == "ptr"]
        mats = [
            len(self.layer.names) + m * len(self.matrix.names) + j for m in range(len(self.matrices.names)) for j in mat
        ]
        return out + [self.h0 + i * self.nl + j for i in range(n) for j in row + mats]

    def _put(self, at: int, kind: str, name: str, value) -> None:
        if kind == "ptr":
            if value is not None and not isinstance(value, np.ndarray):
                raise TypeError(f"descriptor field {name!r} takes an array (its address) or None, got {value!r}")
            self.array[at] = 0 if value is None else value.ctypes.data
            self._held[at] = value
        elif kind == "f32":
            self.array[at] = f32_bits(value)
        else:
            if isinstance(value, (float, np.floating, np.ndarray)):
                raise TypeError(f"descriptor field {name!r} takes an integer, got {value!r}")
            self.array[at] = int(value)
