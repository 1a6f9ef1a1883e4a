/*
 * tensor.c - the dtype table: safetensors names and element sizes (see tensor.h).
 */
#include "format/tensor.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    gptoss_dtype dtype;
    size_t size;
} dtype_table[] = {
    {"BF16", GPTOSS_DTYPE_BF16, 2},       {"F16", GPTOSS_DTYPE_F16, 2},
    {"F32", GPTOSS_DTYPE_F32, 4},         {"U8", GPTOSS_DTYPE_U8, 1},
    {"I8", GPTOSS_DTYPE_I8, 1},           {"I16", GPTOSS_DTYPE_I16, 2},
    {"U16", GPTOSS_DTYPE_U16, 2},         {"I32", GPTOSS_DTYPE_I32, 4},
    {"U32", GPTOSS_DTYPE_U32, 4},         {"I64", GPTOSS_DTYPE_I64, 8},
    {"U64", GPTOSS_DTYPE_U64, 8},         {"F64", GPTOSS_DTYPE_F64, 8},
    {"BOOL", GPTOSS_DTYPE_BOOL, 1},       {"F8_E4M3", GPTOSS_DTYPE_F8_E4M3, 1},
    {"F8_E5M2", GPTOSS_DTYPE_F8_E5M2, 1}, {"F8_E8M0", GPTOSS_DTYPE_F8_E8M0, 1},
};

size_t gptoss_dtype_size(gptoss_dtype dtype) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dtype == dtype) return dtype_table[i].size;
    return 0;
}

const char *gptoss_dtype_name(gptoss_dtype dtype) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dtype == dtype) return dtype_table[i].name;
    return "?";
}

gptoss_dtype gptoss_dtype_from_name(const char *name) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcmp(dtype_table[i].name, name) == 0) return dtype_table[i].dtype;
    return GPTOSS_DTYPE_UNKNOWN;
}

float *gptoss_tensor_to_f32(const gptoss_tensor *t) {
    if (t->dtype != GPTOSS_DTYPE_F32 && t->dtype != GPTOSS_DTYPE_BF16) return NULL;
    size_t n = 1;
    for (int32_t d = 0; d < t->n_dims; d++)
        n *= (size_t)t->shape[d];
    float *out = malloc((n ? n : 1) * sizeof *out);
    if (!out) return NULL;
    const uint8_t *p = t->data;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == GPTOSS_DTYPE_F32)
            memcpy(&out[i], p + 4 * i, 4);
        else
            out[i] = gptoss_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    }
    return out;
}
