"""The shared runner for parity against transformers: build a tiny random model from its config
class, save it, convert it, hand the reference exactly the weights the store holds, and compare
logits through chunked prefill and step-by-step decode."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from inference import kernels, models
from inference.convert import convert
from inference.convert.hf import NameTable, Shard, find_shards, to_f32
from inference.model import load_model
from inference.quant import dequantize
from inference.store import Store


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter random values, norms and scales around 1, so no weight hides a bug."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or "scalar" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def build_checkpoint(model_cls, config, out: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    randomize(model, seed)
    model.save_pretrained(out)
    return out


def reference_checkpoint(src: Path, store_path: Path, quant: str, out: Path) -> Path:
    """A copy of `src` whose weights are exactly what the store holds (fp16-rounded or dequantized)."""
    st = Store(store_path)
    arch = models.get(st.architecture)
    table = NameTable(arch)
    out.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    for shard in (Shard(p) for p in find_shards(src)):
        tensors = {}
        for name in shard.tensors:
            a = to_f32(shard.get(name), shard.is_bf16(name))
            internal, cls = table.map(name)
            if internal is None:
                tensors[name] = a
            elif internal.startswith("experts:"):
                _, layer, e, which = internal.split(":")
                layer = int(layer)
                get = lambda j, sub: dequantize(st.expert(layer, j)[sub])  # noqa: E731, B023 - used in this iteration
                if e != "*":
                    tensors[name] = get(int(e), which)
                elif which == "gate_up":
                    tensors[name] = np.stack(
                        [np.concatenate([get(j, "gate"), get(j, "up")]) for j in range(a.shape[0])]
                    )
                else:
                    tensors[name] = np.stack([get(j, "down") for j in range(a.shape[0])])
            elif st.has(internal):
                tensors[name] = dequantize(st.dense(internal)).reshape(a.shape)
            else:  # a tied lm_head: the embedding's values
                tensors[name] = dequantize(st.dense("embed")).reshape(a.shape)
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, out / shard.path.name)
    return out


@dataclass
class ParityResult:
    worst: float  # max over positions of max|Δ| / (max − min of the reference logits)
    positions: int
    ours: np.ndarray
    ref: np.ndarray


def run_parity(
    model_cls, config, tmp: Path, quant: str, *, n_prompt: int = 40, n_decode: int = 64, chunk: int = 16, seed: int = 0
) -> ParityResult:
    """Convert a random model with `quant` and compare logits at every position with transformers."""
    src = build_checkpoint(model_cls, config, tmp / "hf", seed)
    store = convert(src, tmp / f"store-{quant}", quant, progress=False)
    ref_dir = reference_checkpoint(src, store, quant, tmp / f"ref-{quant}")
    ref_model = model_cls.from_pretrained(ref_dir, dtype=torch.float32).eval()

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, n_prompt + n_decode)
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids[None])).logits[0].float().numpy()

    m = load_model(store, chunk=chunk)
    cache = m.new_cache()
    before = kernels.get_activations()
    kernels.set_activations("f32")  # the exact path: transformers multiplies float activations
    try:
        outs = [m.forward(ids[:n_prompt], cache)]
        for t in ids[n_prompt:]:
            outs.append(m.forward(np.array([t]), cache))
    finally:
        kernels.set_activations(before)
    ours = np.concatenate(outs)
    rng_ref = ref.max(axis=-1) - ref.min(axis=-1)
    worst = float((np.abs(ours - ref).max(axis=-1) / rng_ref).max())
    return ParityResult(worst, len(ids), ours, ref)


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())


def write_report(path: Path, row: dict) -> None:
    """Append a row to a JSON-lines report (reported, not asserted)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
