"""The `.rknn` graphs at run time (`inference/backends/rknpu/lite.py`) through a STAND-IN for RKNNLite.

rknn-toolkit-lite2 exists only for aarch64 boards and nothing off a board executes a `.rknn` file: the
tests put `tests/rknnlite_standin` on sys.path, a stand-in `rknnlite.api.RKNNLite` that enforces the
documented API and evaluates the ONNX each graph was compiled from (kept by `npu build --keep-onnx`),
rounded as the graph's precision computes. The graphs themselves are compiled by Rockchip's toolkit.
"""

import contextlib
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from inference.backends.rknpu.build import build, texts
from inference.backends.rknpu.quality import MAX_PERPLEXITY_RISE, MEASURED, measure
from inference.backends.rknpu.graphs import o_norm_graph, qkv_graph
from inference.engine import Engine
from inference.models.base import rms_norm

ROOT = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).parent / "rknnlite_standin"
RKNN_PY = ROOT / ".venv-rknn" / "bin" / "python"
needs_toolkit = pytest.mark.skipif(not RKNN_PY.exists(), reason="no .venv-rknn: run scripts/setup --npu-build")
ROWS = 32
LAYERS = [0, 1, 2, 29]
MOE = "tiny-qwen3-moe"  # the tiny MoE's name in the quality gate's table
PROMPT = "The three largest cities of France, in order of population, are"


@pytest.fixture
def rknnlite(monkeypatch):
    """The stand-in's RKNNLite class, importable as `rknnlite.api` for this test only."""
    monkeypatch.syspath_prepend(str(STANDIN))
    from rknnlite.api import RKNNLite

    yield RKNNLite
    for name in ("rknnlite.api", "rknnlite"):  # gone again for the tests without it
        sys.modules.pop(name, None)


def graph_store(src: Path, tmp_path_factory, precision: str, layers: list[int] | None = LAYERS) -> Path:
    """A copy of the store `src` with its graphs of `layers` (None: all) built in `precision` at ROWS rows."""
    store = tmp_path_factory.mktemp("npu-" + precision) / "store"
    shutil.copytree(src, store)
    build(store, rows=ROWS, layers=layers, precision=precision, keep_onnx=True, log=lambda line: None)
    return store


@pytest.fixture(scope="module")
def fp16_store(smollm2_store, tmp_path_factory):
    return graph_store(smollm2_store, tmp_path_factory, "fp16")


def standin_graph(tmp_path: Path, model) -> str:
    """An fp16 graph's ONNX and a file with the RKNN magic beside it: what the stand-in loads."""
    import onnx

    onnx.helper.set_model_props(model, {"rkmojo.precision": "fp16"})
    onnx.save(model, tmp_path / "g.onnx")
    (tmp_path / "g.rknn").write_bytes(b"RKNN" + bytes(60))
    return str(tmp_path / "g.rknn")


@pytest.fixture
def qkv_rknn(tmp_path):
    """A qkv graph: enough for the stand-in's API checks."""
    rng = np.random.default_rng(0)
    return standin_graph(
        tmp_path, qkv_graph(*(rng.standard_normal((n, 64)).astype(np.float32) for n in (64, 32, 32)), rows=8)
    )


