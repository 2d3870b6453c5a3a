/* The vector vocabulary the kernels in rkkernels.c are written in, with one backend per ISA.
 *
 * Backends: AVX-512 (x86_64 with F+BW), AVX2+FMA+F16C (x86_64), NEON (aarch64), and portable C
 * (anything else, or when built with -DRK_NO_SIMD; -DRK_NO_AVX512 picks AVX2 on an AVX-512 machine).
 * Weights decode in units of DU consecutive values (8, or 16 with AVX-512) held in NU vectors of VL
 * float32 lanes. Each backend defines:
 *   VL, NU, DU = NU * VL
 *   vf_zero, vf_set1, vf_load, vf_store, vf_add, vf_mul
 *   vf_fma(a, b, c)           a * b + c (fused where the ISA has it; always the same per backend)
 *   vf_hsum(v)                sum of the lanes in a fixed order
 *   decu_f32/f16/i8(p, w)     DU weights at p as NU float vectors
 *   decu_nib(p, lo, b)        DU bytes at p: their low nibbles (DU values) and the whole bytes (DU values)
 *   decu_f16x2_strided(p, s, n, a, b)  the half pairs at p + j*s for j < n <= DU: first halves to a,
 *                             second to b, lanes from n on zero (and their memory untouched)
 *   f16_to_f32(bits)          one IEEE half to float
 * Every kernel step is one of these, so the order of float operations per output element is fixed by
 * the source and the backend; it never depends on how many rows share a call (see rkkernels.c).
 */
#ifndef RKKERNELS_SIMD_H
#define RKKERNELS_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define RK_INLINE static inline __attribute__((always_inline))
#define RK_SIMD_X86 0
#define RK_SIMD_NEON 0

#if !defined(RK_NO_SIMD) && !defined(RK_NO_AVX512) && defined(__AVX512F__) && defined(__AVX512BW__)
/* ---------------------------------------------------------------- AVX-512 (F, BW) */
#include <immintrin.h>
#define RK_BACKEND "avx512"
#undef RK_SIMD_X86
#define RK_SIMD_X86 1
#define VL 16
#define NU 1
typedef __m512 vf;

RK_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
RK_INLINE vf vf_set1(float a) { return _mm512_set1_ps(a); }
RK_INLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
RK_INLINE void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
RK_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
RK_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
RK_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }

RK_INLINE float vf_hsum(vf a)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

RK_INLINE void decu_f32(const float *p, vf *w) { w[0] = _mm512_loadu_ps(p); }
RK_INLINE void decu_f16(const uint16_t *p, vf *w) { w[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
RK_INLINE void decu_i8(const int8_t *p, vf *w)
{
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
RK_INLINE void decu_nib(const uint8_t *p, vf *lo, vf *b)
{
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    lo[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    b[0] = _mm512_cvtepi32_ps(v);
}
/* q8_0's blocks (stride 34: 16 lanes over 9 cache lines) convert faster from scalar loads than from
 * the gather (SmolLM2's q8_0 LM head 1.6x faster on an AVX-512 EPYC); q4_0 (18) and q4_1 (20) were
 * slower or the same that way and keep it; the AVX2 gather of 8 showed no difference (benchmarks/README.md). */
RK_INLINE void decu_f16x2_strided(const uint8_t *p, int64_t stride, int n, vf *a, vf *b)
{
    __m512i v;
    if (stride > 32) {
        uint32_t t[16];
        for (int j = 0; j < 16; j++) {
            uint32_t u = 0;
            if (j < n) memcpy(&u, p + j * stride, 4);
            t[j] = u;
        }
        v = _mm512_loadu_si512(t);
    } else {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)stride));
        v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << n) - 1), idx, (const void *)p, 1);
    }
    a[0] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    b[0] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}
RK_INLINE float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

