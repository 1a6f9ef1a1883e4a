/*
 * cpu_backend.c - the reference gpt-oss forward pass on the CPU (spec section 2).
 *
 * Plain C11 with fp32 activations and fp32 accumulation everywhere (unless a test asks for
 * the CUDA backend's bf16 activation rounding, see round_bf16); bf16 weights are widened
 * on the fly and MXFP4 expert rows are dequantized on the fly (never materialized). It is the
 * reference every other backend is tested against, so it is written to be read top to bottom
 * (cpu_forward) and is batch-invariant: a token's result does not depend on what else is in
 * the plan, because every reduction runs in a fixed order per token. OpenMP parallelizes
 * over output rows, heads and experts, never inside a reduction.
 *
 * KV cache: the pools are fp32 whatever kv_cache_dtype says. With GPTOSS_KV_CACHE_FP8 every K
 * and V head vector makes the round trip an FP8 page imposes (kv_fp8.h: e4m3 codes with the
 * vector's absmax / 448 as scale, decoded times the scale) before it is stored, so attention
 * reads exactly the values the CUDA backend's FP8 pages hold; only the bytes are not saved.
 *
 * Owns: the KV pools (fp32) and grow-only scratch buffers. Reads weights it does not own.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/kv_fp8.h"
#include "model/config.h"
#include "util/error.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-layer small tensors widened to fp32 once at creation. */
typedef struct cpu_layer {
    float *attn_norm;    /* [H] */
    float *q_bias;       /* [NH*D] */
    float *k_bias;       /* [NKV*D] */
    float *v_bias;       /* [NKV*D] */
    float *o_bias;       /* [H] */
    float *sinks;        /* [NH] */
    float *mlp_norm;     /* [H] */
    float *router_bias;  /* [E] */
    float *gate_up_bias; /* [E, 2I] interleaved gate, up */
    float *down_bias;    /* [E, H] */
    int32_t group_slot;  /* index of this layer within its KV pool (full or sliding) */
} cpu_layer;

/* Scratch for one forward, sized for n_tokens (grow-only). */
typedef struct cpu_scratch {
    int32_t capacity;  /* tokens the buffers hold */
    float *x;          /* [n, H] residual stream */
    float *t;          /* [n, H] normalized input of the current block */
    float *q;          /* [n, NH*D] */
    float *k;          /* [n, NKV*D] */
    float *v;          /* [n, NKV*D] */
    float *attn;       /* [n, NH*D] attention output, heads concatenated */
    float *proj;       /* [n, H] o_proj output */
    float *router;     /* [n, E] router logits */
    int32_t *expert;   /* [n, K] selected experts, best first */
    float *weight;     /* [n, K] softmax over the selected logits */
    float *expert_out; /* [n, K, H] each selected expert's output (bias included) */
    float *act;        /* [n, K, I] SwiGLU outputs */
    int32_t *seq_of;   /* [n] sequence of each token */
} cpu_scratch;

typedef struct cpu_state {
    const gptoss_config *config;
    const gptoss_weights *weights;
    cpu_layer *layers;      /* [n_layers] */
    float *final_norm;      /* [H] */
    float *inv_freq;        /* [D/2] YaRN inverse frequencies */
    float concentration;    /* YaRN attention scaling on cos and sin */
    float mxfp4_scale[256]; /* 2^(s-127) for every E8M0 byte (255 = NaN) */
    bool layer_stats;       /* print residual statistics per layer (diagnostics) */
    bool emulate_bf16;      /* round activations to bf16 where the CUDA backend does (tests) */
    bool kv_fp8;            /* K and V go through e4m3 + scale before they are stored */
    int32_t block_size;     /* tokens per KV page */
    int32_t n_threads;      /* OpenMP threads per forward, 0 = the runtime's default */
    int32_t n_full_layers, n_sliding_layers;
    int32_t n_blocks, n_sliding_blocks;
    float *full_k, *full_v;       /* [n_blocks, n_full_layers, block_size, NKV*D] */
    float *sliding_k, *sliding_v; /* [n_sliding_blocks, n_sliding_layers, block_size, NKV*D] */
    cpu_scratch s;
    /* EAGLE3 drafting: the layer boundaries whose residual stream each forward keeps (none
     * until capture_hidden asks), and the last forward's rows [n, n_capture * H]. */
    int32_t n_capture;
    int32_t capture[8];
    float *captured;
    size_t captured_cap; /* floats */
    int32_t captured_rows;
} cpu_state;

