/*
 * weights.cu - the model's weights on the device: allocation (bf16, or e4m3 with row scales
 * for the FP8 dense layers), upload from a loaded model (FP8 matrices quantized on the way
 * through a bf16 scratch), random weights for the bench, and what is derived once they are
 * in place. Owns the weight buffers of a state and the FP8 layers' scratch (freed by
 * gptoss_cuda_weights_free).
 */
#include "backend/cuda/cuda_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "model/config.h"
#include "util/log.h"
}

static size_t dense_bytes(size_t n, size_t k, bool fp8) {
    return fp8 ? gptoss_cuda_e4m3_bytes(n, k) : n * k * 2;
}

static size_t layer_weight_bytes(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts;
    size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim,
           q = (size_t)c->n_heads * c->head_dim;
    size_t b = 0;
    b += 2 * H * 4 + dense_bytes(qkv, H, fp8_layers & GPTOSS_FP8_QKV) + qkv * 4 +
         dense_bytes(H, q, fp8_layers & GPTOSS_FP8_O) + H * 4 + c->n_heads * 4 + E * H * (2 + 4) +
         E * 4;
    b += E * 2 * I * (H / 32) * 17 + E * 2 * I * 4 + E * H * (I / 32) * 17 + E * H * 4;
    return b + 16 * 256; /* alignment slack */
}

/* A dense [n, k] matrix in the form fp8 asks for (see gptoss_cuda_dense_weight), counted as
 * weights. */
static gptoss_status dense_alloc(gptoss_cuda_state *s, gptoss_cuda_dense_weight *w, size_t n,
                                 size_t k, bool fp8, const char *what, gptoss_error *error) {
    memset(w, 0, sizeof *w);
    if (fp8 && k % 16)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA: %s cannot be held in FP8: rows of %zu weights (a multiple of 16 is needed)",
            what, k);
    size_t bytes = dense_bytes(n, k, fp8);
    gptoss_status st =
        gptoss_cuda_alloc(fp8 ? (void **)&w->w_e4m3 : (void **)&w->w_bf16, bytes, what, error);
    if (st) return st;
    if (fp8) w->row_scale = (float *)(w->w_e4m3 + gptoss_cuda_e4m3_scale_offset(n, k));
    s->weight_bytes += bytes;
    return GPTOSS_OK;
}

static void dense_free(gptoss_cuda_dense_weight *w) {
    cudaFree(w->w_bf16);
    cudaFree(w->w_e4m3);
}

/* bf16 elements of the FP8 layers' scratch: a whole QKV or O matrix (staged there at load
 * time, decoded there for prefill GEMMs), and lm_head in blocks of up to 4096 rows. */
static size_t dense_scratch_elems(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, V = c->vocab_size, q = (size_t)c->n_heads * c->head_dim;
    size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim, e = 0;
    if ((fp8_layers & GPTOSS_FP8_QKV) && qkv * H > e) e = qkv * H;
    if ((fp8_layers & GPTOSS_FP8_O) && H * q > e) e = H * q;
    if ((fp8_layers & GPTOSS_FP8_LM_HEAD) && (V < 4096 ? V : 4096) * H > e)
        e = (V < 4096 ? V : 4096) * H;
    return e;
}

size_t gptoss_cuda_weights_bytes(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, V = c->vocab_size;
    return V * H * 2 + dense_bytes(V, H, fp8_layers & GPTOSS_FP8_LM_HEAD) +
           (size_t)c->n_layers * layer_weight_bytes(c, fp8_layers) +
           dense_scratch_elems(c, fp8_layers) * 2;
}

/* Experts held here: all of them, or a tensor-parallel rank's share (tp.cu). */
static size_t moe_experts(const gptoss_cuda_state *s) {
    return s->tp_n_experts > 0 ? (size_t)s->tp_n_experts : (size_t)s->config.n_experts;
}

