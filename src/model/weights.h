/*
 * weights.h - the tensors of a gpt-oss model, bound to their layer slots.
 *
 * A gptoss_tensor is a view: it points into memory someone else owns (the safetensors
 * mappings of a loaded model, or buffers a generator filled). Binding checks every tensor's
 * dtype and shape against the config, so backends may trust them.
 *
 * Shapes use the Hugging Face layout (spec section 3.2): Linear weights are [out, in],
 * MXFP4 experts are blocks [E, rows, in/32, 16] (two 4-bit codes per byte, low nibble = even
 * lane) with scales [E, rows, in/32] (E8M0, value 2^(s-127)).
 */
#ifndef GPTOSS_MODEL_WEIGHTS_H
#define GPTOSS_MODEL_WEIGHTS_H

#include "gptoss.h"

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
    const char *name;               /* full checkpoint name; owned by the binder */
    const void *data;               /* little-endian, C-order, possibly unaligned */
    gptoss_dtype dtype;
    int32_t n_dims;
    int64_t shape[GPTOSS_MAX_DIMS];
    size_t n_bytes;
} gptoss_tensor;

typedef struct gptoss_layer_weights {
    gptoss_tensor attn_norm;      /* input_layernorm.weight [H] */
    gptoss_tensor q_weight;       /* [NH*D, H] bf16 */
    gptoss_tensor q_bias;         /* [NH*D] */
    gptoss_tensor k_weight;       /* [NKV*D, H] bf16 */
    gptoss_tensor k_bias;         /* [NKV*D] */
    gptoss_tensor v_weight;       /* [NKV*D, H] bf16 */
    gptoss_tensor v_bias;         /* [NKV*D] */
    gptoss_tensor o_weight;       /* [H, NH*D] bf16 */
    gptoss_tensor o_bias;         /* [H] */
    gptoss_tensor sinks;          /* [NH] one logit per query head */
    gptoss_tensor mlp_norm;       /* post_attention_layernorm.weight [H] (feeds the MoE) */
    gptoss_tensor router_weight;  /* [E, H] bf16 */
    gptoss_tensor router_bias;    /* [E] */
    gptoss_tensor gate_up_blocks; /* [E, 2I, H/32, 16] u8; rows interleaved gate,up,gate,... */
    gptoss_tensor gate_up_scales; /* [E, 2I, H/32] u8 */
    gptoss_tensor gate_up_bias;   /* [E, 2I] interleaved like the rows */
    gptoss_tensor down_blocks;    /* [E, H, I/32, 16] u8 */
    gptoss_tensor down_scales;    /* [E, H, I/32] u8 */
    gptoss_tensor down_bias;      /* [E, H] */
} gptoss_layer_weights;

typedef struct gptoss_weights {
    gptoss_tensor embedding;      /* model.embed_tokens.weight [V, H] bf16 */
    gptoss_tensor final_norm;     /* model.norm.weight [H] */
    gptoss_tensor lm_head;        /* lm_head.weight [V, H] bf16 (untied) */
    gptoss_layer_weights *layers; /* [n_layers] */
    int32_t n_layers;
} gptoss_weights;

/* Number of tensors a model of this config has (19 per layer + 3). */
int32_t gptoss_weights_expected_count(const gptoss_config *config);

/* The weights of a loaded model (valid while the model lives). */
const gptoss_weights *gptoss_model_weights(const gptoss_model *model);

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

/* E2M1 code (0..15) to float, and E8M0 scale byte to 2^(s-127). */
extern const float gptoss_fp4_e2m1_values[16];

#endif
