"""Gemma 4's compiled one-token step (`inference.steps.gemma4`: `kernels.gemma4_attn`, `gemma4_route`, rkgemma4.c)
against the Python layer code it stands in for at one row (`inference/models/gemma4.py`): the parity tests'
tiny Gemma 4 (sliding and full layers with their own head sizes, K = V on the full ones, a window the
ring wraps past), each activation mode and KV precision, streamed experts with the lookahead, any thread
count, the other x86 builds and the NEON build."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from inference import kernels
from inference.convert import convert
from inference.engine import Engine
from inference.experts import StreamingExperts
from inference.model import load_model
from inference.steps import gemma4 as gemma4_step
from parity import build_checkpoint
from test_moe_decode import relocations, worst
from test_parity import gemma4 as tiny_gemma4

# as test_moe_decode: on floats the step and the Python layers differ by the RMS norm's summation order,
# libm's expf in the router's softmax, the router's sums and (f16 KV) a half's rounding those move
TOL = 1e-4
# f16 K/V: a last-bit difference moves a half's rounding by one of its steps (2^-11 of the value), and over
# 48 tokens a few such steps reach the logits (measured: up to 4e-4 of a row's range)
TOL_F16 = 2.0**-10
CHUNK = 8  # a sliding layer's ring holds window 24 + 8 rows: a few tokens wrap it


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    model_cls, cfg = tiny_gemma4()
    tmp = tmp_path_factory.mktemp("gemma4")
    return convert(build_checkpoint(model_cls, cfg, tmp / "hf"), tmp / "q4", "q4", progress=False)


def decode(store, kv: str, mode: str, ids, n_prompt: int, fused: bool = True, **kw):
    """Logits of each generated token after a prompt of `n_prompt` ids (the step or `layer`), and the cache."""
    m = load_model(store, kv_dtype=kv, chunk=CHUNK, **kw)
    m.fused_decode = fused
    cache = m.new_cache()
    with kernels.configured(activations=mode):
        if n_prompt:
            m.forward(np.array(ids[:n_prompt]), cache)
        steps = [m.forward(np.array([t]), cache)[0] for t in ids[n_prompt:]]
    assert (m._step is not None) == fused  # the step ran, or (the reference) it did not
    return np.array(steps), cache


def ids_for(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 512, n)


def same_cache(a, b, kv: str) -> None:
    for x, y in zip(a.layers, b.layers):
        assert x.cap == y.cap and np.array_equal(x.pos, y.pos)
        atol = (1e-4 if kv == "f32" else 2.0**-9) * max(np.abs(y.k).max(), np.abs(y.v).max())
        np.testing.assert_allclose(x.k.astype(np.float32), y.k.astype(np.float32), atol=atol, rtol=0)
        np.testing.assert_allclose(x.v.astype(np.float32), y.v.astype(np.float32), atol=atol, rtol=0)
    assert a.offset == b.offset


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_the_step_gives_the_python_layers_logits_and_cache_on_floats(store, kv):
    ids = ids_for(48, 1)
    for n_prompt in (0, 9):  # from position 0, and after a prompt; 48 positions wrap the 32-row ring
        got, got_cache = decode(store, kv, "f32", ids, n_prompt)
        want, want_cache = decode(store, kv, "f32", ids, n_prompt, fused=False)
        assert worst(got, want) <= (TOL if kv == "f32" else TOL_F16), f"{kv} after {n_prompt}"
        same_cache(got_cache, want_cache, kv)
        assert got_cache.layers[0].window and got_cache.layers[0].pos.min() > 0  # the ring wrapped


def test_the_step_keeps_going_as_a_full_layers_cache_grows(store):
    ids = ids_for(262, 2)
    got, cache = decode(store, "f16", "f32", ids, 252)  # positions 252 .. 261
    want, want_cache = decode(store, "f16", "f32", ids, 252, fused=False)
    assert cache.layers[1].window is None and cache.layers[1].cap > 256  # grown past 256 rows mid-decode
    assert worst(got, want) <= TOL_F16
    same_cache(cache, want_cache, "f16")


@pytest.mark.parametrize("mode", ["experts", "decode"])
def test_the_step_takes_int8_where_the_python_layers_do(store, mode):
    # int8 activations: a last-bit difference in x may move a value across an int8 rounding boundary, so
    # the step is held to "closer to the Python layers in this mode than floats are" (test_moe_decode)
    ids = ids_for(20, 3)
    got, _ = decode(store, "f16", mode, ids, 9)
    want, _ = decode(store, "f16", mode, ids, 9, fused=False)
    exact, _ = decode(store, "f16", "f32", ids, 9, fused=False)
    assert worst(got, want) < worst(exact, want)
    if mode == "decode":  # q/k/v and o took int8 (the experts mode's step keeps them on floats)
        experts, _ = decode(store, "f16", "experts", ids, 9)
        assert not np.array_equal(got, experts)


@pytest.mark.parametrize("mode", ["decode", "f32"])
def test_the_step_is_bit_identical_at_any_thread_count(store, mode):
    ids = ids_for(40, 4)
    runs = []
    for threads in (1, 2, 3):
        m = load_model(store, kv_dtype="f16", chunk=CHUNK)
        cache = m.new_cache()
        with kernels.configured(threads=threads, activations=mode):
            m.forward(np.array(ids[:6]), cache)
            runs.append(np.array([m.forward(np.array([t]), cache)[0] for t in ids[6:]]))
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize("slots,prefetch", [(2, 0), (3, 4)])
def test_streamed_experts_give_the_resident_bits_through_the_step(store, slots, prefetch):
    ids = ids_for(30, 5)
    resident, _ = decode(store, "f16", "decode", ids, 10)
    experts = StreamingExperts(
        load_model(store).store, slots, io="threads", direct=False, prefetch=prefetch, verify="always"
    )
    try:
        streamed, _ = decode(store, "f16", "decode", ids, 10, experts=experts)
        st = experts.stats()["total"]
    finally:
        experts.close()
    assert np.array_equal(resident, streamed)
    assert st["misses"] > 0 and st["evictions"] > 0
    if prefetch:
        assert st["prefetched"] > 0  # the lookahead's compiled router named guesses


def test_the_lookahead_guesses_with_the_compiled_router_what_the_python_one_names(store):
    m = load_model(store, chunk=CHUNK)
    cache = m.new_cache()
    m.forward(np.array(ids_for(5, 6)), cache)
    step = gemma4_step.DecodeStep(m)
    h = np.random.default_rng(6).standard_normal((1, m.args.hidden_size)).astype(np.float32)
    step.prepare(h, cache, np.array([cache.offset]))
    for i in range(m.args.num_hidden_layers):
        ids, w = step.route(i)
        want_ids, want_w = m.route(i, h.copy())  # not the step's row: the Python router
        assert np.array_equal(ids, want_ids)
        np.testing.assert_allclose(w, want_w, rtol=1e-5)


def test_the_engine_decodes_through_the_step(store, monkeypatch):
    calls = []
    real = gemma4_step.DecodeStep.__call__
    monkeypatch.setattr(gemma4_step.DecodeStep, "__call__", lambda *a: calls.append(1) or real(*a))
    e = Engine.open(store, chunk=CHUNK)
    try:
        first, _ = e.prefill([int(t) for t in ids_for(5, 7)])
        assert not calls  # prompts stay on the Python layers
        e.forward([int(np.argmax(first))])
        assert calls
    finally:
        e.close()


def one_step(store, run, mode: str):
    """A build's step at position 30 (the ring wrapped) by `run(model, step, h, cache, positions)` → the
    layers' output h and the cache, against the Python layers in the same activation mode."""
    ids = ids_for(31, 8)
    m = load_model(store, kv_dtype="f16", chunk=CHUNK)
    cache = m.new_cache()
    m.forward(np.array(ids[:30]), cache)
    positions = np.array([cache.offset])
    h0 = kernels.embed_rows(m.embed, ids[30:]) * np.float32(m.embed_scale)
    m._rope_memo = {}
    with kernels.configured(activations=mode):
        got_h, got_cache = run(m, gemma4_step.DecodeStep(m), h0, copy.deepcopy(cache), positions)
    m.fused_decode = False
    m._rope_memo = {}
    with kernels.configured(activations=mode):
        want = m.layers_forward(h0, cache, positions, False)
    tol = 1e-4 if mode == "f32" else 2e-2  # other builds sum in their own lane order; int8 rounding moves
    assert np.abs(got_h - want).max() <= tol * np.abs(want).max()
    for a, b in zip(got_cache.layers, cache.layers):
        assert np.array_equal(a.pos, b.pos)
        np.testing.assert_allclose(a.k.astype(np.float32), b.k.astype(np.float32), atol=1e-3 * np.abs(b.k).max())