/* ---- small helpers ----------------------------------------------------------------------- */

static inline float bf16_at(const uint8_t *p, size_t i) {
    return gptoss_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

/*
 * bf16 emulation (opt-in, for comparing against the CUDA backend). The CUDA backend keeps the
 * residual stream, router input, q, scores and every accumulation in fp32 and stores these
 * activations as bf16 (round to nearest even), and only these:
 *   1. the attention-norm output (QKV GEMM input),
 *   2. K after bias + RoPE and V after bias, as written to the KV pages (with an FP8 cache
 *      they are quantized from fp32 instead, never rounded to bf16 first),
 *   3. the attention output (O GEMM input),
 *   4. the MLP-norm output as the experts' input (the router reads it unrounded),
 *   5. the clamped SwiGLU output (down-projection input),
 *   6. the final-norm output (lm_head input).
 * round_bf16 applies the same rounding at the same six points when emulate_bf16 is set; the
 * default path never calls it, so it stays fp32 and bit-identical.
 */
static void round_bf16(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        if ((u & 0x7f800000u) == 0x7f800000u) { /* inf / NaN: keep (quiet NaN stays NaN) */
            if (u & 0x007fffffu) u |= 0x00400000u;
        } else {
            u += 0x7fffu + ((u >> 16) & 1u); /* nearest, ties to even */
        }
        u &= 0xffff0000u;
        memcpy(&v[i], &u, 4);
    }
}

/* Half-split YaRN rotation of one head vector at position pos (spec 2.4). The angle is a
 * float product, as the references compute it. */
