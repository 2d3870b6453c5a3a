/* Causal, optionally windowed, grouped-query attention over the KV cache (a unit of the kernel library: rkinternal.h).
 *
 * out[t, h, :] = sum_j p_j v[h / g, j, :] with p = softmax_j(scale * q[t, h, :] . k[h / g, j, :]) over
 * the held rows j whose position is >= 0, <= qpos[t] and, with a window, > qpos[t] - window.
 *
 * Why it is not numpy: a decode step is ~10 M multiply-adds per layer, too small for BLAS's threads,
 * which fight the kernel pool's for the cores (measured: 15 ms per sliding layer of Gemma 4 with
 * OpenBLAS on one thread, 110 ms with its default threads on a busy machine).
 *
 * Determinism: each (t, h) is computed by one thread, over j in increasing order, in a fixed lane
 * order (the vector backend's), the same whatever T, the tasks' split or the thread count.
 *
 * Tasks are (KV head, block of ATT_TB query rows): a key/value row is loaded once for the block's
 * g x ATT_TB query heads. Scratch: the block's scores, on the heap per task. */
#include "rkinternal.h"

#define ATT_TB 8     /* query rows per task */

/* att_job: rkinternal.h */

RK_INLINE float att_dot(const float *a, const float *b, int64_t n)
{
    vf acc0 = vf_zero(), acc1 = vf_zero();
    int64_t i = 0;
    for (; i + 2 * VL <= n; i += 2 * VL) {
        acc0 = vf_fma(vf_load(a + i), vf_load(b + i), acc0);
        acc1 = vf_fma(vf_load(a + i + VL), vf_load(b + i + VL), acc1);
    }
    for (; i + VL <= n; i += VL) acc0 = vf_fma(vf_load(a + i), vf_load(b + i), acc0);
    float s = vf_hsum(vf_add(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

RK_INLINE float att_dot_f16(const float *a, const uint16_t *b, int64_t n)
{
    vf acc[NU], w[NU];
    for (int u = 0; u < NU; u++) acc[u] = vf_zero();
    int64_t i = 0;
    for (; i + DU <= n; i += DU) {
        decu_f16(b + i, w);
        for (int u = 0; u < NU; u++) acc[u] = vf_fma(vf_load(a + i + u * VL), w[u], acc[u]);
    }
    for (int u = 1; u < NU; u++) acc[0] = vf_add(acc[0], acc[u]);
    float s = vf_hsum(acc[0]);
    for (; i < n; i++) s += a[i] * f16_to_f32(b[i]);
    return s;
}

RK_INLINE void att_axpy_f16(float *o, float p, const uint16_t *v, int64_t n)
{
    const vf pv = vf_set1(p);
    vf w[NU];
    int64_t i = 0;
    for (; i + DU <= n; i += DU) {
        decu_f16(v + i, w);
        for (int u = 0; u < NU; u++) vf_store(o + i + u * VL, vf_fma(pv, w[u], vf_load(o + i + u * VL)));
    }
    for (; i < n; i++) o[i] += p * f16_to_f32(v[i]);
}

/* o[0:n] += p * v[0:n] */
RK_INLINE void att_axpy(float *o, float p, const float *v, int64_t n)
{
    const vf pv = vf_set1(p);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vf_store(o + i, vf_fma(pv, vf_load(v + i), vf_load(o + i)));
    for (; i < n; i++) o[i] += p * v[i];
}

RK_INLINE int att_visible(const att_job *j, int64_t key, int64_t t)
{
    const int64_t p = j->kpos[key], qp = j->qpos[t];
    return p >= 0 && p <= qp && (j->window <= 0 || p > qp - j->window);
}

RK_INTERNAL void att_task(const void *ctx, int64_t task)
{
    att_job *j = (att_job *)ctx;
    const int64_t g = j->H / j->KV, nblk = (j->T + ATT_TB - 1) / ATT_TB;
    const int64_t kvh = task / nblk, t0 = (task % nblk) * ATT_TB;
    const int64_t tb = j->T - t0 < ATT_TB ? j->T - t0 : ATT_TB, S = j->S;
    const int64_t esz = j->f16 ? 2 : 4; /* bytes per k/v element */
    const char *K = (const char *)j->k + kvh * j->head_stride_k * esz, *V = (const char *)j->v + kvh * j->head_stride_v * esz;
    float *sc = malloc(sizeof(float) * (size_t)(tb * g * S + tb * g));
    if (!sc) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *mx = sc + tb * g * S; /* per query head: the largest visible score */
    for (int64_t r = 0; r < tb * g; r++) mx[r] = -INFINITY;
    for (int64_t s = 0; s < S; s++) {
        const void *krow = K + s * j->D * esz;
        for (int64_t r = 0; r < tb; r++) {
            const int vis = att_visible(j, s, t0 + r);
            for (int64_t a = 0; a < g; a++) {
                const int64_t h = kvh * g + a, idx = (r * g + a) * S + s;
                if (!vis) {
                    sc[idx] = -INFINITY;
                    continue;
                }
                const float *qv = j->q + ((t0 + r) * j->H + h) * j->D;
                const float x = (j->f16 ? att_dot_f16(qv, krow, j->D) : att_dot(qv, krow, j->D)) * j->scale;
                sc[idx] = x;
                if (x > mx[r * g + a]) mx[r * g + a] = x;
            }
        }
    }
    for (int64_t r = 0; r < tb; r++)
        for (int64_t a = 0; a < g; a++) {
            float *o = j->out + ((t0 + r) * j->H + kvh * g + a) * j->Dv;
            float *row = sc + (r * g + a) * S, sum = 0.0f;
            const float m = mx[r * g + a];
            for (int64_t d = 0; d < j->Dv; d++) o[d] = 0.0f;
            for (int64_t s = 0; s < S; s++) {
                if (row[s] == -INFINITY) continue;
                const float p = expf(row[s] - m);
                sum += p;
                const void *vrow = V + s * j->Dv * esz;
                if (j->f16)
                    att_axpy_f16(o, p, vrow, j->Dv);
                else
                    att_axpy(o, p, vrow, j->Dv);
            }
            const float inv = 1.0f / sum;
            for (int64_t d = 0; d < j->Dv; d++) o[d] *= inv;
        }
    free(sc);
}

/* q [T, H, D], out [T, H, Dv] C-contiguous float32; k and v: float32, or IEEE halves with kv_f16, KV
 * heads of S rows each, head h starting at element h * head_stride_k of k (rows of D elements) and
 * h * head_stride_v of v (rows of Dv); kpos [S] the
 * position each row holds (-1: empty), qpos [T] the query rows' positions; window <= 0: none.
 * Every query row must see at least one row (its own). Returns RK_OK, RK_EINVAL or RK_ENOMEM. */
RK_API int rk_attention(int64_t T, int64_t H, int64_t KV, int64_t D, int64_t Dv, int64_t S, const float *q,
                        int kv_f16, const void *k, int64_t head_stride_k, const void *v, int64_t head_stride_v,
                        const int64_t *kpos, const int64_t *qpos, int64_t window, float scale, float *out)
{
    if (T < 0 || KV < 1 || H < KV || H % KV || D < 1 || Dv < 1 || S < 1 || head_stride_k < S * D ||
        head_stride_v < S * Dv)
        return RK_EINVAL;
    att_job j = {T, H, KV, D, Dv, S, head_stride_k, head_stride_v, window, kv_f16 != 0, q, k, v, kpos, qpos, scale,
                 out, 0};
    const int64_t ntask = KV * ((T + ATT_TB - 1) / ATT_TB);
    /* this thread's count, as the matmuls (it was the process default: an engine's own count was ignored) */
    if (ntask) rk_pool_run(att_task, &j, ntask, rk_threads_for(T * H * S * (D + Dv)));
    return j.failed ? RK_ENOMEM : RK_OK;
}

