"""Grammar-constrained decode against free decode, side by side in one engine, and the grammars' compile time.

Each round runs one free answer and one answer constrained by a JSON schema (an object whose one field is
a long string: the grammar's most expensive state, where nearly every token is allowed and the mask walks
the whole token trie), in alternating order, both `--tokens` long with the same sampling. The ratio is
the median constrained decode rate over the median free one; the time to first token is reported too.
Compile times: the first constraint of the run (the llguidance tokenizer is built then: once per model),
a new schema afterwards, and a schema seen before (a copy from the cache).

A store without a tokenizer (an `rkmojo synth` store) gets a synthetic byte-level BPE tokenizer.json of
the model's vocabulary size (262,144 for Gemma 4), written into the store, so the mask is computed over a
vocabulary of the real size:

    .venv/bin/python benchmarks/constrained_decode.py ~/.local/share/rkmojo/models/smollm2-135m-instruct
    .venv/bin/python benchmarks/constrained_decode.py /work/stores/gemma4-26b-a4b-uniform --memory-budget all
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMA = {"type": "object", "properties": {"notes": {"type": "string"}}, "required": ["notes"]}
OTHER = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
}


def synthetic_tokenizer(n_vocab: int, seed: int = 0) -> str:
    """A byte-level BPE tokenizer.json of `n_vocab` ids laid out as Gemma's: 0-3 the special tokens (pad,
    end, begin, unknown: the ids a synth store's config names), then the 256 bytes, then merges of random
    earlier tokens (short ones more often, so lengths spread as a real vocabulary's do)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    rng = np.random.default_rng(seed)
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tokens = specials + sorted(alphabet)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    letters = [t for t in tokens[4:] if t.isalpha() or t == "Ġ"]
    while len(tokens) < n_vocab:
        a = (
            letters[rng.integers(len(letters))]
            if rng.random() < 0.5
            else tokens[min(len(tokens) - 1, 4 + int(rng.exponential(len(tokens) / 8)))]
        )
        b = (
            tokens[4 + int(rng.integers(len(tokens) - 4))]
            if rng.random() < 0.3
            else letters[rng.integers(len(letters))]
        )
        new = a + b
        if new in vocab or len(new) > 16:
            continue
        vocab[new] = len(tokens)
        tokens.append(new)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok.to_str()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--memory-budget", default="all", help='"all" (every expert resident) or a size, e.g. 4G')
    ap.add_argument("--tokens", type=int, default=48, help="decoded tokens per answer")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()

    from inference.engine import Engine

    store = Path(a.store)
    where = (
        {"memory_budget": None, "expert_slots": None, "prefetch": 0}
        if a.memory_budget == "all"
        else {"memory_budget": a.memory_budget}
    )
    if not (store / "tokenizer.json").exists():
        from inference.store import Store

        n_vocab = Store.open(store).config["vocab_size"] if hasattr(Store, "open") else None
        n_vocab = n_vocab or json.loads((store / "manifest.json").read_text())["config"]["vocab_size"]
        tmp = store / "tokenizer.json.tmp"
        tmp.write_text(synthetic_tokenizer(n_vocab))
        tmp.rename(store / "tokenizer.json")
        print(f"wrote a synthetic {n_vocab}-id tokenizer.json into {store}")
    e = Engine.open(store, threads=a.threads, **where)
    try:
        vocab = e.model.args.vocab_size
        prompt = np.random.default_rng(0).integers(300, min(vocab, 20000), 32).tolist()
        base = {"temperature": 0.7, "top_k": 64, "max_tokens": a.tokens}

        t0 = time.perf_counter()
        e.grammars.constraint("start: %json " + json.dumps(SCHEMA), "format")
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        e.grammars.constraint("start: %json " + json.dumps(OTHER), "format")
        new = time.perf_counter() - t0
        t0 = time.perf_counter()
        e.grammars.constraint("start: %json " + json.dumps(SCHEMA), "format")
        cached = time.perf_counter() - t0

        def run(constrained: bool, seed: int):
            p = {**base, "seed": seed, **({"format": SCHEMA} if constrained else {})}
            final = list(e.generate(prompt, p))[-1]
            return final.timings.decode_tps, final.timings.ttft, final.usage.completion_tokens

        run(False, 0)
        run(True, 0)  # warm both paths
        seen = {False: [], True: []}
        ttft = {False: [], True: []}
        for r in range(a.rounds):
            for constrained in (False, True) if r % 2 == 0 else (True, False):
                tps, tt, n = run(constrained, r + 1)
                if n < a.tokens // 2:
                    print(f"  round {r}: {'constrained' if constrained else 'free'} answer ended after {n} tokens")
                seen[constrained].append(tps)
                ttft[constrained].append(tt)
        free, cons = statistics.median(seen[False]), statistics.median(seen[True])
        print(f"store {store.name}, vocab {vocab}, {a.rounds} rounds of {a.tokens} tokens, budget {a.memory_budget}")
        print(f"  free decode         {free:8.2f} tok/s   (runs: {', '.join(f'{x:.2f}' for x in seen[False])})")
        print(f"  constrained decode  {cons:8.2f} tok/s   (runs: {', '.join(f'{x:.2f}' for x in seen[True])})")
        print(f"  constrained / free  {cons / free:8.3f}")
        print(
            f"  TTFT free {statistics.median(ttft[False]) * 1e3:.1f} ms, constrained {statistics.median(ttft[True]) * 1e3:.1f} ms"
        )
        print(
            f"  grammar compile: first {first * 1e3:.0f} ms (with the tokenizer), new schema {new * 1e3:.1f} ms, cached {cached * 1e3:.2f} ms"
        )
    finally:
        e.close()


if __name__ == "__main__":
    main()
