/*
 * forward.cu - the forward pass of one batch plan as a fixed sequence of kernels (spec
 * section 2): the step workspace, plan staging and token order, the graph cache, and
 * enqueue_step, the per-layer kernel sequence.
 *
 * Per step:  plan upload -> embed -> [per layer: attn-norm, QKV GEMM (our GEMV for <= 4
 * tokens, else cuBLAS), bias+RoPE+KV write, paged sink attention, O GEMM (likewise),
 * residual+mlp-norm, router logits (fp32 input) + top-k in one launch, route (not for a
 * single token), MoE (MXFP4)] -> residual+final norm of the logit rows only -> lm_head GEMM.
 * With batch_invariant set each of these sums in one order for every step
 * (docs/batch-invariance.md): the GEMMs on kernels/batch_invariant.cu (skinny or wide launch
 * shapes by rows, same bits), the router logits there too, the WMMA experts path's arithmetic
 * (its streaming and wide forms there), tensor-core attention unsplit for every token (one
 * token per block for short runs), no fused one-token kernels.
 * The residual stream is fp32; GEMM inputs are bf16 (as the references round them), except
 * the router, whose discrete choice is made from fp32 activations; every reduction
 * accumulates in fp32. KV pages are bf16, or with kv_cache_dtype FP8 e4m3 codes with one fp32
 * scale per token and KV head (kv_fp8.h; the same kernels, templated on the page type, and
 * then K and V are quantized from fp32 rather than rounded to bf16). The complete list of
 * bf16 roundings (the CPU backend's testing.emulate_bf16_activations mode repeats exactly these,
 * see cpu_backend.c): attention-norm output, K (after bias + RoPE) and V (after bias) in the pages,
 * attention output, MLP-norm output as the experts' input, SwiGLU output, final-norm output. Steps
 * of up to 64 tokens (decode) are captured once per shape as CUDA graphs and replayed (the graphs
 * knob turns that off).
 *
 * Owns the step workspace, the plan buffers and the captured graphs of a state. Must not:
 * print, touch KV pages a plan does not name, or leave the device in a failed state without
 * an error message.
 */
#include "backend/cuda/kernels/attention_tc.h"
#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/diagnostics.h"

#include <stdlib.h>
#include <string.h>

/* Y[M, N] f32 = X[M, K] bf16 . W[N, K]^T (row-major), fp32 accumulation. Decode shapes of
 * the layer projections go to our GEMV (cuBLAS reaches about half the bandwidth at M = 1);
 * lm_head stays on cuBLAS, which is at its floor already. A matrix held in FP8 (e4m3 with
 * row scales, dense_lowp.h) goes through the e4m3 GEMV in passes of GPTOSS_GEMV_MAX_ROWS
 * rows up to GPTOSS_E4M3_GEMV_MAX_TOKENS rows (lm_head too: its bytes halve), and above
 * that through blocks of rows decoded to bf16 for cuBLAS. */
static gptoss_status gemm_bf16(gptoss_cuda_state *s, gptoss_cuda_dense_weight wt, const bf16 *x,
                               float *y, int32_t m, int32_t n, int32_t k, bool allow_gemv,
                               gptoss_error *error) {
    if (m <= 0) return GPTOSS_OK;
    if (s->batch_invariant) /* one kernel for every m (batch_invariant.h) */
        return gptoss_cuda_bi_gemm_variant(wt, x, y, m, n, k,
                                           m <= s->tuning.bi_dense_split ? GPTOSS_BI_GEMM_SPLIT
                                           : m <= s->tuning.bi_dense_max ? GPTOSS_BI_GEMM_SKINNY
                                           : s->tuning.bi_dense_large > 0
                                               ? GPTOSS_BI_GEMM_LARGE - 1 + s->tuning.bi_dense_large
                                           : s->tuning.bi_dense_wide ? GPTOSS_BI_GEMM_WIDE
                                                                     : GPTOSS_BI_GEMM_TILE,
                                           s->stream) == 0
                   ? GPTOSS_OK
                   : gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                      "CUDA: batch-invariant GEMM refuses width %d", (int)k);
    const bool gemv = s->tuning.gemv != GPTOSS_CUDA_GEMV_OFF,
               gemv_all = s->tuning.gemv == GPTOSS_CUDA_GEMV_ALL;
    if (wt.w_e4m3) {
        if ((gemv && m <= GPTOSS_E4M3_GEMV_MAX_TOKENS) || gemv_all) {
            bool ok = true;
            for (int32_t r = 0; r < m && ok; r += GPTOSS_GEMV_MAX_ROWS) {
                int32_t rows = m - r < GPTOSS_GEMV_MAX_ROWS ? m - r : GPTOSS_GEMV_MAX_ROWS;
                ok = gptoss_cuda_gemv_e4m3(wt.w_e4m3, wt.row_scale, x + (size_t)r * k,
                                           y + (size_t)r * n, rows, n, k, s->dev.n_sms,
                                           s->stream) == 0;
            }
            if (ok) return GPTOSS_OK;
        }
        return gptoss_cublas_check(gptoss_cuda_gemm_e4m3(s->cublas, wt.w_e4m3, wt.row_scale, x, y,
                                                         m, n, k, s->dense_scratch,
                                                         s->dense_scratch_elems, s->stream),
                                   "FP8 GEMM (rows decoded to bf16)", error);
    }
    const bf16 *w = wt.w_bf16;
    if (allow_gemv && gemv && gptoss_cuda_gemv_bf16(w, x, y, m, n, k, s->dev.n_sms, s->stream) == 0)
        return GPTOSS_OK;
    if (gemv_all) { /* diagnostics: every row block through the GEMV, no cuBLAS */
        bool ok = true;
        for (int32_t r = 0; r < m && ok; r += GPTOSS_GEMV_MAX_ROWS) {
            int32_t rows = m - r < GPTOSS_GEMV_MAX_ROWS ? m - r : GPTOSS_GEMV_MAX_ROWS;
            ok = gptoss_cuda_gemv_bf16(w, x + (size_t)r * k, y + (size_t)r * n, rows, n, k,
                                       s->dev.n_sms, s->stream) == 0;
        }
        if (ok) return GPTOSS_OK;
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w,
                                     CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, y, CUDA_R_32F, n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return gptoss_cublas_check(st, "bf16 GEMM", error);
}

