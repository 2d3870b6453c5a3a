"""GGUF → `.rkmojo` store, tensor by tensor from the memory-mapped file.

The file is read with the `gguf` package's `GGUFReader` (llama.cpp's own reader): every tensor is
a view into the mapped file, so memory stays bounded by the largest single tensor.

- F32, F16, Q8_0, Q4_0 and Q4_1 tensors are kept byte for byte (QTensor kinds f32/f16/q8_0/q4_0/q4_1);
  any other type (K-quants, BF16, …) is dequantized a chunk of rows at a time and stored as q8.
- llama.cpp's converter permutes the rows of attn_q/attn_k for its interleaved RoPE; our models use
  the HF rotate-half convention, so those rows are put back. A row permutation moves whole block
  rows and is exact for every kind.
- The tokenizer is rebuilt as a HF `tokenizer.json` (`inference.tokenizer_gguf`).

To add an architecture, add an `ArchTable` to `ARCHITECTURES`: a config builder from the metadata, the
GGUF → internal tensor name table, and which rows need un-permuting. Expected shapes come from the
model module (`expected_shapes`), as for the safetensors converter.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, LlamaFileType
from gguf.quants import dequantize as gguf_dequantize

from .. import models
from ..errors import ConvertError, ModelFormatError
from ..quant import QTensor, quantize
from ..store import StoreWriter
from ..tokenizer_gguf import tokenizer_from_gguf
from .progress import progress_bar

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# GGUF types stored as they are, and the QTensor kind each becomes
KEPT = {
    GGMLQuantizationType.F32: "f32",
    GGMLQuantizationType.F16: "f16",
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
}
REQUANT_KIND = "q8"
# rows dequantized at once when re-quantizing (bounds the float32 scratch to ~64 MB)
CHUNK_VALUES = 16 * 1024 * 1024
# general.sampling.* → generation_config key
SAMPLING_KEYS = {
    "temp": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "penalty_repeat": "repetition_penalty",
}


@dataclass(frozen=True)
class ArchTable:
    """How one GGUF architecture maps onto a store. Names use `{}` for the layer index."""

    config: Callable[[dict, str], dict]  # (metadata, file name) → HF-style config
    tensors: dict[str, tuple[str, str]]  # GGUF name → (internal name, tensor class)
    unpermute: dict[str, str] = field(default_factory=dict)  # internal name → config key of its head count


def _llama_config(meta: dict, src: str) -> dict:
    def req(key: str):
        v = meta.get(f"llama.{key}")
        if v is None:
            raise ConvertError(f"{src}: metadata key llama.{key} missing; the GGUF is incomplete, re-export it")
        return v

    hidden, heads = int(req("embedding_length")), int(req("attention.head_count"))
    kv_heads = meta.get("llama.attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ConvertError(f"{src}: per-layer llama.attention.head_count_kv is not supported")
    head_dim = int(meta.get("llama.attention.key_length") or hidden // heads)
    rope_dim = int(meta.get("llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ConvertError(
            f"{src}: partial RoPE (llama.rope.dimension_count={rope_dim}, head_dim={head_dim}) is not supported"
        )
    vocab = meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(req("feed_forward_length")),
        "num_hidden_layers": int(req("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(req("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta, "llama", src),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(req("context_length")),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
    }


def _rope_scaling(meta: dict, arch: str, src: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor") or meta.get(f"{arch}.rope.scale_linear")
    if kind in (None, "none") and not factor:
        return None
    if kind in (None, "linear"):
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": orig}
    raise ConvertError(
        f"{src}: RoPE scaling {kind!r} ({arch}.rope.scaling.type) is not supported; supported: linear, yarn"
    )


LLAMA = ArchTable(
    config=_llama_config,
    tensors={
        "token_embd.weight": ("embed", "embedding"),
        "output_norm.weight": ("norm", "norm"),
        "output.weight": ("lm_head", "embedding"),
        "blk.{}.attn_norm.weight": ("layers.{}.attn_norm", "norm"),
        "blk.{}.attn_q.weight": ("layers.{}.attn.q", "linear"),
        "blk.{}.attn_k.weight": ("layers.{}.attn.k", "linear"),
        "blk.{}.attn_v.weight": ("layers.{}.attn.v", "linear"),
        "blk.{}.attn_output.weight": ("layers.{}.attn.o", "linear"),
        "blk.{}.ffn_norm.weight": ("layers.{}.mlp_norm", "norm"),
        "blk.{}.ffn_gate.weight": ("layers.{}.mlp.gate", "linear"),
        "blk.{}.ffn_up.weight": ("layers.{}.mlp.up", "linear"),
        "blk.{}.ffn_down.weight": ("layers.{}.mlp.down", "linear"),
    },
    unpermute={"layers.{}.attn.q": "num_attention_heads", "layers.{}.attn.k": "num_key_value_heads"},
)

ARCHITECTURES: dict[str, ArchTable] = {"llama": LLAMA}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def convert_gguf(src: Path, out: Path, *, progress: bool = True) -> Path:
    """Convert one GGUF file into a store at `out`.

    Args:
        src: the `.gguf` file (a single file; split GGUFs are not supported).
        out: the store directory to create; must not exist.
        progress: show a progress bar over the tensor bytes.
    Returns:
        `out`, a complete store.
    Raises:
        ConvertError: the output exists, or the architecture / a tensor is not supported or disagrees with the metadata.
        ModelFormatError: `src` is not a GGUF file, or is truncated or corrupt.
    """
    src, out = Path(src), Path(out)
    if out.exists():
        raise ConvertError(f"{out}: output path exists; remove it or choose another path")
    reader = _open(src)
    meta = _metadata(reader, src)
    arch = meta.get("general.architecture")
    table = ARCHITECTURES.get(arch)
    if table is None:
        raise ConvertError(
            f"{src}: architecture {arch!r} is not supported for GGUF conversion; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    config = table.config(meta, str(src))
    config["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    model = models.get(config["model_type"])
    try:
        expected = model.expected_shapes(model.Args.from_dict(config))
    except (TypeError, ValueError) as e:
        raise ConvertError(f"{src}: {e}") from None
    tok = tokenizer_from_gguf(meta, str(src))

    kinds: dict[str, set[str]] = {}
    requantized: dict[str, int] = {}
    total = sum(t.n_bytes for t in reader.tensors)
    with (
        StoreWriter(out, config["model_type"], config) as w,
        progress_bar(total, f"convert {src.name}", progress) as bar,
    ):
        seen = set()
        for t in reader.tensors:
            template, internal, cls = _internal_name(table, t.name, config, str(src))
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            want = tuple(expected[internal])
            if shape != want:
                raise ConvertError(
                    f"{src}: tensor {t.name} has shape {list(shape)} but the metadata implies {list(want)}; "
                    "the GGUF is inconsistent, re-export it"
                )
            heads = config[table.unpermute[template]] if template in table.unpermute else None
            qt = _to_qtensor(t, shape, heads)
            w.add_dense(internal, qt)
            seen.add(internal)
            kinds.setdefault("default" if cls == "linear" else cls, set()).add(qt.kind)
            if qt.kind == REQUANT_KIND:
                requantized[t.tensor_type.name] = requantized.get(t.tensor_type.name, 0) + 1
            bar.update(t.n_bytes)
        missing = sorted(
            n for n in expected if n not in seen and not (n == "lm_head" and config["tie_word_embeddings"])
        )
        if missing:
            raise ConvertError(
                f"{src}: tensor {_gguf_name(table, missing[0])} missing ({len(missing)} missing); "
                "the GGUF is incomplete, re-export it"
            )

        quant = {cls: "+".join(sorted(k)) for cls, k in sorted(kinds.items())}
        if requantized:
            quant["requantized"] = ",".join(f"{k}->{REQUANT_KIND}" for k in sorted(requantized))
            log.warning(
                "%s: re-quantized %s to %s (GGUF types kept as they are: %s)",
                src,
                ", ".join(f"{n} {k} tensors" for k, n in sorted(requantized.items())),
                REQUANT_KIND,
                ", ".join(k.name for k in KEPT),
            )
        w.set_quantization(quant)
        w.set_generation(_generation(meta, tok.bos_token_id, tok.eos_token_ids))
        w.set_source(_source(meta, src))
        for name, data in tok.files().items():
            w.add_tokenizer_file(name, data)
        w.set_tokenizer_info(
            chat_template=tok.chat_template, bos_token_id=tok.bos_token_id, eos_token_ids=tok.eos_token_ids
        )
        return w.finish()


# --- reading ------------------------------------------------------------------------------------
def _open(src: Path) -> GGUFReader:
    if not src.is_file():
        raise ConvertError(f"{src}: no such file; pass the path of a .gguf model file")
    with open(src, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFormatError(f"{src}: not a GGUF file (no GGUF magic at its start); pass a .gguf model file")
    size = src.stat().st_size
    try:
        reader = GGUFReader(src)
    except Exception as e:  # the reader signals a short or garbled file with assorted errors
        raise ModelFormatError(_diagnose(src, size, e)) from None
    if reader.byte_order != "I":
        raise ModelFormatError(f"{src}: big-endian GGUF files are not supported; use a little-endian export")
    # a newer reader could map lazily: check that every tensor lies inside the file before reading it
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelFormatError(_truncated(src, t.name, t.data_offset, t.n_bytes, size))
    return reader


class _TensorIndex(GGUFReader):
    """The header and tensor index only, without data views: names the tensor a short file cuts off."""

    def _build_tensors(self, start_offs, fields) -> None:
        self.index = []
        for f in fields:
            name, dims, raw_type, offset = bytes(f.parts[1]).decode(), f.parts[3], f.parts[4][0], f.parts[5][0]
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type))]
            self.index.append((name, start_offs + int(offset), math.prod(int(d) for d in dims) * size // block))
        self.tensors = []


def _diagnose(src: Path, size: int, err: Exception) -> str:
    try:
        for name, offset, n in _TensorIndex(src).index:
            if offset + n > size:
                return _truncated(src, name, offset, n, size)
    except Exception:
        pass  # the header itself is cut off or garbled
    return f"{src}: unreadable GGUF ({type(err).__name__}: {err}); the file is truncated or corrupt, download it again"


def _truncated(src: Path, name: str, offset: int, n: int, size: int) -> str:
    return (
        f"{src}: truncated GGUF: tensor {name} needs bytes {offset}..{offset + n} but the file has {size}; "
        "download the file again"
    )


def _metadata(reader: GGUFReader, src: Path) -> dict:
    try:
        return {k: f.contents() for k, f in reader.fields.items()}
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFormatError(
            f"{src}: unreadable GGUF metadata ({e}); the file is corrupt, download it again"
        ) from None


# --- tensors ------------------------------------------------------------------------------------
def _internal_name(table: ArchTable, name: str, config: dict, src: str) -> tuple[str, str, str]:
    """(internal template, internal name, tensor class) of a GGUF tensor name."""
    m = _LAYER.match(name)
    template, layer = (f"blk.{{}}.{m.group(2)}", int(m.group(1))) if m else (name, None)
    if template not in table.tensors:
        raise ConvertError(
            f"{src}: tensor {name} is not part of architecture {config['model_type']} as rkmojo knows it; "
            "this GGUF variant is not supported"
        )
    internal, cls = table.tensors[template]
    if layer is not None and layer >= config["num_hidden_layers"]:
        raise ConvertError(
            f"{src}: tensor {name} is past the {config['num_hidden_layers']} layers the metadata declares; "
            "the GGUF is inconsistent, re-export it"
        )
    return internal, internal.format(layer), cls


def _gguf_name(table: ArchTable, internal: str) -> str:
    """The GGUF name of an internal tensor name (for messages)."""
    for gguf_template, (template, _) in table.tensors.items():
        m = re.fullmatch(re.escape(template).replace(r"\{\}", r"(\d+)"), internal)
        if m:
            return gguf_template.format(*m.groups())
    return internal


def _to_qtensor(t, shape: tuple[int, ...], heads: int | None) -> QTensor:
    """One GGUF tensor as a QTensor of logical `shape`, rows un-permuted for `heads` when given."""
    kind = KEPT.get(t.tensor_type)
    if len(shape) == 1:
        vals = t.data if kind in ("f32", "f16") else gguf_dequantize(t.data, t.tensor_type)
        return quantize(np.asarray(vals, np.float32).reshape(shape), "f32")
    perm = _unpermute_rows(shape[0], heads) if heads else None
    if kind is not None:
        arr = t.data.reshape(shape[0], -1)  # [out, in] values or [out, row bytes]
        if perm is not None:
            arr = arr[perm]
        return QTensor(kind, shape, {"w" if kind in ("f32", "f16") else "blocks": arr})
    step = max(1, CHUNK_VALUES // shape[1])
    chunks = [
        quantize(gguf_dequantize(t.data[r : r + step], t.tensor_type).reshape(-1, shape[1]), REQUANT_KIND)
        for r in range(0, shape[0], step)
    ]
    q = np.concatenate([c.parts["q"] for c in chunks])
    scales = np.concatenate([c.parts["scales"] for c in chunks])
    if perm is not None:
        q, scales = q[perm], scales[perm]  # per-row quantization commutes with a row permutation
    return QTensor(REQUANT_KIND, shape, {"q": q, "scales": scales})


def _unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's q/k layout back into HF's: `hf = gguf[perm]`.

    Per head, llama.cpp interleaves the two rotate-half halves (rows j and j + d/2 become 2j and 2j+1).
    """
    hd = n_rows // n_heads
    assert hd * n_heads == n_rows and hd % 2 == 0, (n_rows, n_heads)
    return np.arange(n_rows).reshape(n_heads, hd // 2, 2).transpose(0, 2, 1).reshape(-1)


# --- metadata -----------------------------------------------------------------------------------
def _generation(meta: dict, bos: int | None, eos: list[int]) -> dict:
    gen = {"bos_token_id": bos, "eos_token_id": eos}
    for key, name in SAMPLING_KEYS.items():
        if f"general.sampling.{key}" in meta:
            gen[name] = meta[f"general.sampling.{key}"]
    return gen


def _source(meta: dict, src: Path) -> dict:
    ftype = meta.get("general.file_type")
    try:
        ftype = LlamaFileType(ftype).name if ftype is not None else None
    except ValueError:
        pass
    info = {
        "type": "gguf",
        "path": str(src),
        "size": os.path.getsize(src),
        "gguf_version": meta.get("GGUF.version"),
        "file_type": ftype,
    }
    for key in ("name", "organization", "basename", "finetune", "size_label", "license"):
        if f"general.{key}" in meta:
            info[key] = meta[f"general.{key}"]
    return info