def test_the_standin_runs_a_qkv_graph_without_v(rknnlite, tmp_path):
    # Gemma 4's full layers have K = V: their qkv graph has two outputs
    rng = np.random.default_rng(1)
    wq, wk = (rng.standard_normal((n, 64)).astype(np.float32) for n in (64, 32))
    model = qkv_graph(wq, wk, None, rows=8)
    assert [o.name for o in model.graph.output] == ["q", "k"]
    rt = rknnlite()
    assert rt.load_rknn(standin_graph(tmp_path, model)) == 0 and rt.init_runtime(core_mask=rknnlite.NPU_CORE_0) == 0
    x = rng.standard_normal((8, 64)).astype(np.float32)
    q, k = rt.inference(inputs=[x])
    for got, w in ((q, wq), (k, wk)):
        want = x @ w.T
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def test_an_o_norm_graph_computes_gemma4s_normed_o_projection(rknnlite, tmp_path):
    # the graph's RMSNorm (ReduceMean, Sqrt, Div) against the CPU's models/base.rms_norm, a narrow weight
    # scaling the projection far from unit RMS so that a missing norm cannot pass
    rng = np.random.default_rng(2)
    wo = rng.standard_normal((32, 64)).astype(np.float32) * 5
    norm = rng.uniform(0.5, 1.5, 32).astype(np.float32)
    rt = rknnlite()
    assert rt.load_rknn(standin_graph(tmp_path, o_norm_graph(wo, norm, 1e-6, rows=8))) == 0
    assert rt.init_runtime(core_mask=rknnlite.NPU_CORE_1) == 0
    o, h = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal((8, 32)).astype(np.float32)
    (got,) = rt.inference(inputs=[o, h])
    want = h + rms_norm(o @ wo.T, norm, 1e-6)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def test_the_standin_refuses_what_the_runtime_refuses(rknnlite, qkv_rknn, tmp_path):
    rt = rknnlite()
    assert rt.load_rknn(str(tmp_path / "missing.rknn")) == -1
    (tmp_path / "bad.rknn").write_bytes(b"ONNX" + bytes(60))
    assert rt.load_rknn(str(tmp_path / "bad.rknn")) == -1
    assert rt.init_runtime(core_mask=rknnlite.NPU_CORE_0) == -1  # nothing loaded
    assert rt.load_rknn(qkv_rknn) == 0
    assert rt.inference(inputs=[np.zeros((8, 64), np.float32)]) is None  # before init
    assert rt.init_runtime(core_mask=5) == -1  # not a core mask the runtime knows
    assert rt.init_runtime(core_mask=rknnlite.NPU_CORE_2) == 0
    assert rt.init_runtime(core_mask=rknnlite.NPU_CORE_2) == -1  # a second init
    assert rt.inference(inputs=[]) is None
    assert rt.inference(inputs=[np.zeros((8, 64), np.float64)]) is None
    assert rt.inference(inputs=[np.zeros((7, 64), np.float32)]) is None
    q, k, v = rt.inference(inputs=[np.ones((8, 64), np.float32)])
    assert (q.shape, k.shape, v.shape) == ((8, 64), (8, 32), (8, 32))
    rt.release()
    assert rt.inference(inputs=[np.ones((8, 64), np.float32)]) is None


@needs_toolkit
@pytest.mark.slow
def test_the_fp16_graphs_give_the_cpus_greedy_tokens(fp16_store, rknnlite):
    cpu = Engine.open(fp16_store, backend="cpu", chunk=ROWS)
    npu = Engine.open(fp16_store, backend="rknpu", chunk=ROWS)
    try:
        assert npu.backend.name == "rknpu" and npu.backend.reason.startswith("graphs: self-test passed (8 graphs")
        graphs = npu.backend.backend.graphs
        assert sorted({g.core_mask for g in graphs.values()}) == [1, 2, 4]  # spread over the three cores
        runs = spy_runs(npu)
        prompt = npu.tokenizer.encode(PROMPT * 3)
        got = greedy(npu, prompt)
        assert got == greedy(cpu, prompt)
        assert {"layer_00.qkv.rknn", "layer_29.o_mlp.rknn"} <= set(runs)  # the chunks did go through graphs
    finally:
        npu.close()


def spy_runs(engine) -> list[str]:
    """The names of the graphs run from now on, in order."""
    runs = []
    for g in engine.backend.backend.graphs.values():
        inference = g.rt.inference
        g.rt.inference = lambda inputs, f=inference, name=g.path.name: runs.append(name) or f(inputs=inputs)
    return runs


def greedy(engine, prompt: list[int], n: int = 12) -> list[int]:
    out = [int(engine.forward(prompt)[-1].argmax())]
    while len(out) < n:
        out.append(int(engine.forward([out[-1]])[-1].argmax()))
    engine.reset()
    return out


@pytest.fixture(scope="module")
def moe_graphs(moe_text_store, tmp_path_factory) -> dict[str, Path]:
    """The tiny random Qwen3-MoE (2 layers, q4, SmolLM2's tokenizer) with its qkv and o graphs, per precision."""
    return {p: graph_store(moe_text_store, tmp_path_factory, p, layers=None) for p in ("fp16", "w8a8")}


@needs_toolkit
@pytest.mark.slow
def test_a_tiny_moes_qkv_and_o_graphs_give_the_cpus_greedy_tokens(moe_graphs, rknnlite):
    # Qwen3-MoE: the q/k/v projections and the o projection with its residual add as graphs; q/k norms,
    # attention, the post-attention norm, router and experts on the CPU
    cpu = Engine.open(moe_graphs["fp16"], backend="cpu", chunk=ROWS)
    npu = Engine.open(moe_graphs["fp16"], backend="rknpu", chunk=ROWS)
    try:
        assert npu.backend.reason.startswith("graphs: self-test passed (4 graphs")
        prompt = list(range(3, 60))
        runs = spy_runs(npu)
        assert greedy(npu, prompt) == greedy(cpu, prompt)
        # the first 32 rows; the rest is too short
        assert runs == ["layer_00.qkv.rknn", "layer_00.o.rknn", "layer_01.qkv.rknn", "layer_01.o.rknn"]
    finally:
        npu.close()