/* ---- workspace ------------------------------------------------------------------------ */

static size_t align_up(size_t x) {
    return (x + 255) & ~(size_t)255;
}

gptoss_status gptoss_cuda_workspace_ensure(gptoss_cuda_state *s, int32_t n_tokens, int32_t n_logits,
                                           int32_t table_ints, gptoss_error *error) {
    cuda_workspace *w = &s->ws;
    const gptoss_config *c = &s->config;
    if (n_tokens > w->cap_tokens || n_logits > w->cap_logits) {
        int32_t T = n_tokens > w->cap_tokens ? n_tokens : w->cap_tokens;
        int32_t NL = n_logits > w->cap_logits ? n_logits : w->cap_logits;
        if (T < 16) T = 16;
        if (NL < 1) NL = 1;
        size_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts,
               K = c->n_experts_per_token;
        size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
        size_t V = c->vocab_size;
        /* split-K partials exist only while n_tokens * n_kv_heads * splits < 4 * SMs (see
         * gptoss_cuda_attention_splits), i.e. n_tokens * n_heads * splits < 4 * SMs * group */
        size_t part = (size_t)4 * s->dev.n_sms * (NH / NKV) * (D + 2);
        /* lm_head split by vocabulary: this rank's columns, and every rank's (V in all) */
        const bool lm_split = (size_t)s->lm_rows < V;
        size_t sizes[18] = {(size_t)T * H * 4,
                            (size_t)T * H * 2,
                            (size_t)T * H * 4,
                            (size_t)T * QKV * 4,
                            (size_t)T * NH * D * 4,
                            (size_t)T * NH * D * 2,
                            (size_t)T * (H > E ? H : E) * 4,
                            (size_t)T * K * 4,
                            (size_t)T * K * 4,
                            gptoss_cuda_route_bytes((int32_t)(T * K), (int32_t)E),
                            (size_t)T * K * I * 2,
                            (size_t)T * K * H * 4,
                            part * 4,
                            (size_t)NL * H * 2,
                            (size_t)NL * V * 4,
                            16,
                            lm_split ? (size_t)NL * s->lm_rows * 4 : 0,
                            lm_split ? (size_t)NL * V * 4 : 0};
        size_t total = 0;
        for (int i = 0; i < 18; i++)
            total += align_up(sizes[i]);
        if (w->base) {
            cudaStreamSynchronize(s->stream);
            cudaFree(w->base);
            w->base = NULL;
        }
        gptoss_status st = gptoss_cuda_alloc(&w->base, total, "the step workspace", error);
        if (st) {
            w->cap_tokens = w->cap_logits = 0;
            return st;
        }
        w->bytes = total;
        char *p = (char *)w->base;
        void **slots[18] = {
            (void **)&w->x,           (void **)&w->t,        (void **)&w->t_f32,
            (void **)&w->qkv,         (void **)&w->q,        (void **)&w->attn,
            (void **)&w->proj,        (void **)&w->topk_idx, (void **)&w->topk_weight,
            (void **)&w->route_mem,   (void **)&w->h,        (void **)&w->y,
            (void **)&w->partial,     (void **)&w->lm_in,    (void **)&w->logits,
            (void **)&w->router_done, (void **)&w->lm_part,  (void **)&w->lm_gather};
        for (int i = 0; i < 18; i++) {
            *slots[i] = p;
            p += align_up(sizes[i]);
        }
        CUDA_TRY(cudaMemset(w->router_done, 0, sizeof(unsigned)), "workspace setup");
        w->partial_floats = part;
        w->cap_tokens = T;
        w->cap_logits = NL;
    }
    size_t plan_ints = (size_t)3 * w->cap_tokens + w->cap_logits + 2 * (size_t)table_ints;
    if (plan_ints > w->plan_ints) {
        if (w->plan_dev) {
            cudaStreamSynchronize(s->stream);
            cudaFree(w->plan_dev);
            cudaFreeHost(w->plan_host);
            w->plan_dev = NULL;
            w->plan_host = NULL;
        }
        plan_ints = plan_ints * 2;
        gptoss_status st =
            gptoss_cuda_alloc((void **)&w->plan_dev, plan_ints * 4, "the plan buffer", error);
        if (st) return st;
        CUDA_TRY(cudaMallocHost((void **)&w->plan_host, plan_ints * 4), "cudaMallocHost");
        w->plan_ints = plan_ints;
    }
    return GPTOSS_OK;
}

void gptoss_cuda_workspace_free(gptoss_cuda_state *s) {
    cudaFree(s->ws.base);
    cudaFreeHost(s->ws.plan_host);
    free(s->ws.seq_start);
    cudaFree(s->ws.plan_dev);
}

/* ---- one step ----------------------------------------------------------------------------- */

