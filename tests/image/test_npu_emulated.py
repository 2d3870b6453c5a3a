"""The whole engine with the NPU backend on the board's own software, emulated: the image's arm64 root
filesystem (stage 30: bookworm, the appliance's venv, the wheel's NEON kernels) run under qemu-aarch64.

Both NPU paths, each against a stand-in for the part only a board has:
- matmuls: the librknnrt stand-in (tests/rknnrt_standin.c, cross-compiled) at /usr/lib/librknnrt.so.
  `backend="auto"` on aarch64 finds the library, runs its self-test and puts prefill's dense matmuls on
  it;
- graphs: `.rknn` files compiled on this machine by Rockchip's rknn-toolkit2 (`npu build --keep-onnx`),
  copied into the root with their stores, and run through the RKNNLite stand-in (tests/rknnlite_standin)
  on the emulated Python, with onnx and its dependencies installed there from PyPI's aarch64 wheels.
  The stand-in evaluates the ONNX each graph was compiled from, rounded to the graph's precision: it is
  not the NPU, and nothing here executes a `.rknn` file. What it proves is the board's side of the
  path: the engine finds the graphs in the store, `rknpu` and `auto` choose them after their
  self-test, and the layer code hands its chunks to them under the board's Python and kernels.

Greedy tokens must equal the CPU's in fp16, on SmolLM2 and on a tiny MoE; int8 matmuls and w8a8 graphs
report their agreement. The stand-ins compute on the CPU, so nothing here says how fast the NPU is
(docs/npu.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from imagetest import CACHE, build, read_env

HERE = Path(__file__).parent
STANDIN = HERE.parent / "rknnrt_standin.c"
RKNNLITE_STANDIN = HERE.parent / "rknnlite_standin"
RKNN_PY = HERE.parents[1] / ".venv-rknn" / "bin" / "python"
GRAPH_ROWS = 32  # npu_emulated_run.py's GRAPH_ROWS
DENSE_LAYERS = [0, 1, 2, 29]  # the first layers and the last: SmolLM2's others stay on the CPU
GLIBC_MINOR = 36  # bookworm's glibc 2.36: the wheels its loader takes (as image stage 20)


def unpack(tar: str, root: Path) -> None:
    root.mkdir()
    subprocess.run(["tar", "-xpf", tar, "-C", str(root), "--numeric-owner"], check=True)


def in_root(root: Path, *argv: str) -> subprocess.CompletedProcess:
    """argv in the arm64 root (binfmt runs it under qemu-aarch64), with its own /proc, in a private
    mount namespace so that nothing stays mounted after it. Leading NAME=VALUE words set its environment."""
    script = f'mount -t proc proc "{root}/proc" && exec chroot "{root}" /usr/bin/env -i LANG=C.UTF-8 "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=3600,
    )


def run_json(root: Path, *argv: str) -> dict:
    r = in_root(root, *argv)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def board_root(tmp_path_factory) -> Path:
    """Stage 30's arm64 root filesystem, unpacked, with the librknnrt stand-in at the runtime's place on
    a board (the npu role puts the vendor's file there) and this directory's run script in /tmp/npu."""
    cc = shutil.which("aarch64-linux-gnu-gcc")
    if cc is None:
        pytest.skip("no aarch64 cross compiler: run scripts/setup --test")
    out = build("qemu-arm64")
    root = tmp_path_factory.mktemp("board") / "root"
    unpack(read_env(out / "rkmojo-qemu-arm64.build.env")["STAGE_30_PROVISION"], root)
    subprocess.run(
        [cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-march=armv8-a", str(STANDIN), "-o"]
        + [str(root / "usr/lib/librknnrt.so")],
        check=True,
    )
    (root / "tmp/npu").mkdir()
    shutil.copy(HERE / "npu_emulated_run.py", root / "tmp/npu/run.py")
    return root


@pytest.mark.slow
def test_the_board_software_under_emulation_uses_the_npu_and_answers_as_the_cpu(board_root, smollm2_store, moe_store):
    work = board_root / "tmp/npu"
    shutil.copytree(smollm2_store, work / "dense")
    shutil.copytree(moe_store, work / "moe")

    # generated tokens in float (`experts`: int8 in the routed experts only), as the MoE decode was before its
    # compiled step: in the default `decode` mode the step's int8 q/k/v/o round the NPU's fp16 prefill
    # differences into other int8 steps, and the tiny random MoE's greedy tokens (small top-1 margins) part
    # at the 5th; this test is about the NPU's prefill (the decode step is tested under qemu by test_moe_decode)
    got = run_json(
        board_root,
        "RKMOJO_ACTIVATIONS=experts",
        "/opt/rkmojo/bin/python",
        "/tmp/npu/run.py",
        "matmuls",
        "/tmp/npu/dense",
        "/tmp/npu/moe",
    )
    assert got["machine"] == "aarch64"
    for model in ("dense", "moe"):
        runs = got[model]
        assert runs["cpu"]["backend"] == "cpu"
        # auto on aarch64 with the library present: the self-test passed and the NPU took prefill
        assert runs["auto"]["backend"] == "rknpu", runs["auto"]["reason"]
        assert runs["auto"]["reason"].startswith("matmuls: self-test passed")
        assert runs["auto"]["tokens"] == runs["cpu"]["tokens"], model
        assert runs["rknpu-int8"]["backend"] == "rknpu"
        print(f"{model} (matmuls): fp16 tokens = the CPU's; int8 {agreement(runs['rknpu-int8'], runs['cpu'])}")


def agreement(run: dict, cpu: dict) -> str:
    rows = sum(a == b for a, b in zip(run["top1"], cpu["top1"]))
    same = sum(a == b for a, b in zip(run["tokens"], cpu["tokens"]))
    return f"top-1 {rows}/{len(cpu['top1'])} prompt rows and {same}/{len(cpu['tokens'])} greedy tokens the CPU's"


def graph_store(source: Path, out: Path, precision: str, layers: list[int] | None = None) -> Path:
    """A copy of `source` with `npu build --keep-onnx` graphs for GRAPH_ROWS-row chunks (rknn-toolkit2 in
    .venv-rknn compiles them; the stand-in evaluates the ONNX kept beside them)."""
    from inference.backends.rknpu.build import build as npu_build

    shutil.copytree(source, out)
    npu_build(out, rows=GRAPH_ROWS, layers=layers, precision=precision, keep_onnx=True, log=lambda line: None)
    return out


@pytest.fixture(scope="module")
def graph_stores(smollm2_store, tmp_path_factory) -> Path:
    """dense-fp16, dense-w8a8, moe-fp16, moe-w8a8: SmolLM2 (its first three layers and its last) and a
    tiny random Qwen3-MoE with SmolLM2's vocabulary (its tokenizer reads the build's calibration texts),
    each with its graphs."""
    if not RKNN_PY.exists():
        pytest.skip("no .venv-rknn (rknn-toolkit2 compiles the graphs): run scripts/setup --test")
    from inference.convert import convert
    from tiny_models import tiny_qwen3_moe

    tmp = tmp_path_factory.mktemp("graphs")
    moe = convert(tiny_qwen3_moe(tmp / "hf", vocab=49152), tmp / "moe", "q8", progress=False)
    shutil.copy(smollm2_store / "tokenizer.json", moe / "tokenizer.json")
    out = tmp / "stores"
    for precision in ("fp16", "w8a8"):
        graph_store(smollm2_store, out / f"dense-{precision}", precision, DENSE_LAYERS)
        graph_store(moe, out / f"moe-{precision}", precision)
    return out


def aarch64_wheels(root: Path, requirement: str) -> Path:
    """`requirement` and its dependencies as wheels for the root's CPython on aarch64, downloaded from
    PyPI once into the image cache (as image stage 20 downloads the appliance's)."""
    python = next((root / "opt/rkmojo/lib").glob("python3.*")).name.removeprefix("python")
    out = CACHE / "test-wheels" / f"{requirement.replace('==', '-')}-cp{python.replace('.', '')}-aarch64"
    if not out.exists():
        platforms = ["--platform", "manylinux2014_aarch64"]
        for v in range(17, GLIBC_MINOR + 1):
            platforms += ["--platform", f"manylinux_2_{v}_aarch64"]
        part = out.with_name(f"{out.name}.part-{os.getpid()}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:"]
            + platforms
            + ["--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}"]
            + ["-d", str(part), requirement],
            check=True,
        )
        try:
            part.rename(out)
        except OSError:  # another test run got there first
            shutil.rmtree(part)
    return out