static void rope(float *v, int32_t head_dim, int32_t pos, const float *inv_freq,
                 float concentration) {
    int32_t half = head_dim / 2;
    for (int32_t j = 0; j < half; j++) {
        float angle = (float)pos * inv_freq[j];
        float c = cosf(angle) * concentration, s = sinf(angle) * concentration;
        float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

/* Row r of expert e's MXFP4 matrix, dequantized: blocks [rows, cols/32, 16], scales [rows,
 * cols/32]. */
static void dequant_mxfp4_row(float *out, const uint8_t *blocks, const uint8_t *scales,
                              int32_t cols, const float *scale_table) {
    int32_t groups = cols / 32;
    for (int32_t g = 0; g < groups; g++) {
        float scale = scale_table[scales[g]];
        const uint8_t *b = blocks + (size_t)g * 16;
        for (int32_t i = 0; i < 16; i++) {
            out[32 * g + 2 * i] =
                gptoss_fp4_e2m1_values[b[i] & 0x0f] * scale; /* low nibble: even lane */
            out[32 * g + 2 * i + 1] =
                gptoss_fp4_e2m1_values[b[i] >> 4] * scale; /* high nibble: odd lane */
        }
    }
}

/* The same from ggml's layout (a GGUF file's experts, gptoss_ggml_experts): 17-byte blocks, the
 * scale byte then qs[j] = lane j | lane j+16 << 4. Same codes and scales, so the same values. */
static void dequant_mxfp4_row_ggml(float *out, const uint8_t *row, int32_t cols,
                                   const float *scale_table) {
    int32_t groups = cols / 32;
    for (int32_t g = 0; g < groups; g++) {
        const uint8_t *b = row + (size_t)g * 17;
        float scale = scale_table[b[0]];
        for (int32_t i = 0; i < 16; i++) {
            out[32 * g + i] = gptoss_fp4_e2m1_values[b[1 + i] & 0x0f] * scale;
            out[32 * g + 16 + i] = gptoss_fp4_e2m1_values[b[1 + i] >> 4] * scale;
        }
    }
}

/* ---- KV pages ------------------------------------------------------------------------------ */

/* Address of the K (or V) vector of `pos` for layer slot `slot` in a pool. */
static inline float *kv_slot(float *pool, int32_t n_group_layers, int32_t block_size,
                             int32_t kv_dim, const int32_t *block_row, int32_t slot, int32_t pos) {
    int32_t block = block_row[pos / block_size];
    size_t index =
        (((size_t)block * n_group_layers + slot) * block_size + (size_t)(pos % block_size)) *
        kv_dim;
    return pool + index;
}

/* ---- creation ------------------------------------------------------------------------------ */

static void cpu_destroy(void *opaque) {
    cpu_state *st = opaque;
    if (!st) return;
    if (st->layers)
        for (int32_t l = 0; l < st->config->n_layers; l++) {
            cpu_layer *L = &st->layers[l];
            free(L->attn_norm), free(L->q_bias), free(L->k_bias), free(L->v_bias), free(L->o_bias);
            free(L->sinks), free(L->mlp_norm), free(L->router_bias), free(L->gate_up_bias),
                free(L->down_bias);
        }
    free(st->layers);
    free(st->final_norm);
    free(st->inv_freq);
    free(st->full_k), free(st->full_v), free(st->sliding_k), free(st->sliding_v);
    free(st->captured);
    cpu_scratch *s = &st->s;
    free(s->x), free(s->t), free(s->q), free(s->k), free(s->v), free(s->attn), free(s->proj);
    free(s->router), free(s->expert), free(s->weight), free(s->expert_out), free(s->act),
        free(s->seq_of);
    free(st);
}

static gptoss_status cpu_create(const gptoss_model *model, gptoss_backend_options *o, void **out,
                                gptoss_error *error) {
    cpu_state *st = calloc(1, sizeof *st);
    if (!st) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    const gptoss_config *c = gptoss_model_config(model);
    st->config = c;
    st->weights = gptoss_model_weights(model);
    st->block_size = o->kv_block_size;
    st->layer_stats = o->testing.layer_stats;
    st->emulate_bf16 = o->testing.emulate_bf16_activations;
    st->kv_fp8 = o->kv_cache_dtype == GPTOSS_KV_CACHE_FP8;
    st->n_blocks = o->n_kv_blocks;
    st->n_sliding_blocks = o->n_sliding_kv_blocks;
    st->n_threads = o->n_threads;
    if (o->n_threads > 0) omp_set_num_threads(o->n_threads);
    for (int s = 0; s < 256; s++)
        st->mxfp4_scale[s] = s == 255 ? NAN : ldexpf(1.0f, s - 127);

    st->layers = calloc((size_t)c->n_layers, sizeof *st->layers);
    st->inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof *st->inv_freq);
    st->final_norm = gptoss_tensor_to_f32(&st->weights->final_norm);
    bool ok = st->layers && st->inv_freq && st->final_norm;
    for (int32_t l = 0; ok && l < c->n_layers; l++) {
        const gptoss_layer_weights *w = &st->weights->layers[l];
        cpu_layer *L = &st->layers[l];
        L->attn_norm = gptoss_tensor_to_f32(&w->attn_norm);
        L->q_bias = gptoss_tensor_to_f32(&w->q_bias);
        L->k_bias = gptoss_tensor_to_f32(&w->k_bias);
        L->v_bias = gptoss_tensor_to_f32(&w->v_bias);
        L->o_bias = gptoss_tensor_to_f32(&w->o_bias);
        L->sinks = gptoss_tensor_to_f32(&w->sinks);
        L->mlp_norm = gptoss_tensor_to_f32(&w->mlp_norm);
        L->router_bias = gptoss_tensor_to_f32(&w->router_bias);
        L->gate_up_bias = gptoss_tensor_to_f32(&w->gate_up_bias);
        L->down_bias = gptoss_tensor_to_f32(&w->down_bias);
        ok = L->attn_norm && L->q_bias && L->k_bias && L->v_bias && L->o_bias && L->sinks &&
             L->mlp_norm && L->router_bias && L->gate_up_bias && L->down_bias;
        L->group_slot = c->layer_is_sliding[l] ? st->n_sliding_layers++ : st->n_full_layers++;
    }
    if (ok) {
        gptoss_rope_yarn_inv_freq(c, st->inv_freq, &st->concentration);
        size_t kv_dim = (size_t)gptoss_config_kv_dim(c);
        size_t full = (size_t)st->n_blocks * st->n_full_layers * st->block_size * kv_dim;
        size_t sliding =
            (size_t)st->n_sliding_blocks * st->n_sliding_layers * st->block_size * kv_dim;
        /* calloc: pages never written read as zeros, so a bug reads zeros, not garbage. */
        st->full_k = calloc(full ? full : 1, sizeof(float));
        st->full_v = calloc(full ? full : 1, sizeof(float));
        st->sliding_k = calloc(sliding ? sliding : 1, sizeof(float));
        st->sliding_v = calloc(sliding ? sliding : 1, sizeof(float));
        ok = st->full_k && st->full_v && st->sliding_k && st->sliding_v;
    }
    if (!ok) {
        cpu_destroy(st);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "cpu backend: out of memory (KV cache of %d + %d blocks)",
                                o->n_kv_blocks, o->n_sliding_kv_blocks);
    }
    *out = st;
    return GPTOSS_OK;
}

