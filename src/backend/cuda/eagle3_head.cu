/*
 * eagle3_head.cu - an EAGLE3 draft head on the target's GPU: the CUDA backend's draft ops
 * (backend.h gptoss_backend_draft_ops).
 *
 * The target's side: every step copies the residual stream at the asked layer boundaries into
 * capture_dev (forward.cu, inside the captured graphs); captured_hidden reads the last step's
 * rows back to the host in plan order, once, when the drafter asks.
 *
 * The head's side (gptoss_eagle3_exec): its weights on the device (q|k|v and gate|up
 * concatenated, so each is one product), each sequence's head cache as device f32 rows, and
 * one forward per call on the target's stream, as the CPU forward computes it
 * (backend/cpu/eagle3_forward.h) but with the activations rounded to bf16 before each matrix
 * product (fp32 accumulation, the target's GEMV for decode shapes, cuBLAS otherwise). What
 * crosses to the device per call: the rows' indices, the target states of rows that read them
 * ([3H] f32 each) and the chained rows' previous outputs ([H]); what comes back: the draft ids
 * and the outputs of the rows that asked for a token (the next round's inputs), and whole
 * logits rows only where a row asks for them (GPTOSS_EAGLE3_DUMP).
 * Owns: the capture buffers (freed with the state), the executor's buffers (freed by destroy).
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/dense_lowp.h"
#include "backend/cuda/kernels/eagle3.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "model/eagle3.h"
}

/* ---- the target's hidden states ------------------------------------------------------ */

static size_t capture_width(const gptoss_cuda_state *s) {
    return (size_t)s->n_capture * s->config.hidden_size;
}

gptoss_status gptoss_cuda_capture_prepare(gptoss_cuda_state *s, int32_t T, bool reorder,
                                          gptoss_error *error) {
    s->captured_rows = 0;
    if (s->n_capture == 0) return GPTOSS_OK;
    if (T > s->capture_cap) {
        int32_t cap = s->capture_cap ? s->capture_cap : 64;
        while (cap < T)
            cap *= 2;
        CUDA_TRY(cudaStreamSynchronize(s->stream), "previous step");
        gptoss_cuda_graphs_clear(s); /* they copy into the old buffer */
        gptoss_cuda_capture_free(s);
        s->capture_order = (int32_t *)malloc((size_t)cap * sizeof(int32_t));
        if (!s->capture_order)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
        const size_t bytes = (size_t)cap * capture_width(s) * sizeof(float);
        gptoss_status st = gptoss_cuda_alloc((void **)&s->capture_dev, bytes,
                                             "hidden states for the draft head", error);
        if (st) return st;
        CUDA_TRY(cudaMallocHost((void **)&s->capture_host, bytes), "cudaMallocHost");
        CUDA_TRY(cudaMallocHost((void **)&s->capture_staging, bytes), "cudaMallocHost");
        s->capture_cap = cap;
    }
    s->captured_rows = T;
    s->captured_reordered = reorder;
    s->captured_read = false;
    return GPTOSS_OK;
}

void gptoss_cuda_capture_free(gptoss_cuda_state *s) {
    cudaFree(s->capture_dev);
    cudaFreeHost(s->capture_host);
    cudaFreeHost(s->capture_staging);
    free(s->capture_order);
    s->capture_dev = NULL;
    s->capture_host = s->capture_staging = NULL;
    s->capture_order = NULL;
    s->capture_cap = s->captured_rows = 0;
}

static gptoss_status cuda_capture_hidden(void *state, const int32_t *boundaries, int32_t n,
                                         gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    if (n < 0 || n > (int32_t)(sizeof s->capture / sizeof s->capture[0]))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "cuda backend: %d hidden-state boundaries (at most 8)", (int)n);
    /* Stopping keeps the boundaries, the buffer and the captured steps that copy into it (a
     * few device copies per step, read by nobody), so a head that starts again on the same
     * boundaries (a new engine on this backend) finds every captured step still valid. */
    s->capture_on = n > 0;
    s->captured_rows = 0;
    if (n == 0 || (n == s->n_capture && memcmp(s->capture, boundaries, (size_t)n * 4) == 0))
        return GPTOSS_OK;
    gptoss_status st = gptoss_cuda_device_bind(&s->dev, error);
    if (st) return st;
    CUDA_TRY(cudaStreamSynchronize(s->stream), "previous step");
    gptoss_cuda_graphs_clear(s); /* the steps captured so far copy other boundaries */
    gptoss_cuda_capture_free(s); /* the row width changes */
    memcpy(s->capture, boundaries, (size_t)n * sizeof *boundaries);
    s->n_capture = n;
    return GPTOSS_OK;
}

