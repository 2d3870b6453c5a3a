/* The aarch64 NEON backend of rkkernels_simd.h's vocabulary (which documents it); int8 dot products by
 * sdot where the CPU has dotprod (RK3588's A76 and A55), else widening multiplies. Included by
 * rkkernels_simd.h only. */
/* ---------------------------------------------------------------- NEON (aarch64) */
#include <arm_neon.h>
#define RK_BACKEND "neon"
#undef RK_SIMD_NEON
#define RK_SIMD_NEON 1
#define VL 4
#define NU 2
typedef float32x4_t vf;

RK_INLINE vf vf_zero(void) { return vdupq_n_f32(0.0f); }
RK_INLINE vf vf_set1(float a) { return vdupq_n_f32(a); }
RK_INLINE vf vf_load(const float *p) { return vld1q_f32(p); }
RK_INLINE void vf_store(float *p, vf a) { vst1q_f32(p, a); }
RK_INLINE vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
RK_INLINE vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
RK_INLINE vf vf_fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }

RK_INLINE float vf_hsum(vf a)
{
    float32x2_t s = vadd_f32(vget_low_f32(a), vget_high_f32(a));
    return vget_lane_f32(vpadd_f32(s, s), 0);
}

RK_INLINE void decu_f32(const float *p, vf *w)
{
    w[0] = vld1q_f32(p);
    w[1] = vld1q_f32(p + 4);
}
RK_INLINE void cvt_f16x8(uint16x8_t bits, vf *w)
{
    const float16x8_t h = vreinterpretq_f16_u16(bits);
    w[0] = vcvt_f32_f16(vget_low_f16(h));
    w[1] = vcvt_high_f32_f16(h);
}
RK_INLINE void decu_f16(const uint16_t *p, vf *w) { cvt_f16x8(vld1q_u16(p), w); }
RK_INLINE void decu_i8(const int8_t *p, vf *w)
{
    int16x8_t h = vmovl_s8(vld1_s8(p));
    w[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    w[1] = vcvtq_f32_s32(vmovl_high_s16(h));
}
RK_INLINE void decu_nib(const uint8_t *p, vf *lo, vf *b)
{
    uint16x8_t h = vmovl_u8(vld1_u8(p));
    uint16x8_t l = vandq_u16(h, vdupq_n_u16(15)); /* one op masks 8 weights */
    lo[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(l)));
    lo[1] = vcvtq_f32_u32(vmovl_high_u16(l));
    b[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(h)));
    b[1] = vcvtq_f32_u32(vmovl_high_u16(h));
}
RK_INLINE void decu_f16x2_strided(const uint8_t *p, int64_t stride, int n, vf *a, vf *b)
{
    uint16_t ha[8] = {0}, hb[8] = {0};
    for (int j = 0; j < n; j++) {
        memcpy(ha + j, p + j * stride, 2);
        memcpy(hb + j, p + j * stride + 2, 2);
    }
    cvt_f16x8(vld1q_u16(ha), a);
    cvt_f16x8(vld1q_u16(hb), b);
}
RK_INLINE float f16_to_f32(uint16_t h)
{
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

/* ---------------------------------------------------------------- int8 activations */
typedef int8x16x2_t vb;
typedef int32x4_t vi;
typedef float32x4_t vs;
RK_INLINE vb vb_nib(const uint8_t *p)
{
    const uint8x16_t v = vld1q_u8(p);
    vb r = {{vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(v, 4))}};
    return r;
}
RK_INLINE vb vb_s8(const int8_t *p)
{
    vb r = {{vld1q_s8(p), vld1q_s8(p + 16)}};
    return r;
}
#if defined(__ARM_FEATURE_DOTPROD)
#define RK_DOT "sdot"
RK_INLINE vi vi_dot_s(vb w, const int8_t *x)
{
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w.val[0], vld1q_s8(x)), w.val[1], vld1q_s8(x + 16));
}
#else
#define RK_DOT "smull"
/* ARMv8.0 (the A55 alone has dotprod too, but not every aarch64 does): widening multiplies */
RK_INLINE vi vi_dot_s(vb w, const int8_t *x)
{
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
    int16x8_t p = vmull_s8(vget_low_s8(w.val[0]), vget_low_s8(x0));
    int32x4_t acc = vpaddlq_s16(p);
    p = vmull_high_s8(w.val[0], x0);
    acc = vpadalq_s16(acc, p);
    p = vmull_s8(vget_low_s8(w.val[1]), vget_low_s8(x1));
    acc = vpadalq_s16(acc, p);
    p = vmull_high_s8(w.val[1], x1);
    return vpadalq_s16(acc, p);
}
#endif
RK_INLINE vi vi_dot_u(vb w, const int8_t *x) { return vi_dot_s(w, x); } /* 0..15 is a signed int8 too */
RK_INLINE vs vs_zero(void) { return vdupq_n_f32(0.0f); }
RK_INLINE vs vs_fma_i(vi i, float s, vs acc) { return vfmaq_n_f32(acc, vcvtq_f32_s32(i), s); }
RK_INLINE float vs_hsum(vs a) { return vf_hsum(a); }
RK_INLINE float q8a_load(const float *x, int eo, float *v)
{
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int h = 0; h < 4; h++) {
        float32x4_t a, b;
        if (eo) {
            const float32x4x2_t p = vld2q_f32(x + 8 * h); /* evens 8h.., odds 8h.. */
            a = p.val[0];
            b = p.val[1];
            vst1q_f32(v + 4 * h, a);
            vst1q_f32(v + 16 + 4 * h, b);
        } else {
            a = vld1q_f32(x + 8 * h);
            b = vld1q_f32(x + 8 * h + 4);
            vst1q_f32(v + 8 * h, a);
            vst1q_f32(v + 8 * h + 4, b);
        }
        m = vmaxq_f32(m, vmaxq_f32(vabsq_f32(a), vabsq_f32(b)));
    }
    return vmaxvq_f32(m);
}
RK_INLINE int32_t q8a_round(const float *v, float id, int8_t *q)
{
    int32x4_t s = vdupq_n_s32(0);
    for (int h = 0; h < 4; h++) {
        int32x4_t i0 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(v + 8 * h), id)); /* nearest, ties away */
        int32x4_t i1 = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(v + 8 * h + 4), id));
        i0 = vminq_s32(vmaxq_s32(i0, vdupq_n_s32(-127)), vdupq_n_s32(127));
        i1 = vminq_s32(vmaxq_s32(i1, vdupq_n_s32(-127)), vdupq_n_s32(127));
        vst1_s8(q + 8 * h, vmovn_s16(vcombine_s16(vmovn_s32(i0), vmovn_s32(i1))));
        s = vaddq_s32(s, vaddq_s32(i0, i1));
    }
    return vaddvq_s32(s);
}