@pytest.mark.parametrize("mode", ["f32", "decode"])
def test_the_other_builds_step_matches_the_python_layers(other_build, store, mode, monkeypatch):
    def run(m, step, h0, cache, positions):
        monkeypatch.setattr(kernels, "_LIB", other_build)
        before = other_build.use(None, mode)
        try:
            return m.layers_forward(h0, cache, positions, False), cache  # through the step (asserted below)
        finally:
            other_build.use(*before)
            monkeypatch.undo()
            assert m._step is not None

    one_step(store, run, mode)


def neon_experts(neon, ws: list[dict], inter: int, flag: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y[k] = the gelu_tanh MLP of weights ws[k] on x (rk_moe_experts_act) by the NEON build; y as it left it."""
    rows = [[k, *(f for n in ("gate", "up", "down") for f in kernels.matrix_fields(w[n]))] for k, w in enumerate(ws)]
    desc = np.array([len(ws), len(x), inter, flag, 0, 0] + [f for r in rows for f in r], np.int64)
    blobs = [x, y] + [p for w in ws for n in ("gate", "up", "down") for p in w[n].parts.values()]
    fields = [6 + 13 * j + 1 + 4 * m + p for j in range(len(ws)) for m in range(3) for p in (1, 2, 3)]
    relocs = [(4, 0), (5, 1)] + relocations(desc, fields, blobs)
    return neon.call(["experts_act", str(kernels.EXPERT_ACTIVATIONS.index("gelu_tanh"))], desc, blobs, relocs)[1]


@pytest.mark.parametrize("mode", ["f32", "decode"])
def test_the_neon_step_matches_the_python_layers_under_qemu(neon, store, mode):
    """Every C part of the step (attention half, router, dense MLP and experts, the layer's end) by the NEON
    build under qemu-aarch64, against the Python layers on this machine."""

    def run(m, step, h0, cache, positions):
        step.prepare(h0, cache, positions)
        a = m.args
        outs = [step.h, step.ids, step.wts, step.x_mlp, step.x_moe] + [
            x for kv in cache.layers for x in (kv.k, kv.v, kv.pos)
        ]
        weights = [
            p
            for L in m.layers
            for v in L.values()
            for w in (v.values() if isinstance(v, dict) else [v])
            for p in (w.parts.values() if hasattr(w, "parts") else [w])
            if isinstance(p, np.ndarray)
        ]
        rows = [t[r] for t in step.tables.values() for r in (0, 1)]  # cos, sin: each row its own blob
        blobs = outs + [step.mlp, step.y] + rows + weights
        relocs = relocations(step.desc.array, step.desc.pointer_fields(), blobs)
        dense_flag, group_flag = step.dense_flag, step.group_flag
        for i in range(a.num_hidden_layers):
            for dst, src in zip(outs, neon.call(["gemma4_attn", str(i)], step.desc.array, blobs, relocs)):
                dst[...] = src
            got = neon.call(["gemma4_route", str(i)], step.desc.array, blobs, relocs)
            step.ids[...], step.wts[...] = got[1], got[2]
            L = m.layers[i]
            step.mlp[...] = neon_experts(neon, [L["mlp"]], a.intermediate_size, dense_flag, step.x_mlp, step.mlp)
            ws = [m.experts.store.expert(i, int(e)) for e in step.ids]
            step.y[...] = neon_experts(neon, ws, a.moe_intermediate_size, group_flag, step.x_moe, step.y)
            step.h[...] = neon.call(["gemma4_ffn_out", str(i)], step.desc.array, blobs, relocs)[0]
        return step.h.copy(), cache

    one_step(store, run, mode)
