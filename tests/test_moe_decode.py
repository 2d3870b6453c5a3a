"""The compiled MoE decode step (`inference.steps.moe`: `kernels.moe_decode_layer`, `moe_experts`,
`moe_combine`, rkmoedecode.c) against the Python layer code it stands in for at one row
(`inference/models/qwen3_moe.py`, `olmoe.py`, `moe.mixture`): the parity tests' tiny Qwen3-MoE (a dense
layer among the MoE ones) and OLMoE (q/k norm over the whole projection, clip_qkv), each activation mode
and KV precision, streamed experts, any thread count, the other x86 builds and the NEON build."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from inference import kernels
from inference.convert import convert
from inference.engine import Engine
from inference.experts import StreamingExperts
from inference.model import load_model
from inference.steps import moe as moe_step
from parity import build_checkpoint
from test_parity import olmoe, qwen3_moe as tiny_qwen3_moe

ARCHS = {"qwen3_moe": tiny_qwen3_moe, "olmoe": olmoe}
# as test_llama_decode: in f32 activations the step and the Python layers differ only by the RMS norm's
# summation order, libm's expf (softmax, silu), the router's sums and (f16 KV) a half's rounding those move
TOL = 1e-4


@pytest.fixture(scope="module", params=list(ARCHS))
def store(request, tmp_path_factory):
    model_cls, cfg = ARCHS[request.param]()
    tmp = tmp_path_factory.mktemp(request.param)
    return convert(build_checkpoint(model_cls, cfg, tmp / "hf"), tmp / "q4", "q4", progress=False)


def worst(a: np.ndarray, b: np.ndarray) -> float:
    """max |Δ| over each row of logits, relative to the row's range"""
    return float((np.abs(a - b).max(axis=-1) / (b.max(axis=-1) - b.min(axis=-1))).max())


def decode(store, kv: str, mode: str, ids, n_prompt: int, fused: bool = True, step_mode: str | None = None, **kw):
    """Logits of each generated token after a prompt of `n_prompt` ids (fused step or `layer`), and the cache.
    The prompt runs in `mode`, the generated tokens in `step_mode` (default: `mode`)."""
    m = load_model(store, kv_dtype=kv, **kw)
    m.fused_decode = fused
    cache = m.new_cache()
    with kernels.configured(activations=mode):
        if n_prompt:
            m.forward(np.array(ids[:n_prompt]), cache)
    with kernels.configured(activations=step_mode or mode):
        steps = [m.forward(np.array([t]), cache)[0] for t in ids[n_prompt:]]
    return np.array(steps), cache


def python_decode_mode(store, kv: str, ids, n_prompt: int) -> np.ndarray:
    """What the fused step computes in the `decode` mode, through the Python layers: q/k/v, o and dense MLPs
    with int8 activations (the q8 mode's linear) but the router and the LM head on floats (decode's)."""
    m = load_model(store, kv_dtype=kv)
    m.fused_decode = False
    route, logits = m.route, m.logits

    def on_floats(f):
        def g(*a):
            with kernels.configured(activations="decode"):
                return f(*a)

        return g

    m.route, m.logits = on_floats(route), on_floats(logits)
    cache = m.new_cache()
    with kernels.configured(activations="decode"):
        if n_prompt:
            m.forward(np.array(ids[:n_prompt]), cache)
    with kernels.configured(activations="q8"):
        return np.array([m.forward(np.array([t]), cache)[0] for t in ids[n_prompt:]])