void gptoss_cuda_graphs_clear(gptoss_cuda_state *s) {
    for (int i = 0; i < GPTOSS_CUDA_MAX_GRAPHS; i++) {
        if (s->graphs[i].valid) cudaGraphExecDestroy(s->graphs[i].exec);
        s->graphs[i].valid = false;
    }
}

/* Runs of at least this many tokens of one sequence attend on tensor cores (one tile). */
#define ATTN_TC_MIN_RUN 16
/* batch-invariant experts on the grouped pair kernel: pairs per route tile (one copy of each
 * 16-row weight tile serves this many pairs of its expert) */
#define BI_PAIR_ROUTE_ROWS 16

/* Attention of one layer over its pages, bf16 or FP8: tokens [n_short, T) on the tensor-core
 * kernel, those before on the split-K kernel (all of them when the tensor-core kernel refuses
 * the shape; see gptoss_cuda_forward_device for the order). False when no kernel takes the
 * shape (nothing launched then). */
static bool layer_attention_try_launch(gptoss_cuda_state *s, const cuda_layer *L,
                                       const cuda_step_key *key, const int32_t *d_pos,
                                       const int32_t *d_seq, const int32_t *table) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t T = key->n_tokens, NS = key->n_short, NH = c->n_heads, NKV = c->n_kv_heads,
                  D = c->head_dim;
    const size_t q_row = (size_t)NH * D;
    const int32_t window = L->sliding ? c->sliding_window : 0;
    const int32_t splits = L->sliding ? key->splits_sliding : key->splits_full;
    int32_t scalar_end = NS;
    if (NS < T) {
        const float *q = w->q + NS * q_row;
        bf16 *out = w->attn + NS * q_row;
        int rc = s->kv_fp8
                     ? gptoss_cuda_attention_tc_fp8(q, L->k_fp8, L->v_fp8, L->k_scale, L->v_scale,
                                                    d_pos + NS, d_seq + NS, table, key->max_blocks,
                                                    s->kv_block_size, L->sinks, T - NS, NH, NKV, D,
                                                    window, out, s->stream)
                     : gptoss_cuda_attention_tc(q, L->k_cache, L->v_cache, d_pos + NS, d_seq + NS,
                                                table, key->max_blocks, s->kv_block_size, L->sinks,
                                                T - NS, NH, NKV, D, window, out, s->stream);
        if (rc != 0) scalar_end = T;
    }
    if (scalar_end == 0) return true;
    /* batch-invariant: the short runs on the same tensor-core kernel, one token per block, each
     * row bitwise what a tile gives it; the scalar kernel, unsplit, for every token where
     * attn_tc is off or the kernel refuses the shape */
    if (s->batch_invariant && s->tuning.attn_tc && scalar_end == NS) {
        int rc =
            s->kv_fp8
                ? gptoss_cuda_attention_tc_fp8_each(w->q, L->k_fp8, L->v_fp8, L->k_scale,
                                                    L->v_scale, d_pos, d_seq, table,
                                                    key->max_blocks, s->kv_block_size, L->sinks, NS,
                                                    NH, NKV, D, window, w->attn, s->stream)
                : gptoss_cuda_attention_tc_each(w->q, L->k_cache, L->v_cache, d_pos, d_seq, table,
                                                key->max_blocks, s->kv_block_size, L->sinks, NS, NH,
                                                NKV, D, window, w->attn, s->stream);
        if (rc == 0) return true;
        scalar_end = T; /* refused: every token on the scalar kernel */
    }
    /* tensor cores; the scalar kernel below for shapes it refuses */
    if (s->dev.attn_decode && !s->batch_invariant) {
        int rc = s->kv_fp8
                     ? gptoss_cuda_attention_decode_fp8(
                           w->q, L->k_fp8, L->v_fp8, L->k_scale, L->v_scale, d_pos, d_seq, table,
                           key->max_blocks, s->kv_block_size, L->sinks, scalar_end, NH, NKV, D,
                           window, splits, w->partial, w->attn, s->stream)
                     : gptoss_cuda_attention_decode(w->q, L->k_cache, L->v_cache, d_pos, d_seq,
                                                    table, key->max_blocks, s->kv_block_size,
                                                    L->sinks, scalar_end, NH, NKV, D, window,
                                                    splits, w->partial, w->attn, s->stream);
        if (rc == 0) return true;
    }
    if (s->kv_fp8)
        return gptoss_cuda_attention_fp8(w->q, L->k_fp8, L->v_fp8, L->k_scale, L->v_scale, d_pos,
                                         d_seq, table, key->max_blocks, s->kv_block_size, L->sinks,
                                         scalar_end, NH, NKV, D, window, splits, w->partial,
                                         w->attn, s->stream) == 0;
    return gptoss_cuda_attention(w->q, L->k_cache, L->v_cache, d_pos, d_seq, table, key->max_blocks,
                                 s->kv_block_size, L->sinks, scalar_end, NH, NKV, D, window, splits,
                                 w->partial, w->attn, s->stream) == 0;
}

/* One decode token on bf16 pages: the QKV projection with RoPE and the KV write in its
 * epilogue, in one kernel. False when the step has another shape or the kernel refuses it;
 * the projection and the RoPE kernel then run apart. */