gptoss_status gptoss_cuda_weights_alloc(gptoss_cuda_state *s, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    size_t QKV = (NH + 2 * NKV) * D;
    const size_t EM = moe_experts(s);
    gptoss_status st;
#define ALLOC(ptr, bytes, what)                                                                    \
    do {                                                                                           \
        st = gptoss_cuda_alloc((void **)&(ptr), (bytes), (what), error);                           \
        if (st) return st;                                                                         \
        s->weight_bytes += (bytes);                                                                \
    } while (0)
    ALLOC(s->embedding, V * H * 2, "the embedding");
    st = dense_alloc(s, &s->lm_head, (size_t)s->lm_rows, H, s->fp8_layers & GPTOSS_FP8_LM_HEAD,
                     "lm_head", error);
    if (st) return st;
    ALLOC(s->final_norm, H * 4, "the final norm");
    ALLOC(s->inv_freq, D / 2 * 4, "RoPE tables");
    s->layers = (cuda_layer *)calloc((size_t)c->n_layers, sizeof(cuda_layer));
    if (!s->layers) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        L->sliding = c->layer_is_sliding[l] && c->sliding_window > 0;
        ALLOC(L->attn_norm, H * 4, "norms");
        ALLOC(L->mlp_norm, H * 4, "norms");
        st = dense_alloc(s, &L->qkv_weight, QKV, H, s->fp8_layers & GPTOSS_FP8_QKV, "QKV weights",
                         error);
        if (st) return st;
        ALLOC(L->qkv_bias, QKV * 4, "QKV bias");
        st = dense_alloc(s, &L->o_weight, H, NH * D, s->fp8_layers & GPTOSS_FP8_O, "O weights",
                         error);
        if (st) return st;
        ALLOC(L->o_bias, H * 4, "O bias");
        ALLOC(L->sinks, NH * 4, "sinks");
        ALLOC(L->router_weight, E * H * 2, "router");
        ALLOC(L->router_weight_f32, E * H * 4, "router");
        ALLOC(L->router_bias, E * 4, "router bias");
        gptoss_cuda_moe_weights *m = &L->moe;
        ALLOC(m->gate_up_blocks, EM * 2 * I * (H / 32) * 16, "expert gate_up blocks");
        ALLOC(m->gate_up_scales, EM * 2 * I * (H / 32), "expert gate_up scales");
        ALLOC(m->gate_up_bias, EM * 2 * I * 4, "expert gate_up bias");
        ALLOC(m->down_blocks, EM * H * (I / 32) * 16, "expert down blocks");
        ALLOC(m->down_scales, EM * H * (I / 32), "expert down scales");
        ALLOC(m->down_bias, EM * H * 4, "expert down bias");
        m->n_experts = (int32_t)EM;
        m->hidden = (int32_t)H;
        m->intermediate = (int32_t)I;
        m->swiglu_limit = (float)c->swiglu_limit;
        m->swiglu_alpha = (float)c->swiglu_alpha;
    }
#undef ALLOC
    s->dense_scratch_elems = dense_scratch_elems(c, s->fp8_layers);
    if (s->dense_scratch_elems) {
        st = gptoss_cuda_alloc((void **)&s->dense_scratch, s->dense_scratch_elems * 2,
                               "the FP8 layers' scratch", error);
        if (st) return st;
    }
    float inv_freq[512];
    float conc = 1.0f;
    gptoss_rope_yarn_inv_freq(c, inv_freq, &conc);
    s->concentration = conc;
    CUDA_TRY(cudaMemcpy(s->inv_freq, inv_freq, D / 2 * sizeof(float), cudaMemcpyHostToDevice),
             "upload RoPE");
    return GPTOSS_OK;
}

