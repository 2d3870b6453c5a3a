/* An ABI-faithful stand-in for librknnrt's matmul API, built by the tests (tests/test_rknpu_matmul.py).
 *
 * Written from the documented layouts (LP64), not from Rockchip's headers. It exports the symbols the
 * binding (inference/backends/rknpu/matmul.py) calls, computes on the CPU, and refuses what the RK3588
 * runtime refuses, with the runtime's error codes:
 *   - struct sizes: matmul_info 64, tensor_attr 332, io_attr 996, tensor_mem 40, quant_params 288
 *     (checked at compile time below); reserved bytes of matmul_info must be zero;
 *   - the RK3588 type table: FP16xFP16->FP32 (1), INT8xINT8->INT32 (2), INT4xINT4->INT16 (10); every
 *     other type (w4a16 7, INT8xINT4 11, FP16xINT8 5, ...) is RKNN_ERR_PARAM_INVALID;
 *   - K a multiple of 32 and <= 10240, N a multiple of 32 (int8), 16 (fp16), 64 (int4), M >= 1;
 *   - live handles: a destroyed or unknown context or memory is RKNN_ERR_CTX_INVALID / PARAM_INVALID;
 *   - memory from memfd (rknn_create_mem sets fd), tensor names and sizes checked in set_io_mem;
 *     rknn_create_mem_from_fd takes the caller's fd and mapping (never unmaps or closes them) and
 *     refuses an fd that is not open or is shorter than offset + size;
 *   - core masks of three cores (AUTO, 0, 1, 2, 0_1, 0_1_2, ALL);
 *   - per-channel B quantization "runs" and returns zeros, as reported on RK3588 (rknn-toolkit2 #550).
 * Fault injection: the environment variable RKNN_STANDIN_FAULT = create | run | version | from_fd makes that call
 * fail (read at each call).
 * B native layout (B_layout 1): tiles of [N/tn, K/32, tn, 32], tn = 16 (fp16), 32 (int8), 64 (int4).
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rknnrt_standin.h"

#define MAX_CTX 1024
#define MAX_MEM 4096
typedef struct {
    int live;
    mm_info info;
    mm_io_attr io;
    tensor_mem *mem[3]; /* A, B, C */
    uint32_t core_mask;
} ctx_t;
static ctx_t ctxs[MAX_CTX];      /* handle = index + 1 */
static tensor_mem *mems[MAX_MEM]; /* every live tensor_mem this library handed out */

static int fault(const char *call) {
    const char *f = getenv("RKNN_STANDIN_FAULT");
    return f && strcmp(f, call) == 0;
}

static ctx_t *get_ctx(uint64_t h) {
    return h >= 1 && h <= MAX_CTX && ctxs[h - 1].live ? &ctxs[h - 1] : NULL;
}

static int mem_slot(const tensor_mem *m) {
    for (int i = 0; i < MAX_MEM; i++)
        if (m && mems[i] == m) return i;
    return -1;
}

static int tile_n(int type) { return type == MM_F16_F32 ? 16 : type == MM_I8_I32 ? 32 : 64; }

static void set_attr(mm_attr *a, const char *name, int type, uint32_t bytes, int n, const uint32_t *dims) {
    memset(a, 0, sizeof *a);
    strcpy(a->name, name);
    a->type = type;
    a->size = bytes;
    a->n_dims = (uint32_t)n;
    for (int i = 0; i < n; i++) a->dims[i] = dims[i];
}

int rknn_matmul_create(uint64_t *ctx, mm_info *info, mm_io_attr *io) {
    if (!ctx || !info || !io) return ERR_PARAM_INVALID;
    for (int i = 0; i < 34; i++)
        if (info->reserved[i]) return ERR_PARAM_INVALID;
    if (fault("create")) return ERR_FAIL;
    int t = info->type;
    if (t != MM_F16_F32 && t != MM_I8_I32 && t != MM_I4_I16) return ERR_PARAM_INVALID;
    int M = info->M, K = info->K, N = info->N;
    if (M < 1 || K < 32 || K > 10240 || K % 32 || N < 1 || N % tile_n(t)) return ERR_PARAM_INVALID;
    if (info->B_layout < 0 || info->B_layout > 1 || info->AC_layout != 0) return ERR_PARAM_INVALID;
    if (info->B_quant_type < 0 || info->B_quant_type > 2 || info->AC_quant_type != 0) return ERR_PARAM_INVALID;
    int slot = -1;
    for (int i = 0; i < MAX_CTX && slot < 0; i++)
        if (!ctxs[i].live) slot = i;
    if (slot < 0) return ERR_FAIL;
    ctx_t *c = &ctxs[slot];
    memset(c, 0, sizeof *c);
    c->live = 1;
    c->info = *info;
    int in_t = t == MM_F16_F32 ? T_FLOAT16 : t == MM_I8_I32 ? T_INT8 : T_INT4;
    int out_t = t == MM_F16_F32 ? T_FLOAT32 : t == MM_I8_I32 ? T_INT32 : T_INT16;
    uint32_t in_bits = t == MM_F16_F32 ? 16 : t == MM_I8_I32 ? 8 : 4, out_b = t == MM_I4_I16 ? 2 : 4;
    uint32_t a_dims[2] = {(uint32_t)M, (uint32_t)K}, c_dims[2] = {(uint32_t)M, (uint32_t)N};
    set_attr(&c->io.A, "A", in_t, (uint32_t)M * K * in_bits / 8, 2, a_dims);
    if (info->B_layout == 1) {
        uint32_t tn = (uint32_t)tile_n(t), b_dims[4] = {(uint32_t)N / tn, (uint32_t)K / 32, tn, 32};
        set_attr(&c->io.B, "B", in_t, (uint32_t)K * N * in_bits / 8, 4, b_dims);
    } else {
        uint32_t b_dims[2] = {(uint32_t)K, (uint32_t)N};
        set_attr(&c->io.B, "B", in_t, (uint32_t)K * N * in_bits / 8, 2, b_dims);
    }
    set_attr(&c->io.C, "C", out_t, (uint32_t)M * N * out_b, 2, c_dims);
    *io = c->io;
    *ctx = (uint64_t)slot + 1;
    return SUCC;
}

