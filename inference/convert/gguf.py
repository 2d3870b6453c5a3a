"""GGUF → `.rkmojo` store, tensor by tensor from the memory-mapped file.

The file is read with the `gguf` package's `GGUFReader` (llama.cpp's own reader): every tensor is
a view into the mapped file, so memory stays bounded by the largest single tensor.

- Architectures and their tensor names: `gguf_arch` (llama, qwen3moe, olmoe, gemma4).
- Tensor types: `gguf_types` (kept byte for byte, Q4_K re-laid out as q4_1, others re-quantized, or
  refused by name).
- Experts (3-D `ffn_*_exps` tensors) are written one expert at a time through the store writer's expert
  files (`StoreWriter.begin_expert_layer` / `add_expert_tensor`), as the safetensors converter writes
  them, so the engine streams them the same way.
- The tokenizer is rebuilt as a HF `tokenizer.json` (`inference.tokenizer_gguf`).

Every name, type and shape is checked before the store writer starts; the writer builds the store in
a temporary directory and renames it at the end, so a refused or failed conversion leaves nothing.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, LlamaFileType

from .. import models
from ..errors import ConvertError, ModelFormatError
from ..store import StoreWriter
from ..tokenizer_gguf import tokenizer_from_gguf
from .gguf_arch import ARCHITECTURES, ArchTable, GGUFMeta
from .gguf_types import KEPT, RELAID, storage_kind, to_qtensor, unsupported
from .progress import progress_bar

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# general.sampling.* → generation_config key
SAMPLING_KEYS = {
    "temp": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "penalty_repeat": "repetition_penalty",
}
# tokenizer.ggml.model / .pre values llama.cpp reads like ones `tokenizer_gguf` builds: Gemma 4's vocabulary
# is SentencePiece-style BPE (spaces as ▁, the file's merges, byte fallback, no space prefix); OLMo's
# pre-tokenizer is GPT-2's regex (llama-vocab.cpp)
TOKENIZER_MODEL_AS = {"gemma4": "llama"}
TOKENIZER_PRE_AS = {"olmo": "gpt2"}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class _Planned:
    """One GGUF tensor checked and placed: where it goes, as what."""

    tensor: object  # gguf ReaderTensor
    internal: str  # internal name; for experts `experts:{layer}:{sub}`
    cls: str
    shape: tuple[int, ...]  # logical shape, numpy order ([experts, rows, in] for experts)
    kind: str
    heads: int | None  # head count of rows to un-permute


def convert_gguf(src: Path, out: Path, *, progress: bool = True) -> Path:
    """Convert one GGUF file into a store at `out`.

    Args:
        src: the `.gguf` file (a single file; split GGUFs are not supported).
        out: the store directory to create; must not exist.
        progress: show a progress bar over the tensor bytes.
    Returns:
        `out`, a complete store.
    Raises:
        ConvertError: the output exists, or the architecture / a tensor type is not supported, or a tensor
            disagrees with the metadata.
        ModelFormatError: `src` is not a GGUF file, or is truncated or corrupt.
    """
    src, out = Path(src), Path(out)
    if out.exists():
        raise ConvertError(f"{out}: output path exists; remove it or choose another path")
    reader = _open(src)
    fields = _metadata(reader, src)
    arch = fields.get("general.architecture")
    table = ARCHITECTURES.get(arch)
    if table is None:
        raise ConvertError(
            f"{src}: architecture {arch!r} is not supported for GGUF conversion; supported: {', '.join(ARCHITECTURES)}"
        )
    tensors = {t.name: t for t in reader.tensors}
    config = table.config(GGUFMeta(fields, arch, str(src), tensors))
    config["tie_word_embeddings"] = "output.weight" not in tensors
    model = models.get(config["model_type"])
    try:
        args = model.Args.from_dict(config)
        expected = model.expected_shapes(args)
    except (TypeError, ValueError) as e:
        raise ConvertError(f"{src}: {e}") from None
    if table.extra_shapes:
        expected |= table.extra_shapes(args)
    moe_layers = args.moe_layers() if hasattr(args, "moe_layers") else []
    plan = [
        _place(t, table, config, args, expected, moe_layers, str(src))
        for t in reader.tensors
        if t.name not in table.skip
    ]
    expert_kinds = _check_complete(plan, table, config, args, expected, moe_layers, str(src))
    tok = tokenizer_from_gguf(_tokenizer_fields(fields), str(src))

    kinds: dict[str, set[str]] = {}
    converted: dict[tuple[str, str], int] = {}
    total = sum(p.tensor.n_bytes for p in plan)
    with (
        StoreWriter(out, config["model_type"], config) as w,
        progress_bar(total, f"convert {src.name}", progress) as bar,
    ):
        for layer in moe_layers:
            w.begin_expert_layer(
                layer, args.num_experts, {n: (expert_kinds[layer][n], s) for n, s in args.expert_shapes().items()}
            )
        for p in plan:
            try:
                _write(w, p, args)
            except ValueError as e:  # a Q4_K scale past f16's range
                raise ConvertError(f"{src}: tensor {p.tensor.name}: {e}; this file cannot be stored as q4_1") from None
            kinds.setdefault("default" if p.cls == "linear" else p.cls, set()).add(p.kind)
            ty = p.tensor.tensor_type
            if len(p.shape) > 1 and ty not in KEPT:
                converted[(ty.name, p.kind)] = converted.get((ty.name, p.kind), 0) + 1
            bar.update(p.tensor.n_bytes)

        quant = {cls: "+".join(sorted(k)) for cls, k in sorted(kinds.items())}
        if converted:
            quant["requantized"] = ",".join(f"{t}->{k}" for t, k in sorted(converted))
            log.warning(
                "%s: re-quantized %s (GGUF types kept as they are: %s; %s re-laid out with f16 scales)",
                src,
                ", ".join(f"{n} {t} tensors to {k}" for (t, k), n in sorted(converted.items())),
                ", ".join(k.name for k in KEPT),
                ", ".join(k.name for k in RELAID),
            )
        w.set_quantization(quant)
        w.set_generation(_generation(fields, tok.bos_token_id, tok.eos_token_ids))
        w.set_source(_source(fields, src))
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
def _place(t, table: ArchTable, config: dict, args, expected: dict, moe_layers: list, src: str) -> _Planned:
    """Check one tensor's name, type and shape against the metadata; where and as what it is stored."""
    template, internal, cls = _internal_name(table, t.name, config, src)
    kind = storage_kind(t.tensor_type)
    if kind is None:
        raise ConvertError(unsupported(src, t.name, t.tensor_type))
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if cls == "expert":
        _, layer, sub = internal.split(":")
        if int(layer) not in moe_layers:
            raise ConvertError(
                f"{src}: tensor {t.name} holds experts but the metadata makes layer {layer} dense; "
                "the GGUF is inconsistent, re-export it"
            )
        want = _expert_shape(args, sub)
    else:
        want = expected.get(internal)
        if want is None and internal not in expected:
            raise ConvertError(
                f"{src}: tensor {t.name} is not part of {config['model_type']} as the metadata describes it "
                "(e.g. a dense layer with a router); the GGUF is inconsistent, re-export it"
            )
    if shape != tuple(want):
        raise ConvertError(
            f"{src}: tensor {t.name} has shape {list(shape)} but the metadata implies {list(want)}; "
            "the GGUF is inconsistent, re-export it"
        )
    heads = config[table.unpermute[template]] if template in table.unpermute else None
    return _Planned(t, internal, cls, shape, "f32" if len(shape) == 1 else kind, heads)


