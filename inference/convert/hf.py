"""Convert a local Hugging Face checkpoint (config.json + safetensors shards) into a store.

Tensor by tensor with bounded memory: each shard is memory-mapped, each tensor is read and quantized
in row blocks, and written before the next one is touched. The safetensors header is parsed here
(8-byte length + JSON) rather than through `safetensors.safe_open`, because its numpy API cannot
return bfloat16 — the dtype of most released checkpoints — and we need the byte offsets to
memory-map tensors and to detect truncated files before reading them.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

from .. import models
from ..errors import ConvertError, ModelFormatError
from ..quant import QUANT_CHOICES, Q4_GROUP, QTensor, quantize
from ..store import StoreWriter
from .progress import progress_bar

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
ROW_BLOCK = 1024  # rows quantized at a time: bounds the float32 temporaries


class Shard:
    """One safetensors file: its header and memory-mapped tensors."""

    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError("shorter than its 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8 or n > 100 * 2**20:
                    raise ValueError(f"header length {n} exceeds the file")
                header = json.loads(f.read(n))
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{path}: not a readable safetensors file ({e}); re-download it") from None
        header.pop("__metadata__", None)
        self.base = 8 + n
        self.tensors = header
        end = max((t["data_offsets"][1] for t in header.values()), default=0)
        if self.base + end > size:
            raise ModelFormatError(
                f"{path}: truncated ({size} bytes, tensors need {self.base + end}); re-download this shard"
            )

    def get(self, name: str) -> np.ndarray:
        """The tensor read into memory (bf16 arrives as its uint16 bits).

        Read with pread rather than memory-mapped: mapped pages of a whole checkpoint would count
        in this process's resident set, and conversion memory must stay bounded by one tensor.
        """
        t = self.tensors[name]
        dt = DTYPES.get(t["dtype"])
        if dt is None:
            raise ConvertError(
                f"{self.path}: tensor {name} has dtype {t['dtype']}; only F32/F16/BF16 checkpoints convert"
            )
        a, b = t["data_offsets"]
        buf = np.empty(b - a, np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.base + a)
            view, got = memoryview(buf), 0
            while got < len(buf):
                n = f.readinto(view[got:])
                if not n:
                    raise ModelFormatError(f"{self.path}: truncated inside tensor {name}; re-download this shard")
                got += n
        return buf.view(dt).reshape(t["shape"])

    def is_bf16(self, name: str) -> bool:
        return self.tensors[name]["dtype"] == "BF16"


def to_f32(a: np.ndarray, bf16: bool) -> np.ndarray:
    if bf16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def load_config(src: Path) -> tuple[str, dict]:
    """(model_type, text config) of a checkpoint; multimodal wrappers yield their text config."""
    path = src / "config.json"
    if not path.is_file():
        raise ConvertError(f"{src}: no config.json; point `rkmojo convert` at a Hugging Face checkpoint directory")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise ModelFormatError(f"{path}: invalid JSON ({e})") from None
    model_type = cfg.get("model_type", "")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        text = dict(cfg["text_config"])
        for k in ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
            if k in cfg and k not in text:
                text[k] = cfg[k]
        cfg = text
    return model_type, cfg


def find_shards(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise ModelFormatError(f"{index}: unreadable index ({e}); re-download it") from None
        for f in files:
            if not (src / f).is_file():
                raise ConvertError(f"{src / f}: shard listed in model.safetensors.index.json is missing; download it")
        return [src / f for f in files]
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise ConvertError(f"{src}: no *.safetensors files; only safetensors checkpoints convert")
    return shards


class NameTable:
    """Compiled checkpoint → internal name mapping of one architecture."""

    def __init__(self, arch):
        self.rules = [(re.compile(p + r"\Z"), n, c) for p, n, c in arch.HF_NAMES]
        self.prefixes = getattr(arch, "HF_PREFIXES", {})
        self.drop = [re.compile(p + r"\Z") for p in getattr(arch, "HF_DROP", ())]

    def map(self, name: str):
        """(internal name, class) for a checkpoint name; (None, None) for tensors to skip."""
        for old, new in self.prefixes.items():
            if name.startswith(old):
                name = new + name[len(old) :]
        if any(d.match(name) for d in self.drop):
            return None, None
        for rx, new, cls in self.rules:
            m = rx.match(name)
            if m:
                return (new.format(*m.groups()) if new else None), cls
        raise ConvertError(
            f"tensor {name}: not part of this architecture's name table; is config.json's model_type right?"
        )


def kind_for(cls: str, quant: str, shape: tuple) -> str:
    """Storage kind of a tensor class under `--quant`; q4 falls back to q8 when rows don't group by 64."""
    if cls == "norm":
        return "f32"
    if cls == "router":
        return "f16" if quant == "f16" else "q8"
    if quant == "q4" and shape[-1] % Q4_GROUP:
        return "q8"
    return quant


