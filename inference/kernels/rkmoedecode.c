/* The one-token decode step (T = 1) of the MoE architectures, Qwen3-MoE and OLMoE (a unit of
 * the kernel library sharing rkdecode.c's helpers: rkinternal.h). The Python layer code
 * (inference/models/qwen3_moe.py, olmoe.py, moe.py) is the reference and runs prompts; these are its
 * one-row case for generated tokens, where the numpy steps around the kernels took 10-19 % of a token
 * (benchmarks/README.md at 9362a58).
 *
 * A layer cannot be one call as in rk_llama_decode: its routed experts come from an expert source that
 * decides when each expert's weights are at hand (streaming reads them from disk while others compute).
 * So a layer is three calls, Python's expert source in between:
 *
 *   rk_moe_decode_layer, the attention half, in the order of qwen3_moe.py:
 *     x = rms_norm(h) * attn_norm;  q, k, v = x @ Wq.T, Wk.T, Wv.T (one rk_linear_many)
 *     q, k = rms_norm per head (Qwen3: weights [D]) or over the whole projection (OLMoE: [nh D], [nkv D])
 *     OLMoE's optional clip of q, k, v to [-c, c];  q, k = rope(q), rope(k);  K/V row `pos` = k, v
 *     h += attention(q, K, V) @ Wo.T;  x = rms_norm(h) * mlp_norm
 *     routed layer: p = softmax(x @ Wrouter.T); ids, w = the top-k of p, largest first, ties to the lower
 *     index (moe.top_k); w /= sum(w) when norm_topk_prob. x, ids, w go back to the caller.
 *     dense layer (Qwen3's mlp_only_layers): h += (silu(x @ Wgate.T) * (x @ Wup.T)) @ Wdown.T, as Llama.
 *   rk_moe_experts, for each batch of experts the source hands over: y[slot] = expert(x), that is
 *     (silu(x @ Wgate.T) * (x @ Wup.T)) @ Wdown.T as moe.experts_mlp, gates and ups as one grouped call
 *     and the downs as another (rk_linear_grouped: each result has the bits it has alone, so a result
 *     does not depend on which experts share its batch, and streamed experts give the resident bits).
 *   rk_moe_combine: h += sum_k w_k y_k, the products summed in slot order as moe.mixture does.
 *
 * Numerics: the kernels are the Python path's; elementwise steps give numpy's bits except the RMS norm's
 * sum (vector lanes; numpy: pairwise), softmax's and silu's expf (libm) and its sums (in order), so the
 * step agrees with the Python layers within float rounding. A router tie within that rounding may pick
 * the other expert, as it may between numpy builds. The dense matrices (q, k, v, o, a dense layer's MLP)
 * take int8 activations when DM_Q8A says so (the `decode` mode, as in rk_llama_decode);
 * the router takes its own flag (MM_ROUTER_Q8A: the Python router's `linear`, float unless q8), the
 * experts the caller's (linear_grouped's).
 *
 * The model is one int64 array: rkdecode.c's DM_FIELDS header fields (DM_INTER: a dense layer's MLP
 * width), then MM_* fields, then ML_FIELDS per layer. The first five layer fields are rkdecode.c's DL_*;
 * the matrices are its MAT_* then the router (the lists below, RK_MOE_*).
 */
#include "rkdescriptors.h"
#include "rkinternal.h"


/* q/k RMS norm of n heads of D in place: per head with w [D], or over all n D with w [n D] */
static void moe_qk_norm(float *x, int64_t n, int64_t D, int whole, const float *w, float eps)
{
    if (whole)
        dec_rms_norm(x, w, n * D, eps, x);
    else
        for (int64_t h = 0; h < n; h++) dec_rms_norm(x + h * D, w, D, eps, x + h * D);
}

/* np.clip(x, -c, c) */
static void moe_clip(float *x, int64_t n, float c)
{
    for (int64_t i = 0; i < n; i++) x[i] = x[i] < -c ? -c : (x[i] > c ? c : x[i]);
}

/* The router's scores p [E] → softmax in place (moe.softmax: minus the max, exp, over the sum), then the
 * top K: ids largest first, ties to the lower index (a stable sort's order, moe.top_k), wts their
 * probabilities. Returns the sum of wts, added in order. */
RK_INTERNAL float moe_softmax_top_k(float *p, int64_t E, int64_t K, int64_t *ids, float *wts)
{
    float mx = p[0];
    for (int64_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / sum;
    float wsum = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j && !taken; i++) taken = ids[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[j] = best;
        wts[j] = p[best];
        wsum += wts[j];
    }
    return wsum;
}

