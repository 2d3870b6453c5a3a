/* The one-token decode step (T = 1) of Gemma 4's layers around their experts (a unit of
 * the kernel library sharing rkdecode.c's and rkmoedecode.c's helpers: rkinternal.h). The Python layer code
 * (inference/models/gemma4.py) is the reference and runs prompts; these are its one-row case for generated
 * tokens, where the numpy steps around the kernels took a fifth of an all-resident token of the Gemma 4
 * 26B-A4B shapes (benchmarks/README.md at 9362a58). A streamed token waits for part of that CPU too: the next
 * layer's reads cannot start before its router has run.
 *
 *   rk_gemma4_attn, the attention half, in the order of gemma4.py's attn_half:
 *     x = rms_norm(h) * attn_norm;  q, k[, v] = x @ Wq.T, Wk.T[, Wv.T] (one rk_linear_many; a full layer
 *     with K = V has no Wv and takes v from the raw k)
 *     q = rms_norm per head * q_norm;  v = rms_norm per head (no weight);  k = rope(rms_norm per head * k_norm)
 *     K/V row = k, v (a sliding layer's ring: row pos % cap; a full layer's: row pos), kpos[row] = pos
 *     h += rms_norm(attention(rope(q), K, V, scale 1, the layer's window) @ Wo.T) * post_attn_norm
 *     then the dense MLP's input x_mlp = rms_norm(h) * mlp_norm and the experts' x_moe = rms_norm(h) * moe_norm
 *   rk_gemma4_route, the router on the residual stream h (the layer's own, and the lookahead's guess of
 *     the next layer's on the same h): p = softmax((rms_norm(h) * router_in) @ Wrouter.T); ids, w = the
 *     top-k of p, largest first, ties to the lower index (moe.top_k); w = w / sum(w) * expert_scale[ids].
 *   the dense MLP and the experts, by rk_moe_experts_act with gelu_tanh (the experts as the expert source
 *     hands them over, the dense MLP while their reads land), then
 *   rk_gemma4_ffn_out: moe = sum_k w_k y_k; h = (h + rms_norm(rms_norm(mlp) * post_mlp_norm +
 *     rms_norm(moe) * post_moe_norm) * post_ffn_norm) * layer_scalar.
 *
 * Each layer has its own head size, KV heads, cache capacity, window and RoPE table (sliding and full
 * layers differ in all of them). The dense matrices take int8 activations when G4_Q8A says so, the router
 * when G4_ROUTER_Q8A does. Numerics as rkmoedecode.c: the kernels are the Python path's; elementwise steps
 * give numpy's bits except the RMS norm's sum (vector lanes; numpy: pairwise), softmax's expf and sums and
 * gelu's tanhf (libm), so the step agrees with the Python layers within float rounding.
 *
 * The model is one int64 array: G4_FIELDS header fields, then GL_FIELDS per layer, whose matrices are
 * G4_MAT_COUNT of DL_MAT_FIELDS each (kind code, then its parts as in rk_linear_many).
 */
#include "rkdescriptors.h"
#include "rkinternal.h"


/* The attention half of layer l for the token at G4_POS (see above). Returns RK_OK, RK_EINVAL (shapes,
 * a layer out of range, a row outside the cache) or RK_ENOMEM; on an error h and the cache may hold a
 * partial step. */