static bool grow_scratch(cpu_state *st, int32_t n) {
    cpu_scratch *s = &st->s;
    if (n <= s->capacity) return true;
    const gptoss_config *c = st->config;
    size_t H = (size_t)c->hidden_size, q = (size_t)gptoss_config_q_dim(c),
           kv = (size_t)gptoss_config_kv_dim(c);
    size_t K = (size_t)c->n_experts_per_token, E = (size_t)c->n_experts,
           I = (size_t)c->intermediate_size;
    size_t N = (size_t)n;
#define GROW(field, count)                                                                         \
    do {                                                                                           \
        void *p = realloc(s->field, (count) * sizeof *s->field);                                   \
        if (!p) return false;                                                                      \
        s->field = p;                                                                              \
    } while (0)
    GROW(x, N * H);
    GROW(t, N * H);
    GROW(q, N * q);
    GROW(k, N * kv);
    GROW(v, N * kv);
    GROW(attn, N * q);
    GROW(proj, N * H);
    GROW(router, N * E);
    GROW(expert, N * K);
    GROW(weight, N * K);
    GROW(expert_out, N * K * H);
    GROW(act, N * K * I);
    GROW(seq_of, N);
#undef GROW
    s->capacity = n;
    return true;
}

/* ---- the blocks of a layer ------------------------------------------------------------------ */

/* Attention for every new token and head over the paged KV (spec 2.5, 2.6). */
static void attention(cpu_state *st, int32_t l, const gptoss_batch_plan *p) {
    const gptoss_config *c = st->config;
    const cpu_layer *L = &st->layers[l];
    bool sliding = c->layer_is_sliding[l];
    int32_t D = c->head_dim, kv_dim = (int32_t)gptoss_config_kv_dim(c),
            q_dim = (int32_t)gptoss_config_q_dim(c);
    int32_t group = c->n_heads / c->n_kv_heads,
            n_group_layers = sliding ? st->n_sliding_layers : st->n_full_layers;
    float *pool_k = sliding ? st->sliding_k : st->full_k,
          *pool_v = sliding ? st->sliding_v : st->full_v;
    const int32_t *tables =
        sliding && p->sliding_block_tables ? p->sliding_block_tables : p->block_tables;
    const float scale = 1.0f / sqrtf((float)D);

#pragma omp parallel for collapse(2) schedule(dynamic, 4)
    for (int32_t t = 0; t < p->n_tokens; t++) {
        for (int32_t h = 0; h < c->n_heads; h++) {
            int32_t s = st->s.seq_of[t], pos = p->positions[t], g = h / group;
            const int32_t *row = tables + (size_t)s * p->max_blocks_per_seq;
            int32_t first = sliding ? pos - c->sliding_window + 1 : 0;
            if (first < 0) first = 0;
            const float *q = st->s.q + (size_t)t * q_dim + (size_t)h * D;
            /* Online softmax seeded with the sink logit: m starts at S_h, the sum at 0, and the
             * sink's exp(S_h - m) joins the denominator at the end (it has no value vector). */
            float sink = L->sinks[h], m = sink, sum = 0.0f;
            float acc[1024];
            for (int32_t d = 0; d < D; d++)
                acc[d] = 0.0f;
            for (int32_t j = first; j <= pos; j++) {
                const float *k =
                    kv_slot(pool_k, n_group_layers, st->block_size, kv_dim, row, L->group_slot, j) +
                    g * D;
                const float *v =
                    kv_slot(pool_v, n_group_layers, st->block_size, kv_dim, row, L->group_slot, j) +
                    g * D;
                float score = gptoss_cpu_dot(q, k, D) * scale;
                if (score > m) {
                    float rescale = expf(m - score);
                    sum *= rescale;
                    for (int32_t d = 0; d < D; d++)
                        acc[d] *= rescale;
                    m = score;
                }
                float w = expf(score - m);
                sum += w;
                for (int32_t d = 0; d < D; d++)
                    acc[d] += w * v[d];
            }
            sum += expf(sink - m);
            float *out = st->s.attn + (size_t)t * q_dim + (size_t)h * D;
            for (int32_t d = 0; d < D; d++)
                out[d] = acc[d] / sum;
        }
    }
}

