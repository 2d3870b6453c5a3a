"""GGUF → store for the MoE architectures (qwen3moe, olmoe, gemma4) with K-quants, against transformers.

Each test writes a tiny GGUF with `gguf.GGUFWriter` from a tiny random transformers checkpoint, its
matrices in a Q4_K_M-like mix (Q4_K, Q5_K, Q6_K; Q8_0 where a row is not a multiple of 256), converts
it, and compares our logits and greedy ids with transformers running the GGUF's own dequantized weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from tokenizers import Tokenizer, pre_tokenizers
from tiny_models import K_QUANTIZERS, kquant_values, tiny_parity_model

from inference import kernels
from inference.convert.gguf import convert_gguf
from inference.errors import ConvertError, ModelFormatError
from inference.model import load_model
from inference.quant import dequantize, quantize
from inference.store import Store

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WIDE = dict(hidden_size=256, num_experts=8)  # rows of 256: K-quants need whole super-blocks
OVERRIDES = {
    "qwen3moe": ("qwen3_moe", WIDE | dict(intermediate_size=256, moe_intermediate_size=256, num_experts_per_tok=2)),
    "olmoe": ("olmoe", WIDE | dict(intermediate_size=256, num_experts_per_tok=2)),
    "gemma4": ("gemma4", WIDE | dict(intermediate_size=256, moe_intermediate_size=256, top_k_experts=2)),
}
# GGUF type of each kind of matrix (a Q4_K_M-like mix); rows that are not whole super-blocks fall back to Q8_0
MIX = {"attn_v": T.Q6_K, "ffn_down": T.Q6_K, "ffn_down_exps": T.Q6_K, "attn_k": T.Q5_K, "ffn_up_exps": T.Q5_K}
COMMON = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "blk.{}.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", "blk.{}.attn_q.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", "blk.{}.attn_k.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", "blk.{}.attn_v.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "blk.{}.attn_output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", "blk.{}.attn_q_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", "blk.{}.attn_k_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "blk.{}.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "blk.{}.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "blk.{}.ffn_down.weight"),
]
SPARSE = COMMON + [
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "blk.{}.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate\.weight", "blk.{}.ffn_gate_inp.weight"),
    (r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", "blk.{0}.ffn_{2}_exps.weight"),
]
GEMMA4 = COMMON + [
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "blk.{}.post_attention_norm.weight"),
    (r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight", "blk.{}.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm\.weight", "blk.{}.post_ffw_norm.weight"),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm_1\.weight", "blk.{}.post_ffw_norm_1.weight"),
    (r"model\.layers\.(\d+)\.pre_feedforward_layernorm_2\.weight", "blk.{}.pre_ffw_norm_2.weight"),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm_2\.weight", "blk.{}.post_ffw_norm_2.weight"),
    (r"model\.layers\.(\d+)\.layer_scalar", "blk.{}.layer_output_scale.weight"),
    (r"model\.layers\.(\d+)\.router\.proj\.weight", "blk.{}.ffn_gate_inp.weight"),
    (r"model\.layers\.(\d+)\.router\.scale", "blk.{}.ffn_gate_inp.scale"),
    (r"model\.layers\.(\d+)\.router\.per_expert_scale", "blk.{}.ffn_down_exps.scale"),
    (r"model\.layers\.(\d+)\.experts\.gate_up_proj", "blk.{}.ffn_gate_up_exps.weight"),
    (r"model\.layers\.(\d+)\.experts\.down_proj", "blk.{}.ffn_down_exps.weight"),
]
NAMES = {"qwen3moe": SPARSE, "olmoe": SPARSE, "gemma4": GEMMA4}


def gguf_name(arch: str, hf: str) -> tuple[str, int | None]:
    """(GGUF name, expert index or None) of a checkpoint tensor."""
    for pat, new in NAMES[arch]:
        m = re.fullmatch(pat, hf)
        if m:
            g = m.groups()
            return new.format(*g[:1], None, *g[2:]), (int(g[1]) if len(g) > 2 else None)
    raise KeyError(hf)


def gguf_type(name: str, shape: tuple, mix: bool) -> T:
    if len(shape) == 1 or "ffn_gate_inp" in name:
        return T.F32
    kind = name.split(".")[-2]
    if not mix or shape[-1] % 256:
        return T.Q8_0
    return MIX.get(kind, T.Q4_K)


def encode(w: np.ndarray, ty: T) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes or values written, the values `gguf.quants.dequantize` reads back from them)."""
    if ty == T.F32:
        return w, w
    flat = w.reshape(-1, w.shape[-1])
    if ty == T.Q8_0:
        data = quantize(flat, "q8_0").parts["blocks"]
    else:
        data = K_QUANTIZERS[ty.name](flat)
        # the reference quantizer's layout: llama.cpp's reader gives back exactly the values meant
        assert np.array_equal(gguf_dequantize(data, ty), kquant_values(flat, ty.name)), ty.name
    data = data.reshape(*w.shape[:-1], -1)
    return data, gguf_dequantize(data, ty).reshape(w.shape)


