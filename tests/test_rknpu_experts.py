"""Routed experts through the librknnrt matmul binding, against the ABI-faithful stand-in
(tests/rknnrt_standin.c, which computes on the CPU): a full chunk of a tiny MoE equals a numpy reference
of the same arithmetic, and the engine with experts on the NPU gives the CPU's greedy tokens."""

import logging
import os

import numpy as np
import pytest

from inference import kernels
from inference.backends import CPU
from inference.backends.rknpu import RknpuBackend
from inference.backends.rknpu.dmabuf import DMA_HEAP
from inference.backends.rknpu.experts import bucket
from inference.backends.rknpu.matmul import quantize_rows
from inference.convert import convert
from inference.engine import Engine
from inference.experts import ResidentExperts
from inference.model import load_model
from inference.models.base import silu
from inference.models.moe import mixture
from inference.quant import quantize
from inference.store import Store

LAYER = 1
SLOTS = "dma-heap" if os.path.exists(DMA_HEAP) else "memfd"  # where the expert slots' buffers come from


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """The tiny random Qwen3-MoE (H 64, expert width 64, 16 experts, top-4) in q4: every weight is
    quantized per output channel for the int8 path."""
    from tiny_models import tiny_qwen3_moe

    tmp = tmp_path_factory.mktemp("tiny-moe")
    return convert(tiny_qwen3_moe(tmp / "hf"), tmp / "store", "q4", progress=False)


def chunk(store, rows=64):
    """A chunk's normed MoE input and its routing by the model's own router."""
    model = load_model(store)
    x = np.random.default_rng(5).standard_normal((rows, model.args.hidden_size)).astype(np.float32)
    idx, w = model.route(LAYER, x)
    return x, idx, w


def combine(x, idx, weights, expert_fn):
    """mixture()'s combination, written out: per expert its rows, then weights, slot by slot."""
    T, K = idx.shape
    y = np.zeros((T, K, x.shape[1]), np.float32)
    for e in np.unique(idx):
        rows, slots = np.nonzero(idx == e)
        y[rows, slots] = expert_fn(int(e), x[rows])
    y *= weights[:, :, None].astype(np.float32)
    out = y[:, 0].copy()
    for k in range(1, K):
        out += y[:, k]
    return out


def int8_linear(x, w):
    """Raw int8 products (int64 here: exact) × row scale × channel scale, the same float operations."""
    q8 = quantize(w.dense(), "q8")
    qa, sa = quantize_rows(x)
    raw = qa.astype(np.int64) @ q8.parts["q"].astype(np.int64).T
    return raw.astype(np.float32) * sa[:, None] * np.asarray(q8.parts["scales"], np.float32)[None, :]


def fp16_linear(x, w):
    a = x.astype(np.float16).astype(np.float64)
    return (a @ w.dense().astype(np.float16).astype(np.float64).T).astype(np.float32)


def reference(store, x, idx, weights, linear):
    st = Store(store)

    def expert(e, xr):
        w = st.expert(LAYER, e)
        h = silu(linear(xr, w["gate"])) * linear(xr, w["up"])
        return linear(h, w["down"])

    return combine(x, idx, weights, expert)


def test_a_chunk_of_a_tiny_moe_through_the_binding_equals_the_int8_reference_exactly(tiny_moe, rknnrt_standin):
    x, idx, w = chunk(tiny_moe)
    npu = RknpuBackend(rknnrt_standin, precision="int8", rows=64, expert_min_rows=1)
    try:
        got = mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu, ops=npu)[0]
        assert npu.experts.calls == len(np.unique(idx))  # every expert of the chunk went through the binding
        assert npu.experts.imported == SLOTS  # their B in buffers of ours, imported by fd
    finally:
        npu.close()
    np.testing.assert_array_equal(got, reference(tiny_moe, x, idx, w, int8_linear))


def test_slots_the_runtime_will_not_import_go_in_its_memory_with_one_log_line(
    tiny_moe, rknnrt_standin, monkeypatch, caplog
):
    x, idx, w = chunk(tiny_moe)
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "from_fd")
    npu = RknpuBackend(rknnrt_standin, precision="int8", rows=64, expert_min_rows=1)
    try:
        with caplog.at_level(logging.WARNING, logger="inference.backends"):
            got = mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu, ops=npu)[0]
        assert npu.experts.imported is None and npu.failed is None and len(npu.experts._ctx) > 1
    finally:
        npu.close()
    np.testing.assert_array_equal(got, reference(tiny_moe, x, idx, w, int8_linear))
    assert [r.getMessage() for r in caplog.records if r.name == "inference.backends"] == [
        "backend: the runtime refused expert slots imported by fd (rknn_create_mem_from_fd); "
        "their B is in rknn_create_mem's memory"
    ]