/* Router, top-k, softmax over the k, clamped SwiGLU experts, weighted sum (spec 2.7-2.9).
 * Adds the MoE output to the residual stream x. */
static void moe(cpu_state *st, int32_t l, int32_t n) {
    const gptoss_config *c = st->config;
    const gptoss_layer_weights *w = &st->weights->layers[l];
    const cpu_layer *L = &st->layers[l];
    int32_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts,
            K = c->n_experts_per_token;
    cpu_scratch *s = &st->s;

    gptoss_cpu_matmul_bf16(s->router, s->t, n, &w->router_weight, L->router_bias);
    if (st->emulate_bf16) round_bf16(s->t, (size_t)n * H); /* point 4: after the router read it */
    for (int32_t t = 0; t < n; t++) {
        const float *r = s->router + (size_t)t * E;
        int32_t *sel = s->expert + (size_t)t * K;
        float *wt = s->weight + (size_t)t * K;
        /* Top-k by value, ties to the lower expert index; sorted best first. */
        for (int32_t k = 0; k < K; k++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                bool taken = false;
                for (int32_t j = 0; j < k; j++)
                    taken |= sel[j] == e;
                if (!taken && (best < 0 || r[e] > r[best])) best = e;
            }
            sel[k] = best;
        }
        float top = r[sel[0]], total = 0.0f;
        for (int32_t k = 0; k < K; k++)
            total += (wt[k] = expf(r[sel[k]] - top));
        for (int32_t k = 0; k < K; k++)
            wt[k] /= total;
    }

    const float limit = (float)c->swiglu_limit, alpha = (float)c->swiglu_alpha;
    size_t gu_row_bytes = (size_t)H / 32 * 16, gu_scale_row = (size_t)H / 32;
    size_t dn_row_bytes = (size_t)I / 32 * 16, dn_scale_row = (size_t)I / 32;
    const uint8_t *gu_blocks = w->gate_up_blocks.data, *gu_scales = w->gate_up_scales.data;
    const uint8_t *dn_blocks = w->down_blocks.data, *dn_scales = w->down_scales.data;
    /* A GGUF model's experts are read where the file holds them (no converted copy). */
    const gptoss_ggml_experts *gg =
        st->weights->ggml_experts ? &st->weights->ggml_experts[l] : NULL;
    size_t gg_gu_row = (size_t)H / 32 * 17, gg_dn_row = (size_t)I / 32 * 17;
    int32_t max_width = H > I ? H : I;

    /* Each expert's weights are visited once for all tokens routed to it: row by row,
     * dequantized into a thread-local buffer, dotted with each routed token's input. */
