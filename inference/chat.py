"""A first terminal chat over a store: its tokenizer, its own chat template, greedy or temperature
sampling, streamed text. (The generation issue replaces this with the engine's event API.)"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from .errors import ModelFormatError
from .model import load_model
from .store import Store

FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTokenizer:
    """The store's tokenizer.json plus its chat template and end-of-turn ids."""

    def __init__(self, store: Store):
        path = store.path / "tokenizer.json"
        if not path.is_file():
            raise ModelFormatError(f"{store.path}: no tokenizer.json in the store; re-run `rkmojo convert`")
        self.tok = Tokenizer.from_file(str(path))
        info = store.manifest.get("tokenizer", {})
        tc = {}
        if (store.path / "tokenizer_config.json").is_file():
            tc = json.loads((store.path / "tokenizer_config.json").read_text())
        self.template = info.get("chat_template") or tc.get("chat_template") or FALLBACK_TEMPLATE
        self.bos = _token_text(tc.get("bos_token"))
        self.eos = _token_text(tc.get("eos_token"))
        eos = info.get("eos_token_ids") or store.config.get("eos_token_id") or []
        gen = store.manifest.get("generation", {}).get("eos_token_id")
        ids = set(eos if isinstance(eos, list) else [eos]) | set(gen if isinstance(gen, list) else [gen] if gen is not None else [])
        if self.eos and self.tok.token_to_id(self.eos) is not None:
            ids.add(self.tok.token_to_id(self.eos))
        self.eos_ids = {int(i) for i in ids if i is not None}
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._tmpl = env.from_string(self.template)

    def render(self, messages: list[dict]) -> str:
        return self._tmpl.render(messages=messages, add_generation_prompt=True,
                                 bos_token=self.bos or "", eos_token=self.eos or "")

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.tok.encode(self.render(messages), add_special_tokens=False).ids


def _token_text(t) -> str | None:
    return t.get("content") if isinstance(t, dict) else t


def generate(model, tok: ChatTokenizer, ids: list[int], cache, *, max_tokens: int, temperature: float,
             rng: np.random.Generator):
    """Yield (token id, text delta) pairs until an end-of-turn id or `max_tokens`."""
    logits = model.forward(np.array(ids), cache, last_only=True)[-1]
    out: list[int] = []
    shown = ""
    for _ in range(max_tokens):
        if temperature > 0:
            p = np.exp((logits - logits.max()) / temperature)
            nxt = int(rng.choice(len(p), p=p / p.sum()))
        else:
            nxt = int(np.argmax(logits))
        if nxt in tok.eos_ids:
            return
        out.append(nxt)
        text = tok.tok.decode(out, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # hold back a partial UTF-8 character
            yield nxt, text[len(shown):]
            shown = text
        logits = model.forward(np.array([nxt]), cache, last_only=True)[-1]


def run_chat(store_path: Path, *, prompt: str | None, max_tokens: int, temperature: float,
             seed: int | None, threads: int | None) -> int:
    if threads:
        from .kernels import set_threads
        set_threads(threads)
    store = Store(store_path)
    model, tok = load_model(store), ChatTokenizer(store)
    rng = np.random.default_rng(seed)
    history: list[dict] = []
    interactive = prompt is None
    while True:
        if interactive:
            try:
                line = input(">>> ")
            except EOFError:
                return 0
            if not line.strip():
                continue
        else:
            line = prompt
        history.append({"role": "user", "content": line})
        cache = model.new_cache()
        t0, n, answer = time.perf_counter(), 0, []
        try:
            for _, delta in generate(model, tok, tok.encode_chat(history), cache,
                                     max_tokens=max_tokens, temperature=temperature, rng=rng):
                n += 1
                answer.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
        except KeyboardInterrupt:
            if not interactive:
                raise
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(answer)})
        if not interactive:
            return 0
        dt = time.perf_counter() - t0
        print(f"[{n} tokens, {n / dt:.1f} tok/s]", file=sys.stderr)
