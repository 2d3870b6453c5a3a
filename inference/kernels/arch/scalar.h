/* The portable C backend of rkkernels_simd.h's vocabulary (which documents it): plain loops over
 * 8-lane structs, the same integers and the same float order on any machine (-DRK_NO_SIMD forces it).
 * Included by rkkernels_simd.h only. */
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

/* ---------------------------------------------------------------- int8 activations */
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

/* ---------------------------------------------------------------- repacked q4 */
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
