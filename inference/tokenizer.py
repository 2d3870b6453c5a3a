"""The store's tokenizer (HF `tokenizers`), its chat template, and streaming detokenization.

- `StoreTokenizer`: tokenizer.json, the special tokens of tokenizer_config.json, the chat template,
  and every end-of-sequence id the store names (model config, generation config, converter).
- `IncrementalDecoder`: token ids in, text out, never a partial UTF-8 character: each step decodes a
  short window of recent ids and emits only text that no later token can change.
- `TextStream`: on top of that, holds back the last grapheme cluster (a later token may extend it:
  ZWJ emoji sequences, combining accents, flag pairs — found with the `regex` package's `\\X`) and
  any tail that could begin a stop string; a stop string ends the stream and is never emitted.
"""

from __future__ import annotations

import json
from pathlib import Path

import regex
from tokenizers import Tokenizer

from .errors import ModelFormatError
from .store import Store
from .templates import FALLBACK_TEMPLATE, PLAIN_TEMPLATE, ChatTemplate

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
_GRAPHEME = regex.compile(r"\X")


def _token_text(t) -> str | None:
    return t.get("content") if isinstance(t, dict) else t


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]


class StoreTokenizer:
    """Tokenizer, chat template and stop ids of one store.

    Raises:
        ModelFormatError: the store has no tokenizer.json, or its tokenizer files are unreadable.
    """

    def __init__(self, store: Store):
        path = store.path / "tokenizer.json"
        if not path.is_file():
            raise ModelFormatError(f"{store.path}: no tokenizer.json in the store; re-run `rkmojo convert`")
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise ModelFormatError(f"{path}: unreadable tokenizer ({e}); re-run `rkmojo convert`") from None
        config = _read_json(store.path / "tokenizer_config.json")
        info = store.manifest.get("tokenizer", {})
        self.special_tokens = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_text(config.get(k)))}
        self.bos_id = info.get("bos_token_id", store.config.get("bos_token_id"))
        eos = _ids(info.get("eos_token_ids")) + _ids(store.manifest.get("generation", {}).get("eos_token_id"))
        eos += _ids(store.config.get("eos_token_id"))
        if (e := self.special_tokens.get("eos_token")) and self.tok.token_to_id(e) is not None:
            eos.append(self.tok.token_to_id(e))
        self.eos_ids: frozenset[int] = frozenset(eos)
        self.template_source = _chat_template(store.path, info, config)
        if self.template_source is None:
            chatml = self.tok.token_to_id("<|im_start|>") is not None and self.tok.token_to_id("<|im_end|>") is not None
            self.template_source = FALLBACK_TEMPLATE if chatml else PLAIN_TEMPLATE
            self.has_template = False
        else:
            self.has_template = True
        self.template = ChatTemplate(self.template_source, self.special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of plain text; `add_special_tokens` adds what the tokenizer adds (BOS for most models)."""
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True, tools=None, **kwargs) -> str:
        """The prompt text of a conversation (see `templates.ChatTemplate.render`)."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)

    def encode_chat(self, messages: list[dict], **kwargs) -> list[int]:
        """Token ids of a rendered conversation; the template writes the special tokens itself."""
        return self.encode(self.render_chat(messages, **kwargs), add_special_tokens=False)

    def stream(self, stop: list[str] = (), *, skip_special_tokens: bool = True) -> "TextStream":
        """A fresh detokenizer for one answer (special tokens kept when a parser needs to see its markers)."""
        return TextStream(self.decoder(skip_special_tokens=skip_special_tokens), stop)

    def decoder(self, *, skip_special_tokens: bool = True) -> "IncrementalDecoder":
        return IncrementalDecoder(self.tok, skip_special_tokens=skip_special_tokens)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ModelFormatError(f"{path}: invalid JSON ({e}); re-run `rkmojo convert`") from None


def _chat_template(path: Path, info: dict, config: dict) -> str | None:
    """The store's template: the manifest's, chat_template.jinja, chat_template.json, tokenizer_config.json."""
    if info.get("chat_template"):
        return info["chat_template"]
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    tmpl = _read_json(path / "chat_template.json").get("chat_template") or config.get("chat_template")
    if isinstance(tmpl, list):  # named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default") or next(iter(named.values()), None)
    return tmpl or None


class IncrementalDecoder:
    """Token ids in, finished text out; a character split across tokens waits for its last byte.

    Decodes only the ids since the last emitted boundary (`prefix`), compared with the text they gave
    before the newest token, so each step costs a few tokens, not the whole answer.
    """

    def __init__(self, tok: Tokenizer, *, skip_special_tokens: bool = True):
        self.tok = tok
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to text already emitted
        self.read = 0

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, token: int) -> str:
        """Add one token; the text it completes ("" while a character is unfinished)."""
        self.ids.append(int(token))
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is left at the end of the answer (a dangling partial character included)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


class TextStream:
    """Text deltas safe to show: whole grapheme clusters, nothing that could start a stop string.

    Args:
        decoder: an `IncrementalDecoder`.
        stop: strings that end the answer; the text before the first match is emitted, the match never.
    """

    def __init__(self, decoder: IncrementalDecoder, stop=()):
        self.decoder = decoder
        self.stop = [s for s in stop if s]
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one token; the text now safe to emit. Sets `stopped` when a stop string completed."""
        self.text += self.decoder.push(token)
        return self._emit(final=False)

    def finish(self) -> str:
        """The held-back tail at the end of the answer."""
        if not self.stopped:
            self.text += self.decoder.flush()
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self.stopped:
            return ""
        hit = min((i for s in self.stop if (i := self.text.find(s, self.sent)) >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            end = hit
        elif final:
            end = len(self.text)
        else:
            end = min(self._last_grapheme_start(), len(self.text) - self._stop_prefix_len())
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out

    def _last_grapheme_start(self) -> int:
        last = self.sent
        for m in _GRAPHEME.finditer(self.text, self.sent):
            last = m.start()
        return last

    def _stop_prefix_len(self) -> int:
        """Length of the longest unsent tail of the text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text) - self.sent), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best
