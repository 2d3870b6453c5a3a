"""GGUF → store: the demo model byte for byte, a tiny written GGUF round trip, and bad inputs."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from tokenizers import Tokenizer, pre_tokenizers

from inference.convert.gguf import convert_gguf
from inference.errors import ConvertError, ModelFormatError
from inference.quant import quantize
from inference.store import Store

LAYER_NAMES = {
    "attn_norm": "attn_norm",
    "attn_q": "attn.q",
    "attn_k": "attn.k",
    "attn_v": "attn.v",
    "attn_output": "attn.o",
    "ffn_norm": "mlp_norm",
    "ffn_gate": "mlp.gate",
    "ffn_up": "mlp.up",
    "ffn_down": "mlp.down",
}
GLOBAL_NAMES = {"token_embd": "embed", "output_norm": "norm", "output": "lm_head"}


def internal_name(gguf_name: str) -> str:
    m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", gguf_name)
    if m:
        return f"layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return GLOBAL_NAMES[gguf_name.removesuffix(".weight")]


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (HF rotate-half → interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- the demo model ---------------------------------------------------------------------------
def test_the_demo_model_converts_into_a_store_that_verifies(smollm2_store):
    st = Store(smollm2_store)
    st.verify()
    c = st.config
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]) == (
        576,
        30,
        9,
        3,
    )
    assert (c["head_dim"], c["vocab_size"], c["max_position_embeddings"]) == (64, 49152, 8192)
    assert c["tie_word_embeddings"] and not st.has("lm_head")
    assert c["rope_theta"] == 100000.0 and c["rope_scaling"] is None
    assert st.manifest["quantization"] == {"default": "q4_1", "embedding": "q8_0", "norm": "f32"}
    assert st.manifest["tokenizer"]["eos_token_ids"] == [2]
    assert "<|im_start|>" in st.manifest["tokenizer"]["chat_template"]
    assert sorted(p.name for p in st.iter_tokenizer_files()) == ["tokenizer.json", "tokenizer_config.json"]


def test_every_demo_tensor_keeps_its_gguf_bytes(smollm2_store, smollm2_gguf):
    st, rd = Store(smollm2_store), GGUFReader(smollm2_gguf)
    heads = {"attn.q": st.config["num_attention_heads"], "attn.k": st.config["num_key_value_heads"]}
    assert len(st.dense_names()) == len(rd.tensors) == 272
    for t in rd.tensors:
        q = st.dense(internal_name(t.name))
        ours = next(iter(q.parts.values()))
        n_head = heads.get(internal_name(t.name).split(".", 2)[-1])
        if n_head:  # q/k rows were un-permuted: permuting them again must give the file's rows
            ours = llamacpp_permute(ours, n_head)
        assert np.array_equal(ours, t.data.reshape(ours.shape)), t.name


# --- a tiny GGUF written here -----------------------------------------------------------------
H, I, NH, NKV, L = 64, 96, 4, 2, 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
# GGUF type of each layer tensor, per layer: q/k in block, f16 and re-quantized (BF16) forms
LAYER_TYPES = [
    {
        "attn_q": T.Q4_0,
        "attn_k": T.Q8_0,
        "attn_v": T.F16,
        "attn_output": T.Q4_1,
        "ffn_gate": T.Q4_0,
        "ffn_up": T.BF16,
        "ffn_down": T.F32,
    },
    {
        "attn_q": T.F16,
        "attn_k": T.BF16,
        "attn_v": T.Q8_0,
        "attn_output": T.Q4_0,
        "ffn_gate": T.F16,
        "ffn_up": T.Q4_1,
        "ffn_down": T.Q8_0,
    },
]


def tiny_tokens() -> list[str]:
    return SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]


def encode(w: np.ndarray, ty: T) -> np.ndarray:
    if ty == T.F32:
        return w.astype(np.float32)
    if ty == T.F16:
        return w.astype(np.float16)
    if ty == T.BF16:
        return gguf_quantize(w.astype(np.float32), T.BF16)
    return quantize(w, ty.name.lower()).parts["blocks"]


def write_tiny_gguf(
    path: Path, *, arch: str = "llama", ffn_meta: int = I, drop: str | None = None, seed: int = 0
) -> dict:
    """A 2-layer llama GGUF with random weights in mixed types; returns the HF-layout weights by internal name."""
    rng = np.random.default_rng(seed)
    tokens = tiny_tokens()
    V = len(tokens)
    w = GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(ffn_meta)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(H // NH)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (V - len(SPECIAL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )

    hf: dict[str, np.ndarray] = {}

    def add(name: str, shape: tuple, ty: T, n_head: int | None = None) -> None:
        if name == drop:
            return
        v = (rng.standard_normal(shape) * (1.0 if len(shape) == 1 else shape[-1] ** -0.5)).astype(np.float32)
        hf[internal_name(name)] = v
        w.add_tensor(name, encode(llamacpp_permute(v, n_head) if n_head else v, ty), raw_dtype=ty)

    add("token_embd.weight", (V, H), T.Q8_0)
    add("output_norm.weight", (H,), T.F32)
    add("output.weight", (V, H), T.F16)
    for i, types in enumerate(LAYER_TYPES):
        hd = H // NH
        shapes = {
            "attn_q": (NH * hd, H),
            "attn_k": (NKV * hd, H),
            "attn_v": (NKV * hd, H),
            "attn_output": (H, NH * hd),
            "ffn_gate": (I, H),
            "ffn_up": (I, H),
            "ffn_down": (H, I),
        }
        add(f"blk.{i}.attn_norm.weight", (H,), T.F32)
        add(f"blk.{i}.ffn_norm.weight", (H,), T.F32)
        for n, ty in types.items():
            add(f"blk.{i}.{n}.weight", shapes[n], ty, {"attn_q": NH, "attn_k": NKV}.get(n))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def test_a_tiny_mixed_type_gguf_round_trips(tmp_path, caplog):
    hf = write_tiny_gguf(tmp_path / "tiny.gguf")
    with caplog.at_level(logging.WARNING, logger="inference.convert.gguf"):
        st = Store(convert_gguf(tmp_path / "tiny.gguf", tmp_path / "store", progress=False))
    st.verify()
    assert not st.config["tie_word_embeddings"] and st.has("lm_head")
    assert st.manifest["quantization"]["requantized"] == "BF16->q8"
    assert "re-quantized 2 BF16 tensors to q8" in caplog.text
    types = {f"layers.{i}.{LAYER_NAMES[n]}": ty for i, lt in enumerate(LAYER_TYPES) for n, ty in lt.items()}
    types.update(embed=T.Q8_0, lm_head=T.F16)
    for name, v in hf.items():
        got = st.dense(name)
        ty = types.get(name, T.F32)
        if ty == T.BF16:  # rounded to bf16 in the file, then q8 per row
            want = quantize(gguf_dequantize(gguf_quantize(v, T.BF16), T.BF16), "q8")
        else:
            want = quantize(v, {T.F32: "f32", T.F16: "f16"}.get(ty) or ty.name.lower())
        assert got.kind == want.kind, name
        for p in want.parts:
            assert np.array_equal(got.parts[p], want.parts[p]), (name, p)
    tok = Tokenizer.from_file(str(st.path / "tokenizer.json"))
    text = "<|im_start|>the the then<|im_end|>"
    ids = tok.encode(text).ids
    assert ids[0] == 1 and ids[-1] == 2 and tiny_tokens().index("Ġthe") in ids
    assert tok.decode(ids, skip_special_tokens=False) == text


# --- bad input: one line naming the file and the fix, nothing left behind ----------------------
def assert_refused(exc_type, src: Path, out: Path, *needles: str) -> str:
    with pytest.raises(exc_type) as e:
        convert_gguf(src, out, progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))
    return msg


def test_it_rejects_a_file_that_is_not_gguf(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_text('{"not": "a gguf"}')
    assert_refused(ModelFormatError, src, tmp_path / "store", str(src), "not a GGUF file")


def test_it_rejects_a_truncated_gguf_naming_the_cut_tensor(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    last = GGUFReader(tmp_path / "tiny.gguf").tensors[-1].name
    (tmp_path / "cut.gguf").write_bytes(data[:-100])
    assert_refused(ModelFormatError, tmp_path / "cut.gguf", tmp_path / "store", "truncated", last, "download")


def test_it_rejects_a_gguf_cut_inside_its_header(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "tiny.gguf").read_bytes()[:200])
    assert_refused(ModelFormatError, tmp_path / "cut.gguf", tmp_path / "store", "truncated or corrupt")


def test_it_rejects_an_unsupported_architecture_listing_the_supported_ones(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", arch="mamba")
    assert_refused(ConvertError, tmp_path / "m.gguf", tmp_path / "store", "'mamba'", "supported: llama")


def test_it_rejects_a_tensor_whose_shape_disagrees_with_the_metadata(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", ffn_meta=128)
    assert_refused(ConvertError, tmp_path / "m.gguf", tmp_path / "store", "blk.0.ffn_gate.weight", "[128, 64]")


def test_it_rejects_a_gguf_missing_a_tensor(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", drop="blk.1.ffn_down.weight")
    assert_refused(ConvertError, tmp_path / "m.gguf", tmp_path / "store", "blk.1.ffn_down.weight", "missing")


def test_it_refuses_an_existing_output_path(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf")
    out = tmp_path / "store"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError, match="output path exists"):
        convert_gguf(tmp_path / "m.gguf", out, progress=False)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