#pragma omp parallel
    {
        float *row = malloc((size_t)max_width * sizeof *row);
        float *gate_up = malloc((size_t)n * 2 * sizeof *gate_up);
        for (int32_t e = 0; e < E; e++) {
            /* Experts no token chose are skipped by every thread alike (same data, same test),
             * so the worksharing loops below stay matched. */
            bool used = false;
            for (int32_t j = 0; j < n * K && !used; j++)
                used = s->expert[j] == e;
            if (!used) continue;
                /* gate_up rows come in pairs (2i gate, 2i+1 up): one unit i per iteration. */
#pragma omp for schedule(static)
            for (int32_t i = 0; i < I; i++) {
                for (int32_t half = 0; half < 2; half++) {
                    size_t r = (size_t)e * 2 * I + 2 * (size_t)i + half;
                    if (gg)
                        dequant_mxfp4_row_ggml(row,
                                               (half ? gg->up : gg->gate) +
                                                   ((size_t)e * I + (size_t)i) * gg_gu_row,
                                               H, st->mxfp4_scale);
                    else
                        dequant_mxfp4_row(row, gu_blocks + r * gu_row_bytes,
                                          gu_scales + r * gu_scale_row, H, st->mxfp4_scale);
                    for (int32_t t = 0; t < n; t++)
                        for (int32_t k = 0; k < K; k++)
                            if (s->expert[(size_t)t * K + k] == e)
                                gate_up[2 * t + half] =
                                    gptoss_cpu_dot(s->t + (size_t)t * H, row, H) +
                                    L->gate_up_bias[r];
                }
                for (int32_t t = 0; t < n; t++)
                    for (int32_t k = 0; k < K; k++) {
                        if (s->expert[(size_t)t * K + k] != e) continue;
                        float g = gate_up[2 * t], u = gate_up[2 * t + 1];
                        g = g < limit ? g : limit; /* gate: upper clamp only */
                        u = u < -limit ? -limit : u > limit ? limit : u; /* up: both sides */
                        float glu = g / (1.0f + expf(-alpha * g));
                        float a = glu * (u + 1.0f);
                        if (st->emulate_bf16) round_bf16(&a, 1); /* point 5 */
                        s->act[((size_t)t * K + k) * I + i] = a;
                    }
            }
            /* (implicit barrier) down projection: output row h of expert e. */
#pragma omp for schedule(static)
            for (int32_t h = 0; h < H; h++) {
                size_t r = (size_t)e * H + h;
                if (gg)
                    dequant_mxfp4_row_ggml(row, gg->down + r * gg_dn_row, I, st->mxfp4_scale);
                else
                    dequant_mxfp4_row(row, dn_blocks + r * dn_row_bytes,
                                      dn_scales + r * dn_scale_row, I, st->mxfp4_scale);
                for (int32_t t = 0; t < n; t++)
                    for (int32_t k = 0; k < K; k++)
                        if (s->expert[(size_t)t * K + k] == e)
                            s->expert_out[((size_t)t * K + k) * H + h] =
                                gptoss_cpu_dot(s->act + ((size_t)t * K + k) * I, row, I) +
                                L->down_bias[r];
            }
        }
        free(gate_up);
        free(row);
    }
    /* Weighted sum in rank order, then the residual add. */
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < H; h++) {
            float sum = 0.0f;
            for (int32_t k = 0; k < K; k++)
                sum += s->weight[(size_t)t * K + k] * s->expert_out[((size_t)t * K + k) * H + h];
            s->x[(size_t)t * H + h] += sum;
        }
}

/* ---- hidden states for a draft head ------------------------------------------------------- */

/* Copies the residual stream of every token into the capture slots that name boundary b. */
static void capture_boundary(cpu_state *st, int32_t b, int32_t n) {
    const int32_t H = st->config->hidden_size, width = st->n_capture * H;
    for (int32_t i = 0; i < st->n_capture; i++) {
        if (st->capture[i] != b) continue;
        for (int32_t t = 0; t < n; t++)
            memcpy(st->captured + (size_t)t * width + (size_t)i * H, st->s.x + (size_t)t * H,
                   (size_t)H * sizeof(float));
    }
}

static gptoss_status cpu_capture_hidden(void *opaque, const int32_t *boundaries, int32_t n,
                                        gptoss_error *error) {
    cpu_state *st = opaque;
    if (n < 0 || n > (int32_t)(sizeof st->capture / sizeof st->capture[0]))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "cpu backend: %d hidden-state boundaries (at most 8)", n);
    if (n > 0) memcpy(st->capture, boundaries, (size_t)n * sizeof *boundaries); /* NULL when 0 */
    st->n_capture = n;
    st->captured_rows = 0;
    return GPTOSS_OK;
}

