/* rkmojo's compiled kernels: y[T, out] = x[T, in] @ W[out, in].T with W in any storage kind of
 * inference/quant.py, dequantized block by block into registers (never as a whole matrix).
 *
 * Plain C functions (rk_linear_many and friends, loaded through ctypes by inference/kernels/_lib.py),
 * built by setuptools as a Python extension whose one function is a cheaper way into the same code
 * (rkpython.h). Threads come from rkpool.h, vectors from rkkernels_simd.h. The attention and the decode
 * steps are units of their own, beside this one (rkinternal.h lists them and what they share).
 *
 * Determinism. Each output element y[t, o] is computed by one thread, from one output row and one
 * activation row, by the same sequence of float operations whatever the batch (T), the tile it falls
 * in, or the thread count. Tiles only interleave independent (o, t) pairs; partial sums are never
 * split across threads or merged in a batch-dependent order.
 *
 * Arithmetic per kind (s, m: a group's scale and bias; sums run in the fixed vector order):
 *   f32, f16       y = sum(w * x)
 *   q8             y = scale[o] * sum(q * x)
 *   q8_0           y = sum_b d_b * sum_{b}(q * x)
 *   q4, q4_0, q4_1 y = sum_g s_g * sum_{g}(q * x) + sum_g m_g * sum_{g}(x)   (q4_0: m = -8 d)
 * For the nibble kinds, a byte holding q_lo (weight of x_lo) and q_hi (of x_hi) contributes
 *   q_lo * x_lo + q_hi * x_hi = q_lo * (x_lo - x_hi / 16) + byte * (x_hi / 16)
 * so the kernel only masks the low nibble and converts the whole byte (no shift), against activations
 * rewritten that way. That rewrite and the group sums of x are made once per activation row and
 * shared by all output rows (and by all matrices of one rk_linear_many call).
 *
 * Int8 activations (a kind code | RK_Q8A; q4, q4_0, q4_1, q8_0 only, other kinds ignore the flag): each
 * activation row is rounded per block of 32 to xq (int8) times dx (f32), once per call as above, and
 *   y = sum_b (s_g dx_b) * dot(q_b, xq_b) + sum_g m_g * xs_g,   xs_g = sum_{b in g} dx_b sum(xq_b)
 * with dot exact in int32 (VNNI, AVX2 maddubs, NEON sdot or widening multiplies, scalar C: the same
 * integers) and the float steps in a fixed order, so the determinism above holds in this mode too.
 *
 * Repacked q4, q4_1 and q8_0 (their kind code | RK_RP): matrices the engine repacked (dense ones at load,
 * q4 experts where they land), 16 output rows side by side, so that int8 products take 16 rows per vector
 * instruction; float calls unpack them back to the store layout and get its bits. See "repacked q4" below.
 */
#ifndef RK_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python requires; it also selects POSIX */
#elif !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime and pthreads under -std=c11 */
#endif

#include "rkdescriptors.h"
#include "rkinternal.h"
#include "rkpool.h"

/* storage kinds, in the order of inference.quant.KINDS */
enum { K_F32, K_F16, K_Q8, K_Q4, K_Q4_0, K_Q4_1, K_Q8_0, K_COUNT };


#define TILE_T 128    /* activation rows prepared at once */
#define MAXR 6        /* largest micro-tile side */
#define DECODE_MR 4   /* output rows per decode micro-tile */
#define PREFILL_NR 6  /* activation rows per prefill micro-tile */

typedef struct {
    int64_t out, in;
    int64_t ng;          /* groups per row: q4 (64), q4_0 / q4_1 / q8_0 (32) */
    int64_t ngp;         /* ng rounded up to a batch of DU */
    int64_t row_bytes;   /* bytes per row of p0 */
    const uint8_t *p0;   /* w | q | blocks */
    const uint8_t *p1;   /* q8: scales f32 [out]; q4: scales f16 [out, ng] */
    const uint8_t *p2;   /* q4: biases f16 [out, ng] */
    int rp;              /* q4 / q4_1 / q8_0 repacked (rows in lanes, "repacked q4"): p0, p1, p2 in panels of RP rows */
} wmat;

typedef struct {
    const float *x;   /* [T, in]; nibble kinds: rewritten per byte pair (see prep_row) */
    const float *xs;  /* [T, ngp] per-group sums of x, zero-padded (nibble kinds; q8a: of the int8 x) */
    const int8_t *xq; /* q8a: [T, in] x quantized per block of 32 (q4: in nibble order, see prep_q8a_row) */
    const float *dx;  /* q8a: [T, in / 32] the blocks' scales */
    float *y;         /* [T, out] */
    int64_t T;
} acts;

RK_INLINE float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Decode (one activation row) streams weight rows from DRAM at their full rate only with a software
 * prefetch this far ahead: with small rows (in = 576) the 4 rows of a tile are one stream, and 512 B
 * ahead of it is too close (x86 server: 4 KiB ahead made the SmolLM2 decode matmuls 25% faster). */
#ifndef PREFETCH_AHEAD
#if defined(__aarch64__)
#define PREFETCH_AHEAD 512 /* RK3588 setting, not re-measured with the x86 change */
#else
#define PREFETCH_AHEAD 4096
#endif
#endif

RK_INLINE void prefetch_ahead(const uint8_t *p) { __builtin_prefetch(p + PREFETCH_AHEAD); }

RK_INLINE int is_nibble_kind(int kind) { return kind == K_Q4 || kind == K_Q4_0 || kind == K_Q4_1; }

/* A micro-tile covers MR output rows x NR activation rows over the columns [k0, k1) of one K block.
 * Its NA partial-sum vectors per (output row, activation row) pair wait in `st` between blocks
 * (stored and reloaded unchanged, so blocking never alters the arithmetic); the block ending at
 * `in` finishes the pairs and writes y. */
#define NA 2

RK_INLINE void tile_begin(const int MR, const int NR, int64_t k0, const vf *st, vf acc[MAXR][MAXR][NA])
{
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++)
            for (int u = 0; u < NA; u++) acc[i][r][u] = k0 ? st[(i * NR + r) * NA + u] : vf_zero();
}

RK_INLINE void tile_suspend(const int MR, const int NR, vf *st, vf acc[MAXR][MAXR][NA])
{
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++)
            for (int u = 0; u < NA; u++) st[(i * NR + r) * NA + u] = acc[i][r][u];
}

/* ------------------------------------------------------------------ f32, f16, q8: one long sum */

RK_INLINE void dense_decu(const int kind, const uint8_t *row, int64_t k, vf *w)
{
    if (kind == K_F32)
        decu_f32((const float *)row + k, w);
    else if (kind == K_F16)
        decu_f16((const uint16_t *)row + k, w);
    else
        decu_i8((const int8_t *)row + k, w);
}

RK_INLINE float dense_scalar(const int kind, const uint8_t *row, int64_t k)
{
    if (kind == K_F32) return ((const float *)row)[k];
    if (kind == K_F16) return load_f16(row + 2 * k);
    return (float)((const int8_t *)row)[k];
}

/* Vector u of the row goes to accumulator u % 2 (two chains hide the FMA latency at T = 1). */
RK_INLINE void dense_tile(const int kind, const int MR, const int NR, const wmat *w, const acts *a, int64_t o,
                          int64_t t, int64_t k0, int64_t k1, vf *st)
{
    const int64_t in = w->in;
    const uint8_t *row[MAXR];
    const float *x[MAXR];
    vf acc[MAXR][MAXR][NA];
    for (int i = 0; i < MR; i++) row[i] = w->p0 + (o + i) * w->row_bytes;
    for (int r = 0; r < NR; r++) x[r] = a->x + (t + r) * in;
    tile_begin(MR, NR, k0, st, acc);

    int64_t k = k0;
    for (; k + 2 * DU <= k1; k += 2 * DU)
        for (int i = 0; i < MR; i++) {
            vf wv[2 * NU];
            if (NR == 1) prefetch_ahead(row[i] + (w->row_bytes / in) * k);
            dense_decu(kind, row[i], k, wv);
            dense_decu(kind, row[i], k + DU, wv + NU);
            for (int u = 0; u < 2 * NU; u++)
                for (int r = 0; r < NR; r++)
                    acc[i][r][u & 1] = vf_fma(wv[u], vf_load(x[r] + k + u * VL), acc[i][r][u & 1]);
        }
    if (k1 < in) {
        tile_suspend(MR, NR, st, acc);
        return;
    }
    if (k + DU <= in) {
        for (int i = 0; i < MR; i++) {
            vf wv[NU];
            dense_decu(kind, row[i], k, wv);
            for (int u = 0; u < NU; u++)
                for (int r = 0; r < NR; r++)
                    acc[i][r][u & 1] = vf_fma(wv[u], vf_load(x[r] + k + u * VL), acc[i][r][u & 1]);
        }
        k += DU;
    }
    for (int i = 0; i < MR; i++) {
        const float scale = kind == K_Q8 ? ((const float *)w->p1)[o + i] : 1.0f;
        for (int r = 0; r < NR; r++) {
            float s = vf_hsum(vf_add(acc[i][r][0], acc[i][r][1]));
            for (int64_t j = k; j < in; j++) {
                float p = dense_scalar(kind, row[i], j) * x[r][j];
                s = s + p;
            }
            a->y[(t + r) * w->out + o + i] = kind == K_Q8 ? s * scale : s;
        }
    }
}

