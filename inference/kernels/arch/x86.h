/* The x86 backend of rkkernels_simd.h's vocabulary (which documents it): AVX-512 (F, BW; VNNI when the
 * machine has it) or AVX2 + FMA + F16C. Included by rkkernels_simd.h only. */
#if !defined(RK_NO_AVX512) && defined(__AVX512F__) && defined(__AVX512BW__)
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
 * slower or the same that way and keep it; the AVX2 gather of 8 showed no difference (benchmarks/README.md at 9362a58). */
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
#else
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
#endif

/* ---------------------------------------------------------------- int8 activations */
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

/* ---------------------------------------------------------------- repacked q4 */
#if defined(RK_GROUP64)
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
#else
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
#endif