@needs_toolkit
@pytest.mark.slow
def test_a_tiny_olmoes_qkv_and_o_graphs_give_the_cpus_greedy_tokens(smollm2_store, tmp_path, rknnlite):
    # OLMoE: its own attention (q/k norms over the whole projection, clip_qkv) around the same two graphs
    from inference.convert import convert
    from tiny_models import tiny_olmoe

    store = convert(tiny_olmoe(tmp_path / "hf", vocab=49152), tmp_path / "store", "q8", progress=False)
    shutil.copy(smollm2_store / "tokenizer.json", store / "tokenizer.json")
    with fp16_engines(store, [f"layer_{i:02d}.{k}" for i in range(3) for k in ("o", "qkv")]) as (cpu, npu):
        prompt = list(range(3, 60))
        runs = spy_runs(npu)
        assert greedy(npu, prompt) == greedy(cpu, prompt)
        assert runs == [f"layer_{i:02d}.{k}.rknn" for i in range(3) for k in ("qkv", "o")]


@contextlib.contextmanager
def fp16_engines(store: Path, graphs: list[str]):
    """(CPU engine, graphs engine) of `store` after an fp16 build of `graphs` at ROWS rows."""
    section = build(store, rows=ROWS, precision="fp16", keep_onnx=True, log=lambda line: None)
    assert sorted(section["graphs"]) == sorted(graphs)
    cpu = Engine.open(store, backend="cpu", chunk=ROWS)
    npu = Engine.open(store, backend="rknpu", chunk=ROWS)
    try:
        assert npu.backend.reason.startswith(f"graphs: self-test passed ({len(graphs)} graphs")
        yield cpu, npu
    finally:
        npu.close()


@needs_toolkit
@pytest.mark.slow
def test_gemma4s_fp16_graphs_give_the_cpus_greedy_tokens(gemma4_store, tmp_path, rknnlite):
    # Gemma 4: qkv (no v on its K = V full layers), the normed o projection and the dense MLP as graphs;
    # the other norms, attention, router and routed experts on the CPU
    store = tmp_path / "store"
    shutil.copytree(gemma4_store, store)
    kinds = ("qkv", "o_norm", "mlp")  # in the order a chunk meets them
    with fp16_engines(store, [f"layer_{i:02d}.{k}" for i in range(4) for k in kinds]) as (cpu, npu):
        prompt = list(range(3, 60))
        runs = spy_runs(npu)
        # every position's top-1 is the CPU's (the logits differ by 5.6e-2 relative: fp16's ~4e-4 per graph
        # grows through the layers, and one row of 32 takes another expert set in layer 2)
        logits = npu.forward(prompt[:ROWS], last_only=False)
        want = cpu.forward(prompt[:ROWS], last_only=False)
        assert (logits != want).any() and (logits.argmax(-1) == want.argmax(-1)).all()
        npu.reset()
        cpu.reset()
        assert greedy(npu, prompt) == greedy(cpu, prompt)
        # the first 32 rows of each call with a full chunk; the rest is too short
        assert runs == [f"layer_{i:02d}.{k}.rknn" for _ in range(2) for i in range(4) for k in kinds]


@needs_toolkit
@pytest.mark.slow
def test_graphs_loaded_just_in_time_keep_one_layer_and_give_the_same_logits(fp16_store, rknnlite):
    every = Engine.open(fp16_store, backend="rknpu", chunk=ROWS)
    one = Engine.open(fp16_store, backend="rknpu", chunk=ROWS, npu_graph_layers=1)
    try:
        ids = every.tokenizer.encode(PROMPT * 3)
        assert (one.forward(ids) == every.forward(ids)).all()
        b = one.backend.backend
        assert list(b.loaded) == [29] and [k for k, g in b.graphs.items() if g.rt is not None] == [
            (29, "qkv"),
            (29, "o_mlp"),
        ]
    finally:
        every.close()
        one.close()


@needs_toolkit
@pytest.mark.slow
def test_a_runtime_failure_after_the_self_test_moves_prefill_to_the_cpu(fp16_store, rknnlite, monkeypatch, caplog):
    cpu = Engine.open(fp16_store, backend="cpu", chunk=ROWS)
    npu = Engine.open(fp16_store, backend="rknpu", chunk=ROWS)
    ids = cpu.tokenizer.encode(PROMPT * 3)
    monkeypatch.setenv("RKNNLITE_STANDIN_FAULT", "inference")
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        got = npu.forward(ids)
    assert (got == cpu.forward(ids)).all()  # bit-identical: the whole chunk ran on the CPU
    lines = [r.getMessage() for r in caplog.records if r.name == "inference.backends" and r.levelno >= logging.WARNING]
    assert lines == [
        "backend: the CPU runs prefill from now on; the NPU failed after its self-test: "
        "RKNNLite.inference failed for layer_00.qkv.rknn"
    ]
    assert all(g.rt is None for g in npu.backend.backend.graphs.values())