void gptoss_cuda_weights_free(gptoss_cuda_state *s) {
    cudaFree(s->embedding);
    dense_free(&s->lm_head);
    cudaFree(s->dense_scratch);
    cudaFree(s->final_norm);
    cudaFree(s->inv_freq);
    if (!s->layers) return;
    for (int l = 0; l < s->config.n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        cudaFree(L->attn_norm);
        cudaFree(L->mlp_norm);
        dense_free(&L->qkv_weight);
        cudaFree(L->qkv_bias);
        dense_free(&L->o_weight);
        cudaFree(L->o_bias);
        cudaFree(L->sinks);
        cudaFree(L->router_weight);
        cudaFree(L->router_weight_f32);
        cudaFree(L->router_bias);
        cudaFree((void *)L->moe.gate_up_blocks);
        cudaFree((void *)L->moe.gate_up_scales);
        cudaFree((void *)L->moe.gate_up_bias);
        cudaFree((void *)L->moe.down_blocks);
        cudaFree((void *)L->moe.down_scales);
        cudaFree((void *)L->moe.down_bias);
    }
}

/* ---- weight upload ---------------------------------------------------------------------- */

typedef struct upload_ctx {
    gptoss_cuda_state *s;
    const gptoss_backend_options *options;
    size_t done, total; /* bytes */
    float *host_f32;    /* staging for small vectors converted to f32 */
    size_t host_cap;
} upload_ctx;

static void upload_progress(upload_ctx *u, size_t bytes) {
    u->done += bytes;
    if (u->options->progress)
        u->options->progress(u->options->progress_user, "uploading weights",
                             u->total ? (double)u->done / u->total : 1.0);
}

static gptoss_status upload_raw(upload_ctx *u, void *dst, const gptoss_tensor *t,
                                size_t expect_bytes, gptoss_error *error) {
    if (t->n_bytes != expect_bytes)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: tensor %s has %zu bytes, expected %zu",
                                t->name ? t->name : "?", t->n_bytes, expect_bytes);
    CUDA_TRY(cudaMemcpy(dst, t->data, expect_bytes, cudaMemcpyHostToDevice), "weight upload");
    upload_progress(u, expect_bytes);
    return GPTOSS_OK;
}

/* A dense matrix tensor must be bf16 with n elements. */
static gptoss_status check_bf16_matrix(const gptoss_tensor *t, size_t n, gptoss_error *error) {
    if (t->dtype != GPTOSS_DTYPE_BF16)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA upload: tensor %s is %s; the CUDA backend "
                                "needs BF16 for dense matrices",
                                t->name ? t->name : "?", gptoss_dtype_name(t->dtype));
    if (t->n_bytes != n * 2)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: tensor %s has %zu bytes, expected %zu",
                                t->name ? t->name : "?", t->n_bytes, n * 2);
    return GPTOSS_OK;
}

static gptoss_status upload_bf16_matrix(upload_ctx *u, bf16 *dst, const gptoss_tensor *t, size_t n,
                                        gptoss_error *error) {
    gptoss_status st = check_bf16_matrix(t, n, error);
    return st ? st : upload_raw(u, dst, t, n * 2, error);
}

/* Rows [row0, row0 + rows) of a dense [*, k] matrix from a bf16 tensor [rows, k]: copied in
 * place, or, for an FP8 matrix, staged through s->dense_scratch in blocks of rows and
 * quantized into place (a row's scale needs only that row). */
static gptoss_status upload_dense(upload_ctx *u, gptoss_cuda_dense_weight *dst, size_t row0,
                                  size_t rows, size_t k, const gptoss_tensor *t,
                                  gptoss_error *error) {
    if (dst->w_bf16) return upload_bf16_matrix(u, dst->w_bf16 + row0 * k, t, rows * k, error);
    gptoss_cuda_state *s = u->s;
    gptoss_status st = check_bf16_matrix(t, rows * k, error);
    if (st) return st;
    const size_t block = s->dense_scratch_elems / k;
    const unsigned char *src = (const unsigned char *)t->data;
    for (size_t r = 0; r < rows; r += block) {
        size_t n = rows - r < block ? rows - r : block;
        CUDA_TRY(cudaMemcpyAsync(s->dense_scratch, src + r * k * 2, n * k * 2,
                                 cudaMemcpyHostToDevice, s->stream),
                 "weight upload");
        gptoss_cuda_quantize_e4m3_rows(s->dense_scratch, (int32_t)n, (int32_t)k,
                                       dst->w_e4m3 + (row0 + r) * k, dst->row_scale + row0 + r,
                                       s->stream);
        upload_progress(u, n * k * 2);
    }
    CUDA_TRY(cudaStreamSynchronize(s->stream), "FP8 quantization");
    CUDA_TRY(cudaGetLastError(), "FP8 quantization");
    return GPTOSS_OK;
}

