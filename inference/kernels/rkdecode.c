/* One decode step (one token, T = 1) through every layer of a Llama-style model in one call (a unit of
 * the kernel library: rkinternal.h). The Python layer code (inference/models/llama.py) is the
 * reference and runs prompts; this is its one-row case for generated tokens, without the ~40 numpy
 * temporaries and 5 kernel calls per layer that took a third of a SmolLM2 token (benchmarks/README.md at 9362a58).
 *
 * Per layer, in the order of llama.py:
 *   x = rms_norm(h) * attn_norm;  q, k, v = x @ Wq.T, Wk.T, Wv.T (one rk_linear_many)
 *   q, k = rope(q), rope(k) (rotate-half, cos/sin given);  K/V row `pos` = k, v (f32 or f16);  kpos[pos] = pos
 *   h += attention(q, K, V) @ Wo.T;  x = rms_norm(h) * mlp_norm
 *   g, u = x @ Wgate.T, Wup.T (one rk_linear_many);  h += (silu(g) * u) @ Wdown.T
 * The matmuls and attention are the kernels the Python path calls, with the same inputs' bits except
 * where the elementwise steps differ: RoPE, the residual adds and the KV rounding give numpy's bits;
 * the RMS norm's sum runs in vector lanes (numpy: pairwise) and silu's expf is libm's, so results agree
 * with the Python path within float rounding, not bit for bit. Elementwise steps run on the calling
 * thread and the kernels are deterministic, so the step's output does not depend on the thread count.
 *
 * The model is one int64 array: DM_FIELDS header fields, then DL_FIELDS per layer. Pointers are
 * addresses; eps and the attention scale are float32 bits; matrix codes are kind codes of rkkernels.c
 * (rkdescriptors.h lists them, for the enums here and for Python through `rk_fields`). A layer's K (and V)
 * cache is [n_kv, cap, head_dim], row `pos` of each head written here; kpos [cap] the position each row
 * holds (-1: empty), row p holding position p.
 *
 * rkmoedecode.c and rkgemma4.c, the other steps, share the helpers below (norm, RoPE, linear, K/V +
 * attention), declared in rkinternal.h.
 */
#include "rkdescriptors.h"
#include "rkinternal.h"

/* An IEEE half, rounded to nearest even as numpy's astype(float16) does (overflow to infinity). Scalar
 * on every backend: a decode step rounds 2 n_kv head_dim values per layer. */
RK_INTERNAL uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0); /* inf, NaN (quiet) */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                                  /* >= 65520: infinity */
    if (ax >= 0x38800000u) {                                                      /* a normal half */
        const uint32_t r = ax - 0x38000000u; /* exponent rebased from 127 to 15 */
        uint32_t h = r >> 13;
        const uint32_t rem = r & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry moves into the exponent, as it should */
        return sign | (uint16_t)h;
    }
    if (ax < 0x33000000u) return sign; /* below 2^-25 (or exactly it, a tie to even): zero */
    /* a subnormal half: round(|f| * 2^24); |f| = mant * 2^(e - 150) with e in [102, 112] */
    const int e = (int)(ax >> 23), shift = 126 - e; /* 14 .. 24 */
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u, half = 1u << (shift - 1);
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}

