/*
 * tensor.h - element types and the tensor view every layer shares.
 *
 * A gptoss_tensor is a view: it points into memory someone else owns (a mapped checkpoint
 * file, or buffers a generator filled). The dtype names are the safetensors ones. This header
 * knows nothing of models or files, so format readers and the model may both include it.
 */
#ifndef GPTOSS_FORMAT_TENSOR_H
#define GPTOSS_FORMAT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum gptoss_dtype {
    GPTOSS_DTYPE_UNKNOWN = 0,
    GPTOSS_DTYPE_BF16,
    GPTOSS_DTYPE_F16,
    GPTOSS_DTYPE_F32,
    GPTOSS_DTYPE_U8,
    GPTOSS_DTYPE_I8,
    GPTOSS_DTYPE_I16,
    GPTOSS_DTYPE_U16,
    GPTOSS_DTYPE_I32,
    GPTOSS_DTYPE_U32,
    GPTOSS_DTYPE_I64,
    GPTOSS_DTYPE_U64,
    GPTOSS_DTYPE_F64,
    GPTOSS_DTYPE_BOOL,
    GPTOSS_DTYPE_F8_E4M3,
    GPTOSS_DTYPE_F8_E5M2,
    GPTOSS_DTYPE_F8_E8M0,
} gptoss_dtype;

/* Bytes per element (0 for unknown). */
size_t gptoss_dtype_size(gptoss_dtype dtype);
/* The safetensors name ("BF16"), or "?". */
const char *gptoss_dtype_name(gptoss_dtype dtype);
/* Parses a safetensors dtype string; GPTOSS_DTYPE_UNKNOWN if not known. */
gptoss_dtype gptoss_dtype_from_name(const char *name);

#define GPTOSS_MAX_DIMS 8

typedef struct gptoss_tensor {
    const char *name; /* full checkpoint name; owned by the binder */
    const void *data; /* little-endian, C-order, possibly unaligned */
    gptoss_dtype dtype;
    int32_t n_dims;
    int64_t shape[GPTOSS_MAX_DIMS];
    size_t n_bytes;
} gptoss_tensor;

/* A malloc'd f32 copy of every element of a bf16 or f32 tensor (NULL when out of memory or for
 * another dtype); the caller frees it. */
float *gptoss_tensor_to_f32(const gptoss_tensor *t);

/* bf16 <-> f32 (round to nearest even; NaN stays NaN). */
static inline float gptoss_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}
static inline uint16_t gptoss_f32_to_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}

#endif