static bool qkv_rope_fused(gptoss_cuda_state *s, const cuda_layer *L, const cuda_step_key *key,
                           const int32_t *d_pos, const int32_t *d_seq, const int32_t *table) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    return key->n_tokens == 1 && s->tuning.qkv_rope && !s->batch_invariant &&
           s->tuning.gemv != GPTOSS_CUDA_GEMV_OFF && !s->kv_fp8 && L->qkv_weight.w_bf16 &&
           !GPTOSS_CUDA_ABLATED(s, key, GPTOSS_CUDA_ABLATE_ROPE | GPTOSS_CUDA_ABLATE_QKV) &&
           gptoss_cuda_qkv_rope_one(L->qkv_weight.w_bf16, w->t, L->qkv_bias, d_pos, d_seq,
                                    s->inv_freq, s->concentration, c->n_heads, c->n_kv_heads,
                                    c->head_dim, c->hidden_size, table, key->max_blocks,
                                    s->kv_block_size, w->q, L->k_cache, L->v_cache, s->stream) == 0;
}

/* Bias + RoPE on the projected q and k, k and v into the layer's pages (bf16 or FP8). */
static void rope_kv_write(gptoss_cuda_state *s, const cuda_layer *L, const cuda_step_key *key,
                          const int32_t *d_pos, const int32_t *d_seq, const int32_t *table) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t T = key->n_tokens, NH = c->n_heads, NKV = c->n_kv_heads, D = c->head_dim;
    if (s->kv_fp8)
        gptoss_cuda_rope_kv_write_fp8(w->qkv, L->qkv_bias, d_pos, d_seq, s->inv_freq,
                                      s->concentration, T, NH, NKV, D, table, key->max_blocks,
                                      s->kv_block_size, w->q, L->k_fp8, L->v_fp8, L->k_scale,
                                      L->v_scale, s->stream);
    else
        gptoss_cuda_rope_kv_write(w->qkv, L->qkv_bias, d_pos, d_seq, s->inv_freq, s->concentration,
                                  T, NH, NKV, D, table, key->max_blocks, s->kv_block_size, w->q,
                                  L->k_cache, L->v_cache, s->stream);
}

/* One decode token: residual, norm and router in one kernel; its logits go to w->t_f32,
 * which only the unfused router reads (not w->proj: that is the kernel's input). False when
 * the step has another shape or the kernel refuses it. */
static bool norm_router_fused(gptoss_cuda_state *s, const cuda_layer *L, const cuda_step_key *key) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t H = c->hidden_size, E = c->n_experts;
    return key->n_tokens == 1 && s->tuning.norm_router && !s->batch_invariant &&
           !GPTOSS_CUDA_ABLATED(s, key, GPTOSS_CUDA_ABLATE_ROUTER) &&
           (int64_t)w->cap_tokens * H >= E &&
           gptoss_cuda_norm_router_one(w->x, w->proj, L->o_bias, L->mlp_norm,
                                       (float)c->rms_norm_eps, H, w->t, L->router_weight,
                                       L->router_bias, E, c->n_experts_per_token, w->t_f32,
                                       w->router_done, w->topk_idx, w->topk_weight, s->stream) == 0;
}

/* Router logits and top-k of every token: the fused router for small steps, an SGEMM and the
 * top-k kernel for larger ones (the fused kernel selects in its last block alone: too serial
 * for big steps). */
static gptoss_status route_tokens(gptoss_cuda_state *s, const cuda_layer *L,
                                  const cuda_step_key *key, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t T = key->n_tokens, H = c->hidden_size, E = c->n_experts,
                  K = c->n_experts_per_token;
    if (s->batch_invariant) { /* one kernel for every step; bias added by the top-k kernel */
        if (gptoss_cuda_bi_router_logits(w->t_f32, L->router_weight_f32, T, E, H, w->proj,
                                         s->stream) != 0)
            return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                    "CUDA: batch-invariant router refuses width %d", (int)H);
        gptoss_cuda_router_topk(w->proj, L->router_bias, T, E, K, w->topk_idx, w->topk_weight,
                                s->stream);
        return GPTOSS_OK;
    }
    if (T <= s->tuning.router_fused_max) {
        gptoss_cuda_router(w->t_f32, L->router_weight, L->router_bias, T, E, H, K, w->proj,
                           w->router_done, w->topk_idx, w->topk_weight, s->stream);
        return GPTOSS_OK;
    }
    /* fp32 SGEMM (no TF32: cuBLAS's default math mode) on the fp32 copy of the router: the
     * logits kernel re-reads the matrix per 8 tokens (36 ms of a 2048-token 120b prefill);
     * bias added by the top-k kernel */
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t cs = cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, E, T, H, &one,
                                    L->router_weight_f32, H, w->t_f32, H, &zero, w->proj, E);
    if (cs != CUBLAS_STATUS_SUCCESS) return gptoss_cublas_check(cs, "router SGEMM", error);
    gptoss_cuda_router_topk(w->proj, L->router_bias, T, E, K, w->topk_idx, w->topk_weight,
                            s->stream);
    return GPTOSS_OK;
}

/* Tensor parallelism: this rank's share of the experts' weighted outputs summed into w->proj
 * (free once the experts ran), summed over the ranks,
 * then added to the residual stream as one projection before the next norm. */
static gptoss_status tp_residual_next_norm(gptoss_cuda_state *s, int l, const cuda_step_key *key,
                                           const int32_t *d_logit, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t T = key->n_tokens, H = c->hidden_size, K = c->n_experts_per_token;
    const float eps = (float)c->rms_norm_eps;
    const bool last = l + 1 == c->n_layers;
    const float *gain = last ? s->final_norm : s->layers[l + 1].attn_norm;
    gptoss_cuda_moe_combine(w->y, w->topk_weight, K, T, H, w->proj, s->stream);
    gptoss_status st = gptoss_cuda_tp_allreduce(s, w->proj, (size_t)T * H, error);
    if (st) return st;
    if (!last)
        gptoss_cuda_residual_rmsnorm(w->x, w->proj, NULL, NULL, NULL, 0, gain, eps, NULL, T, H,
                                     w->t, NULL, s->stream);
    else
        gptoss_cuda_residual_rmsnorm(w->x, w->proj, NULL, NULL, NULL, 0, gain, eps, d_logit,
                                     key->n_logits, H, w->lm_in, NULL, s->stream);
    return GPTOSS_OK;
}

