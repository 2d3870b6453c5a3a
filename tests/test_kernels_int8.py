"""The "q8" activation path (int8 activations per block of 32, integer dot products) on every backend:
against the float64 product of the rounded activations, and as deterministic as the float path."""

from __future__ import annotations

import numpy as np
import pytest
from kernels_ref import assert_close, halfway_row, int8_activations, random_weight

from inference import kernels

INT8_KINDS = ("q4", "q4_0", "q4_1", "q8_0")
SHAPES = ((7, 64), (49, 192), (13, 2112))


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(11)


@pytest.fixture(autouse=True)
def q8_activations():
    before_threads, before = kernels.get_threads(), kernels.get_activations()
    kernels.set_activations("q8")
    yield
    kernels.set_activations(before)
    kernels.set_threads(before_threads)


@pytest.mark.parametrize("kind", INT8_KINDS)
def test_it_is_the_float64_product_of_the_rounded_activations(kind, rng):
    for out, inn in SHAPES:
        w = random_weight(kind, out, inn, rng)
        for T in (1, 6, 17, 130):
            x = rng.standard_normal((T, inn), dtype=np.float32)
            x[0, :32] = 0.0  # an all-zero block has scale 0
            x[-1] = halfway_row(inn)  # ties round away from zero
            assert_close(kernels.linear(x, w), int8_activations(x), w)


@pytest.mark.parametrize("kind", INT8_KINDS)
def test_a_row_gives_the_same_bits_alone_in_any_batch_or_thread_count(kind, rng):
    w = random_weight(kind, 203, 1088 if kind != "q4" else 1152, rng)
    x = rng.standard_normal((130, w.shape[1]), dtype=np.float32)
    kernels.set_threads(1)
    full = kernels.linear(x, w)
    for t in (0, 5, 129):
        assert np.array_equal(kernels.linear(x[t : t + 1], w)[0], full[t])
    assert np.array_equal(kernels.linear(x[3:20], w), full[3:20])
    kernels.set_threads(2)
    assert np.array_equal(kernels.linear(x, w), full)
    assert all(np.array_equal(y, full) for y in kernels.linear_many(x, [w, w]))


def test_kinds_without_an_int8_path_keep_their_float_bits(rng):
    for kind in ("f32", "f16", "q8"):
        w = random_weight(kind, 9, 96, rng)
        x = rng.standard_normal((5, 96), dtype=np.float32)
        q8 = kernels.linear(x, w)
        kernels.set_activations("f32")
        assert np.array_equal(q8, kernels.linear(x, w))
        kernels.set_activations("q8")


def test_a_call_mixing_both_orders_of_nibbles_gives_each_its_own_bits(rng):
    ws = [random_weight(k, 11, 128, rng) for k in ("q4", "q4_0", "f16", "q8_0")]
    x = rng.standard_normal((7, 128), dtype=np.float32)
    for w, y in zip(ws, kernels.linear_many(x, ws)):
        assert np.array_equal(y, kernels.linear(x, w))


def test_an_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="f32, q8"):
        kernels.set_activations("int4")


@pytest.mark.parametrize("kind", INT8_KINDS)
def test_the_other_c_backends_match_the_int8_reference(other_build, kind, rng):
    other_build.set_threads(2)
    out, inn = SHAPES[-1]
    w = random_weight(kind, out, inn, rng)
    x = rng.standard_normal((130, inn), dtype=np.float32)
    x[1] = halfway_row(inn)
    other_build.set_activations("q8")  # a shared build: back to f32 before any assertion
    try:
        full, last = other_build.linear(x, w), other_build.linear(x[129:], w)
    finally:
        other_build.set_activations("f32")
    assert_close(full, int8_activations(x), w)
    assert np.array_equal(last[0], full[129])


@pytest.mark.parametrize("kind", INT8_KINDS)
@pytest.mark.parametrize("build", ["neon", "neon_v80"])
def test_the_neon_int8_path_matches_the_reference_under_qemu(build, kind, rng, request):
    neon = request.getfixturevalue(build)
    out, inn = SHAPES[-1]
    w = random_weight(kind, out, inn, rng)
    x = rng.standard_normal((130, inn), dtype=np.float32)
    x[1] = halfway_row(inn)
    full = neon.linear(x, w, threads=2, activations="q8")
    assert_close(full, int8_activations(x), w)
    assert np.array_equal(neon.linear(x, w, threads=1, activations="q8"), full)
    assert np.array_equal(neon.linear(x[129:], w, activations="q8")[0], full[129])


@pytest.mark.parametrize("mode", ["f32", "q8", "experts"])
def test_a_grouped_call_gives_each_matrix_the_bits_of_its_own_call(mode, rng):
    kernels.set_activations(mode)
    kinds = ("q4", "q4_0", "q8_0", "f16", "q4_1") * 7  # more than one job's worth of matrices
    ws = [random_weight(k, 5 + j, 128, rng) for j, k in enumerate(kinds)]
    xs = [rng.standard_normal((t, 128), dtype=np.float32) for t in (1, 0, 3, 130, 6) * 7]
    ys = kernels.linear_grouped(list(zip(xs, ws)))
    kernels.set_activations("f32" if mode == "f32" else "q8")  # what the grouped call used
    for x, w, y in zip(xs, ws, ys):
        assert y.shape == (len(x), w.shape[0]) and np.array_equal(y, kernels.linear(x, w))


def test_matrices_sharing_activations_share_one_preparation_and_keep_their_bits(rng):
    x = rng.standard_normal((1, 128), dtype=np.float32)
    ws = [random_weight(k, 9, 128, rng) for k in ("q4", "q4", "q4_0", "q8_0", "q4")]
    ys = kernels.linear_grouped([(x, w) for w in ws])  # one x object: prepared once per family
    for w, y in zip(ws, ys):
        assert np.array_equal(y, kernels.linear(x, w))