int rknn_matmul_destroy(uint64_t ctx) {
    ctx_t *c = get_ctx(ctx);
    if (!c) return ERR_CTX_INVALID;
    c->live = 0;
    return SUCC;
}

int rknn_matmul_set_core_mask(uint64_t ctx, int32_t mask) {
    ctx_t *c = get_ctx(ctx);
    if (!c) return ERR_CTX_INVALID;
    if (mask != 0 && mask != 1 && mask != 2 && mask != 4 && mask != 3 && mask != 7 && mask != 0xffff)
        return ERR_PARAM_INVALID;
    c->core_mask = (uint32_t)mask;
    return SUCC;
}

int rknn_matmul_set_quant_params(uint64_t ctx, quant_params *p) {
    if (!get_ctx(ctx)) return ERR_CTX_INVALID;
    return p && p->scale && p->scale_len > 0 ? SUCC : ERR_PARAM_INVALID;
}

tensor_mem *rknn_create_mem(uint64_t ctx, uint32_t size) {
    if (!get_ctx(ctx) || size == 0) return NULL;
    int slot = mem_slot(NULL);
    for (int i = 0; i < MAX_MEM && slot < 0; i++)
        if (!mems[i]) slot = i;
    if (slot < 0) return NULL;
    int fd = memfd_create("rknn_standin", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, size) != 0) return NULL;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { close(fd); return NULL; }
    tensor_mem *m = calloc(1, sizeof *m);
    m->virt_addr = p;
    m->fd = fd;
    m->size = size;
    m->flags = 1; /* owned: unmapped and closed by rknn_destroy_mem */
    mems[slot] = m;
    return m;
}

tensor_mem *rknn_create_mem_from_fd(uint64_t ctx, int32_t fd, void *virt, uint32_t size, int32_t offset) {
    if (fault("from_fd") || !get_ctx(ctx) || fd < 0 || !virt || size == 0 || offset < 0) return NULL;
    off_t end = lseek(fd, 0, SEEK_END); /* a dma-buf's and a memfd's size alike */
    if (end < 0 || (uint64_t)end < (uint64_t)offset + size) return NULL;
    int slot = -1;
    for (int i = 0; i < MAX_MEM && slot < 0; i++)
        if (!mems[i]) slot = i;
    if (slot < 0) return NULL;
    tensor_mem *m = calloc(1, sizeof *m);
    m->virt_addr = virt; /* the caller's mapping of fd at offset */
    m->fd = fd;
    m->offset = offset;
    m->size = size;
    mems[slot] = m;
    return m;
}

int rknn_destroy_mem(uint64_t ctx, tensor_mem *m) {
    if (!get_ctx(ctx)) return ERR_CTX_INVALID;
    int slot = mem_slot(m);
    if (slot < 0) return ERR_PARAM_INVALID;
    for (int i = 0; i < MAX_CTX; i++)
        for (int j = 0; j < 3; j++)
            if (ctxs[i].mem[j] == m) ctxs[i].mem[j] = NULL;
    if (m->flags & 1) {
        munmap(m->virt_addr, m->size);
        close(m->fd);
    }
    mems[slot] = NULL;
    free(m);
    return SUCC;
}

int rknn_matmul_set_io_mem(uint64_t ctx, tensor_mem *m, mm_attr *attr) {
    ctx_t *c = get_ctx(ctx);
    if (!c) return ERR_CTX_INVALID;
    if (mem_slot(m) < 0 || !attr) return ERR_PARAM_INVALID;
    const mm_attr *want[3] = {&c->io.A, &c->io.B, &c->io.C};
    for (int j = 0; j < 3; j++) {
        if (strncmp(attr->name, want[j]->name, NAME_LEN) != 0) continue;
        if (attr->size != want[j]->size || attr->type != want[j]->type) return ERR_PARAM_INVALID;
        if ((uint64_t)m->size < want[j]->size) return ERR_PARAM_INVALID;
        c->mem[j] = m;
        return SUCC;
    }
    return ERR_PARAM_INVALID; /* not a tensor of this context */
}