@pytest.mark.slow
def test_the_board_software_under_emulation_runs_the_graphs_and_answers_as_the_cpu(board_root, graph_stores):
    work = board_root / "tmp/npu"
    # onnx as the x86 tests have it (the stand-in's evaluator), installed by the root's own pip
    onnx = f"onnx=={metadata.version('onnx')}"
    shutil.copytree(aarch64_wheels(board_root, onnx), work / "wheels")
    r = in_root(
        board_root,
        *("/opt/rkmojo/bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check"),
        *("--no-index", "--find-links", "/tmp/npu/wheels", onnx),
    )
    assert r.returncode == 0, r.stderr[-4000:]
    shutil.copytree(RKNNLITE_STANDIN, work / "rknnlite_standin", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(graph_stores, work / "graphs")

    got = run_json(
        board_root,
        *("PYTHONPATH=/tmp/npu/rknnlite_standin", "/opt/rkmojo/bin/python", "/tmp/npu/run.py", "graphs"),
        "/tmp/npu/graphs",
    )
    assert got["machine"] == "aarch64"
    # the image's venv has the real rknn-toolkit-lite2 (the npu role installs it); PYTHONPATH comes first
    assert got["rknnlite"] == "/tmp/npu/rknnlite_standin/rknnlite/__init__.py"
    ran = {
        "dense": {f"layer_{i:02d}.{k}.rknn" for i in DENSE_LAYERS for k in ("qkv", "o_mlp")},
        # its attention's q/k/v and o projections; the norms, attention, router and experts on the CPU
        "moe": {f"layer_{i:02d}.{k}.rknn" for i in (0, 1) for k in ("qkv", "o")},
    }
    for model in ("dense", "moe"):
        runs = got[model]
        assert runs["cpu"]["backend"] == "cpu" and runs["cpu"]["graphs"] == []
        for name in ("rknpu", "auto", "rknpu-w8a8"):
            assert runs[name]["backend"] == "rknpu", runs[name]["reason"]
            assert runs[name]["reason"].startswith("graphs: self-test passed"), runs[name]["reason"]
            assert set(runs[name]["graphs"]) == ran[model], name  # the prompt's full chunk went through each
        for name in ("rknpu", "auto"):
            # every prompt row's top-1 (a broken graph shows there before it changes a greedy token)
            assert runs[name]["top1"] == runs["cpu"]["top1"], (model, name, agreement(runs[name], runs["cpu"]))
            assert runs[name]["tokens"] == runs["cpu"]["tokens"], (model, name)
        print(f"{model} (graphs): fp16 tokens = the CPU's; w8a8 {agreement(runs['rknpu-w8a8'], runs['cpu'])}")