#elif !defined(RK_NO_SIMD) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* ---------------------------------------------------------------- AVX2 + FMA + F16C */
#include <immintrin.h>
#define RK_BACKEND "avx2"
#undef RK_SIMD_X86
#define RK_SIMD_X86 1
#define VL 8
#define NU 1
typedef __m256 vf;

RK_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
RK_INLINE vf vf_set1(float a) { return _mm256_set1_ps(a); }
RK_INLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
RK_INLINE void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
RK_INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
RK_INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
RK_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }

RK_INLINE float vf_hsum(vf a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

RK_INLINE void decu_f32(const float *p, vf *w) { w[0] = _mm256_loadu_ps(p); }
RK_INLINE void decu_f16(const uint16_t *p, vf *w) { w[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
RK_INLINE void decu_i8(const int8_t *p, vf *w)
{
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
RK_INLINE void decu_nib(const uint8_t *p, vf *lo, vf *b)
{
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    lo[0] = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    b[0] = _mm256_cvtepi32_ps(v);
}
RK_INLINE void decu_f16x2_strided(const uint8_t *p, int64_t stride, int n, vf *a, vf *b)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i idx = _mm256_mullo_epi32(iota, _mm256_set1_epi32((int)stride));
    const __m256i v = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)p, idx,
                                                  _mm256_cmpgt_epi32(_mm256_set1_epi32(n), iota), 1);
    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(v, 16);
    const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8); /* lo 0-7 | hi 0-7 */
    a[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(pk));
    b[0] = _mm256_cvtph_ps(_mm256_extracti128_si256(pk, 1));
}
RK_INLINE float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

#elif !defined(RK_NO_SIMD) && defined(__ARM_NEON) && defined(__aarch64__)
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

#else
/* ---------------------------------------------------------------- portable C */
#define RK_BACKEND "scalar"
#define VL 8
#define NU 1
typedef struct {
    float v[VL];
} vf;

RK_INLINE vf vf_zero(void)
{
    vf r;
    for (int l = 0; l < VL; l++) r.v[l] = 0.0f;
    return r;
}
RK_INLINE vf vf_set1(float a)
{
    vf r;
    for (int l = 0; l < VL; l++) r.v[l] = a;
    return r;
}
RK_INLINE vf vf_load(const float *p)
{
    vf r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
RK_INLINE void vf_store(float *p, vf a) { memcpy(p, a.v, sizeof a.v); }
RK_INLINE vf vf_add(vf a, vf b)
{
    for (int l = 0; l < VL; l++) a.v[l] += b.v[l];
    return a;
}
RK_INLINE vf vf_mul(vf a, vf b)
{
    for (int l = 0; l < VL; l++) a.v[l] *= b.v[l];
    return a;
}
/* a separate multiply and add: the same on every compiler (fp-contract off, see rkkernels.c) */
RK_INLINE vf vf_fma(vf a, vf b, vf c)
{
    for (int l = 0; l < VL; l++) {
        float p = a.v[l] * b.v[l];
        c.v[l] = c.v[l] + p;
    }
    return c;
}
RK_INLINE float vf_hsum(vf a)
{
    float s0 = (a.v[0] + a.v[4]) + (a.v[2] + a.v[6]);
    float s1 = (a.v[1] + a.v[5]) + (a.v[3] + a.v[7]);
    return s0 + s1;
}

RK_INLINE float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in float */
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    memcpy(&f, &bits, 4);
    return f;
}

