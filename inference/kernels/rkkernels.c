/* rkmojo's compiled kernels: y[T, out] = x[T, in] @ W[out, in].T with W in any storage kind of
 * inference/quant.py, dequantized block by block into registers (never as a whole matrix).
 *
 * Plain C functions loaded through ctypes (inference/kernels/_lib.py); the Python module init at the
 * bottom only exists so setuptools can build and import the file as an extension.
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
 * shared by all output rows.
 */
#ifndef RK_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "rkkernels_simd.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* gcc: -std=c11 already implies -ffp-contract=off */
#endif

#define RK_API __attribute__((visibility("default")))

/* storage kinds, in the order of inference.quant.KINDS */
enum { K_F32, K_F16, K_Q8, K_Q4, K_Q4_0, K_Q4_1, K_Q8_0, K_COUNT };

enum { RK_OK = 0, RK_EINVAL = 1, RK_ENOMEM = 2 };

#define TILE_T 128    /* activation rows prepared at once */
#define MAXR 6        /* largest micro-tile side */
#define PREFILL_NR 6  /* activation rows per prefill micro-tile (decode tiles 4 output rows) */

typedef struct {
    int64_t out, in;
    int64_t ng;          /* groups per row: q4 (64), q4_0 / q4_1 / q8_0 (32) */
    int64_t ngp;         /* ng rounded up to a batch of 8 */
    int64_t row_bytes;   /* bytes per row of p0 */
    const uint8_t *p0;   /* w | q | blocks */
    const uint8_t *p1;   /* q8: scales f32 [out]; q4: scales f16 [out, ng] */
    const uint8_t *p2;   /* q4: biases f16 [out, ng] */
} wmat;

typedef struct {
    const float *x;  /* [T, in]; nibble kinds: rewritten per byte pair (see prep_row) */
    const float *xs; /* [T, ng rounded up to 8] per-group sums of x, zero-padded (nibble kinds) */
    float *y;        /* [T, out] */
    int64_t T;
} acts;

RK_INLINE float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* Decode (one activation row) streams weight rows from DRAM at their full rate only with a software
 * prefetch this many bytes ahead (hardware prefetchers lose track of 4 interleaved rows). */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 512
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

