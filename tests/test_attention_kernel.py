"""The attention kernel against a plain numpy softmax(q k^T) v, and its determinism."""

from __future__ import annotations

import numpy as np
import pytest

from inference import kernels
from inference.models.base import LayerKV, attention


def reference(q, k, v, kpos, qpos, window, scale):
    """Grouped-query attention in float64, straight from the definition."""
    T, H, D = q.shape
    g = H // k.shape[0]
    out = np.zeros((T, H, v.shape[2]))
    for t in range(T):
        seen = (kpos >= 0) & (kpos <= qpos[t])
        if window:
            seen &= kpos > qpos[t] - window
        for h in range(H):
            s = k[h // g][seen].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = p @ v[h // g][seen] / p.sum()
    return out


@pytest.mark.parametrize(
    "T,H,KV,D,Dv,window",
    [
        (1, 16, 8, 256, 256, 1024),
        (1, 16, 2, 512, 512, None),
        (7, 4, 4, 64, 64, None),
        (21, 6, 2, 40, 24, 5),
        (128, 8, 1, 64, 64, 32),
    ],
)
def test_attention_matches_the_definition(T, H, KV, D, Dv, window):
    rng = np.random.default_rng(T * 7 + H)
    S = 300
    k = rng.standard_normal((KV, S, D), np.float32)
    v = rng.standard_normal((KV, S, Dv), np.float32)
    kpos = rng.permutation(S).astype(np.int64) - 40  # shuffled rows (a ring), some empty (−1 and below)
    kpos[kpos < 0] = -1
    qpos = np.sort(rng.choice(np.arange(100, 260), T, replace=False)).astype(np.int64)
    q = rng.standard_normal((T, H, D), np.float32)
    got = kernels.attention(q, k, v, kpos, qpos, window, 0.125)
    want = reference(q, k, v, kpos, qpos, window, 0.125)
    assert got.shape == (T, H, Dv) and got.dtype == np.float32
    assert np.max(np.abs(got - want)) < 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("D", [256, 40])
def test_float16_keys_and_values_give_the_attention_of_their_values(D):
    rng = np.random.default_rng(D)
    T, H, KV, S = 5, 8, 2, 200
    k = rng.standard_normal((KV, S, D)).astype(np.float16)
    v = rng.standard_normal((KV, S, D)).astype(np.float16)
    q = rng.standard_normal((T, H, D), np.float32)
    kpos, qpos = np.arange(S, dtype=np.int64), np.arange(S - T, S, dtype=np.int64)
    got = kernels.attention(q, k, v, kpos, qpos, 64, D**-0.5)
    want = reference(q, k.astype(np.float32), v.astype(np.float32), kpos, qpos, 64, D**-0.5)
    assert np.max(np.abs(got - want)) < 1e-5 * max(1.0, np.abs(want).max())
    kv = LayerKV(KV, D, None, 8, dtype=np.float16)
    kv.append(k.transpose(1, 0, 2).astype(np.float32), v.transpose(1, 0, 2).astype(np.float32), kpos)
    assert kv.k.dtype == np.float16 and np.array_equal(
        attention(q, kv, qpos, D**-0.5), kernels.attention(q, k, v, kpos, qpos, None, D**-0.5)
    )


def test_strided_heads_of_a_growing_cache_are_read_in_place():
    rng = np.random.default_rng(1)
    big = rng.standard_normal((2, 50, 16), np.float32)
    q = rng.standard_normal((3, 4, 16), np.float32)
    pos = np.arange(30, dtype=np.int64)
    got = kernels.attention(q, big[:, :30], big[:, :30], pos, np.array([27, 28, 29]), None, 0.25)
    want = kernels.attention(q, big[:, :30].copy(), big[:, :30].copy(), pos, np.array([27, 28, 29]), None, 0.25)
    assert np.array_equal(got, want)


def test_a_row_is_bit_identical_whatever_the_batch_and_the_threads():
    rng = np.random.default_rng(2)
    T, H, KV, D = 37, 8, 2, 64
    k = rng.standard_normal((KV, 64, D), np.float32)
    v = rng.standard_normal((KV, 64, D), np.float32)
    q = rng.standard_normal((T, H, D), np.float32)
    kpos, qpos = np.arange(64, dtype=np.int64), np.arange(27, 64, dtype=np.int64)
    threads = kernels.get_threads()
    try:
        kernels.set_threads(2)
        full = kernels.attention(q, k, v, kpos, qpos, 16, 0.125)
        kernels.set_threads(1)
        one = kernels.attention(q, k, v, kpos, qpos, 16, 0.125)
        rows = [kernels.attention(q[t : t + 1], k, v, kpos, qpos[t : t + 1], 16, 0.125) for t in range(T)]
    finally:
        kernels.set_threads(threads)
    assert np.array_equal(full, one)
    assert np.array_equal(full, np.concatenate(rows))


def test_layer_kv_attention_on_a_ring_sees_only_the_window():
    rng = np.random.default_rng(3)
    kv = LayerKV(2, 8, window=4, chunk=2)  # a ring of 6 rows
    ks = rng.standard_normal((10, 2, 8), np.float32)
    vs = rng.standard_normal((10, 2, 8), np.float32)
    for p in range(0, 10, 2):
        kv.append(ks[p : p + 2], vs[p : p + 2], np.arange(p, p + 2))
    q = rng.standard_normal((1, 4, 8), np.float32)
    got = attention(q, kv, np.array([9]), 0.5)
    want = reference(q, ks[6:10].transpose(1, 0, 2), vs[6:10].transpose(1, 0, 2), np.arange(6, 10), [9], None, 0.5)
    assert np.max(np.abs(got - want)) < 1e-5


def test_bad_layouts_are_refused_with_the_reason():
    q = np.zeros((1, 4, 8), np.float32)
    k = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="shapes do not fit"):
        kernels.attention(q, k, k, np.arange(4), np.array([3]), None, 1.0)
    with pytest.raises(ValueError, match="must both be float32 or both float16"):
        kernels.attention(q, k.astype(np.float16), k, np.arange(5), np.array([3]), None, 1.0)
    with pytest.raises(ValueError, match="contiguous rows"):
        kernels.attention(q, k[:, :, ::2].repeat(2, axis=2)[:, ::2], k[:, ::2], np.arange(3), np.array([2]), None, 1.0)


def test_a_half_precision_kv_cache_moves_the_logits_little(tmp_path):
    """The engine's default f16 KV cache against f32 on a small random dense model (llama; a random MoE
    is chaotic: a near-tie in a router flips an expert) over 60 positions: well under 1% of the range."""
    from inference.convert import convert
    from inference.engine import Engine
    from parity import build_checkpoint
    from test_parity import llama

    cls, cfg = llama()
    store = convert(build_checkpoint(cls, cfg, tmp_path / "hf", seed=0), tmp_path / "s", "f16", progress=False)
    ids = np.random.default_rng(4).integers(0, 256, 60)
    half, full = Engine.open(store), Engine.open(store, kv_dtype="f32")
    a = [half.forward(ids[:20], last_only=False)] + [half.forward([t]) for t in ids[20:]]
    b = [full.forward(ids[:20], last_only=False)] + [full.forward([t]) for t in ids[20:]]
    a, b = np.concatenate(a), np.concatenate(b)
    assert half.cache.layers[0].k.dtype == np.float16 and full.cache.layers[0].k.dtype == np.float32
    assert np.max(np.abs(a - b)) < 0.005 * (b.max() - b.min())