static int8_t nib(const uint8_t *p, size_t i) { /* element i of packed int4, low nibble first */
    int v = (p[i / 2] >> (4 * (i % 2))) & 15;
    return (int8_t)(v >= 8 ? v - 16 : v);
}

/* element (k, n) of B, in either layout */
static size_t b_index(const mm_info *in, int k, int n) {
    if (in->B_layout == 0) return (size_t)k * in->N + n;
    int tn = tile_n(in->type);
    return ((((size_t)(n / tn) * (in->K / 32) + k / 32) * tn + n % tn) * 32) + k % 32;
}

/* C = A·B. B is read one column n at a time into `col` (K values, in k order), so both layouts
 * share one inner loop over contiguous memory. */
int rknn_matmul_run(uint64_t ctx) {
    ctx_t *c = get_ctx(ctx);
    if (!c) return ERR_CTX_INVALID;
    if (!c->mem[0] || !c->mem[1] || !c->mem[2]) return ERR_PARAM_INVALID;
    if (fault("run")) return ERR_TIMEOUT;
    const mm_info *in = &c->info;
    int M = in->M, K = in->K, N = in->N;
    const uint8_t *A = (uint8_t *)c->mem[0]->virt_addr, *B = (uint8_t *)c->mem[1]->virt_addr;
    void *C = c->mem[2]->virt_addr;
    int zeros = in->B_quant_type != 0;
    float *af = malloc(sizeof(float) * (size_t)M * K), *bf = malloc(sizeof(float) * K);
    int32_t *ai = malloc(sizeof(int32_t) * (size_t)M * K), *bi = malloc(sizeof(int32_t) * K);
    for (size_t i = 0; i < (size_t)M * K; i++) {
        if (in->type == MM_F16_F32) af[i] = (float)((const _Float16 *)A)[i];
        else ai[i] = in->type == MM_I8_I32 ? ((const int8_t *)A)[i] : nib(A, i);
    }
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) {
            size_t j = b_index(in, k, n);
            if (in->type == MM_F16_F32) bf[k] = (float)((const _Float16 *)B)[j];
            else bi[k] = in->type == MM_I8_I32 ? ((const int8_t *)B)[j] : nib(B, j);
        }
        for (int m = 0; m < M; m++) {
            if (in->type == MM_F16_F32) {
                const float *a = af + (size_t)m * K;
                float acc[8] = {0}; /* 8 lanes in a fixed order: vectorizable and deterministic (K % 32 == 0) */
                for (int k = 0; k < K; k += 8)
                    for (int j = 0; j < 8; j++) acc[j] += a[k + j] * bf[k + j];
                float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
                ((float *)C)[(size_t)m * N + n] = zeros ? 0.f : s;
            } else {
                const int32_t *a = ai + (size_t)m * K;
                int32_t s = 0;
                for (int k = 0; k < K; k++) s += a[k] * bi[k];
                if (in->type == MM_I8_I32) ((int32_t *)C)[(size_t)m * N + n] = zeros ? 0 : s;
                else ((int16_t *)C)[(size_t)m * N + n] = zeros ? 0 : (int16_t)s;
            }
        }
    }
    free(af), free(bf), free(ai), free(bi);
    return SUCC;
}

int rknn_B_normal_layout_to_native_layout(void *src, void *dst, int K, int N, mm_info *info) {
    if (!src || !dst || !info || info->K != K || info->N != N) return ERR_PARAM_INVALID;
    mm_info normal = *info, native = *info;
    normal.B_layout = 0;
    native.B_layout = 1;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            size_t i = b_index(&normal, k, n), o = b_index(&native, k, n);
            if (info->type == MM_F16_F32) ((uint16_t *)dst)[o] = ((uint16_t *)src)[i];
            else if (info->type == MM_I8_I32) ((int8_t *)dst)[o] = ((int8_t *)src)[i];
            else {
                uint8_t *d = (uint8_t *)dst + o / 2;
                int sh = 4 * (o % 2);
                *d = (uint8_t)((*d & ~(15 << sh)) | ((nib(src, i) & 15) << sh));
            }
        }
    return SUCC;
}

#define QUERY_SDK_VERSION 5
int rknn_query(uint64_t ctx, int cmd, void *out, uint32_t size) {
    if (!get_ctx(ctx)) return ERR_CTX_INVALID;
    if (cmd != QUERY_SDK_VERSION || !out || size != sizeof(sdk_version)) return ERR_PARAM_INVALID;
    if (fault("version")) return ERR_FAIL;
    sdk_version *v = out;
    memset(v, 0, sizeof *v);
    strcpy(v->api_version, "2.5.0 (stand-in)");
    strcpy(v->drv_version, "0.9.8 (stand-in)");
    return SUCC;
}