/* ------------------------------------------------------------------ q8_0: blocks of 32 */

/* Blocks go in batches of DU, whose scales convert together (a strided load of their halves). */
RK_INLINE void q80_tile(const int MR, const int NR, const wmat *w, const acts *a, int64_t o, int64_t t,
                        int64_t k0, int64_t k1, vf *st)
{
    const float *x[MAXR];
    vf acc[MAXR][MAXR][NA];
    for (int r = 0; r < NR; r++) x[r] = a->x + (t + r) * w->in;
    tile_begin(MR, NR, k0, st, acc);

    const int64_t b1 = k1 / 32;
    for (int64_t b0 = k0 / 32; b0 < b1; b0 += DU) {
        const int n = b1 - b0 < DU ? (int)(b1 - b0) : DU;
        float sc[MAXR][DU];
        for (int i = 0; i < MR; i++) {
            vf d[NU], unused[NU];
            decu_f16x2_strided(w->p0 + (o + i) * w->row_bytes + 34 * b0, 34, n, d, unused);
            for (int u = 0; u < NU; u++) vf_store(sc[i] + u * VL, d[u]);
        }
        for (int j = 0; j < n; j++) {
            const int64_t k = 32 * (b0 + j);
            for (int i = 0; i < MR; i++) {
                const uint8_t *blk = w->p0 + (o + i) * w->row_bytes + 34 * (b0 + j);
                if (NR == 1) prefetch_ahead(blk);
                vf gs[MAXR];
                for (int r = 0; r < NR; r++) gs[r] = vf_zero();
                for (int c = 0; c < 32 / DU; c++) {
                    vf wv[NU];
                    decu_i8((const int8_t *)(blk + 2 + DU * c), wv);
                    for (int v = 0; v < NU; v++)
                        for (int r = 0; r < NR; r++)
                            gs[r] = vf_fma(wv[v], vf_load(x[r] + k + DU * c + v * VL), gs[r]);
                }
                const vf d = vf_set1(sc[i][j]);
                for (int r = 0; r < NR; r++) acc[i][r][0] = vf_fma(d, gs[r], acc[i][r][0]);
            }
        }
    }
    if (k1 < w->in) {
        tile_suspend(MR, NR, st, acc);
        return;
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) a->y[(t + r) * w->out + o + i] = vf_hsum(acc[i][r][0]);
}

/* ------------------------------------------------------------------ q4, q4_0, q4_1: nibbles */

RK_INLINE int64_t gguf_block_bytes(const int kind) { return kind == K_Q4_0 ? 18 : 20; }

RK_INLINE const uint8_t *gguf_block(const int kind, const wmat *w, int64_t o, int64_t g)
{
    return w->p0 + o * w->row_bytes + gguf_block_bytes(kind) * g;
}

/* The nibbles of group g of row o. */
RK_INLINE const uint8_t *nib_bytes(const int kind, const wmat *w, int64_t o, int64_t g)
{
    if (kind == K_Q4) return w->p0 + o * w->row_bytes + 32 * g;
    return gguf_block(kind, w, o, g) + (kind == K_Q4_0 ? 2 : 4);
}

/* Scales and biases of groups g0 .. g0+n-1 (n <= DU) of row o as floats, zero past n, converted
 * together: q4 keeps them in arrays of their own, GGUF blocks at a fixed stride. (q4_0 stores no
 * bias: its q - 8 is -8 d; past n that is -0, which adds nothing either.) */
RK_INLINE void nib_params(const int kind, const wmat *w, int64_t o, int64_t g0, int n, float *s, float *m)
{
    vf sv[NU], mv[NU];
    if (kind == K_Q4 && n < DU) { /* a partial batch (in = 768: every row): a vector load would run past the
                                   * arrays, so the n halves go through zeroed copies, still converted together */
        uint16_t hs[DU] = {0}, hm[DU] = {0};
        memcpy(hs, w->p1 + 2 * (o * w->ng + g0), 2 * (size_t)n);
        memcpy(hm, w->p2 + 2 * (o * w->ng + g0), 2 * (size_t)n);
        decu_f16(hs, sv);
        decu_f16(hm, mv);
    } else if (kind == K_Q4) {
        decu_f16((const uint16_t *)w->p1 + o * w->ng + g0, sv);
        decu_f16((const uint16_t *)w->p2 + o * w->ng + g0, mv);
    } else {
        decu_f16x2_strided(gguf_block(kind, w, o, g0), gguf_block_bytes(kind), n, sv, mv);
    }
    for (int u = 0; u < NU; u++) {
        vf_store(s + u * VL, sv[u]);
        vf_store(m + u * VL, kind == K_Q4_0 ? vf_mul(sv[u], vf_set1(-8.0f)) : mv[u]);
    }
}

/* Each DU bytes of nibbles meet 2 DU prepared activations: DU for the low nibbles, DU for the bytes.
 * Groups go in batches of DU (counted from the row start, so every tiling batches alike): scales and
 * biases convert together, and the batch's bias part m . xsum lands in the accumulator's lanes. */
RK_INLINE void nib_tile(const int kind, const int MR, const int NR, const wmat *w, const acts *a, int64_t o,
                        int64_t t, int64_t k0, int64_t k1, vf *st)
{
    const int G = kind == K_Q4 ? 64 : 32, nstep = G / (2 * DU);
    const float *x[MAXR], *xs[MAXR];
    vf acc[MAXR][MAXR][NA];
    for (int r = 0; r < NR; r++) {
        x[r] = a->x + (t + r) * w->in;
        xs[r] = a->xs + (t + r) * w->ngp;
    }
    tile_begin(MR, NR, k0, st, acc);

    const int64_t g1 = k1 / G;
    for (int64_t g0 = k0 / G; g0 < g1; g0 += DU) {
        const int n = g1 - g0 < DU ? (int)(g1 - g0) : DU;
        float sc[MAXR][DU], mb[MAXR][DU];
        for (int i = 0; i < MR; i++) nib_params(kind, w, o + i, g0, n, sc[i], mb[i]);
        for (int j = 0; j < n; j++) {
            const int64_t k = G * (g0 + j);
            for (int i = 0; i < MR; i++) {
                const uint8_t *q = nib_bytes(kind, w, o + i, g0 + j);
                if (NR == 1) prefetch_ahead(q);
                vf gs[MAXR];
                for (int r = 0; r < NR; r++) gs[r] = vf_zero();
                for (int c = 0; c < nstep; c++) {
                    vf lo[NU], by[NU];
                    decu_nib(q + DU * c, lo, by);
                    const int64_t kc = k + 2 * DU * c;
                    for (int v = 0; v < NU; v++)
                        for (int r = 0; r < NR; r++) {
                            gs[r] = vf_fma(lo[v], vf_load(x[r] + kc + v * VL), gs[r]);
                            gs[r] = vf_fma(by[v], vf_load(x[r] + kc + DU + v * VL), gs[r]);
                        }
                }
                const vf sv = vf_set1(sc[i][j]);
                for (int r = 0; r < NR; r++) acc[i][r][0] = vf_fma(sv, gs[r], acc[i][r][0]);
            }
        }
        for (int i = 0; i < MR; i++) {
            vf m[NU];
            decu_f32(mb[i], m);
            for (int u = 0; u < NU; u++)
                for (int r = 0; r < NR; r++)
                    acc[i][r][0] = vf_fma(m[u], vf_load(xs[r] + g0 + u * VL), acc[i][r][0]);
        }
    }
    if (k1 < w->in) {
        tile_suspend(MR, NR, st, acc);
        return;
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) a->y[(t + r) * w->out + o + i] = vf_hsum(acc[i][r][0]);
}