RK_API int rk_gemma4_attn(const int64_t *model, int64_t l)
{
    const int64_t nl = model[G4_LAYERS], H = model[G4_HIDDEN], nh = model[G4_HEADS], pos = model[G4_POS];
    if (l < 0 || l >= nl || H < 1 || nh < 1 || pos < 0) return RK_EINVAL;
    const int64_t *L = model + G4_FIELDS + l * GL_FIELDS;
    const int64_t D = L[GL_HEAD_DIM], nkv = L[GL_KV_HEADS], cap = L[GL_CAP], window = L[GL_WINDOW];
    const int64_t r = L[GL_ROT_HALF], row = window > 0 ? pos % cap : pos;
    const int f16 = model[G4_KV_F16] != 0, kv_same = L[GL_K_EQ_V] != 0;
    const int64_t flag = model[G4_Q8A] ? RK_Q8A : 0;
    const float eps = bits_f32(model[G4_EPS]);
    if (D < 1 || nkv < 1 || nh % nkv || cap < 1 || window < 0 || row >= cap || r < 0 || 2 * r > D) return RK_EINVAL;
    float *h = (float *)(intptr_t)model[G4_H];
    const float *cs = (const float *)(intptr_t)L[GL_COS], *sn = (const float *)(intptr_t)L[GL_SIN];
    const int64_t QD = nh * D, KD = nkv * D;
    float *buf = malloc(sizeof(float) * (size_t)(H + QD + 2 * KD + QD + H));
    if (!buf) return RK_ENOMEM;
    float *x = buf, *q = x + H, *k = q + QD, *v = k + KD, *att = v + KD, *o = att + QD;
    int rc = RK_OK;
    do {
        dec_rms_norm(h, (const float *)(intptr_t)L[GL_ATTN_NORM], H, eps, x);
        float *qkv[3] = {q, k, v};
        const int64_t qkv_out[3] = {QD, KD, KD};
        if ((rc = dec_linear(L + GL_MATS, G4_MAT_Q, kv_same ? 2 : 3, flag, H, x, qkv, qkv_out))) break;
        if (kv_same) memcpy(v, k, sizeof(float) * KD);
        const float *qn = (const float *)(intptr_t)L[GL_Q_NORM], *kn = (const float *)(intptr_t)L[GL_K_NORM];
        for (int64_t hd = 0; hd < nh; hd++) dec_rms_norm(q + hd * D, qn, D, eps, q + hd * D);
        for (int64_t hd = 0; hd < nkv; hd++) {
            dec_rms_norm(k + hd * D, kn, D, eps, k + hd * D);
            dec_rms_norm(v + hd * D, NULL, D, eps, v + hd * D);
        }
        dec_rope(k, nkv, D, r, cs, sn);
        dec_rope(q, nh, D, r, cs, sn);

        uint8_t *K = (uint8_t *)(intptr_t)L[GL_K], *V = (uint8_t *)(intptr_t)L[GL_V];
        dec_kv_store(K, V, k, v, nkv, D, cap, row, f16);
        int64_t *kpos = (int64_t *)(intptr_t)L[GL_KPOS];
        kpos[row] = pos;
        /* a ring's rows are all candidates (att_visible keeps the window's); a full layer's are 0 .. pos */
        const int64_t S = window > 0 ? cap : pos + 1;
        att_job aj = {1, nh, nkv, D, D, S, cap * D, cap * D, window, f16, q, K, V, kpos, &pos, 1.0f, att, 0};
        rk_pool_run(att_task, &aj, nkv, rk_threads_for(nh * S * 2 * D));
        if (aj.failed) {
            rc = RK_ENOMEM;
            break;
        }

        float *oy[1] = {o};
        const int64_t o_out[1] = {H};
        if ((rc = dec_linear(L + GL_MATS, G4_MAT_O, 1, flag, QD, att, oy, o_out))) break;
        dec_rms_norm(o, (const float *)(intptr_t)L[GL_POST_ATTN_NORM], H, eps, o);
        for (int64_t i = 0; i < H; i++) h[i] = h[i] + o[i];
        dec_rms_norm(h, (const float *)(intptr_t)L[GL_MLP_NORM], H, eps, (float *)(intptr_t)model[G4_X_MLP]);
        if (L[GL_MOE_NORM])
            dec_rms_norm(h, (const float *)(intptr_t)L[GL_MOE_NORM], H, eps, (float *)(intptr_t)model[G4_X_MOE]);
    } while (0);
    free(buf);
    return rc;
}

