"""What compare.py, ab.py and vs_llamacpp.py share: one timed prompt-and-decode of an engine, a child
process that serves it, the A B B A order, and the summary.

The method (README.md): two variants run side by side in one run, in alternating order (A B, B A, A B …),
so a machine whose speed drifts by a tenth within minutes drifts on both alike; each figure is the median
over the rounds, and the ratio B/A comes with the spread of the per-round ratios (each round's B over the
same round's A, measured moments apart). Nothing here asserts a time.

One measurement (`measure`): the sequence is reset, a prompt of fresh random ids is prefilled (its wall
time is the time to first token, TTFT, and prompt tokens / TTFT the prefill rate), then tokens are
generated one at a time (decode tok/s). The decoded ids are random too, unless `greedy`: a random-weight
model's greedy answer soon repeats one token, which re-reads the same experts and flatters a streamed
decode (llama.cpp's driver decodes greedily, so vs_llamacpp.py does too).

The child (`python benchmarks/rounds.py serve STORE --options JSON …`) opens the engine with the given
`EngineConfig` options, runs an untimed warm-up (a first prompt checks the digests of the experts it
reads and pages the store in), prints `{"ready": …}`, then answers one JSON line per seed it reads on
stdin (`--warm` off: no warm-up). It uses only `Engine.open`, `forward`, `reset`, `close` and
`model.args.vocab_size`, so it serves another checkout's engine too (`PYTHONPATH` set to that tree, as
compare.py does). Importing this module imports no `inference`: the llama.cpp driver's Python
(vs_llamacpp.py) has none.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# figure → (label, higher is better)
FIGURES = {
    "decode_tok_s": ("decode tok/s", True),
    "prefill_tok_s": ("prefill tok/s", True),
    "ttft_s": ("TTFT s", False),
}


def order(k: int, labels: tuple[str, str]) -> tuple[str, str]:
    """Round k's order: A B, then B A, then A B …"""
    return labels if k % 2 == 0 else labels[::-1]