/* ------------------------------------------------------------------ int8 activations (q8a) */

/* q4, q4_0, q4_1, q8_0 against x quantized to int8 per block of 32 (x ~ dx * xq):
 *   y = sum_b (s_g * dx_b) * dot(q_b, xq_b)  +  sum_g m_g * xs_g,   xs_g = sum_{b in g} dx_b * sum(xq_b)
 * dot exact in int32, then scaled into float lanes in block order; the bias part as in nib_tile. Using
 * the int8 x's own sums makes the error sum(w * (x - dx xq)), that of the activations' rounding alone.
 * Whole rows: int8 activation rows are small enough to stay in L1 without K blocks. */
RK_INLINE void q8a_tile(const int kind, const int MR, const int NR, const wmat *w, const acts *a, int64_t o,
                        int64_t t)
{
    const int64_t in = w->in, nb = in / 32;
    const int bpg = kind == K_Q4 ? 2 : 1; /* blocks of 32 per group */
    const int8_t *xq[MAXR];
    const float *dx[MAXR], *xs[MAXR];
    vs acc[MAXR][MAXR];
    vf bacc[MAXR][MAXR], gacc[MAXR][MAXR]; /* gacc: q4 groups whole (RK_GROUP64), else zero */
    for (int r = 0; r < NR; r++) {
        xq[r] = a->xq + (t + r) * in;
        dx[r] = a->dx + (t + r) * nb;
        xs[r] = a->xs + (t + r) * w->ngp;
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++) {
            acc[i][r] = vs_zero();
            bacc[i][r] = gacc[i][r] = vf_zero();
        }
    for (int64_t g0 = 0; g0 < w->ng; g0 += DU) {
        const int n = w->ng - g0 < DU ? (int)(w->ng - g0) : DU;
        float sc[MAXR][DU], mb[MAXR][DU];
        for (int i = 0; i < MR; i++) {
            if (kind == K_Q8_0) {
                vf d[NU], unused[NU];
                decu_f16x2_strided(w->p0 + (o + i) * w->row_bytes + 34 * g0, 34, n, d, unused);
                for (int u = 0; u < NU; u++) vf_store(sc[i] + u * VL, d[u]);
            } else {
                nib_params(kind, w, o + i, g0, n, sc[i], mb[i]);
            }
        }
        for (int j = 0; j < n; j++) {
            const int64_t g = g0 + j;
            for (int i = 0; i < MR; i++) {
                const uint8_t *q = kind == K_Q8_0 ? w->p0 + (o + i) * w->row_bytes + 34 * g + 2
                                                  : nib_bytes(kind, w, o + i, g);
                if (NR == 1) prefetch_ahead(q);
#ifdef RK_GROUP64
                if (kind == K_Q4) {
                    const __m512i wv = vg_nib(q);
                    for (int r = 0; r < NR; r++) gacc[i][r] = vg_fma(wv, xq[r] + 64 * g, dx[r] + 2 * g, sc[i][j], gacc[i][r]);
                    continue;
                }
#endif
                for (int h = 0; h < bpg; h++) {
                    const int64_t b = g * bpg + h;
                    const vb wv = kind == K_Q8_0 ? vb_s8((const int8_t *)q) : vb_nib(q + 16 * h);
                    for (int r = 0; r < NR; r++) {
                        const vi d = kind == K_Q8_0 ? vi_dot_s(wv, xq[r] + 32 * b) : vi_dot_u(wv, xq[r] + 32 * b);
                        acc[i][r] = vs_fma_i(d, sc[i][j] * dx[r][b], acc[i][r]);
                    }
                }
            }
        }
        if (kind != K_Q8_0)
            for (int i = 0; i < MR; i++) {
                vf m[NU];
                decu_f32(mb[i], m);
                for (int u = 0; u < NU; u++)
                    for (int r = 0; r < NR; r++)
                        bacc[i][r] = vf_fma(m[u], vf_load(xs[r] + g0 + u * VL), bacc[i][r]);
            }
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < NR; r++)
            a->y[(t + r) * w->out + o + i] = (vs_hsum(acc[i][r]) + vf_hsum(gacc[i][r])) + vf_hsum(bacc[i][r]);
}

/* Output rows [o0, o1) for all T activation rows, q8a: as run_rows, without K blocks. */
RK_INLINE void run_rows_q8a(const int kind, const wmat *w, const acts *a, int64_t o0, int64_t o1)
{
    int64_t o = o0;
    if (a->T == 1) {
        for (; o + DECODE_MR <= o1; o += DECODE_MR) q8a_tile(kind, DECODE_MR, 1, w, a, o, 0);
        for (; o < o1; o++) q8a_tile(kind, 1, 1, w, a, o, 0);
        return;
    }
    for (int64_t t = 0; t < a->T; t += PREFILL_NR) {
        const int64_t nr = a->T - t < PREFILL_NR ? a->T - t : PREFILL_NR;
        for (o = o0; o < o1; o++) {
            if (nr == 6)
                q8a_tile(kind, 1, 6, w, a, o, t);
            else if (nr == 5)
                q8a_tile(kind, 1, 5, w, a, o, t);
            else if (nr == 4)
                q8a_tile(kind, 1, 4, w, a, o, t);
            else if (nr == 3)
                q8a_tile(kind, 1, 3, w, a, o, t);
            else if (nr == 2)
                q8a_tile(kind, 1, 2, w, a, o, t);
            else
                q8a_tile(kind, 1, 1, w, a, o, t);
        }
    }
}

/* ------------------------------------------------------------------ repacked q4 (rows in lanes) */

/* Decode (T = 1) with int8 activations reads each q4 weight once, so it runs at the speed of its own
 * instructions: per group of 64 weights of ONE row the row-major kernel above unpacks 32 bytes, makes a
 * dot, converts and scales it, and every row ends in horizontal sums. Resident dense q4 matrices
 * (attention, a dense model's MLP, the LM head) are repacked once at load, and routed experts as they
 * land in a cache slot or at an all-resident engine's load (inference/kernels/repack.py; rk_repack_q4
 * below), so that RP = 16 output rows lie side by side, one row per 32-bit lane:
 *   q       panel p (rows 16p .. 16p+15), group g, line c (0..7): 64 bytes at (p ng + g) 512 + 64 c,
 *           bytes 4c..4c+3 of row r's 32 bytes of group g at + 4 r (line c < 4: the group's first block
 *           of 32 weights, c >= 4 the second)
 *   scales  f16 [p][g][16], biases likewise: a group's scales of 16 rows are one 32-byte load
 * with the rows padded with zeros to a whole panel (outputs past `out` are never written). A block's
 * dot for 16 rows is then 4 line loads, each against one broadcast activation dword per nibble half
 * (rp_block in rkkernels_simd.h), its float step one vector multiply-add for 16 rows, the biases one per
 * group, and no horizontal sums:
 *   y_r = sum_b float(dot_rb) * (s_rg dx_b)  +  sum_g m_rg xs_g     (per lane, in group/block order)
 * the q8a formula of q8a_tile with the sums in another order: results agree with it within float
 * rounding, not bit for bit. Each row is one lane of one panel, whatever the task split (tasks are whole
 * panels), so the thread count does not change the bits. Several activation rows (a prompt, an expert's
 * rows of a prompt) run RP_T at a time over each panel, sharing its line loads, each row with the sums it
 * has alone: a row's bits depend neither on T nor on its neighbours. At 8 and at 128 rows this ran
 * 2.5-3.6x faster than the row-major int8 tiles (benchmarks/README.md at 9362a58, benchmarks/profile/repack_bench.py --tokens).
 * One layout for every backend: a 64-byte line is one AVX-512 vector (vpdpbusd, 16 rows), two AVX2 ones
 * (maddubs, 8 rows each) and four NEON ones (sdot by lane, 4 rows each): each backend reads it with full
 * vector loads, and one repacking serves them all; 16 rows also give the narrower backends independent
 * chains to overlap.
 * Float calls on a repacked matrix (prompts in the decode mode, any T) unpack each panel's rows back into
 * the store layout in a scratch buffer and run the row-major kernels on it: the same bits as on the
 * store's own matrix, at the cost of one copy per panel and activation tile.
 *
 * Repacked q4_1 (a GGUF model's dense matrices, repacked at load) is the same layout with a group of one
 * block: its 16 nibble bytes (byte j: element j low, j + 16 high, which rp_block meets with the block's
 * int8 activations in their own order) as 4 lines of 64 bytes at (p nb + b) 256 + 64 c, and the blocks'
 * d and m as scales and biases f16 [p][b][16]; its bias part is m_rb xs_b, xs_b the block's int8 sum.
 *
 * Repacked q8_0 (a GGUF model's Q8_0 matrices, its tied LM head above all) likewise, with int8 weights: a
 * block's 32 bytes of 16 rows as 8 lines of 64 bytes at (p nb + b) 512 + 64 c (line c: bytes 4c..4c+3 of
 * each row), the blocks' d as scales f16 [p][b][16], and per block and row the sum of its 32 weights as
 * int16 [p][b][16] (rp_block8: VNNI's unsigned operand is x + 128, whose extra 128 sum_w the sums take
 * back); no bias part. */