RK_INLINE void decu_f32(const float *p, vf *w) { memcpy(w[0].v, p, 8 * sizeof(float)); }
RK_INLINE void decu_f16(const uint16_t *p, vf *w)
{
    for (int l = 0; l < 8; l++) w[0].v[l] = f16_to_f32(p[l]);
}
RK_INLINE void decu_i8(const int8_t *p, vf *w)
{
    for (int l = 0; l < 8; l++) w[0].v[l] = (float)p[l];
}
RK_INLINE void decu_nib(const uint8_t *p, vf *lo, vf *b)
{
    for (int l = 0; l < 8; l++) {
        lo[0].v[l] = (float)(p[l] & 15);
        b[0].v[l] = (float)p[l];
    }
}
RK_INLINE void decu_f16x2_strided(const uint8_t *p, int64_t stride, int n, vf *a, vf *b)
{
    for (int l = 0; l < 8; l++) {
        uint16_t h[2] = {0, 0};
        if (l < n) memcpy(h, p + l * stride, 4);
        a[0].v[l] = f16_to_f32(h[0]);
        b[0].v[l] = f16_to_f32(h[1]);
    }
}
#endif

#define DU (NU * VL)

/* ---------------------------------------------------------------- int8 activations (all backends)
 * The vocabulary of the int8-activation path (rkkernels.c, "q8a"): 32 weights of one block meet 32
 * int8 activations in an exact integer dot product, which is then scaled into a float accumulator.
 *   vb                        32 int8 weights of one block
 *   vb_nib(p)                 16 bytes of nibbles at p as 32 values 0..15: the low nibbles, then the high
 *   vb_s8(p)                  32 int8 at p
 *   vi_dot_u(w, x)            lanes of int32 partial sums of w * x (w from vb_nib: 0..15), exact
 *   vi_dot_s(w, x)            the same for signed w (vb_s8; -127..127, as every quantizer writes)
 *   vs, vs_zero, vs_fma_i(i, s, acc)  acc + float(i) * s lane by lane (fused or not, fixed per backend)
 *   vs_hsum(acc)              sum of the lanes in a fixed order
 *   q8a_load(x, eo, v)        the 32 floats at x into v, as they are or (eo) their even then odd elements;
 *                             returns max |v|
 *   q8a_round(v, id, q)       q[j] = roundf(v[j] * id) clamped to +-127 for the 32 floats at v (roundf: half
 *                             away from zero); returns the sum of q. The same integers on every backend.
 */
#if RK_SIMD_X86
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && !defined(RK_NO_AVX512)
#define RK_DOT "vnni"
RK_INLINE __m256i rk_dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
#if defined(__AVX512F__) && defined(__AVX512BW__)
/* q4's groups of 64 (two blocks) in one 512-bit dot, half the instructions per weight of two 256-bit ones:
 *   vg_nib(p)                   32 bytes of nibbles as vb_nib(p) | vb_nib(p + 16)
 *   vg_fma(w, x, dx2, s, acc)   acc + float(dot(w, x) per block) * (dx2[block] * s), 16 lanes (vf) */
