"""The compiled kernels against the float64 reference, their determinism, and the quantizers' bounds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from kernels_ref import assert_close, random_weight

from inference import kernels
from inference.kernels._lib import KernelLib
from inference.quant import KINDS, QTensor, dequantize, quantize

BATCHES = (1, 3, 17, 128, 130)


def shapes_for(kind: str) -> list[tuple[int, int]]:
    """Odd output counts; inputs at the kind's granularity, one past a K block (1024) for prefill."""
    shapes = [(7, 64), (49, 192), (13, 2112)]
    if kind in ("f32", "f16", "q8"):  # no grouping: ragged input sizes reach the scalar tail
        shapes += [(5, 1), (6, 13), (9, 1100)]
    return shapes


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(7)


@pytest.fixture(autouse=True)
def restore_threads():
    before, acts = kernels.get_threads(), kernels.get_activations()
    kernels.set_activations("f32")  # the float path; test_kernels_int8.py checks the int8 one
    yield
    kernels.set_threads(before)
    kernels.set_activations(acts)


@pytest.mark.parametrize("kind", KINDS)
def test_it_matches_the_float64_reference(kind, rng):
    for out, inn in shapes_for(kind):
        w = random_weight(kind, out, inn, rng)
        for T in BATCHES:
            x = rng.standard_normal((T, inn), dtype=np.float32)
            y = kernels.linear(x, w)
            assert y.shape == (T, out) and y.dtype == np.float32
            assert_close(y, x, w)


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_gives_the_same_bits_alone_or_in_any_batch(kind, rng):
    for out, inn in shapes_for(kind):
        w = random_weight(kind, out, inn, rng)
        x = rng.standard_normal((130, inn), dtype=np.float32)
        full = kernels.linear(x, w)
        for t in (0, 5, 127, 129):
            assert np.array_equal(kernels.linear(x[t : t + 1], w)[0], full[t])
        for lo, hi in ((0, 3), (3, 20), (7, 135)):  # tiles fall at other offsets in a sub-batch
            assert np.array_equal(kernels.linear(x[lo:hi], w), full[lo:hi])


@pytest.mark.parametrize("kind", KINDS)
def test_the_thread_count_does_not_change_a_bit(kind, rng):
    w = random_weight(kind, 203, 1088, rng)
    for T in (1, 130):
        x = rng.standard_normal((T, 1088), dtype=np.float32)
        kernels.set_threads(1)
        one = kernels.linear(x, w)
        for n in (2, 3):
            kernels.set_threads(n)
            assert np.array_equal(kernels.linear(x, w), one)


def test_concurrent_calls_from_python_threads_agree_with_serial_ones(rng):
    from concurrent.futures import ThreadPoolExecutor

    ws = [random_weight(kind, 96, 512, rng) for kind in ("q4", "q8", "q4_0", "f16")]
    x = rng.standard_normal((9, 512), dtype=np.float32)
    serial = [kernels.linear(x, w) for w in ws]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            results = list(pool.map(lambda w: kernels.linear(x, w), ws))
            assert all(np.array_equal(a, b) for a, b in zip(results, serial))


@pytest.mark.parametrize("threads", (1, 2))
def test_linear_many_gives_each_matrix_the_bits_of_linear(threads, rng):
    kernels.set_threads(threads)
    ws = [
        random_weight(kind, out, 576, rng)
        for kind, out in (("q4_1", 576), ("q4_1", 192), ("q4_0", 40), ("q4", 96), ("q8_0", 200), ("f16", 24), ("q8", 8))
    ]
    for T in (1, 3, 130):
        x = rng.standard_normal((T, 576), dtype=np.float32)
        ys = kernels.linear_many(x, ws)
        assert [y.shape for y in ys] == [(T, w.shape[0]) for w in ws]
        for y, w in zip(ys, ws):
            assert np.array_equal(y, kernels.linear(x, w))
    assert kernels.linear_many(x[0], ws[:2])[1].shape == (192,)


def test_linear_many_rejects_matrices_that_do_not_fit_x(rng):
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match=r"input size 64"):
        kernels.linear_many(x, [random_weight("q4_1", 8, 64, rng), random_weight("q4_1", 8, 96, rng)])
    with pytest.raises(ValueError, match=r"needs \[\.\.\., 32\]"):
        kernels.linear_many(np.zeros((2, 64), np.float32), [random_weight("q8_0", 8, 32, rng)])
    with pytest.raises(ValueError, match="1 to 16 matrices"):
        kernels.linear_many(x, [])


