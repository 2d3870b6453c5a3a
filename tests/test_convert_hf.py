"""Converting Hugging Face checkpoints: the store it writes, and one clear error for each bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import transformers
from safetensors.numpy import save_file

from inference.convert import convert
from inference.errors import ConvertError, ModelFormatError
from inference.store import Store
from parity import build_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def qwen_ckpt(tmp_path_factory):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=16,
        num_experts_per_tok=4,
    )
    return build_checkpoint(transformers.Qwen3MoeForCausalLM, cfg, tmp_path_factory.mktemp("ckpt") / "hf")


def copy_ckpt(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inference.cli", *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )


def test_it_writes_a_store_that_verifies_with_aligned_expert_blobs(qwen_ckpt, tmp_path):
    out = convert(qwen_ckpt, tmp_path / "s", "q4", progress=False)
    st = Store(out)
    st.verify()
    lay = st.expert_layers[0]
    assert lay.stride % 16384 == 0 and lay.stride >= lay.blob_size
    assert os.path.getsize(lay.path) == lay.stride * 16
    assert st.dense("layers.0.router").kind == "q8"  # the router never drops to 4 bits
    assert st.dense("layers.0.attn_norm").kind == "f32"
    assert st.dense("layers.0.attn.q").kind == "q4"
    assert not any(p.name.startswith(".s.tmp") for p in tmp_path.iterdir())


def test_it_rejects_an_unsupported_architecture(qwen_ckpt, tmp_path):
    bad = copy_ckpt(qwen_ckpt, tmp_path / "bert")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(cfg, model_type="bert")))
    r = cli("convert", bad, tmp_path / "out")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "'bert' is not supported" in r.stderr
    assert not (tmp_path / "out").exists()


def test_it_names_a_missing_shard(qwen_ckpt, tmp_path):
    bad = copy_ckpt(qwen_ckpt, tmp_path / "sharded")
    index = {
        "weight_map": {"model.norm.weight": "model.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}
    }
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match="model-00002-of-00002.safetensors: shard .* missing"):
        convert(bad, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_it_names_a_truncated_safetensors_file(qwen_ckpt, tmp_path):
    bad = copy_ckpt(qwen_ckpt, tmp_path / "trunc")
    f = bad / "model.safetensors"
    os.truncate(f, f.stat().st_size - 1000)
    r = cli("convert", bad, tmp_path / "out")
    assert r.returncode == 1 and "model.safetensors: truncated" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_it_names_a_tensor_whose_shape_disagrees_with_the_config(qwen_ckpt, tmp_path):
    bad = copy_ckpt(qwen_ckpt, tmp_path / "shape")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(cfg, vocab_size=300)))
    with pytest.raises(
        ConvertError, match=r"tensor (model\.embed_tokens|lm_head)\.weight has shape \[256, 64\].*\[300, 64\]"
    ):
        convert(bad, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_it_refuses_an_existing_output_path(qwen_ckpt, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    r = cli("convert", qwen_ckpt, tmp_path / "out")
    assert r.returncode == 1 and "output path exists" in r.stderr
    assert (tmp_path / "out" / "keep").read_text() == "x"


def test_verify_names_the_first_bad_expert_and_tensor(qwen_ckpt, tmp_path):
    out = convert(qwen_ckpt, tmp_path / "s", "q8", progress=False)
    st = Store(out)
    lay = st.expert_layers[1]
    with open(lay.path, "r+b") as f:
        f.seek(7 * lay.stride + 100)
        b = f.read(1)
        f.seek(7 * lay.stride + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    r = cli("verify", out, "-q")
    assert r.returncode == 1 and "experts/layer_01.bin: expert 7 digest mismatch" in r.stderr
    dense = out / "dense.bin"
    off = st.manifest["dense"]["tensors"]["layers.0.attn.k"]["parts"]["q"]["offset"]
    with open(dense, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ModelFormatError, match="dense tensor layers.0.attn.k digest mismatch"):
        Store(out).verify()


MEM_SCRIPT = """
import resource, sys
from inference.convert import convert
convert(sys.argv[1], sys.argv[2], "q4", progress=False)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_conversion_memory_stays_bounded_on_a_checkpoint_larger_than_the_bound(tmp_path):
    # Qwen3-MoE shapes, 2.2 GB of f16 in 3 shards; largest tensor: the 131 MB embedding
    cfg = dict(
        model_type="qwen3_moe",
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=4096,
        moe_intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=32,
        num_experts_per_tok=4,
        tie_word_embeddings=False,
    )
    src = tmp_path / "big"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    H, I, E = 2048, 768, 32

    def r(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    weight_map, total, largest = {}, 0, 0
    shards = [["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"], [], []]
    for i in range(6):
        shards[1 + i // 3].append(i)
    for n, names in enumerate(shards):
        fname = f"model-{n + 1:05d}-of-00003.safetensors"
        tensors = {}
        for item in names:
            if isinstance(item, str):
                tensors[item] = r(H) if "norm" in item else r(32000, H)
                continue
            p = f"model.layers.{item}."
            tensors.update(
                {
                    p + "input_layernorm.weight": r(H),
                    p + "post_attention_layernorm.weight": r(H),
                    p + "self_attn.q_proj.weight": r(2048, H),
                    p + "self_attn.k_proj.weight": r(512, H),
                    p + "self_attn.v_proj.weight": r(512, H),
                    p + "self_attn.o_proj.weight": r(H, 2048),
                    p + "self_attn.q_norm.weight": r(128),
                    p + "self_attn.k_norm.weight": r(128),
                    p + "mlp.gate.weight": r(E, H),
                }
            )
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                tensors.update(
                    {q + "gate_proj.weight": r(I, H), q + "up_proj.weight": r(I, H), q + "down_proj.weight": r(H, I)}
                )
        save_file(tensors, src / fname)
        total += sum(t.nbytes for t in tensors.values())
        largest = max([largest] + [t.nbytes for t in tensors.values()])
        weight_map.update({k: fname for k in tensors})
        del tensors
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    # alone the peak is 1.2 GiB; in the whole suite, with the image build writing beside it, 1.7 GiB was seen
    bound = int(1.75 * 2**30) + largest
    assert total > bound, "the checkpoint must be larger than the memory bound it is tested against"

    p = subprocess.run(
        [sys.executable, "-c", MEM_SCRIPT, src, tmp_path / "store"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    peak = int(p.stdout.split()[-1])
    print(f"checkpoint {total / 2**30:.2f} GiB, bound {bound / 2**30:.2f} GiB, peak RSS {peak / 2**30:.2f} GiB")
    assert peak < bound
    Store(tmp_path / "store").verify()