def quantize_rows(a: np.ndarray, bf16: bool, kind: str) -> QTensor:
    """Quantize a 2-D array view block by block, so temporaries stay at ROW_BLOCK rows."""
    if a.ndim != 2 or kind in ("f32",):
        return quantize(to_f32(a, bf16), kind)
    blocks = [quantize(to_f32(a[s : s + ROW_BLOCK], bf16), kind) for s in range(0, a.shape[0], ROW_BLOCK)]
    if len(blocks) == 1:
        return blocks[0]
    parts = {k: np.concatenate([b.parts[k] for b in blocks]) for k in blocks[0].parts}
    return QTensor(kind, tuple(a.shape), parts)


def convert_hf(
    src: Path,
    out: Path,
    quant: str = "q4",
    *,
    progress: bool = True,
    shards=None,
    writer=StoreWriter,
    repack: bool = True,
) -> Path:
    """Convert the checkpoint directory `src` into a store at `out`.

    Args:
        shards: `Shard`-like objects to read instead of the safetensors files in `src` (`rkmojo pull`
            passes remote ones); a tensor for which `shard.resumed(name)` is true was already written
            by an interrupted earlier run and is skipped.
        writer: the `StoreWriter` class (or a factory with its signature) that builds the store.
        repack: q4 experts in the kernels' repacked layout (passed to `writer` as `repack_experts`).
    Raises:
        ConvertError / ModelFormatError: one line naming the file or tensor and the fix; nothing is left at `out`.
    """
    src, out = Path(src), Path(out)
    if quant not in QUANT_CHOICES:
        raise ConvertError(f"--quant {quant}: choose one of {', '.join(QUANT_CHOICES)}")
    if out.exists():
        raise ConvertError(f"{out}: output path exists; remove it or choose another path")
    model_type, cfg = load_config(src)
    arch = models.get(model_type)
    try:
        args = arch.Args.from_dict(cfg)
    except (TypeError, ValueError) as e:
        raise ConvertError(f"{src / 'config.json'}: {e}") from None
    expected = arch.expected_shapes(args)
    tied = bool(cfg.get("tie_word_embeddings", False))
    moe_layers = args.moe_layers() if hasattr(args, "moe_layers") else []
    shards = list(shards) if shards is not None else [Shard(p) for p in find_shards(src)]
    table = NameTable(arch)
    kinds = {"default": quant, "router": "f16" if quant == "f16" else "q8", "norm": "f32", "embedding": quant}

    total = sum(sum(t["data_offsets"][1] - t["data_offsets"][0] for t in s.tensors.values()) for s in shards)
    cfg = dict(cfg, model_type=models.canonical(model_type))
    with (
        writer(out, models.canonical(model_type), cfg, repack_experts=repack) as w,
        progress_bar(total, f"convert {src.name}", progress) as bar,
    ):
        w.set_quantization(kinds)
        w.set_source({"type": "safetensors", "path": str(src), "model_type": model_type})
        for layer in moe_layers:
            shapes = args.expert_shapes()
            w.begin_expert_layer(
                layer, args.num_experts, {n: (kind_for("expert", quant, s), s) for n, s in shapes.items()}
            )
        seen = set()
        for shard in shards:
            for name, meta in shard.tensors.items():
                nbytes = meta["data_offsets"][1] - meta["data_offsets"][0]
                internal, cls = table.map(name)
                if internal is None or (internal == "lm_head" and tied):
                    bar.update(nbytes)
                    continue
                if getattr(shard, "resumed", None) and shard.resumed(name):
                    seen.add(internal)
                    bar.update(nbytes)
                    continue
                a = shard.get(name)
                bf16 = shard.is_bf16(name)
                if cls in ("expert", "experts_fused"):
                    _write_experts(w, args, internal, cls, a, bf16, quant, shard.path, name)
                else:
                    want = expected.get(internal)
                    if want is not None and tuple(a.shape) != tuple(want):
                        raise ConvertError(
                            f"{shard.path.name}: tensor {name} has shape {list(a.shape)}, config.json implies "
                            f"{list(want)}; the checkpoint and its config disagree"
                        )
                    w.add_dense(internal, quantize_rows(a, bf16, kind_for(cls, quant, a.shape)))
                    seen.add(internal)
                bar.update(nbytes)
        need = {n for n in expected if n != "lm_head" or not tied}
        missing = sorted(need - seen)
        if missing:
            raise ConvertError(
                f"{src}: tensor {missing[0]} missing from the checkpoint ({len(missing)} missing); check that every shard is present"
            )
        _copy_tokenizer(src, w)
        return w.finish()


