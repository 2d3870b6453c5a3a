"""rkmojo against llama.cpp on one model, dense or MoE, in RAM or both in the same memory cgroup, in one run.

Both sides prefill the same prompt ids and then decode greedily with the same thread count, each side a
process of its own, in rounds whose order alternates (rkmojo first, then llama.cpp first, …) so the
machine's drift hits both alike; medians of the rounds, and rkmojo / llama.cpp with the spread of the
per-round ratios. Neither side warms up: each first prompt pays its own page faults (and rkmojo's its
digest checks), as a first prompt after start does.

- In RAM (the default): rkmojo with every expert resident; llama.cpp with its weights repacked at load,
  its fastest CPU path.
- `--memory SIZE`: each side runs inside a cgroup-v1 memory limit of SIZE (root; `inference.bench.cgroup`),
  the page cache dropped before each run (pages cached earlier by another group would serve the limited
  child without being charged to it, and llama.cpp would look RAM-resident). rkmojo streams its experts
  within `--memory-budget`, by default SIZE; llama.cpp runs without weight repacking (repacked weights are
  anonymous memory, which a memory cgroup cannot page out: `use_extra_bufts` off, llama.cpp's
  `--no-repack`), its weights memory-mapped, and decodes `--llama-tokens` tokens: on a model 4x its limit
  it runs at ~0.1 tok/s, and greedy decoding, which repeats tokens and their experts, can only help it.

llama.cpp runs through llama-cpp-python in a venv of its own (`python3 -m venv /work/llamavenv &&
/work/llamavenv/bin/pip install llama-cpp-python==0.3.36`, which compiles llama.cpp), by this same file
(`--llama-driver`, which imports no rkmojo). The GGUF holds the model rkmojo's store was converted from
(the demo: SmolLM2-135M Q4_1), or the same shapes (`rkmojo synth --shape qwen3-30b-a3b --layers N` and
`/work/shared/tools/synth_qwen3moe_gguf.py OUT.gguf --layers N`: random weights both, so only speed compares):

    .venv/bin/python benchmarks/vs_llamacpp.py --threads 2 --rounds 5 --decode-tokens 128
    .venv/bin/python benchmarks/vs_llamacpp.py --store /work/stores/qwen3-30b-a3b-uniform \\
        --gguf /work/stores/qwen3-30b-a3b-q4_0.gguf --memory 4G --prompt-tokens 128 --decode-tokens 32 \\
        --llama-tokens 5 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import rounds

LLAMA_PYTHON = os.environ.get("LLAMA_PYTHON", "/work/llamavenv/bin/python")


def llama_driver(a) -> int:
    """In llama-cpp-python's venv: prefill the prompt ids, decode greedily, print one JSON line."""
    import llama_cpp
    import numpy as np

    if a.no_repack:  # weights stay in the mmap (llama.cpp's --no-repack)
        default = llama_cpp.llama_model_default_params

        def params():
            mp = default()
            mp.use_extra_bufts = False
            return mp

        llama_cpp.llama_model_default_params = params
        llama_cpp.llama.llama_cpp.llama_model_default_params = params
    t = time.perf_counter()
    shape = {"n_threads": a.threads, "n_threads_batch": a.threads, "n_ctx": 2048, "n_batch": 128}
    llm = llama_cpp.Llama(model_path=a.llama_driver, verbose=False, use_mmap=True, logits_all=True, **shape)
    opened = time.perf_counter() - t
    prompt = [int(x) for x in a.prompt.split(",")]
    t = time.perf_counter()
    llm.eval(prompt)
    ttft = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(a.decode_tokens):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    decode_s = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"ttft_s": ttft, "prefill_tok_s": len(prompt) / ttft, "decode_tok_s": a.decode_tokens / decode_s}
    print(json.dumps(out | {"open_s": opened, "peak_rss_bytes": peak, "repack": not a.no_repack}))
    return 0


def in_group(memory: str | None):
    """A fresh cgroup of `memory` with the page cache dropped, or nothing (in RAM)."""
    import contextlib

    if memory is None:
        return contextlib.nullcontext()
    from inference.bench.bounds import drop_caches
    from inference.bench.cgroup import MemoryCgroup

    if not drop_caches():
        raise SystemExit("--memory: dropping the page cache needs root (see the docstring for why it is dropped)")
    return MemoryCgroup(memory)