static const float *cuda_captured_hidden(void *state, int32_t *n_tokens) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    *n_tokens = 0;
    if (!s->capture_on || s->captured_rows == 0) return NULL;
    const int32_t T = s->captured_rows;
    const size_t width = capture_width(s);
    if (!s->captured_read) {
        gptoss_error err;
        memset(&err, 0, sizeof err);
        if (gptoss_cuda_device_bind(&s->dev, &err) != GPTOSS_OK) return NULL;
        float *to = s->captured_reordered ? s->capture_staging : s->capture_host;
        if (cudaMemcpyAsync(to, s->capture_dev, (size_t)T * width * sizeof(float),
                            cudaMemcpyDeviceToHost, s->stream) != cudaSuccess ||
            cudaStreamSynchronize(s->stream) != cudaSuccess)
            return NULL;
        if (s->captured_reordered) /* back into plan order */
            for (int32_t t = 0; t < T; t++)
                memcpy(s->capture_host + (size_t)t * width,
                       s->capture_staging + (size_t)s->capture_order[t] * width,
                       width * sizeof(float));
        s->captured_read = true;
    }
    *n_tokens = T;
    return s->capture_host;
}

static gptoss_status cuda_embed_tokens(void *state, const int32_t *tokens, int32_t n, float *out,
                                       gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    const int32_t H = s->config.hidden_size;
    gptoss_status st = gptoss_cuda_device_bind(&s->dev, error);
    if (st) return st;
    bf16 *row = (bf16 *)malloc((size_t)H * sizeof(bf16));
    if (!row) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int32_t t = 0; t < n && st == GPTOSS_OK; t++) {
        cudaError_t ce = cudaMemcpy(row, s->embedding + (size_t)tokens[t] * H,
                                    (size_t)H * sizeof(bf16), cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "embedding rows");
        for (int32_t h = 0; h < H && st == GPTOSS_OK; h++)
            out[(size_t)t * H + h] = __bfloat162float(row[h]);
    }
    free(row);
    return st;
}

/* ---- the head ------------------------------------------------------------------------- */

/* A matrix [n, k] bf16. Where k is wider than the GEMV takes (4096), it is held in `chunks`
 * column blocks of kc, one after another ([chunks][n][kc]): a one-row product then runs as
 * GEMVs over groups of chunks plus a sum (head_gemm), at the GEMV's bandwidth rather than
 * cuBLAS's at one row. */
typedef struct head_mat {
    bf16 *w;
    int32_t n, k, kc, chunks;
    /* with tuning.draft_fp8: the same chunks in e4m3, each chunk's rows with their own
     * scales (codes [chunks][n][kc], scales [chunks][n]; one allocation at codes) */
    uint8_t *codes;
    float *scales;
} head_mat;

typedef struct cuda_head {
    gptoss_cuda_state *s; /* the target's: device, stream, cuBLAS, embedding */
    const gptoss_eagle3_config *c;
    const gptoss_eagle3_weights *w;
    int32_t qkv_width; /* (NH + 2 NKV) * D */
    /* weights: bf16 matrices, f32 norms */
    head_mat fc, qkv, o, gate_up, down, lm_head;
    bf16 *own_embed;
    float *parts; /* the chunked products' partial sums */
    float *g_embed, *g_hidden, *g_post, *g_final, *inv_freq;
    /* scratch for cap rows */
    int32_t cap;
    float *aux;      /* [cap, 3H] */
    bf16 *aux16;     /* [cap, 3H] */
    float *fc_out;   /* [cap, H] */
    float *chain;    /* [cap, H] */
    float *hidden;   /* [cap, H]: the hidden input, then h, then prenorm */
    bf16 *x2;        /* [cap, 2H] */
    float *qkv_out;  /* [cap, qkv_width] */
    bf16 *attn;      /* [cap, NH * D] */
    float *proj;     /* [cap, H] o_proj, then down_proj outputs */
    bf16 *t;         /* [cap, H] post-attention norm; final norm of the picked rows */
    float *gu;       /* [cap, 2I] */
    bf16 *act;       /* [cap, I] */
    float *logits;   /* [cap, DV] */
    float *picked;   /* [cap, H] prenorm of the picked rows, gathered */
    int32_t *meta;   /* [GPTOSS_E3_META + 1, cap]: the row fields, then the picked rows */
    float **kv_ptrs; /* [2, cap] */
    void *summary;   /* argmax scratch */
    size_t summary_bytes;
    int32_t *ids;    /* [cap] device */
    float *top_vals; /* [cap] */
    float *lse;      /* [cap] */
    /* pinned host twins */
    int32_t *h_meta;
    float **h_kv_ptrs;
    float *h_aux, *h_chain, *h_picked;
    int32_t *h_ids;
    cudaGraphExec_t graphs[2]; /* one-row forwards, by n_aux (launch_one_row) */
} cuda_head;