RK_INLINE int64_t rp_rows(int64_t out) { return (out + RP - 1) / RP * RP; }

#define RP_T 4 /* activation rows per pass over a panel (int8 on repacked q4) */

/* The outputs of panel p for the NT activation rows t .. t + NT - 1 of `a` (q8a, in the order of the kind)
 * into y, of the panel's rows those below `out`; BPG blocks of 32 per group (q4 2, q4_1 1); Q8: int8
 * weights (q8_0, one block per group, no biases: p2 the weight sums). The NT rows
 * share each line load; each row's sums are those it has alone (the same operations in the same order),
 * so a row's bits do not depend on T or on its neighbours. */
RK_INLINE void rp_panel_q8a(const wmat *w, const acts *a, int64_t p, int64_t t, const int NT, const int BPG,
                              const int Q8)
{
    const int64_t ng = w->ng, in = w->in, nb = in / 32;
    const uint8_t *q = w->p0 + p * RP * (Q8 ? in : in / 2);
    const uint16_t *sc = (const uint16_t *)w->p1 + p * RP * ng, *bi = (const uint16_t *)w->p2 + p * RP * ng;
    vf acc[RP_T][RP / VL], bacc[RP_T][RP / VL];
    for (int j = 0; j < NT; j++)
        for (int k = 0; k < RP / VL; k++) acc[j][k] = bacc[j][k] = vf_zero();
    for (int64_t g = 0; g < ng; g++) {
        vf s[RP / VL], m[RP / VL];
        for (int u = 0; u < RP / DU; u++) {
            decu_f16(sc + RP * g + DU * u, s + NU * u);
            if (!Q8) decu_f16(bi + RP * g + DU * u, m + NU * u);
        }
        for (int h = 0; h < BPG; h++) {
            const int64_t b = BPG * g + h;
            const uint8_t *qb = q + (Q8 ? 512 : 256) * b;
            for (int c = 0; c < (Q8 ? 8 : 4); c++) prefetch_ahead(qb + 64 * c);
            for (int j = 0; j < NT; j++) {
                vf d[RP / VL];
                if (Q8)
                    rp_block8(qb, a->xq + (t + j) * in + 32 * b, (const int16_t *)bi + RP * b, d);
                else
                    rp_block(qb, a->xq + (t + j) * in + 32 * b, d);
                const vf db = vf_set1(a->dx[(t + j) * nb + b]);
                for (int k = 0; k < RP / VL; k++) acc[j][k] = vf_fma(d[k], vf_mul(s[k], db), acc[j][k]);
            }
        }
        if (!Q8)
            for (int j = 0; j < NT; j++) {
                const vf xg = vf_set1(a->xs[(t + j) * w->ngp + g]);
                for (int k = 0; k < RP / VL; k++) bacc[j][k] = vf_fma(m[k], xg, bacc[j][k]);
            }
    }
    const int64_t o = p * RP, n = w->out - o < RP ? w->out - o : RP;
    for (int j = 0; j < NT; j++) {
        float y16[RP];
        for (int k = 0; k < RP / VL; k++) vf_store(y16 + VL * k, vf_add(acc[j][k], bacc[j][k]));
        memcpy(a->y + (t + j) * w->out + o, y16, sizeof(float) * (size_t)n);
    }
}

/* The transpose of an 8 x 8 block of 32-bit words: the 32 bytes at s + i ss (i = 0..7) hold row i; word i of
 * row j goes to word j of the 32 bytes at d + i ds. Between a group's 16 rows (32 bytes each) and its 8
 * lines (64 bytes: word r = row r) that is two such blocks, rows 0-7 and 8-15, either way round. */
#if RK_SIMD_X86
static inline void rp_tr8(const uint8_t *s, int64_t ss, uint8_t *d, int64_t ds)
{
    __m256i r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(s + i * ss));
    for (int i = 0; i < 8; i += 2) { /* pairs of rows, words interleaved within 128-bit lanes */
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);     /* words 0, 1 | 4, 5 of rows i, i+1 */
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]); /* words 2, 3 | 6, 7 */
    }
    for (int i = 0; i < 8; i += 4) { /* quads of rows: one word of 4 rows per 128-bit lane */
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);         /* word 0 | 4 */
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);     /* word 1 | 5 */
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]); /* word 2 | 6 */
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]); /* word 3 | 7 */
    }
    for (int c = 0; c < 4; c++) { /* rows 0-3 and 4-7 of word c (low lanes) and c + 4 (high lanes) */
        _mm256_storeu_si256((__m256i *)(d + c * ds), _mm256_permute2x128_si256(u[c], u[c + 4], 0x20));
        _mm256_storeu_si256((__m256i *)(d + (c + 4) * ds), _mm256_permute2x128_si256(u[c], u[c + 4], 0x31));
    }
}
#elif RK_SIMD_NEON
static inline void rp_tr8(const uint8_t *s, int64_t ss, uint8_t *d, int64_t ds)
{
    for (int bi = 0; bi < 8; bi += 4)
        for (int bj = 0; bj < 8; bj += 4) { /* the 4 x 4 block of rows bi.., words bj.. */
            const uint8_t *sb = s + bi * ss + 4 * bj;
            uint32x4_t a0 = vld1q_u32((const uint32_t *)sb), a1 = vld1q_u32((const uint32_t *)(sb + ss));
            uint32x4_t a2 = vld1q_u32((const uint32_t *)(sb + 2 * ss)), a3 = vld1q_u32((const uint32_t *)(sb + 3 * ss));
            uint64x2_t t0 = vreinterpretq_u64_u32(vtrn1q_u32(a0, a1)), t1 = vreinterpretq_u64_u32(vtrn2q_u32(a0, a1));
            uint64x2_t t2 = vreinterpretq_u64_u32(vtrn1q_u32(a2, a3)), t3 = vreinterpretq_u64_u32(vtrn2q_u32(a2, a3));
            uint8_t *db = d + bj * ds + 4 * bi;
            vst1q_u32((uint32_t *)db, vreinterpretq_u32_u64(vtrn1q_u64(t0, t2)));
            vst1q_u32((uint32_t *)(db + ds), vreinterpretq_u32_u64(vtrn1q_u64(t1, t3)));
            vst1q_u32((uint32_t *)(db + 2 * ds), vreinterpretq_u32_u64(vtrn2q_u64(t0, t2)));
            vst1q_u32((uint32_t *)(db + 3 * ds), vreinterpretq_u32_u64(vtrn2q_u64(t1, t3)));
        }
}
#else
static inline void rp_tr8(const uint8_t *s, int64_t ss, uint8_t *d, int64_t ds)
{
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) memcpy(d + j * ds + 4 * i, s + i * ss + 4 * j, 4);
}
#endif

/* Panel p's rows in the store layout: nibbles [RP, in / 2], then scales and biases f16 [RP, ng]. */
static void rp_unpack(const wmat *w, int64_t p, uint8_t *buf)
{
    const int64_t half = w->in / 2, ng = w->ng;
    const uint8_t *q = w->p0 + p * RP * half;
    for (int64_t g = 0; g < ng; g++)
        for (int h = 0; h < RP; h += 8) rp_tr8(q + 512 * g + 4 * h, 64, buf + h * half + 32 * g, half);
    const uint16_t *s = (const uint16_t *)w->p1 + p * RP * ng, *m = (const uint16_t *)w->p2 + p * RP * ng;
    uint16_t *ds = (uint16_t *)(buf + RP * half), *dm = ds + RP * ng;
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < RP; r++) {
            ds[r * ng + g] = s[RP * g + r];
            dm[r * ng + g] = m[RP * g + r];
        }
}