def test_a_chunk_of_a_tiny_moe_in_fp16_equals_the_reference_within_fp16_rounding(tiny_moe, rknnrt_standin):
    x, idx, w = chunk(tiny_moe)
    npu = RknpuBackend(rknnrt_standin, precision="fp16", rows=64, expert_min_rows=1)
    try:
        got = mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu, ops=npu)[0]
    finally:
        npu.close()
    want = reference(tiny_moe, x, idx, w, fp16_linear)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    with kernels.configured(activations="f32"):  # the CPU's q4 kernels with exact activations agree too
        cpu = mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu)[0]
    assert np.linalg.norm(got - cpu) / np.linalg.norm(cpu) < 1e-2


def test_only_experts_with_enough_rows_go_to_the_npu(tiny_moe, rknnrt_standin):
    x, idx, w = chunk(tiny_moe)
    counts = np.bincount(idx.reshape(-1), minlength=16)
    threshold = int(np.median(counts[counts > 0])) + 1
    npu = RknpuBackend(rknnrt_standin, rows=64, expert_min_rows=threshold)
    try:
        mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu, ops=npu)
        assert 0 < npu.experts.calls == int((counts >= threshold).sum()) < int((counts > 0).sum())
    finally:
        npu.close()


def test_a_context_keeps_its_b_for_the_same_expert_and_resets_it_for_another(tiny_moe, rknnrt_standin):
    st = Store(tiny_moe)
    x = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32)
    npu = RknpuBackend(rknnrt_standin, rows=64)
    try:
        a1 = npu.experts(x, st.expert(0, 3), silu, (0, 3))
        a2 = npu.experts(x, st.expert(0, 3), silu, (0, 3))
        b = npu.experts(x, st.expert(0, 4), silu, (0, 4))
        assert npu.experts.loads == 2 and npu.experts.calls == 3
        np.testing.assert_array_equal(a1, a2)
        assert not np.array_equal(a1, b)  # expert 4's B replaced expert 3's
        np.testing.assert_array_equal(npu.experts(x, st.expert(0, 3), silu, None), a1)  # None: re-set always
        assert npu.experts.loads == 3
    finally:
        npu.close()


def test_without_a_calibration_or_the_option_experts_stay_on_the_cpu(tiny_moe, rknnrt_standin, tmp_path, monkeypatch):
    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path))
    npu = Engine.open(tiny_moe, backend="rknpu", npu_library=rknnrt_standin, chunk=64)
    try:
        npu.forward(list(range(3, 60)))
        assert npu.backend.backend.experts.calls == 0 and npu.backend.backend._weights  # dense did go
    finally:
        npu.close()


def test_rows_go_to_the_smallest_context_that_holds_them():
    assert [bucket(n, 128) for n in (1, 2, 8, 9, 33, 100, 128)] == [1, 8, 8, 16, 64, 128, 128]
    assert bucket(50, 48) == 48  # never more rows than the chunk


def test_a_runtime_failure_moves_the_experts_to_the_cpu_with_the_cpus_bits(
    tiny_moe, rknnrt_standin, monkeypatch, caplog
):
    x, idx, w = chunk(tiny_moe)
    npu = RknpuBackend(rknnrt_standin, rows=64, expert_min_rows=1)
    monkeypatch.setenv("RKNN_STANDIN_FAULT", "run")
    with caplog.at_level(logging.WARNING, logger="inference.backends"):
        got = mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu, ops=npu)[0]
    np.testing.assert_array_equal(got, mixture(x, idx, w, LAYER, ResidentExperts(Store(tiny_moe)), silu, ops=CPU)[0])
    assert "RKNN_ERR_TIMEOUT" in npu.failed
    assert len([r for r in caplog.records if r.name == "inference.backends"]) == 1


def greedy_ids(engine, prompt, n=10):
    out = [int(engine.forward(prompt)[-1].argmax())]
    while len(out) < n:
        out.append(int(engine.forward([out[-1]])[-1].argmax()))
    return out


@pytest.mark.parametrize(
    "streamed,how", [(False, "option"), (True, "option"), (False, "calibration")], ids=["resident", "streamed", "cal"]
)
def test_the_tiny_moe_with_experts_on_the_npu_gives_the_cpus_greedy_tokens(
    tiny_moe, rknnrt_standin, tmp_path, monkeypatch, streamed, how
):
    from test_rknpu_calibrate import sha, write

    monkeypatch.setenv("RKMOJO_HOME", str(tmp_path))
    turn_on = {"npu_expert_rows": 4}
    if how == "calibration":  # the board's calibration, not the option, turns the experts on
        write(tmp_path / "npu-calibration.json", sha=sha(rknnrt_standin), min_rows=32, expert_min_rows=4)
        turn_on = {}
    slots = {"expert_slots": 4} if streamed else {}  # 4 of 16 slots: experts move between slots
    prompt = list(range(3, 60))
    cpu = Engine.open(tiny_moe, backend="cpu", chunk=64, **slots)
    npu = Engine.open(tiny_moe, backend="rknpu", npu_library=rknnrt_standin, chunk=64, **turn_on, **slots)
    try:
        assert "experts from 4 rows" in npu.backend.reason
        assert greedy_ids(npu, prompt) == greedy_ids(cpu, prompt)
        assert npu.backend.backend.experts.calls > 0  # the prompt's experts went through the binding
    finally:
        npu.close()
        cpu.close()