/* The fields every sequence of a batch shares: shapes, flags and (layer l's) weights. */
static int moe_same_model(const int64_t *a, const int64_t *b, int64_t l)
{
    static const int fields[] = {DM_LAYERS,   DM_HIDDEN,    DM_HEADS,   DM_KV_HEADS, DM_HEAD_DIM,  DM_INTER,
                                 DM_ROT_HALF, DM_KV_F16,    DM_Q8A,     DM_EPS,      DM_SCALE,     MM_EXPERTS,
                                 MM_TOP_K,    MM_NORM_TOPK, MM_QK_WHOLE, MM_CLIP_ON, MM_CLIP,      MM_ROUTER_Q8A};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (a[fields[i]] != b[fields[i]]) return 0;
    const int64_t *La = a + MM_FIELDS + l * ML_FIELDS, *Lb = b + MM_FIELDS + l * ML_FIELDS;
    return La[DL_ATTN_NORM] == Lb[DL_ATTN_NORM] && La[DL_MLP_NORM] == Lb[DL_MLP_NORM] &&
           La[ML_Q_NORM] == Lb[ML_Q_NORM] && La[ML_K_NORM] == Lb[ML_K_NORM] && La[ML_ROUTED] == Lb[ML_ROUTED] &&
           !memcmp(La + ML_MATS, Lb + ML_MATS, sizeof(int64_t) * (ML_FIELDS - ML_MATS));
}

/* The attention half of layer l (see above) for `m` sequences of one model (models: m descriptor
 * addresses, each with its own h, pos, cos/sin, K/V cache, kv_cap and x/ids/wts outputs; shapes, flags
 * and weights the same in all): each matrix product over the m rows at once, norms, RoPE, attention and
 * routing per sequence. Each row's products have the bits they have alone, so every sequence gets the bits
 * of the one-sequence call. Returns RK_OK, RK_EINVAL (shapes, kinds, a layer out of range, different
 * models) or RK_ENOMEM; on an error the h arrays and caches may hold a partial step. */
