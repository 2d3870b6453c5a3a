/* The librknnrt matmul API's structures and prototypes as the stand-in (rknnrt_standin.c) and its aarch64
 * driver (rknnrt_standin_driver.c) use them: written from the documented layout (LP64), sizes checked. */
#ifndef RKNNRT_STANDIN_H
#define RKNNRT_STANDIN_H
#include <stddef.h>
#include <stdint.h>

#define NAME_LEN 256
#define MAX_DIMS 16
enum { SUCC = 0, ERR_FAIL = -1, ERR_TIMEOUT = -2, ERR_PARAM_INVALID = -5, ERR_CTX_INVALID = -7 };
enum { T_FLOAT32 = 0, T_FLOAT16 = 1, T_INT8 = 2, T_INT16 = 4, T_INT32 = 6, T_INT4 = 10 };
enum { MM_F16_F32 = 1, MM_I8_I32 = 2, MM_I4_I16 = 10 };

typedef struct {
    int32_t M, K, N, type;
    int16_t B_layout, B_quant_type, AC_layout, AC_quant_type;
    int32_t iommu_domain_id;
    int16_t group_size;
    int8_t reserved[34];
} mm_info;

typedef struct {
    char name[NAME_LEN];
    uint32_t n_dims, dims[MAX_DIMS], size;
    int32_t type;
} mm_attr;

typedef struct { mm_attr A, B, C; } mm_io_attr;

typedef struct {
    void *virt_addr;
    uint64_t phys_addr;
    int32_t fd, offset;
    uint32_t size, flags;
    void *priv_data;
} tensor_mem;

typedef struct {
    char name[NAME_LEN];
    float *scale;
    int32_t scale_len;
    int32_t *zp;
    int32_t zp_len;
} quant_params;

typedef struct { char api_version[256], drv_version[256]; } sdk_version;

_Static_assert(sizeof(mm_info) == 64, "matmul_info");
_Static_assert(sizeof(mm_attr) == 332, "tensor_attr");
_Static_assert(sizeof(mm_io_attr) == 996, "io_attr");
_Static_assert(sizeof(tensor_mem) == 40, "tensor_mem");
_Static_assert(sizeof(quant_params) == 288, "quant_params");
_Static_assert(offsetof(mm_info, B_layout) == 16 && offsetof(mm_info, iommu_domain_id) == 24 &&
               offsetof(mm_info, reserved) == 30, "matmul_info offsets");

int rknn_matmul_create(uint64_t *ctx, mm_info *info, mm_io_attr *io);
int rknn_matmul_destroy(uint64_t ctx);
int rknn_matmul_set_core_mask(uint64_t ctx, int32_t mask);
int rknn_matmul_set_io_mem(uint64_t ctx, tensor_mem *m, mm_attr *attr);
int rknn_matmul_run(uint64_t ctx);
tensor_mem *rknn_create_mem(uint64_t ctx, uint32_t size);
int rknn_B_normal_layout_to_native_layout(void *src, void *dst, int K, int N, mm_info *info);
#endif
