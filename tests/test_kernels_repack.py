"""Repacked q4, q4_1 and q8_0 ("q4r", "q4_1r", "q8_0r", rows in lanes): the int8 kernel against the row-major one and the
float64 reference on every backend, row counts that do not fill a panel, thread counts, every activation
row with the bits it has alone, float calls with the store matrix's own bits, and experts repacked where
they land."""

from __future__ import annotations

import numpy as np
import pytest
from kernels_ref import assert_close, halfway_row, int8_activations, random_weight

from inference import kernels
from inference.kernels import repack
from inference.quant import (
    REPACKED_Q4,
    REPACKED_Q4_1,
    REPACKED_Q8_0,
    QTensor,
    dequantize,
    part_layout,
    repack_q4,
    repack_q4_1,
    repack_q8_0,
    unrepack,
    unrepack_q4,
)

# (out, in): ragged row counts (not multiples of 16), a lone row, whole panels, odd group counts
SHAPES = ((1, 64), (7, 192), (16, 128), (33, 1152), (203, 2112), (512, 2048))
# the kinds with a repacked layout: q4 (groups of 64, two blocks), q4_1 and q8_0 (GGUF blocks of 32, one per group)
REPACK = {"q4": repack_q4, "q4_1": repack_q4_1, "q8_0": repack_q8_0}
REPACKED_KIND = {"q4": REPACKED_Q4, "q4_1": REPACKED_Q4_1, "q8_0": REPACKED_Q8_0}
KINDS = pytest.mark.parametrize("kind", list(REPACK))


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(16)


@pytest.fixture(autouse=True)
def restore():
    before_threads, before = kernels.get_threads(), kernels.get_activations()
    yield
    kernels.set_activations(before)
    kernels.set_threads(before_threads)


def rows_of(inn, rng):
    """A decode row: random, with a zero block (scale 0)."""
    x = rng.standard_normal((1, inn), dtype=np.float32)
    x[0, :32] = 0.0
    return x


def close_to_row_major(y_rp, y_old, x, w, rel=1e-5):
    """The repacked result within `rel` · |x| @ |W|.T of the row-major one (the same int8 products summed
    in another order)."""
    scale = np.abs(x).astype(np.float64) @ np.abs(dequantize(w).astype(np.float64)).T + 1e-30
    err = (np.abs(y_rp.astype(np.float64) - y_old) / scale).max()
    assert err <= rel, f"{w.shape}: repacked vs row-major {err:.2e} of |x||W|"


@KINDS
def test_repacking_is_a_layout_only(rng, kind):
    for out, inn in SHAPES + ((5, 96),) * (kind != "q4"):
        w = random_weight(kind, out, inn, rng)
        r = REPACK[kind](w)
        assert r.kind == REPACKED_KIND[kind] and r.shape == w.shape
        for name, (dt, shp) in part_layout(r.kind, w.shape).items():
            assert r.parts[name].dtype == dt and r.parts[name].shape == shp
            assert not any(np.shares_memory(r.parts[name], p) for p in w.parts.values())
        back = unrepack(r)
        assert back.kind == kind and all(np.array_equal(back.parts[n], w.parts[n]) for n in w.parts)
        assert np.array_equal(dequantize(r), dequantize(w))
        first_last = w.rows([0, out - 1]).parts
        assert all(np.array_equal(r.rows([0, out - 1]).parts[n], first_last[n]) for n in first_last)
    if kind == "q4":
        assert unrepack_q4(REPACK[kind](w)).kind == "q4"


def test_layout_puts_16_rows_of_a_4_byte_piece_in_one_line(rng):
    w = random_weight("q4", 16, 128, rng)
    q = repack_q4(w).parts["q"].reshape(-1)
    for g, c, r in ((0, 0, 0), (0, 3, 5), (1, 7, 15)):
        line = q[512 * g + 64 * c : 512 * g + 64 * c + 64]
        assert np.array_equal(line[4 * r : 4 * r + 4], w.parts["q"][r, 32 * g + 4 * c : 32 * g + 4 * c + 4])


