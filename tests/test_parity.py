"""Logits of every architecture match transformers at every position, for f16, q8 and q4 stores."""

import pytest
import transformers

from parity import run_parity

TOL = 1e-3  # max |Δlogit| ≤ TOL × (max logit − min logit), at every position


def gemma4():
    cfg = transformers.Gemma4TextConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=192,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        sliding_window=24,
        enable_moe_block=True,
        num_experts=16,
        top_k_experts=4,
        hidden_size_per_layer_input=0,
        final_logit_softcapping=30.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return transformers.Gemma4ForCausalLM, cfg


def gemma4_released_layout():
    """The released checkpoint's class: text weights under model.language_model, a vision tower to drop."""
    _, text = gemma4()
    cfg = transformers.Gemma4Config(
        text_config=text.to_dict(),
        audio_config=None,
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
        ),
    )
    cfg.vocab_size = text.vocab_size
    return transformers.Gemma4ForConditionalGeneration, cfg


def qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        tie_word_embeddings=False,
    )
    return transformers.Qwen3MoeForCausalLM, cfg


def llama():
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    )
    return transformers.LlamaForCausalLM, cfg


def olmoe():
    cfg = transformers.OlmoeConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        clip_qkv=4.0,
        tie_word_embeddings=False,
    )
    return transformers.OlmoeForCausalLM, cfg


ARCHS = {
    "gemma4": gemma4,
    "gemma4_released_layout": gemma4_released_layout,
    "qwen3_moe": qwen3_moe,
    "llama": llama,
    "olmoe": olmoe,
}


@pytest.mark.parametrize("quant", ["f16", "q8", "q4"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_match_transformers(arch, quant, tmp_path):
    model_cls, cfg = ARCHS[arch]()
    r = run_parity(model_cls, cfg, tmp_path, quant, n_prompt=40, n_decode=64, chunk=16)
    assert r.positions >= 104
    assert r.worst <= TOL, f"{arch}/{quant}: worst relative logit error {r.worst:.2e}"