def ids_for(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 512, n)


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_the_fused_step_gives_the_python_layers_logits_and_cache_on_floats(store, kv):
    ids = ids_for(16, 1)
    for n_prompt in (0, 9):  # from an empty cache (position 0), and after a prompt
        got, got_cache = decode(store, kv, "f32", ids, n_prompt)
        want, want_cache = decode(store, kv, "f32", ids, n_prompt, fused=False)
        assert worst(got, want) <= TOL, f"{kv} after {n_prompt}"
        for a, b in zip(got_cache.layers, want_cache.layers):
            assert np.array_equal(a.pos, b.pos)
            atol = (1e-4 if kv == "f32" else 2.0**-9) * np.abs(b.k).max()
            np.testing.assert_allclose(a.k.astype(np.float32), b.k.astype(np.float32), atol=atol, rtol=0)
            np.testing.assert_allclose(a.v.astype(np.float32), b.v.astype(np.float32), atol=atol, rtol=0)
        assert got_cache.offset == want_cache.offset == len(ids)


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_the_fused_step_in_the_experts_mode_takes_int8_in_the_experts_only(store, kv):
    # int8 experts: a last-bit difference in x may move an activation across an int8 rounding boundary
    # (test_llama_decode's TOL), so the step is held to "closer to the Python experts mode than floats are"
    ids = ids_for(16, 1)
    for n_prompt in (0, 9):
        got, _ = decode(store, kv, "experts", ids, n_prompt)
        want, _ = decode(store, kv, "experts", ids, n_prompt, fused=False)
        exact, _ = decode(store, kv, "f32", ids, n_prompt, fused=False)
        assert worst(got, want) < worst(exact, want), f"{kv} after {n_prompt}"


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_the_fused_step_in_the_decode_mode_takes_int8_in_the_dense_matrices_too(store, kv):
    ids = ids_for(16, 1)
    for n_prompt in (0, 9):
        got, _ = decode(store, kv, "decode", ids, n_prompt)
        want = python_decode_mode(store, kv, ids, n_prompt)
        exact, _ = decode(store, kv, "f32", ids, n_prompt, fused=False)
        experts, _ = decode(store, kv, "experts", ids, n_prompt)
        assert not np.array_equal(got, experts)  # q/k/v and o did take int8
        assert worst(got, want) < worst(exact, want), f"{kv} after {n_prompt}"
        # the prompt stayed on the float path: the same cache rows as the experts mode's
        if n_prompt:
            a, b = decode(store, kv, "decode", ids[:10], 9)[1], decode(store, kv, "experts", ids[:10], 9)[1]
            assert all(np.array_equal(x.k[:, :9], y.k[:, :9]) for x, y in zip(a.layers, b.layers))


def test_the_fused_step_keeps_going_as_the_cache_grows(store):
    ids = ids_for(262, 2)
    got, cache = decode(store, "f16", "f32", ids, 252)  # positions 252 .. 261
    want, _ = decode(store, "f16", "f32", ids, 252, fused=False)
    assert cache.layers[0].cap > 256  # grown past its first 256 rows mid-decode
    assert worst(got, want) <= TOL


@pytest.mark.parametrize("mode", ["decode", "experts"])
def test_the_fused_step_is_bit_identical_at_any_thread_count(store, mode):
    ids = ids_for(12, 3)
    runs = []
    for threads in (1, 2, 3):
        m = load_model(store, kv_dtype="f16")
        cache = m.new_cache()
        with kernels.configured(threads=threads, activations=mode):
            m.forward(np.array(ids[:6]), cache)
            runs.append(np.array([m.forward(np.array([t]), cache)[0] for t in ids[6:]]))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize("mode", ["decode", "experts"])
@pytest.mark.parametrize("slots,prefetch", [(1, 0), (2, 0), (3, 4)])
def test_streamed_experts_give_the_resident_bits_through_the_fused_step(store, mode, slots, prefetch):
    ids = ids_for(30, 4)
    resident, _ = decode(store, "f16", mode, ids, 10)
    experts = StreamingExperts(
        load_model(store).store, slots, io="threads", direct=False, prefetch=prefetch, verify="always"
    )
    try:
        streamed, _ = decode(store, "f16", mode, ids, 10, experts=experts)
        st = experts.stats()["total"]
    finally:
        experts.close()
    assert np.array_equal(resident, streamed)
    assert st["misses"] > 0 and st["evictions"] > 0
    if prefetch:
        assert st["prefetched"] > 0  # the gate lookahead ran from the fused step


def test_the_engine_decodes_through_the_fused_step(store, monkeypatch):
    calls = []
    real = moe_step.DecodeStep.__call__
    monkeypatch.setattr(moe_step.DecodeStep, "__call__", lambda *a: calls.append(1) or real(*a))
    e = Engine.open(store, chunk=8)
    prompt = [int(t) for t in ids_for(5, 5)]
    first, _ = e.prefill(prompt)
    assert not calls  # prompts stay on the Python layers
    e.forward([int(np.argmax(first))])
    assert calls


def test_resident_experts_fields_are_remembered_and_streamed_ones_are_not(store):
    def step_after(experts=None):
        m = load_model(store, **({"experts": experts} if experts else {}))
        cache = m.new_cache()
        with kernels.configured(activations="decode"):
            for t in ids_for(4, 6):
                m.forward(np.array([t]), cache)
        return m._step

    held = step_after().fields
    assert held and all(isinstance(w, dict) and len(f) == 12 for w, f in held.values())
    experts = StreamingExperts(load_model(store).store, 2, io="threads", direct=False)
    try:
        assert not step_after(experts).fields
    finally:
        experts.close()