#define RK_GROUP64 1
RK_INLINE __m512i vg_nib(const uint8_t *p)
{
    /* bytes 0-15 into 128-bit lanes 0 and 1, bytes 16-31 into lanes 2 and 3 (one cross-lane permute), then
     * lanes 1 and 3 shifted right by 4 and every byte masked: the low nibbles, then the high, per half */
    const __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                               _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)));
    const __m512i by4 = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                          0x0004000400040004);
    return _mm512_and_si512(_mm512_srlv_epi16(v, by4), _mm512_set1_epi8(15));
}
RK_INLINE __m512 vg_fma(__m512i w, const int8_t *x, const float *dx2, float s, __m512 acc)
{
    const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)x));
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512 dx = _mm512_permutexvar_ps(half, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)dx2))));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(dx, _mm512_set1_ps(s)), acc);
}
#endif
#else
#define RK_DOT "maddubs"
/* u <= 15 (nibbles) or <= 128 (|q8_0|) against |s| <= 127: a pair never saturates the int16 */
RK_INLINE __m256i rk_dot_u8s8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
#endif
typedef __m256i vb;
typedef __m256i vi;
typedef __m256 vs;
/* q8a_round: roundf(p) is p's integral part t plus sign(p) where |p - t| >= 0.5 (p - t is exact) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(RK_NO_AVX512)
RK_INLINE float q8a_load(const float *x, int eo, float *v)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    if (eo) {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512 e = _mm512_permutex2var_ps(a, even, b);
        b = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
        a = e;
    }
    _mm512_storeu_ps(v, a);
    _mm512_storeu_ps(v + 16, b);
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
}
RK_INLINE int32_t q8a_round(const float *v, float id, int8_t *q)
{
    int32_t sum = 0;
    for (int h = 0; h < 2; h++) {
        const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(v + 16 * h), _mm512_set1_ps(id));
        __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m512 sign = _mm512_and_ps(p, _mm512_set1_ps(-0.0f));
        const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(p, t));
        t = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t,
                               _mm512_or_ps(_mm512_set1_ps(1.0f), sign));
        t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
        const __m512i i = _mm512_cvtps_epi32(t);
        _mm_storeu_si128((__m128i *)(q + 16 * h), _mm512_cvtepi32_epi8(i));
        sum += _mm512_reduce_add_epi32(i);
    }
    return sum;
}
#else
RK_INLINE float q8a_load(const float *x, int eo, float *v)
{
    __m256 r[4], m = _mm256_setzero_ps();
    for (int h = 0; h < 4; h++) r[h] = _mm256_loadu_ps(x + 8 * h);
    if (eo) { /* shuffles pick per 128-bit lane: a0 a2 b0 b2 | a4 a6 b4 b6, then 64-bit pairs back in order */
        const __m256 e0 = _mm256_shuffle_ps(r[0], r[1], 0x88), e1 = _mm256_shuffle_ps(r[2], r[3], 0x88);
        const __m256 o0 = _mm256_shuffle_ps(r[0], r[1], 0xdd), o1 = _mm256_shuffle_ps(r[2], r[3], 0xdd);
        r[0] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e0), 0xd8));
        r[1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e1), 0xd8));
        r[2] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o0), 0xd8));
        r[3] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o1), 0xd8));
    }
    for (int h = 0; h < 4; h++) {
        _mm256_storeu_ps(v + 8 * h, r[h]);
        m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), r[h]));
    }
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
RK_INLINE int32_t q8a_round(const float *v, float id, int8_t *q)
{
    __m256i i[4];
    for (int h = 0; h < 4; h++) {
        const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(v + 8 * h), _mm256_set1_ps(id));
        __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 sign = _mm256_and_ps(p, _mm256_set1_ps(-0.0f));
        const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(p, t));
        const __m256 half = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
        t = _mm256_add_ps(t, _mm256_and_ps(_mm256_or_ps(_mm256_set1_ps(1.0f), sign), half));
        t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        i[h] = _mm256_cvtps_epi32(t);
    }
    /* packs work per 128-bit lane: 4-element runs of i0 i1 i2 i3 | i0 i1 i2 i3, put back in order */
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}
#endif
RK_INLINE vb vb_nib(const uint8_t *p)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
RK_INLINE vb vb_s8(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
RK_INLINE vi vi_dot_u(vb w, const int8_t *x) { return rk_dot_u8s8(w, _mm256_loadu_si256((const __m256i *)x)); }
RK_INLINE vi vi_dot_s(vb w, const int8_t *x)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return rk_dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
}
RK_INLINE vs vs_zero(void) { return _mm256_setzero_ps(); }
RK_INLINE vs vs_fma_i(vi i, float s, vs acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s), acc); }
RK_INLINE float vs_hsum(vs a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#elif RK_SIMD_NEON
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

#else
#define RK_DOT "scalar"
typedef struct {
    int8_t v[32];
} vb;
typedef int32_t vi;
typedef float vs;
RK_INLINE vb vb_nib(const uint8_t *p)
{
    vb r;
    for (int j = 0; j < 16; j++) {
        r.v[j] = (int8_t)(p[j] & 15);
        r.v[16 + j] = (int8_t)(p[j] >> 4);
    }
    return r;
}
RK_INLINE vb vb_s8(const int8_t *p)
{
    vb r;
    memcpy(r.v, p, 32);
    return r;
}
RK_INLINE vi vi_dot_s(vb w, const int8_t *x)
{
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)w.v[j] * x[j];
    return s;
}
RK_INLINE vi vi_dot_u(vb w, const int8_t *x) { return vi_dot_s(w, x); }
RK_INLINE vs vs_zero(void) { return 0.0f; }
RK_INLINE vs vs_fma_i(vi i, float s, vs acc)
{
    float p = (float)i * s;
    return acc + p;
}
RK_INLINE float vs_hsum(vs a) { return a; }
RK_INLINE float q8a_load(const float *x, int eo, float *v)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        v[j] = eo ? x[j < 16 ? 2 * j : 2 * (j - 16) + 1] : x[j];
        const float m = v[j] < 0 ? -v[j] : v[j];
        amax = m > amax ? m : amax;
    }
    return amax;
}
RK_INLINE int32_t q8a_round(const float *v, float id, int8_t *q)
{
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
        const int r = (int)roundf(v[j] * id);
        q[j] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
        sum += q[j];
    }
    return sum;
}
#endif