def random_ids(vocab: int, n: int, seed: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(10, vocab, n).tolist()


def measure(
    engine, prompt_tokens: int, decode_tokens: int, seed: int, *, greedy: bool = False, prompt: list[int] | None = None
) -> dict:
    """One prompt of `prompt_tokens` fresh random ids (or the ids `prompt`), then `decode_tokens` generated
    tokens, timed."""
    import numpy as np

    vocab = engine.model.args.vocab_size
    ids = prompt or random_ids(vocab, prompt_tokens, seed)
    engine.reset()
    t = time.perf_counter()
    logits = engine.forward(ids)
    ttft = time.perf_counter() - t
    first = int(np.argmax(logits[-1]))
    feed = random_ids(vocab, decode_tokens, seed + 1)
    nxt = first
    t = time.perf_counter()
    for k in range(decode_tokens):
        logits = engine.forward([nxt if greedy else feed[k]])
        nxt = int(np.argmax(logits[-1]))
    decode_s = time.perf_counter() - t
    return {
        "ttft_s": ttft,
        "prefill_tok_s": len(ids) / ttft,
        "decode_tok_s": decode_tokens / decode_s if decode_tokens else float("nan"),
        "first_token": first,
    }


def serve(a) -> int:
    """The child: open, warm up, then one measurement per seed line on stdin."""
    import inference
    from inference.engine import Engine

    t = time.perf_counter()
    engine = Engine.open(a.store, **json.loads(a.options))
    opened = time.perf_counter() - t
    try:
        if a.warm:
            measure(engine, a.prompt_tokens, min(a.decode_tokens, 4), 999_999, greedy=a.greedy)
        print(json.dumps({"ready": True, "open_s": opened, "inference": str(Path(inference.__file__).parent)}))
        sys.stdout.flush()
        for line in sys.stdin:
            prompt = [int(x) for x in a.prompt.split(",")] if a.prompt else None
            out = measure(engine, a.prompt_tokens, a.decode_tokens, int(line), greedy=a.greedy, prompt=prompt)
            print(json.dumps(out | {"open_s": opened}), flush=True)
    finally:
        engine.close()
    return 0


class Child:
    """A served engine in a process of its own (another checkout's when `src` is given).

    Raises:
        SystemExit: the child ended before it answered (its stderr is shown as it goes).
    """

    def __init__(
        self,
        name: str,
        store: str | Path,
        options: dict,
        *,
        prompt_tokens: int,
        decode_tokens: int,
        warm: bool = True,
        greedy: bool = False,
        prompt: list[int] | None = None,
        src: Path | None = None,
        preexec_fn=None,
    ):
        self.name = name
        env, cwd = dict(os.environ), None
        if src is not None:  # that tree's `inference` first on the path; its kernels built in place
            env["PYTHONPATH"] = str(src)
            cwd = src
        cmd = [sys.executable, str(Path(__file__).resolve()), "serve", str(store), "--options", json.dumps(options)]
        cmd += ["--prompt-tokens", str(prompt_tokens), "--decode-tokens", str(decode_tokens)]
        cmd += ["--warm"] * warm + ["--greedy"] * greedy
        cmd += ["--prompt", ",".join(map(str, prompt))] if prompt else []
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "bufsize": 1}
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, preexec_fn=preexec_fn, **pipes)
        self.ready = self._answer("while opening")

    def ask(self, seed: int) -> dict:
        self.proc.stdin.write(f"{seed}\n")
        return self._answer(f"measuring seed {seed}")

    def _answer(self, doing: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: the child ended {doing} (exit status {self.proc.wait()}; see above)")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def once(child_args: dict, seed: int) -> dict:
    """A fresh child that opens the engine, measures once and ends (a round of loads)."""
    child = Child(**child_args)
    try:
        return child.ask(seed)
    finally:
        child.close()


def summary(rows: list[dict[str, dict]], a: str, b: str, figures=FIGURES) -> dict:
    """{figure: {a: median, b: median, "ratio": median b / median a, "rounds": per-round b/a (min, median, max)}}."""
    out = {}
    for key in figures:
        va, vb = [r[a][key] for r in rows], [r[b][key] for r in rows]
        per = sorted(y / x for x, y in zip(va, vb) if x)
        if not per:
            continue
        ma, mb = statistics.median(va), statistics.median(vb)
        out[key] = {a: ma, b: mb, "ratio": mb / ma, "rounds": (per[0], statistics.median(per), per[-1])}
    return out


def print_summary(s: dict, a: str, b: str, n: int, figures=FIGURES) -> None:
    """The medians of each side and B/A: the ratio of the medians, then the per-round ratios' median and range."""
    width = max(len(a), len(b), 12)
    print(f"\nmedians of {n} rounds   {a:>{width}}  {b:>{width}}   B / A (per round: median, min–max)")
    for key, row in s.items():
        label, higher = figures[key]
        lo, mid, hi = row["rounds"]
        note = "" if higher else "  (a time: below 1 is faster)"
        print(
            f"{label:<22} {row[a]:>{width}.3f}  {row[b]:>{width}.3f}   {row['ratio']:.3f} "
            f"({mid:.3f}, {lo:.3f}–{hi:.3f}){note}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="a child: serve one engine (compare.py, ab.py, vs_llamacpp.py start it)")
    s.add_argument("store")
    s.add_argument("--options", default="{}", help="EngineConfig options as a JSON object")
    s.add_argument("--prompt-tokens", type=int, default=128)
    s.add_argument("--decode-tokens", type=int, default=32)
    s.add_argument("--warm", action="store_true", help="an untimed prompt and 4 tokens before answering")
    s.add_argument("--greedy", action="store_true", help="decode the argmax (default: random ids)")
    s.add_argument("--prompt", help="the prompt's ids, comma-separated (default: random ids, a seed's own)")
    return serve(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