def tokens_for(arch: str, vocab: int) -> tuple[list[str], list[str]]:
    if arch == "gemma4":  # SentencePiece-style: ▁ for spaces, byte-fallback tokens
        base = SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "t", "h", "e", "▁t", "he", "▁the"]
        merges = ["▁ t", "h e", "▁t he"]
    else:
        base = SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
        merges = ["Ġ t", "h e", "Ġt he"]
    return base + [f"<extra_{i}>" for i in range(vocab - len(base))], merges


def write_moe_gguf(
    arch: str,
    ckpt: Path,
    path: Path,
    *,
    mix: bool = True,
    meta: dict | None = None,
    drop: str = "",
    retype: tuple[str, T] | None = None,
) -> dict[str, np.ndarray]:
    """A GGUF of checkpoint `ckpt` as llama.cpp's converter lays it out; returns the checkpoint's tensors
    with the values the GGUF holds (dequantized), by checkpoint name. `meta` overrides metadata values,
    `drop` leaves a tensor out, `retype` = (name, type) writes that tensor as zero blocks of `type`."""
    from inference.convert.hf import Shard, find_shards

    cfg = json.loads((ckpt / "config.json").read_text())
    tensors: dict[str, np.ndarray] = {}
    for shard in (Shard(p) for p in find_shards(ckpt)):
        tensors |= {n: np.asarray(shard.get(n), np.float32) for n in shard.tensors}
    n_layers, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(4096)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    if arch == "gemma4":
        from inference.models.gemma4 import Args

        a = Args.from_dict(cfg)  # full layers' head size and KV heads (per_layer_config in the checkpoint)
        swa = [t == "sliding_attention" for t in cfg["layer_types"]]
        full = cfg["rope_parameters"]["full_attention"]
        g_dim = a.attn_dims(swa.index(False))[0]
        w.add_head_count_kv([a.attn_dims(i)[1] for i in range(n_layers)])
        w.add_key_length(g_dim)
        w.add_key_length_swa(cfg["head_dim"])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern(swa)
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
        w.add_rope_dimension_count(g_dim)
        w.add_rope_dimension_count_swa(cfg["head_dim"])
        w.add_expert_used_count(cfg["top_k_experts"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_shared_kv_layers(0)
        w.add_embedding_length_per_layer_input(0)
        n_rot = int(g_dim * full["partial_rotary_factor"] / 2)
        freqs = [1.0] * n_rot + [1e30] * (g_dim // 2 - n_rot)
        w.add_tensor("rope_freqs.weight", np.array(freqs, np.float32))
        w.add_tokenizer_model("gemma4")
    else:
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
        w.add_rope_dimension_count(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if cfg.get("moe_intermediate_size"):
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("clip_qkv"):
            w.add_clamp_kqv(cfg["clip_qkv"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch == "qwen3moe" else "olmo")
    tokens, merges = tokens_for(arch, vocab)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (vocab - len(SPECIAL)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    for k, v in (meta or {}).items():
        w.kv_data[0][f"{arch}.{k}"].value = v

    # experts of sparse checkpoints are stacked per layer and projection into one 3-D tensor
    grouped: dict[str, dict[int, str]] = {}
    for hf in tensors:
        name, e = gguf_name(arch, hf)
        grouped.setdefault(name, {})[e] = hf
    back: dict[str, np.ndarray] = {}
    for name, parts in grouped.items():
        if name == drop:
            continue
        if retype and name == retype[0]:
            shape = tensors[next(iter(parts.values()))].shape
            block, size = GGML_QUANT_SIZES[retype[1]]
            rows = (len(parts), *shape[:-1]) if None not in parts else shape[:-1]
            w.add_tensor(name, np.zeros((*rows, shape[-1] // block * size), np.uint8), raw_dtype=retype[1])
            continue
        order = [parts[e] for e in sorted(parts)] if None not in parts else [parts[None]]
        v = np.stack([tensors[h] for h in order]) if None not in parts else tensors[order[0]]
        data, values = encode(v, gguf_type(name, v.shape, mix))
        w.add_tensor(name, data, raw_dtype=gguf_type(name, v.shape, mix))
        for j, h in enumerate(order):
            back[h] = values[j] if None not in parts else values
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return back


def reference_model(arch: str, ckpt: Path, weights: dict[str, np.ndarray]):
    """The transformers model of `ckpt` holding `weights` (the GGUF's dequantized values)."""
    from test_parity import ARCHS

    cls, _ = ARCHS[OVERRIDES[arch][0]]()
    model = cls.from_pretrained(ckpt, dtype=torch.float32).eval()
    sd = model.state_dict()
    weights = dict(weights)
    # transformers holds per-expert checkpoint tensors fused: gate_up [E, 2I, H], down [E, H, I]
    for key in [k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        per = key.removesuffix("gate_up_proj").removesuffix("down_proj")
        n = sd[key].shape[0]
        if f"{per}0.down_proj.weight" not in weights:
            continue
        take = lambda e, p, per=per: weights.pop(f"{per}{e}.{p}_proj.weight")  # noqa: E731
        if key.endswith("gate_up_proj"):
            weights[key] = np.stack([np.concatenate([take(e, "gate"), take(e, "up")]) for e in range(n)])
        else:
            weights[key] = np.stack([take(e, "down") for e in range(n)])
    assert set(weights) <= set(sd), set(weights) - set(sd)
    for k, v in weights.items():
        sd[k] = torch.from_numpy(np.ascontiguousarray(v)).reshape(sd[k].shape)
    if "lm_head.weight" in sd and "lm_head.weight" not in weights:  # tied
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd)
    return model


def greedy(arch: str, tmp: Path, n_prompt: int = 8, n_new: int = 32, mix: bool = True):
    """(our ids, reference ids, our logits, reference logits) over a prompt and `n_new` greedy tokens."""
    name, over = OVERRIDES[arch]
    ckpt = tiny_parity_model(name, tmp / "hf", **over)
    weights = write_moe_gguf(arch, ckpt, tmp / "m.gguf", mix=mix)
    store = convert_gguf(tmp / "m.gguf", tmp / "store", progress=False)
    prompt = np.random.default_rng(0).integers(3, 512, n_prompt)

    m = load_model(store, chunk=16)
    cache = m.new_cache()
    before = kernels.get_activations()
    kernels.set_activations("f32")  # the exact path: transformers multiplies float activations
    try:
        outs = [m.forward(prompt, cache)]
        ours = list(prompt)
        for _ in range(n_new):
            ours.append(int(outs[-1][-1].argmax()))
            outs.append(m.forward(np.array(ours[-1:]), cache))
    finally:
        kernels.set_activations(before)
    ref_model = reference_model(arch, ckpt, weights)
    ref = list(prompt)
    with torch.no_grad():
        for _ in range(n_new):
            ref.append(int(ref_model(torch.tensor([ref])).logits[0, -1].argmax()))
        ref_logits = ref_model(torch.tensor([ours])).logits[0].numpy()
    return ours, ref, np.concatenate(outs), ref_logits, Store(store)


@pytest.mark.parametrize("arch", ["qwen3moe", "olmoe", "gemma4"])
def test_a_moe_gguf_gives_transformers_greedy_ids_and_logits(arch, tmp_path):
    """Q8_0 matrices, kept byte for byte: the same weights on both sides, so the same tokens."""
    ours, ref, logits, ref_logits, st = greedy(arch, tmp_path, mix=False)
    st.verify()
    assert ours == ref
    err = np.abs(logits - ref_logits).max(axis=-1) / np.ptp(ref_logits, axis=-1)
    print(f"{arch} Q8_0: max |dlogit| {np.abs(logits - ref_logits).max():.2e}, relative to range {err.max():.2e}")
    assert err.max() < 1e-4, f"{arch}: worst relative logit error {err.max():.2e}"


@pytest.mark.parametrize("arch", ["qwen3moe", "olmoe", "gemma4"])
def test_a_k_quant_moe_gguf_stays_close_to_transformers_on_its_own_weights(arch, tmp_path):
    """A Q4_K/Q5_K/Q6_K mix: Q5_K/Q6_K are re-quantized to q8_0, so logits move by the re-quantization
    (about 1% of their range per position; a near-tied router choice can flip an expert at a position)."""
    ours, ref, logits, ref_logits, st = greedy(arch, tmp_path)
    st.verify()
    err = np.abs(logits - ref_logits).max(axis=-1) / np.ptp(ref_logits, axis=-1)
    top1 = float((logits.argmax(-1) == ref_logits.argmax(-1)).mean())
    same = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ours)) - 8
    print(
        f"{arch} K-mix: max |dlogit| {np.abs(logits - ref_logits).max():.2e}, relative max {err.max():.2e}"
        f" median {np.median(err):.2e}; top-1 agreement {top1:.2f}; greedy ids equal for {same} of 32 tokens"
    )
    assert np.median(err) < 0.03 and np.quantile(err, 0.9) < 0.06, err
    assert top1 >= 0.8
    q = st.manifest["quantization"]
    assert q["expert"] == "q4_1+q8_0" and "Q4_K->q4_1" in q["requantized"] and "Q6_K->q8_0" in q["requantized"]


def test_experts_land_in_expert_files_as_the_gguf_holds_them(tmp_path):
    ckpt = tiny_parity_model("qwen3_moe", tmp_path / "hf", **OVERRIDES["qwen3moe"][1])
    write_moe_gguf("qwen3moe", ckpt, tmp_path / "m.gguf")
    st = Store(convert_gguf(tmp_path / "m.gguf", tmp_path / "store", progress=False))
    rd = {t.name: t for t in GGUFReader(tmp_path / "m.gguf").tensors}
    assert st.config["mlp_only_layers"] == [1] and st.config["norm_topk_prob"] is True
    assert not any(n.startswith("experts") or "exps" in n for n in st.dense_names())
    for layer in (0, 2, 3):
        for sub, ty in (("gate", T.Q4_K), ("up", T.Q5_K), ("down", T.Q6_K)):
            t = rd[f"blk.{layer}.ffn_{sub}_exps.weight"]
            assert t.tensor_type == ty
            want = gguf_dequantize(t.data, ty)  # [experts, rows, in]
            for e in (0, 7):
                got = st.expert(layer, e)[sub]
                assert got.kind == ("q4_1" if ty == T.Q4_K else "q8_0")
                scale = np.abs(want[e]).max()
                assert np.abs(dequantize(got) - want[e]).max() < 0.02 * scale, (layer, sub, e)
    tok = Tokenizer.from_file(str(st.path / "tokenizer.json"))
    ids = tok.encode("<|im_start|>the then").ids
    assert ids[0] == 1 and tok.decode(ids, skip_special_tokens=False) == "<|im_start|>the then"
    assert "<|im_start|>" in st.manifest["tokenizer"]["chat_template"]


def test_gemma4_metadata_becomes_its_config(tmp_path):
    ckpt = tiny_parity_model("gemma4", tmp_path / "hf", **OVERRIDES["gemma4"][1])
    write_moe_gguf("gemma4", ckpt, tmp_path / "m.gguf", mix=False)
    st = Store(convert_gguf(tmp_path / "m.gguf", tmp_path / "store", progress=False))
    c = st.config
    assert c["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert (c["head_dim"], c["global_head_dim"], c["num_key_value_heads"], c["num_global_key_value_heads"]) == (
        32,
        64,
        2,
        1,
    )
    assert c["attention_k_eq_v"] and c["tie_word_embeddings"] and c["final_logit_softcapping"] == 30.0
    assert c["rope_parameters"]["full_attention"]["partial_rotary_factor"] == 0.25
    assert (c["num_experts"], c["top_k_experts"], c["moe_intermediate_size"]) == (8, 2, 256)
    tok = Tokenizer.from_file(str(st.path / "tokenizer.json"))
    ids = tok.encode("the the").ids
    assert tok.id_to_token(ids[-1]) == "▁the" and tok.decode(ids) == "the the"


# --- bad input: one line naming the file and the thing, nothing left behind -------------------
def assert_refused(exc_type, src: Path, out: Path, *needles: str) -> None:
    with pytest.raises(exc_type) as e:
        convert_gguf(src, out, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and str(src) in msg
    for n in needles:
        assert n in msg, msg
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))


@pytest.fixture(scope="module")
def olmoe_ckpt(tmp_path_factory) -> Path:
    return tiny_parity_model("olmoe", tmp_path_factory.mktemp("olmoe") / "hf", **OVERRIDES["olmoe"][1])


def test_it_rejects_a_truncated_moe_gguf_naming_the_cut_tensor(olmoe_ckpt, tmp_path):
    write_moe_gguf("olmoe", olmoe_ckpt, tmp_path / "m.gguf")
    last = GGUFReader(tmp_path / "m.gguf").tensors[-1].name
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "m.gguf").read_bytes()[:-1000])
    assert_refused(ModelFormatError, tmp_path / "cut.gguf", tmp_path / "store", "truncated", last)


def test_it_rejects_an_unsupported_tensor_type_naming_the_tensor_and_the_supported_types(olmoe_ckpt, tmp_path):
    write_moe_gguf("olmoe", olmoe_ckpt, tmp_path / "m.gguf", retype=("blk.2.ffn_down_exps.weight", T.TQ2_0))
    assert_refused(
        ConvertError, tmp_path / "m.gguf", tmp_path / "store", "blk.2.ffn_down_exps.weight", "TQ2_0", "Q4_K, Q5_K"
    )


def test_it_rejects_an_unsupported_architecture(olmoe_ckpt, tmp_path):
    write_moe_gguf("olmoe", olmoe_ckpt, tmp_path / "m.gguf", mix=False)
    data = (tmp_path / "m.gguf").read_bytes().replace(b"olmoe", b"olmo2", 1)
    (tmp_path / "x.gguf").write_bytes(data)
    assert_refused(ConvertError, tmp_path / "x.gguf", tmp_path / "store", "'olmo2'", "qwen3moe", "gemma4")


def test_it_rejects_metadata_that_disagrees_with_the_expert_shapes(olmoe_ckpt, tmp_path):
    write_moe_gguf("olmoe", olmoe_ckpt, tmp_path / "m.gguf", mix=False, meta={"expert_count": 16})
    assert_refused(
        ConvertError, tmp_path / "m.gguf", tmp_path / "store", "blk.0.ffn_down_exps.weight", "[16, 256, 256]"
    )


def test_it_rejects_a_moe_gguf_missing_an_expert_tensor(olmoe_ckpt, tmp_path):
    write_moe_gguf("olmoe", olmoe_ckpt, tmp_path / "m.gguf", mix=False, drop="blk.1.ffn_up_exps.weight")
    assert_refused(ConvertError, tmp_path / "m.gguf", tmp_path / "store", "blk.1.ffn_up_exps.weight", "missing")
