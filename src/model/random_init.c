/*
 * random_init.c - deterministic random weights (see random_init.h for the distributions).
 */
#include "model/random_init.h"
#include "model/config.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_name(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then mixed */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return gptoss_init_mix(h);
}

/* round(log2(1 / (2.93 * sqrt(in)))) without libm: find k with 2^k closest to the target in
 * log space, comparing squares (2^(2k) vs 1 / (2.93^2 * in)). */
static int32_t scale_center_for(int64_t in) {
    double target_sq = 1.0 / (8.5849 * (double)in);
    int32_t best = 0;
    double best_err = 1e300;
    for (int32_t k = -40; k <= 10; k++) {
        double p = 1.0;
        if (k >= 0)
            for (int32_t i = 0; i < 2 * k; i++)
                p *= 2.0;
        else
            for (int32_t i = 0; i < -2 * k; i++)
                p *= 0.5;
        /* distance in log2 space between p and target_sq, compared via ratios */
        double ratio = p > target_sq ? p / target_sq : target_sq / p;
        if (ratio < best_err) {
            best_err = ratio;
            best = k;
        }
    }
    return 127 + best;
}

static float inv_sqrt(int64_t n) {
    /* Newton iterations for 1/sqrt(n) in double: exact enough and libm-free. */
    double x = 1.0, v = (double)n;
    while (x * x * v > 4.0)
        x *= 0.5;
    while (x * x * v < 0.25)
        x *= 2.0;
    for (int i = 0; i < 60; i++)
        x = x * (1.5 - 0.5 * v * x * x);
    return (float)x;
}