def _write_experts(
    w: StoreWriter, args, internal: str, cls: str, a: np.ndarray, bf16: bool, quant: str, path: Path, name: str
) -> None:
    _, layer, e, which = internal.split(":")
    layer = int(layer)
    shapes = args.expert_shapes()
    I, H = shapes["gate"]
    if cls == "expert":
        if tuple(a.shape) != tuple(shapes[which]):
            raise ConvertError(f"{path.name}: tensor {name} has shape {list(a.shape)}, expected {list(shapes[which])}")
        w.add_expert_tensor(layer, int(e), which, quantize_rows(a, bf16, kind_for("expert", quant, a.shape)))
        return
    want = (args.num_experts, 2 * I, H) if which == "gate_up" else (args.num_experts, *shapes["down"])
    if tuple(a.shape) != want:
        raise ConvertError(f"{path.name}: tensor {name} has shape {list(a.shape)}, expected {list(want)}")
    for j in range(args.num_experts):
        if which == "gate_up":
            for sub, rows in (("gate", a[j, :I]), ("up", a[j, I:])):
                w.add_expert_tensor(layer, j, sub, quantize_rows(rows, bf16, kind_for("expert", quant, rows.shape)))
        else:
            w.add_expert_tensor(layer, j, "down", quantize_rows(a[j], bf16, kind_for("expert", quant, a[j].shape)))


def _copy_tokenizer(src: Path, w: StoreWriter) -> None:
    for f in TOKENIZER_FILES:
        p = src / f
        if p.is_file():
            w.add_tokenizer_file(f, p.read_bytes())
    gen = src / "generation_config.json"
    if gen.is_file():
        try:
            w.set_generation(json.loads(gen.read_text()))
        except ValueError as e:
            raise ModelFormatError(f"{gen}: invalid JSON ({e})") from None
    tc = src / "tokenizer_config.json"
    template = None
    if (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text()
    elif tc.is_file():
        try:
            template = json.loads(tc.read_text()).get("chat_template")
        except ValueError as e:
            raise ModelFormatError(f"{tc}: invalid JSON ({e})") from None
    if template:
        w.set_tokenizer_info(chat_template=template)