/* Panel p's rows of a repacked q4_1 matrix in the store layout: blocks of 20 bytes (d, m, 16 nibble bytes). */
static void rp_unpack_q4_1(const wmat *w, int64_t p, uint8_t *buf)
{
    const int64_t nb = w->ng;
    const uint8_t *q = w->p0 + p * RP * (w->in / 2);
    const uint16_t *s = (const uint16_t *)w->p1 + p * RP * nb, *m = (const uint16_t *)w->p2 + p * RP * nb;
    for (int r = 0; r < RP; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = buf + r * w->row_bytes + 20 * b;
            memcpy(blk, s + RP * b + r, 2);
            memcpy(blk + 2, m + RP * b + r, 2);
            for (int c = 0; c < 4; c++) memcpy(blk + 4 + 4 * c, q + 256 * b + 64 * c + 4 * r, 4);
        }
}

/* Panel p's rows of a repacked q8_0 matrix in the store layout: blocks of 34 bytes (d, 32 int8). A block's
 * 8 lines of 16 rows are two 8 x 8 word transposes, as a q4 group's (a prompt's LM head, 28 MB for SmolLM2,
 * goes through here once per prompt). */
static void rp_unpack_q8_0(const wmat *w, int64_t p, uint8_t *buf)
{
    const int64_t nb = w->ng, rb = w->row_bytes;
    const uint8_t *q = w->p0 + p * RP * w->in;
    const uint16_t *s = (const uint16_t *)w->p1 + p * RP * nb;
    for (int64_t b = 0; b < nb; b++) {
        for (int h = 0; h < RP; h += 8) rp_tr8(q + 512 * b + 4 * h, 64, buf + h * rb + 34 * b + 2, rb);
        for (int r = 0; r < RP; r++) memcpy(buf + r * rb + 34 * b, s + RP * b + r, 2);
    }
}

/* q4 [out, in] from the store layout (q, s, m) into the repacked one (dq, ds, dm): quant.repack_q4 in C, for
 * the expert weights that land in cache slots at run time. out a multiple of RP (no padding); dst may be
 * src (in place: each panel goes through a scratch copy). Returns RK_OK, RK_EINVAL or RK_ENOMEM. */
RK_API int rk_repack_q4(int64_t out, int64_t in, const uint8_t *q, const uint16_t *s, const uint16_t *m, uint8_t *dq,
                        uint16_t *ds, uint16_t *dm)
{
    if (out < 0 || out % RP || in < 64 || in % 64) return RK_EINVAL;
    const int64_t half = in / 2, ng = in / 64;
    uint8_t *buf = malloc((size_t)(RP * half + 4 * RP * ng));
    if (!buf) return RK_ENOMEM;
    uint16_t *bs = (uint16_t *)(buf + RP * half), *bm = bs + RP * ng;
    for (int64_t p = 0; p < out / RP; p++) {
        memcpy(buf, q + p * RP * half, (size_t)(RP * half));
        memcpy(bs, s + p * RP * ng, sizeof(uint16_t) * (size_t)(RP * ng));
        memcpy(bm, m + p * RP * ng, sizeof(uint16_t) * (size_t)(RP * ng));
        uint8_t *oq = dq + p * RP * half;
        uint16_t *os = ds + p * RP * ng, *om = dm + p * RP * ng;
        for (int64_t g = 0; g < ng; g++) {
            for (int h = 0; h < RP; h += 8) rp_tr8(buf + h * half + 32 * g, half, oq + 512 * g + 4 * h, 64);
            for (int r = 0; r < RP; r++) {
                os[RP * g + r] = bs[r * ng + g];
                om[RP * g + r] = bm[r * ng + g];
            }
        }
    }
    free(buf);
    return RK_OK;
}

/* ------------------------------------------------------------------ tiling */

RK_INLINE void tile(const int kind, const int MR, const int NR, const wmat *w, const acts *a, int64_t o,
                    int64_t t, int64_t k0, int64_t k1, vf *st)
{
    if (kind == K_Q8_0)
        q80_tile(MR, NR, w, a, o, t, k0, k1, st);
    else if (is_nibble_kind(kind))
        nib_tile(kind, MR, NR, w, a, o, t, k0, k1, st);
    else
        dense_tile(kind, MR, NR, w, a, o, t, k0, k1, st);
}

#define PREFILL_ROWS 16 /* output rows per prefill task: their weights stay in L2 across x tiles */
#ifndef KBLOCK_MAX
#define KBLOCK_MAX 1024 /* columns per K block: 6 activation rows of it (24 KiB) stay in L1 */
#endif
#define KALIGN (DU * 64) /* K blocks start at whole batches of DU groups (q4: DU x 64), as T = 1 batches them */

/* Output rows [o0, o1) for all T activation rows. Decode (T = 1) runs DECODE_MR output rows side by
 * side over the whole row. Prefill runs 6 activation rows side by side, so each decoded weight block
 * serves 6 rows of x, and walks K in blocks so those x rows stay in L1 while the task's output rows
 * take their turns. */
RK_INLINE void run_rows(const int kind, const wmat *w, const acts *a, int64_t o0, int64_t o1)
{
    const int64_t in = w->in;
    int64_t o = o0;
    if (a->T == 1) {
        vf unused[MAXR * NA]; /* whole rows: nothing to carry between K blocks */
        for (; o + DECODE_MR <= o1; o += DECODE_MR) tile(kind, DECODE_MR, 1, w, a, o, 0, 0, in, unused);
        for (; o < o1; o++) tile(kind, 1, 1, w, a, o, 0, 0, in, unused);
        return;
    }
    const int64_t nkb = (in + KBLOCK_MAX - 1) / KBLOCK_MAX;
    const int64_t kb = nkb > 1 ? ((in + nkb - 1) / nkb + KALIGN - 1) / KALIGN * KALIGN : in;
    vf st[PREFILL_ROWS][MAXR * NA]; /* prefill tasks are at most PREFILL_ROWS rows */
    for (int64_t t = 0; t < a->T; t += PREFILL_NR) {
        const int64_t nr = a->T - t < PREFILL_NR ? a->T - t : PREFILL_NR;
        for (int64_t k0 = 0; k0 < in; k0 += kb) {
            const int64_t k1 = k0 + kb < in ? k0 + kb : in;
            for (o = o0; o < o1; o++) {
                vf *s = st[o - o0];
                if (nr == 6)
                    tile(kind, 1, 6, w, a, o, t, k0, k1, s);
                else if (nr == 5)
                    tile(kind, 1, 5, w, a, o, t, k0, k1, s);
                else if (nr == 4)
                    tile(kind, 1, 4, w, a, o, t, k0, k1, s);
                else if (nr == 3)
                    tile(kind, 1, 3, w, a, o, t, k0, k1, s);
                else if (nr == 2)
                    tile(kind, 1, 2, w, a, o, t, k0, k1, s);
                else
                    tile(kind, 1, 1, w, a, o, t, k0, k1, s);
            }
        }
    }
}

typedef void (*runner_fn)(const wmat *, const acts *, int64_t, int64_t);
#define RUNNER(name, kind) \
    static void name(const wmat *w, const acts *a, int64_t o0, int64_t o1) { run_rows(kind, w, a, o0, o1); }
RUNNER(run_f32, K_F32)
RUNNER(run_f16, K_F16)
RUNNER(run_q8, K_Q8)
RUNNER(run_q4, K_Q4)
RUNNER(run_q4_0, K_Q4_0)
RUNNER(run_q4_1, K_Q4_1)
RUNNER(run_q8_0, K_Q8_0)
static const runner_fn RUNNERS[K_COUNT] = {run_f32, run_f16, run_q8, run_q4, run_q4_0, run_q4_1, run_q8_0};
#define RUNNER_Q8A(name, kind) \
    static void name(const wmat *w, const acts *a, int64_t o0, int64_t o1) { run_rows_q8a(kind, w, a, o0, o1); }
RUNNER_Q8A(run_q8a_q4, K_Q4)
RUNNER_Q8A(run_q8a_q4_0, K_Q4_0)
RUNNER_Q8A(run_q8a_q4_1, K_Q4_1)
RUNNER_Q8A(run_q8a_q8_0, K_Q8_0)
/* q8a runners by kind; NULL: the kind has no int8 path and runs its float one */
static const runner_fn RUNNERS_Q8A[K_COUNT] = {NULL, NULL, NULL, run_q8a_q4, run_q8a_q4_0, run_q8a_q4_1, run_q8a_q8_0};

