"""The tokenizer rebuilt from GGUF metadata: the demo model against transformers' GGUF tokenizer, a
SentencePiece vocabulary against sentencepiece itself, and refusals."""

from __future__ import annotations

import inspect
import io
import json

import pytest
from tokenizers import Tokenizer

from inference.errors import ConvertError
from inference.tokenizer_gguf import tokenizer_from_gguf

TEXTS = [
    "Hello world!",
    "The year 2024 had 366 days; π ≈ 3.14159, 1,000,000 $12.50",
    "naïve café, Straße, 日本語のテキスト, 中文, Ελληνικά, русский",
    "emoji 😀🎉 family 👩‍👩‍👧 flags 🇫🇷 done",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "spaces   runs\t\ttabs\n\n\nnewlines  \n  trailing   ",
    "  leading spaces",
    "don't I'll we've they'RE",
    "<|im_start|>user\nhi<|im_end|><|endoftext|>",
    "",
]
MESSAGES = [
    {"role": "user", "content": "Write a haiku about the sea 🌊 in 3 lines."},
    {"role": "assistant", "content": "Waves fold into foam\n  salt wind\tcarries gull cries"},
    {"role": "user", "content": "Now in French, s'il vous plaît: « la mer »"},
]


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="module")
def ours(smollm2_store):
    return Tokenizer.from_file(str(smollm2_store / "tokenizer.json"))


def test_the_demo_tokenizer_encodes_like_transformers_gguf_loader(ours, reference):
    prompt = reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    for text in TEXTS + [prompt]:
        ids = ours.encode(text).ids
        assert ids == reference.encode(text), text
        assert ours.decode(ids, skip_special_tokens=False) == text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_the_store_tokenizer_loads_in_transformers_with_the_same_chat_template(smollm2_store, reference):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_store))
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    ) == reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    config = json.loads((smollm2_store / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is False


# --- SentencePiece (tokenizer.ggml.model == "llama") --------------------------------------------
@pytest.fixture(scope="module")
def sentencepiece_model():
    """A small SentencePiece BPE model trained here (byte fallback, whitespace kept as llama's)."""
    spm = pytest.importorskip("sentencepiece")
    lines = [l for l in (inspect.getsource(json) + inspect.getsource(inspect)).splitlines() if l.strip()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        vocab_size=600,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def spm_metadata(sp) -> dict:
    """The metadata llama.cpp writes for a SentencePiece vocabulary (scores, types, no merges)."""

    def kind(i):
        return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1

    n = sp.get_piece_size()
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(n)],
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


def test_a_sentencepiece_vocabulary_encodes_like_sentencepiece(sentencepiece_model):
    sp = sentencepiece_model
    built = tokenizer_from_gguf(spm_metadata(sp))
    tok = Tokenizer.from_str(built.tokenizer_json)
    assert built.config["add_bos_token"] is True and built.bos_token_id == 1
    for text in TEXTS[:-3] + ["return self.__class__.__name__", "x"]:
        ids = tok.encode(text).ids
        assert ids == [1] + sp.encode(text), text
        assert tok.decode(ids) == sp.decode(ids[1:]) == text


def test_a_sentencepiece_vocabulary_prefixes_a_space_after_special_tokens_as_llama_cpp(sentencepiece_model):
    sp = sentencepiece_model
    tok = Tokenizer.from_str(tokenizer_from_gguf(spm_metadata(sp)).tokenizer_json)
    assert tok.encode("</s>return", add_special_tokens=False).ids == [2] + sp.encode("return")


# --- refusals ------------------------------------------------------------------------------------
def test_it_refuses_an_unknown_pre_tokenizer_listing_the_known_ones():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "mystery", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(ConvertError, match=r"m\.gguf: pre-tokenizer 'mystery' .* supported: .*smollm"):
        tokenizer_from_gguf(meta, "m.gguf")


def test_it_refuses_a_gguf_without_a_vocabulary():
    with pytest.raises(ConvertError, match="no tokenizer vocabulary"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "gpt2"}, "m.gguf")