def test_pool_stats_count_the_multi_threaded_calls(rng):
    w = random_weight("q4_1", 512, 576, rng)
    x = rng.standard_normal((1, 576), dtype=np.float32)
    kernels.set_threads(2)
    before = kernels.pool_stats()
    kernels.linear(x, w)
    after = kernels.pool_stats()
    assert set(after) == {"shared", "solo", "stalls", "stall_ns", "tasks", "helper_tasks"}
    assert after["shared"] + after["solo"] == before["shared"] + before["solo"] + 1


def test_a_forked_child_computes_without_the_parents_threads(rng):
    import multiprocessing

    w = random_weight("q4_1", 512, 576, rng)
    x = rng.standard_normal((1, 576), dtype=np.float32)
    kernels.set_threads(2)
    expected = kernels.linear(x, w)  # starts the helper threads, which a fork does not copy
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply(kernels.linear, (x, w))
    assert np.array_equal(got, expected)


def test_it_multiplies_read_only_memmap_views_in_place(tmp_path, rng):
    experts = [random_weight("q4", 48, 128, rng) for _ in range(3)]
    path = tmp_path / "experts.bin"
    stacked = {name: np.stack([e.parts[name] for e in experts]) for name in ("q", "scales", "biases")}
    offsets, pos = {}, 0
    with path.open("wb") as f:
        for name, arr in stacked.items():
            offsets[name] = pos
            pos += f.write(arr.tobytes())
    x = rng.standard_normal((5, 128), dtype=np.float32)
    for e, expected in enumerate(experts):
        parts = {name: np.memmap(path, arr.dtype, "r", offsets[name], arr.shape)[e] for name, arr in stacked.items()}
        assert not parts["q"].flags.writeable
        y = kernels.linear(x, QTensor("q4", (48, 128), parts))
        assert np.array_equal(y, kernels.linear(x, expected))


def test_it_takes_any_leading_dims_and_converts_x_to_float32(rng):
    w = random_weight("q8", 11, 64, rng)
    x = rng.standard_normal((2, 3, 64))
    y = kernels.linear(x, w)
    assert y.shape == (2, 3, 11)
    assert np.array_equal(y.reshape(6, 11), kernels.linear(x.reshape(6, 64).astype(np.float32), w))
    assert kernels.linear(x[0, 0], w).shape == (11,)


def test_it_rejects_a_mismatched_x(rng):
    with pytest.raises(ValueError, match=r"needs \[\.\.\., 64\]"):
        kernels.linear(np.zeros((2, 32), np.float32), random_weight("q4", 8, 64, rng))


def test_it_rejects_parts_laid_out_wrong(rng):
    w = random_weight("q8", 8, 64, rng)
    strided = QTensor("q8", (8, 32), {"q": w.parts["q"][:, ::2], "scales": w.parts["scales"]})
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.linear(np.zeros((1, 32), np.float32), strided)
    wrong_dtype = QTensor("q8", (8, 64), {"q": w.parts["q"].view(np.uint8), "scales": w.parts["scales"]})
    with pytest.raises(ValueError, match="int8"):
        kernels.linear(np.zeros((1, 64), np.float32), wrong_dtype)
    short = QTensor("q8", (8, 64), {"q": w.parts["q"][:7], "scales": w.parts["scales"]})
    with pytest.raises(ValueError, match="512 elements"):
        kernels.linear_many(np.zeros((1, 64), np.float32), [w, short])


def test_thread_count_round_trips_and_must_be_positive():
    kernels.set_threads(3)
    assert kernels.get_threads() == 3
    with pytest.raises(ValueError, match="positive"):
        kernels.set_threads(0)


