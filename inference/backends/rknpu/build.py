"""`rkmojo npu build`: a store's dense-block graphs compiled for rk3588 into `npu/rk3588/` of the store.

Per layer, each graph kind the architecture's layer code can hand to a graph (`graphs.py`; Llama-style
layers: `qkv` and `o_mlp`; Qwen3-MoE and OLMoE: `qkv` and `o`, the o projection with its residual add;
Gemma 4: `qkv`, without v on its K = V layers, `o_norm`, the o projection with its post-attention norm
and residual add, and `mlp`, its dense MLP). Calibration activations are
the CPU engine's own, captured at the graph's inputs while it reads texts that Python ships (the Zen of Python, the `pydoc_data` topics), cut into
chunks of exactly `rows` tokens (a graph has one static shape). The last chunks are held out: the
toolkit process (`export.py`, in .venv-rknn) compiles, simulates them, and compares with the CPU's
outputs. `auto` builds fp16 while w8a8 fails the quality gate (`quality.auto_precisions`: its perplexity
rise over the CPU's, on the whole model); were it to pass, `auto` would keep w8a8 for a graph only when
its error is within `W8A8_MAX_ERROR`, else fp16.

Manifest section `npu.<target>` (docs/store-format.md): target, rows, toolkit version, the w8a8 bound,
and per graph its file, kind, layer, precision, inputs and outputs with shapes, size, sha256, and the
measured error of each precision tried. Atomic: the graphs are built in a temp directory beside `npu/`,
renamed into place, then the manifest is rewritten by temp name and rename; a failure leaves the store
as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ...errors import RkmojoError
from ...store import Store
from ...store.format import sha256_file
from ...store.writer import write_atomic
from .graphs import INPUTS, RESIDUAL, output_names
from .quality import auto_precisions

TARGETS = ("rk3588",)
PRECISIONS = ("auto", "fp16", "w8a8")
TOOLKIT_PYTHON = Path(__file__).resolve().parents[3] / ".venv-rknn" / "bin" / "python"
EXPORT = Path(__file__).with_name("export.py")
# w8a8 is kept only within this relative L2 error on held-out chunks. SmolLM2's smallest measured w8a8
# error is 2.3e-2 (a qkv graph; docs/npu.md) and the int8 matmul path, of that error class, raised its
# perplexity 11.8 % (fp16, at ~3e-4, 0.00 %): 1e-2 keeps w8a8 only where it is a few times better than that.
W8A8_MAX_ERROR = 1e-2
CALIBRATION_CHUNKS, HELD_OUT_CHUNKS = 4, 2
# the graph kinds whose layer code has the hooks (models/llama.py: qkv, o_mlp; models/qwen3_moe.py: qkv, o;
# models/gemma4.py: qkv, o_norm, mlp)
KINDS = {
    "llama": ("qkv", "o_mlp"),
    "qwen3_moe": ("qkv", "o"),
    "olmoe": ("qkv", "o"),
    "gemma4": ("qkv", "o_norm", "mlp"),
}
ACTS = ("silu", "gelu_pytorch_tanh", "gelu_tanh")


class BuildError(RkmojoError):
    pass


def texts() -> list[str]:
    """Real English that Python ships: the Zen of Python and the help topics of `pydoc_data`."""
    import codecs
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        import this
    from pydoc_data.topics import topics

    return [codecs.decode(this.s, "rot13"), *(topics[k] for k in sorted(topics))]


def capture(store: Store, model, rows: int, chunks: int, kinds: tuple) -> dict[int, list[dict]]:
    """Per layer, `chunks` captures {x, q, k[, v][, o, h, out][, mlp_x, mlp_out]} of the CPU's layer code
    (o, h, out: the `o`, `o_norm` or `o_mlp` block's), each `rows` rows (`model` built with chunk=rows; its layer
    code is spied on, then restored)."""
    from ...tokenizer import StoreTokenizer

    tok = StoreTokenizer(store)
    seen: dict[int, list[dict]] = {i: [] for i in range(len(model.layers))}
    qkv = model.qkv

    def spy_qkv(i, x):
        out = qkv(i, x)
        seen[i].append({"x": x, **dict(zip("qkv", out))})
        return out

    model.qkv = spy_qkv
    for name in [k for k in RESIDUAL if k in kinds]:  # (o, h) → out
        block = getattr(model, name)

        def spy_o(i, o, h, block=block):
            out = block(i, o, h)
            seen[i][-1].update(o=o, h=h, out=out)
            return out

        setattr(model, name, spy_o)
    if "mlp" in kinds:
        mlp = model.mlp

        def spy_mlp(i, x):
            out = mlp(i, x)
            seen[i][-1].update(mlp_x=x, mlp_out=out)
            return out

        model.mlp = spy_mlp
    ids = [t for text in texts() for t in tok.encode(text)]
    vocab = model.args.vocab_size
    if max(ids) >= vocab:
        raise BuildError(f"{store.path}: the tokenizer gives id {max(ids)}, the model's vocabulary has {vocab}")
    if len(ids) < rows * chunks:
        raise BuildError(f"--rows {rows}: the calibration texts give {len(ids)} tokens, fewer than {chunks} chunks")
    try:
        model.forward(np.asarray(ids[: rows * chunks], np.int64), model.new_cache())
    finally:
        for name in ("qkv", *RESIDUAL, "mlp"):
            model.__dict__.pop(name, None)
    return seen


def plan_layer(model_args, layer: dict, i: int, got: list[dict], kinds: tuple, act: str) -> list[tuple]:
    """(name, kind, job dict) per graph of layer i; weights dequantized to float32."""
    jobs = []
    cal, held = got[:CALIBRATION_CHUNKS], got[CALIBRATION_CHUNKS:]
    stack = lambda part, key: np.stack([c[key] for c in part])  # noqa: E731
    for kind in kinds:
        if kind == "qkv":  # a K = V layer (Gemma 4's full attention) has no v: its graph has no v output
            job = {"w" + n: layer[n].dense() for n in "qkv" if layer[n] is not None}
            ins, outs = {"x": "x"}, {n: n for n in "qkv" if layer[n] is not None}
        elif kind == "o":
            job = {"wo": layer["o"].dense()}
            ins, outs = {"o": "o", "h": "h"}, {"out": "out"}
        elif kind == "o_norm":  # Gemma 4: h + rms_norm(o·Woᵀ) · post_attn_norm
            job = {"wo": layer["o"].dense(), "norm": layer["post_attn_norm"], "eps": model_args.rms_norm_eps}
            ins, outs = {"o": "o", "h": "h"}, {"out": "out"}
        elif kind == "mlp":
            job = {n: layer["mlp"][n].dense() for n in ("gate", "up", "down")}
            job["act"] = act
            ins, outs = {"x": "mlp_x"}, {"out": "mlp_out"}
        else:
            job = {
                "wo": layer["o"].dense(),
                "norm": layer["mlp_norm"],
                **{n: layer["mlp"][n].dense() for n in ("gate", "up", "down")},
                "eps": model_args.rms_norm_eps,
                "act": act,
            }
            ins, outs = {"o": "o", "h": "h"}, {"out": "out"}
        for n, key in ins.items():
            job["in_" + n], job["held_" + n] = stack(cal, key), stack(held, key)
        for n, key in outs.items():
            job["want_" + n] = stack(held, key)
        job["kind"] = kind
        jobs.append((f"layer_{i:02d}.{kind}", kind, job))
    return jobs


def build(
    store_path: str | os.PathLike,
    *,
    target: str = "rk3588",
    rows: int = 128,
    precision: str = "auto",
    layers: list[int] | None = None,
    keep_onnx: bool = False,
    toolkit_python: str | os.PathLike | None = None,
    log=print,
) -> dict:
    """Build the graphs of `store_path` into `npu/<target>/` and its manifest section.

    Args:
        target: the SoC (rk3588 only).
        rows: the prefill chunk each graph is compiled for (the engine's `chunk`).
        precision: auto (fp16; w8a8 where within W8A8_MAX_ERROR while w8a8 passes the quality gate),
            fp16 or w8a8.
        layers: only these layers (default all); the others stay on the CPU.
        keep_onnx: keep each graph's ONNX beside it (the tests' rknnlite stand-in evaluates it).
        toolkit_python: the rknn-toolkit2 venv's python (default .venv-rknn/bin/python).
    Returns:
        The manifest section written.
    Raises:
        BuildError: a bad option, an architecture without graphs, no toolkit, or a failed toolkit run.
    """
    if target not in TARGETS:
        raise BuildError(f"--target {target!r}: choose one of {', '.join(TARGETS)}")
    if precision not in PRECISIONS:
        raise BuildError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if rows < 1:
        raise BuildError(f"--rows {rows}: give a positive number of rows (the engine's chunk, e.g. 128)")
    python = Path(toolkit_python or TOOLKIT_PYTHON)
    if not python.exists():
        raise BuildError(f"{python}: rknn-toolkit2's venv is missing; make it with `scripts/setup --npu-build`")
    store = Store(store_path)
    kinds = KINDS.get(store.architecture)
    if kinds is None:
        raise BuildError(
            f"{store.path}: architecture {store.architecture!r} has no NPU graphs yet (only {', '.join(KINDS)}); "
            "its layers stay on the CPU"
        )
    act = store.config.get("hidden_activation", store.config.get("hidden_act", "silu"))  # Gemma's name, Llama's
    if act not in ACTS:
        raise BuildError(f"{store.path}: activation {act!r} has no NPU graph yet; its layers stay on the CPU")
    n_layers = int(store.config["num_hidden_layers"])
    layers = sorted(set(range(n_layers) if layers is None else layers))
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise BuildError(f"--layers {bad}: the model has layers 0–{n_layers - 1}")
    from ...model import load_model

    model = load_model(store, chunk=rows)
    seen = capture(store, model, rows, CALIBRATION_CHUNKS + HELD_OUT_CHUNKS, kinds)
    # auto tries w8a8 only while it passes the quality gate (a whole-model perplexity rise of at most 2 %)
    auto = ["w8a8", "fp16"] if "w8a8" in auto_precisions("graphs") else ["fp16"]
    order = {"auto": auto, "fp16": ["fp16"], "w8a8": ["w8a8"]}[precision]
    store_dir = store.path
    # the jobs hold float32 weights (SmolLM2: 0.4 GB): on the store's disk, not /tmp
    with tempfile.TemporaryDirectory(prefix=".npu-jobs-", dir=store_dir) as jobs_dir:
        plan = {"w8a8_max_error": W8A8_MAX_ERROR, "graphs": []}
        specs = {}
        for i in layers:
            for name, kind, job in plan_layer(model.args, model.layers[i], i, seen[i], kinds, act):
                np.savez(os.path.join(jobs_dir, name + ".npz"), **job)
                plan["graphs"].append({"name": name, "kind": kind, "precisions": order, "job": name + ".npz"})
                specs[name] = (kind, i, job)
        del seen
        Path(jobs_dir, "plan.json").write_text(json.dumps(plan))
        out = Path(tempfile.mkdtemp(prefix=".npu-build-", dir=store_dir))
        try:
            log(
                f"npu build: {len(specs)} graphs ({', '.join(kinds)} of {len(layers)} layers), {rows} rows, {precision}"
            )
            with tempfile.TemporaryFile("w+") as err:
                # stream the per-graph lines as they come: a whole model takes minutes
                with subprocess.Popen(
                    [str(python), str(EXPORT), jobs_dir, str(out)], stdout=subprocess.PIPE, stderr=err, text=True
                ) as p:
                    for line in p.stdout:  # the toolkit talks on stdout too: only export.py's lines
                        if line.startswith("rkmojo: "):
                            log("  " + line.removeprefix("rkmojo: ").rstrip())
                if p.returncode != 0:
                    err.seek(0)
                    tail = "\n".join(err.read().strip().splitlines()[-5:])
                    raise BuildError(f"rknn-toolkit2 failed (exit {p.returncode}); the store is unchanged:\n{tail}")
            result = json.loads((out / "result.json").read_text())
            (out / "result.json").unlink()
            section = _section(out, target, rows, result, specs, keep_onnx)
            _install(store_dir, out, target, section)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return section


def _section(out: Path, target: str, rows: int, result: dict, specs: dict, keep_onnx: bool) -> dict:
    graphs = {}
    for name, (kind, layer, job) in specs.items():
        got = result["graphs"][name]
        if not keep_onnx:
            (out / f"{name}.onnx").unlink()
        files = [f"{name}.rknn"] + ([f"{name}.onnx"] if keep_onnx else [])
        graphs[name] = {
            "kind": kind,
            "layer": layer,
            "file": files[0],
            "precision": got["precision"],
            "inputs": {n: [rows, job["in_" + n].shape[-1]] for n in INPUTS[kind]},
            "outputs": {n: [rows, job["want_" + n].shape[-1]] for n in output_names(kind, job)},
            "digests": {f: sha256_file(out / f) for f in files},
            "size": (out / files[0]).stat().st_size,
            "error": got["error"],
            "tried": got["tried"],
        }
    return {
        "target": target,
        "rows": rows,
        "toolkit": f"rknn-toolkit2 {result['toolkit']}",
        "w8a8_max_error": W8A8_MAX_ERROR,
        "digest": "sha256",
        "graphs": graphs,
    }


def _install(store_dir: Path, out: Path, target: str, section: dict) -> None:
    """Rename the built directory into npu/<target>, then rewrite the manifest (temp + rename); put the
    old graphs back when the manifest cannot be written."""
    final = store_dir / "npu" / target
    old = None
    created_npu = not final.parent.exists()
    final.parent.mkdir(exist_ok=True)
    if final.exists():
        old = final.with_name(f".{target}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(out, final)
    mpath = store_dir / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text())
        manifest.setdefault("npu", {})[target] = section
        write_atomic(mpath, json.dumps(manifest, indent=1).encode())
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        if old is not None:
            os.rename(old, final)
        elif created_npu:
            shutil.rmtree(final.parent, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