def one_step(store, run, mode: str):
    """A build's step at position 6 by `run(model, step, h, cache, positions)` → the layers' output h
    and the cache, against the Python layers (the reference's matrices in the step's activations)."""
    ids = ids_for(7, 7)
    m = load_model(store, kv_dtype="f16")
    cache = m.new_cache()
    m.forward(np.array(ids[:6]), cache)
    pos = cache.offset
    h0 = kernels.embed_rows(m.embed, ids[6:])
    m._rope_memo = {}  # as `hidden` starts a chunk
    got_h, got_cache = run(m, moe_step.DecodeStep(m), h0, copy.deepcopy(cache), np.array([pos]))
    m.fused_decode = False
    m._rope_memo = {}  # as `hidden` starts a chunk
    with kernels.configured(activations=mode):
        want = m.layers_forward(h0, cache, np.array([pos]), False)
    # other builds sum in their own lane order; int8: one layer's worth of int8 rounding moves
    tol = 1e-4 if mode == "f32" else 2e-2
    assert np.abs(got_h - want).max() <= tol * np.abs(want).max()
    for a, b in zip(got_cache.layers, cache.layers):
        assert np.array_equal(a.pos, b.pos)
        np.testing.assert_allclose(a.k.astype(np.float32), b.k.astype(np.float32), atol=1e-3 * np.abs(b.k).max())


@pytest.mark.parametrize("mode", ["f32", "experts"])
def test_the_other_builds_fused_step_matches_the_python_layers(other_build, store, mode, monkeypatch):
    def run(m, step, h0, cache, positions):
        monkeypatch.setattr(kernels, "_LIB", other_build)
        before = other_build.use(None, mode)
        try:
            return step(h0, cache, positions), cache
        finally:
            other_build.use(*before)
            monkeypatch.undo()

    one_step(store, run, mode)


def relocations(desc: np.ndarray, fields: list[int], blobs: list[np.ndarray]) -> list[tuple[int, int]]:
    where = {b.ctypes.data: j for j, b in enumerate(blobs)}
    return [(f, where[int(desc[f])]) for f in fields if desc[f]]


@pytest.mark.parametrize("mode", ["f32", "experts"])
def test_the_neon_fused_step_matches_the_python_layers_under_qemu(neon, store, mode):
    def run(m, step, h0, cache, positions):
        h, (cos, sin) = step.prepare(h0, cache, positions)
        with kernels.configured(activations=mode):
            flag = kernels.moe_decode_flags(step.desc.array)
        outs = [h, step.x, step.ids, step.wts] + [a for kv in cache.layers for a in (kv.k, kv.v, kv.pos)]
        weights = [
            p
            for L in m.layers
            for v in L.values()
            for w in (v.values() if isinstance(v, dict) else [v])
            for p in (w.parts.values() if hasattr(w, "parts") else [w])
        ]
        blobs = outs + [cos, sin] + weights
        relocs = relocations(step.desc.array, step.desc.pointer_fields(), blobs)
        a = m.args
        for i, routed in enumerate(step.routed):
            for dst, src in zip(outs, neon.call(["moe_layer", str(i)], step.desc.array, blobs, relocs)):
                dst[...] = src
            if not routed:
                continue
            y = np.zeros((len(step.ids), a.hidden_size), np.float32)
            ws = [m.experts.store.expert(i, int(e)) for e in step.ids]
            parts = [p for w in ws for n in ("gate", "up", "down") for p in w[n].parts.values()]
            rows = [
                [k, *(f for n in ("gate", "up", "down") for f in kernels.matrix_fields(w[n]))] for k, w in enumerate(ws)
            ]
            head = [len(ws), a.hidden_size, a.moe_intermediate_size, flag, 0, 0, 0, 0, len(ws)]
            desc = np.array(head + [f for r in rows for f in r], np.int64)
            eblobs = [step.x, y, step.wts, h] + parts
            desc[4:8] = [b.ctypes.data for b in eblobs[:4]]
            fields = [4, 5, 6, 7] + [
                9 + 13 * j + 1 + 4 * m_ + p for j in range(len(ws)) for m_ in range(3) for p in (1, 2, 3)
            ]
            got = neon.call(["moe_experts"], desc, eblobs, relocations(desc, fields, eblobs))
            h[...] = got[3]
        return h, cache

    one_step(store, run, mode)