/* ---------------------------------------------------------------- repacked q4 (rows in lanes, all backends)
 * rp_block(q, x, d): the dots of one block of 32 weights of RP = 16 output rows against one block of
 * int8 activations, as floats (d: RP / VL vectors, lane = row). q is the block in the repacked layout of
 * rkkernels.c ("repacked q4"): 4 lines of 64 bytes, line c holding bytes 4c..4c+3 of the block's 16 bytes
 * for rows 0..15 (4 bytes per row); x the block's 32 int8 in q4's order (16 evens, 16 odds), so the low
 * nibbles of line c meet x[4c..4c+3] and the high ones x[16+4c..16+4c+3], each an activation dword
 * broadcast against every row. The dots are exact integers (so their order does not matter), converted
 * to float once per block and row.
 *
 * rp_block8(q, x, ws, d): the same for a block of 32 int8 weights (repacked q8_0): 8 lines of 64 bytes, line c
 * holding bytes 4c..4c+3 of the block's 32 for rows 0..15, against x[4c..4c+3] (the block's int8 activations
 * in their own order); ws the block's 16 rows' weight sums (int16), which VNNI needs for its unsigned
 * operand and the other backends ignore. */
#define RP 16
#if RK_SIMD_X86 && defined(RK_GROUP64)
/* AVX-512 VNNI: one 512-bit line is 16 rows; vpdpbusd with the activation dword broadcast. The high
 * nibbles are taken in place (v & 0xf0, 16 x their value; the int32 sums stay exact), then shifted back
 * once per block: one operation per line less than shifting each line. */
#define RK_RP_KERNEL "vnni16"
RK_INLINE void rp_block(const uint8_t *q, const int8_t *x, vf *d)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        int32_t xl, xh;
        memcpy(&xl, x + 4 * c, 4);
        memcpy(&xh, x + 16 + 4 * c, 4);
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
        lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(v, m4), _mm512_set1_epi32(xl));
        hi = _mm512_dpbusd_epi32(hi, _mm512_andnot_si512(m4, v), _mm512_set1_epi32(xh));
    }
    d[0] = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, _mm512_srai_epi32(hi, 4)));
}
/* vpdpbusd takes the activations as x + 128 (x ^ 0x80, unsigned) against the signed weights, which adds
 * 128 times each row's weight sum: the sums start from minus that. Two chains, lines 0-3 and 4-7. */