/* The router of layer l on G4_H into G4_IDS and G4_WTS (see above). Returns RK_OK, RK_EINVAL or RK_ENOMEM. */
RK_API int rk_gemma4_route(const int64_t *model, int64_t l)
{
    const int64_t nl = model[G4_LAYERS], H = model[G4_HIDDEN], E = model[G4_EXPERTS], K = model[G4_TOP_K];
    if (l < 0 || l >= nl || H < 1 || E < 1 || K < 1 || K > E) return RK_EINVAL;
    const int64_t *L = model + G4_FIELDS + l * GL_FIELDS;
    const float eps = bits_f32(model[G4_EPS]);
    const float *h = (const float *)(intptr_t)model[G4_H], *in = (const float *)(intptr_t)L[GL_ROUTER_IN];
    const float *scale = (const float *)(intptr_t)L[GL_EXPERT_SCALE];
    float *x = malloc(sizeof(float) * (size_t)(H + E));
    if (!x) return RK_ENOMEM;
    float *p = x + H;
    dec_rms_norm(h, NULL, H, eps, x);
    for (int64_t i = 0; i < H; i++) x[i] = x[i] * in[i];
    float *py[1] = {p};
    const int64_t r_out[1] = {E};
    const int rc = dec_linear(L + GL_MATS, G4_MAT_ROUTER, 1, model[G4_ROUTER_Q8A] ? RK_Q8A : 0, H, x, py, r_out);
    if (rc == RK_OK) {
        int64_t *ids = (int64_t *)(intptr_t)model[G4_IDS];
        float *wts = (float *)(intptr_t)model[G4_WTS];
        const float wsum = moe_softmax_top_k(p, E, K, ids, wts);
        for (int64_t j = 0; j < K; j++) wts[j] = wts[j] / wsum * scale[ids[j]];
    }
    free(x);
    return rc;
}

/* The end of layer l once its dense MLP (G4_MLP) and experts (G4_Y, weights G4_WTS) are computed, in the
 * order of gemma4.py's ffn_half: moe = sum_k w_k y_k (each product rounded, added in slot order, as
 * moe.mixture); m = rms_norm(mlp) * post_mlp_norm + rms_norm(moe) * post_moe_norm (a layer without
 * experts: m = mlp); h = (h + rms_norm(m) * post_ffn_norm) * layer_scalar. Returns RK_OK, RK_EINVAL or
 * RK_ENOMEM. */
RK_API int rk_gemma4_ffn_out(const int64_t *model, int64_t l)
{
    const int64_t nl = model[G4_LAYERS], H = model[G4_HIDDEN], K = model[G4_TOP_K];
    if (l < 0 || l >= nl || H < 1) return RK_EINVAL;
    const int64_t *L = model + G4_FIELDS + l * GL_FIELDS;
    const int routed = L[GL_MOE_NORM] != 0;
    if (routed && K < 1) return RK_EINVAL;
    const float eps = bits_f32(model[G4_EPS]), scalar = *(const float *)(intptr_t)L[GL_LAYER_SCALAR];
    float *h = (float *)(intptr_t)model[G4_H];
    const float *mlp = (const float *)(intptr_t)model[G4_MLP];
    float *buf = malloc(sizeof(float) * (size_t)(2 * H));
    if (!buf) return RK_ENOMEM;
    float *m = buf, *moe = buf + H;
    if (routed) {
        const float *y = (const float *)(intptr_t)model[G4_Y], *w = (const float *)(intptr_t)model[G4_WTS];
        for (int64_t i = 0; i < H; i++) moe[i] = moe_mix_at(K, H, y, w, i);
        dec_rms_norm(mlp, (const float *)(intptr_t)L[GL_POST_MLP_NORM], H, eps, m);
        dec_rms_norm(moe, (const float *)(intptr_t)L[GL_POST_MOE_NORM], H, eps, moe);
        for (int64_t i = 0; i < H; i++) m[i] = m[i] + moe[i];
    } else
        memcpy(m, mlp, sizeof(float) * H);
    dec_rms_norm(m, (const float *)(intptr_t)L[GL_POST_FFN_NORM], H, eps, m);
    for (int64_t i = 0; i < H; i++) h[i] = (h[i] + m[i]) * scalar;
    free(buf);
    return RK_OK;
}