/* dst[i] = f32_to_f16(src[i]): the rounding the decode step stores K/V with, for the tests. */
RK_API void rk_f16_round(int64_t n, const float *src, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

/* y[0:n] = x * (1 / sqrt(mean(x^2) + eps)) * w, the product in numpy's order (w NULL: no weight) */
RK_INTERNAL void dec_rms_norm(const float *x, const float *w, int64_t n, float eps, float *y)
{
    vf acc = vf_zero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        const vf v = vf_load(x + i);
        acc = vf_fma(v, v, acc);
    }
    float s = vf_hsum(acc);
    for (; i < n; i++) s += x[i] * x[i];
    const float r = 1.0f / sqrtf(s / (float)n + eps);
    if (w)
        for (i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (i = 0; i < n; i++) y[i] = x[i] * r;
}

/* heads [n, D]: dims [0, r) and [r, 2r) rotated as apply_rope in models/base.py */
RK_INTERNAL void dec_rope(float *x, int64_t n, int64_t D, int64_t r, const float *c, const float *s)
{
    for (int64_t h = 0; h < n; h++) {
        float *v = x + h * D;
        for (int64_t j = 0; j < r; j++) {
            const float x1 = v[j], x2 = v[r + j];
            const float a = x1 * c[j], b = x2 * s[j], e = x2 * c[j], f = x1 * s[j];
            v[j] = a - b;
            v[r + j] = e + f;
        }
    }
}

/* One rk_linear_many of `n` matrices of a layer (its matrix fields at `mats`, from matrix m0) on `rows`
 * rows x [rows, in]: y[j] [rows, outs[j]]. Each row's result has the bits it has alone (rkkernels.c). */
RK_INTERNAL int dec_linear_rows(const int64_t *mats, int m0, int n, int64_t flag, int64_t rows, int64_t in,
                                const float *x, float *const *y, const int64_t *outs)
{
    int64_t desc[6 * 3];
    for (int j = 0; j < n; j++) {
        const int64_t *m = mats + (m0 + j) * DL_MAT_FIELDS;
        int64_t *d = desc + 6 * j;
        d[0] = m[0] | flag;
        d[1] = outs[j];
        d[2] = (int64_t)(intptr_t)y[j];
        d[3] = m[1];
        d[4] = m[2];
        d[5] = m[3];
    }
    return rk_linear_many(n, rows, in, x, desc);
}

/* dec_linear_rows of one row x [in] */
RK_INTERNAL int dec_linear(const int64_t *mats, int m0, int n, int64_t flag, int64_t in, const float *x, float *const *y,
                      const int64_t *outs)
{
    return dec_linear_rows(mats, m0, n, flag, 1, in, x, y, outs);
}

/* Writes k, v [n_kv, D] as row `row` of each head of the cache K, V [n_kv, cap, D] (f32, or halves when f16). */
RK_INTERNAL void dec_kv_store(uint8_t *K, uint8_t *V, const float *k, const float *v, int64_t nkv, int64_t D, int64_t cap,
                         int64_t row, int f16)
{
    const int64_t esz = f16 ? 2 : 4;
    for (int64_t hd = 0; hd < nkv; hd++) {
        uint8_t *kr = K + ((hd * cap + row) * D) * esz, *vr = V + ((hd * cap + row) * D) * esz;
        if (f16)
            for (int64_t d = 0; d < D; d++) {
                ((uint16_t *)kr)[d] = f32_to_f16(k[hd * D + d]);
                ((uint16_t *)vr)[d] = f32_to_f16(v[hd * D + d]);
            }
        else {
            memcpy(kr, k + hd * D, sizeof(float) * D);
            memcpy(vr, v + hd * D, sizeof(float) * D);
        }
    }
}

/* Appends k, v [n_kv, D] as row `pos` of each head of the cache K, V [n_kv, cap, D] (f32, or halves when
 * f16), marks kpos[pos] = pos, and attends q [nh, D] to rows 0..pos (S = pos + 1, as kv.view(pos) in
 * Python) into att [nh, D]. Returns RK_OK or RK_ENOMEM. */
RK_INTERNAL int dec_attend(int64_t Kp, int64_t Vp, int64_t kposp, const float *q, const float *k, const float *v,
                      int64_t nh, int64_t nkv, int64_t D, int64_t cap, int64_t pos, int f16, float scale, float *att)
{
    uint8_t *K = (uint8_t *)(intptr_t)Kp, *V = (uint8_t *)(intptr_t)Vp;
    dec_kv_store(K, V, k, v, nkv, D, cap, pos, f16);
    int64_t *kpos = (int64_t *)(intptr_t)kposp;
    kpos[pos] = pos;
    att_job aj = {1, nh, nkv, D, D, pos + 1, cap * D, cap * D, 0, f16, q, K, V, kpos, &pos, scale, att, 0};
    rk_pool_run(att_task, &aj, nkv, rk_threads_for(nh * (pos + 1) * 2 * D));
    return aj.failed ? RK_ENOMEM : RK_OK;
}

/* The fields every sequence of a batch shares: the model's shapes, flags and weights. */
static int same_model(const int64_t *a, const int64_t *b)
{
    static const int fields[] = {DM_LAYERS, DM_HIDDEN, DM_HEADS, DM_KV_HEADS, DM_HEAD_DIM, DM_INTER, DM_ROT_HALF,
                                 DM_KV_F16, DM_Q8A, DM_EPS, DM_SCALE};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (a[fields[i]] != b[fields[i]]) return 0;
    return 1;
}

/* One decode step of `m` sequences of one model (models: m descriptor addresses, each with its own h, pos,
 * cos/sin, K/V cache and kv_cap; the weights and shapes are the first's and must be the same in all):
 * the steps above with each matrix product over the m rows at once (one read of the weights per step),
 * norms, RoPE and attention per sequence. Each row's products have the bits they have alone, so every
 * sequence gets the bits of rk_llama_decode on its own descriptor. Returns RK_OK, RK_EINVAL (shapes,
 * kinds, different models) or RK_ENOMEM; on an error the h arrays and caches hold a partial step. */
RK_API int rk_llama_decode_batch(int64_t m, const int64_t *models)
{
    if (m < 1) return RK_EINVAL;
    const int64_t *model = (const int64_t *)(intptr_t)models[0];
    const int64_t nl = model[DM_LAYERS], H = model[DM_HIDDEN], nh = model[DM_HEADS], nkv = model[DM_KV_HEADS];
    const int64_t D = model[DM_HEAD_DIM], I = model[DM_INTER], r = model[DM_ROT_HALF];
    const int f16 = model[DM_KV_F16] != 0;
    const int64_t flag = model[DM_Q8A] ? RK_Q8A : 0;
    const float eps = bits_f32(model[DM_EPS]), scale = bits_f32(model[DM_SCALE]);
    if (nl < 0 || H < 1 || nh < 1 || nkv < 1 || nh % nkv || D < 1 || I < 1 || r < 0 || 2 * r > D) return RK_EINVAL;
    for (int64_t s = 0; s < m; s++) {
        const int64_t *ms = (const int64_t *)(intptr_t)models[s];
        if (!same_model(model, ms) || ms[DM_POS] < 0 || ms[DM_POS] >= ms[DM_KV_CAP]) return RK_EINVAL;
        for (int64_t l = 0; l < nl; l++) /* the same weights: every layer's matrix fields */
            if (memcmp(model + DM_FIELDS + l * DL_FIELDS + DL_MATS, ms + DM_FIELDS + l * DL_FIELDS + DL_MATS,
                       sizeof(int64_t) * (DL_FIELDS - DL_MATS)))
                return RK_EINVAL;
    }
    const int64_t QD = nh * D, KD = nkv * D;
    float *buf = malloc(sizeof(float) * (size_t)m * (size_t)(H + QD + 2 * KD + QD + H + 2 * I));
    if (!buf) return RK_ENOMEM;
    float *x = buf, *q = x + m * H, *k = q + m * QD, *v = k + m * KD, *att = v + m * KD, *o = att + m * QD;
    float *g = o + m * H, *u = g + m * I;
    int rc = RK_OK;
    for (int64_t l = 0; l < nl && rc == RK_OK; l++) {
        const int64_t *L = model + DM_FIELDS + l * DL_FIELDS;
        for (int64_t s = 0; s < m; s++) {
            const int64_t *ms = (const int64_t *)(intptr_t)models[s];
            dec_rms_norm((const float *)(intptr_t)ms[DM_H], (const float *)(intptr_t)L[DL_ATTN_NORM], H, eps, x + s * H);
        }
        float *qkv[3] = {q, k, v};
        const int64_t qkv_out[3] = {QD, KD, KD};
        if ((rc = dec_linear_rows(L + DL_MATS, MAT_Q, 3, flag, m, H, x, qkv, qkv_out))) break;
        for (int64_t s = 0; s < m && rc == RK_OK; s++) {
            const int64_t *ms = (const int64_t *)(intptr_t)models[s], *Ls = ms + DM_FIELDS + l * DL_FIELDS;
            const float *cs = (const float *)(intptr_t)ms[DM_COS], *sn = (const float *)(intptr_t)ms[DM_SIN];
            dec_rope(q + s * QD, nh, D, r, cs, sn);
            dec_rope(k + s * KD, nkv, D, r, cs, sn);
            rc = dec_attend(Ls[DL_K], Ls[DL_V], Ls[DL_KPOS], q + s * QD, k + s * KD, v + s * KD, nh, nkv, D,
                            ms[DM_KV_CAP], ms[DM_POS], f16, scale, att + s * QD);
        }
        if (rc) break;
        float *oy[1] = {o};
        const int64_t o_out[1] = {H};
        if ((rc = dec_linear_rows(L + DL_MATS, MAT_O, 1, flag, m, QD, att, oy, o_out))) break;
        for (int64_t s = 0; s < m; s++) {
            float *h = (float *)(intptr_t)((const int64_t *)(intptr_t)models[s])[DM_H];
            for (int64_t i = 0; i < H; i++) h[i] = h[i] + o[s * H + i];
            dec_rms_norm(h, (const float *)(intptr_t)L[DL_MLP_NORM], H, eps, x + s * H);
        }
        float *gu[2] = {g, u};
        const int64_t gu_out[2] = {I, I};
        if ((rc = dec_linear_rows(L + DL_MATS, MAT_GATE, 2, flag, m, H, x, gu, gu_out))) break;
        for (int64_t i = 0; i < m * I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        float *dy[1] = {o};
        const int64_t d_out[1] = {H};
        if ((rc = dec_linear_rows(L + DL_MATS, MAT_DOWN, 1, flag, m, I, g, dy, d_out))) break;
        for (int64_t s = 0; s < m; s++) {
            float *h = (float *)(intptr_t)((const int64_t *)(intptr_t)models[s])[DM_H];
            for (int64_t i = 0; i < H; i++) h[i] = h[i] + o[s * H + i];
        }
    }
    free(buf);
    return rc;
}

/* One decode step of one sequence: rk_llama_decode_batch of one. */
RK_API int rk_llama_decode(const int64_t *model)
{
    const int64_t one[1] = {(int64_t)(intptr_t)model};
    return rk_llama_decode_batch(1, one);
}