RK_INLINE void rp_block8(const uint8_t *q, const int8_t *x, const int16_t *ws, vf *d)
{
    const __m512i sum = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)ws));
    __m512i acc[2] = {_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)), _mm512_setzero_si512()};
    for (int c = 0; c < 8; c++) {
        int32_t xv;
        memcpy(&xv, x + 4 * c, 4);
        acc[c / 4] = _mm512_dpbusd_epi32(acc[c / 4], _mm512_set1_epi32(xv ^ (int32_t)0x80808080u),
                                         _mm512_loadu_si512((const void *)(q + 64 * c)));
    }
    d[0] = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[0], acc[1]));
}
#elif RK_SIMD_X86
/* AVX2 (and AVX-512 without VNNI): each 64-byte line as two 256-bit halves of 8 rows; maddubs pairs
 * (<= 2 * 15 * 127 = 3810) summed in int16 over the block's 8 (<= 30480, no saturation), then one madd
 * against ones per half. */
#define RK_RP_KERNEL "maddubs8x2"
RK_INLINE void rp_block(const uint8_t *q, const int8_t *x, vf *d)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < 4; c++) {
        int32_t xl, xh;
        memcpy(&xl, x + 4 * c, 4);
        memcpy(&xh, x + 16 + 4 * c, 4);
        const __m256i bl = _mm256_set1_epi32(xl), bh = _mm256_set1_epi32(xh);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * c + 32 * h));
            s[h] = _mm256_add_epi16(s[h], _mm256_maddubs_epi16(_mm256_and_si256(v, m4), bl));
            s[h] = _mm256_add_epi16(s[h], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), bh));
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i i0 = _mm256_madd_epi16(s[0], ones), i1 = _mm256_madd_epi16(s[1], ones);
#if VL == 16
    d[0] = _mm512_cvtepi32_ps(_mm512_inserti64x4(_mm512_castsi256_si512(i0), i1, 1));
#else
    d[0] = _mm256_cvtepi32_ps(i0);
    d[1] = _mm256_cvtepi32_ps(i1);
#endif
}
/* maddubs takes an unsigned operand: |w| against x with w's sign (x in [-127, 127], so no byte
 * overflows; a pair <= 2 * 128 * 127 = 32512), one madd against ones per half line into int32. */
RK_INLINE void rp_block8(const uint8_t *q, const int8_t *x, const int16_t *ws, vf *d)
{
    (void)ws;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < 8; c++) {
        int32_t xv;
        memcpy(&xv, x + 4 * c, 4);
        const __m256i b = _mm256_set1_epi32(xv);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * c + 32 * h));
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(b, v));
            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p, ones));
        }
    }
#if VL == 16
    d[0] = _mm512_cvtepi32_ps(_mm512_inserti64x4(_mm512_castsi256_si512(s[0]), s[1], 1));
#else
    d[0] = _mm256_cvtepi32_ps(s[0]);
    d[1] = _mm256_cvtepi32_ps(s[1]);
#endif
}
#elif RK_SIMD_NEON
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
#else
#define RK_RP_KERNEL "scalar"
RK_INLINE void rp_block(const uint8_t *q, const int8_t *x, vf *d)
{
    int32_t i[RP] = {0};
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < RP; r++)
            for (int j = 0; j < 4; j++) {
                const uint8_t b = q[64 * c + 4 * r + j];
                i[r] += (int32_t)(b & 15) * x[4 * c + j] + (int32_t)(b >> 4) * x[16 + 4 * c + j];
            }
    for (int r = 0; r < RP; r++) d[r / VL].v[r % VL] = (float)i[r];
}
RK_INLINE void rp_block8(const uint8_t *q, const int8_t *x, const int16_t *ws, vf *d)
{
    (void)ws;
    int32_t i[RP] = {0};
    for (int c = 0; c < 8; c++)
        for (int r = 0; r < RP; r++)
            for (int j = 0; j < 4; j++) i[r] += (int32_t)(int8_t)q[64 * c + 4 * r + j] * x[4 * c + j];
    for (int r = 0; r < RP; r++) d[r / VL].v[r % VL] = (float)i[r];
}
#endif

#endif /* RKKERNELS_SIMD_H */
