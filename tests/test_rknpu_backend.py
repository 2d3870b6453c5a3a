"""EngineConfig.backend: the NPU chosen only after its self-test (against the librknnrt stand-in here),
the CPU otherwise with one log line saying why, and the same greedy tokens either way."""

import logging

import pytest

from inference.convert import convert
from inference.engine import Engine
from inference.options import OptionError
from inference.generate import TokenEvent

PROMPT = "The three largest cities of France, in order of population, are"  # > 32 prompt rows: the NPU's


def greedy(engine) -> list[int]:
    prompt = engine.tokenizer.encode(PROMPT * 3)
    assert len(prompt) >= 32
    return [ev.id for ev in engine.generate(prompt, temperature=0, max_tokens=12) if isinstance(ev, TokenEvent)]


def warnings(caplog) -> list[str]:
    """The backend's warning lines (other tests may have turned INFO logging on for the process)."""
    return [r.getMessage() for r in caplog.records if r.name == "inference.backends" and r.levelno >= logging.WARNING]


def greedy_ids(engine, prompt: list[int], n: int = 12) -> list[int]:
    """Greedy continuation through engine.forward (for stores without a tokenizer)."""
    out = [int(engine.forward(prompt)[-1].argmax())]
    while len(out) < n:
        out.append(int(engine.forward([out[-1]])[-1].argmax()))
    return out


def test_auto_is_the_cpu_on_x86(smollm2_store):
    eng = Engine.open(smollm2_store, backend="auto")
    assert (eng.backend.name, eng.backend.reason) == ("cpu", "auto: x86_64 has no RK3588 NPU")


def test_an_unknown_backend_or_precision_names_the_choices(smollm2_store):
    with pytest.raises(OptionError, match="backend='gpu' is out of range; allowed: one of auto, cpu, rknpu"):
        Engine.open(smollm2_store, backend="gpu")
    with pytest.raises(OptionError, match="npu_precision='int4' is out of range; allowed: one of fp16, int8"):
        Engine.open(smollm2_store, backend="rknpu", npu_precision="int4")


@pytest.mark.parametrize("fault,why", [("create", "rknn_matmul_create"), ("version", "RKNN_QUERY_SDK_VERSION")])
def test_a_failed_self_test_falls_back_to_the_cpu_with_one_log_line(
    smollm2_store, rknnrt_standin, monkeypatch, caplog, fault, why
):
    monkeypatch.setenv("RKNN_STANDIN_FAULT", fault)
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        eng = Engine.open(smollm2_store, backend="rknpu", npu_library=rknnrt_standin)
    assert eng.backend.name == "cpu" and why in eng.backend.reason
    lines = warnings(caplog)
    assert len(lines) == 1 and why in lines[0]


def test_a_missing_library_falls_back_to_the_cpu(smollm2_store, tmp_path):
    eng = Engine.open(smollm2_store, backend="rknpu", npu_library=str(tmp_path / "librknnrt.so"))
    assert eng.backend.name == "cpu" and "cannot load" in eng.backend.reason


def test_the_npu_gives_the_cpus_greedy_tokens(smollm2_store, rknnrt_standin):
    cpu = Engine.open(smollm2_store, backend="cpu", chunk=64)
    npu = Engine.open(smollm2_store, backend="rknpu", npu_library=rknnrt_standin, chunk=64)
    try:
        assert npu.backend.name == "rknpu" and "driver 0.9.8 (stand-in)" in npu.backend.reason
        assert greedy(npu) == greedy(cpu)
        assert npu.backend.backend._weights  # the prompt's chunk did go through the binding
    finally:
        npu.close()


def test_a_runtime_failure_after_the_self_test_moves_prefill_to_the_cpu(
    smollm2_store, rknnrt_standin, monkeypatch, caplog
):
    cpu = Engine.open(smollm2_store, backend="cpu", chunk=64)
    npu = Engine.open(smollm2_store, backend="rknpu", npu_library=rknnrt_standin, chunk=64)
    ids = cpu.tokenizer.encode(PROMPT * 3)
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "run")
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        got = npu.forward(ids)
    assert (got == cpu.forward(ids)).all()  # bit-identical: every matmul of the chunk ran on the CPU
    lines = warnings(caplog)
    assert len(lines) == 1 and "RKNN_ERR_TIMEOUT" in lines[0]
    assert "rknn_matmul_run" in npu.backend.backend.failed and not npu.backend.backend._weights


def test_a_tiny_moe_gives_the_cpus_greedy_tokens(tmp_path, rknnrt_standin):
    # attention projections on the NPU, router and routed experts on the CPU
    from tiny_models import tiny_qwen3_moe

    store = convert(tiny_qwen3_moe(tmp_path / "hf"), tmp_path / "store", "q8", progress=False)
    prompt = list(range(3, 60))
    cpu = Engine.open(store, backend="cpu", chunk=64)
    npu = Engine.open(store, backend="rknpu", npu_library=rknnrt_standin, chunk=64)
    try:
        assert npu.backend.name == "rknpu"
        assert greedy_ids(npu, prompt) == greedy_ids(cpu, prompt)
        assert len(npu.backend.backend._weights) == 2 * 4  # q, k, v, o of both layers
    finally:
        npu.close()


def test_int8_prefill_agrees_with_the_cpu_on_most_rows(smollm2_store, rknnrt_standin):
    # raw INT8×INT8→INT32 with per-row and per-channel scales: measured 38 of 39 prompt rows with the
    # CPU's top-1 token (SmolLM2; fp16: all). On a longer text it falls to 0.73: see the quality gate below
    cpu = Engine.open(smollm2_store, backend="cpu", chunk=64)
    npu = Engine.open(smollm2_store, backend="rknpu", npu_library=rknnrt_standin, chunk=64, npu_precision="int8")
    try:
        ids = cpu.tokenizer.encode(PROMPT * 3)
        agree = (npu.forward(ids, last_only=False).argmax(-1) == cpu.forward(ids, last_only=False).argmax(-1)).mean()
        print(f"int8 prefill top-1 agreement: {agree:.3f} over {len(ids)} rows")
        assert agree >= 0.9
    finally:
        npu.close()


@pytest.mark.slow
def test_the_quality_gate_passes_fp16_and_fails_int8(smollm2_store, rknnrt_standin):
    # a text that a package ships (the standard library's Zen of Python), 203 tokens in 64-row chunks
    from inference.backends.rknpu.build import texts
    from inference.backends.rknpu.quality import MAX_PERPLEXITY_RISE, MEASURED, measure

    cpu = Engine.open(smollm2_store, backend="cpu", chunk=64)
    ids = cpu.tokenizer.encode(texts()[0])
    got = {}
    for precision in ("fp16", "int8"):
        npu = Engine.open(smollm2_store, backend="rknpu", npu_library=rknnrt_standin, chunk=64, npu_precision=precision)
        try:
            got[precision] = q = measure(npu, cpu, ids)
        finally:
            npu.close()
        print(
            f"{precision}: perplexity {q.perplexity:.3f} vs {q.cpu_perplexity:.3f} ({q.rise:+.2%}), "
            f"top-1 agreement {q.top1_agreement:.3f}"
        )
    assert got["fp16"].passes and got["fp16"].top1_agreement > 0.98
    assert not got["int8"].passes  # measured +11.8 %: `auto` keeps fp16 (inference/backends/__init__.py)
    for precision, q in got.items():  # the table `auto` reads says what was measured
        assert q.passes == (MEASURED["matmul", precision]["smollm2"] <= MAX_PERPLEXITY_RISE), precision