static void add(gptoss_init_tensor *list, size_t *n, const char *name, gptoss_dtype dtype,
                int32_t n_dims, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                gptoss_init_kind kind, float mean, float std, int32_t scale_center) {
    gptoss_init_tensor *t = &list[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->shape[3] = d3;
    t->kind = kind;
    t->mean = mean;
    t->std = std;
    t->scale_center = scale_center;
    t->stream = hash_name(name);
}

gptoss_status gptoss_init_tensors(const gptoss_config *c, gptoss_init_tensor **out, size_t *n_out,
                                  gptoss_error *error) {
    size_t cap = (size_t)gptoss_weights_expected_count(c);
    gptoss_init_tensor *list = calloc(cap, sizeof *list);
    if (!list) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = 0;
    int64_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts, V = c->vocab_size;
    int64_t q = gptoss_config_q_dim(c), kv = gptoss_config_kv_dim(c);
    const float bias_std = 0.02f, norm_std = 0.05f;
    add(list, &n, "model.embed_tokens.weight", GPTOSS_DTYPE_BF16, 2, V, H, 0, 0, GPTOSS_INIT_NORMAL,
        0, 1.0f, 0);
    for (int32_t l = 0; l < c->n_layers; l++) {
        char name[128];
#define T(suffix, dtype, nd, a, b, cc, d, kind, mean, std, center)                                 \
    do {                                                                                           \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                              \
        add(list, &n, name, dtype, nd, a, b, cc, d, kind, mean, std, center);                      \
    } while (0)
        T("input_layernorm.weight", GPTOSS_DTYPE_BF16, 1, H, 0, 0, 0, GPTOSS_INIT_NORMAL, 1.0f,
          norm_std, 0);
        T("self_attn.q_proj.weight", GPTOSS_DTYPE_BF16, 2, q, H, 0, 0, GPTOSS_INIT_NORMAL, 0,
          inv_sqrt(H), 0);
        T("self_attn.q_proj.bias", GPTOSS_DTYPE_BF16, 1, q, 0, 0, 0, GPTOSS_INIT_NORMAL, 0,
          bias_std, 0);
        T("self_attn.k_proj.weight", GPTOSS_DTYPE_BF16, 2, kv, H, 0, 0, GPTOSS_INIT_NORMAL, 0,
          inv_sqrt(H), 0);
        T("self_attn.k_proj.bias", GPTOSS_DTYPE_BF16, 1, kv, 0, 0, 0, GPTOSS_INIT_NORMAL, 0,
          bias_std, 0);
        T("self_attn.v_proj.weight", GPTOSS_DTYPE_BF16, 2, kv, H, 0, 0, GPTOSS_INIT_NORMAL, 0,
          inv_sqrt(H), 0);
        T("self_attn.v_proj.bias", GPTOSS_DTYPE_BF16, 1, kv, 0, 0, 0, GPTOSS_INIT_NORMAL, 0,
          bias_std, 0);
        T("self_attn.o_proj.weight", GPTOSS_DTYPE_BF16, 2, H, q, 0, 0, GPTOSS_INIT_NORMAL, 0,
          inv_sqrt(q), 0);
        T("self_attn.o_proj.bias", GPTOSS_DTYPE_BF16, 1, H, 0, 0, 0, GPTOSS_INIT_NORMAL, 0,
          bias_std, 0);
        T("self_attn.sinks", GPTOSS_DTYPE_BF16, 1, c->n_heads, 0, 0, 0, GPTOSS_INIT_NORMAL, 0, 1.0f,
          0);
        T("post_attention_layernorm.weight", GPTOSS_DTYPE_BF16, 1, H, 0, 0, 0, GPTOSS_INIT_NORMAL,
          1.0f, norm_std, 0);
        T("mlp.router.weight", GPTOSS_DTYPE_BF16, 2, E, H, 0, 0, GPTOSS_INIT_NORMAL, 0, inv_sqrt(H),
          0);
        T("mlp.router.bias", GPTOSS_DTYPE_BF16, 1, E, 0, 0, 0, GPTOSS_INIT_NORMAL, 0, bias_std, 0);
        T("mlp.experts.gate_up_proj_blocks", GPTOSS_DTYPE_U8, 4, E, 2 * I, H / 32, 16,
          GPTOSS_INIT_MXFP4_CODES, 0, 0, 0);
        T("mlp.experts.gate_up_proj_scales", GPTOSS_DTYPE_U8, 3, E, 2 * I, H / 32, 0,
          GPTOSS_INIT_MXFP4_SCALES, 0, 0, scale_center_for(H));
        T("mlp.experts.gate_up_proj_bias", GPTOSS_DTYPE_BF16, 2, E, 2 * I, 0, 0, GPTOSS_INIT_NORMAL,
          0, bias_std, 0);
        T("mlp.experts.down_proj_blocks", GPTOSS_DTYPE_U8, 4, E, H, I / 32, 16,
          GPTOSS_INIT_MXFP4_CODES, 0, 0, 0);
        T("mlp.experts.down_proj_scales", GPTOSS_DTYPE_U8, 3, E, H, I / 32, 0,
          GPTOSS_INIT_MXFP4_SCALES, 0, 0, scale_center_for(I));
        T("mlp.experts.down_proj_bias", GPTOSS_DTYPE_BF16, 2, E, H, 0, 0, GPTOSS_INIT_NORMAL, 0,
          bias_std, 0);
#undef T
    }
    add(list, &n, "model.norm.weight", GPTOSS_DTYPE_BF16, 1, H, 0, 0, 0, GPTOSS_INIT_NORMAL, 1.0f,
        norm_std, 0);
    add(list, &n, "lm_head.weight", GPTOSS_DTYPE_BF16, 2, V, H, 0, 0, GPTOSS_INIT_NORMAL, 0,
        inv_sqrt(H), 0);
    *out = list;
    *n_out = n;
    return GPTOSS_OK;
}

uint64_t gptoss_init_tensor_bytes(const gptoss_init_tensor *t) {
    uint64_t n = gptoss_dtype_size(t->dtype);
    for (int32_t d = 0; d < t->n_dims; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* Element i of the tensor's stream as four 16-bit uniforms -> one approximate normal. */
static float normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
    uint64_t h = gptoss_init_mix(seed ^ gptoss_init_mix(stream + i));
    float u = (float)(h & 0xffff) + (float)((h >> 16) & 0xffff) + (float)((h >> 32) & 0xffff) +
              (float)(h >> 48);
    /* sum of four U[0,65536) has mean 131070 and std 65536/sqrt(3); standardize exactly */
    return (u - 131070.0f) * (1.7320508f / 65536.0f);
}

void gptoss_init_fill(const gptoss_init_tensor *t, uint64_t seed, uint64_t offset, uint8_t *out,
                      size_t len) {
    switch (t->kind) {
    case GPTOSS_INIT_NORMAL:
        for (size_t b = 0; b + 1 < len; b += 2) {
            uint64_t i = (offset + b) / 2;
            float v = t->mean + t->std * normal_at(seed, t->stream, i);
            uint16_t h = gptoss_f32_to_bf16(v);
            out[b] = (uint8_t)(h & 0xff);
            out[b + 1] = (uint8_t)(h >> 8);
        }
        break;
    case GPTOSS_INIT_MXFP4_CODES:
        for (size_t b = 0; b < len;) {
            uint64_t word = (offset + b) / 8;
            uint64_t h = gptoss_init_mix(seed ^ gptoss_init_mix(t->stream + word));
            size_t start = (size_t)((offset + b) % 8);
            for (size_t k = start; k < 8 && b < len; k++, b++)
                out[b] = (uint8_t)(h >> (8 * k));
        }
        break;
    case GPTOSS_INIT_MXFP4_SCALES:
        for (size_t b = 0; b < len; b++) {
            uint64_t h = gptoss_init_mix(seed ^ gptoss_init_mix(t->stream + offset + b));
            int32_t s = t->scale_center + (int32_t)(h % 3) - 1;
            out[b] = (uint8_t)(s < 1 ? 1 : s > 254 ? 254 : s);
        }
        break;
    }
}
