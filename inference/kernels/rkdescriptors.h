/* The steps' descriptors: the int64 arrays that rk_llama_decode (rkdecode.c), rk_moe_decode_layer
 * (rkmoedecode.c) and rk_gemma4_* (rkgemma4.c) read, as lists of fields from which both the enums the C
 * code indexes them by and the names Python sets them by (`rk_fields`, inference/steps/descriptor.py)
 * come, so the two cannot disagree. A list entry is X(enum name, field name, int | f32 | ptr): an integer,
 * a float32's bits, an address. A descriptor is its header's fields, then per layer its fields and its
 * matrices, each the RK_MATRIX fields. The units' own comments say what each step does with them.
 */
#ifndef RKDESCRIPTORS_H
#define RKDESCRIPTORS_H

/* ---------------------------------------------------------------- Llama (rkdecode.c) */
/* The header's fields, one list from which the enum and `rk_fields` (the names Python sets them by,
 * inference/steps/descriptor.py) both come: X(enum name, field name, int | f32 | ptr). */
#define RK_DECODE_HEADER(X)                                                                                   \
    X(DM_LAYERS, layers, int)     /* number of layers */                                                     \
    X(DM_HIDDEN, hidden, int)     /* H */                                                                    \
    X(DM_HEADS, heads, int)       /* query heads */                                                          \
    X(DM_KV_HEADS, kv_heads, int) /* key/value heads (divides DM_HEADS) */                                   \
    X(DM_HEAD_DIM, head_dim, int) /* D */                                                                    \
    X(DM_INTER, inter, int)       /* the MLP's width I */                                                    \
    X(DM_ROT_HALF, rot_half, int) /* cos/sin entries: dims [0, r) and [r, 2r) of each head rotate */          \
    X(DM_KV_F16, kv_f16, int)     /* 1: the K/V caches hold IEEE halves */                                   \
    X(DM_KV_CAP, kv_cap, int)     /* rows per head in every layer's K/V cache */                             \
    X(DM_EPS, eps, f32)           /* RMS norm epsilon */                                                     \
    X(DM_SCALE, scale, f32)       /* q.k scale */                                                            \
    X(DM_POS, pos, int)           /* the token's position (< DM_KV_CAP) */                                   \
    X(DM_H, h, ptr)               /* float [H]: the token's hidden state in, the last layer's output out */  \
    X(DM_COS, cos, ptr)           /* float [DM_ROT_HALF] for this position */                                \
    X(DM_SIN, sin, ptr)                                                                                       \
    X(DM_Q8A, q8a, int)           /* 1: int8 activations (RK_Q8A) for the matrices whose kind has them */
/* a layer's fields before its matrices */
#define RK_DECODE_LAYER(X)                                                                                    \
    X(DL_ATTN_NORM, attn_norm, ptr) /* float [H] */                                                          \
    X(DL_MLP_NORM, mlp_norm, ptr)   /* float [H] */                                                          \
    X(DL_K, k, ptr)                 /* K cache [n_kv, cap, D] */                                             \
    X(DL_V, v, ptr)                 /* V cache [n_kv, cap, D] */                                             \
    X(DL_KPOS, kpos, ptr)           /* int64 [cap]: the position each row holds (-1: empty) */
/* a layer's matrices, each DL_MAT_FIELDS (RK_MATRIX): kind code, then its parts as in rk_linear_many */
#define RK_DECODE_MATRICES(X) X(MAT_Q, q) X(MAT_K, k) X(MAT_V, v) X(MAT_O, o) X(MAT_GATE, gate) X(MAT_UP, up) X(MAT_DOWN, down)
#define RK_MATRIX(X) X(MF_KIND, kind, int) X(MF_P0, p0, ptr) X(MF_P1, p1, ptr) X(MF_P2, p2, ptr)

#define RK_FIELD_ENUM(e, name, type) e,
#define RK_FIELD_NAME(e, name, type) " " #name ":" #type
#define RK_MATRIX_ENUM(e, name) e,
#define RK_MATRIX_NAME(e, name) " " #name