/* Output rows [o0, o1) of a repacked q4 matrix (whole panels, o1 a panel's end or `out`): int8 activations
 * in lanes, RP_T activation rows per pass over a panel; float ones through the row-major kernels on each
 * panel unpacked (see "repacked q4"). */
static void run_rows_rp(int kind, int q8a, const wmat *w, const acts *a, int64_t o0, int64_t o1)
{
    if (q8a) {
        for (int64_t o = o0; o < o1; o += RP)
            for (int64_t t = 0; t < a->T; t += RP_T) {
                const int64_t p = o / RP, nt = a->T - t < RP_T ? a->T - t : RP_T;
                if (kind == K_Q8_0) {
                    switch (nt) { /* NT, BPG and Q8 constants in each: the loops unroll */
                    case 1: rp_panel_q8a(w, a, p, t, 1, 1, 1); break;
                    case 2: rp_panel_q8a(w, a, p, t, 2, 1, 1); break;
                    case 3: rp_panel_q8a(w, a, p, t, 3, 1, 1); break;
                    default: rp_panel_q8a(w, a, p, t, RP_T, 1, 1); break;
                    }
                } else if (kind == K_Q4_1) {
                    switch (nt) {
                    case 1: rp_panel_q8a(w, a, p, t, 1, 1, 0); break;
                    case 2: rp_panel_q8a(w, a, p, t, 2, 1, 0); break;
                    case 3: rp_panel_q8a(w, a, p, t, 3, 1, 0); break;
                    default: rp_panel_q8a(w, a, p, t, RP_T, 1, 0); break;
                    }
                } else {
                    switch (nt) {
                    case 1: rp_panel_q8a(w, a, p, t, 1, 2, 0); break;
                    case 2: rp_panel_q8a(w, a, p, t, 2, 2, 0); break;
                    case 3: rp_panel_q8a(w, a, p, t, 3, 2, 0); break;
                    default: rp_panel_q8a(w, a, p, t, RP_T, 2, 0); break;
                    }
                }
            }
        return;
    }
    const int64_t half = w->in / 2;
    uint8_t *buf = malloc((size_t)(kind != K_Q4 ? RP * w->row_bytes : RP * half + 4 * RP * w->ng) + 1);
    for (int64_t o = o0 - o0 % RP; o < o1; o += RP) {
        const int64_t r0 = o0 > o ? o0 - o : 0, r1 = o1 - o < RP ? o1 - o : RP;
        if (!buf) { /* no scratch: the rows say so rather than hold stale values */
            for (int64_t t = 0; t < a->T; t++)
                for (int64_t r = r0; r < r1; r++) a->y[t * w->out + o + r] = NAN;
            continue;
        }
        wmat u = *w;
        u.rp = 0;
        u.p0 = buf;
        if (kind == K_Q8_0) {
            rp_unpack_q8_0(w, o / RP, buf);
        } else if (kind == K_Q4_1) {
            rp_unpack_q4_1(w, o / RP, buf);
        } else {
            rp_unpack(w, o / RP, buf);
            u.p1 = buf + RP * half;
            u.p2 = u.p1 + 2 * RP * w->ng;
        }
        acts b = *a;
        b.y = a->y + o; /* rows r of the scratch are rows o + r of y (whose row stride stays w->out) */
        RUNNERS[kind](&u, &b, r0, r1);
    }
    free(buf);
}

/* ------------------------------------------------------------------ activations */

/* Nibble kinds: the activations for each DU bytes of a row (see the top of the file), and the group
 * sums of x. q4 (MLX) byte b of a row holds elements 2b (low) and 2b+1 (high); GGUF byte j of a
 * block holds elements j (low) and j+16 (high). q4_0 and q4_1 share one preparation. */
static void prep_row(int kind, const wmat *w, const float *x, float *xp, float *xs)
{
    const int G = kind == K_Q4 ? 64 : 32;
    for (int64_t k = 0; k < w->in; k += 2 * DU) {
        for (int j = 0; j < DU; j++) {
            int64_t lo;
            if (kind == K_Q4) {
                lo = k + 2 * j;
            } else { /* byte k / 2 + j of the row is byte b % 16 of block b / 16 */
                const int64_t b = k / 2 + j;
                lo = 32 * (b / 16) + b % 16;
            }
            const int64_t hi = kind == K_Q4 ? lo + 1 : lo + 16;
            const float xb = x[hi] * 0.0625f;
            xp[k + j] = x[lo] - xb;
            xp[k + DU + j] = xb;
        }
    }
    for (int64_t g = 0; g < w->ng; g++) {
        vf s = vf_load(x + g * G);
        for (int v = 1; v < G / VL; v++) s = vf_add(s, vf_load(x + g * G + v * VL));
        xs[g] = vf_hsum(s);
    }
    for (int64_t g = w->ng; g < w->ngp; g++) xs[g] = 0.0f;
}

/* q8a: x rounded to int8 per block of 32 (scale max|x| / 127, round half away from zero), in the order
 * vb_nib unpacks the weights: GGUF blocks as they are, q4's 32-element halves of a group as their even
 * then odd elements; the blocks' scales, and per weight group the sum of the int8 x times its scale. */
static void prep_q8a_row(int kind, const wmat *w, const float *x, int8_t *xq, float *dx, float *xs)
{
    const int64_t nb = w->in / 32;
    const int bpg = kind == K_Q4 ? 2 : 1;
    for (int64_t g = 0; g < w->ngp; g++) xs[g] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float v[32];
        const float amax = q8a_load(x + 32 * b, kind == K_Q4, v);
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        dx[b] = d;
        xs[b / bpg] += d * (float)q8a_round(v, id, xq + 32 * b);
    }
}

typedef struct {
    int kind, q8a;
    const wmat *w;
    const float *x;
    float *xp, *xs, *dx;
    int8_t *xq;
} prep_job;

static void prep_task(const void *ctx, int64_t t)
{
    const prep_job *p = ctx;
    const int64_t in = p->w->in;
    if (p->q8a)
        prep_q8a_row(p->kind, p->w, p->x + t * in, p->xq + t * in, p->dx + t * (in / 32), p->xs + t * p->w->ngp);
    else
        prep_row(p->kind, p->w, p->x + t * in, p->xp + t * in, p->xs + t * p->w->ngp);
}

/* ------------------------------------------------------------------ calls */

/* One matrix of a call and the tasks (runs of output rows) it is split into. */
typedef struct {
    int kind;
    int q8a;       /* int8 activations (RK_Q8A asked and the kind has them) */
    wmat w;
    float *y;      /* [T, out] */
    acts a;        /* the current T tile */
    int64_t rows;  /* output rows per task */
    int64_t task0; /* its first task among all the call's matrices */
} part;

typedef struct {
    const part *parts;
    int n;
} job;

static void run_task(const void *ctx, int64_t task)
{
    const job *jb = ctx;
    int j = 0;
    while (j + 1 < jb->n && jb->parts[j + 1].task0 <= task) j++;
    const part *p = &jb->parts[j];
    const int64_t o0 = (task - p->task0) * p->rows, o1 = o0 + p->rows < p->w.out ? o0 + p->rows : p->w.out;
    if (p->w.rp)
        run_rows_rp(p->kind, p->q8a, &p->w, &p->a, o0, o1);
    else
        (p->q8a ? RUNNERS_Q8A : RUNNERS)[p->kind](&p->w, &p->a, o0, o1);
}

static int wmat_init(wmat *w, int kind, int64_t out, int64_t in, const void *p0, const void *p1, const void *p2)
{
    if (kind < 0 || kind >= K_COUNT || out < 0 || in < 0) return RK_EINVAL;
    if (kind == K_Q4 ? in % 64 : (kind >= K_Q4_0 && in % 32)) return RK_EINVAL;
    *w = (wmat){out, in, 0, 0, 0, p0, p1, p2, 0};
    switch (kind) {
    case K_F32: w->row_bytes = 4 * in; break;
    case K_F16: w->row_bytes = 2 * in; break;
    case K_Q8: w->row_bytes = in; break;
    case K_Q4: w->ng = in / 64; w->row_bytes = in / 2; break;
    case K_Q4_0: w->ng = in / 32; w->row_bytes = 18 * w->ng; break;
    case K_Q4_1: w->ng = in / 32; w->row_bytes = 20 * w->ng; break;
    case K_Q8_0: w->ng = in / 32; w->row_bytes = 34 * w->ng; break;
    }
    w->ngp = (w->ng + DU - 1) / DU * DU;
    return RK_OK;
}