/* EAGLE3 drafting: the residual stream x (the input of layer b; b = n_layers: the last
 * layer's output) of every token into the slots of capture_dev that name boundary b. */
static void capture_boundary(gptoss_cuda_state *s, int32_t b, int32_t T) {
    const size_t H = s->config.hidden_size;
    for (int32_t i = 0; i < s->n_capture; i++)
        if (s->capture[i] == b)
            cudaMemcpy2DAsync(s->capture_dev + (size_t)i * H, (size_t)s->n_capture * H * 4, s->ws.x,
                              H * 4, H * 4, (size_t)T, cudaMemcpyDeviceToDevice, s->stream);
}

static bool captures(const gptoss_cuda_state *s, int32_t b) {
    for (int32_t i = 0; i < s->n_capture; i++)
        if (s->capture[i] == b) return true;
    return false;
}

/* The experts' weighted outputs into the residual stream, then the next layer's attention
 * norm; after the last layer the final norm of only the rows that want logits, gathered
 * (every row's stream updated first when a draft head reads the last layer's output). */
static gptoss_status residual_next_norm(gptoss_cuda_state *s, int l, const cuda_step_key *key,
                                        const int32_t *d_logit, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t H = c->hidden_size, K = c->n_experts_per_token;
    const float eps = (float)c->rms_norm_eps;
    if (s->tp_size > 1) return tp_residual_next_norm(s, l, key, d_logit, error);
    if (l + 1 < c->n_layers)
        gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, w->y, w->topk_weight, K,
                                     s->layers[l + 1].attn_norm, eps, NULL, key->n_tokens, H, w->t,
                                     NULL, s->stream);
    else if (captures(s, c->n_layers)) {
        gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, w->y, w->topk_weight, K, s->final_norm, eps,
                                     NULL, key->n_tokens, H, w->t, NULL, s->stream);
        gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, NULL, NULL, 0, s->final_norm, eps, d_logit,
                                     key->n_logits, H, w->lm_in, NULL, s->stream);
    } else
        gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, w->y, w->topk_weight, K, s->final_norm, eps,
                                     d_logit, key->n_logits, H, w->lm_in, NULL, s->stream);
    return GPTOSS_OK;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        gptoss_status try_st_ = (call);                                                            \
        if (try_st_) return try_st_;                                                               \
    } while (0)
#define MARK(part) gptoss_cuda_prof_mark(s, part)
#define ABLATED(bits) GPTOSS_CUDA_ABLATED(s, key, GPTOSS_CUDA_ABLATE_##bits)

/* Enqueues one whole step on s->stream from the staged plan (no host work depends on the
 * plan's contents here, so the same sequence can be captured once and replayed). MARK
 * charges the time since the previous mark to a component when profiling; ABLATED is false
 * except in diagnostics builds (diagnostics.h). */
