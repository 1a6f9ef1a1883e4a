/*
 * tp_split.c - the arithmetic and checks of tensor parallelism (see tp_split.h); owns nothing.
 */
#include "backend/tp_split.h"

#include "util/error.h"

#include <stdio.h>
#include <string.h>

gptoss_status gptoss_tp_check_options(int32_t tp_size, gptoss_backend_kind kind,
                                      gptoss_error *error) {
    if (tp_size == 0 || tp_size == 1) return GPTOSS_OK;
    if (tp_size != 2 && tp_size != 4 && tp_size != 8)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "backend: tensor_parallel_size must be 1, 2, 4 or 8, got %d",
                                (int)tp_size);
    if (kind != GPTOSS_BACKEND_CUDA)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "backend: tensor parallelism (tensor_parallel_size %d) needs the "
                                "CUDA backend; the CPU backend runs on one device",
                                (int)tp_size);
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_check_config(const gptoss_config *c, int32_t tp_size, int32_t device,
                                     int32_t n_devices, gptoss_error *error) {
    if (tp_size <= 1) return GPTOSS_OK;
    if (device < 0 || device + tp_size > n_devices)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tensor parallel size %d needs GPUs %d..%d, but %d %s visible",
                                (int)tp_size, (int)device, (int)(device + tp_size - 1),
                                (int)n_devices, n_devices == 1 ? "is" : "are");
    if (c->n_heads % tp_size || c->n_kv_heads % tp_size || c->n_experts % tp_size)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "tensor parallel size %d must divide the model's query heads (%d), "
                                "KV heads (%d) and experts (%d)",
                                (int)tp_size, (int)c->n_heads, (int)c->n_kv_heads,
                                (int)c->n_experts);
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_check_job(const gptoss_config *c, int32_t tp_size, int32_t n_procs,
                                  int32_t device, int32_t n_devices, gptoss_error *error) {
    if (n_procs <= 1) return gptoss_tp_check_config(c, tp_size, device, n_devices, error);
    if (tp_size < n_procs || tp_size % n_procs)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tensor parallel size %d (the GPUs of all %d processes together) "
                                "must be a multiple of the number of processes",
                                (int)tp_size, (int)n_procs);
    const int32_t local = tp_size / n_procs;
    if (device < 0 || device + local > n_devices)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "tensor parallel size %d over %d processes needs %d GPU%s in each "
                                "(GPUs %d..%d), but %d %s visible here",
                                (int)tp_size, (int)n_procs, (int)local, local == 1 ? "" : "s",
                                (int)device, (int)(device + local - 1), (int)n_devices,
                                n_devices == 1 ? "is" : "are");
    return gptoss_tp_check_config(c, tp_size, 0, tp_size, error); /* the split itself */
}

gptoss_status gptoss_dp_engine_devices(int32_t n_engines, int32_t tp_size, int32_t device,
                                       int32_t n_devices, int32_t *first, gptoss_error *error) {
    if (tp_size < 1) tp_size = 1;
    if (n_engines < 1)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "data parallel size %d: at least one engine", (int)n_engines);
    const int64_t need = (int64_t)n_engines * tp_size;
    if (device < 0 || device + need > n_devices) {
        char per[64] = "";
        if (tp_size > 1)
            snprintf(per, sizeof per, " of %d GPUs each (tensor parallel)", (int)tp_size);
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "data parallel size %d%s needs GPUs %d..%lld, but %d %s visible",
                                (int)n_engines, per, (int)device, (long long)(device + need - 1),
                                (int)n_devices, n_devices == 1 ? "is" : "are");
    }
    for (int32_t i = 0; first && i < n_engines; i++)
        first[i] = device + i * tp_size;
    return GPTOSS_OK;
}

gptoss_tp_slice gptoss_tp_rank_slice(const gptoss_config *c, int32_t tp_size, int32_t rank) {
    gptoss_tp_slice s;
    if (tp_size < 1) tp_size = 1;
    s.n_heads = c->n_heads / tp_size;
    s.n_kv_heads = c->n_kv_heads / tp_size;
    s.n_experts = c->n_experts / tp_size;
    s.head0 = rank * s.n_heads;
    s.kv_head0 = rank * s.n_kv_heads;
    s.expert0 = rank * s.n_experts;
    s.inter0 = 0;
    s.n_inter = c->intermediate_size;
    s.down_bias = true;
    return s;
}

gptoss_tp_slice gptoss_tp_rank_slice_moe(const gptoss_config *c, int32_t tp_size, int32_t rank,
                                         int32_t moe_parallel) {
    gptoss_tp_slice s = gptoss_tp_rank_slice(c, tp_size, rank);
    if (moe_parallel != GPTOSS_MOE_PARALLEL_TP || tp_size <= 1) return s;
    s.expert0 = 0;
    s.n_experts = c->n_experts;
    s.n_inter = c->intermediate_size / tp_size;
    s.inter0 = rank * s.n_inter;
    s.down_bias = rank == 0;
    return s;
}

gptoss_status gptoss_tp_check_moe(const gptoss_config *c, int32_t tp_size, int32_t moe_parallel,
                                  gptoss_error *error) {
    if (moe_parallel != GPTOSS_MOE_PARALLEL_EP && moe_parallel != GPTOSS_MOE_PARALLEL_TP)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "backend: moe_parallel must be 0 (experts) or 1 (rows), got %d",
                                (int)moe_parallel);
    if (moe_parallel == GPTOSS_MOE_PARALLEL_TP && tp_size > 1 &&
        c->intermediate_size % (32 * tp_size) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "tensor parallelism: splitting the experts' %d intermediate rows "
                                "%d ways leaves %d-row slices, not whole 32-wide MXFP4 groups "
                                "(--moe-parallel ep splits by whole experts instead)",
                                (int)c->intermediate_size, (int)tp_size,
                                (int)(c->intermediate_size / tp_size));
    return GPTOSS_OK;
}

void gptoss_tp_copy_row_slices(const void *src, size_t rows, size_t row_bytes, size_t off, size_t n,
                               void *dst) {
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)dst;
    for (size_t r = 0; r < rows; r++)
        memcpy(d + r * n, s + r * row_bytes + off, n);
}

void gptoss_tp_copy_columns16(const void *src, size_t rows, size_t cols, size_t col0, size_t n_cols,
                              void *dst) {
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)dst;
    for (size_t r = 0; r < rows; r++)
        memcpy(d + r * n_cols * 2, s + (r * cols + col0) * 2, n_cols * 2);
}