def test_q4_1_layout_is_q4s_with_a_group_of_one_block(rng):
    """Block b's line c holds nibble bytes 4c..4c+3 of each of the 16 rows; d and m of 16 rows side by side."""
    w = random_weight("q4_1", 16, 128, rng)
    r = repack_q4_1(w)
    q, blk = r.parts["q"].reshape(-1), w.parts["blocks"].reshape(16, 4, 20)
    for b, c, row in ((0, 0, 0), (1, 3, 5), (3, 2, 15)):
        line = q[256 * b + 64 * c : 256 * b + 64 * c + 64]
        assert np.array_equal(line[4 * row : 4 * row + 4], blk[row, b, 4 + 4 * c : 8 + 4 * c])
    d = r.parts["scales"].reshape(-1)
    assert np.array_equal(d[16 * 2 : 16 * 3].view(np.uint8).reshape(16, 2), blk[:, 2, 0:2])


def test_q8_0_layout_has_8_lines_per_block_and_the_rows_weight_sums(rng):
    """Block b's line c holds int8 bytes 4c..4c+3 of each of the 16 rows; d and the block's weight sum of 16
    rows side by side; rows past `out` are zeros (sum 0)."""
    w = random_weight("q8_0", 13, 128, rng)
    r = repack_q8_0(w)
    q, blk = r.parts["q"].reshape(-1), w.parts["blocks"].reshape(13, 4, 34)
    for b, c, row in ((0, 0, 0), (1, 7, 5), (3, 4, 12)):
        line = q[512 * b + 64 * c : 512 * b + 64 * c + 64]
        assert np.array_equal(line[4 * row : 4 * row + 4].view(np.uint8), blk[row, b, 2 + 4 * c : 6 + 4 * c])
    sums = r.parts["sums"].reshape(-1)
    want = blk[:, 2, 2:].view(np.int8).astype(np.int64).sum(axis=1)
    assert np.array_equal(sums[16 * 2 : 16 * 2 + 13], want) and not sums[16 * 2 + 13 : 16 * 3].any()