static gptoss_status enqueue_step(gptoss_cuda_state *s, const cuda_step_key *key,
                                  gptoss_error *error) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t T = key->n_tokens, NL = key->n_logits, table_ints = key->n_seqs * key->max_blocks;
    const int32_t H = c->hidden_size, E = c->n_experts, K = c->n_experts_per_token, D = c->head_dim;
    const int32_t NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
    const float eps = (float)c->rms_norm_eps;
    cudaStream_t k = s->stream;
    MARK(PART_GAPS);
    CUDA_TRY(
        cudaMemcpyAsync(w->plan_dev, w->plan_host, key->staged_ints * 4, cudaMemcpyHostToDevice, k),
        "plan upload");
    MARK(PART_UPLOAD);
    const int32_t *d_ids = w->plan_dev, *d_pos = w->plan_dev + w->cap_tokens,
                  *d_seq = w->plan_dev + 2 * w->cap_tokens;
    const int32_t *d_logit = w->plan_dev + 3 * w->cap_tokens;
    const int32_t *d_full = d_logit + w->cap_logits, *d_slide = d_full + table_ints;
    gptoss_cuda_route route;
    gptoss_cuda_route_bind(w->route_mem, T * K, E, &route);

    gptoss_cuda_embed(s->embedding, d_ids, T, H, w->x, k);
    gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, NULL, NULL, 0, s->layers[0].attn_norm, eps, NULL,
                                 T, H, w->t, NULL, k);
    MARK(PART_SMALL);
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        const int32_t *table = L->sliding ? d_slide : d_full;
        if (s->n_capture > 0) capture_boundary(s, l, T);
        /* attention: QKV, RoPE + KV write, attention over the pages, O */
        const bool qkv_roped = qkv_rope_fused(s, L, key, d_pos, d_seq, table);
        if (!qkv_roped && !ABLATED(QKV))
            TRY(gemm_bf16(s, L->qkv_weight, w->t, w->qkv, T, QKV, H, true, error));
        MARK(PART_DENSE);
        if (!qkv_roped && !ABLATED(ROPE)) rope_kv_write(s, L, key, d_pos, d_seq, table);
        MARK(PART_SMALL);
        if (!ABLATED(ATTENTION) && !layer_attention_try_launch(s, L, key, d_pos, d_seq, table))
            return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                    "CUDA: attention shape not supported");
        MARK(PART_ATTENTION);
        if (!ABLATED(O))
            TRY(gemm_bf16(s, L->o_weight, w->attn, w->proj, T, H, NH * D, true, error));
        if (s->tp_size > 1) TRY(gptoss_cuda_tp_allreduce(s, w->proj, (size_t)T * H, error));
        MARK(PART_DENSE);
        /* MLP: residual + norm, router, experts */
        const bool normed_routed = norm_router_fused(s, L, key);
        if (!normed_routed && !ABLATED(NORMS))
            gptoss_cuda_residual_rmsnorm(w->x, w->proj, L->o_bias, NULL, NULL, 0, L->mlp_norm, eps,
                                         NULL, T, H, w->t, w->t_f32, k);
        if (!normed_routed && !ABLATED(ROUTER)) TRY(route_tokens(s, L, key, error));
        if (s->tp_size > 1 && s->tp_n_experts < E) /* experts split by whole experts */
            gptoss_cuda_tp_mask_experts(s, w->topk_idx, w->topk_weight, T, K);
        /* batch-invariant: the WMMA path's arithmetic from the kernels of batch_invariant.cu,
         * per (token, expert) pair for the smallest steps (no route), streaming or wide over
         * the WMMA path's route otherwise; the WMMA path itself where they refuse the widths,
         * or for large steps with bi_moe_wide=0. Each row's sums in one order whatever the
         * launch shape. */
        const enum gptoss_moe_path moe_path = gptoss_cuda_moe_choose_path(
            s->batch_invariant ? GPTOSS_MOE_WMMA_GEMM : s->tuning.moe_path, T, K, &L->moe);
        int bi_moe = -1; /* the batch-invariant launch shape, or none */
        if (s->batch_invariant)
            bi_moe = T <= s->tuning.bi_moe_pairs ? GPTOSS_BI_MOE_PAIRS
                     : T <= s->tuning.bi_moe_max ? GPTOSS_BI_MOE_SMALL
                     : s->tuning.bi_moe_wide     ? GPTOSS_BI_MOE_WIDE
                                                 : -1;
        /* batch-invariant on the mma GEMM's arithmetic where it is exact and runs (the dense
         * pair kernel for small steps, the sliced GEMM over a route beyond), else on the pair
         * mma's (the TMA pair kernel, the grouped kernel beyond); bitwise the same per pair
         * within either */
        const bool bi_mma =
            s->batch_invariant && s->tuning.bi_moe_mma && gptoss_moe_bi_mma_ok(&L->moe);
        const bool bi_pair = !bi_mma && s->batch_invariant && s->tuning.bi_moe_pair &&
                             gptoss_moe_pair_grouped_ok(&L->moe);
        const bool bi_pair_small = (bi_pair || bi_mma) && T <= s->tuning.bi_moe_pair_tokens;
        if (bi_pair || bi_mma) bi_moe = -1;
        const bool bi_pairs = bi_moe == GPTOSS_BI_MOE_PAIRS;
        if (bi_mma && !bi_pair_small)
            gptoss_cuda_moe_route_rows(w->topk_idx, T, K, L->moe.n_experts,
                                       gptoss_moe_mma_sliced_tile_rows(T, K, L->moe.n_experts),
                                       &route, k);
        else if (bi_pair && !bi_pair_small)
            gptoss_cuda_moe_route_rows(w->topk_idx, T, K, L->moe.n_experts, BI_PAIR_ROUTE_ROWS,
                                       &route, k);
        else if (!bi_pair && !bi_mma && !bi_pairs && moe_path != GPTOSS_MOE_PAIR_GEMV &&
                 moe_path != GPTOSS_MOE_PAIR_MMA) /* the pair paths need none */
            gptoss_cuda_moe_route(w->topk_idx, T, K, L->moe.n_experts, moe_path, &route, k);
        MARK(PART_SMALL);
        if (!ABLATED(MOE) && bi_mma) {
            if (bi_pair_small)
                gptoss_moe_pair_dense(&L->moe, w->t, w->topk_idx, T * K, K, (__half *)w->h, w->y,
                                      k);
            else
                gptoss_moe_mma_gemm_sliced(&L->moe, w->t, &route, T, K, (__half *)w->h, w->y, k);
        } else if (!ABLATED(MOE) && bi_pair) {
            if (bi_pair_small)
                gptoss_moe_pair_tma(&L->moe, w->t, w->topk_idx, T * K, K, (__half *)w->h, w->y, k);
            else
                gptoss_moe_pair_grouped(&L->moe, w->t, &route, T, K, (__half *)w->h, w->y, k);
        } else if (!ABLATED(MOE)) {
            const bool done = bi_moe >= 0 && gptoss_cuda_bi_moe(&L->moe, w->t, T, K, w->topk_idx,
                                                                bi_pairs ? NULL : &route, w->h,
                                                                w->y, bi_moe, k) == 0;
            if (!done && bi_pairs) gptoss_cuda_moe_route(w->topk_idx, T, K, E, moe_path, &route, k);
            if (!done)
                gptoss_cuda_moe(&L->moe, w->t, T, K, w->topk_idx, &route, w->h, w->y, moe_path, k);
        }
        MARK(PART_MOE);
        if (!ABLATED(NORMS)) TRY(residual_next_norm(s, l, key, d_logit, error));
        MARK(PART_SMALL);
    }
    if (s->n_capture > 0) capture_boundary(s, c->n_layers, T);
    /* tensor parallelism: every rank holds the same final rows; rank 0 alone makes logits,
     * or with lm_head split by vocabulary every rank its columns, gathered on rank 0 */
    if (!ABLATED(LM_HEAD) && s->lm_rows < c->vocab_size) {
        TRY(gemm_bf16(s, s->lm_head, w->lm_in, w->lm_part, NL, s->lm_rows, H, false, error));
        TRY(gptoss_cuda_tp_gather_logits(s, NL, error));
    } else if (!ABLATED(LM_HEAD) && s->tp_rank == 0) {
        TRY(gemm_bf16(s, s->lm_head, w->lm_in, w->logits, NL, c->vocab_size, H, false, error));
    }
    MARK(PART_LM_HEAD);
    CUDA_TRY(cudaGetLastError(), "kernel launch");
    return GPTOSS_OK;
}