def test_an_engines_settings_are_its_threads_own_and_another_thread_keeps_the_default(rng):
    import threading

    w = random_weight("q4", 64, 128, rng)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    default = (kernels.get_threads(), kernels.get_activations())
    inside, other, barrier = {}, {}, threading.Barrier(2)

    def engine_thread():
        with kernels.configured(1, "q8"):
            with kernels.configured(2, "f32"):  # nested: restored on the way out
                assert (kernels.get_threads(), kernels.get_activations()) == (2, "f32")
            inside["settings"] = (kernels.get_threads(), kernels.get_activations())
            inside["y"] = kernels.linear(x, w)
            barrier.wait()  # the other thread looks while these settings are in force
            barrier.wait()
        inside["after"] = (kernels.get_threads(), kernels.get_activations())

    def other_thread():
        barrier.wait()
        other["settings"] = (kernels.get_threads(), kernels.get_activations())
        barrier.wait()

    ts = [threading.Thread(target=engine_thread), threading.Thread(target=other_thread)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert inside["settings"] == (1, "q8") and other["settings"] == default and inside["after"] == default
    with kernels.configured(None, "q8"):
        np.testing.assert_array_equal(kernels.linear(x, w), inside["y"])  # q8 from any thread, the same bits
    with pytest.raises(ValueError, match="positive"):
        with kernels.configured(0, None):
            pass
    with pytest.raises(ValueError, match="choose one of"):
        with kernels.configured(None, "int3"):
            pass


def test_a_missing_build_is_an_import_error_that_says_how_to_build(tmp_path):
    with pytest.raises(ImportError, match=r"pip install -e \."):
        KernelLib(tmp_path / "absent.so")


@pytest.mark.parametrize("kind", KINDS)
def test_embed_rows_are_the_dequantized_rows(kind, rng):
    w = random_weight(kind, 40, 64, rng)
    ids = np.array([3, 0, 39, 3])
    assert np.array_equal(kernels.embed_rows(w, ids), dequantize(w)[ids])


# error bound per element, in units of the element's quantization step
@pytest.mark.parametrize(
    "kind, steps",
    [
        ("q8", 0.5),
        ("q4", 0.5),
        ("q4_1", 0.5),
        ("q8_0", 0.5),
        ("q4_0", 1.0),
    ],  # the largest magnitude maps to -8, so the opposite extreme clips at +7
)
def test_quantizers_round_trip_within_their_step(kind, steps, rng):
    w = (rng.standard_normal((16, 256)) * rng.uniform(0.01, 3.0, (16, 1))).astype(np.float32)
    w[3] = 0.0
    w[5, :64] = 0.0
    q = quantize(w, kind)
    err = np.abs(dequantize(q) - w)
    if kind == "q8":
        step = np.broadcast_to(q.parts["scales"][:, None], w.shape)
    elif kind == "q4":
        step = np.repeat(q.parts["scales"].astype(np.float32), 64, axis=1)
    else:
        blocks = q.parts["blocks"].reshape(16, 8, -1)
        step = np.repeat(np.abs(blocks[..., :2].copy().view(np.float16).astype(np.float32))[..., 0], 32, axis=1)
    assert np.all(err <= steps * step * (1 + 1e-3) + 1e-12)
    assert np.all(dequantize(q)[3] == 0.0) and np.all(dequantize(q)[5, :64] == 0.0)


def test_f16_round_trip_is_half_precision(rng):
    w = rng.standard_normal((4, 64)).astype(np.float32)
    assert np.all(np.abs(dequantize(quantize(w, "f16")) - w) <= np.abs(w) * 2.0**-11)


# ------------------------------------------------------------------ the other backends (conftest.py builds them)


@pytest.mark.parametrize("kind", KINDS)
def test_the_other_c_backends_match_the_reference(other_build, kind, rng):
    other_build.set_threads(2)
    for out, inn in shapes_for(kind):
        w = random_weight(kind, out, inn, rng)
        x = rng.standard_normal((130, inn), dtype=np.float32)
        full = other_build.linear(x, w)
        assert_close(full, x, w)
        assert np.array_equal(other_build.linear(x[129:], w)[0], full[129])
        assert all(np.array_equal(y, full) for y in other_build.linear_many(x, [w, w]))


@pytest.mark.parametrize("kind", KINDS)
def test_the_neon_backend_matches_the_reference_under_qemu(neon, kind, rng):
    assert neon.backend == "neon"
    out, inn = shapes_for(kind)[-1]
    w = random_weight(kind, out, inn, rng)
    x = rng.standard_normal((130, inn), dtype=np.float32)
    full = neon.linear(x, w, threads=2)
    assert_close(full, x, w)
    assert np.array_equal(neon.linear(x, w, threads=1), full)
    assert np.array_equal(neon.linear(x[129:], w)[0], full[129])


def test_rkmojo_kernels_picks_the_build_and_names_the_choices():
    import platform
    import subprocess
    import sys

    def backend(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "from inference import kernels; print(kernels.BACKEND)"],
            env={**os.environ, "RKMOJO_KERNELS": name},
            capture_output=True,
            text=True,
        )

    bad = backend("sse9")
    assert bad.returncode != 0 and "RKMOJO_KERNELS='sse9'" in bad.stderr
    assert "one of native, avx512, avx2, scalar" in bad.stderr
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert backend("scalar").stdout.strip() == "scalar"
        assert backend("avx2").stdout.strip() in ("avx2", "scalar")  # scalar where the CPU lacks AVX2