RK_INLINE void dense_dec8(const int kind, const uint8_t *row, int64_t k, vf *w)
{
    if (kind == K_F32)
        dec8_f32((const float *)row + k, w);
    else if (kind == K_F16)
        dec8_f16((const uint16_t *)row + k, w);
    else
        dec8_i8((const int8_t *)row + k, w);
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
    for (; k + 16 <= k1; k += 16)
        for (int i = 0; i < MR; i++) {
            vf wv[2 * NV8];
            if (NR == 1) prefetch_ahead(row[i] + (w->row_bytes / in) * k);
            dense_dec8(kind, row[i], k, wv);
            dense_dec8(kind, row[i], k + 8, wv + NV8);
            for (int u = 0; u < 2 * NV8; u++)
                for (int r = 0; r < NR; r++)
                    acc[i][r][u & 1] = vf_fma(wv[u], vf_load(x[r] + k + u * VL), acc[i][r][u & 1]);
        }
    if (k1 < in) {
        tile_suspend(MR, NR, st, acc);
        return;
    }
    if (k + 8 <= in) {
        for (int i = 0; i < MR; i++) {
            vf wv[NV8];
            dense_dec8(kind, row[i], k, wv);
            for (int u = 0; u < NV8; u++)
                for (int r = 0; r < NR; r++)
                    acc[i][r][u & 1] = vf_fma(wv[u], vf_load(x[r] + k + u * VL), acc[i][r][u & 1]);
        }
        k += 8;
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

RK_INLINE void q80_tile(const int MR, const int NR, const wmat *w, const acts *a, int64_t o, int64_t t,
                        int64_t k0, int64_t k1, vf *st)
{
    const float *x[MAXR];
    vf acc[MAXR][MAXR][NA];
    for (int r = 0; r < NR; r++) x[r] = a->x + (t + r) * w->in;
    tile_begin(MR, NR, k0, st, acc);

    for (int64_t b = k0 / 32; b < k1 / 32; b++) {
        const int64_t k = 32 * b;
        for (int i = 0; i < MR; i++) {
            const uint8_t *blk = w->p0 + (o + i) * w->row_bytes + 34 * b;
            if (NR == 1) prefetch_ahead(blk);
            vf gs[MAXR];
            for (int r = 0; r < NR; r++) gs[r] = vf_zero();
            for (int c = 0; c < 4; c++) {
                vf wv[NV8];
                dec8_i8((const int8_t *)(blk + 2 + 8 * c), wv);
                for (int v = 0; v < NV8; v++)
                    for (int r = 0; r < NR; r++) gs[r] = vf_fma(wv[v], vf_load(x[r] + k + 8 * c + v * VL), gs[r]);
            }
            const vf d = vf_set1(load_f16(blk));
            for (int r = 0; r < NR; r++) acc[i][r][0] = vf_fma(d, gs[r], acc[i][r][0]);
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

RK_INLINE const uint8_t *gguf_block(const int kind, const wmat *w, int64_t o, int64_t g)
{
    return w->p0 + o * w->row_bytes + (kind == K_Q4_0 ? 18 : 20) * g;
}

/* The nibbles of group g of row o. */
RK_INLINE const uint8_t *nib_bytes(const int kind, const wmat *w, int64_t o, int64_t g)
{
    if (kind == K_Q4) return w->p0 + o * w->row_bytes + 32 * g;
    return gguf_block(kind, w, o, g) + (kind == K_Q4_0 ? 2 : 4);
}

/* Scales and biases of groups g0 .. g0+n-1 (n <= 8) of row o as floats, biases zero past n. q4 keeps
 * them in arrays of their own, which convert 8 at once. (q4_0 stores no bias: its q - 8 is -8 d.) */
RK_INLINE void nib_params(const int kind, const wmat *w, int64_t o, int64_t g0, int n, float *s, float *m)
{
    if (kind == K_Q4 && n == 8) {
        vf v[NV8];
        dec8_f16((const uint16_t *)w->p1 + o * w->ng + g0, v);
        for (int u = 0; u < NV8; u++) vf_store(s + u * VL, v[u]);
        dec8_f16((const uint16_t *)w->p2 + o * w->ng + g0, v);
        for (int u = 0; u < NV8; u++) vf_store(m + u * VL, v[u]);
        return;
    }
    for (int j = 0; j < 8; j++) {
        if (j >= n) {
            m[j] = 0.0f;
        } else if (kind == K_Q4) {
            s[j] = load_f16(w->p1 + 2 * (o * w->ng + g0 + j));
            m[j] = load_f16(w->p2 + 2 * (o * w->ng + g0 + j));
        } else {
            const uint8_t *blk = gguf_block(kind, w, o, g0 + j);
            s[j] = load_f16(blk);
            m[j] = kind == K_Q4_0 ? -8.0f * s[j] : load_f16(blk + 2);
        }
    }
}

/* Each 8 bytes of nibbles meet 16 prepared activations: 8 for the low nibbles, 8 for the bytes.
 * Groups go in batches of 8 (counted from the row start, so every tiling batches alike): scales and
 * biases convert together, and the batch's bias part m . xsum lands in the accumulator's lanes. */
RK_INLINE void nib_tile(const int kind, const int MR, const int NR, const wmat *w, const acts *a, int64_t o,
                        int64_t t, int64_t k0, int64_t k1, vf *st)
{
    const int G = kind == K_Q4 ? 64 : 32, nchunk = G / 16;
    const float *x[MAXR], *xs[MAXR];
    vf acc[MAXR][MAXR][NA];
    for (int r = 0; r < NR; r++) {
        x[r] = a->x + (t + r) * w->in;
        xs[r] = a->xs + (t + r) * w->ngp;
    }
    tile_begin(MR, NR, k0, st, acc);

    const int64_t g1 = k1 / G;
    for (int64_t g0 = k0 / G; g0 < g1; g0 += 8) {
        const int n = g1 - g0 < 8 ? (int)(g1 - g0) : 8;
        float sc[MAXR][8], mb[MAXR][8];
        for (int i = 0; i < MR; i++) nib_params(kind, w, o + i, g0, n, sc[i], mb[i]);
        for (int j = 0; j < n; j++) {
            const int64_t k = G * (g0 + j);
            for (int i = 0; i < MR; i++) {
                const uint8_t *q = nib_bytes(kind, w, o + i, g0 + j);
                if (NR == 1) prefetch_ahead(q);
                vf gs[MAXR];
                for (int r = 0; r < NR; r++) gs[r] = vf_zero();
                for (int c = 0; c < nchunk; c++) {
                    vf lo[NV8], by[NV8];
                    dec8_nib(q + 8 * c, lo, by);
                    const int64_t kc = k + 16 * c;
                    for (int v = 0; v < NV8; v++)
                        for (int r = 0; r < NR; r++) {
                            gs[r] = vf_fma(lo[v], vf_load(x[r] + kc + v * VL), gs[r]);
                            gs[r] = vf_fma(by[v], vf_load(x[r] + kc + 8 + v * VL), gs[r]);
                        }
                }
                const vf sv = vf_set1(sc[i][j]);
                for (int r = 0; r < NR; r++) acc[i][r][0] = vf_fma(sv, gs[r], acc[i][r][0]);
            }
        }
        for (int i = 0; i < MR; i++) {
            vf m[NV8];
            dec8_f32(mb[i], m);
            for (int u = 0; u < NV8; u++)
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
#define KALIGN 512 /* K blocks start at whole batches of 8 groups (q4: 8 x 64), as T = 1 batches them */

/* Output rows [o0, o1) for all T activation rows. Decode (T = 1) runs 4 output rows side by side
 * over the whole row. Prefill runs 6 activation rows side by side, so each decoded weight block
 * serves 6 rows of x, and walks K in blocks so those x rows stay in L1 while the task's output rows
 * take their turns. */
RK_INLINE void run_rows(const int kind, const wmat *w, const acts *a, int64_t o0, int64_t o1)
{
    const int64_t in = w->in;
    int64_t o = o0;
    if (a->T == 1) {
        vf unused[MAXR * NA]; /* whole rows: nothing to carry between K blocks */
        for (; o + 4 <= o1; o += 4) tile(kind, 4, 1, w, a, o, 0, 0, in, unused);
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

/* ------------------------------------------------------------------ activations */

/* Nibble kinds: the activations for each 8 bytes of a row (see the top of the file), and the group
 * sums of x. q4 (MLX) byte j of a 16-element span holds elements 2j (low) and 2j+1 (high); GGUF
 * byte j of a block holds elements j (low) and j+16 (high). */
static void prep_row(int kind, const wmat *w, const float *x, float *xp, float *xs)
{
    const int G = kind == K_Q4 ? 64 : 32;
    for (int64_t k = 0; k < w->in; k += 16) {
        for (int j = 0; j < 8; j++) {
            int64_t lo, hi;
            if (kind == K_Q4) {
                lo = k + 2 * j;
                hi = lo + 1;
            } else { /* the 16-span is chunk c of block k / 32 */
                lo = (k & ~(int64_t)31) + (k & 16) / 2 + j;
                hi = lo + 16;
            }
            const float xb = x[hi] * 0.0625f;
            xp[k + j] = x[lo] - xb;
            xp[k + 8 + j] = xb;
        }
    }
    for (int64_t g = 0; g < w->ng; g++) {
        vf s = vf_load(x + g * G);
        for (int v = 1; v < G / VL; v++) s = vf_add(s, vf_load(x + g * G + v * VL));
        xs[g] = vf_hsum(s);
    }
    for (int64_t g = w->ng; g < w->ngp; g++) xs[g] = 0.0f;
}

/* ------------------------------------------------------------------ entry points */

static int g_threads = 1;

RK_API void rk_set_threads(int n) { g_threads = n < 1 ? 1 : n; }
RK_API int rk_get_threads(void) { return g_threads; }
RK_API const char *rk_backend(void) { return RK_BACKEND; }

/* Work below which a second thread costs more than it saves (multiply-adds). */
#define MIN_WORK_PER_THREAD (1 << 17)

/* y[T, out] = x[T, in] @ W.T. Parts by kind: f32/f16 (w); q8 (q, scales); q4 (q, scales, biases);
 * q4_0/q4_1/q8_0 (blocks). All C-contiguous as in inference.quant.part_layout. Returns RK_OK, or
 * RK_EINVAL (bad kind or shape) / RK_ENOMEM (scratch for the activations). */
RK_API int rk_linear(int kind, int64_t T, int64_t out, int64_t in, const float *x, float *y,
                     const void *p0, const void *p1, const void *p2)
{
    if (kind < 0 || kind >= K_COUNT || T < 0 || out < 0 || in < 0) return RK_EINVAL;
    if (kind == K_Q4 ? in % 64 : (kind >= K_Q4_0 && in % 32)) return RK_EINVAL;
    if (T == 0 || out == 0) return RK_OK;
    if (in == 0) {
        memset(y, 0, sizeof(float) * T * out);
        return RK_OK;
    }

    wmat w = {out, in, 0, 0, 0, p0, p1, p2};
    switch (kind) {
    case K_F32: w.row_bytes = 4 * in; break;
    case K_F16: w.row_bytes = 2 * in; break;
    case K_Q8: w.row_bytes = in; break;
    case K_Q4: w.ng = in / 64; w.row_bytes = in / 2; break;
    case K_Q4_0: w.ng = in / 32; w.row_bytes = 18 * w.ng; break;
    case K_Q4_1: w.ng = in / 32; w.row_bytes = 20 * w.ng; break;
    case K_Q8_0: w.ng = in / 32; w.row_bytes = 34 * w.ng; break;
    }
    w.ngp = (w.ng + 7) & ~(int64_t)7;
    const int nib = is_nibble_kind(kind);

    const int64_t tt_max = T < TILE_T ? T : TILE_T;
    float *xp = NULL, *xs = NULL;
    if (nib && (!(xp = malloc(sizeof(float) * tt_max * in)) || !(xs = malloc(sizeof(float) * tt_max * w.ngp)))) {
        free(xp);
        return RK_ENOMEM;
    }

    for (int64_t t0 = 0; t0 < T; t0 += TILE_T) {
        const int64_t tt = T - t0 < TILE_T ? T - t0 : TILE_T;
        const acts a = {nib ? xp : x + t0 * in, xs, y + t0 * out, tt};
        const int64_t work = out * in * tt;
        int nth = g_threads;
        if ((int64_t)nth * MIN_WORK_PER_THREAD > work) nth = (int)(work / MIN_WORK_PER_THREAD) + 1;
        if (nth > g_threads) nth = g_threads;
        /* Tasks of whole 4-row groups: decode aims at ~8 tasks per thread for dynamic balance
         * (big.LITTLE cores finish at different speeds); prefill keeps a task's weights in cache. */
        int64_t rows = tt == 1 ? (out + 8 * nth - 1) / (8 * nth) : PREFILL_ROWS;
        rows = (rows + 3) & ~(int64_t)3;
        const int64_t ntask = (out + rows - 1) / rows;
        const runner_fn run = RUNNERS[kind];

        if (nth == 1) { /* no OpenMP region at all: it costs about a microsecond even when serial */
            for (int64_t t = 0; t < tt && nib; t++) prep_row(kind, &w, x + (t0 + t) * in, xp + t * in, xs + t * w.ngp);
            for (int64_t o0 = 0; o0 < out; o0 += rows) run(&w, &a, o0, o0 + rows < out ? o0 + rows : out);
            continue;
        }
#pragma omp parallel num_threads(nth)
        {
            if (nib) {
#pragma omp for schedule(static)
                for (int64_t t = 0; t < tt; t++) prep_row(kind, &w, x + (t0 + t) * in, xp + t * in, xs + t * w.ngp);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < ntask; task++) {
                const int64_t o0 = task * rows, o1 = o0 + rows < out ? o0 + rows : out;
                run(&w, &a, o0, o1);
            }
        }
    }
    free(xp);
    free(xs);
    return RK_OK;
}

/* ------------------------------------------------------------------ Python module stub */

#ifndef RK_NO_PYTHON
static struct PyModuleDef rk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_rkkernels",
    .m_doc = "rkmojo kernels: plain C functions loaded with ctypes by inference.kernels._lib.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__rkkernels(void) { return PyModule_Create(&rk_module); }
#endif