/* Small vectors (norms, biases, sinks) become f32 on the device whatever their file dtype. */
static gptoss_status upload_vector_f32(upload_ctx *u, float *dst, const gptoss_tensor *t, size_t n,
                                       gptoss_error *error) {
    if (n > u->host_cap) {
        float *grown = (float *)realloc(u->host_f32, n * sizeof(float));
        if (!grown) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        u->host_f32 = grown;
        u->host_cap = n;
    }
    const unsigned char *p = (const unsigned char *)t->data;
    size_t esz = gptoss_dtype_size(t->dtype);
    if (t->n_bytes != n * esz || (t->dtype != GPTOSS_DTYPE_BF16 && t->dtype != GPTOSS_DTYPE_F32))
        return gptoss_set_error(error, GPTOSS_ERR_MODEL,
                                "CUDA upload: tensor %s: expected %zu BF16 or F32 values",
                                t->name ? t->name : "?", n);
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == GPTOSS_DTYPE_BF16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            u->host_f32[i] = gptoss_bf16_to_f32(h);
        } else {
            memcpy(&u->host_f32[i], p + 4 * i, 4);
        }
    }
    CUDA_TRY(cudaMemcpy(dst, u->host_f32, n * sizeof(float), cudaMemcpyHostToDevice),
             "weight upload");
    upload_progress(u, t->n_bytes);
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_weights_upload(gptoss_cuda_state *s, const gptoss_weights *w,
                                         const gptoss_backend_options *options,
                                         gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    const size_t EM = moe_experts(s); /* the expert tensors hold these (tp.cu slices them) */
    upload_ctx u = {s, options, 0, 0, NULL, 0};
    u.total = w->embedding.n_bytes + w->lm_head.n_bytes + w->final_norm.n_bytes;
    for (int l = 0; l < w->n_layers; l++) {
        const gptoss_tensor *ts = &w->layers[l].attn_norm;
        for (size_t i = 0; i < sizeof(gptoss_layer_weights) / sizeof(gptoss_tensor); i++)
            u.total += ts[i].n_bytes;
    }
    gptoss_status st = GPTOSS_OK;
#define TRY(x)                                                                                     \
    do {                                                                                           \
        st = (x);                                                                                  \
        if (st) goto done;                                                                         \
    } while (0)
    if (w->n_layers != c->n_layers) {
        st = gptoss_set_error(error, GPTOSS_ERR_MODEL,
                              "CUDA upload: weights have %d layers, config %d", w->n_layers,
                              c->n_layers);
        goto done;
    }
    TRY(upload_bf16_matrix(&u, s->embedding, &w->embedding, V * H, error));
    TRY(upload_dense(&u, &s->lm_head, 0, (size_t)s->lm_rows, H, &w->lm_head, error));
    TRY(upload_vector_f32(&u, s->final_norm, &w->final_norm, H, error));
    for (int l = 0; l < c->n_layers; l++) {
        const gptoss_layer_weights *lw = &w->layers[l];
        cuda_layer *L = &s->layers[l];
        TRY(upload_vector_f32(&u, L->attn_norm, &lw->attn_norm, H, error));
        TRY(upload_vector_f32(&u, L->mlp_norm, &lw->mlp_norm, H, error));
        TRY(upload_dense(&u, &L->qkv_weight, 0, NH * D, H, &lw->q_weight, error));
        TRY(upload_dense(&u, &L->qkv_weight, NH * D, NKV * D, H, &lw->k_weight, error));
        TRY(upload_dense(&u, &L->qkv_weight, (NH + NKV) * D, NKV * D, H, &lw->v_weight, error));
        TRY(upload_vector_f32(&u, L->qkv_bias, &lw->q_bias, NH * D, error));
        TRY(upload_vector_f32(&u, L->qkv_bias + NH * D, &lw->k_bias, NKV * D, error));
        TRY(upload_vector_f32(&u, L->qkv_bias + (NH + NKV) * D, &lw->v_bias, NKV * D, error));
        TRY(upload_dense(&u, &L->o_weight, 0, H, NH * D, &lw->o_weight, error));
        TRY(upload_vector_f32(&u, L->o_bias, &lw->o_bias, H, error));
        TRY(upload_vector_f32(&u, L->sinks, &lw->sinks, NH, error));
        TRY(upload_bf16_matrix(&u, L->router_weight, &lw->router_weight, E * H, error));
        TRY(upload_vector_f32(&u, L->router_bias, &lw->router_bias, E, error));
        TRY(upload_raw(&u, (void *)L->moe.gate_up_blocks, &lw->gate_up_blocks,
                       EM * 2 * I * (H / 32) * 16, error));
        TRY(upload_raw(&u, (void *)L->moe.gate_up_scales, &lw->gate_up_scales,
                       EM * 2 * I * (H / 32), error));
        TRY(upload_vector_f32(&u, (float *)L->moe.gate_up_bias, &lw->gate_up_bias, EM * 2 * I,
                              error));
        TRY(upload_raw(&u, (void *)L->moe.down_blocks, &lw->down_blocks, EM * H * (I / 32) * 16,
                       error));
        TRY(upload_raw(&u, (void *)L->moe.down_scales, &lw->down_scales, EM * H * (I / 32), error));
        TRY(upload_vector_f32(&u, (float *)L->moe.down_bias, &lw->down_bias, EM * H, error));
    }
#undef TRY
done:
    free(u.host_f32);
    return st;
}

