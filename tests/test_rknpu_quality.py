"""The NPU quality gate (`inference/backends/rknpu/quality.py`): what `auto` may use follows the measured
perplexity rises, a rise over 2 % takes a precision out of `auto`, and the tiny random MoE's measurement
through the librknnrt binding (dense matmuls and routed experts on the NPU: the stand-in library)."""

import logging

import pytest

from inference.backends.rknpu.build import texts
from inference.backends.rknpu.quality import MAX_PERPLEXITY_RISE, MEASURED, Quality, auto_precisions, measure
from inference.engine import Engine

MOE = "tiny-qwen3-moe"
# texts()[0]: the Zen of Python, the gate's corpus (the standard library's `this`)


def test_a_rise_of_more_than_two_percent_fails_the_gate():
    assert Quality(perplexity=101.99, cpu_perplexity=100.0, top1_agreement=1.0).passes
    assert not Quality(perplexity=102.01, cpu_perplexity=100.0, top1_agreement=1.0).passes


def test_auto_takes_the_precisions_every_measured_model_kept_within_the_gate(monkeypatch):
    assert auto_precisions("matmul") == ("fp16",) and auto_precisions("graphs") == ("fp16",)
    monkeypatch.setitem(MEASURED, ("matmul", "int8"), {"smollm2": 0.019, MOE: 0.0})
    assert auto_precisions("matmul") == ("fp16", "int8")
    monkeypatch.setitem(MEASURED, ("matmul", "fp16"), {"smollm2": 0.0, MOE: 0.021})  # one model is enough
    assert auto_precisions("matmul") == ("int8",)


@pytest.fixture
def on_a_board(monkeypatch, tmp_path):
    """`auto` as on an aarch64 board, with no calibration file of this machine's user."""
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path))


def test_auto_on_a_board_runs_fp16_when_int8_is_asked_for(smollm2_store, rknnrt_standin, on_a_board, caplog):
    with caplog.at_level(logging.INFO, logger="inference.backends"):
        eng = Engine.open(smollm2_store, backend="auto", npu_library=rknnrt_standin, npu_precision="int8")
    try:
        assert eng.backend.name == "rknpu" and eng.backend.backend.precision == "fp16"
    finally:
        eng.close()
    assert "backend: auto uses fp16 on the NPU; int8 raised smollm2's perplexity +11.8%" in caplog.text
    asked = Engine.open(smollm2_store, backend="rknpu", npu_library=rknnrt_standin, npu_precision="int8")
    try:
        assert asked.backend.backend.precision == "int8"  # asked for by name, it runs
    finally:
        asked.close()


def test_auto_on_a_board_uses_the_cpu_when_no_precision_passes(smollm2_store, rknnrt_standin, on_a_board, monkeypatch):
    monkeypatch.setitem(MEASURED, ("matmul", "fp16"), {"smollm2": 0.0, MOE: 0.025})
    eng = Engine.open(smollm2_store, backend="auto", npu_library=rknnrt_standin)
    assert eng.backend.name == "cpu"
    assert eng.backend.reason.startswith(
        "auto: no NPU precision passes the quality gate: fp16 raised tiny-qwen3-moe's perplexity +2.5%"
    )


def test_a_moe_layer_error_is_measured_per_layer(moe_text_store):
    # the gate's per-layer error: a layer's output against the CPU's; an engine against itself is exact
    eng = Engine.open(moe_text_store, backend="cpu", chunk=64)
    ids = eng.tokenizer.encode(texts()[0])[:80]
    q = measure(eng, eng, ids)
    assert q.layer_errors == [0.0, 0.0] and q.rise == 0.0 and q.top1_agreement == 1.0
    assert "layer" not in vars(eng.model)  # the spy is gone


@pytest.mark.slow
def test_the_tiny_moes_gate_through_the_binding_with_experts_on_the_npu(
    moe_text_store, rknnrt_standin, tmp_path, monkeypatch
):
    # q/k/v/o and every routed expert (from 1 row) through the binding; router and attention on the CPU
    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path))
    cpu = Engine.open(moe_text_store, backend="cpu", chunk=64)
    ids = cpu.tokenizer.encode(texts()[0])
    got = {}
    for precision in ("fp16", "int8"):
        npu = Engine.open(
            moe_text_store,
            backend="rknpu",
            npu_library=rknnrt_standin,
            chunk=64,
            npu_precision=precision,
            npu_expert_rows=1,
        )
        try:
            got[precision] = q = measure(npu, cpu, ids)
            assert npu.backend.backend.experts.calls > 0 and npu.backend.backend._weights
        finally:
            npu.close()
        print(
            f"tiny MoE, matmuls {precision}: perplexity {q.perplexity:.2f} vs {q.cpu_perplexity:.2f} "
            f"({q.rise:+.3%}), top-1 {q.top1_agreement:.3f}, layers {[f'{e:.1e}' for e in q.layer_errors]}"
        )
        # the table `auto` reads says what was measured
        table = MEASURED["matmul", precision][MOE]
        assert q.passes == (table <= MAX_PERPLEXITY_RISE), (
            f"{precision}: measured {q.rise:+.2%}, the table {table:+.2%}"
        )
    # measured fp16: top-1 0.980, layers 6.6e-3 and 1.5e-2, mostly the CPU's own int8 activations (against
    # activations="f32": 6.3e-4, 8.1e-4, top-1 0.995); int8: top-1 0.882, layers 5.2e-2, 6.1e-2
    assert got["fp16"].top1_agreement > 0.97 and max(got["fp16"].layer_errors) < 3e-2
    assert got["int8"].top1_agreement < got["fp16"].top1_agreement
