"""The real-model proof: the demo GGUF converted into a store decodes exactly as transformers does
when it loads the same GGUF (float32, greedy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference import kernels
from inference.model import load_model
from inference.store import Store

NEW_TOKENS = 40
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [
        {"role": "system", "content": "You are a pirate. Answer in pirate speak."},
        {"role": "user", "content": "How do I bake bread?"},
    ],
    [{"role": "user", "content": "List three prime numbers greater than 100."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Explain photosynthesis in one sentence 🌱."},
    ],
    [{"role": "user", "content": "Traduis en français : « The weather is nice today. »"}],
]
# transformers name of each internal tensor of a Llama layer
HF_LAYER = {
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def prompts(smollm2_store, smollm2_gguf):
    """Each conversation rendered with the store's chat template and encoded with the store's tokenizer."""
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(str(smollm2_store))
    theirs = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    out = []
    for conv in CONVERSATIONS:
        ids = list(ours.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False))
        assert ids == list(
            theirs.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        out.append(ids)
    return out


def test_the_store_holds_exactly_the_weights_transformers_loads(smollm2_store, reference):
    st, sd = Store(smollm2_store), reference.state_dict()
    names = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight"}
    for i in range(st.config["num_hidden_layers"]):
        names.update({f"layers.{i}.{ours}": f"model.layers.{i}.{hf}.weight" for ours, hf in HF_LAYER.items()})
    assert set(names) == set(st.dense_names())
    for ours, hf in names.items():
        assert np.array_equal(st.dense(ours).dense(), sd[hf].numpy()), ours


def reference_greedy(model, ids: list[int], n: int) -> tuple[list[int], np.ndarray, list[float]]:
    """Greedy tokens, prefill logits, and the top-1/top-2 margin at each step (to tell near-ties apart)."""
    tokens, margins = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        prefill = out.logits[0].numpy()
        for _ in range(n):
            last = out.logits[0, -1]
            top = torch.topk(last, 2).values
            margins.append(float(top[0] - top[1]))
            tokens.append(int(last.argmax()))
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens, prefill, margins


def engine_greedy(model, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """On the exact float path (the default decodes in int8): transformers multiplies float activations."""
    cache = model.new_cache()
    with kernels.configured(activations="f32"):
        logits = model.forward(np.array(ids), cache)
        prefill, tokens = logits, []
        for _ in range(n):
            tokens.append(int(logits[-1].argmax()))
            logits = model.forward(np.array([tokens[-1]]), cache)
    return tokens, prefill


def test_greedy_decoding_is_token_identical_to_transformers(smollm2_store, reference, prompts):
    model = load_model(smollm2_store)
    for ids in prompts:
        want, ref_prefill, margins = reference_greedy(reference, ids, NEW_TOKENS)
        got, prefill = engine_greedy(model, ids, NEW_TOKENS)
        assert prefill.shape == ref_prefill.shape
        np.testing.assert_allclose(prefill, ref_prefill, atol=2e-3, rtol=0)
        if got != want:
            step = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            pytest.fail(
                f"prompt of {len(ids)} tokens: step {step} engine {got[step]} vs transformers {want[step]} "
                f"(transformers' top-2 margin there: {margins[step]:.2e})"
            )


def test_a_half_precision_kv_cache_keeps_greedy_decoding(smollm2_store, prompts):
    """The engine's default f16 KV cache against f32 on the real model: the same greedy tokens."""
    half, full = load_model(smollm2_store, kv_dtype="f16"), load_model(smollm2_store)
    for ids in prompts:
        got, p_half = engine_greedy(half, ids, NEW_TOKENS)
        want, p_full = engine_greedy(full, ids, NEW_TOKENS)
        assert got == want
        assert np.max(np.abs(p_half - p_full)) < 0.005 * (p_full.max() - p_full.min())
