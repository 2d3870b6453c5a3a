/* The vector vocabulary the kernels in rkkernels.c are written in, with one backend per ISA, each in its
 * own file: arch/x86.h (AVX-512, AVX2), arch/neon.h (aarch64), arch/scalar.h (portable C), one included.
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

/* derived from each backend's VL and NU */
#define DU (NU * VL)
#define RP 16 /* output rows per panel of repacked q4 (rp_block) */

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

#if !defined(RK_NO_SIMD) && ((!defined(RK_NO_AVX512) && defined(__AVX512F__) && defined(__AVX512BW__)) || \
                             (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)))
#include "arch/x86.h"
#elif !defined(RK_NO_SIMD) && defined(__ARM_NEON) && defined(__aarch64__)
#include "arch/neon.h"
#else
#include "arch/scalar.h"
#endif

#endif /* RKKERNELS_SIMD_H */
