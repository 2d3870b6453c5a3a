"""One engine option at two values, side by side in one run: `--toggle NAME` names an `EngineConfig`
option (`inference/options.py` declares them; `fused_decode`, `--fused-decode` and `RKMOJO_FUSED_DECODE`
are all accepted), `--values A B` its two values (default for an on/off option: off on).

Which method depends on when the engine reads the option, and the script finds that out rather than
keeping a list: it opens the engine once with a config that records the options read, at open and then
during one generated token.

- Read per call, not at open (e.g. `threads`): the option flips live. In that one engine, prompts of
  fresh random ids alternate between the values (A B, B A, …: TTFT and prefill), then generated tokens
  go in pairs, two at A, two at B, …, and only the second token of each pair is timed, so no timed token
  pays for what the other value left running (reads in flight, a cache's state). B/A's spread is that of
  each B pair's rate over the A pair's before it.
- Read at open (the memory budget, the cache, the lookahead, repacking, activations, …): the option needs
  a reload, and the script says so. Each round then opens a fresh engine at A and one at B, in processes
  of their own, in alternating order (A B, B A, …), each timing one prompt and its decode after an
  untimed warm-up (`rounds.py`); the open time is reported too.

    .venv/bin/python benchmarks/ab.py --toggle threads --values 1 2
    .venv/bin/python benchmarks/ab.py --toggle activations --values f32 decode --rounds 4
    .venv/bin/python -m inference.bench.cgroup 3G -- .venv/bin/python benchmarks/ab.py \\
        --store /work/stores/gemma4-26b-a4b-uniform --memory-budget 3G --toggle token_prefetch --values 0 3

`--store` defaults to the demo model. The other engine options (`--memory-budget`, `--expert-slots`, …) set
what both values share. `--method pairs|loads` skips the probe.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import typing
from pathlib import Path

import rounds


class Recording:
    """An `EngineConfig` stand-in that notes which options the engine reads; `config` is the one it reads,
    swapped to flip an option live (every holder of the stand-in then sees the new value)."""

    def __init__(self, config):
        self.config, self.read = config, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self.config, name)


def option_name(text: str, names) -> str:
    """`fused_decode`, `--fused-decode` or `RKMOJO_FUSED_DECODE` → `fused_decode`.

    Raises:
        SystemExit: not an engine option (lists them).
    """
    name = text.strip().lower().removeprefix("--").removeprefix("rkmojo_").replace("-", "_")
    if name not in names:
        raise SystemExit(f"--toggle {text!r}: not an engine option; the options are {', '.join(names)}")
    return name


def values(name: str, given: list[str] | None) -> tuple:
    """The two values, parsed and checked by the option's schema.

    Raises:
        SystemExit: not two values, or one the option refuses (in its own words).
    """
    from inference import options
    from inference.engine import EngineConfig

    tp, spec = options.specs(EngineConfig)[name]
    if given is None:
        if bool not in (tp, *typing.get_args(tp)):
            raise SystemExit(f"--toggle {name}: give its two values, --values A B ({options.allowed(tp, spec)})")
        given = ["off", "on"]
    if len(given) != 2:
        raise SystemExit(f"--values: two values, A and B (got {len(given)})")
    try:
        return tuple(options.read_value(EngineConfig, name, v, options.CLI) for v in given)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def probe(store, base: dict, name: str, value) -> tuple[str, object]:
    """(`pairs` or `loads`, the engine when `pairs`): whether the engine reads `name` at open or per call."""
    from inference.engine import Engine, EngineConfig
    from inference.store import Store

    rec = Recording(EngineConfig(**base, **{name: value}))
    engine = Engine(Store(store), rec)
    at_open = set(rec.read)
    rec.read.clear()
    rounds.measure(engine, 8, 2, 7)
    per_call = set(rec.read)
    if name in per_call and name not in at_open:
        return "pairs", engine
    engine.close()
    when = "at open" if name in at_open else "neither at open nor in a prompt or a token"
    print(f"{name}: the engine reads it {when}, so it needs a reload: alternate rounds of loads")
    return "loads", None


def labels(name: str, vals: tuple) -> tuple[str, str]:
    return f"A {name}={vals[0]}", f"B {name}={vals[1]}"


def pairs(engine, name: str, vals: tuple, a) -> dict:
    """Prompts alternating between the values, then generated tokens in alternating pairs, in `engine`."""
    import numpy as np

    rec, base = engine.cfg, engine.cfg.config
    side = labels(name, vals)
    configs = [dataclasses.replace(base, **{name: v}) for v in vals]
    prompts: list[dict] = []
    for k in range(a.rounds):
        got = {}
        for i in rounds.order(k, (0, 1)):
            rec.config = configs[i]
            got[side[i]] = rounds.measure(engine, a.prompt_tokens, 0, 2000 + k)
        prompts.append(got)
    engine.reset()
    engine.forward(rounds.random_ids(engine.model.args.vocab_size, a.prompt_tokens, 1))
    feed = rounds.random_ids(engine.model.args.vocab_size, a.decode_tokens, 2)
    timed: list[list[float]] = [[], []]
    for t in range(a.decode_tokens):
        i = (t // 2) % 2
        rec.config = configs[i]
        t0 = time.perf_counter()
        engine.forward([feed[t]])
        if t % 2:  # the second of the pair
            timed[i].append(time.perf_counter() - t0)
    rec.config = base
    n = min(len(timed[0]), len(timed[1]))
    if not n:
        raise SystemExit("--decode-tokens: at least 4 (two pairs) to time a token at each value")
    per = sorted(x / y for x, y in zip(timed[0], timed[1]))  # B's rate over A's, pair by pair
    ma, mb = statistics.median(timed[0]), statistics.median(timed[1])
    q = np.quantile(per, [0.25, 0.5, 0.75])
    print(
        f"generated tokens, {n} timed per value: {side[0]} {1 / ma:.2f} tok/s, {side[1]} {1 / mb:.2f} tok/s "
        f"(medians), B/A {ma / mb:.3f}; per pair: median {q[1]:.3f}, quartiles {q[0]:.3f}–{q[2]:.3f}"
    )
    figures = {k: rounds.FIGURES[k] for k in ("prefill_tok_s", "ttft_s")}
    s = rounds.summary(prompts, *side, figures)
    rounds.print_summary(s, *side, len(prompts), figures)
    decode = {side[0]: 1 / ma, side[1]: 1 / mb, "ratio": ma / mb, "pairs": (per[0], float(q[1]), per[-1])}
    return {"prompts": prompts, "summary": s, "decode": decode | {"timed": n}}


def loads(store, base: dict, name: str, vals: tuple, a) -> dict:
    """Each round a fresh engine at each value, in a process of its own, the order alternating."""
    work = {"store": store, "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens}
    side = labels(name, vals)
    rows = []
    for k in range(a.rounds):
        got = {}
        for i in rounds.order(k, (0, 1)):
            got[side[i]] = rounds.once(work | {"name": side[i], "options": base | {name: vals[i]}}, 3000 + k)
        rows.append(got)
        cells = "  |  ".join(
            f"{s}: open {got[s]['open_s']:.1f} s, decode {got[s]['decode_tok_s']:.2f} tok/s, "
            f"prefill {got[s]['prefill_tok_s']:.1f} tok/s, TTFT {got[s]['ttft_s']:.3f} s"
            for s in side
        )
        print(f"round {k}: {cells}", flush=True)
    figures = rounds.FIGURES | {"open_s": ("open s", False)}
    s = rounds.summary(rows, *side, figures)
    rounds.print_summary(s, *side, len(rows), figures)
    return {"rounds": rows, "summary": s}


def main() -> int:
    from inference import options
    from inference.engine import EngineConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--toggle", required=True, metavar="OPTION", help="the EngineConfig option to flip")
    p.add_argument("--values", nargs="+", metavar="VALUE", help="A and B (default for on/off options: off on)")
    p.add_argument("--store", help="the store (default: the demo model, installed if missing)")
    p.add_argument("--method", choices=("auto", "pairs", "loads"), default="auto")
    p.add_argument("--rounds", type=int, default=6, help="prompts per value (pairs) or loads per value (loads)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--decode-tokens", type=int, default=64, help="pairs: both values together; loads: per load")
    p.add_argument("--json", help="write the rounds and the summary here")
    options.add_flags(p.add_argument_group("engine options, both values"), EngineConfig)
    a = p.parse_args()
    name = option_name(a.toggle, options.specs(EngineConfig))
    vals = values(name, a.values)
    try:
        base = {k: v for k, v in options.from_flags(EngineConfig, a).items() if k != name}
    except ValueError as e:
        p.error(str(e))
    if a.store is None:
        from inference.demo import install

        a.store = str(install(progress=False))
    print(f"{a.store}: {name} A={vals[0]!r} B={vals[1]!r}; both with {base or 'the defaults'}")
    method, engine = probe(a.store, base, name, vals[0]) if a.method == "auto" else (a.method, None)
    if method == "pairs":
        if engine is None:
            from inference.engine import Engine, EngineConfig
            from inference.store import Store

            engine = Engine(Store(a.store), Recording(EngineConfig(**base, **{name: vals[0]})))
        print(f"{name}: the engine reads it per call: flipped live in one engine")
        try:
            out = pairs(engine, name, vals, a)
        finally:
            engine.close()
    else:
        out = loads(a.store, base, name, vals, a)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "method": method, **out}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