/* What is derived from the weights once they are in place (uploaded or generated): the fp32
 * copy of the router matrices, and per layer whether the tensor-core MoE path is exact
 * (gptoss_cuda_moe_check_mma); layers where it is not keep the WMMA/GEMV paths, and the
 * caller hears how many. */
gptoss_status gptoss_cuda_weights_finish(gptoss_cuda_state *s, gptoss_error *error) {
    for (int l = 0; l < s->config.n_layers; l++)
        gptoss_cuda_bf16_to_f32(s->layers[l].router_weight,
                                (size_t)s->config.n_experts * s->config.hidden_size,
                                s->layers[l].router_weight_f32, s->stream);
    unsigned *scratch = NULL;
    gptoss_status st = gptoss_cuda_alloc((void **)&scratch, 16, "a check buffer", error);
    if (st) return st;
    int slow = 0;
    cudaError_t ce = cudaSuccess;
    for (int l = 0; l < s->config.n_layers && ce == cudaSuccess; l++) {
        ce =
            gptoss_cuda_moe_check_mma(&s->layers[l].moe, s->layers[l].mlp_norm, scratch, s->stream);
        slow += !s->layers[l].moe.mma_ok;
    }
    cudaFree(scratch);
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "MoE weight check");
    if (slow)
        GPTOSS_LOG_W(
            "cuda",
            "%d of %d MoE layers have scales outside [2^-23, 2^1] (or inputs too wide for fp16) "
            "and use the slower WMMA/GEMV kernels",
            slow, s->config.n_layers);
    return GPTOSS_OK;
}

/* ---- random weights (bench) ----------------------------------------------------------- */

/* N(0, sd) values for a dense [n, k] matrix, rows [row0, row0 + n) of the matrix the seed
 * gives: generated in place, or, for an FP8 matrix, in blocks of rows in the scratch and
 * quantized into place (from the values the bf16 matrix gets from the same seed). Enqueued on
 * s->stream; the caller checks for errors. */