RK_API int rk_moe_decode_layer_batch(int64_t m, const int64_t *models, int64_t l)
{
    if (m < 1) return RK_EINVAL;
    const int64_t *model = (const int64_t *)(intptr_t)models[0];
    const int64_t nl = model[DM_LAYERS], H = model[DM_HIDDEN], nh = model[DM_HEADS], nkv = model[DM_KV_HEADS];
    const int64_t D = model[DM_HEAD_DIM], I = model[DM_INTER], r = model[DM_ROT_HALF];
    const int64_t E = model[MM_EXPERTS], K = model[MM_TOP_K];
    const int f16 = model[DM_KV_F16] != 0, whole = model[MM_QK_WHOLE] != 0;
    const int64_t flag = model[DM_Q8A] ? RK_Q8A : 0, rflag = model[MM_ROUTER_Q8A] ? RK_Q8A : 0;
    const float eps = bits_f32(model[DM_EPS]), scale = bits_f32(model[DM_SCALE]), clip = bits_f32(model[MM_CLIP]);
    if (l < 0 || l >= nl || H < 1 || nh < 1 || nkv < 1 || nh % nkv || D < 1 || r < 0 || 2 * r > D) return RK_EINVAL;
    const int64_t *L = model + MM_FIELDS + l * ML_FIELDS;
    const int routed = L[ML_ROUTED] != 0;
    if (routed ? (E < 1 || K < 1 || K > E) : I < 1) return RK_EINVAL;
    for (int64_t s = 0; s < m; s++) {
        const int64_t *ms = (const int64_t *)(intptr_t)models[s];
        if (!moe_same_model(model, ms, l) || ms[DM_POS] < 0 || ms[DM_POS] >= ms[DM_KV_CAP]) return RK_EINVAL;
    }
    const int64_t QD = nh * D, KD = nkv * D, W = routed ? E : 2 * I;
    float *buf = malloc(sizeof(float) * (size_t)m * (size_t)(H + QD + 2 * KD + QD + H + W));
    if (!buf) return RK_ENOMEM;
    float *x = buf, *q = x + m * H, *k = q + m * QD, *v = k + m * KD, *att = v + m * KD, *o = att + m * QD;
    float *wide = o + m * H;
    int rc = RK_OK;
    do {
        for (int64_t s = 0; s < m; s++) {
            const float *h = (const float *)(intptr_t)((const int64_t *)(intptr_t)models[s])[DM_H];
            dec_rms_norm(h, (const float *)(intptr_t)L[DL_ATTN_NORM], H, eps, x + s * H);
        }
        float *qkv[3] = {q, k, v};
        const int64_t qkv_out[3] = {QD, KD, KD};
        if ((rc = dec_linear_rows(L + ML_MATS, MAT_Q, 3, flag, m, H, x, qkv, qkv_out))) break;
        for (int64_t s = 0; s < m && rc == RK_OK; s++) {
            const int64_t *ms = (const int64_t *)(intptr_t)models[s], *Ls = ms + MM_FIELDS + l * ML_FIELDS;
            const float *cs = (const float *)(intptr_t)ms[DM_COS], *sn = (const float *)(intptr_t)ms[DM_SIN];
            float *qs = q + s * QD, *ks = k + s * KD, *vs = v + s * KD;
            moe_qk_norm(qs, nh, D, whole, (const float *)(intptr_t)L[ML_Q_NORM], eps);
            moe_qk_norm(ks, nkv, D, whole, (const float *)(intptr_t)L[ML_K_NORM], eps);
            if (model[MM_CLIP_ON]) {
                moe_clip(qs, QD, clip);
                moe_clip(ks, KD, clip);
                moe_clip(vs, KD, clip);
            }
            dec_rope(qs, nh, D, r, cs, sn);
            dec_rope(ks, nkv, D, r, cs, sn);
            rc = dec_attend(Ls[DL_K], Ls[DL_V], Ls[DL_KPOS], qs, ks, vs, nh, nkv, D, ms[DM_KV_CAP], ms[DM_POS], f16,
                            scale, att + s * QD);
        }
        if (rc) break;
        float *oy[1] = {o};
        const int64_t o_out[1] = {H};
        if ((rc = dec_linear_rows(L + ML_MATS, MAT_O, 1, flag, m, QD, att, oy, o_out))) break;
        for (int64_t s = 0; s < m; s++) {
            float *h = (float *)(intptr_t)((const int64_t *)(intptr_t)models[s])[DM_H];
            for (int64_t i = 0; i < H; i++) h[i] = h[i] + o[s * H + i];
            dec_rms_norm(h, (const float *)(intptr_t)L[DL_MLP_NORM], H, eps, x + s * H);
        }

        if (!routed) { /* a dense MLP, as rk_llama_decode's */
            float *g = wide, *u = wide + m * I;
            float *gu[2] = {g, u};
            const int64_t gu_out[2] = {I, I};
            if ((rc = dec_linear_rows(L + ML_MATS, MAT_GATE, 2, flag, m, H, x, gu, gu_out))) break;
            for (int64_t i = 0; i < m * I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            float *dy[1] = {o};
            const int64_t d_out[1] = {H};
            if ((rc = dec_linear_rows(L + ML_MATS, MAT_DOWN, 1, flag, m, I, g, dy, d_out))) break;
            for (int64_t s = 0; s < m; s++) {
                float *h = (float *)(intptr_t)((const int64_t *)(intptr_t)models[s])[DM_H];
                for (int64_t i = 0; i < H; i++) h[i] = h[i] + o[s * H + i];
            }
            break;
        }

        /* router: softmax → top-k → renormalise, per sequence */
        float *p = wide;
        float *py[1] = {p};
        const int64_t r_out[1] = {E};
        if ((rc = dec_linear_rows(L + ML_MATS, MAT_ROUTER, 1, rflag, m, H, x, py, r_out))) break;
        for (int64_t s = 0; s < m; s++) {
            const int64_t *ms = (const int64_t *)(intptr_t)models[s];
            int64_t *ids = (int64_t *)(intptr_t)ms[MM_IDS];
            float *wts = (float *)(intptr_t)ms[MM_WTS];
            const float wsum = moe_softmax_top_k(p + s * E, E, K, ids, wts);
            if (model[MM_NORM_TOPK])
                for (int64_t j = 0; j < K; j++) wts[j] = wts[j] / wsum;
            memcpy((float *)(intptr_t)ms[MM_X], x + s * H, sizeof(float) * H);
        }
    } while (0);
    free(buf);
    return rc;
}

/* The attention half of layer l for the token at DM_POS: rk_moe_decode_layer_batch of one. */
RK_API int rk_moe_decode_layer(const int64_t *model, int64_t l)
{
    const int64_t one[1] = {(int64_t)(intptr_t)model};
    return rk_moe_decode_layer_batch(1, one, l);
}

#define MOE_EXPERT_FIELDS 13 /* slot, then gate, up, down: kind code and 3 parts each */
#define MOE_BATCH (MAX_GROUPED / 2)
enum { MOE_SILU, MOE_GELU_TANH }; /* the experts' activations (rk_moe_experts_act) */

/* y[slot_j] = (silu(x @ Gj.T) * (x @ Uj.T)) @ Dj.T for the n experts of `desc` (MOE_EXPERT_FIELDS each:
 * the row of y, then each matrix's kind code and parts as in rk_linear_many), x [H], experts of width I,
 * `flag` (RK_Q8A or 0) on every kind code. Returns RK_OK, RK_EINVAL or RK_ENOMEM. */
RK_API int rk_moe_experts_act(int n, int64_t H, int64_t I, int64_t flag, int64_t act, const float *x,
                              const int64_t *desc, float *y);

RK_API int rk_moe_experts(int n, int64_t H, int64_t I, int64_t flag, const float *x, const int64_t *desc, float *y)
{
    return rk_moe_experts_act(n, H, I, flag, MOE_SILU, x, desc, y);
}

/* gelu with the tanh approximation in models/base.py's order: 0.5 x (1 + tanh(c (x + 0.044715 x x x))) */
RK_INLINE float moe_gelu_tanh(float x)
{
    const float c = (float)0.7978845608028654, a = 0.044715f;
    const float inner = c * (x + a * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

/* rk_moe_experts with the activation `act` (MOE_SILU: (silu(x @ G.T) * (x @ U.T)) @ D.T; MOE_GELU_TANH:
 * gelu_tanh in place of silu, Gemma 4's experts and dense MLP). */
RK_API int rk_moe_experts_act(int n, int64_t H, int64_t I, int64_t flag, int64_t act, const float *x,
                              const int64_t *desc, float *y)
{
    if (act != MOE_SILU && act != MOE_GELU_TANH) return RK_EINVAL;
    if (n < 0 || H < 1 || I < 1) return RK_EINVAL;
    const int nb = n < MOE_BATCH ? n : MOE_BATCH;
    float *g = malloc(sizeof(float) * (size_t)(2 * nb * I + 1));
    if (!g) return RK_ENOMEM;
    float *u = g + nb * I;
    int64_t gd[8 * MAX_GROUPED];
    int rc = RK_OK;
    for (int j0 = 0; j0 < n && rc == RK_OK; j0 += MOE_BATCH) {
        const int m = n - j0 < MOE_BATCH ? n - j0 : MOE_BATCH;
        for (int j = 0; j < m; j++) { /* gate and up of every expert, all on x */
            const int64_t *e = desc + (j0 + j) * MOE_EXPERT_FIELDS;
            for (int w = 0; w < 2; w++) {
                int64_t *d = gd + 8 * (2 * j + w);
                const int64_t *mat = e + 1 + 4 * w;
                d[0] = mat[0] | flag;
                d[1] = I;
                d[2] = (int64_t)(intptr_t)((w ? u : g) + j * I);
                d[3] = mat[1];
                d[4] = mat[2];
                d[5] = mat[3];
                d[6] = (int64_t)(intptr_t)x;
                d[7] = 1;
            }
        }
        if ((rc = rk_linear_grouped(2 * m, H, gd))) break;
        if (act == MOE_SILU)
            for (int64_t i = 0; i < m * I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        else
            for (int64_t i = 0; i < m * I; i++) g[i] = moe_gelu_tanh(g[i]) * u[i];
        for (int j = 0; j < m; j++) { /* every down on its own expert's activations */
            const int64_t *e = desc + (j0 + j) * MOE_EXPERT_FIELDS, *mat = e + 9;
            int64_t *d = gd + 8 * j;
            d[0] = mat[0] | flag;
            d[1] = H;
            d[2] = (int64_t)(intptr_t)(y + e[0] * H);
            d[3] = mat[1];
            d[4] = mat[2];
            d[5] = mat[3];
            d[6] = (int64_t)(intptr_t)(g + j * I);
            d[7] = 1;
        }
        rc = rk_linear_grouped(m, I, gd);
    }
    free(g);
    return rc;
}

/* h[0:H] += sum_k w[k] y[k] for the K rows of y [K, H]: each product rounded, then added in slot order
 * (moe.mixture's y *= weights, then out = y[:, 0] + y[:, 1] + ...), then added to h. */
RK_API void rk_moe_combine(int64_t K, int64_t H, const float *y, const float *w, float *h)
{
    for (int64_t i = 0; i < H; i++) h[i] = h[i] + moe_mix_at(K, H, y, w, i);
}