def q8_0_extremes(out: int, inn: int, rng) -> QTensor:
    """q8_0 blocks whose weights are all -128, all 127 or random in [-128, 127] (a GGUF file may hold -128,
    which llama.cpp's quantizer never writes), d 1: the sums at both ends of their range."""
    blocks = np.zeros((out, inn // 32, 34), np.uint8)
    blocks[..., :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    q = rng.integers(-128, 128, (out, inn // 32, 32), dtype=np.int64)
    q[0], q[1] = -128, 127
    blocks[..., 2:] = q.astype(np.int8).view(np.uint8)
    return QTensor("q8_0", (out, inn), {"blocks": blocks.reshape(out, -1)})


def test_q8_0_weights_at_the_ends_of_int8_stay_exact(rng):
    """-128 weights (whose |w| is 128 in AVX2's sign trick) and 127 ones against activations at +-127: the
    int8 dots are exact integers, so the result is the float64 product of the same int8 operands."""
    kernels.set_activations("q8")
    w = q8_0_extremes(20, 256, rng)
    for x in (np.full((1, 256), 1.0, np.float32), np.full((1, 256), -1.0, np.float32), rows_of(256, rng)):
        y = kernels.linear(x, repack_q8_0(w))
        assert_close(y, int8_activations(x), w)
        close_to_row_major(y, kernels.linear(x, w), x, w)
    ones = kernels.linear(np.ones((1, 256), np.float32), repack_q8_0(w))
    assert ones[0, 0] == -128 * 256 and ones[0, 1] == 127 * 256


@KINDS
@pytest.mark.parametrize("shape", SHAPES)
def test_one_int8_row_matches_the_row_major_kernel_and_the_reference(shape, rng, kind):
    out, inn = shape
    w = random_weight(kind, out, inn, rng)
    r = REPACK[kind](w)
    kernels.set_activations("q8")
    for x in (rows_of(inn, rng), halfway_row(inn)[None]):
        y_rp, y_old = kernels.linear(x, r), kernels.linear(x, w)
        assert y_rp.shape == (1, out)
        assert_close(y_rp, int8_activations(x), w)
        close_to_row_major(y_rp, y_old, x, w)


@KINDS
def test_the_thread_count_and_call_company_do_not_change_the_bits(rng, kind):
    w = random_weight(kind, 203, 1152, rng)
    r = REPACK[kind](w)
    others = [random_weight(k, 37, 1152, rng) for k in (kind, "q8_0", "f16")]
    x = rng.standard_normal((1, 1152), dtype=np.float32)
    kernels.set_activations("q8")
    kernels.set_threads(1)
    alone = kernels.linear(x, r)
    for n in (2, 3, 5):
        kernels.set_threads(n)
        assert np.array_equal(kernels.linear(x, r), alone)
        ys = kernels.linear_many(x, [others[0], r, others[1], r, others[2]])
        assert np.array_equal(ys[1], alone) and np.array_equal(ys[3], alone)
        assert np.array_equal(ys[0], kernels.linear(x, others[0]))


@KINDS
def test_float_calls_on_a_repacked_matrix_give_the_store_matrix_bits(rng, kind):
    """Float activations (prompts in decode mode, one float row) unpack the panels and run the row-major kernels."""
    kernels.set_activations("f32")
    for out, inn in ((7, 192), (203, 2112)):
        w = random_weight(kind, out, inn, rng)
        r = REPACK[kind](w)
        for T in (1, 6, 17, 130):
            x = rng.standard_normal((T, inn), dtype=np.float32)
            for threads in (1, 2):
                kernels.set_threads(threads)
                assert np.array_equal(kernels.linear(x, r), kernels.linear(x, w)), (out, inn, T, threads)


def each_row_alone(lin, x, w):
    return np.concatenate([lin(x[t : t + 1], w) for t in range(len(x))])


@KINDS
def test_int8_rows_on_a_repacked_matrix_have_the_bits_they_have_alone(rng, kind):
    """Several activation rows (prompts, an expert's rows) run in lanes too, RP_T of them per pass over a
    panel: each row's sums are its one-row sums, whatever T, the thread count or the call."""
    kernels.set_activations("q8")
    for out, inn in ((7, 192), (203, 2112)):
        w = random_weight(kind, out, inn, rng)
        r = REPACK[kind](w)
        for T in (2, 3, 5, 6, 130):
            x = rng.standard_normal((T, inn), dtype=np.float32)
            alone = each_row_alone(kernels.linear, x, r)
            for threads in (1, 2):
                kernels.set_threads(threads)
                assert np.array_equal(kernels.linear(x, r), alone), (out, inn, T, threads)
            close_to_row_major(alone, kernels.linear(x, w), x, w)


def test_the_compiled_decode_step_uses_repacked_matrices():
    """rkdecode.c passes the kind code on: a q4r matrix is a valid decode matrix."""
    w = repack_q4(random_weight("q4", 20, 128, np.random.default_rng(1)))
    assert kernels.matrix_fields(w)[0] == 3 | 32
    w = repack_q4_1(random_weight("q4_1", 20, 128, np.random.default_rng(1)))
    assert kernels.matrix_fields(w)[0] == 5 | 32
    w = repack_q8_0(random_weight("q8_0", 20, 128, np.random.default_rng(1)))
    assert kernels.matrix_fields(w)[0] == 6 | 32


def test_grouped_calls_take_repacked_experts(rng):
    """An MoE layer's experts run repacked in grouped calls (int8 in every mode but f32): each matrix's
    result is the one `linear` gives it, whichever matrices share the call."""
    kernels.set_activations("experts")
    ws = [repack_q4(random_weight("q4", out, 128, rng)) for out in (16, 48, 16)]
    xs = [rng.standard_normal((t, 128), dtype=np.float32) for t in (1, 5, 3)]
    ys = kernels.linear_grouped(list(zip(xs, ws)))
    kernels.set_activations("q8")
    for x, w, y in zip(xs, ws, ys):
        assert np.array_equal(y, kernels.linear(x, w))


def test_the_compiled_repacking_is_quant_repack_q4(rng):
    for out, inn in ((16, 64), (48, 1152), (512, 2048)):
        w = random_weight("q4", out, inn, rng)
        want = repack_q4(w)
        got = kernels.repack_q4(w)
        own = w.__class__(w.kind, w.shape, {n: p.copy() for n, p in w.parts.items()})
        in_place = kernels.repack_q4(own, in_place=True)
        for r in (got, in_place):
            assert r.kind == REPACKED_Q4
            assert all(np.array_equal(r.parts[n], want.parts[n]) for n in want.parts)
        assert np.shares_memory(in_place.parts["q"], own.parts["q"])
    with pytest.raises(ValueError, match="rows a multiple of 16"):
        kernels.repack_q4(random_weight("q4", 20, 64, rng))
    with pytest.raises(ValueError, match="writable"):
        ro = random_weight("q4", 16, 64, rng)
        ro.parts["q"].flags.writeable = False
        kernels.repack_q4(ro, in_place=True)


@KINDS
def test_the_other_c_backends_match(other_build, rng, kind):
    other_build.set_threads(2)
    out, inn = 203, 2112
    w = random_weight(kind, out, inn, rng)
    r = REPACK[kind](w)
    x = rng.standard_normal((1, inn), dtype=np.float32)
    xs = rng.standard_normal((9, inn), dtype=np.float32)
    other_build.set_activations("q8")  # a shared build: back to f32 before any assertion
    try:
        y_rp, y_old, prompt = other_build.linear(x, r), other_build.linear(x, w), other_build.linear(xs, r)
        prompt_alone = each_row_alone(other_build.linear, xs, r)
        other_build.set_threads(1)
        y_rp1 = other_build.linear(x, r)
    finally:
        other_build.set_activations("f32")
    float_prompt = (other_build.linear(xs, r), other_build.linear(xs, w))
    assert other_build.rp_kernel in ("maddubs8x2", "scalar")
    assert_close(y_rp, int8_activations(x), w)
    close_to_row_major(y_rp, y_old, x, w)
    assert np.array_equal(y_rp1, y_rp)
    assert np.array_equal(prompt, prompt_alone)
    assert np.array_equal(*float_prompt)
    if kind == "q8_0":  # this build's sign trick at the ends of int8
        other_build.set_activations("q8")
        try:
            ones = other_build.linear(np.ones((1, 256), np.float32), repack_q8_0(q8_0_extremes(20, 256, rng)))
        finally:
            other_build.set_activations("f32")
        assert ones[0, 0] == -128 * 256 and ones[0, 1] == 127 * 256
    if kind != "q4":
        return
    w16 = random_weight("q4", 48, inn, rng)  # the compiled repacking: this build's transposes
    got, want = other_build.repack_q4(w16), repack_q4(w16)
    assert all(np.array_equal(got.parts[n], want.parts[n]) for n in want.parts)


@KINDS
@pytest.mark.parametrize("build", ["neon", "neon_v80"])
def test_the_neon_backends_match_under_qemu(build, rng, request, kind):
    neon = request.getfixturevalue(build)
    for out, inn in ((7, 192), (203, 2112)):
        w = random_weight(kind, out, inn, rng)
        r = REPACK[kind](w)
        x = rng.standard_normal((1, inn), dtype=np.float32)
        y_rp = neon.linear(x, r, threads=2, activations="q8")
        assert_close(y_rp, int8_activations(x), w)
        close_to_row_major(y_rp, neon.linear(x, w, threads=2, activations="q8"), x, w)
        assert np.array_equal(neon.linear(x, r, threads=1, activations="q8"), y_rp)
        xs = rng.standard_normal((7, inn), dtype=np.float32)
        alone = np.concatenate([neon.linear(xs[t : t + 1], r, activations="q8") for t in range(len(xs))])
        assert np.array_equal(neon.linear(xs, r, activations="q8"), alone)
        assert np.array_equal(neon.linear(xs, r, activations="f32"), neon.linear(xs, w, activations="f32"))
    if kind == "q8_0":  # widening products and sdot at the ends of int8
        ones = neon.linear(np.ones((1, 256), np.float32), repack_q8_0(q8_0_extremes(20, 256, rng)), activations="q8")
        assert ones[0, 0] == -128 * 256 and ones[0, 1] == 127 * 256
    if kind != "q4":
        return
    for out, inn in ((16, 64), (48, 1152), (32, 2816)):  # the compiled repacking (its NEON transposes)
        w = random_weight("q4", out, inn, rng)
        got, want = neon.repack_q4(w), repack_q4(w)
        assert all(np.array_equal(got[n], want.parts[n].reshape(-1)) for n in got)


@KINDS
def test_rows_of_a_repacked_matrix_are_the_rows_it_was_made_from(rng, kind):
    """Embedding lookups on a tied head held repacked unpack only the panels of their rows: any rows, in
    any order, repeated, in the last (padded) panel, bit for bit."""
    for out, inn in ((7, 64 if kind == "q4" else 32), (203, 256)):
        w = random_weight(kind, out, inn, rng)
        rp = REPACK[kind](w)
        for idx in ([0], [out - 1, 0, out - 1], rng.integers(0, out, 9), np.arange(out)):
            got, want = rp.rows(idx), w.rows(idx)
            assert got.kind == kind and got.shape == want.shape == (len(idx), inn)
            assert np.array_equal(dequantize(got), dequantize(want))


class _Model:
    def __init__(self, rng):
        self.layers = [
            {
                "q": random_weight("q4", 32, 128, rng),
                "norm": np.ones(128, np.float32),
                "mlp": {"up": random_weight("q4", 40, 128, rng)},
            },
            {"q": random_weight("q8_0", 32, 128, rng), "o": random_weight("q4_1", 24, 128, rng)},
        ]
        self.lm_head = random_weight("q4", 50, 128, rng)


def test_a_model_repacks_its_dense_q4_matrices_for_int8_decode(rng):
    m = _Model(rng)
    assert repack.repack_model(m, "f32") == 0 and repack.repack_model(m, "experts") == 0
    assert repack.repack_model(m, "decode") == 0  # not a dense model's compiled decode step
    assert m.layers[0]["q"].kind == "q4"
    assert repack.repack_model(m, "q8") > 0
    assert m.layers[0]["q"].kind == m.layers[0]["mlp"]["up"].kind == m.lm_head.kind == REPACKED_Q4
    assert m.layers[1]["q"].kind == REPACKED_Q8_0 and m.layers[1]["o"].kind == REPACKED_Q4_1


@pytest.mark.parametrize("writable", [True, False])
def test_a_tied_head_is_repacked_once_and_serves_the_lookups_where_it_was_rewritten(rng, writable):
    """A model whose generated tokens take int8 in their own layer calls (Gemma 4's `int8_dense_decode`)
    repacks in "decode" mode. A tied head in writable memory (a store read into memory) is repacked in
    place and the embedding is that one copy; from a read-only map the head is a new array and the
    embedding keeps the store's rows. The rows are the same either way."""
    m = _Model(rng)
    m.int8_decode = True
    tied = random_weight("q4", 48, 128, rng)
    tied.parts = {k: v.copy() for k, v in tied.parts.items()}
    for p in tied.parts.values():
        p.flags.writeable = writable
    m.lm_head = m.embed = tied
    want = dequantize(tied.rows([3, 47, 3]))
    assert repack.repack_model(m, "decode") > 0
    assert m.lm_head.kind == REPACKED_Q4
    assert np.shares_memory(m.lm_head.parts["q"], tied.parts["q"]) == writable
    assert (m.embed is m.lm_head) == writable and (m.embed is tied) != writable
    assert np.array_equal(dequantize(m.embed.rows([3, 47, 3])), want)


# ------------------------------------------------------------------ whole models


def _worst(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| per step over the step's logit range (test_llama_decode's measure)."""
    return float((np.abs(a - b).max(axis=-1) / (b.max(axis=-1) - b.min(axis=-1))).max())


def _run(store, mode: str, repacked: bool, ids, n_prompt: int):
    """The prompt's logits and each decode step's, the model repacked for `mode` or not."""
    from inference.model import load_model

    m = load_model(store)
    if repacked:
        assert repack.repack_model(m, mode) > 0
    cache = m.new_cache()
    with kernels.configured(activations=mode):
        prompt = m.forward(np.array(ids[:n_prompt]), cache)
        steps = np.array([m.forward(np.array([t]), cache)[0] for t in ids[n_prompt:]])
    return prompt, steps


def _tiny_q4(name: str, tmp_path_factory):
    import test_parity
    from parity import build_checkpoint

    from inference.convert import convert

    model_cls, cfg = getattr(test_parity, name)()
    tmp = tmp_path_factory.mktemp(name)
    return convert(build_checkpoint(model_cls, cfg, tmp / "hf"), tmp / "q4", "q4", progress=False)


@pytest.fixture(scope="module")
def llama_q4(tmp_path_factory):
    return _tiny_q4("llama", tmp_path_factory)


@pytest.fixture(scope="module")
def gemma4_q4(tmp_path_factory):
    return _tiny_q4("gemma4", tmp_path_factory)


@pytest.fixture(params=["llama_q4", "gemma4_q4"])
def dense_q4(request):
    """A tiny model in q4: Llama (a compiled decode step) and Gemma 4 (int8 in its own layer calls)."""
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("mode", ["decode", "q8"])
def test_a_repacked_dense_model_keeps_its_prompt_bits_and_decodes_as_closely_as_int8_allows(dense_q4, mode):
    """Float prompts (decode mode) run unpacked panels: the same bits. Int8 products (q8's prompts, a
    generated token's dense products in decode mode, q8's head) differ by summation order; as in
    test_llama_decode, a last-bit change can move an int8 rounding, so the bound is "closer to the
    row-major int8 run than the float run is"."""
    ids = [int(t) for t in np.random.default_rng(7).integers(0, 512, 14)]
    p_old, d_old = _run(dense_q4, mode, False, ids, 8)
    p_new, d_new = _run(dense_q4, mode, True, ids, 8)
    p_f32, d_f32 = _run(dense_q4, "f32", False, ids, 8)
    if mode == "decode":
        assert np.array_equal(p_new, p_old)
    else:
        assert _worst(p_new, p_old) < _worst(p_f32, p_old)
    assert _worst(d_new, d_old) < _worst(d_f32, d_old)


def test_gemma4_takes_int8_in_a_generated_tokens_dense_products_only(gemma4_q4, monkeypatch):
    """Decode mode: a prompt's dense products stay float (the bits of a model without the int8 path); a
    generated token's q/k/v/o, dense MLP and LM head take int8 (other bits, close to the float ones)."""
    from inference.models import gemma4

    ids = [int(t) for t in np.random.default_rng(9).integers(0, 512, 14)]
    p_int8, d_int8 = _run(gemma4_q4, "decode", True, ids, 8)
    monkeypatch.setattr(gemma4.Model, "int8_dense_decode", False)
    p_float, d_float = _run(gemma4_q4, "decode", False, ids, 8)
    assert np.array_equal(p_int8, p_float)
    assert not np.array_equal(d_int8, d_float)
    p_f32, d_f32 = _run(gemma4_q4, "f32", False, ids, 8)
    # they move the logits less than the int8 experts that decode mode already had, and keep the argmax
    assert _worst(d_int8, d_float) < _worst(d_f32, d_float)
    assert (d_int8.argmax(-1) == d_float.argmax(-1)).mean() >= 0.8


def test_a_repacked_moe_model_in_q8_mode(moe_store):
    ids = [int(t) for t in np.random.default_rng(8).integers(0, 256, 12)]
    p_old, d_old = _run(moe_store, "q8", False, ids, 6)
    p_new, d_new = _run(moe_store, "q8", True, ids, 6)
    p_f32, d_f32 = _run(moe_store, "f32", False, ids, 6)
    assert _worst(p_new, p_old) < _worst(p_f32, p_old)
    assert _worst(d_new, d_old) < _worst(d_f32, d_old)


def test_the_engine_repacks_on_the_cpu_unless_switched_off(moe_store):
    from inference.engine import Engine

    def kinds(e):
        return {e.model.layers[0]["q"].kind, e.model.lm_head.kind}

    resident = Engine.open(moe_store, activations="q8")
    assert kinds(resident) == {"q4r"}  # new arrays: the store file's map is read-only
    assert not np.shares_memory(resident.model.layers[0]["q"].parts["q"], resident.store._dense())
    decode = Engine.open(moe_store, activations="decode")  # the MoE decode step and its head: int8
    assert (decode.model.layers[0]["q"].kind, decode.model.lm_head.kind) == ("q4r", "q4r")
    streamed = Engine.open(moe_store, activations="q8", expert_slots=4)  # dense.bin read into memory
    assert kinds(streamed) == {"q4r"}
    assert np.shares_memory(streamed.model.layers[0]["q"].parts["q"], streamed.store._dense())  # in place
    assert kinds(Engine.open(moe_store, activations="q8", repack=False)) == {"q4"}


def test_experts_are_repacked_where_they_land_and_stream_with_the_resident_bits(moe_store_plain):
    """Every mode with int8 experts holds them repacked: an all-resident engine in copies made at first
    use, a streaming one in its slots as each read lands (demand, prefetch, a warm start): the same
    layout, so the same bits; f32 and `repack` off keep the store's layout. (A store converted now holds
    them repacked on disk: `test_store_repack`.)"""
    from inference.engine import Engine

    def expert_kinds(e):
        src = e.model.experts
        if hasattr(src, "caches"):
            views = [
                src.landing.view(layer, c.pool.view(s)) for layer, c in src.caches.items() for s in c.where.values()
            ]
        else:
            views = list(src._views.values())
        assert views
        return {w.kind for v in views for w in v.values()}

    ids = [int(t) for t in np.random.default_rng(9).integers(0, 256, 20)]
    for mode in ("decode", "experts", "f32"):
        resident = Engine.open(moe_store_plain, chunk=8, activations=mode)
        want = resident.forward(ids, last_only=False)
        streamed = Engine.open(moe_store_plain, chunk=8, activations=mode, expert_slots=3, prefetch=2)
        assert np.array_equal(streamed.forward(ids, last_only=False), want), mode
        kind = "q4" if mode == "f32" else "q4r"
        assert expert_kinds(resident) == expert_kinds(streamed) == {kind}, mode
    warm = Engine.open(moe_store_plain, chunk=8, expert_slots=3)
    assert warm.model.experts.warm({0: np.arange(16)[::-1], 1: np.arange(16)}) > 0
    assert expert_kinds(warm) == {"q4r"}
    assert np.array_equal(
        warm.forward(ids, last_only=False), Engine.open(moe_store_plain, chunk=8).forward(ids, last_only=False)
    )
    off = Engine.open(moe_store_plain, chunk=8, repack=False)
    off.forward(ids[:4])
    assert expert_kinds(off) == {"q4"}


def test_resident_experts_that_would_not_fit_in_memory_stay_mapped(moe_store_plain, monkeypatch):
    """Copies of a model larger than the available memory could not be paged out: the engine keeps the
    memory map (store layout) and says why, and still answers."""
    import inference.experts.resident as resident
    from inference.engine import Engine

    monkeypatch.setattr(resident, "meminfo", lambda: {"MemAvailable": 64 * 1024})
    e = Engine.open(moe_store_plain, chunk=8)
    src = e.model.experts
    assert not src.repacked and "available" in src.not_repacked and "memory budget" in src.not_repacked
    e.forward([1, 2, 3])
    assert {w.kind for v in src._views.values() for w in v.values()} == {"q4"}
    assert e.model.layers[0]["q"].kind == "q4r"  # the dense matrices are repacked as before
