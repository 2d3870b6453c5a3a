/* Instruction counts of one decode product (T = 1, int8 activations) of a q4, q4_1 or q8_0 matrix,
 * row-major (old) or repacked (new), for valgrind's callgrind, which counts instructions whatever the
 * machine's load. Valgrind has no AVX-512, so build the AVX2 backend (setup.py's avx2 build):
 *
 *   cc -O3 -std=c11 -pthread -march=haswell -mno-avx512f -DRK_NO_PYTHON benchmarks/profile/repack_callgrind.c \
 *      inference/kernels/rkkernels.c -o /tmp/rp_cg -lm
 *   valgrind --tool=callgrind --toggle-collect=rk_linear /tmp/rp_cg old 4096 2048 3 [q4|q4_1|q8_0]
 *
 * Arguments: old | new, out, in, calls, kind (default q4). The weights are random bytes in the kind's
 * parts (values do not change the path; the repacked parts are as large as quant.part_layout's). */
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

/* n bytes of random data whose 16-bit words are small positive halves where `halves` (scales) */
static void *random_part(int64_t n, int halves)
{
    uint8_t *p = malloc((size_t)n + 2);
    for (int64_t i = 0; i < n; i += 2) {
        const uint16_t v = halves ? (uint16_t)(0x2000 + (next() & 0x3ff)) : (uint16_t)next();
        memcpy(p + i, &v, 2);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) return 2;
    const int rp = !strcmp(argv[1], "new");
    const char *kind = argc == 6 ? argv[5] : "q4";
    const int64_t out = atoll(argv[2]), in = atoll(argv[3]), calls = atoll(argv[4]);
    const int64_t rows = rp ? (out + 15) / 16 * 16 : out, nb = in / 32;
    int code;
    const void *p0, *p1 = NULL, *p2 = NULL;
    if (!strcmp(kind, "q4")) { /* q, scales, biases (groups of 64) in either layout */
        code = 3;
        p0 = random_part(rows * in / 2, 0);
        p1 = random_part(rows * nb, 1);
        p2 = random_part(rows * nb, 1);
    } else if (!strcmp(kind, "q4_1")) { /* blocks of 20 bytes; repacked: q, d, m */
        code = 5;
        p0 = random_part(rp ? rows * in / 2 : out * nb * 20, 0);
        if (rp) p1 = random_part(rows * nb * 2, 1), p2 = random_part(rows * nb * 2, 1);
    } else if (!strcmp(kind, "q8_0")) { /* blocks of 34 bytes; repacked: q, d, weight sums */
        code = 6;
        p0 = random_part(rp ? rows * in : out * nb * 34, 0);
        if (rp) p1 = random_part(rows * nb * 2, 1), p2 = random_part(rows * nb * 2, 0);
    } else {
        fprintf(stderr, "kind %s: give q4, q4_1 or q8_0\n", kind);
        return 2;
    }
    if (!rp && code != 3) /* a GGUF block's d (and m) as small halves too */
        for (int64_t b = 0; b < out * nb; b++) {
            uint8_t *blk = (uint8_t *)p0 + b * (code == 5 ? 20 : 34);
            for (int h = 0; h < (code == 5 ? 2 : 1); h++) {
                const uint16_t v = (uint16_t)(0x2000 + (next() & 0x3ff));
                memcpy(blk + 2 * h, &v, 2);
            }
        }
    float *x = malloc(4 * in), *y = malloc(4 * out);
    for (int64_t k = 0; k < in; k++) x[k] = (float)((int32_t)(next() % 2001) - 1000) / 1000.0f;
    rk_set_threads(1);
    double sum = 0;
    for (int64_t c = 0; c < calls; c++) {
        const int rc = rk_linear(code | 16 | (rp ? 32 : 0), 1, out, in, x, y, p0, p1, p2);
        if (rc) return 10 + rc;
        for (int64_t o = 0; o < out; o++) sum += y[o];
    }
    printf("%s %s %lldx%lld: checksum %.6g\n", argv[1], kind, (long long)out, (long long)in, sum);
    return 0;
}
