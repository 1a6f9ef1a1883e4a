/*
 * weights.h - the tensors of a gpt-oss model, bound to their layer slots.
 *
 * The tensors are views (format/tensor.h) into storage the model keeps alive: the mapped files
 * of a loaded checkpoint, or buffers a generator filled. Binding checks every tensor's dtype
 * and shape against the config, so backends may trust them.
 *
 * Shapes use the Hugging Face layout (spec section 3.2): Linear weights are [out, in],
 * MXFP4 experts are blocks [E, rows, in/32, 16] (two 4-bit codes per byte, low nibble = even
 * lane) with scales [E, rows, in/32] (E8M0, value 2^(s-127)).
 */
#ifndef GPTOSS_MODEL_WEIGHTS_H
#define GPTOSS_MODEL_WEIGHTS_H

#include "format/tensor.h"
#include "gptoss.h"

#include <stddef.h>
#include <stdint.h>

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

/* One layer's MXFP4 experts as ggml lays them out (a GGUF file): rows of 17-byte blocks of 32
 * values, the E8M0 scale byte then 16 bytes where byte j holds lane j in its low nibble and
 * lane j + 16 in its high one; gate and up are separate row sets, not interleaved. */
typedef struct gptoss_ggml_experts {
    const uint8_t *gate; /* [E, I, H/32] blocks */
    const uint8_t *up;   /* [E, I, H/32] blocks */
    const uint8_t *down; /* [E, H, I/32] blocks */
} gptoss_ggml_experts;

typedef struct gptoss_weights {
    gptoss_tensor embedding;      /* model.embed_tokens.weight [V, H] bf16 */
    gptoss_tensor final_norm;     /* model.norm.weight [H] */
    gptoss_tensor lm_head;        /* lm_head.weight [V, H] bf16 (untied) */
    gptoss_layer_weights *layers; /* [n_layers] */
    int32_t n_layers;
    /* [n_layers] for a model whose experts came in ggml's layout, else NULL. Then the layers'
     * gate_up/down blocks and scales have data NULL (dtype, shape and n_bytes set) until
     * gptoss_model_unpack_experts converts them: a backend either calls that (backend.c does,
     * unless the backend converts these bytes itself) or reads these. */
    const gptoss_ggml_experts *ggml_experts;
} gptoss_weights;

/* Number of tensors a model of this config has (19 per layer + 3). */
int32_t gptoss_weights_expected_count(const gptoss_config *config);

/* The weights of a loaded model (valid while the model lives). */
const gptoss_weights *gptoss_model_weights(const gptoss_model *model);

/* Gives the expert blocks and scales of a model whose loader left them in ggml's layout their
 * data (the Hugging Face layout, in buffers the model owns); the first call converts, later
 * ones return at once, and a model without ggml experts has nothing to do. Safe to call from
 * several threads. */
gptoss_status gptoss_model_unpack_experts(const gptoss_model *model, gptoss_error *error);

/* E2M1 code (0..15) to float, and E8M0 scale byte to 2^(s-127). */
extern const float gptoss_fp4_e2m1_values[16];

#endif