static void head_scratch_free(cuda_head *x) {
    for (int i = 0; i < 2; i++) /* they use the buffers below */
        if (x->graphs[i]) cudaGraphExecDestroy(x->graphs[i]), x->graphs[i] = NULL;
    void *dev[] = {x->aux,  x->aux16,   x->fc_out,  x->chain, x->hidden,   x->x2,     x->qkv_out,
                   x->attn, x->proj,    x->t,       x->gu,    x->act,      x->logits, x->picked,
                   x->meta, x->kv_ptrs, x->summary, x->ids,   x->top_vals, x->lse};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        cudaFree(dev[i]);
    void *host[] = {x->h_meta, x->h_kv_ptrs, x->h_aux, x->h_chain, x->h_picked, x->h_ids};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        cudaFreeHost(host[i]);
    x->aux = x->fc_out = x->chain = x->hidden = x->qkv_out = x->proj = x->gu = x->logits =
        x->picked = x->top_vals = x->lse = NULL;
    x->aux16 = x->x2 = x->attn = x->t = x->act = NULL;
    x->meta = x->ids = x->h_meta = x->h_ids = NULL;
    x->kv_ptrs = x->h_kv_ptrs = NULL;
    x->summary = NULL;
    x->h_aux = x->h_chain = x->h_picked = NULL;
    x->cap = 0;
}

static gptoss_status head_grow(cuda_head *x, int32_t n, gptoss_error *error) {
    if (n <= x->cap) return GPTOSS_OK;
    int32_t cap = x->cap ? x->cap : 16;
    while (cap < n)
        cap *= 2;
    CUDA_TRY(cudaStreamSynchronize(x->s->stream), "draft head");
    head_scratch_free(x);
    const gptoss_eagle3_config *c = x->c;
    const size_t N = (size_t)cap, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size,
                 DV = (size_t)c->draft_vocab_size, Q = (size_t)c->n_heads * c->head_dim;
    x->summary_bytes = gptoss_cuda_logits_summary_scratch(cap, c->draft_vocab_size);
    struct {
        void **p;
        size_t bytes;
    } dev[] = {{(void **)&x->aux, N * 3 * H * 4},
               {(void **)&x->aux16, N * 3 * H * 2},
               {(void **)&x->fc_out, N * H * 4},
               {(void **)&x->chain, N * H * 4},
               {(void **)&x->hidden, N * H * 4},
               {(void **)&x->x2, N * 2 * H * 2},
               {(void **)&x->qkv_out, N * x->qkv_width * 4},
               {(void **)&x->attn, N * Q * 2},
               {(void **)&x->proj, N * H * 4},
               {(void **)&x->t, N * H * 2},
               {(void **)&x->gu, N * 2 * I * 4},
               {(void **)&x->act, N * I * 2},
               {(void **)&x->logits, N * DV * 4},
               {(void **)&x->picked, N * H * 4},
               {(void **)&x->meta, N * (GPTOSS_E3_META + 1) * 4},
               {(void **)&x->kv_ptrs, N * 2 * sizeof(float *)},
               {&x->summary, x->summary_bytes},
               {(void **)&x->ids, N * 4},
               {(void **)&x->top_vals, N * 4},
               {(void **)&x->lse, N * 4}};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        gptoss_status st = gptoss_cuda_alloc(dev[i].p, dev[i].bytes, "draft head scratch", error);
        if (st) {
            head_scratch_free(x);
            return st;
        }
    }
    struct {
        void **p;
        size_t bytes;
    } host[] = {{(void **)&x->h_meta, N * (GPTOSS_E3_META + 1) * 4},
                {(void **)&x->h_kv_ptrs, N * 2 * sizeof(float *)},
                {(void **)&x->h_aux, N * 3 * H * 4},
                {(void **)&x->h_chain, N * H * 4},
                {(void **)&x->h_picked, N * H * 4},
                {(void **)&x->h_ids, N * 4}};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) {
        cudaError_t ce = cudaMallocHost(host[i].p, host[i].bytes);
        if (ce != cudaSuccess) {
            head_scratch_free(x);
            return gptoss_cuda_error(error, ce, "cudaMallocHost (draft head)");
        }
    }
    x->cap = cap;
    return GPTOSS_OK;
}

static void head_destroy(void *state) {
    cuda_head *x = (cuda_head *)state;
    if (!x) return;
    gptoss_error err;
    memset(&err, 0, sizeof err);
    gptoss_cuda_device_bind(&x->s->dev, &err);
    cudaStreamSynchronize(x->s->stream);
    head_scratch_free(x);
    void *dev[] = {x->fc.w,       x->qkv.w,         x->o.w,       x->gate_up.w, x->down.w,
                   x->lm_head.w,  x->fc.codes,      x->qkv.codes, x->o.codes,   x->gate_up.codes,
                   x->down.codes, x->lm_head.codes, x->own_embed, x->g_embed,   x->g_hidden,
                   x->g_post,     x->g_final,       x->inv_freq,  x->parts};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        cudaFree(dev[i]);
    free(x);
}

