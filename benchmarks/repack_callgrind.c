/* Instruction counts of one decode product (T = 1, int8 activations) of a q4 matrix, row-major (old)
 * or repacked (new), for valgrind's callgrind, which counts instructions whatever the machine's load.
 * Valgrind has no AVX-512, so build the AVX2 backend (benchmarks/README.md, "Repacked q4"):
 *
 *   cc -O2 -std=c11 -pthread -march=haswell -DRK_NO_PYTHON benchmarks/repack_callgrind.c \
 *      inference/kernels/rkkernels.c -o /tmp/rp_cg -lm
 *   valgrind --tool=callgrind --toggle-collect=rk_linear_many /tmp/rp_cg old 4096 2048 3
 *
 * Arguments: old | new, out, in, calls. The weights are random (values do not change the path). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rk_linear(int, int64_t, int64_t, int64_t, const float *, float *, const void *, const void *, const void *);
void rk_set_threads(int);

static uint64_t state = 88172645463325252ull;
static uint32_t next(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)state;
}

int main(int argc, char **argv)
{
    if (argc != 5) return 2;
    const int rp = !strcmp(argv[1], "new");
    const int64_t out = atoll(argv[2]), in = atoll(argv[3]), calls = atoll(argv[4]);
    const int64_t rows = (out + 15) / 16 * 16, half = in / 2, ng = in / 64;
    uint8_t *q = calloc(rows * half, 1), *rq = calloc(rows * half, 1);
    uint16_t *s = calloc(rows * ng, 2), *m = calloc(rows * ng, 2), *rs = calloc(rows * ng, 2), *rm = calloc(rows * ng, 2);
    float *x = malloc(4 * in), *y = malloc(4 * out);
    for (int64_t i = 0; i < out * half; i++) q[i] = (uint8_t)next();
    for (int64_t i = 0; i < out * ng; i++) {
        s[i] = 0x2000 + (next() & 0x3ff); /* small positive halves */
        m[i] = 0xa000 + (next() & 0x3ff);
    }
    for (int64_t k = 0; k < in; k++) x[k] = (float)((int32_t)(next() % 2001) - 1000) / 1000.0f;
    /* the layout of inference.quant.repack_q4 */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            const int64_t p = r / 16, l = r % 16;
            for (int c = 0; c < 8; c++) memcpy(rq + (p * ng + g) * 512 + 64 * c + 4 * l, q + r * half + 32 * g + 4 * c, 4);
            rs[(p * ng + g) * 16 + l] = s[r * ng + g];
            rm[(p * ng + g) * 16 + l] = m[r * ng + g];
        }
    rk_set_threads(1);
    double sum = 0;
    for (int64_t c = 0; c < calls; c++) {
        const int rc = rp ? rk_linear(3 | 16 | 32, 1, out, in, x, y, rq, rs, rm) : rk_linear(3 | 16, 1, out, in, x, y, q, s, m);
        if (rc) return 10 + rc;
        for (int64_t o = 0; o < out; o++) sum += y[o];
    }
    printf("%s %lldx%lld: checksum %.6g\n", argv[1], (long long)out, (long long)in, sum);
    return 0;
}
