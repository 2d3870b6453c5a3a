"""A Hugging Face `tokenizer.json` rebuilt from a GGUF file's tokenizer metadata.

A GGUF carries no `tokenizer.json`: llama.cpp keeps the vocabulary, merges, token types and special
ids as metadata (`tokenizer.ggml.*`) and names the pre-tokenizer (`tokenizer.ggml.pre`) instead of
storing it. We build the equivalent pipeline with the `tokenizers` library, so that the engine and
any HF tool read the converted store the same way:

- `gpt2` (byte-level BPE): the file's merges; split regex chosen by `tokenizer.ggml.pre`
  (`PRE_TOKENIZERS`); ByteLevel decoder.
- `llama` (SentencePiece BPE): merges from the file, or derived from the token scores; the space
  prefix as llama.cpp applies it; byte fallback.

Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
tokens, so both are matched whole in text as llama.cpp does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .errors import ConvertError

# llama.cpp's token types (`llama_token_type`)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_style() -> pre_tokenizers.PreTokenizer:
    # ByteLevel's own regex is GPT-2's: 's|'t|… | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_style()])


def _split(regex: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )

    return build


# `tokenizer.ggml.pre` → the byte-level pre-tokenizer its merges were learned with (llama-vocab.cpp)
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2_style,
    "gpt-2": _gpt2_style,
    "gpt2": _gpt2_style,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "codeshell": _digits_then_gpt2,
    "llama-bpe": _split(_LLAMA3_SPLIT),
    "llama3": _split(_LLAMA3_SPLIT),
    "smaug-bpe": _split(_LLAMA3_SPLIT),
    "dbrx": _split(_LLAMA3_SPLIT),
    "qwen2": _split(_QWEN2_SPLIT),
    "deepseek-r1-qwen": _split(_QWEN2_SPLIT),
}


@dataclass
class GGUFTokenizer:
    """The tokenizer files for a store and the facts the engine needs without parsing them."""

    tokenizer_json: str
    config: dict  # tokenizer_config.json
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: list[int]

    def files(self) -> dict[str, bytes]:
        return {
            "tokenizer.json": self.tokenizer_json.encode(),
            "tokenizer_config.json": json.dumps(self.config, indent=1, ensure_ascii=False).encode(),
        }


def tokenizer_from_gguf(meta: Mapping[str, Any], source: str = "GGUF") -> GGUFTokenizer:
    """Build the tokenizer a GGUF's metadata describes.

    Args:
        meta: the file's metadata as plain values (`{"tokenizer.ggml.tokens": [...], ...}`).
        source: the file name, for error messages.
    Raises:
        ConvertError: the file has no vocabulary, or a tokenizer model / pre-tokenizer we do not know.
    """
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ConvertError(
            f"{source}: no tokenizer vocabulary (tokenizer.ggml.tokens); use a GGUF that embeds its tokenizer"
        )
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if kind == "gpt2":
        tok, add_prefix_space = _byte_level_bpe(meta, tokens, types, source), False
    elif kind == "llama":
        add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        tok = _sentencepiece_bpe(meta, tokens, types, add_prefix_space)
    else:
        raise ConvertError(
            f"{source}: tokenizer model {kind!r} is not supported; supported: gpt2 (byte-level BPE), llama (SentencePiece)"
        )
    _add_special(tok, tokens, types)

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    # llama.cpp adds BOS to SentencePiece vocabularies unless the file says otherwise
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and token("eos_token_id") is not None
    _set_post_processor(
        tok, kind, token("bos_token_id") if add_bos else None, token("eos_token_id") if add_eos else None
    )

    eos_ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is not None and i not in eos_ids:
            eos_ids.append(int(i))
    template = meta.get("tokenizer.chat_template")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": add_prefix_space,
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    return GGUFTokenizer(
        tokenizer_json=tok.to_str(),
        config={k: v for k, v in config.items() if v is not None},
        chat_template=template,
        bos_token_id=int(bos_id) if bos_id is not None else None,
        eos_token_ids=eos_ids,
    )


def _byte_level_bpe(meta: Mapping[str, Any], tokens: list[str], types: list[int], source: str) -> Tokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConvertError(
            f"{source}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    vocab: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        # a normal token outside the byte alphabet is written as raw text: respell it byte-level
        if ty == NORMAL and not set(t) <= alphabet:
            t = "".join(piece for piece, _ in spell.pre_tokenize_str(t))
        vocab.setdefault(t, i)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            fuse_unk=False,
            continuing_subword_prefix="",
            end_of_word_suffix="",
        )
    )
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(
    meta: Mapping[str, Any], tokens: list[str], types: list[int], add_prefix_space: bool
) -> Tokenizer:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    if meta.get("tokenizer.ggml.merges"):
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    else:
        merges = _merges_from_scores(tokens, types, list(meta.get("tokenizer.ggml.scores") or []), vocab)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    # llama.cpp (like sentencepiece) prefixes every text run with a space, also after a special token
    # and also when the text already starts with one; HF's Metaspace(prepend_scheme="first") does neither
    steps = [normalizers.Replace(" ", "▁")]
    if add_prefix_space:
        steps.insert(0, normalizers.Prepend("▁"))
    tok.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        decode.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(decode)
    return tok


def _merges_from_scores(tokens, types, scores, vocab) -> list[tuple[str, str]]:
    """SentencePiece BPE merges: every split of a normal token into two vocabulary pieces, best score first."""
    if len(scores) != len(tokens):
        scores = [-float(i) for i in range(len(tokens))]  # no scores: earlier tokens merge first
    ranked = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty != NORMAL or len(t) < 2:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                ranked.append((-scores[i], i, vocab[a], a, b))
    ranked.sort()
    return [(a, b) for *_, a, b in ranked]


def _add_special(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    special = [
        AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)
    ]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)


def _set_post_processor(tok: Tokenizer, kind: str, bos: str | None, eos: str | None) -> None:
    if bos is None and eos is None:
        if kind == "gpt2":
            tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return
    ids = {t: tok.token_to_id(t) for t in (bos, eos) if t is not None}
    pre = f"{bos}:0 " if bos else ""
    post = f" {eos}:0" if eos else ""
    pair_pre = f"{bos}:1 " if bos else ""
    pair_post = f" {eos}:1" if eos else ""
    tok.post_processor = processors.TemplateProcessing(
        single=f"{pre}$A:0{post}",
        pair=f"{pre}$A:0{post} {pair_pre}$B:1{pair_post}",
        special_tokens=list(ids.items()),
    )