static void head_kv_release(void *state, gptoss_eagle3_kv *kv) {
    cuda_head *x = (cuda_head *)state;
    if (kv->k || kv->v) {
        gptoss_error err;
        memset(&err, 0, sizeof err);
        gptoss_cuda_device_bind(&x->s->dev, &err);
        cudaStreamSynchronize(x->s->stream); /* a forward may still read them */
        cudaFree(kv->k);
        cudaFree(kv->v);
    }
    kv->k = kv->v = NULL;
    kv->cap = 0;
}

/* Grows a sequence's cache to hold n_positions rows (keeps what it holds). */
static gptoss_status kv_reserve(cuda_head *x, gptoss_eagle3_kv *kv, int32_t n_positions,
                                gptoss_error *error) {
    if (n_positions <= kv->cap) return GPTOSS_OK;
    int32_t cap = kv->cap ? kv->cap : 256;
    while (cap < n_positions)
        cap *= 2;
    const size_t row = (size_t)x->c->n_kv_heads * x->c->head_dim * sizeof(float);
    float *k = NULL, *v = NULL;
    gptoss_status st = gptoss_cuda_alloc((void **)&k, (size_t)cap * row, "draft head KV", error);
    if (st == GPTOSS_OK)
        st = gptoss_cuda_alloc((void **)&v, (size_t)cap * row, "draft head KV", error);
    if (st == GPTOSS_OK && kv->n > 0) {
        cudaError_t ce =
            cudaMemcpyAsync(k, kv->k, (size_t)kv->n * row, cudaMemcpyDeviceToDevice, x->s->stream);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(v, kv->v, (size_t)kv->n * row, cudaMemcpyDeviceToDevice,
                                 x->s->stream);
        if (ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "draft head KV");
    }
    if (st != GPTOSS_OK) {
        cudaFree(k);
        cudaFree(v);
        return st;
    }
    head_kv_release(x, kv); /* synchronizes: the copies are done */
    kv->k = k;
    kv->v = v;
    kv->cap = cap;
    return GPTOSS_OK;
}

#define CHUNK_GROUP GPTOSS_GEMV_MAX_ROWS

/* Floats of x->parts a chunked matrix needs (head_gemm's one-row path). */
static size_t parts_floats(const head_mat *a) {
    if (a->chunks == 1) return 0;
    const size_t groups = (size_t)(a->chunks + CHUNK_GROUP - 1) / CHUNK_GROUP;
    return groups * CHUNK_GROUP * CHUNK_GROUP * (size_t)a->n;
}

/* One row through a chunked matrix: each group of chunks as one GEMV whose rows are the
 * group's chunks of x, then the diagonal blocks summed; on the e4m3 codes when fp8. False:
 * the GEMV refused. */
static bool chunked_gemv(cuda_head *x, const head_mat *a, const bf16 *in, float *y, bool fp8) {
    gptoss_cuda_state *s = x->s;
    for (int32_t g = 0; g * CHUNK_GROUP < a->chunks; g++) {
        const int32_t c0 = g * CHUNK_GROUP,
                      cg = a->chunks - c0 < CHUNK_GROUP ? a->chunks - c0 : CHUNK_GROUP;
        const size_t w0 = (size_t)c0 * a->n * a->kc;
        float *part = x->parts + (size_t)c0 * CHUNK_GROUP * a->n;
        const int rc = fp8 ? gptoss_cuda_gemv_e4m3(a->codes + w0, a->scales + (size_t)c0 * a->n,
                                                   in + (size_t)c0 * a->kc, part, cg, cg * a->n,
                                                   a->kc, s->dev.n_sms, s->stream)
                           : gptoss_cuda_gemv_bf16(a->w + w0, in + (size_t)c0 * a->kc, part, cg,
                                                   cg * a->n, a->kc, s->dev.n_sms, s->stream);
        if (rc != 0) return false;
    }
    gptoss_cuda_e3_sum_chunks(x->parts, a->chunks, CHUNK_GROUP, a->n, y, s->stream);
    return true;
}

/* y [m, n] f32 = in [m, k] bf16 . a^T: the target's GEMV for the decode shapes it takes (a
 * chunked matrix's one row too), cuBLAS otherwise (chunk by chunk, accumulating). */