def run_llama(a, prompt: list[int]) -> dict:
    cmd = [a.llama_python, str(Path(__file__).resolve()), "--llama-driver", str(a.gguf), "--threads", str(a.threads)]
    cmd += ["--prompt", ",".join(map(str, prompt)), "--decode-tokens", str(a.llama_tokens or a.decode_tokens)]
    cmd += ["--no-repack"] * bool(a.memory)
    with in_group(a.memory) as group:
        r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=group.enter if group else None)
        use = group.usage() if group else None
    if r.returncode != 0:
        why = "killed by the OOM killer" if use and use["oom_kills"] else f"exit status {r.returncode}"
        raise SystemExit(f"llama.cpp ({' '.join(cmd[:3])} …) failed, {why}:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]) | {"cgroup": use}


def run_rkmojo(a, engine: dict, prompt: list[int]) -> dict:
    work = {"store": a.store, "options": engine, "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens}
    with in_group(a.memory) as group:
        enter = group.enter if group else None
        child = rounds.Child("rkmojo", **work, warm=False, greedy=True, prompt=prompt, preexec_fn=enter)
        try:
            got = child.ask(0)
        finally:
            child.close()
        use = group.usage() if group else None
    return got | {"cgroup": use}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", help="rkmojo's store (default: the demo model, installed if missing)")
    p.add_argument("--gguf", help="llama.cpp's GGUF of the same model (default: the demo GGUF)")
    p.add_argument("--memory", help="both sides in a memory cgroup of this size (root), e.g. 4G")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="both sides")
    p.add_argument("--prompt-tokens", type=int, default=8, help="prompt ids prefilled before decoding")
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--llama-tokens", type=int, help="llama.cpp's decode tokens (default: --decode-tokens)")
    p.add_argument("--llama-python", default=LLAMA_PYTHON, help="a Python with llama-cpp-python ($LLAMA_PYTHON)")
    p.add_argument("--json", help="write every round and the summary here")
    p.add_argument("--llama-driver", metavar="GGUF", help=argparse.SUPPRESS)
    p.add_argument("--prompt", help=argparse.SUPPRESS)
    p.add_argument("--no-repack", action="store_true", help=argparse.SUPPRESS)
    args = sys.argv[1:]
    if "--llama-driver" in args:  # llama.cpp's venv has no rkmojo: no engine options to parse
        return llama_driver(p.parse_args(args))

    from inference import options
    from inference.bench.cgroup import children_die_with_us
    from inference.demo import demo_gguf, install
    from inference.engine import EngineConfig

    options.add_flags(p.add_argument_group("rkmojo's engine options"), EngineConfig, exclude=("threads",))
    a = p.parse_args(args)
    try:
        engine = options.from_flags(EngineConfig, a) | {"threads": a.threads}
    except ValueError as e:
        p.error(str(e))
    if a.memory and "memory_budget" not in engine:
        engine["memory_budget"] = options.read_value(EngineConfig, "memory_budget", a.memory, options.CLI)
    a.store = a.store or str(install(progress=False))
    a.gguf = a.gguf or str(demo_gguf())
    prompt = [300 + i % 1000 for i in range(a.prompt_tokens)]  # ids the two sides share
    where = f"both in a {a.memory} memory cgroup" if a.memory else "in RAM"
    print(f"rkmojo {a.store} against llama.cpp {a.gguf}, {where}, {a.threads} threads; rkmojo: {engine}")
    sides = ("rkmojo", "llama.cpp")
    rows = []
    with children_die_with_us():
        for k in range(a.rounds):
            got = {}
            for side in rounds.order(k, sides):
                got[side] = run_rkmojo(a, engine, prompt) if side == "rkmojo" else run_llama(a, prompt)
            rows.append(got)
            cells = "  |  ".join(
                f"{s} decode {got[s]['decode_tok_s']:.2f} tok/s, prefill {got[s]['prefill_tok_s']:.1f} tok/s, "
                f"TTFT {got[s]['ttft_s']:.3f} s"
                + (f", cgroup peak {got[s]['cgroup']['max_usage_bytes'] / 2**30:.2f} GiB" if got[s]["cgroup"] else "")
                for s in rounds.order(k, sides)
            )
            print(f"round {k}: load {os.getloadavg()[0]:.2f}  {cells}", flush=True)
    s = rounds.summary(rows, "llama.cpp", "rkmojo")
    print("\nB = rkmojo, A = llama.cpp")
    rounds.print_summary(s, "llama.cpp", "rkmojo", len(rows))
    if a.memory:
        for side in sides:
            peak = statistics.median(r[side]["cgroup"]["max_usage_bytes"] for r in rows) / 2**30
            ooms = sum(r[side]["cgroup"]["oom_kills"] for r in rows)
            print(f"{side}: cgroup peak {peak:.2f} GiB (median), OOM kills {ooms}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rounds": rows, "summary": s}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