/* ---------------------------------------------------------------- repacked q4 */
/* NEON: a 16-byte quarter of a line is 4 rows. sdot by lane (the activation dword picked from a register),
 * or without dotprod widening multiplies summed in int16 (<= 8 * 15 * 127) and paired at the block's end. */
/* the 8 lines of a q8_0 block, line c against activation dword c (x0: 0-3, x1: 4-7) */
#define RP_LINES8(M) M(0, x0, 0); M(1, x0, 1); M(2, x0, 2); M(3, x0, 3); M(4, x1, 0); M(5, x1, 1); M(6, x1, 2); M(7, x1, 3)
#if defined(__ARM_FEATURE_DOTPROD)
#define RK_RP_KERNEL "sdot4x4"
#define RP_DOT(c)                                                                                    \
    do {                                                                                             \
        const uint8x16_t v = vld1q_u8(q + 64 * (c) + 16 * k);                                        \
        i = vdotq_laneq_s32(i, vreinterpretq_s8_u8(vandq_u8(v, m4)), xl, c);                         \
        i = vdotq_laneq_s32(i, vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), xh, c);                        \
    } while (0)
RK_INLINE void rp_block(const uint8_t *q, const int8_t *x, vf *d)
{
    const uint8x16_t m4 = vdupq_n_u8(15);
    const int8x16_t xl = vld1q_s8(x), xh = vld1q_s8(x + 16);
    for (int k = 0; k < 4; k++) {
        int32x4_t i = vdupq_n_s32(0);
        RP_DOT(0);
        RP_DOT(1);
        RP_DOT(2);
        RP_DOT(3);
        d[k] = vcvtq_f32_s32(i);
    }
}
#define RP_DOT8(c, xr, l) i = vdotq_laneq_s32(i, vld1q_s8((const int8_t *)q + 64 * (c) + 16 * k), xr, l)
RK_INLINE void rp_block8(const uint8_t *q, const int8_t *x, const int16_t *ws, vf *d)
{
    (void)ws;
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
    for (int k = 0; k < 4; k++) {
        int32x4_t i = vdupq_n_s32(0);
        RP_LINES8(RP_DOT8);
        d[k] = vcvtq_f32_s32(i);
    }
}
#undef RP_DOT8
#else
#define RK_RP_KERNEL "smull4x4"
#define RP_DOT(c)                                                                                    \
    do {                                                                                             \
        const uint8x16_t v = vld1q_u8(q + 64 * (c) + 16 * k);                                        \
        const int8x16_t wl = vreinterpretq_s8_u8(vandq_u8(v, m4)), wh = vreinterpretq_s8_u8(vshrq_n_u8(v, 4)); \
        const int8x16_t bl = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(xl), c));  \
        const int8x16_t bh = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(xh), c));  \
        s01 = vmlal_s8(s01, vget_low_s8(wl), vget_low_s8(bl));                                       \
        s23 = vmlal_high_s8(s23, wl, bl);                                                            \
        s01 = vmlal_s8(s01, vget_low_s8(wh), vget_low_s8(bh));                                       \
        s23 = vmlal_high_s8(s23, wh, bh);                                                            \
    } while (0)