static gptoss_status head_gemm(cuda_head *x, const head_mat *a, const bf16 *in, float *y, int32_t m,
                               gptoss_error *error) {
    gptoss_cuda_state *s = x->s;
    if (m <= 0) return GPTOSS_OK;
    const bool gemv = s->tuning.gemv != GPTOSS_CUDA_GEMV_OFF;
    if (gemv && a->codes && m <= GPTOSS_GEMV_MAX_ROWS) { /* the decode rounds */
        if (a->chunks == 1 && gptoss_cuda_gemv_e4m3(a->codes, a->scales, in, y, m, a->n, a->k,
                                                    s->dev.n_sms, s->stream) == 0)
            return GPTOSS_OK;
        if (a->chunks > 1 && m == 1 && chunked_gemv(x, a, in, y, true)) return GPTOSS_OK;
    }
    if (gemv && a->chunks == 1 &&
        gptoss_cuda_gemv_bf16(a->w, in, y, m, a->n, a->k, s->dev.n_sms, s->stream) == 0)
        return GPTOSS_OK;
    if (gemv && a->chunks > 1 && m == 1 && chunked_gemv(x, a, in, y, false)) return GPTOSS_OK;
    const float one = 1.0f, zero = 0.0f;
    for (int32_t c = 0; c < a->chunks; c++) {
        cublasStatus_t cs =
            cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, a->n, m, a->kc, &one,
                         a->w + (size_t)c * a->n * a->kc, CUDA_R_16BF, a->kc,
                         in + (size_t)c * a->kc, CUDA_R_16BF, a->k, c ? &one : &zero, y, CUDA_R_32F,
                         a->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (cs != CUBLAS_STATUS_SUCCESS) return gptoss_cublas_check(cs, "draft head GEMM", error);
    }
    return GPTOSS_OK;
}

/* Everything a forward enqueues, from the staged rows (x->h_meta, h_kv_ptrs, h_aux, h_chain)
 * to the picked rows' draft ids and outputs in x->h_ids and h_picked; no host work depends on
 * the rows' contents, so a one-row forward is captured once and replayed (launch_one_row). */
static gptoss_status enqueue_rows(cuda_head *x, int32_t n, int32_t n_aux, int32_t n_pick,
                                  gptoss_error *error) {
    gptoss_cuda_state *s = x->s;
    const gptoss_eagle3_config *c = x->c;
    const int32_t H = c->hidden_size, I = c->intermediate_size, D = c->head_dim,
                  DV = c->draft_vocab_size, NH = c->n_heads, NKV = c->n_kv_heads;
    const float eps = (float)c->rms_norm_eps;
    cudaStream_t k = s->stream;
    gptoss_status st = GPTOSS_OK;
    CUDA_TRY(cudaMemcpyAsync(x->meta, x->h_meta, (size_t)(GPTOSS_E3_META * n + n_pick) * 4,
                             cudaMemcpyHostToDevice, k),
             "draft head rows");
    CUDA_TRY(cudaMemcpyAsync(x->kv_ptrs, x->h_kv_ptrs, (size_t)2 * n * sizeof(float *),
                             cudaMemcpyHostToDevice, k),
             "draft head rows");
    if (n_aux > 0)
        CUDA_TRY(cudaMemcpyAsync(x->aux, x->h_aux, (size_t)n_aux * 3 * H * sizeof(float),
                                 cudaMemcpyHostToDevice, k),
                 "draft head inputs");
    if (n_aux < n)
        CUDA_TRY(cudaMemcpyAsync(x->chain, x->h_chain, (size_t)n * H * sizeof(float),
                                 cudaMemcpyHostToDevice, k),
                 "draft head inputs");

    /* hidden = fc(aux) | chain; x2 = [norm(embed), norm(hidden)]; q|k|v; RoPE; K, V kept */
    if (n_aux > 0) {
        gptoss_cuda_e3_to_bf16(x->aux, (size_t)n_aux * 3 * H, x->aux16, k);
        st = head_gemm(x, &x->fc, x->aux16, x->fc_out, n_aux, error);
        if (st) return st;
    }
    const bf16 *embedding = x->own_embed ? x->own_embed : s->embedding;
    gptoss_cuda_e3_inputs(x->meta, n, embedding, x->fc_out, x->chain, x->g_embed, x->g_hidden, eps,
                          H, x->hidden, x->x2, k);
    st = head_gemm(x, &x->qkv, x->x2, x->qkv_out, n, error);
    if (st) return st;
    gptoss_cuda_e3_rope_kv(x->qkv_out, x->meta, x->kv_ptrs, n, x->inv_freq, NH, NKV, D, k);
    if (gptoss_cuda_e3_attention(x->qkv_out, x->meta, x->kv_ptrs, n, NH, NKV, D, x->attn, k))
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "EAGLE3 head: head_dim %d (32, 64 or 128 on CUDA)", (int)D);
    /* h = o(attn) + hidden; prenorm = h + down(swiglu(gate_up(norm(h)))) */
    st = head_gemm(x, &x->o, x->attn, x->proj, n, error);
    if (st) return st;
    gptoss_cuda_residual_rmsnorm(x->hidden, x->proj, NULL, NULL, NULL, 0, x->g_post, eps, NULL, n,
                                 H, x->t, NULL, k);
    st = head_gemm(x, &x->gate_up, x->t, x->gu, n, error);
    if (st) return st;
    gptoss_cuda_e3_swiglu(x->gu, n, I, x->act, k);
    st = head_gemm(x, &x->down, x->act, x->proj, n, error);
    if (st) return st;
    /* the picked rows: prenorm, final norm, lm_head, argmax */
    const int32_t *d_pick = x->meta + (size_t)GPTOSS_E3_META * n;
    if (n_pick > 0) {
        gptoss_cuda_residual_rmsnorm(x->hidden, x->proj, NULL, NULL, NULL, 0, x->g_final, eps,
                                     d_pick, n_pick, H, x->t, NULL, k);
        gptoss_cuda_e3_gather_f32(x->hidden, d_pick, n_pick, H, x->picked, k);
        st = head_gemm(x, &x->lm_head, x->t, x->logits, n_pick, error);
        if (st) return st;
        if (gptoss_cuda_logits_summary(x->logits, n_pick, DV, 1, x->summary, x->ids, x->top_vals,
                                       x->lse, k) != 0)
            return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                    "EAGLE3 head: draft vocabulary %d too large", (int)DV);
        CUDA_TRY(cudaMemcpyAsync(x->h_ids, x->ids, (size_t)n_pick * 4, cudaMemcpyDeviceToHost, k),
                 "draft ids");
        CUDA_TRY(cudaMemcpyAsync(x->h_picked, x->picked, (size_t)n_pick * H * sizeof(float),
                                 cudaMemcpyDeviceToHost, k),
                 "draft head outputs");
    }
    return GPTOSS_OK;
}

