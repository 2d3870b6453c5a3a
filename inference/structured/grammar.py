"""Grammar-constrained sampling through llguidance: a store's grammar compiler and one answer's constraint.

llguidance (the library llama.cpp uses) was chosen over xgrammar and outlines-core because it ships abi3
wheels for x86_64 and aarch64 without torch, compiles JSON schemas and Lark grammars (with `%json`
embedded in Lark, which the tool-call grammars need) in milliseconds, and computes a token mask from a
token trie without a per-grammar precomputation over the vocabulary.

- `Grammars` holds one store's llguidance tokenizer (built once, on first use: about a second on a
  262k vocabulary) and its compiled grammars, kept by grammar text (an LRU of `CACHE_SIZE`): a
  request with a schema seen before starts from a copy of the compiled matcher.
- `Constraint` is one answer's matcher: `apply(logits)` sets every token the grammar refuses to -inf,
  `accept(token)` advances it. `done` says the grammar is complete and allows nothing more.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import numpy as np

from ..errors import RkmojoError

CACHE_SIZE = 64


class StructureError(RkmojoError, ValueError):
    """A request's tools, tool choice, output format or thinking switch cannot be honoured.

    `field` names the request field as the engine spells it (`tools[0].function.parameters`, `format`,
    `tool_choice`, `think`); each API translates it to its own spelling.
    """

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _llguidance():
    import llguidance

    return llguidance


class Grammars:
    """The grammar compiler of one tokenizer.

    Args:
        tokenizer_json: the store's tokenizer.json text.
        n_vocab: the model's logit width (may exceed the tokenizer's ids).
        eos_ids: end-of-sequence ids; the first is the grammar's own end token.
    """

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_ids):
        self._json = tokenizer_json
        self.n_vocab = int(n_vocab)
        self.eos_ids = sorted(int(i) for i in eos_ids)
        self._tok = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def llg_tokenizer(self):
        if self._tok is None:
            llg = _llguidance()
            eos = [i for i in self.eos_ids if i < self.n_vocab] or None  # None: the tokenizer's own
            self._tok = llg.LLTokenizer(self._json, n_vocab=self.n_vocab, eos_token=eos)
            self.eos_ids = sorted(set(self.eos_ids) | set(self._tok.eos_tokens))
        return self._tok

    def constraint(self, lark: str, field: str) -> "Constraint":
        """A fresh constraint for the Lark grammar `lark`.

        Raises:
            StructureError: the grammar (or a JSON schema inside it) does not compile; names `field`.
        """
        with self._lock:
            base = self._compiled.get(lark)
            if base is not None:
                self._compiled.move_to_end(lark)
            else:
                base = self._compile(lark, field)
                self._compiled[lark] = base
                while len(self._compiled) > CACHE_SIZE:
                    self._compiled.popitem(last=False)
            return Constraint(base.deep_copy(), self.n_vocab, self.eos_ids)

    def _compile(self, lark: str, field: str):
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_lark(lark)
        except (ValueError, RuntimeError) as e:
            raise StructureError(field, f"{field}: the grammar does not compile: {_first_line(e)}") from None
        matcher = llg.LLMatcher(self.llg_tokenizer, grammar)
        if matcher.is_error():
            raise StructureError(field, f"{field}: {_schema_message(matcher.get_error())}")
        return matcher


def _first_line(e) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _schema_message(error: str) -> str:
    """llguidance's compile error as one sentence with a fix (its position in the grammar text left out)."""
    line = re.sub(r"^(at )?\d+\(\d+\):?\s*", "", _first_line(error))
    line = re.sub(r"\s*\bat \d+\(\d+\)", "", line)
    if "Unimplemented keys" in line:
        return f"this JSON schema uses keywords the constrained decoder does not support ({line}); remove them"
    return f"the JSON schema is not valid ({line}); fix the schema"


_LANES = np.arange(32, dtype=np.int64)


def _positions(bits: np.ndarray, words: np.ndarray, *, refused: bool) -> np.ndarray:
    """Token ids of the refused (or allowed) bits in the mask words `words`."""
    sub = np.unpackbits(bits[words].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little").astype(bool)
    return (words[:, None] * 32 + _LANES)[~sub if refused else sub]


class Constraint:
    """One answer's grammar state over the vocabulary (see the module docstring)."""

    def __init__(self, matcher, n_vocab: int, eos_ids):
        self.m = matcher
        self.n_vocab = n_vocab
        self.eos = np.asarray(eos_ids, dtype=np.int64)
        self.eos_set = frozenset(int(i) for i in eos_ids)
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows no further token."""
        return bool(self.m.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.m.is_accepting())

    def apply(self, logits: np.ndarray) -> None:
        """Set the logits [vocab] of every token the grammar refuses to -inf, in place.

        The mask is 32 tokens a word; only words neither all-allowed nor all-refused are unpacked, so a
        mask that allows nearly everything (text inside a JSON string) or nearly nothing costs a few
        microseconds, not a pass over 262k booleans.
        """
        self.m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits, n = self._bits, self.n_vocab
        eos = self.eos[self.eos < n]
        keep_eos = logits[eos].copy() if self.m.is_accepting() else None  # every end id ends a complete answer
        partial = np.flatnonzero(bits != -1)
        if len(partial) <= len(bits) // 4:  # mostly allowed: refuse the few
            pos = _positions(bits, partial, refused=True)
            logits[pos[pos < n]] = -np.inf
        else:  # mostly refused: keep the few
            some = np.flatnonzero(bits != 0)
            pos = _positions(bits, some, refused=False)
            pos = pos[pos < n]
            kept = logits[pos].copy()
            logits[:n] = -np.inf
            logits[pos] = kept
        if keep_eos is not None:
            logits[eos] = keep_eos

    def ends(self, token: int) -> bool:
        """`token` is an end-of-sequence id the grammar allows now: the answer is complete."""
        return token in self.eos_set and self.accepting

    def accept(self, token: int) -> bool:
        """Advance by the sampled `token`; False when the grammar refused it (the constraint is then spent)."""
        return bool(self.m.consume_token(int(token)))

    def accept_text(self, ids: list[int]) -> bool:
        """Advance by token ids whose bytes are text already written (a lazy start inside a token)."""
        return bool(self.m.consume_tokens([int(i) for i in ids])) if ids else True