/* Threads a call splits its work over: the calling thread's own count while an engine computes on it
 * (rk_use_threads; each engine applies its own, so two engines on two threads do not fight over one
 * setting), else the process's default (rk_set_threads). The pool itself is shared and safe to call
 * from several threads at once (pool_run: one caller at a time uses the helpers, others run solo). */
static int g_threads = 1;
static _Thread_local int t_threads; /* 0: the process's default */

static int threads_now(void) { return t_threads > 0 ? t_threads : g_threads; }

RK_API void rk_set_threads(int n) { g_threads = n < 1 ? 1 : n; }
RK_API void rk_use_threads(int n) { t_threads = n < 0 ? 0 : n; }
RK_API int rk_get_threads(void) { return threads_now(); }
RK_API const char *rk_backend(void) { return RK_BACKEND; }
RK_API const char *rk_dot(void) { return RK_DOT; } /* the int8 dot product of the q8a path */
RK_API const char *rk_rp_kernel(void) { return RK_RP_KERNEL; } /* that of repacked q4 (rp_block) */

/* Counters since load, for benchmarks: multi-threaded jobs shared with helpers, those run alone in a
 * solo period, stalls, the nanoseconds spent in them, the tasks of shared jobs and those of them
 * helpers ran. */
RK_API void rk_pool_stats(int64_t out[6])
{
    pthread_mutex_lock(&pool.busy);
    memcpy(out, pool.stats, sizeof pool.stats);
    pthread_mutex_unlock(&pool.busy);
}

/* Work below which a second thread costs more than it saves (multiply-adds). */
#define MIN_WORK_PER_THREAD (1 << 15)

/* Threads for a job of `work` multiply-adds: this thread's count, fewer for small jobs. */
static int threads_for(int64_t work)
{
    const int most = threads_now();
    int nth = most;
    if ((int64_t)nth * MIN_WORK_PER_THREAD > work) nth = (int)(work / MIN_WORK_PER_THREAD) + 1;
    return nth > most ? most : nth;
}

RK_INTERNAL int rk_threads_for(int64_t work) { return threads_for(work); }

RK_INTERNAL void rk_pool_run(pool_task_fn fn, const void *ctx, int64_t ntask, int threads)
{
    pool_run(fn, ctx, ntask, threads);
}
#define MAX_MATRICES 16
#define DECODE_TASKS_PER_THREAD 4 /* balances late helpers and big.LITTLE cores; each claim moves a cache line */
#define DECODE_BATCH_T 8           /* rows up to which a call on a repacked matrix is split as a generated token's */

/* RK_Q8A, the flag on a kind code for int8 activations: rkinternal.h */
/* Flag on the q4, q4_1 and q8_0 kind codes: the parts are repacked (rows in lanes, see "repacked q4"), rows
 * padded to RP: q4 (q, scales, biases); q4_1 (q, d as scales, m as biases); q8_0 (q, d as scales, weight sums). */
#define RK_RP 32
RK_INLINE int rp_kind(int kind) { return kind == K_Q4 || kind == K_Q4_1 || kind == K_Q8_0; }

/* Preparations of x a call may need, shared by its matrices: nibble rewrites for q4 and for GGUF
 * kinds, and int8 activations in q4's order and in the GGUF blocks' one. */
enum { F_NIB_Q4, F_NIB_GGUF, F_Q8A_Q4, F_Q8A_GGUF, F_COUNT };

RK_INLINE int family(const part *p)
{
    if (p->q8a) return p->kind == K_Q4 ? F_Q8A_Q4 : F_Q8A_GGUF;
    if (is_nibble_kind(p->kind)) return p->kind == K_Q4 ? F_NIB_Q4 : F_NIB_GGUF;
    return -1;
}

/* Output rows per task of a matrix with `out` rows, T activation rows, among matrices of `outs` rows
 * in all: decode (and a batched decode step's few rows on a repacked matrix), tasks of whole micro-tiles
 * (panels), a few per thread, sized by this matrix's share; prefill, PREFILL_ROWS rows, whose weights stay in
 * cache across x tiles. */
static int64_t task_rows(int64_t out, int64_t T, int nth, int64_t outs, int rp)
{
    const int64_t unit = rp ? RP : DECODE_MR; /* repacked: whole panels, in every call */
    int64_t rows = rp ? (PREFILL_ROWS + RP - 1) / RP * RP : PREFILL_ROWS;
    if (T == 1 || (rp && T <= DECODE_BATCH_T)) { /* a generated token, or a batched step's few on panels */
        const int64_t tasks = nth == 1 ? 1 : (DECODE_TASKS_PER_THREAD * nth * out + outs - 1) / outs;
        rows = (out + tasks - 1) / tasks;
        rows = (rows + unit - 1) / unit * unit;
    }
    return rows < 1 ? 1 : rows;
}

/* y_j[T, out_j] = x[T, in] @ W_j.T for the n matrices described by `desc`, 6 int64 each:
 * kind (| RK_Q8A), out, y (pointer), then the parts by kind: f32/f16 (w); q8 (q, scales); q4 (q, scales,
 * biases); q4_0/q4_1/q8_0 (blocks); unused parts 0. All C-contiguous as in inference.quant.part_layout.
 * The matrices run as one job (one wake-up of the helpers), and share each preparation of x.
 * Returns RK_OK, or RK_EINVAL (bad count, kind or shape) / RK_ENOMEM (scratch for the activations). */
RK_API int rk_linear_many(int n, int64_t T, int64_t in, const float *x, const int64_t *desc)
{
    if (n < 1 || n > MAX_MATRICES || T < 0 || in < 0) return RK_EINVAL;
    part parts[MAX_MATRICES];
    int64_t ngp_max = 0, work = 0;
    int want[F_COUNT] = {0}, first[F_COUNT];
    for (int j = 0; j < n; j++) {
        const int64_t *d = desc + 6 * j;
        part *p = &parts[j];
        p->kind = (int)(d[0] & ~(int64_t)(RK_Q8A | RK_RP));
        const int rc = wmat_init(&p->w, p->kind, d[1], in, (const void *)(intptr_t)d[3],
                                 (const void *)(intptr_t)d[4], (const void *)(intptr_t)d[5]);
        if (rc) return rc;
        if ((p->w.rp = (d[0] & RK_RP) != 0) && !rp_kind(p->kind)) return RK_EINVAL;
        p->q8a = (d[0] & RK_Q8A) && RUNNERS_Q8A[p->kind] != NULL;
        p->y = (float *)(intptr_t)d[2];
        const int f = family(p);
        if (f >= 0 && !want[f]) {
            want[f] = 1;
            first[f] = j;
        }
        if (p->w.ngp > ngp_max) ngp_max = p->w.ngp;
        work += p->w.out;
    }
    if (T == 0) return RK_OK;
    if (in == 0) {
        for (int j = 0; j < n; j++) memset(parts[j].y, 0, sizeof(float) * T * parts[j].w.out);
        return RK_OK;
    }

    const int64_t tt_max = T < TILE_T ? T : TILE_T;
    float *xp[F_COUNT] = {NULL}, *xs[F_COUNT] = {NULL}, *dx[F_COUNT] = {NULL};
    int8_t *xq[F_COUNT] = {NULL};
    int rc = RK_OK;
    for (int f = 0; f < F_COUNT; f++) {
        if (!want[f]) continue;
        const int q8a = f >= F_Q8A_Q4;
        if (!(xs[f] = malloc(sizeof(float) * tt_max * ngp_max))) rc = RK_ENOMEM;
        if (!q8a && !(xp[f] = malloc(sizeof(float) * tt_max * in))) rc = RK_ENOMEM;
        if (q8a && (!(xq[f] = malloc(tt_max * in)) || !(dx[f] = malloc(sizeof(float) * tt_max * (in / 32)))))
            rc = RK_ENOMEM;
    }

    for (int64_t t0 = 0; t0 < T && rc == RK_OK; t0 += TILE_T) {
        const int64_t tt = T - t0 < TILE_T ? T - t0 : TILE_T;
        const int nth = threads_for(work * in * tt);
        for (int f = 0; f < F_COUNT; f++) {
            if (!want[f]) continue;
            /* any matrix of the family: prep only reads its kind's order, in and ngp */
            const part *p = &parts[first[f]];
            const prep_job pj = {p->kind, p->q8a, &p->w, x + t0 * in, xp[f], xs[f], dx[f], xq[f]};
            pool_run(prep_task, &pj, tt, nth);
        }
        int64_t ntask = 0;
        for (int j = 0; j < n; j++) {
            part *p = &parts[j];
            const int f = family(p);
            p->a = (acts){f >= 0 && xp[f] ? xp[f] : x + t0 * in, f >= 0 ? xs[f] : NULL, f >= 0 ? xq[f] : NULL,
                          f >= 0 ? dx[f] : NULL, p->y + t0 * p->w.out, tt};
            p->rows = task_rows(p->w.out, tt, nth, work, p->w.rp);
            p->task0 = ntask;
            ntask += (p->w.out + p->rows - 1) / p->rows;
        }
        const job jb = {parts, n};
        pool_run(run_task, &jb, ntask, nth);
    }
    for (int f = 0; f < F_COUNT; f++) {
        free(xp[f]);
        free(xs[f]);
        free(dx[f]);
        free(xq[f]);
    }
    return rc;
}