/* A one-row forward (n_aux 0: chained, 1: a target row) as a captured graph of
 * enqueue_rows, made on first use (the decode rounds: the launches cost as much as the small
 * kernels). */
static gptoss_status launch_one_row(cuda_head *x, int32_t n_aux, gptoss_error *error) {
    cudaStream_t k = x->s->stream;
    if (!x->graphs[n_aux]) {
        CUDA_TRY(cudaStreamBeginCapture(k, cudaStreamCaptureModeThreadLocal),
                 "cudaStreamBeginCapture");
        gptoss_status st = enqueue_rows(x, 1, n_aux, 1, error);
        cudaGraph_t graph = NULL;
        cudaError_t ce = cudaStreamEndCapture(k, &graph);
        if (st) {
            if (graph) cudaGraphDestroy(graph);
            return st;
        }
        if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "cudaStreamEndCapture");
        ce = cudaGraphInstantiate(&x->graphs[n_aux], graph, 0);
        cudaGraphDestroy(graph);
        if (ce != cudaSuccess) {
            x->graphs[n_aux] = NULL;
            return gptoss_cuda_error(error, ce, "cudaGraphInstantiate");
        }
    }
    CUDA_TRY(cudaGraphLaunch(x->graphs[n_aux], k), "cudaGraphLaunch");
    return GPTOSS_OK;
}

static gptoss_status head_forward(void *state, gptoss_eagle3_row *rows, int32_t n,
                                  gptoss_error *error) {
    cuda_head *x = (cuda_head *)state;
    gptoss_cuda_state *s = x->s;
    if (n <= 0) return GPTOSS_OK;
    const gptoss_eagle3_config *c = x->c;
    const int32_t H = c->hidden_size, DV = c->draft_vocab_size;
    cudaStream_t k = s->stream;
    gptoss_status st = gptoss_cuda_device_bind(&s->dev, error);
    if (st == GPTOSS_OK) st = head_grow(x, n, error);
    if (st) return st;
    /* the previous call's outputs were read; its inputs may still be in flight */
    CUDA_TRY(cudaStreamSynchronize(k), "draft head");

    /* Rows continue their caches: check, then reserve room for every row. */
    int32_t *meta = x->h_meta, *pick = meta + (size_t)GPTOSS_E3_META * n;
    int32_t n_aux = 0, n_pick = 0;
    for (int32_t r = 0; r < n; r++) {
        gptoss_eagle3_row *row = &rows[r];
        gptoss_eagle3_kv *kv = row->kv;
        int32_t ahead = 0;
        for (int32_t q = 0; q < r; q++)
            ahead += rows[q].kv == kv;
        if (row->position != kv->start + kv->n + ahead || (!row->aux && !row->hidden) ||
            !row->prenorm || row->token < 0 || row->token >= c->vocab_size)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "EAGLE3 forward: row %d at position %d does not continue its "
                                    "cache [%d, %d), lacks an input or has token %d",
                                    (int)r, (int)row->position, (int)kv->start,
                                    (int)(kv->start + kv->n + ahead), (int)row->token);
        st = kv_reserve(x, kv, kv->n + ahead + 1, error);
        if (st) return st;
        meta[GPTOSS_E3_WRITE * n + r] = kv->n + ahead; /* kv_reserve keeps n */
    }
    for (int32_t r = 0; r < n; r++) {
        gptoss_eagle3_row *row = &rows[r];
        meta[GPTOSS_E3_TOKEN * n + r] = row->token;
        meta[GPTOSS_E3_POSITION * n + r] = row->position;
        meta[GPTOSS_E3_CTX * n + r] = meta[GPTOSS_E3_WRITE * n + r] + 1;
        if (row->aux) {
            memcpy(x->h_aux + (size_t)n_aux * 3 * H, row->aux, (size_t)3 * H * sizeof(float));
            meta[GPTOSS_E3_AUX_ROW * n + r] = n_aux++;
        } else {
            memcpy(x->h_chain + (size_t)r * H, row->hidden, (size_t)H * sizeof(float));
            meta[GPTOSS_E3_AUX_ROW * n + r] = -1;
        }
        if (row->want_token || row->logits) pick[n_pick++] = r;
        x->h_kv_ptrs[r] = row->kv->k;
        x->h_kv_ptrs[n + r] = row->kv->v;
    }
    if (n == 1 && n_pick == 1 && s->tuning.graphs)
        st = launch_one_row(x, n_aux, error);
    else
        st = enqueue_rows(x, n, n_aux, n_pick, error);
    if (st) return st;
    if (n_pick > 0) {
        for (int32_t i = 0; i < n_pick; i++)
            if (rows[pick[i]].logits)
                CUDA_TRY(cudaMemcpyAsync(rows[pick[i]].logits, x->logits + (size_t)i * DV,
                                         (size_t)DV * sizeof(float), cudaMemcpyDeviceToHost, k),
                         "draft head logits");
    }
    CUDA_TRY(cudaGetLastError(), "draft head kernels");
    CUDA_TRY(cudaStreamSynchronize(k), "draft head");
    for (int32_t r = 0; r < n; r++)
        rows[r].kv->n++;
    for (int32_t i = 0; i < n_pick; i++) {
        gptoss_eagle3_row *row = &rows[pick[i]];
        row->draft_token = x->h_ids[i];
        memcpy(row->prenorm, x->h_picked + (size_t)i * H, (size_t)H * sizeof(float));
    }
    return GPTOSS_OK;
}