enum { RK_DECODE_HEADER(RK_FIELD_ENUM) DM_FIELDS };
enum { RK_DECODE_MATRICES(RK_MATRIX_ENUM) MAT_COUNT };
enum { RK_MATRIX(RK_FIELD_ENUM) DL_MAT_FIELDS };
enum { RK_DECODE_LAYER(RK_FIELD_ENUM) DL_MATS, DL_FIELDS = DL_MATS + MAT_COUNT * DL_MAT_FIELDS };

/* ---------------------------------------------------------------- Qwen3-MoE, OLMoE (rkmoedecode.c) */
/* The header's fields after the Llama step's (RK_DECODE_HEADER), and a layer's after its RK_DECODE_LAYER: one
 * list each for the enums and `rk_fields`, X(enum name, field name, int | f32 | ptr). */
#define RK_MOE_HEADER(X)                                                                                      \
    X(MM_EXPERTS, experts, int)       /* E: routed experts per layer */                                      \
    X(MM_TOP_K, top_k, int)           /* K: experts per token */                                             \
    X(MM_NORM_TOPK, norm_topk, int)   /* 1: renormalise the top-k weights */                                 \
    X(MM_QK_WHOLE, qk_whole, int)     /* 1: q/k RMS norm over the whole projection (OLMoE), 0: per head */   \
    X(MM_CLIP_ON, clip_on, int)       /* 1: clip q, k, v to [-MM_CLIP, MM_CLIP] after the norms (clip_qkv) */ \
    X(MM_CLIP, clip, f32)                                                                                     \
    X(MM_ROUTER_Q8A, router_q8a, int) /* 1: int8 activations for the router */                              \
    X(MM_X, x, ptr)                   /* float [H]: out, the normed MLP input */                             \
    X(MM_IDS, ids, ptr)               /* int64 [K]: out, the chosen experts, largest weight first */         \
    X(MM_WTS, wts, ptr)               /* float [K]: out, their weights */
#define RK_MOE_LAYER(X)                                                                                       \
    X(ML_Q_NORM, q_norm, ptr) /* float [D] (per head) or [nh D] (whole) */                                   \
    X(ML_K_NORM, k_norm, ptr) /* float [D] or [nkv D] */                                                     \
    X(ML_ROUTED, routed, int) /* 1: an MoE layer (router), 0: a dense MLP (gate, up, down) */
/* a layer's matrices after RK_DECODE_MATRICES */
#define RK_MOE_MATRICES(X) X(MAT_ROUTER, router)

enum { MM_FIRST_ = DM_FIELDS - 1, RK_MOE_HEADER(RK_FIELD_ENUM) MM_FIELDS };
enum { MAT_ROUTER_ = MAT_COUNT - 1, RK_MOE_MATRICES(RK_MATRIX_ENUM) MOE_MAT_COUNT };
enum { ML_FIRST_ = DL_MATS - 1, RK_MOE_LAYER(RK_FIELD_ENUM) ML_MATS, ML_FIELDS = ML_MATS + MOE_MAT_COUNT * DL_MAT_FIELDS };

/* ---------------------------------------------------------------- Gemma 4 (rkgemma4.c) */
/* The header's and a layer's fields, one list each for the enums and `rk_fields`: X(enum name, field
 * name, int | f32 | ptr). */