static const float *cpu_captured_hidden(void *opaque, int32_t *n_tokens) {
    cpu_state *st = opaque;
    *n_tokens = st->captured_rows;
    return st->captured_rows > 0 ? st->captured : NULL;
}

static gptoss_status cpu_embed_tokens(void *opaque, const int32_t *tokens, int32_t n, float *out,
                                      gptoss_error *error) {
    (void)error;
    cpu_state *st = opaque;
    const int32_t H = st->config->hidden_size;
    const uint8_t *emb = st->weights->embedding.data;
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < H; h++)
            out[(size_t)t * H + h] = bf16_at(emb, (size_t)tokens[t] * H + h);
    return GPTOSS_OK;
}

/* ---- the forward pass ------------------------------------------------------------------------ */

static gptoss_status cpu_forward(void *opaque, const gptoss_batch_plan *p, float *logits,
                                 gptoss_error *error) {
    cpu_state *st = opaque;
    /* The thread count is a property of the calling thread in OpenMP, and forwards run on the
     * engine's thread (one per engine when several share the machine), not the creator's. */
    if (st->n_threads > 0) omp_set_num_threads(st->n_threads);
    const gptoss_config *c = st->config;
    const gptoss_weights *w = st->weights;
    int32_t n = p->n_tokens, H = c->hidden_size, D = c->head_dim;
    int32_t q_dim = (int32_t)gptoss_config_q_dim(c), kv_dim = (int32_t)gptoss_config_kv_dim(c);
    if (c->head_dim > 1024)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED, "cpu backend: head_dim %d > 1024",
                                c->head_dim);
    if (!grow_scratch(st, n))
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    cpu_scratch *s = &st->s;
    for (int32_t q = 0; q < p->n_seqs; q++)
        for (int32_t t = p->seq_token_start[q]; t < p->seq_token_start[q + 1]; t++)
            s->seq_of[t] = q;

    /* x = Emb[token] */
    const uint8_t *emb = w->embedding.data;
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < H; h++)
            s->x[(size_t)t * H + h] = bf16_at(emb, (size_t)p->token_ids[t] * H + h);

    st->captured_rows = 0;
    if (st->n_capture > 0) {
        size_t need = (size_t)n * st->n_capture * H;
        if (need > st->captured_cap) {
            float *grown = realloc(st->captured, need * sizeof *grown);
            if (!grown)
                return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                        "cpu backend: out of memory (hidden states)");
            st->captured = grown;
            st->captured_cap = need;
        }
        st->captured_rows = n;
    }

    for (int32_t l = 0; l <= c->n_layers; l++) {
        capture_boundary(st, l, n);
        if (l == c->n_layers) break;
        const gptoss_layer_weights *lw = &w->layers[l];
        const cpu_layer *L = &st->layers[l];

        /* Attention block: norm, QKV with biases, RoPE on q and k, K/V into the pages, attend,
         * o_proj with bias, residual add. */
        for (int32_t t = 0; t < n; t++)
            gptoss_cpu_rmsnorm(s->t + (size_t)t * H, s->x + (size_t)t * H, L->attn_norm, H,
                               c->rms_norm_eps);
        if (st->emulate_bf16) round_bf16(s->t, (size_t)n * H); /* point 1 */
        gptoss_cpu_matmul_bf16(s->q, s->t, n, &lw->q_weight, L->q_bias);
        gptoss_cpu_matmul_bf16(s->k, s->t, n, &lw->k_weight, L->k_bias);
        gptoss_cpu_matmul_bf16(s->v, s->t, n, &lw->v_weight, L->v_bias);
        bool sliding = c->layer_is_sliding[l];
        float *pool_k = sliding ? st->sliding_k : st->full_k,
              *pool_v = sliding ? st->sliding_v : st->full_v;
        int32_t n_group_layers = sliding ? st->n_sliding_layers : st->n_full_layers;
        const int32_t *tables =
            sliding && p->sliding_block_tables ? p->sliding_block_tables : p->block_tables;
        for (int32_t t = 0; t < n; t++) {
            int32_t pos = p->positions[t];
            for (int32_t h = 0; h < c->n_heads; h++)
                rope(s->q + (size_t)t * q_dim + (size_t)h * D, D, pos, st->inv_freq,
                     st->concentration);
            for (int32_t g = 0; g < c->n_kv_heads; g++)
                rope(s->k + (size_t)t * kv_dim + (size_t)g * D, D, pos, st->inv_freq,
                     st->concentration);
            const int32_t *row = tables + (size_t)s->seq_of[t] * p->max_blocks_per_seq;
            if (st->kv_fp8) { /* what an FP8 page gives back, one vector per KV head */
                for (int32_t g = 0; g < c->n_kv_heads; g++) {
                    gptoss_kv_fp8_round_trip(s->k + (size_t)t * kv_dim + (size_t)g * D, D, NULL);
                    gptoss_kv_fp8_round_trip(s->v + (size_t)t * kv_dim + (size_t)g * D, D, NULL);
                }
            } else if (st->emulate_bf16) { /* point 2 */
                round_bf16(s->k + (size_t)t * kv_dim, (size_t)kv_dim);
                round_bf16(s->v + (size_t)t * kv_dim, (size_t)kv_dim);
            }
            memcpy(kv_slot(pool_k, n_group_layers, st->block_size, kv_dim, row, L->group_slot, pos),
                   s->k + (size_t)t * kv_dim, (size_t)kv_dim * sizeof(float));
            memcpy(kv_slot(pool_v, n_group_layers, st->block_size, kv_dim, row, L->group_slot, pos),
                   s->v + (size_t)t * kv_dim, (size_t)kv_dim * sizeof(float));
        }
        attention(st, l, p);
        if (st->emulate_bf16) round_bf16(s->attn, (size_t)n * q_dim); /* point 3 */
        gptoss_cpu_matmul_bf16(s->proj, s->attn, n, &lw->o_weight, L->o_bias);
        for (size_t i = 0; i < (size_t)n * H; i++)
            s->x[i] += s->proj[i];

        /* MoE block: norm, router, experts, weighted sum, residual add. */
        for (int32_t t = 0; t < n; t++)
            gptoss_cpu_rmsnorm(s->t + (size_t)t * H, s->x + (size_t)t * H, L->mlp_norm, H,
                               c->rms_norm_eps);
        moe(st, l, n);
        if (st->layer_stats) {
            /* Residual stream of the step's last token: finite, and neither vanishing nor
             * exploding. */
            const float *x = s->x + (size_t)(n - 1) * H;
            double sq = 0, max_abs = 0;
            for (int32_t h = 0; h < H; h++)
                sq += (double)x[h] * x[h], max_abs = fmax(max_abs, fabs(x[h]));
            fprintf(stderr, "layer %3d%s: residual rms %.4g, max |x| %.4g\n", l,
                    c->layer_is_sliding[l] ? " (sliding)" : "", sqrt(sq / H), max_abs);
        }
    }

    /* logits = RMSNorm(x, final) . lm_head^T for the tokens that need them. */
    for (int32_t i = 0; i < p->n_logits; i++) {
        int32_t t = p->logit_token_index[i];
        gptoss_cpu_rmsnorm(s->t + (size_t)i * H, s->x + (size_t)t * H, st->final_norm, H,
                           c->rms_norm_eps);
    }
    if (st->emulate_bf16) round_bf16(s->t, (size_t)p->n_logits * H); /* point 6 */
    if (p->n_logits > 0) gptoss_cpu_matmul_bf16(logits, s->t, p->n_logits, &w->lm_head, NULL);
    return GPTOSS_OK;
}

const gptoss_backend_ops gptoss_cpu_backend_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .converts_ggml_experts = true, /* moe() reads them in place */
};

const gptoss_backend_draft_ops gptoss_cpu_backend_draft_ops = {
    .capture_hidden = cpu_capture_hidden,
    .captured_hidden = cpu_captured_hidden,
    .embed_tokens = cpu_embed_tokens,
};