/* Copies host bf16 matrices [rows_i, k] (stacked: their rows one after another) into a new
 * device matrix, in column chunks where k is wider than the GEMV takes. */
static gptoss_status upload_mat(head_mat *a, const gptoss_tensor *const *parts, int n_parts,
                                gptoss_error *error) {
    a->n = 0;
    a->k = (int32_t)parts[0]->shape[1];
    for (int i = 0; i < n_parts; i++)
        a->n += (int32_t)parts[i]->shape[0];
    a->chunks = 1;
    while (a->k / a->chunks > 4096 || a->k % a->chunks || (a->k / a->chunks) % 8)
        if (++a->chunks > 64) { /* no clean cut: one block, cuBLAS for every shape */
            a->chunks = 1;
            break;
        }
    a->kc = a->k / a->chunks;
    gptoss_status st = gptoss_cuda_alloc((void **)&a->w, (size_t)a->n * a->k * sizeof(bf16),
                                         "draft head weights", error);
    for (int32_t c = 0, row0 = 0; c < a->chunks && st == GPTOSS_OK; c++, row0 = 0)
        for (int i = 0; i < n_parts && st == GPTOSS_OK; i++) {
            const size_t rows = (size_t)parts[i]->shape[0];
            cudaError_t ce =
                cudaMemcpy2D(a->w + ((size_t)c * a->n + row0) * a->kc, (size_t)a->kc * sizeof(bf16),
                             (const char *)parts[i]->data + (size_t)c * a->kc * sizeof(bf16),
                             (size_t)a->k * sizeof(bf16), (size_t)a->kc * sizeof(bf16), rows,
                             cudaMemcpyHostToDevice);
            if (ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "draft head weights");
            row0 += (int32_t)rows;
        }
    return st;
}

/* The e4m3 copy of a matrix, chunk by chunk (each chunk's rows scaled on their own). */
static gptoss_status quantize_mat(head_mat *a, cudaStream_t stream, gptoss_error *error) {
    const size_t chunk_codes = (size_t)a->n * a->kc, codes = chunk_codes * a->chunks;
    const size_t offset = (codes + 255) & ~(size_t)255;
    gptoss_status st =
        gptoss_cuda_alloc((void **)&a->codes, offset + (size_t)a->chunks * a->n * sizeof(float),
                          "draft head FP8 weights", error);
    if (st) return st;
    a->scales = (float *)(a->codes + offset);
    for (int32_t c = 0; c < a->chunks; c++)
        gptoss_cuda_quantize_e4m3_rows(a->w + (size_t)c * chunk_codes, a->n, a->kc,
                                       a->codes + (size_t)c * chunk_codes,
                                       a->scales + (size_t)c * a->n, stream);
    CUDA_TRY(cudaStreamSynchronize(stream), "draft head FP8 weights");
    return GPTOSS_OK;
}

/* The head's own embedding table as it is. */
static gptoss_status upload_bf16(bf16 **out, const gptoss_tensor *t, gptoss_error *error) {
    gptoss_status st = gptoss_cuda_alloc((void **)out, t->n_bytes, "draft head embedding", error);
    if (st) return st;
    CUDA_TRY(cudaMemcpy(*out, t->data, t->n_bytes, cudaMemcpyHostToDevice), "draft head weights");
    return GPTOSS_OK;
}