static void fill_dense_random(gptoss_cuda_state *s, gptoss_cuda_dense_weight *w, size_t n, size_t k,
                              size_t row0, uint64_t seed, float sd) {
    if (w->w_bf16) {
        gptoss_cuda_fill_normal_bf16_at(w->w_bf16, n * k, row0 * k, seed, 0.0f, sd, s->stream);
        return;
    }
    const size_t block = s->dense_scratch_elems / k;
    for (size_t r = 0; r < n; r += block) {
        size_t rows = n - r < block ? n - r : block;
        gptoss_cuda_fill_normal_bf16_at(s->dense_scratch, rows * k, (row0 + r) * k, seed, 0.0f, sd,
                                        s->stream);
        gptoss_cuda_quantize_e4m3_rows(s->dense_scratch, (int32_t)rows, (int32_t)k,
                                       w->w_e4m3 + r * k, w->row_scale + r, s->stream);
    }
}

gptoss_status gptoss_cuda_weights_random(gptoss_cuda_state *s,
                                         const gptoss_backend_options *options, uint64_t seed,
                                         gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
    const size_t EM = moe_experts(s);
    cudaStream_t k = s->stream;
    uint64_t n = seed * 1000003ull;
    /* make-model's distributions (model/random_init.h): embedding N(0, 1), Linear weights
     * N(0, 1/sqrt(in)), biases N(0, 0.02), norm gains 1 + N(0, 0.05), sinks N(0, 1), MXFP4
     * codes uniform, scale bytes s0 + {-1, 0, 1} with s0 = 127 + round(log2(1/(2.93 sqrt(in)))).
     * The values differ from make-model's (another hash); the cost does not depend on them. */
    float lin_h = 1.0f / sqrtf((float)H), lin_q = 1.0f / sqrtf((float)(NH * D));
    int s0_h = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)H))));
    int s0_i = 127 + (int)lrint(log2(1.0 / (2.93 * sqrt((double)I))));
    gptoss_cuda_fill_normal_bf16(s->embedding, V * H, n++, 0.0f, 1.0f, k);
    /* the rows held of the whole model's lm_head (tensor parallelism may hold a share) */
    fill_dense_random(s, &s->lm_head, (size_t)s->lm_rows, H, (size_t)s->lm_row0, n++, lin_h);
    gptoss_cuda_fill_normal_f32(s->final_norm, H, n++, 1.0f, 0.05f, k);
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        gptoss_cuda_fill_normal_f32(L->attn_norm, H, n++, 1.0f, 0.05f, k);
        gptoss_cuda_fill_normal_f32(L->mlp_norm, H, n++, 1.0f, 0.05f, k);
        fill_dense_random(s, &L->qkv_weight, QKV, H, 0, n++, lin_h);
        gptoss_cuda_fill_normal_f32(L->qkv_bias, QKV, n++, 0.0f, 0.02f, k);
        fill_dense_random(s, &L->o_weight, H, NH * D, 0, n++, lin_q);
        gptoss_cuda_fill_normal_f32(L->o_bias, H, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_normal_f32(L->sinks, NH, n++, 0.0f, 1.0f, k);
        gptoss_cuda_fill_normal_bf16(L->router_weight, E * H, n++, 0.0f, lin_h, k);
        gptoss_cuda_fill_normal_f32(L->router_bias, E, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.gate_up_blocks, EM * 2 * I * (H / 32) * 16,
                                    n++, 0, 255, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.gate_up_scales, EM * 2 * I * (H / 32), n++,
                                    s0_h - 1, s0_h + 1, k);
        gptoss_cuda_fill_normal_f32((float *)L->moe.gate_up_bias, EM * 2 * I, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.down_blocks, EM * H * (I / 32) * 16, n++, 0,
                                    255, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.down_scales, EM * H * (I / 32), n++, s0_i - 1,
                                    s0_i + 1, k);
        gptoss_cuda_fill_normal_f32((float *)L->moe.down_bias, EM * H, n++, 0.0f, 0.02f, k);
        if (options->progress)
            options->progress(options->progress_user, "generating weights",
                              (l + 1.0) / c->n_layers);
    }
    cudaError_t ce = cudaStreamSynchronize(k);
    if (ce == cudaSuccess) ce = cudaGetLastError();
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "random weight generation");
    return GPTOSS_OK;
}