@needs_toolkit
@pytest.mark.slow
def test_graphs_for_a_shorter_chunk_fall_back_to_the_matmul_path_and_say_why(fp16_store, rknnlite, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        eng = Engine.open(fp16_store, backend="rknpu", chunk=64, npu_library=str(tmp_path / "librknnrt.so"))
    assert eng.backend.name == "cpu"
    assert eng.backend.reason.startswith(
        "graphs not used: the graphs are compiled for 32-row chunks and the engine's chunk is 64: "
        "rebuild with `rkmojo npu build --rows 64` or set chunk=32; NPU self-test failed: librknnrt: cannot load"
    )


@needs_toolkit
@pytest.mark.slow
def test_auto_on_an_arm_board_takes_the_graphs(fp16_store, rknnlite, monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    eng = Engine.open(fp16_store, backend="auto", chunk=ROWS)
    try:
        assert eng.backend.name == "rknpu" and eng.backend.reason.startswith("graphs: self-test passed")
    finally:
        eng.close()


@needs_toolkit
@pytest.mark.slow
def test_without_rknnlite_the_graphs_are_skipped_with_the_reason(fp16_store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rknnlite", None)  # import rknnlite raises ImportError (as off the board)
    eng = Engine.open(fp16_store, backend="rknpu", chunk=ROWS, npu_library=str(tmp_path / "librknnrt.so"))
    assert eng.backend.name == "cpu" and "rknnlite is not importable" in eng.backend.reason


@needs_toolkit
@pytest.mark.slow
def test_the_quality_gate_of_the_graphs(fp16_store, smollm2_store, tmp_path_factory, rknnlite, monkeypatch):
    # perplexity and top-1 against the CPU over the Zen of Python (a text the standard library ships)
    w8a8_store = graph_store(smollm2_store, tmp_path_factory, "w8a8")
    cpu = Engine.open(fp16_store, backend="cpu", chunk=ROWS)
    ids = cpu.tokenizer.encode(texts()[0])
    got = {}
    for precision, store in (("fp16", fp16_store), ("w8a8", w8a8_store)):
        npu = Engine.open(store, backend="rknpu", chunk=ROWS)
        try:
            assert npu.backend.reason.startswith("graphs: self-test passed")
            got[precision] = q = measure(npu, cpu, ids)
        finally:
            npu.close()
        print(
            f"graphs {precision} (layers {LAYERS}, {ROWS} rows): perplexity {q.perplexity:.3f} vs "
            f"{q.cpu_perplexity:.3f} ({q.rise:+.2%}), top-1 agreement {q.top1_agreement:.3f}"
        )
    assert got["fp16"].passes and got["fp16"].top1_agreement > 0.98
    for precision, q in got.items():  # the table `auto` reads says what was measured
        assert q.passes == (MEASURED["graphs", precision]["smollm2"] <= MAX_PERPLEXITY_RISE), precision
    # so auto on a board leaves w8a8 graphs alone, saying why (and, without librknnrt, uses the CPU)
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    eng = Engine.open(w8a8_store, backend="auto", chunk=ROWS)
    assert eng.backend.name == "cpu" and eng.backend.reason.startswith(
        "graphs not used: auto uses only fp16 graphs; w8a8 raised smollm2's perplexity +5.6%"
    )


@needs_toolkit
@pytest.mark.slow
def test_the_quality_gate_of_a_tiny_moes_graphs(moe_graphs, rknnlite):
    got = {}
    for precision, store in moe_graphs.items():
        cpu = Engine.open(store, backend="cpu", chunk=ROWS)
        npu = Engine.open(store, backend="rknpu", chunk=ROWS)
        try:
            assert npu.backend.reason.startswith("graphs: self-test passed (4 graphs")
            got[precision] = q = measure(npu, cpu, cpu.tokenizer.encode(texts()[0]))
        finally:
            npu.close()
        print(
            f"tiny MoE, graphs {precision} (qkv, o; {ROWS} rows): perplexity {q.perplexity:.2f} vs "
            f"{q.cpu_perplexity:.2f} ({q.rise:+.3%}), top-1 {q.top1_agreement:.3f}, "
            f"layers {[f'{e:.1e}' for e in q.layer_errors]}"
        )
        assert q.passes == (MEASURED["graphs", precision][MOE] <= MAX_PERPLEXITY_RISE), precision
    # measured fp16: top-1 0.975, layers 1.7e-2, 2.3e-2 (the median row 7e-4: a row whose router picks
    # another expert set carries the rest); w8a8: top-1 0.872, layers 5.5e-2, 6.5e-2
    assert got["fp16"].top1_agreement > 0.96 and max(got["fp16"].layer_errors) < 5e-2
    assert got["w8a8"].top1_agreement < got["fp16"].top1_agreement
