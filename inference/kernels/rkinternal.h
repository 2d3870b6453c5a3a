/* What the compilation units of the kernel library share, and nothing they export: the error codes, the
 * kind-code flags, the matmul entry points the steps call, the thread pool's way in, and the helpers that
 * more than one step uses (declared here, defined once in the unit named beside them).
 *
 *   rkkernels.c     the quantized matmuls (rk_linear_many, rk_linear_grouped, rk_linear), the thread pool
 *                   (rkpool.h, its one owner), the library's own facts (rk_backend, rk_fields, ...)
 *   rkattention.c   attention over the KV cache (rk_attention; att_task for the steps)
 *   rkdecode.c      Llama's one-token step (rk_llama_decode) and the helpers of every step: dec_*
 *   rkmoedecode.c   the MoE step (rk_moe_decode_layer, rk_moe_experts_act, rk_moe_combine)
 *   rkgemma4.c      Gemma 4's step (rk_gemma4_attn, rk_gemma4_route, rk_gemma4_ffn_out)
 * The steps' descriptors are laid out in rkdescriptors.h; the vectors come from rkkernels_simd.h (arch/).
 */
#ifndef RKINTERNAL_H
#define RKINTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rkkernels_simd.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* gcc: -std=c11 already implies -ffp-contract=off */
#endif

#define RK_API __attribute__((visibility("default")))    /* the library's functions (ctypes, the tests) */
#define RK_INTERNAL __attribute__((visibility("hidden"))) /* shared between units, not exported */

enum { RK_OK = 0, RK_EINVAL = 1, RK_ENOMEM = 2 };

/* Flag on a kind code: multiply with int8 activations where the kind has that path (q4, q4_0, q4_1,
 * q8_0; see q8a_tile); other kinds ignore it. */
#define RK_Q8A 16
#define MAX_GROUPED 64 /* matrices per rk_linear_grouped call */

/* rkkernels.c */
RK_API int rk_linear_many(int n, int64_t T, int64_t in, const float *x, const int64_t *desc);
RK_API int rk_linear_grouped(int n, int64_t in, const int64_t *desc);
typedef void (*pool_task_fn)(const void *ctx, int64_t task);
/* fn(ctx, t) for t < ntask over `threads` threads (the caller's among them), as rkpool.h's pool_run */
RK_INTERNAL void rk_pool_run(pool_task_fn fn, const void *ctx, int64_t ntask, int threads);
/* threads for a job of `work` multiply-adds: this thread's count, fewer for small jobs */
RK_INTERNAL int rk_threads_for(int64_t work);

/* rkattention.c: one job of attention, run as tasks (KV head, block of query rows) by att_task */
typedef struct {
    int64_t T, H, KV, D, Dv, S, head_stride_k, head_stride_v, window;
    int f16; /* k and v are IEEE halves */
    const float *q;
    const void *k, *v;
    const int64_t *kpos, *qpos;
    float scale;
    float *out;
    int failed; /* set (never cleared) by a task whose scratch allocation failed */
} att_job;
RK_INTERNAL void att_task(const void *ctx, int64_t task);

/* rkdecode.c: the steps' elementwise helpers (see there) */
RK_INTERNAL uint16_t f32_to_f16(float f);
RK_INTERNAL void dec_rms_norm(const float *x, const float *w, int64_t n, float eps, float *y);
RK_INTERNAL void dec_rope(float *x, int64_t n, int64_t D, int64_t r, const float *c, const float *s);
RK_INTERNAL int dec_linear_rows(const int64_t *mats, int m0, int n, int64_t flag, int64_t rows, int64_t in,
                                const float *x, float *const *y, const int64_t *outs);
RK_INTERNAL int dec_linear(const int64_t *mats, int m0, int n, int64_t flag, int64_t in, const float *x,
                           float *const *y, const int64_t *outs);
RK_INTERNAL void dec_kv_store(uint8_t *K, uint8_t *V, const float *k, const float *v, int64_t nkv, int64_t D,
                              int64_t cap, int64_t row, int f16);
RK_INTERNAL int dec_attend(int64_t Kp, int64_t Vp, int64_t kposp, const float *q, const float *k, const float *v,
                           int64_t nh, int64_t nkv, int64_t D, int64_t cap, int64_t pos, int f16, float scale,
                           float *att);

/* a descriptor's float32 field */
RK_INLINE float bits_f32(int64_t v)
{
    const uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* rkmoedecode.c: the routers' softmax and top-k, and the experts' mix (see there) */
RK_INTERNAL float moe_softmax_top_k(float *p, int64_t E, int64_t K, int64_t *ids, float *wts);

/* sum_k w[k] y[k, i] over the K rows of y [K, H]: each product rounded, then added in slot order */
RK_INLINE float moe_mix_at(int64_t K, int64_t H, const float *y, const float *w, int64_t i)
{
    float o = y[i] * w[0];
    for (int64_t k = 1; k < K; k++) {
        const float t = y[k * H + i] * w[k];
        o = o + t;
    }
    return o;
}

#endif /* RKINTERNAL_H */
