"""The `rkmojo` command line: convert, verify, run, bench.

Errors a user can act on (`RkmojoError`) print as one line and exit 1; nothing else is caught.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import RkmojoError


def models_dir() -> Path:
    """Where named models live: $RKMOJO_HOME/models, default ~/.local/share/rkmojo/models."""
    home = os.environ.get("RKMOJO_HOME")
    base = Path(home) if home else Path.home() / ".local" / "share" / "rkmojo"
    return base / "models"


def resolve_model(name: str) -> Path:
    """A store path from a name in the models directory or a path.

    Raises:
        RkmojoError: neither exists.
    """
    p = Path(name)
    if (p / "manifest.json").is_file():
        return p
    q = models_dir() / name
    if (q / "manifest.json").is_file():
        return q
    raise RkmojoError(f"model {name!r} not found as a path or in {models_dir()}; install it with `rkmojo convert`")


def cmd_convert(a) -> int:
    from .convert import convert

    out = convert(a.src, a.out, a.quant, progress=not a.quiet)
    print(out)
    return 0


def cmd_verify(a) -> int:
    from .convert.progress import progress_bar
    from .store import Store

    st = Store(resolve_model(a.store))
    with progress_bar(st.total_bytes(), f"verify {st.path.name}", not a.quiet) as bar:
        st.verify(progress=bar.update)
    print(f"{st.path}: ok ({len(st.dense_names())} dense tensors, "
          f"{sum(l.n_experts for l in st.expert_layers.values())} expert blobs)")
    return 0


def cmd_bench(a) -> int:
    from .bench import run_bench

    run_bench(resolve_model(a.store), threads=a.threads, prompt_tokens=a.prompt_tokens,
              decode_tokens=a.decode_tokens, runs=a.runs, json_out=a.json)
    return 0


def cmd_run(a) -> int:
    from .chat import run_chat

    return run_chat(resolve_model(a.model), prompt=a.prompt, max_tokens=a.max_tokens,
                    temperature=a.temperature, seed=a.seed, threads=a.threads)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rkmojo", description="Run MoE LLMs larger than RAM on small boards.")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("convert", help="convert a Hugging Face checkpoint directory or a GGUF file into a store")
    c.add_argument("src", help="checkpoint directory (config.json + *.safetensors) or a .gguf file")
    c.add_argument("out", help="store directory to create (must not exist)")
    c.add_argument("--quant", choices=["f16", "q8", "q4"], default="q4",
                   help="weight format for safetensors input (GGUF keeps its own types); default q4")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    c.set_defaults(fn=cmd_convert)

    v = sub.add_parser("verify", help="check every tensor and expert blob of a store against its digest")
    v.add_argument("store")
    v.add_argument("-q", "--quiet", action="store_true")
    v.set_defaults(fn=cmd_verify)

    r = sub.add_parser("run", help="chat with a model in the terminal, or answer one prompt with -p")
    r.add_argument("model", help="a model name in the models directory, or a store path")
    r.add_argument("-p", "--prompt", help="answer this prompt and exit (only the answer on stdout)")
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--threads", type=int, default=None)
    r.set_defaults(fn=cmd_run)

    b = sub.add_parser("bench", help="measure prefill and decode speed of a store")
    b.add_argument("store")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--decode-tokens", type=int, default=128)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--json", help="also write the results to this JSON file")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except RkmojoError as e:
        print(f"rkmojo: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