/* Prep tasks of a grouped call: row t of the part whose rows start at prefix[j]. */
typedef struct {
    const prep_job *jobs;
    const int64_t *prefix;
    int n;
} grouped_prep;

static void grouped_prep_task(const void *ctx, int64_t task)
{
    const grouped_prep *g = ctx;
    int j = 0;
    while (j + 1 < g->n && g->prefix[j + 1] <= task) j++;
    if (g->jobs[j].w) prep_task(&g->jobs[j], task - g->prefix[j]);
}


/* y_j[T_j, out_j] = x_j[T_j, in] @ W_j.T for n matrices that each have their own activations: one MoE
 * block's experts (gate and up of every expert, then every down) as one job instead of one call each.
 * `desc` holds 8 int64 per matrix: the 6 of rk_linear_many, then x_j (pointer) and T_j <= 128 (one
 * activation tile). Each y_j gets the bits rk_linear_many gives it alone. Returns as rk_linear_many. */
RK_API int rk_linear_grouped(int n, int64_t in, const int64_t *desc)
{
    if (n < 1 || n > MAX_GROUPED || in < 1) return RK_EINVAL;
    part parts[MAX_GROUPED];
    prep_job jobs[MAX_GROUPED];
    int64_t prefix[MAX_GROUPED + 1], work = 0, ntask = 0;
    void *scratch[MAX_GROUPED];
    int rc = RK_OK;
    prefix[0] = 0;
    for (int j = 0; j < n; j++) {
        const int64_t *d = desc + 8 * j;
        part *p = &parts[j];
        scratch[j] = NULL;
        p->kind = (int)(d[0] & ~(int64_t)(RK_Q8A | RK_RP));
        const int64_t T = d[7];
        if (T < 0 || T > TILE_T) rc = RK_EINVAL;
        if (rc || (rc = wmat_init(&p->w, p->kind, d[1], in, (const void *)(intptr_t)d[3],
                                  (const void *)(intptr_t)d[4], (const void *)(intptr_t)d[5])) ||
            ((p->w.rp = (d[0] & RK_RP) != 0) && !rp_kind(p->kind) && (rc = RK_EINVAL))) {
            n = j;
            break;
        }
        p->q8a = (d[0] & RK_Q8A) && RUNNERS_Q8A[p->kind] != NULL;
        p->y = (float *)(intptr_t)d[2];
        const float *x = (const float *)(intptr_t)d[6];
        const int f = family(p);
        float *xp = NULL, *xs = NULL, *dx = NULL;
        int8_t *xq = NULL;
        int shared = -1; /* an earlier matrix of the same activations and preparation (decode: every gate and up) */
        for (int k = 0; k < j && f >= 0 && shared < 0; k++)
            if (jobs[k].x == x && parts[k].a.T == T && family(&parts[k]) == f && parts[k].w.ngp == p->w.ngp) shared = k;
        if (shared >= 0) {
            p->a = parts[shared].a;
            p->a.y = p->y;
            jobs[j] = (prep_job){p->kind, p->q8a, NULL, x, NULL, NULL, NULL, NULL};
            prefix[j + 1] = prefix[j];
            work += p->w.out * T;
            continue;
        }
        if (f >= 0) { /* one block per matrix: [xs | xp or dx | xq] */
            const int64_t fl = T * p->w.ngp + (p->q8a ? T * (in / 32) : T * in);
            uint8_t *buf = scratch[j] = malloc(sizeof(float) * fl + (p->q8a ? T * in : 0) + 1);
            if (!buf) {
                rc = RK_ENOMEM;
                n = j + 1;
                break;
            }
            xs = (float *)buf;
            if (p->q8a) {
                dx = xs + T * p->w.ngp;
                xq = (int8_t *)(dx + T * (in / 32));
            } else {
                xp = xs + T * p->w.ngp;
            }
        }
        jobs[j] = (prep_job){p->kind, p->q8a, f >= 0 ? &p->w : NULL, x, xp, xs, dx, xq};
        p->a = (acts){xp ? xp : x, xs, xq, dx, p->y, T};
        prefix[j + 1] = prefix[j] + (f >= 0 ? T : 0);
        work += p->w.out * T;
    }
    if (rc == RK_OK) {
        int64_t outs = 0;
        for (int k = 0; k < n; k++) outs += parts[k].w.out;
        const int nth = threads_for(work * in);
        const grouped_prep gp = {jobs, prefix, n};
        if (prefix[n]) pool_run(grouped_prep_task, &gp, prefix[n], nth);
        for (int j = 0; j < n; j++) {
            part *p = &parts[j];
            p->rows = task_rows(p->w.out, p->a.T, nth, outs, p->w.rp);
            p->task0 = ntask;
            ntask += p->a.T ? (p->w.out + p->rows - 1) / p->rows : 0;
        }
        const job jb = {parts, n};
        if (ntask) pool_run(run_task, &jb, ntask, nth);
    }
    for (int j = 0; j < n; j++) free(scratch[j]);
    return rc;
}

/* y[T, out] = x[T, in] @ W.T: rk_linear_many for one matrix, parts passed directly. */
RK_API int rk_linear(int kind, int64_t T, int64_t out, int64_t in, const float *x, float *y,
                     const void *p0, const void *p1, const void *p2)
{
    const int64_t desc[6] = {kind, out, (int64_t)(intptr_t)y, (int64_t)(intptr_t)p0, (int64_t)(intptr_t)p1,
                             (int64_t)(intptr_t)p2};
    return rk_linear_many(1, T, in, x, desc);
}

/* The decode descriptors' layouts, from the lists their enums come from (RK_DECODE_HEADER, ...), for
 * Python (inference/steps/descriptor.py), so the two cannot disagree: table `which` = 0, 1, ... as
 * "table field:type field:type ..." (types int, f32, ptr; a list of matrices: "table name name ..."),
 * NULL past the last. */
RK_API const char *rk_fields(int which)
{
    static const char *const tables[] = {
        "matrix" RK_MATRIX(RK_FIELD_NAME),
        "decode.header" RK_DECODE_HEADER(RK_FIELD_NAME),
        "decode.layer" RK_DECODE_LAYER(RK_FIELD_NAME),
        "decode.matrices" RK_DECODE_MATRICES(RK_MATRIX_NAME),
        "moe.header" RK_DECODE_HEADER(RK_FIELD_NAME) RK_MOE_HEADER(RK_FIELD_NAME),
        "moe.layer" RK_DECODE_LAYER(RK_FIELD_NAME) RK_MOE_LAYER(RK_FIELD_NAME),
        "moe.matrices" RK_DECODE_MATRICES(RK_MATRIX_NAME) RK_MOE_MATRICES(RK_MATRIX_NAME),
        "gemma4.header" RK_GEMMA4_HEADER(RK_FIELD_NAME),
        "gemma4.layer" RK_GEMMA4_LAYER(RK_FIELD_NAME),
        "gemma4.matrices" RK_GEMMA4_MATRICES(RK_MATRIX_NAME),
    };
    return which >= 0 && which < (int)(sizeof tables / sizeof *tables) ? tables[which] : NULL;
}

#ifndef RK_NO_PYTHON
#include "rkpython.h"
#endif