#undef ABLATED
#undef MARK
#undef TRY

static bool key_equal(const cuda_step_key *a, const cuda_step_key *b) {
    return a->n_tokens == b->n_tokens && a->n_logits == b->n_logits && a->n_seqs == b->n_seqs &&
           a->max_blocks == b->max_blocks && a->splits_full == b->splits_full &&
           a->splits_sliding == b->splits_sliding && a->n_short == b->n_short &&
           a->staged_ints == b->staged_ints;
}

/* Steps of up to this many tokens are captured as graphs when graphs are on (decode). */
#define GRAPH_MAX_TOKENS 64

gptoss_status gptoss_cuda_forward_device(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                         gptoss_error *error) {
    const gptoss_config *c = &s->config;
    int32_t T = plan->n_tokens, NL = plan->n_logits;
    if (T <= 0) return GPTOSS_OK;
    gptoss_status bind_st = gptoss_cuda_device_bind(&s->dev, error);
    if (bind_st) return bind_st;
    /* Graph-sized steps stage their block tables with a power-of-two row stride, so a
     * sequence growing by one page does not change the captured step (and force a new
     * capture every kv_block_size tokens). */
    int32_t stride = plan->max_blocks_per_seq;
    if (T <= GRAPH_MAX_TOKENS) {
        stride = 16;
        while (stride < plan->max_blocks_per_seq)
            stride *= 2;
    }
    int32_t table_ints = plan->n_seqs * stride;
    int32_t old_cap = s->ws.cap_tokens, old_logits = s->ws.cap_logits;
    size_t old_plan = s->ws.plan_ints;
    /* the pinned staging buffer may still feed the previous step's copy */
    CUDA_TRY(cudaStreamSynchronize(s->stream), "previous step");
    gptoss_status st = gptoss_cuda_workspace_ensure(s, T, NL, table_ints, error);
    if (st) return st;
    cuda_workspace *w = &s->ws;
    if (w->cap_tokens != old_cap || w->cap_logits != old_logits || w->plan_ints != old_plan)
        gptoss_cuda_graphs_clear(s);
    int32_t NH = c->n_heads, NKV = c->n_kv_heads, D = c->head_dim;

    /* stage the plan's integer arrays: ids | positions | token_seq | logit rows | tables */
    int32_t *hp = w->plan_host;
    int32_t *h_ids = hp, *h_pos = hp + w->cap_tokens, *h_seq = hp + 2 * w->cap_tokens;
    int32_t *h_logit = hp + 3 * w->cap_tokens, *h_full = h_logit + w->cap_logits,
            *h_slide = h_full + table_ints;
    /* Device token order. Attention runs on tensor cores for runs of at least ATTN_TC_MIN_RUN
     * tokens of one sequence and on the scalar split-K kernel for shorter runs (decode tokens:
     * a tensor-core tile of one-token sequences would compute 16 times over). A step too big
     * for a graph that holds both kinds (decodes beside prefill chunks) is reordered: short
     * runs first, then long runs, each in plan order, so each kernel takes one contiguous token
     * range; logit rows are remapped. Every other kernel of the step works per token. Graph-
     * sized steps keep the plan order and one kernel (tensor cores when the step is
     * prefill-shaped). */
    const int32_t *start = plan->seq_token_start;
    int32_t n_short = T; /* batch-invariant: the short runs take the tensor-core kernel too, one
                            token per block (layer_attention_try_launch) */
    const bool attn_tc = s->tuning.attn_tc;
    if (attn_tc && T > GRAPH_MAX_TOKENS) {
        n_short = 0;
        for (int32_t sq = 0; sq < plan->n_seqs; sq++)
            if (start[sq + 1] - start[sq] < ATTN_TC_MIN_RUN) n_short += start[sq + 1] - start[sq];
    } else if (attn_tc && T >= 64 && T >= 16 * plan->n_seqs) {
        n_short = 0;
    }
    const bool reorder = n_short > 0 && n_short < T;
    st = gptoss_cuda_capture_prepare(s, T, reorder, error);
    if (st) return st;
    if (reorder && plan->n_seqs > w->seq_cap) {
        int32_t *grown = (int32_t *)realloc(w->seq_start, (size_t)plan->n_seqs * sizeof(int32_t));
        if (!grown)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                    "out of memory (token order of %d sequences)",
                                    (int)plan->n_seqs);
        w->seq_start = grown;
        w->seq_cap = plan->n_seqs;
    }
    int32_t next_short = 0, next_long = n_short, max_pos = 0;
    for (int32_t sq = 0; sq < plan->n_seqs; sq++) {
        int32_t len = start[sq + 1] - start[sq], to = start[sq];
        if (reorder) {
            int32_t *next = len < ATTN_TC_MIN_RUN ? &next_short : &next_long;
            to = w->seq_start[sq] = *next;
            *next += len;
        }
        if (reorder && s->n_capture > 0)
            for (int32_t i = 0; i < len; i++)
                s->capture_order[start[sq] + i] = to + i;
        memcpy(h_ids + to, plan->token_ids + start[sq], (size_t)len * 4);
        memcpy(h_pos + to, plan->positions + start[sq], (size_t)len * 4);
        for (int32_t i = 0; i < len; i++) {
            h_seq[to + i] = sq;
            if (plan->positions[start[sq] + i] > max_pos) max_pos = plan->positions[start[sq] + i];
        }
    }
    for (int32_t i = 0; i < NL; i++) {
        int32_t j = plan->logit_token_index[i];
        if (reorder) { /* the sequence holding token j: the last one starting at or before it */
            int32_t lo = 0, hi = plan->n_seqs - 1;
            while (lo < hi) {
                int32_t mid = (lo + hi + 1) / 2;
                if (start[mid] <= j)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            j = w->seq_start[lo] + (j - start[lo]);
        }
        h_logit[i] = j;
    }
    const int32_t *slide_src =
        plan->sliding_block_tables ? plan->sliding_block_tables : plan->block_tables;
    if (stride == plan->max_blocks_per_seq) {
        memcpy(h_full, plan->block_tables, (size_t)table_ints * 4);
        memcpy(h_slide, slide_src, (size_t)table_ints * 4);
    } else {
        const int32_t mb = plan->max_blocks_per_seq;
        for (int32_t sq = 0; sq < plan->n_seqs; sq++) {
            memcpy(h_full + (size_t)sq * stride, plan->block_tables + (size_t)sq * mb,
                   (size_t)mb * 4);
            memcpy(h_slide + (size_t)sq * stride, slide_src + (size_t)sq * mb, (size_t)mb * 4);
            for (int32_t b = mb; b < stride; b++)
                h_full[(size_t)sq * stride + b] = h_slide[(size_t)sq * stride + b] = -1;
        }
    }

    cuda_step_key key;
    memset(&key, 0, sizeof key);
    key.n_tokens = T;
    key.n_logits = NL;
    key.n_seqs = plan->n_seqs;
    key.max_blocks = stride;
    key.staged_ints = (size_t)(h_slide + table_ints - hp);
    key.n_short = n_short;
    /* split-K for the scalar kernel's tokens */
    int32_t NS = n_short > 0 ? n_short : 1;
    key.splits_full = gptoss_cuda_attention_splits(NS, NKV, max_pos + 1, s->dev.n_sms);
    int32_t win_span = (max_pos + 1 < c->sliding_window) ? max_pos + 1 : c->sliding_window;
    key.splits_sliding = gptoss_cuda_attention_splits(NS, NKV, win_span, s->dev.n_sms);
    if (s->batch_invariant) key.splits_full = key.splits_sliding = 1;
    while ((size_t)T * NH * key.splits_full * (D + 2) > w->partial_floats && key.splits_full > 1)
        key.splits_full /= 2;
    while ((size_t)T * NH * key.splits_sliding * (D + 2) > w->partial_floats &&
           key.splits_sliding > 1)
        key.splits_sliding /= 2;

    s->prof_n = 0;
    if (s->tuning.step_timing)
        CUDA_TRY(cudaEventRecord(s->timing_events[0], s->stream), "cudaEventRecord");
    if (!s->tuning.graphs || T > GRAPH_MAX_TOKENS || s->profiling) {
        gptoss_cuda_tp_phase(s, "enqueuing an eager step");
        st = enqueue_step(s, &key, error);
        gptoss_cuda_tp_phase(s, "eager step enqueued");
        return st;
    }

    for (int i = 0; i < GPTOSS_CUDA_MAX_GRAPHS; i++) {
        if (s->graphs[i].valid && key_equal(&s->graphs[i].key, &key)) {
            gptoss_cuda_tp_phase(s, "launching a captured step");
            CUDA_TRY(cudaGraphLaunch(s->graphs[i].exec, s->stream), "cudaGraphLaunch");
            gptoss_cuda_tp_phase(s, "captured step launched");
            return GPTOSS_OK;
        }
    }
    cuda_graph_entry *slot = &s->graphs[s->graph_next];
    s->graph_next = (s->graph_next + 1) % GPTOSS_CUDA_MAX_GRAPHS;
    if (slot->valid) cudaGraphExecDestroy(slot->exec);
    slot->valid = false;
    gptoss_cuda_tp_phase(s, "capturing a step");
    CUDA_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture");
    st = enqueue_step(s, &key, error);
    cudaGraph_t graph = NULL;
    gptoss_cuda_tp_phase(s, "ending a capture");
    cudaError_t ce = cudaStreamEndCapture(s->stream, &graph);
    if (st) {
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "cudaStreamEndCapture");
    gptoss_cuda_tp_phase(s, "instantiating a captured step");
    ce = cudaGraphInstantiate(&slot->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "cudaGraphInstantiate");
    slot->valid = true;
    slot->key = key;
    if (s->tp_size > 1) { /* no rank launches a new graph before every rank captured it */
        st = gptoss_cuda_tp_graph_barrier(s, error);
        if (st) return st;
    }
    gptoss_cuda_tp_phase(s, "launching a new captured step");
    CUDA_TRY(cudaGraphLaunch(slot->exec, s->stream), "cudaGraphLaunch");
    gptoss_cuda_tp_phase(s, "new captured step launched");
    return GPTOSS_OK;
}
