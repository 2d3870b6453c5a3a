"""The `rkmojo` command line: convert, pull, import, verify, run, list, show, rm, bench, synth, npu (and `up`, registered by
the appliance through the `rkmojo.commands` entry point group).

Errors a user can act on (`RkmojoError`) print as one line and exit 1; nothing else is caught.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from .errors import RkmojoError
from .models_dir import models_dir, resolve_model
from .options import CLI, OptionError


def cmd_convert(a) -> int:
    from .convert import convert

    out = convert(a.src, a.out, a.quant, progress=not a.quiet, repack=not a.no_repack)
    print(out)
    return 0


def cmd_verify(a) -> int:
    from .convert.progress import progress_bar
    from .store import Store

    st = Store(resolve_model(a.store))
    with progress_bar(st.total_bytes(), f"verify {st.path.name}", not a.quiet) as bar:
        st.verify(progress=bar.update)
    print(
        f"{st.path}: ok ({len(st.dense_names())} dense tensors, "
        f"{sum(l.n_experts for l in st.expert_layers.values())} expert blobs, {len(list(st.npu_files()))} NPU files)"
    )
    return 0


def cmd_repack(a) -> int:
    from .convert.progress import progress_bar
    from .store import Store
    from .store.relayout import repack_store

    st = Store(resolve_model(a.store))
    size = sum(l.n_experts * l.blob_size for l in st.expert_layers.values())
    with progress_bar(size, f"repack {st.path.name}", not a.quiet) as bar:
        r = repack_store(st.path, progress=bar.update)
    if not r["layers"]:
        print(f"{st.path}: nothing to repack ({r['already']} layers were repacked before)")
    else:
        print(
            f"{st.path}: {r['experts']} experts in {r['layers']} layers repacked ({r['bytes'] / 1e9:.2f} GB in "
            f"{r['seconds']:.1f} s); they now land ready to compute"
        )
    return 0


def cmd_npu_build(a) -> int:
    from .backends.rknpu.build import build

    section = build(
        resolve_model(a.store),
        target=a.target,
        rows=a.rows,
        precision=a.precision,
        layers=_int_list(a.layers, "--layers", low=0) if a.layers else None,
        keep_onnx=a.keep_onnx,
    )
    graphs = section["graphs"].values()
    kept = {p: sum(g["precision"] == p for g in graphs) for p in ("fp16", "w8a8")}
    print(
        f"npu/{a.target}: {len(section['graphs'])} graphs ({kept['fp16']} fp16, {kept['w8a8']} w8a8), "
        f"{sum(g['size'] for g in graphs) / 1e6:.1f} MB, {section['toolkit']}"
    )
    return 0


def cmd_bench(a) -> int:
    from .bench import BenchOptions, Workload, run_bench
    from .engine import EngineConfig
    from .options import from_flags

    try:
        engine = from_flags(EngineConfig, a)
    except ValueError as e:
        raise RkmojoError(str(e)) from None
    if a.concurrent:
        from .bench.concurrent import main as concurrent

        counts = _int_list(a.concurrent, "--concurrent")
        concurrent(
            resolve_model(a.store),
            counts,
            engine,
            prompt_tokens=a.prompt_tokens,
            decode_tokens=a.decode_tokens,
            rounds=a.runs,
            seed=a.seed,
            json_out=a.json,
        )
        return 0
    w = Workload(
        prompt_tokens=a.prompt_tokens,
        prefill_tokens=tuple(_int_list(a.prefill_tokens, "--prefill-tokens")),
        decode_tokens=a.decode_tokens,
        runs=a.runs,
        feed=a.feed,
        seed=a.seed,
    )
    o = BenchOptions(
        engine=EngineConfig(**engine),
        workload=w,
        sweep=tuple(_int_list(a.sweep, "--sweep")),
        bandwidth_seconds=a.bandwidth_seconds,
        paired_seconds=a.paired_seconds,
        compute_tokens=a.compute_tokens,
        compute_bound=not a.no_compute_bound,
        drop_caches=not a.no_drop_caches,
        cgroup_memory=a.cgroup_memory,
        turns=not a.no_turns,
    )
    run_bench(resolve_model(a.store), o, json_out=a.json, trace_out=a.trace)
    return 0


def _int_list(text: str, flag: str, low: int = 1) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < low:
        what = "positive whole numbers" if low == 1 else f"whole numbers from {low}"
        raise RkmojoError(f"{flag} {text!r}: give {what} separated by commas, like 8,16,24,32")
    return out


def cmd_synth(a) -> int:
    from .synth import synth_store

    print(
        synth_store(
            a.out,
            a.shape,
            layers=a.layers,
            router=a.router,
            skew=a.skew,
            seed=a.seed,
            progress=not a.quiet,
            repack=not a.no_repack,
        )
    )
    return 0


def cmd_run(a) -> int:
    from .chat import run_chat
    from .options import from_flags
    from .sampler import SamplingParams

    from .engine import EngineConfig

    try:
        params = {**from_flags(SamplingParams, a), "stop": a.stop or []}
        options = from_flags(EngineConfig, a)
    except ValueError as e:
        raise RkmojoError(str(e)) from None
    return run_chat(
        resolve_model(a.model),
        prompt=a.prompt,
        params=params,
        system=a.system,
        show_stats=a.stats,
        engine_options=options,
    )


def cmd_pull(a) -> int:
    from .pull import pull

    try:
        out = pull(
            a.source,
            models_dir(),
            name=a.name,
            revision=a.revision,
            endpoint=a.endpoint,
            quant=a.quant,
            file=a.file,
            progress=not a.quiet,
        )
    except KeyboardInterrupt:
        print("rkmojo pull: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(out)
    return 0


def cmd_import(a) -> int:
    from .convert.ollama import SCHEME, import_ollama

    if not a.source.startswith(SCHEME):
        raise RkmojoError(
            f"{a.source!r}: give an Ollama model as ollama:NAME[:TAG]; convert a .gguf file with "
            f"`rkmojo convert FILE.gguf {models_dir()}/NAME`"
        )
    out = import_ollama(
        a.source[len(SCHEME) :], models_dir(), ollama_dir=a.ollama_dir, local_name=a.name, progress=not a.quiet
    )
    print(out)
    return 0


def cmd_list(a) -> int:
    from .models_dir import fmt_bytes, fmt_count, list_models

    models, partial = list_models()
    if not models and not partial:
        print(
            f"no models in {models_dir()}; install one with `rkmojo pull` (or `python -m inference.demo install`)",
            file=sys.stderr,
        )
        return 0
    rows = [("NAME", "ARCH", "PARAMS", "ACTIVE", "SIZE", "QUANT")]
    rows += [
        (m.name, m.architecture, fmt_count(m.params), fmt_count(m.active_params), fmt_bytes(m.disk_bytes), m.quant)
        for m in models
    ]
    for pp in partial:
        done = fmt_bytes(pp["done"]) + (f" of {fmt_bytes(pp['total'])}" if pp.get("total") else "")
        rows.append((pp["name"], "(partial)", "", "", done, f"from {pp['source']}; `rkmojo pull` it again to resume"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_show(a) -> int:
    from .convert.progress import progress_bar
    from .models_dir import describe, fmt_bytes, fmt_count, quick_check
    from .store import Store

    path = resolve_model(a.model)
    m = describe(path)
    lines = [
        ("name", m.name),
        ("path", str(m.path)),
        ("architecture", m.architecture),
        ("parameters", f"{fmt_count(m.params)} ({fmt_count(m.active_params)} active per token)"),
        ("layers", f"{m.layers}, hidden {m.hidden}, vocabulary {m.vocab}"),
        ("context", str(m.context)),
    ]
    if m.experts:
        e = m.experts
        lines.append(
            (
                "experts",
                f"{e['per_layer']} per layer in {e['layers']} layers, top-{e['top_k']}, "
                f"{fmt_bytes(e['blob_bytes'])} each",
            )
        )
    lines += [
        ("quantization", ", ".join(f"{k} {v}" for k, v in m.quantization.items())),
        ("size on disk", fmt_bytes(m.disk_bytes)),
        ("chat template", "the model's own" if m.has_template else "none (the documented fallback)"),
        (
            "source",
            ", ".join(
                f"{k} {v}"
                for k, v in m.source.items()
                if k in ("type", "repo", "revision", "url", "path", "name", "file_type")
            ),
        ),
    ]
    gen = {
        k: v for k, v in m.generation.items() if k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
    }
    if gen:
        lines.append(("defaults", ", ".join(f"{k} {v}" for k, v in gen.items())))
    problem = quick_check(path)
    if problem:
        status = f"INCOMPLETE: {problem}"
    elif a.verify:
        st = Store(path)
        with progress_bar(st.total_bytes(), f"verify {m.name}", True) as bar:
            st.verify(progress=bar.update)
        status = "ok (every tensor and expert digest verified)"
    else:
        status = "files complete; digests not checked (add --verify)"
    lines.append(("digests", status))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(width)}  {v}")
    return 0 if not problem else 1


def cmd_rm(a) -> int:
    from .models_dir import remove

    for name in a.models:
        print(f"removed {remove(name)}")
    return 0


def cmd_npu_calibrate(a) -> int:
    from .backends import DEFAULT_LIBRARY
    from .backends.rknpu import calibrate, calibration

    shapes = None
    if a.model:
        from .store import Store

        shapes = calibrate.model_shapes(Store(resolve_model(a.model)))
    cal = calibrate.run_calibration(
        a.library or DEFAULT_LIBRARY,
        precision=a.precision,
        shapes=shapes,
        rows=_int_list(a.rows, "--rows"),
        repeats=a.repeats,
        chunk=a.chunk,
    )
    print(f"librknnrt {cal.runtime} ({cal.library}), driver {cal.driver}, {cal.precision}, chunk {cal.chunk}")
    print(calibrate.table(cal))
    print(f"written to {calibration.calibration_path()}")
    return 0


NO_REPACK_HELP = (
    "store q4 experts in the plain q4 layout (default: the kernels' repacked layout, q4r, which streamed "
    "experts need no work to use; `rkmojo repack` rewrites a plain store later)"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rkmojo", description="Run MoE LLMs larger than RAM on small boards.")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("convert", help="convert a Hugging Face checkpoint directory or a GGUF file into a store")
    c.add_argument("src", help="checkpoint directory (config.json + *.safetensors) or a .gguf file")
    c.add_argument("out", help="store directory to create (must not exist)")
    c.add_argument(
        "--quant",
        choices=["f16", "q8", "q4"],
        default="q4",
        help="weight format for safetensors input (GGUF keeps its own types); default q4",
    )
    c.add_argument("--no-repack", action="store_true", help=NO_REPACK_HELP)
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    c.set_defaults(fn=cmd_convert)

    v = sub.add_parser("verify", help="check every tensor and expert blob of a store against its digest")
    v.add_argument("store")
    v.add_argument("-q", "--quiet", action="store_true")
    v.set_defaults(fn=cmd_verify)

    rp = sub.add_parser(
        "repack",
        help="rewrite a store's q4 experts in the kernels' repacked layout, so streamed experts land ready "
        "to compute (layer by layer; an interrupted run is finished by running it again)",
    )
    rp.add_argument("store", help="a model name in the models directory, or a store path")
    rp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    rp.set_defaults(fn=cmd_repack)

    r = sub.add_parser("run", help="chat with a model in the terminal, or answer one prompt with -p")
    r.add_argument("model", help="a model name in the models directory, or a store path")
    r.add_argument("-p", "--prompt", help="answer this prompt and exit (only the answer on stdout; '-' reads stdin)")
    r.add_argument("--system", help="a system prompt")
    r.add_argument("--stats", action="store_true", help="with -p: the stats line on stderr")
    g = r.add_argument_group(
        "sampling (unset: the model's generation config, else temperature 0.2, top-k 64, top-p 0.95)"
    )
    from .engine import EngineConfig
    from .options import add_flags
    from .sampler import SamplingParams

    add_flags(g, SamplingParams, exclude=("logprobs",))
    g.add_argument("--stop", action="append", help="a stop string (repeatable)")
    add_flags(r.add_argument_group("engine"), EngineConfig, exclude=("chunk",))
    r.set_defaults(fn=cmd_run)

    u = sub.add_parser("pull", help="install a model from a Hugging Face-style repository or a GGUF URL (resumable)")
    u.add_argument(
        "source",
        help="a repository id (owner/name), hf.co/OWNER/REPO[:QUANT] for one of its GGUF files (default Q4_K_M), "
        "or the https URL of a .gguf file",
    )
    u.add_argument("--file", help="the GGUF file of the repository to pull (a path in it), instead of converting it")
    u.add_argument("--name", help="name in the models directory (default: from the repository or file name)")
    u.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    u.add_argument("--endpoint", default=None, help="base URL (default $HF_ENDPOINT, else https://huggingface.co)")
    u.add_argument("--quant", choices=["f16", "q8", "q4"], default="q4", help="weight format; default q4")
    u.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    u.set_defaults(fn=cmd_pull)

    im = sub.add_parser(
        "import",
        help="install a model from a local Ollama store (read only; its GGUF blob is converted where it lies)",
        description="Convert a model Ollama has pulled into the models directory, as `rkmojo convert` converts its "
        "GGUF. Ollama's directory is only read; the blob's sha256 is checked against Ollama's manifest. The "
        "params layer's temperature, top_k, top_p, min_p and repeat_penalty become the model's sampling "
        "defaults; its stop strings and runner options are skipped. Ollama's template layer (a Go template) is "
        "ignored: the GGUF's own chat template is kept. Adapter (LoRA) and projector (vision) layers are refused.",
    )
    im.add_argument(
        "source",
        metavar="ollama:NAME[:TAG]",
        help="the model as `ollama list` shows it (TAG defaults to latest), e.g. ollama:qwen3:30b-a3b, "
        "ollama:USER/NAME:TAG, ollama:hf.co/OWNER/REPO:TAG",
    )
    im.add_argument(
        "--ollama-dir",
        help="Ollama's models directory, the folder holding manifests/ and blobs/ (default: the first that exists "
        "of $OLLAMA_MODELS, ~/.ollama/models, /usr/share/ollama/.ollama/models)",
    )
    im.add_argument("--name", help="name in the models directory (default: NAME-TAG, or NAME for latest; lowercase)")
    im.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    im.set_defaults(fn=cmd_import)

    ls = sub.add_parser("list", help="the models in the models directory")
    ls.set_defaults(fn=cmd_list)

    sh = sub.add_parser("show", help="a model's architecture, sizes, quantization and digest status")
    sh.add_argument("model", help="a model name or a store path")
    sh.add_argument("--verify", action="store_true", help="check every digest (reads the whole store)")
    sh.set_defaults(fn=cmd_show)

    rm = sub.add_parser("rm", help="delete models (or an interrupted pull) from the models directory")
    rm.add_argument("models", nargs="+", help="model names or store paths")
    rm.set_defaults(fn=cmd_rm)

    from .synth import DEFAULT_SKEW, ROUTERS, SHAPES

    y = sub.add_parser("synth", help="write a store with a real model's shapes and random weights (benchmarks, tests)")
    y.add_argument("out", help="store directory to create (must not exist)")
    y.add_argument("--shape", required=True, choices=list(SHAPES), help="whose shapes to copy")
    y.add_argument("--layers", type=int, default=None, help="override the layer count (smaller variants)")
    y.add_argument(
        "--router",
        choices=ROUTERS,
        default="uniform",
        help="uniform: every expert equally likely (a cache's worst case); skewed: power-law expert popularity",
    )
    y.add_argument(
        "--skew",
        type=float,
        default=DEFAULT_SKEW,
        help=f"power-law exponent of the skewed router (default {DEFAULT_SKEW})",
    )
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--no-repack", action="store_true", help=NO_REPACK_HELP)
    y.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    y.set_defaults(fn=cmd_synth)

    b = sub.add_parser("bench", help="measure decode and prefill speed of a store against its IO and compute bounds")
    b.add_argument("store")
    add_flags(
        b.add_argument_group("engine"),
        EngineConfig,
        exclude=("context", "backend", "npu_library", "npu_precision", "npu_expert_rows"),
    )
    b.add_argument("--prompt-tokens", type=int, default=128, help="prompt before each decode run (default 128)")
    b.add_argument("--prefill-tokens", default="128,1024", help="prompt lengths timed for prefill and TTFT")
    b.add_argument("--decode-tokens", type=int, default=256)
    b.add_argument("--runs", type=int, default=3, help="decode runs; the median is reported")
    b.add_argument(
        "--feed",
        choices=["random", "greedy"],
        default="random",
        help="decode by a fixed random id sequence (default) or by argmax",
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--sweep", default="8,16,24,32", help="cache sizes the routing trace is replayed at")
    b.add_argument("--bandwidth-seconds", type=float, default=10.0, help="how long to measure read bandwidth")
    b.add_argument(
        "--paired-seconds",
        type=float,
        default=2.0,
        help="measure the disk this long after each timed run, the bound paired with that run (0: off)",
    )
    b.add_argument("--compute-tokens", type=int, default=64, help="decode tokens of the compute-only run")
    b.add_argument("--no-compute-bound", action="store_true", help="skip the all-resident compute-only run")
    b.add_argument("--no-drop-caches", action="store_true", help="do not drop the page cache before the read test")
    b.add_argument(
        "--cgroup-memory",
        default=None,
        help="run the streaming part inside a cgroup-v1 memory limit of this size, e.g. 4G (root)",
    )
    b.add_argument(
        "--no-turns",
        action="store_true",
        help="time the streamed and the all-resident prompts one child after the other only, not also in turns "
        "with both children loaded at once (which needs RAM for the store and the streaming limit together)",
    )
    b.add_argument(
        "--concurrent",
        help="instead: aggregate decode tok/s of N conversations stepped together, for each N of a list such "
        "as 1,2,4, in alternating rounds (--runs rounds; --prompt-tokens, --decode-tokens per sequence)",
    )
    b.add_argument("--json", help="also write the results to this JSON file")
    b.add_argument(
        "--trace",
        help="also write the routing trace (phase, layer, experts, misses, misses the lookahead read, experts dropped to lend their slots) to this JSON file",
    )
    b.set_defaults(fn=cmd_bench)

    n = sub.add_parser("npu", help="the RK3588 NPU: graphs for the dense prefill block, calibration (docs/npu.md)")
    nsub = n.add_subparsers(dest="npu_cmd", required=True)
    nc = nsub.add_parser(
        "calibrate",
        help="time the CPU against the NPU per matmul shape and row count; `--backend auto|rknpu` follow it",
    )
    nc.add_argument("--library", help="librknnrt.so to load (default /usr/lib/librknnrt.so)")
    nc.add_argument("--model", help="time this model's shapes (a name or store path); default: Gemma 4 26B-A4B's")
    nc.add_argument("--precision", choices=["fp16", "int8"], default="fp16", help="NPU matmul precision")
    nc.add_argument("--rows", default="1,8,16,32,64,128", help="row counts timed (default 1,8,16,32,64,128)")
    nc.add_argument("--repeats", type=int, default=3, help="rounds; the median is kept (default 3)")
    nc.add_argument("--chunk", type=int, default=128, help="the prefill chunk: M of the dense contexts")
    nc.set_defaults(fn=cmd_npu_calibrate)
    nb = nsub.add_parser("build", help="compile each layer's dense block to .rknn graphs in the store's npu/ part")
    nb.add_argument("store", help="a model name in the models directory, or a store path")
    nb.add_argument("--target", default="rk3588", help="the SoC (rk3588)")
    nb.add_argument("--rows", type=int, default=128, help="the prefill chunk the graphs are compiled for (128)")
    nb.add_argument(
        "--precision",
        choices=["auto", "fp16", "w8a8"],
        default="auto",
        help="auto: w8a8 where its measured error is within bound, else fp16",
    )
    nb.add_argument("--layers", help="only these layers, e.g. 0,1,2 (the others stay on the CPU)")
    nb.add_argument("--keep-onnx", action="store_true", help="keep each graph's ONNX beside it (for tests)")
    nb.set_defaults(fn=cmd_npu_build)

    # commands other packages register (`rkmojo up` from the appliance): found by name, never imported here
    for ep in entry_points(group="rkmojo.commands"):
        ep.load()(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except OptionError as e:  # the engine names the option; a user of the CLI gave it as a flag
        print(f"rkmojo: error: {CLI.error(e)}", file=sys.stderr)
        return 1
    except RkmojoError as e:
        print(f"rkmojo: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