def _expert_shape(args, sub: str) -> tuple[int, ...]:
    shapes = args.expert_shapes()
    if sub == "gate_up":
        (i, h) = shapes["gate"]
        return (args.num_experts, 2 * i, h)
    return (args.num_experts, *shapes[sub])


def _check_complete(plan, table, config, args, expected, moe_layers, src) -> dict[int, dict[str, str]]:
    """Refuse a file missing a tensor; the storage kind of each expert sub-tensor per MoE layer."""
    seen = {p.internal for p in plan}
    missing = sorted(n for n in expected if n not in seen and not (n == "lm_head" and config["tie_word_embeddings"]))
    if missing:
        raise ConvertError(
            f"{src}: tensor {_gguf_name(table, missing[0])} missing ({len(missing)} missing); "
            "the GGUF is incomplete, re-export it"
        )
    kinds: dict[int, dict[str, str]] = {}
    for p in plan:
        if p.cls == "expert":
            _, layer, sub = p.internal.split(":")
            for s in ("gate", "up") if sub == "gate_up" else (sub,):
                kinds.setdefault(int(layer), {})[s] = p.kind
    for layer in moe_layers:
        for sub in args.expert_shapes():
            if sub not in kinds.get(layer, {}):
                fused = any(t[0] == "experts:{}:gate_up" for t in table.tensors.values()) and sub != "down"
                name = _gguf_name(table, f"experts:{layer}:{'gate_up' if fused else sub}")
                raise ConvertError(f"{src}: tensor {name} missing; the GGUF is incomplete, re-export it")
    return kinds


def _write(w: StoreWriter, p: _Planned, args) -> None:
    t, ty = p.tensor, p.tensor.tensor_type
    if p.cls != "expert":
        perm = _unpermute_rows(p.shape[0], p.heads) if p.heads else None
        w.add_dense(p.internal, to_qtensor(t.data, ty, p.shape, perm))
        return
    _, layer, sub = p.internal.split(":")
    rows = p.shape[1] // 2
    for e in range(p.shape[0]):
        data = t.data[e]  # [rows, in] values or [rows, row bytes]
        if sub == "gate_up":  # gate rows first, then up
            for s, part in (("gate", data[:rows]), ("up", data[rows:])):
                w.add_expert_tensor(int(layer), e, s, to_qtensor(part, ty, (rows, p.shape[2])))
        else:
            w.add_expert_tensor(int(layer), e, sub, to_qtensor(data, ty, p.shape[1:]))


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


def _unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's q/k layout back into HF's: `hf = gguf[perm]`.

    Per head, llama.cpp interleaves the two rotate-half halves (rows j and j + d/2 become 2j and 2j+1).
    """
    hd = n_rows // n_heads
    assert hd * n_heads == n_rows and hd % 2 == 0, (n_rows, n_heads)
    return np.arange(n_rows).reshape(n_heads, hd // 2, 2).transpose(0, 2, 1).reshape(-1)


def _tokenizer_fields(fields: dict) -> dict:
    """The metadata as `tokenizer_from_gguf` reads it (`TOKENIZER_MODEL_AS`, `TOKENIZER_PRE_AS`)."""
    out = dict(fields)
    model, pre = fields.get("tokenizer.ggml.model"), fields.get("tokenizer.ggml.pre")
    if model in TOKENIZER_MODEL_AS:
        out["tokenizer.ggml.model"] = TOKENIZER_MODEL_AS[model]
        out.setdefault("tokenizer.ggml.add_space_prefix", False)
    if pre in TOKENIZER_PRE_AS:
        out["tokenizer.ggml.pre"] = TOKENIZER_PRE_AS[pre]
    return out


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