static gptoss_status upload_f32(float **out, const float *src, size_t n, gptoss_error *error) {
    gptoss_status st =
        gptoss_cuda_alloc((void **)out, n * sizeof(float), "draft head norms", error);
    if (st) return st;
    CUDA_TRY(cudaMemcpy(*out, src, n * sizeof(float), cudaMemcpyHostToDevice), "draft head norms");
    return GPTOSS_OK;
}

static gptoss_status cuda_head_exec(void *state, const struct gptoss_eagle3_head *head,
                                    struct gptoss_eagle3_exec *out, gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    memset(out, 0, sizeof *out);
    const gptoss_eagle3_config *c = gptoss_eagle3_head_config(head);
    if (c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "EAGLE3 head: head_dim %d is not supported on CUDA (32, 64 or "
                                "128)",
                                (int)c->head_dim);
    if (c->hidden_size > 4096)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "EAGLE3 head: hidden size %d is more than the 4096 the CUDA norm "
                                "kernels hold",
                                (int)c->hidden_size);
    gptoss_status st = gptoss_cuda_device_bind(&s->dev, error);
    if (st) return st;
    cuda_head *x = (cuda_head *)calloc(1, sizeof *x);
    if (!x) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    x->s = s;
    x->c = c;
    x->w = gptoss_eagle3_head_weights(head);
    x->qkv_width = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const gptoss_eagle3_weights *w = x->w;
    const gptoss_tensor *qkv[] = {&w->q, &w->k, &w->v}, *gate_up[] = {&w->gate, &w->up};
    const gptoss_tensor *fc = &w->fc, *o = &w->o, *down = &w->down, *lm = &w->lm_head,
                        *emb = &w->embed;
    st = upload_mat(&x->fc, &fc, 1, error);
    if (st == GPTOSS_OK) st = upload_mat(&x->qkv, qkv, 3, error);
    if (st == GPTOSS_OK) st = upload_mat(&x->o, &o, 1, error);
    if (st == GPTOSS_OK) st = upload_mat(&x->gate_up, gate_up, 2, error);
    if (st == GPTOSS_OK) st = upload_mat(&x->down, &down, 1, error);
    if (st == GPTOSS_OK) st = upload_mat(&x->lm_head, &lm, 1, error);
    if (st == GPTOSS_OK && w->embed.data) st = upload_bf16(&x->own_embed, emb, error);
    head_mat *all[] = {&x->fc, &x->qkv, &x->o, &x->gate_up, &x->down, &x->lm_head};
    if (st == GPTOSS_OK && s->tuning.draft_fp8) {
        const cudaError_t ce = gptoss_cuda_dense_lowp_prepare();
        if (ce != cudaSuccess) st = gptoss_cuda_error(error, ce, "FP8 GEMV setup");
        for (size_t i = 0; i < sizeof all / sizeof all[0] && st == GPTOSS_OK; i++)
            if (all[i]->kc % 16 == 0) st = quantize_mat(all[i], s->stream, error);
    }
    if (st == GPTOSS_OK) {
        const head_mat *mats[] = {&x->fc, &x->qkv, &x->o, &x->gate_up, &x->down, &x->lm_head};
        size_t floats = 1;
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (parts_floats(mats[i]) > floats) floats = parts_floats(mats[i]);
        st = gptoss_cuda_alloc((void **)&x->parts, floats * sizeof(float), "draft head scratch",
                               error);
    }
    if (st == GPTOSS_OK) st = head_grow(x, 64, error); /* decode rounds never grow it */
    const size_t H = (size_t)c->hidden_size;
    if (st == GPTOSS_OK) st = upload_f32(&x->g_embed, w->input_norm_f32, H, error);
    if (st == GPTOSS_OK) st = upload_f32(&x->g_hidden, w->hidden_norm_f32, H, error);
    if (st == GPTOSS_OK) st = upload_f32(&x->g_post, w->post_norm_f32, H, error);
    if (st == GPTOSS_OK) st = upload_f32(&x->g_final, w->final_norm_f32, H, error);
    if (st == GPTOSS_OK) {
        const int32_t half = c->head_dim / 2;
        float freq[64];
        for (int32_t j = 0; j < half; j++)
            freq[j] = (float)(1.0 / pow(c->rope_theta, (2.0 * j) / c->head_dim));
        st = upload_f32(&x->inv_freq, freq, (size_t)half, error);
    }
    if (st) {
        head_destroy(x);
        return st;
    }
    out->state = x;
    out->wants_embed = false;
    out->forward = head_forward;
    out->kv_release = head_kv_release;
    out->destroy = head_destroy;
    return GPTOSS_OK;
}

extern "C" const gptoss_backend_draft_ops gptoss_cuda_backend_draft_ops = {
    cuda_capture_hidden, cuda_captured_hidden, cuda_embed_tokens, cuda_head_exec};
