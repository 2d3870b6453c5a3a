/* Drives the librknnrt stand-in the way inference/backends/rknpu/matmul.py does, for the aarch64 build
 * run under qemu-aarch64 (tests/test_rknpu_matmul.py): create, memory, set_io_mem, the library's B
 * layout conversion, run. stdin: M K N int32, then A int8 [M, K] and B int8 [K, N]; stdout: C int32. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rknnrt_standin.h"

int main(void) {
    int32_t dims[3];
    if (fread(dims, 4, 3, stdin) != 3) return 2;
    mm_info info;
    memset(&info, 0, sizeof info);
    info.M = dims[0], info.K = dims[1], info.N = dims[2], info.type = 2, info.B_layout = 1;
    uint64_t ctx;
    mm_io_attr io;
    if (rknn_matmul_create(&ctx, &info, &io)) return 3;
    if (rknn_matmul_set_core_mask(ctx, 4)) return 4;
    tensor_mem *a = rknn_create_mem(ctx, io.A.size), *b = rknn_create_mem(ctx, io.B.size),
               *c = rknn_create_mem(ctx, io.C.size);
    if (rknn_matmul_set_io_mem(ctx, a, &io.A) || rknn_matmul_set_io_mem(ctx, b, &io.B) ||
        rknn_matmul_set_io_mem(ctx, c, &io.C)) return 5;
    int8_t *bn = malloc(io.B.size);
    if (fread(a->virt_addr, 1, io.A.size, stdin) != io.A.size || fread(bn, 1, io.B.size, stdin) != io.B.size) return 6;
    if (rknn_B_normal_layout_to_native_layout(bn, b->virt_addr, info.K, info.N, &info)) return 7;
    if (rknn_matmul_run(ctx)) return 8;
    fwrite(c->virt_addr, 1, io.C.size, stdout);
    return rknn_matmul_destroy(ctx) ? 9 : 0;
}