RK_INLINE void rp_block(const uint8_t *q, const int8_t *x, vf *d)
{
    const uint8x16_t m4 = vdupq_n_u8(15);
    const int8x16_t xl = vld1q_s8(x), xh = vld1q_s8(x + 16);
    for (int k = 0; k < 4; k++) {
        int16x8_t s01 = vdupq_n_s16(0), s23 = vdupq_n_s16(0); /* rows 0-1 and 2-3 of the quarter */
        RP_DOT(0);
        RP_DOT(1);
        RP_DOT(2);
        RP_DOT(3);
        d[k] = vcvtq_f32_s32(vpaddq_s32(vpaddlq_s16(s01), vpaddlq_s16(s23)));
    }
}
/* Products of two int8 (<= 128 * 128) do not pair in int16: each line's are added pairwise into int32. */
#define RP_MUL8(c, xr, l)                                                                             \
    do {                                                                                              \
        const int8x16_t v = vld1q_s8((const int8_t *)q + 64 * (c) + 16 * k);                          \
        const int8x16_t b = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(xr), l));      \
        s01 = vpadalq_s16(s01, vmull_s8(vget_low_s8(v), vget_low_s8(b)));                             \
        s23 = vpadalq_s16(s23, vmull_high_s8(v, b));                                                  \
    } while (0)
RK_INLINE void rp_block8(const uint8_t *q, const int8_t *x, const int16_t *ws, vf *d)
{
    (void)ws;
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
    for (int k = 0; k < 4; k++) {
        int32x4_t s01 = vdupq_n_s32(0), s23 = vdupq_n_s32(0); /* rows 0-1 and 2-3 of the quarter, in halves */
        RP_LINES8(RP_MUL8);
        d[k] = vcvtq_f32_s32(vpaddq_s32(s01, s23));
    }
}
#undef RP_MUL8
#endif
#undef RP_DOT
#undef RP_LINES8