#define RK_GEMMA4_HEADER(X)                                                                                   \
    X(G4_LAYERS, layers, int)         /* number of layers */                                                 \
    X(G4_HIDDEN, hidden, int)         /* H */                                                                \
    X(G4_HEADS, heads, int)           /* query heads (every layer) */                                        \
    X(G4_KV_F16, kv_f16, int)         /* 1: the K/V caches hold IEEE halves */                               \
    X(G4_EPS, eps, f32)               /* RMS norm epsilon */                                                 \
    X(G4_POS, pos, int)               /* the token's position */                                             \
    X(G4_H, h, ptr)                   /* float [H]: the residual stream, updated in place by rk_gemma4_attn */ \
    X(G4_Q8A, q8a, int)               /* 1: int8 activations for q, k, v and o */                            \
    X(G4_EXPERTS, experts, int)       /* E */                                                                \
    X(G4_TOP_K, top_k, int)           /* K */                                                                \
    X(G4_ROUTER_Q8A, router_q8a, int) /* 1: int8 activations for the router */                              \
    X(G4_IDS, ids, ptr)               /* int64 [K]: out, the chosen experts, largest weight first */         \
    X(G4_WTS, wts, ptr)               /* float [K]: out, their weights */                                    \
    X(G4_X_MLP, x_mlp, ptr)           /* float [H]: out (rk_gemma4_attn), the dense MLP's input */           \
    X(G4_X_MOE, x_moe, ptr)           /* float [H]: out (rk_gemma4_attn, a layer with experts), the experts' */ \
    X(G4_MLP, mlp, ptr)               /* float [H]: in (rk_gemma4_ffn_out), the dense MLP's output */        \
    X(G4_Y, y, ptr)                   /* float [K, H]: in (rk_gemma4_ffn_out), each expert's output by slot */
#define RK_GEMMA4_LAYER(X)                                                                                    \
    X(GL_ATTN_NORM, attn_norm, ptr)           /* float [H] */                                                \
    X(GL_POST_ATTN_NORM, post_attn_norm, ptr) /* float [H] */                                                \
    X(GL_Q_NORM, q_norm, ptr)                 /* float [D] */                                                \
    X(GL_K_NORM, k_norm, ptr)                 /* float [D] */                                                \
    X(GL_ROUTER_IN, router_in, ptr)           /* float [H]: the router's input scale (router_scale / sqrt(H)) */ \
    X(GL_EXPERT_SCALE, expert_scale, ptr)     /* float [E] */                                                \
    X(GL_K, k, ptr)                           /* K cache [n_kv, cap, D] */                                   \
    X(GL_V, v, ptr)                           /* V cache [n_kv, cap, D] */                                   \
    X(GL_KPOS, kpos, ptr)                     /* int64 [cap]: the position each row holds (-1: empty) */     \
    X(GL_CAP, cap, int)                       /* rows per head */                                            \
    X(GL_WINDOW, window, int)                 /* sliding window (a ring of cap rows), 0: a full layer */     \
    X(GL_HEAD_DIM, head_dim, int)             /* D */                                                        \
    X(GL_KV_HEADS, kv_heads, int)             /* n_kv (divides G4_HEADS) */                                  \
    X(GL_K_EQ_V, k_eq_v, int)                 /* 1: no Wv, v from the raw k */                               \
    X(GL_ROT_HALF, rot_half, int)             /* r: dims [0, r) and [r, 2r) of each head rotate */           \
    X(GL_COS, cos, ptr)                       /* float [r] for this position */                              \
    X(GL_SIN, sin, ptr)                                                                                       \
    X(GL_MLP_NORM, mlp_norm, ptr)             /* float [H] */                                                \
    X(GL_MOE_NORM, moe_norm, ptr)             /* float [H]; 0: a layer without experts */                    \
    X(GL_POST_MLP_NORM, post_mlp_norm, ptr)   /* float [H] (a layer with experts) */                         \
    X(GL_POST_MOE_NORM, post_moe_norm, ptr)   /* float [H] (a layer with experts) */                         \
    X(GL_POST_FFN_NORM, post_ffn_norm, ptr)   /* float [H] */                                                \
    X(GL_LAYER_SCALAR, layer_scalar, ptr)     /* float [1] */
#define RK_GEMMA4_MATRICES(X) X(G4_MAT_Q, q) X(G4_MAT_K, k) X(G4_MAT_V, v) X(G4_MAT_O, o) X(G4_MAT_ROUTER, router)

enum { RK_GEMMA4_HEADER(RK_FIELD_ENUM) G4_FIELDS };
enum { RK_GEMMA4_MATRICES(RK_MATRIX_ENUM) G4_MAT_COUNT };
enum { RK_GEMMA4_LAYER(RK_FIELD_ENUM) GL_MATS, GL_FIELDS = GL_MATS + G4_MAT_COUNT * DL_MAT_FIELDS };

#endif /* RKDESCRIPTORS_H */
