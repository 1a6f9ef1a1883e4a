/*
 * cuda_backend.cu - the CUDA backend: weight upload, KV pools, workspace, and the forward
 * pass of one batch plan as a fixed sequence of kernels (spec section 2).
 *
 * Per step:  plan upload -> embed -> [per layer: attn-norm, QKV GEMM (our GEMV for <= 4
 * tokens, else cuBLAS), bias+RoPE+KV write, paged sink attention, O GEMM (likewise),
 * residual+mlp-norm, router logits (fp32 input) + top-k in one launch, route (not for a
 * single token), MoE (MXFP4)] -> residual+final norm of the logit rows only -> lm_head GEMM.
 * The residual stream is fp32; GEMM inputs are bf16 (as the references round them), except
 * the router, whose discrete choice is made from fp32 activations; every reduction
 * accumulates in fp32. KV pages are bf16, or with kv_cache_dtype FP8 e4m3 codes with one fp32
 * scale per token and KV head (kv_fp8.h; the same kernels, templated on the page type, and
 * then K and V are quantized from fp32 rather than rounded to bf16). The complete list of
 * bf16 roundings (the CPU backend's emulate_bf16_activations mode repeats exactly these, see
 * cpu_backend.c):
 * attention-norm output, K (after bias + RoPE) and V (after bias) in the pages, attention
 * output, MLP-norm output as the experts' input, SwiGLU output, final-norm output. Steps of up to 64 tokens (decode) are captured once
 * per shape as CUDA graphs and replayed (GPTOSS_CUDA_GRAPHS=0 turns that off).
 *
 * Owns: every device allocation of a state (freed by gptoss_cuda_state_free). Must not:
 * print, touch KV pages a plan does not name, or leave the device in a failed state without
 * an error message.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/attention_tc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "model/config.h"
}

gptoss_status gptoss_cuda_error(gptoss_error *error, cudaError_t code, const char *what) {
    gptoss_status status = (code == cudaErrorMemoryAllocation) ? GPTOSS_ERR_OUT_OF_MEMORY : GPTOSS_ERR_BACKEND;
    return gptoss_set_error(error, status, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(code),
                            cudaGetErrorName(code));
}

#define CUDA_TRY(call, what)                                                                   \
    do {                                                                                       \
        cudaError_t cuda_try_code_ = (call);                                                   \
        if (cuda_try_code_ != cudaSuccess) return gptoss_cuda_error(error, cuda_try_code_, what); \
    } while (0)

static gptoss_status cublas_check(cublasStatus_t s, const char *what, gptoss_error *error) {
    if (s == CUBLAS_STATUS_SUCCESS) return GPTOSS_OK;
    return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "cuBLAS: %s failed with status %d", what, (int)s);
}

/* Y[M, N] f32 = X[M, K] bf16 . W[N, K]^T (row-major), fp32 accumulation. Decode shapes of
 * the layer projections go to our GEMV (cuBLAS reaches about half the bandwidth at M = 1);
 * lm_head stays on cuBLAS, which is at its floor already. A matrix held in FP8 (e4m3 with
 * row scales, dense_lowp.h) goes through the e4m3 GEMV in passes of GPTOSS_GEMV_MAX_ROWS
 * rows up to GPTOSS_E4M3_GEMV_MAX_TOKENS rows (lm_head too: its bytes halve), and above
 * that through blocks of rows decoded to bf16 for cuBLAS. */
static gptoss_status gemm_bf16(gptoss_cuda_state *s, gptoss_cuda_dense_weight wt, const bf16 *x, float *y,
                               int32_t m, int32_t n, int32_t k, bool allow_gemv, gptoss_error *error) {
    if (m <= 0) return GPTOSS_OK;
    if (wt.w_e4m3) {
        if ((s->use_gemv && m <= GPTOSS_E4M3_GEMV_MAX_TOKENS) || s->gemv_all) {
            bool ok = true;
            for (int32_t r = 0; r < m && ok; r += GPTOSS_GEMV_MAX_ROWS) {
                int32_t rows = m - r < GPTOSS_GEMV_MAX_ROWS ? m - r : GPTOSS_GEMV_MAX_ROWS;
                ok = gptoss_cuda_gemv_e4m3(wt.w_e4m3, wt.row_scale, x + (size_t)r * k, y + (size_t)r * n, rows, n, k,
                                           s->n_sms, s->stream) == 0;
            }
            if (ok) return GPTOSS_OK;
        }
        return cublas_check(gptoss_cuda_gemm_e4m3(s->cublas, wt.w_e4m3, wt.row_scale, x, y, m, n, k, s->dense_scratch,
                                                  s->dense_scratch_elems, s->stream),
                            "FP8 GEMM (rows decoded to bf16)", error);
    }
    const bf16 *w = wt.w_bf16;
    if (allow_gemv && s->use_gemv && gptoss_cuda_gemv_bf16(w, x, y, m, n, k, s->n_sms, s->stream) == 0)
        return GPTOSS_OK;
    if (s->gemv_all) { /* diagnostics: every row block through the GEMV, no cuBLAS */
        bool ok = true;
        for (int32_t r = 0; r < m && ok; r += GPTOSS_GEMV_MAX_ROWS) {
            int32_t rows = m - r < GPTOSS_GEMV_MAX_ROWS ? m - r : GPTOSS_GEMV_MAX_ROWS;
            ok = gptoss_cuda_gemv_bf16(w, x + (size_t)r * k, y + (size_t)r * n, rows, n, k, s->n_sms, s->stream) == 0;
        }
        if (ok) return GPTOSS_OK;
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, k,
                                     x, CUDA_R_16BF, k, &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    return cublas_check(st, "bf16 GEMM", error);
}

/* ---- configuration checks ------------------------------------------------------------- */

static gptoss_status check_supported(const gptoss_config *c, gptoss_error *error) {
    if (c->hidden_size % 32 || c->intermediate_size % 32)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: hidden_size (%d) and intermediate_size (%d) must be "
                                "multiples of 32 (MXFP4 groups)", c->hidden_size, c->intermediate_size);
    if (c->hidden_size > 4096 || c->intermediate_size > 4096)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: hidden_size %d / intermediate_size %d exceed the 4096 the "
                                "norm and GEMV kernels hold", c->hidden_size, c->intermediate_size);
    if (c->head_dim != 16 && c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: head_dim %d not supported (16, 32, 64 or 128)", c->head_dim);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > 32)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: %d query heads per KV head not supported (at most 32)",
                                c->n_kv_heads > 0 ? c->n_heads / c->n_kv_heads : 0);
    if (c->n_experts > 1024 || c->n_experts_per_token > 32 || c->n_experts_per_token > c->n_experts)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: %d experts with top-%d not supported (at most 1024, top-32)",
                                c->n_experts, c->n_experts_per_token);
    return GPTOSS_OK;
}

/* ---- allocation ------------------------------------------------------------------------- */

/* Device bytes of a dense [n, k] matrix, bf16 or e4m3 with row scales (dense_lowp.h). */
static size_t dense_bytes(size_t n, size_t k, bool fp8) { return fp8 ? gptoss_cuda_e4m3_bytes(n, k) : n * k * 2; }

static size_t layer_weight_bytes(const gptoss_config *c, uint32_t fp8_layers) {
    size_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts;
    size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim, q = (size_t)c->n_heads * c->head_dim;
    size_t b = 0;
    b += 2 * H * 4 + dense_bytes(qkv, H, fp8_layers & GPTOSS_FP8_QKV) + qkv * 4 +
         dense_bytes(H, q, fp8_layers & GPTOSS_FP8_O) + H * 4 + c->n_heads * 4 + E * H * (2 + 4) + E * 4;
    b += E * 2 * I * (H / 32) * 17 + E * 2 * I * 4 + E * H * (I / 32) * 17 + E * H * 4;
    return b + 16 * 256; /* alignment slack */
}

static gptoss_status dev_alloc(void **p, size_t bytes, const char *what, gptoss_error *error) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "CUDA: cannot allocate %.1f MiB for %s (%.1f MiB free of %.1f MiB); use "
                                "fewer KV blocks or a smaller model",
                                bytes / 1048576.0, what, free_b / 1048576.0, total_b / 1048576.0);
    }
    return GPTOSS_OK;
}

static gptoss_status ensure_workspace(gptoss_cuda_state *s, int32_t n_tokens, int32_t n_logits,
                                      int32_t table_ints, gptoss_error *error);

/* A dense [n, k] matrix in the form fp8 asks for (see gptoss_cuda_dense_weight), counted as
 * weights. */
static gptoss_status dense_alloc(gptoss_cuda_state *s, gptoss_cuda_dense_weight *w, size_t n, size_t k, bool fp8,
                                 const char *what, gptoss_error *error) {
    memset(w, 0, sizeof *w);
    if (fp8 && k % 16)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA: %s cannot be held in FP8: rows of %zu weights (a multiple of 16 is needed)",
                                what, k);
    size_t bytes = dense_bytes(n, k, fp8);
    gptoss_status st = dev_alloc(fp8 ? (void **)&w->w_e4m3 : (void **)&w->w_bf16, bytes, what, error);
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
    if ((fp8_layers & GPTOSS_FP8_LM_HEAD) && (V < 4096 ? V : 4096) * H > e) e = (V < 4096 ? V : 4096) * H;
    return e;
}

/* Steps of up to this many tokens route through the fused router (logits + top-k); larger
 * ones through an SGEMM and the top-k kernel. Measured on an H100 (120b, bench -b at depth
 * 512): with the fused router up to 64 tokens, norms/rope/router took 3.2, 3.6 and 4.4 ms of
 * steps of 16, 32 and 64 tokens; with 8, 2.2, 2.2 and 2.3 ms (+7% tokens/s). The fused
 * kernel's last block selects for every token alone, and each block re-reads the router
 * matrix per 8 tokens. GPTOSS_CUDA_ROUTER_FUSED_MAX overrides it (0..64, for A/B runs). */
#define ROUTER_FUSED_MAX_TOKENS 8

/* Creates everything except the weights' contents: stream, cuBLAS, weight buffers, pools. */
static gptoss_status state_alloc(const gptoss_config *config, const gptoss_backend_options *options,
                                 gptoss_cuda_state **out, gptoss_error *error) {
    gptoss_status st = check_supported(config, error);
    if (st) return st;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0)
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "CUDA: no usable GPU (%s)",
                                ce != cudaSuccess ? cudaGetErrorString(ce) : "device count is 0");
    if (options->device < 0 || options->device >= n_dev)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "CUDA: device %d does not exist (this machine has %d)", options->device, n_dev);
    CUDA_TRY(cudaSetDevice(options->device), "cudaSetDevice");
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, options->device), "cudaGetDeviceProperties");
    if (prop.major < 8)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA: %s is compute capability %d.%d; gptoss needs 8.0 or newer (bf16 "
                                "tensor cores)", prop.name, prop.major, prop.minor);

    gptoss_cuda_state *s = (gptoss_cuda_state *)calloc(1, sizeof *s);
    if (!s) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    *out = s;
    s->config = *config;
    s->device = options->device;
    s->n_sms = prop.multiProcessorCount;
    s->fp8_layers = options->fp8_layers;
    s->kv_fp8 = options->kv_cache_dtype == GPTOSS_KV_CACHE_FP8;
    snprintf(s->device_name, sizeof s->device_name, "%s", prop.name);
    s->use_graphs = getenv("GPTOSS_CUDA_GRAPHS") == NULL || strcmp(getenv("GPTOSS_CUDA_GRAPHS"), "0") != 0;
    /* A/B switches for measurements: GPTOSS_CUDA_GEMV=0 sends decode projections to cuBLAS,
     * GPTOSS_CUDA_GEMV=all sends every projection and lm_head through it (no cuBLAS at all),
     * GPTOSS_CUDA_PDL=0 launches every kernel after its predecessor has fully finished,
     * GPTOSS_CUDA_ATTN_TC=0 keeps prefill attention on the scalar kernel,
     * GPTOSS_CUDA_ATTN_DECODE=0 keeps decode attention on it,
     * GPTOSS_CUDA_ROUTER_FUSED_MAX=N moves the fused router's step limit (see above),
     * GPTOSS_CUDA_NORM_ROUTER=0 keeps a decode token's norm and router in two kernels,
     * GPTOSS_CUDA_GEMV_KERNEL=ld runs decode projections on the kernel older GPUs run,
     * GPTOSS_CUDA_MOE_PAIR_KERNEL=wide runs one-token experts on the kernel older GPUs run,
     * =fp8 on the FP8 tensor-core kernel (sm_90a; slower so far, see moe_pair_fp8_kernel),
     * GPTOSS_CUDA_MOE_PATH=1..6 or a name forces a MoE path (kernels/moe/moe.h),
     * GPTOSS_CUDA_QKV_ROPE=0 keeps a decode token's RoPE + KV write out of the QKV projection,
     * GPTOSS_CUDA_ADC_WARPS=4 or 8 runs decode attention with that many warps per block
     * everywhere (default: 8 for small grids where the GPU allows, see ADC_SMALL_GRID),
     * GPTOSS_CUDA_ABLATE=BITS (diagnostics, wrong results) leaves components out of one-token
     * steps (see ablate_mask). */
    s->attn_tc = getenv("GPTOSS_CUDA_ATTN_TC") == NULL || strcmp(getenv("GPTOSS_CUDA_ATTN_TC"), "0") != 0;
    s->attn_decode = getenv("GPTOSS_CUDA_ATTN_DECODE") == NULL || strcmp(getenv("GPTOSS_CUDA_ATTN_DECODE"), "0") != 0;
    s->router_fused_max = ROUTER_FUSED_MAX_TOKENS;
    if (getenv("GPTOSS_CUDA_ROUTER_FUSED_MAX")) {
        int v = atoi(getenv("GPTOSS_CUDA_ROUTER_FUSED_MAX"));
        if (v >= 0 && v <= 64) s->router_fused_max = v;
    }
    s->norm_router = getenv("GPTOSS_CUDA_NORM_ROUTER") == NULL || strcmp(getenv("GPTOSS_CUDA_NORM_ROUTER"), "0") != 0;
    s->qkv_rope = getenv("GPTOSS_CUDA_QKV_ROPE") == NULL || strcmp(getenv("GPTOSS_CUDA_QKV_ROPE"), "0") != 0;
    s->use_gemv = getenv("GPTOSS_CUDA_GEMV") == NULL || strcmp(getenv("GPTOSS_CUDA_GEMV"), "0") != 0;
    gptoss_cuda_set_pdl(prop.major >= 9 &&
                        (getenv("GPTOSS_CUDA_PDL") == NULL || strcmp(getenv("GPTOSS_CUDA_PDL"), "0") != 0));
    s->gemv_all = getenv("GPTOSS_CUDA_GEMV") && strcmp(getenv("GPTOSS_CUDA_GEMV"), "all") == 0;
    if (getenv("GPTOSS_CUDA_MOE_PATH")) s->moe_path = gptoss_cuda_moe_path_parse(getenv("GPTOSS_CUDA_MOE_PATH"));
    if (getenv("GPTOSS_CUDA_PROFILE") && strcmp(getenv("GPTOSS_CUDA_PROFILE"), "0") != 0) {
        for (int i = 0; i < GPTOSS_CUDA_MAX_PROF_EVENTS; i++)
            CUDA_TRY(cudaEventCreate(&s->prof_events[i]), "cudaEventCreate");
        s->serve_profile = true;
    }
    if (getenv("GPTOSS_STEP_TIMING") && strcmp(getenv("GPTOSS_STEP_TIMING"), "0") != 0) {
        for (int i = 0; i < 3; i++) CUDA_TRY(cudaEventCreate(&s->timing_events[i]), "cudaEventCreate");
        s->step_timing = true;
    }
    s->kv_block_size = options->kv_block_size;
    s->n_kv_blocks = options->n_kv_blocks;
    s->n_sliding_kv_blocks = options->n_sliding_kv_blocks > 0 ? options->n_sliding_kv_blocks : options->n_kv_blocks;
    CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    st = cublas_check(cublasCreate(&s->cublas), "cublasCreate", error);
    if (st) return st;
    st = cublas_check(cublasSetStream(s->cublas, s->stream), "cublasSetStream", error);
    if (st) return st;
    CUDA_TRY(gptoss_cuda_moe_prepare(config->hidden_size, config->intermediate_size), "MoE kernel setup");
    CUDA_TRY(gptoss_cuda_router_prepare(config->hidden_size), "router kernel setup");
    CUDA_TRY(gptoss_cuda_gemv_prepare(), "GEMV kernel setup");
    /* the decode attention kernel's shared memory, set before any graph capture; a head size
     * it does not take keeps the scalar kernel */
    if (s->attn_decode && gptoss_cuda_attention_decode_prepare(config->head_dim) != cudaSuccess) {
        cudaGetLastError();
        s->attn_decode = false;
    }
    if (options->fp8_layers) CUDA_TRY(gptoss_cuda_dense_lowp_prepare(), "FP8 GEMV setup");

    const gptoss_config *c = config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    size_t QKV = (NH + 2 * NKV) * D;
    size_t need = V * H * 2 + dense_bytes(V, H, s->fp8_layers & GPTOSS_FP8_LM_HEAD) +
                  (size_t)c->n_layers * layer_weight_bytes(c, s->fp8_layers) +
                  dense_scratch_elems(c, s->fp8_layers) * 2;
    size_t kv_token = gptoss_kv_cache_token_bytes(c, GPTOSS_BACKEND_CUDA, options->kv_cache_dtype); /* K and V */
    size_t n_sliding = 0;
    for (int l = 0; l < c->n_layers; l++) n_sliding += c->layer_is_sliding[l] && c->sliding_window > 0;
    size_t full_block = ((size_t)c->n_layers - n_sliding) * s->kv_block_size * kv_token; /* one page, all layers */
    size_t sliding_block = n_sliding * s->kv_block_size * kv_token;
    /* shared pages: the k-th sliding layer lives in the k-th full layer's buffers, so the
     * sliding pool costs no memory of its own */
    s->kv_shared = options->kv_shared_pages && n_sliding > 0 && 2 * n_sliding == (size_t)c->n_layers;
    if (s->kv_shared) {
        s->n_sliding_kv_blocks = s->n_kv_blocks;
        sliding_block = 0;
    }
    const bool auto_kv = options->gpu_memory_utilization > 0;
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    size_t kv_need = auto_kv ? full_block + (size_t)s->n_sliding_kv_blocks * sliding_block
                             : (size_t)s->n_kv_blocks * full_block + (size_t)s->n_sliding_kv_blocks * sliding_block;
    if (need + kv_need > free_b)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "CUDA: the model needs %.2f GiB of weights and %.2f GiB of KV cache but %s "
                                "has %.2f GiB free; lower n_kv_blocks or use a larger GPU",
                                need / 1073741824.0, kv_need / 1073741824.0, prop.name, free_b / 1073741824.0);

#define ALLOC(ptr, bytes, what)                                                    \
    do {                                                                           \
        st = dev_alloc((void **)&(ptr), (bytes), (what), error);                   \
        if (st) return st;                                                         \
        s->weight_bytes += (bytes);                                                \
    } while (0)
    ALLOC(s->embedding, V * H * 2, "the embedding");
    st = dense_alloc(s, &s->lm_head, V, H, s->fp8_layers & GPTOSS_FP8_LM_HEAD, "lm_head", error);
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
        st = dense_alloc(s, &L->qkv_weight, QKV, H, s->fp8_layers & GPTOSS_FP8_QKV, "QKV weights", error);
        if (st) return st;
        ALLOC(L->qkv_bias, QKV * 4, "QKV bias");
        st = dense_alloc(s, &L->o_weight, H, NH * D, s->fp8_layers & GPTOSS_FP8_O, "O weights", error);
        if (st) return st;
        ALLOC(L->o_bias, H * 4, "O bias");
        ALLOC(L->sinks, NH * 4, "sinks");
        ALLOC(L->router_weight, E * H * 2, "router");
        ALLOC(L->router_weight_f32, E * H * 4, "router");
        ALLOC(L->router_bias, E * 4, "router bias");
        gptoss_cuda_moe_weights *m = &L->moe;
        ALLOC(m->gate_up_blocks, E * 2 * I * (H / 32) * 16, "expert gate_up blocks");
        ALLOC(m->gate_up_scales, E * 2 * I * (H / 32), "expert gate_up scales");
        ALLOC(m->gate_up_bias, E * 2 * I * 4, "expert gate_up bias");
        ALLOC(m->down_blocks, E * H * (I / 32) * 16, "expert down blocks");
        ALLOC(m->down_scales, E * H * (I / 32), "expert down scales");
        ALLOC(m->down_bias, E * H * 4, "expert down bias");
        m->n_experts = (int32_t)E;
        m->hidden = (int32_t)H;
        m->intermediate = (int32_t)I;
        m->swiglu_limit = (float)c->swiglu_limit;
        m->swiglu_alpha = (float)c->swiglu_alpha;
    }
#undef ALLOC
    s->dense_scratch_elems = dense_scratch_elems(c, s->fp8_layers);
    if (s->dense_scratch_elems) {
        st = dev_alloc((void **)&s->dense_scratch, s->dense_scratch_elems * 2, "the FP8 layers' scratch", error);
        if (st) return st;
    }
    if (options->max_step_tokens > 0) {
        /* the largest step's workspace first, so the KV cache below does not take its memory */
        int32_t T = options->max_step_tokens, NL = options->max_step_logits > 0 ? options->max_step_logits : 1;
        st = ensure_workspace(s, T, NL, T * 64, error);
        if (st) return st;
    }
    if (auto_kv) {
        /* Everything allocated so far (ours, other processes', the context) counts against
         * the fraction; keep 512 MiB for cuBLAS, graphs and the plan buffers. */
        CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        double budget = options->gpu_memory_utilization * (double)total_b - (double)(total_b - free_b) -
                        512.0 * (1 << 20) - (double)s->n_sliding_kv_blocks * (double)sliding_block;
        double blocks = full_block ? budget / (double)full_block : 0;
        if (blocks > (double)(1 << 24)) blocks = (double)(1 << 24);
        if (blocks < 1)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                    "CUDA: no KV cache page fits in %.0f%% of %s's %.1f GiB after %.2f GiB of weights "
                                    "and workspace; raise the memory fraction or use a larger GPU",
                                    options->gpu_memory_utilization * 100, prop.name, total_b / 1073741824.0,
                                    (s->weight_bytes + s->ws.bytes) / 1073741824.0);
        s->n_kv_blocks = (int32_t)blocks;
        if (s->kv_shared) s->n_sliding_kv_blocks = s->n_kv_blocks;
    }
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        if (s->kv_shared && L->sliding) continue; /* aliased below */
        size_t slots = (size_t)(L->sliding ? s->n_sliding_kv_blocks : s->n_kv_blocks) * s->kv_block_size * NKV;
        if (s->kv_fp8) { /* codes, then (256-byte aligned) the scales, in one allocation each for K and V */
            size_t codes = (slots * D + 255) & ~(size_t)255, pool = codes + slots * sizeof(float);
            st = dev_alloc((void **)&L->k_fp8, pool, "the KV cache", error);
            if (st) return st;
            st = dev_alloc((void **)&L->v_fp8, pool, "the KV cache", error);
            if (st) return st;
            L->k_scale = (float *)(L->k_fp8 + codes);
            L->v_scale = (float *)(L->v_fp8 + codes);
            s->kv_bytes += 2 * pool;
        } else {
            size_t pool = slots * D * 2;
            st = dev_alloc((void **)&L->k_cache, pool, "the KV cache", error);
            if (st) return st;
            st = dev_alloc((void **)&L->v_cache, pool, "the KV cache", error);
            if (st) return st;
            s->kv_bytes += 2 * pool;
        }
    }
    if (s->kv_shared) { /* sliding layer k takes full layer k's buffers */
        int full = 0;
        for (int l = 0; l < c->n_layers; l++) {
            cuda_layer *L = &s->layers[l];
            if (!L->sliding) continue;
            while (s->layers[full].sliding) full++;
            const cuda_layer *F = &s->layers[full++];
            L->k_cache = F->k_cache;
            L->v_cache = F->v_cache;
            L->k_fp8 = F->k_fp8;
            L->v_fp8 = F->v_fp8;
            L->k_scale = F->k_scale;
            L->v_scale = F->v_scale;
            L->kv_alias = true;
        }
    }
    float inv_freq[512];
    float conc = 1.0f;
    gptoss_rope_yarn_inv_freq(c, inv_freq, &conc);
    s->concentration = conc;
    CUDA_TRY(cudaMemcpy(s->inv_freq, inv_freq, D / 2 * sizeof(float), cudaMemcpyHostToDevice), "upload RoPE");
    return GPTOSS_OK;
}

static void graphs_clear_all(gptoss_cuda_state *s) {
    for (int i = 0; i < GPTOSS_CUDA_MAX_GRAPHS; i++)
        if (s->graphs[i].valid) cudaGraphExecDestroy(s->graphs[i].exec);
    for (int i = 0; i < GPTOSS_CUDA_MAX_PROF_EVENTS; i++)
        if (s->prof_events[i]) cudaEventDestroy(s->prof_events[i]);
    for (int i = 0; i < 3; i++)
        if (s->timing_events[i]) cudaEventDestroy(s->timing_events[i]);
}

/* GPTOSS_CUDA_PROFILE: where the time of served steps went, per kind of step. */
static void print_serve_profile(const gptoss_cuda_state *s) {
    static const char *names[8] = {"MoE", "attention", "dense GEMMs", "lm_head + summary", "norms/rope/router",
                                   "plan upload", "gaps", "(host between steps)"};
    for (int k = 0; k < 2; k++) {
        if (s->serve_prof_steps[k] == 0) continue;
        double steps = s->serve_prof_steps[k], gpu = 0;
        for (int p = 0; p < 7; p++) gpu += s->serve_prof_ms[k][p];
        fprintf(stderr, "profile of %.0f %s steps (%.1f tokens per step), ms per step:\n", steps,
                k == 0 ? "decode-only" : "prefill-carrying", s->serve_prof_tokens[k] / steps);
        for (int p = 0; p < 7; p++)
            fprintf(stderr, "  %-22s %8.3f  (%4.1f%%)\n", names[p], s->serve_prof_ms[k][p] / steps,
                    100.0 * s->serve_prof_ms[k][p] / gpu);
        fprintf(stderr, "  %-22s %8.3f\n  %-22s %8.3f\n", "GPU total", gpu / steps, "wall per forward call",
                s->serve_prof_wall_ms[k] / steps);
    }
}

void gptoss_cuda_state_free(gptoss_cuda_state *s) {
    if (!s) return;
    cudaSetDevice(s->device);
    if (s->stream) cudaStreamSynchronize(s->stream);
    if (s->serve_profile) print_serve_profile(s);
    if (s->step_timing && s->timing_steps > 0) {
        const double n = s->timing_steps, *t = s->timing_ms;
        fprintf(stderr,
                "CUDA step timing, %.0f steps, us per step: host staging + launch %.1f, GPU step %.1f, GPU "
                "summaries + copy %.1f, host wait %.1f, whole call %.1f\n",
                n, t[0] / n * 1e3, t[1] / n * 1e3, t[2] / n * 1e3, t[3] / n * 1e3, t[4] / n * 1e3);
    }
    cudaFree(s->embedding);
    dense_free(&s->lm_head);
    cudaFree(s->dense_scratch);
    cudaFree(s->final_norm);
    cudaFree(s->inv_freq);
    cudaFree(s->summary_dev);
    cudaFreeHost(s->summary_host);
    if (s->layers) {
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
            if (!L->kv_alias) {
                cudaFree(L->k_cache);
                cudaFree(L->v_cache);
                cudaFree(L->k_fp8);
                cudaFree(L->v_fp8);
            }
        }
        free(s->layers);
    }
    graphs_clear_all(s);
    cudaFree(s->ws.base);
    cudaFreeHost(s->ws.plan_host);
    free(s->ws.seq_start);
    cudaFree(s->ws.plan_dev);
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
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
        u->options->progress(u->options->progress_user, "uploading weights", u->total ? (double)u->done / u->total : 1.0);
}

static gptoss_status upload_raw(upload_ctx *u, void *dst, const gptoss_tensor *t, size_t expect_bytes,
                                gptoss_error *error) {
    if (t->n_bytes != expect_bytes)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "CUDA upload: tensor %s has %zu bytes, expected %zu",
                                t->name ? t->name : "?", t->n_bytes, expect_bytes);
    CUDA_TRY(cudaMemcpy(dst, t->data, expect_bytes, cudaMemcpyHostToDevice), "weight upload");
    upload_progress(u, expect_bytes);
    return GPTOSS_OK;
}

/* A dense matrix tensor must be bf16 with n elements. */
static gptoss_status check_bf16_matrix(const gptoss_tensor *t, size_t n, gptoss_error *error) {
    if (t->dtype != GPTOSS_DTYPE_BF16)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED, "CUDA upload: tensor %s is %s; the CUDA backend "
                                "needs BF16 for dense matrices", t->name ? t->name : "?", gptoss_dtype_name(t->dtype));
    if (t->n_bytes != n * 2)
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "CUDA upload: tensor %s has %zu bytes, expected %zu",
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
static gptoss_status upload_dense(upload_ctx *u, gptoss_cuda_dense_weight *dst, size_t row0, size_t rows, size_t k,
                                  const gptoss_tensor *t, gptoss_error *error) {
    if (dst->w_bf16) return upload_bf16_matrix(u, dst->w_bf16 + row0 * k, t, rows * k, error);
    gptoss_cuda_state *s = u->s;
    gptoss_status st = check_bf16_matrix(t, rows * k, error);
    if (st) return st;
    const size_t block = s->dense_scratch_elems / k;
    const unsigned char *src = (const unsigned char *)t->data;
    for (size_t r = 0; r < rows; r += block) {
        size_t n = rows - r < block ? rows - r : block;
        CUDA_TRY(cudaMemcpyAsync(s->dense_scratch, src + r * k * 2, n * k * 2, cudaMemcpyHostToDevice, s->stream),
                 "weight upload");
        gptoss_cuda_quantize_e4m3_rows(s->dense_scratch, (int32_t)n, (int32_t)k, dst->w_e4m3 + (row0 + r) * k,
                                       dst->row_scale + row0 + r, s->stream);
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
        return gptoss_set_error(error, GPTOSS_ERR_MODEL, "CUDA upload: tensor %s: expected %zu BF16 or F32 values",
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
    CUDA_TRY(cudaMemcpy(dst, u->host_f32, n * sizeof(float), cudaMemcpyHostToDevice), "weight upload");
    upload_progress(u, t->n_bytes);
    return GPTOSS_OK;
}

static gptoss_status upload_weights(gptoss_cuda_state *s, const gptoss_weights *w,
                                    const gptoss_backend_options *options, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    upload_ctx u = {s, options, 0, 0, NULL, 0};
    u.total = w->embedding.n_bytes + w->lm_head.n_bytes + w->final_norm.n_bytes;
    for (int l = 0; l < w->n_layers; l++) {
        const gptoss_tensor *ts = &w->layers[l].attn_norm;
        for (size_t i = 0; i < sizeof(gptoss_layer_weights) / sizeof(gptoss_tensor); i++) u.total += ts[i].n_bytes;
    }
    gptoss_status st = GPTOSS_OK;
#define TRY(x)          \
    do {                \
        st = (x);       \
        if (st) goto done; \
    } while (0)
    if (w->n_layers != c->n_layers) {
        st = gptoss_set_error(error, GPTOSS_ERR_MODEL, "CUDA upload: weights have %d layers, config %d",
                              w->n_layers, c->n_layers);
        goto done;
    }
    TRY(upload_bf16_matrix(&u, s->embedding, &w->embedding, V * H, error));
    TRY(upload_dense(&u, &s->lm_head, 0, V, H, &w->lm_head, error));
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
        TRY(upload_raw(&u, (void *)L->moe.gate_up_blocks, &lw->gate_up_blocks, E * 2 * I * (H / 32) * 16, error));
        TRY(upload_raw(&u, (void *)L->moe.gate_up_scales, &lw->gate_up_scales, E * 2 * I * (H / 32), error));
        TRY(upload_vector_f32(&u, (float *)L->moe.gate_up_bias, &lw->gate_up_bias, E * 2 * I, error));
        TRY(upload_raw(&u, (void *)L->moe.down_blocks, &lw->down_blocks, E * H * (I / 32) * 16, error));
        TRY(upload_raw(&u, (void *)L->moe.down_scales, &lw->down_scales, E * H * (I / 32), error));
        TRY(upload_vector_f32(&u, (float *)L->moe.down_bias, &lw->down_bias, E * H, error));
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
static gptoss_status finish_weights(gptoss_cuda_state *s, gptoss_error *error) {
    for (int l = 0; l < s->config.n_layers; l++)
        gptoss_cuda_bf16_to_f32(s->layers[l].router_weight, (size_t)s->config.n_experts * s->config.hidden_size,
                                s->layers[l].router_weight_f32, s->stream);
    unsigned *scratch = NULL;
    gptoss_status st = dev_alloc((void **)&scratch, 16, "a check buffer", error);
    if (st) return st;
    int slow = 0;
    cudaError_t ce = cudaSuccess;
    for (int l = 0; l < s->config.n_layers && ce == cudaSuccess; l++) {
        ce = gptoss_cuda_moe_check_mma(&s->layers[l].moe, s->layers[l].mlp_norm, scratch, s->stream);
        slow += !s->layers[l].moe.mma_ok;
    }
    cudaFree(scratch);
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "MoE weight check");
    if (slow)
        fprintf(stderr, "note: %d of %d MoE layers have scales outside [2^-23, 2^1] (or inputs too wide for fp16) "
                        "and use the slower WMMA/GEMV kernels\n", slow, s->config.n_layers);
    return GPTOSS_OK;
}

/* ---- random weights (bench) --------------------------------------------------------------- */

/* N(0, sd) values for a dense [n, k] matrix: generated in place, or, for an FP8 matrix, in
 * blocks of rows in the scratch and quantized into place (from the values the bf16 matrix
 * gets from the same seed). Enqueued on s->stream; the caller checks for errors. */
static void fill_dense_random(gptoss_cuda_state *s, gptoss_cuda_dense_weight *w, size_t n, size_t k, uint64_t seed,
                              float sd) {
    if (w->w_bf16) {
        gptoss_cuda_fill_normal_bf16(w->w_bf16, n * k, seed, 0.0f, sd, s->stream);
        return;
    }
    const size_t block = s->dense_scratch_elems / k;
    for (size_t r = 0; r < n; r += block) {
        size_t rows = n - r < block ? n - r : block;
        gptoss_cuda_fill_normal_bf16_at(s->dense_scratch, rows * k, r * k, seed, 0.0f, sd, s->stream);
        gptoss_cuda_quantize_e4m3_rows(s->dense_scratch, (int32_t)rows, (int32_t)k, w->w_e4m3 + r * k, w->row_scale + r,
                                       s->stream);
    }
}

gptoss_status gptoss_cuda_state_create_random(const gptoss_config *config,
                                              const gptoss_backend_options *options, uint64_t seed,
                                              gptoss_cuda_state **out, gptoss_error *error) {
    gptoss_cuda_state *s = NULL;
    gptoss_status st = state_alloc(config, options, &s, error);
    if (st) {
        gptoss_cuda_state_free(s);
        return st;
    }
    const gptoss_config *c = config;
    size_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, E = c->n_experts;
    size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
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
    fill_dense_random(s, &s->lm_head, V, H, n++, lin_h);
    gptoss_cuda_fill_normal_f32(s->final_norm, H, n++, 1.0f, 0.05f, k);
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        gptoss_cuda_fill_normal_f32(L->attn_norm, H, n++, 1.0f, 0.05f, k);
        gptoss_cuda_fill_normal_f32(L->mlp_norm, H, n++, 1.0f, 0.05f, k);
        fill_dense_random(s, &L->qkv_weight, QKV, H, n++, lin_h);
        gptoss_cuda_fill_normal_f32(L->qkv_bias, QKV, n++, 0.0f, 0.02f, k);
        fill_dense_random(s, &L->o_weight, H, NH * D, n++, lin_q);
        gptoss_cuda_fill_normal_f32(L->o_bias, H, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_normal_f32(L->sinks, NH, n++, 0.0f, 1.0f, k);
        gptoss_cuda_fill_normal_bf16(L->router_weight, E * H, n++, 0.0f, lin_h, k);
        gptoss_cuda_fill_normal_f32(L->router_bias, E, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.gate_up_blocks, E * 2 * I * (H / 32) * 16, n++, 0, 255, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.gate_up_scales, E * 2 * I * (H / 32), n++, s0_h - 1, s0_h + 1, k);
        gptoss_cuda_fill_normal_f32((float *)L->moe.gate_up_bias, E * 2 * I, n++, 0.0f, 0.02f, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.down_blocks, E * H * (I / 32) * 16, n++, 0, 255, k);
        gptoss_cuda_fill_uniform_u8((uint8_t *)L->moe.down_scales, E * H * (I / 32), n++, s0_i - 1, s0_i + 1, k);
        gptoss_cuda_fill_normal_f32((float *)L->moe.down_bias, E * H, n++, 0.0f, 0.02f, k);
        if (options->progress) options->progress(options->progress_user, "generating weights", (l + 1.0) / c->n_layers);
    }
    cudaError_t ce = cudaStreamSynchronize(k);
    if (ce == cudaSuccess) ce = cudaGetLastError();
    if (ce != cudaSuccess) {
        gptoss_cuda_state_free(s);
        return gptoss_cuda_error(error, ce, "random weight generation");
    }
    st = finish_weights(s, error);
    if (st) {
        gptoss_cuda_state_free(s);
        return st;
    }
    *out = s;
    return GPTOSS_OK;
}

/* ---- workspace ---------------------------------------------------------------------------- */

static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

static gptoss_status ensure_workspace(gptoss_cuda_state *s, int32_t n_tokens, int32_t n_logits,
                                      int32_t table_ints, gptoss_error *error) {
    cuda_workspace *w = &s->ws;
    const gptoss_config *c = &s->config;
    if (n_tokens > w->cap_tokens || n_logits > w->cap_logits) {
        int32_t T = n_tokens > w->cap_tokens ? n_tokens : w->cap_tokens;
        int32_t NL = n_logits > w->cap_logits ? n_logits : w->cap_logits;
        if (T < 16) T = 16;
        if (NL < 1) NL = 1;
        size_t H = c->hidden_size, I = c->intermediate_size, E = c->n_experts, K = c->n_experts_per_token;
        size_t D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
        size_t V = c->vocab_size;
        /* split-K partials exist only while n_tokens * n_kv_heads * splits < 4 * SMs (see
         * gptoss_cuda_attention_splits), i.e. n_tokens * n_heads * splits < 4 * SMs * group */
        size_t part = (size_t)4 * s->n_sms * (NH / NKV) * (D + 2);
        size_t sizes[16] = {
            (size_t)T * H * 4, (size_t)T * H * 2, (size_t)T * H * 4, (size_t)T * QKV * 4, (size_t)T * NH * D * 4,
            (size_t)T * NH * D * 2, (size_t)T * (H > E ? H : E) * 4, (size_t)T * K * 4, (size_t)T * K * 4,
            gptoss_cuda_route_bytes((int32_t)(T * K), (int32_t)E), (size_t)T * K * I * 2, (size_t)T * K * H * 4,
            part * 4, (size_t)NL * H * 2, (size_t)NL * V * 4, 16};
        size_t total = 0;
        for (int i = 0; i < 16; i++) total += align_up(sizes[i]);
        if (w->base) {
            cudaStreamSynchronize(s->stream);
            cudaFree(w->base);
            w->base = NULL;
        }
        gptoss_status st = dev_alloc(&w->base, total, "the step workspace", error);
        if (st) {
            w->cap_tokens = w->cap_logits = 0;
            return st;
        }
        w->bytes = total;
        char *p = (char *)w->base;
        void **slots[16] = {(void **)&w->x, (void **)&w->t, (void **)&w->t_f32, (void **)&w->qkv, (void **)&w->q,
                            (void **)&w->attn, (void **)&w->proj, (void **)&w->topk_idx,
                            (void **)&w->topk_weight, (void **)&w->route_mem, (void **)&w->h,
                            (void **)&w->y, (void **)&w->partial, (void **)&w->lm_in, (void **)&w->logits,
                            (void **)&w->router_done};
        for (int i = 0; i < 16; i++) {
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
        gptoss_status st = dev_alloc((void **)&w->plan_dev, plan_ints * 4, "the plan buffer", error);
        if (st) return st;
        CUDA_TRY(cudaMallocHost((void **)&w->plan_host, plan_ints * 4), "cudaMallocHost");
        w->plan_ints = plan_ints;
    }
    return GPTOSS_OK;
}

/* ---- forward ---------------------------------------------------------------------------- */

static void prof_mark(gptoss_cuda_state *s, int part) {
    if (!s->profiling || s->prof_n >= GPTOSS_CUDA_MAX_PROF_EVENTS) return;
    cudaEventRecord(s->prof_events[s->prof_n], s->stream);
    s->prof_part[s->prof_n++] = part;
}

static void graphs_clear(gptoss_cuda_state *s) {
    for (int i = 0; i < GPTOSS_CUDA_MAX_GRAPHS; i++) {
        if (s->graphs[i].valid) cudaGraphExecDestroy(s->graphs[i].exec);
        s->graphs[i].valid = false;
    }
}

/* Runs of at least this many tokens of one sequence attend on tensor cores (one tile). */
#define ATTN_TC_MIN_RUN 16

/* Attention of one layer over its pages, bf16 or FP8: tokens [n_short, T) on the tensor-core
 * kernel, those before on the split-K kernel (all of them when the tensor-core kernel refuses
 * the shape; see gptoss_cuda_forward_device for the order). Nonzero when no kernel takes it. */
static int layer_attention(gptoss_cuda_state *s, const cuda_layer *L, const cuda_step_key *key, const int32_t *d_pos,
                           const int32_t *d_seq, const int32_t *table) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    const int32_t T = key->n_tokens, NS = key->n_short, NH = c->n_heads, NKV = c->n_kv_heads, D = c->head_dim;
    const size_t q_row = (size_t)NH * D;
    const int32_t window = L->sliding ? c->sliding_window : 0;
    const int32_t splits = L->sliding ? key->splits_sliding : key->splits_full;
    int32_t scalar_end = NS;
    if (NS < T) {
        const float *q = w->q + NS * q_row;
        bf16 *out = w->attn + NS * q_row;
        int rc = s->kv_fp8 ? gptoss_cuda_attention_tc_fp8(q, L->k_fp8, L->v_fp8, L->k_scale, L->v_scale, d_pos + NS,
                                                          d_seq + NS, table, key->max_blocks, s->kv_block_size, L->sinks,
                                                          T - NS, NH, NKV, D, window, out, s->stream)
                           : gptoss_cuda_attention_tc(q, L->k_cache, L->v_cache, d_pos + NS, d_seq + NS, table,
                                                      key->max_blocks, s->kv_block_size, L->sinks, T - NS, NH, NKV, D,
                                                      window, out, s->stream);
        if (rc != 0) scalar_end = T;
    }
    if (scalar_end == 0) return 0;
    if (s->attn_decode) { /* tensor cores; the scalar kernel below for shapes it refuses */
        int rc = s->kv_fp8 ? gptoss_cuda_attention_decode_fp8(w->q, L->k_fp8, L->v_fp8, L->k_scale, L->v_scale, d_pos,
                                                              d_seq, table, key->max_blocks, s->kv_block_size, L->sinks,
                                                              scalar_end, NH, NKV, D, window, splits, w->partial,
                                                              w->attn, s->stream)
                           : gptoss_cuda_attention_decode(w->q, L->k_cache, L->v_cache, d_pos, d_seq, table,
                                                          key->max_blocks, s->kv_block_size, L->sinks, scalar_end, NH,
                                                          NKV, D, window, splits, w->partial, w->attn, s->stream);
        if (rc == 0) return 0;
    }
    if (s->kv_fp8)
        return gptoss_cuda_attention_fp8(w->q, L->k_fp8, L->v_fp8, L->k_scale, L->v_scale, d_pos, d_seq, table,
                                         key->max_blocks, s->kv_block_size, L->sinks, scalar_end, NH, NKV, D, window,
                                         splits, w->partial, w->attn, s->stream);
    return gptoss_cuda_attention(w->q, L->k_cache, L->v_cache, d_pos, d_seq, table, key->max_blocks, s->kv_block_size,
                                 L->sinks, scalar_end, NH, NKV, D, window, splits, w->partial, w->attn, s->stream);
}

/* GPTOSS_CUDA_ABLATE: diagnostics only. Bits of components that one-token steps leave out
 * (1 router, 2 RoPE + KV write, 4 attention, 8 residual norms, 16 MoE, 32 QKV, 64 O,
 * 128 lm_head), so that `gptoss bench` times what each costs inside the decode graph, where
 * --profile (events between kernels, no graphs) cannot look. The logits are garbage. */
static int ablate_mask(void) {
    static int m = -1;
    if (m < 0) m = getenv("GPTOSS_CUDA_ABLATE") ? atoi(getenv("GPTOSS_CUDA_ABLATE")) : 0;
    return m;
}
/* Enqueues one whole step on s->stream from the staged plan (no host work depends on the
 * plan's contents here, so the same sequence can be captured once and replayed). */
static gptoss_status enqueue_step(gptoss_cuda_state *s, const cuda_step_key *key, gptoss_error *error) {
    const gptoss_config *c = &s->config;
    cuda_workspace *w = &s->ws;
    int32_t T = key->n_tokens, NL = key->n_logits;
    int32_t table_ints = key->n_seqs * key->max_blocks;
    int32_t H = c->hidden_size, E = c->n_experts, K = c->n_experts_per_token, D = c->head_dim;
    int32_t NH = c->n_heads, NKV = c->n_kv_heads, QKV = (NH + 2 * NKV) * D;
    float eps = (float)c->rms_norm_eps;
    cudaStream_t k = s->stream;
    gptoss_status st;
    prof_mark(s, PART_GAPS);
    CUDA_TRY(cudaMemcpyAsync(w->plan_dev, w->plan_host, key->staged_ints * 4, cudaMemcpyHostToDevice, k), "plan upload");
    prof_mark(s, PART_UPLOAD);
    const int32_t *d_ids = w->plan_dev, *d_pos = w->plan_dev + w->cap_tokens, *d_seq = w->plan_dev + 2 * w->cap_tokens;
    const int32_t *d_logit = w->plan_dev + 3 * w->cap_tokens;
    const int32_t *d_full = d_logit + w->cap_logits, *d_slide = d_full + table_ints;
    gptoss_cuda_route route;
    gptoss_cuda_route_bind(w->route_mem, T * K, E, &route);

    gptoss_cuda_embed(s->embedding, d_ids, T, H, w->x, k);
    gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, NULL, NULL, 0, s->layers[0].attn_norm, eps, NULL, T, H, w->t, NULL, k);
    prof_mark(s, PART_SMALL);
    const int AB = key->n_tokens == 1 ? ablate_mask() : 0;
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &s->layers[l];
        const int32_t *table = L->sliding ? d_slide : d_full;
        /* one token, bf16 pages: RoPE and the KV write in the projection's epilogue */
        const bool qkv_rope = T == 1 && s->qkv_rope && s->use_gemv && !s->kv_fp8 && L->qkv_weight.w_bf16 &&
                              !(AB & (2 | 32)) && /* neither RoPE nor QKV ablated */
                              gptoss_cuda_qkv_rope_one(L->qkv_weight.w_bf16, w->t, L->qkv_bias, d_pos, d_seq,
                                                       s->inv_freq, s->concentration, NH, NKV, D, H, table,
                                                       key->max_blocks, s->kv_block_size, w->q, L->k_cache,
                                                       L->v_cache, k) == 0;
        st = (AB & 32) || qkv_rope ? GPTOSS_OK : gemm_bf16(s, L->qkv_weight, w->t, w->qkv, T, QKV, H, true, error);
        if (st) return st;
        prof_mark(s, PART_DENSE);
        if ((AB & 2) || qkv_rope) {
        } else if (s->kv_fp8)
            gptoss_cuda_rope_kv_write_fp8(w->qkv, L->qkv_bias, d_pos, d_seq, s->inv_freq, s->concentration, T, NH,
                                          NKV, D, table, key->max_blocks, s->kv_block_size, w->q, L->k_fp8, L->v_fp8,
                                          L->k_scale, L->v_scale, k);
        else
            gptoss_cuda_rope_kv_write(w->qkv, L->qkv_bias, d_pos, d_seq, s->inv_freq, s->concentration, T, NH, NKV,
                                      D, table, key->max_blocks, s->kv_block_size, w->q, L->k_cache, L->v_cache, k);
        prof_mark(s, PART_SMALL);
        if (!(AB & 4) && layer_attention(s, L, key, d_pos, d_seq, table) != 0)
            return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED, "CUDA: attention shape not supported");
        prof_mark(s, PART_ATTENTION);
        st = (AB & 64) ? GPTOSS_OK : gemm_bf16(s, L->o_weight, w->attn, w->proj, T, H, NH * D, true, error);
        if (st) return st;
        prof_mark(s, PART_DENSE);
        /* one decode token: residual, norm and router in one kernel; its logits go to w->t_f32,
         * which only the unfused router reads (not w->proj: that is the kernel's input) */
        bool fused = T == 1 && s->norm_router && !(AB & 1) && (int64_t)w->cap_tokens * H >= E &&
                     gptoss_cuda_norm_router_one(w->x, w->proj, L->o_bias, L->mlp_norm, eps, H, w->t,
                                                 L->router_weight, L->router_bias, E, K, w->t_f32, w->router_done,
                                                 w->topk_idx, w->topk_weight, k) == 0;
        if (!fused && !(AB & 8))
            gptoss_cuda_residual_rmsnorm(w->x, w->proj, L->o_bias, NULL, NULL, 0, L->mlp_norm, eps, NULL, T, H, w->t,
                                         w->t_f32, k);
        if (fused || (AB & 1)) {
        } else if (T <= s->router_fused_max) {
            gptoss_cuda_router(w->t_f32, L->router_weight, L->router_bias, T, E, H, K, w->proj, w->router_done,
                               w->topk_idx, w->topk_weight, k);
        } else { /* the fused kernel selects in its last block alone: too serial for big steps */
            /* fp32 SGEMM (no TF32: cuBLAS's default math mode) on the fp32 copy of the
             * router: the logits kernel re-reads the matrix per 8 tokens (36 ms of a 2048-token
             * 120b prefill); bias added by the top-k kernel */
            const float one = 1.0f, zero = 0.0f;
            cublasStatus_t cs = cublasSgemm(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, E, T, H, &one, L->router_weight_f32,
                                            H, w->t_f32, H, &zero, w->proj, E);
            if (cs != CUBLAS_STATUS_SUCCESS) return cublas_check(cs, "router SGEMM", error);
            gptoss_cuda_router_topk(w->proj, L->router_bias, T, E, K, w->topk_idx, w->topk_weight, k);
        }
        enum gptoss_moe_path moe_path = gptoss_cuda_moe_choose_path(s->moe_path, T, K, &L->moe);
        if (moe_path != GPTOSS_MOE_PAIR_GEMV && moe_path != GPTOSS_MOE_PAIR_MMA) /* the pair paths need none */
            gptoss_cuda_moe_route(w->topk_idx, T, K, E, moe_path, &route, k);
        prof_mark(s, PART_SMALL);
        if (!(AB & 16)) gptoss_cuda_moe(&L->moe, w->t, T, K, w->topk_idx, &route, w->h, w->y, moe_path, k);
        prof_mark(s, PART_MOE);
        if (AB & 8) {
        } else if (l + 1 < c->n_layers) {
            gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, w->y, w->topk_weight, K, s->layers[l + 1].attn_norm, eps,
                                         NULL, T, H, w->t, NULL, k);
        } else {
            /* only the rows that want logits: residual update + final norm, gathered */
            gptoss_cuda_residual_rmsnorm(w->x, NULL, NULL, w->y, w->topk_weight, K, s->final_norm, eps, d_logit,
                                         NL, H, w->lm_in, NULL, k);
        }
        prof_mark(s, PART_SMALL);
    }
    st = (AB & 128) ? GPTOSS_OK : gemm_bf16(s, s->lm_head, w->lm_in, w->logits, NL, c->vocab_size, H, false, error);
    if (st) return st;
    prof_mark(s, PART_LM_HEAD);
    CUDA_TRY(cudaGetLastError(), "kernel launch");
    return GPTOSS_OK;
}

static bool key_equal(const cuda_step_key *a, const cuda_step_key *b) {
    return a->n_tokens == b->n_tokens && a->n_logits == b->n_logits && a->n_seqs == b->n_seqs &&
           a->max_blocks == b->max_blocks && a->splits_full == b->splits_full &&
           a->splits_sliding == b->splits_sliding && a->n_short == b->n_short && a->staged_ints == b->staged_ints;
}

/* Steps of up to this many tokens are captured as graphs when graphs are on (decode). */
#define GRAPH_MAX_TOKENS 64

gptoss_status gptoss_cuda_forward_device(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                         gptoss_error *error) {
    const gptoss_config *c = &s->config;
    int32_t T = plan->n_tokens, NL = plan->n_logits;
    if (T <= 0) return GPTOSS_OK;
    CUDA_TRY(cudaSetDevice(s->device), "cudaSetDevice");
    /* Graph-sized steps stage their block tables with a power-of-two row stride, so a
     * sequence growing by one page does not change the captured step (and force a new
     * capture every kv_block_size tokens). */
    int32_t stride = plan->max_blocks_per_seq;
    if (T <= GRAPH_MAX_TOKENS) {
        stride = 16;
        while (stride < plan->max_blocks_per_seq) stride *= 2;
    }
    int32_t table_ints = plan->n_seqs * stride;
    int32_t old_cap = s->ws.cap_tokens, old_logits = s->ws.cap_logits;
    size_t old_plan = s->ws.plan_ints;
    /* the pinned staging buffer may still feed the previous step's copy */
    CUDA_TRY(cudaStreamSynchronize(s->stream), "previous step");
    gptoss_status st = ensure_workspace(s, T, NL, table_ints, error);
    if (st) return st;
    cuda_workspace *w = &s->ws;
    if (w->cap_tokens != old_cap || w->cap_logits != old_logits || w->plan_ints != old_plan) graphs_clear(s);
    int32_t NH = c->n_heads, NKV = c->n_kv_heads, D = c->head_dim;

    /* stage the plan's integer arrays: ids | positions | token_seq | logit rows | tables */
    int32_t *hp = w->plan_host;
    int32_t *h_ids = hp, *h_pos = hp + w->cap_tokens, *h_seq = hp + 2 * w->cap_tokens;
    int32_t *h_logit = hp + 3 * w->cap_tokens, *h_full = h_logit + w->cap_logits, *h_slide = h_full + table_ints;
    /* Device token order. Attention runs on tensor cores for runs of at least ATTN_TC_MIN_RUN
     * tokens of one sequence and on the scalar split-K kernel for shorter runs (decode tokens:
     * a tensor-core tile of one-token sequences would compute 16 times over). A step too big
     * for a graph that holds both kinds (decodes beside prefill chunks) is reordered: short
     * runs first, then long runs, each in plan order, so each kernel takes one contiguous token
     * range; logit rows are remapped. Every other kernel of the step works per token. Graph-
     * sized steps keep the plan order and one kernel (tensor cores when the step is
     * prefill-shaped). */
    const int32_t *start = plan->seq_token_start;
    int32_t n_short = T;
    if (s->attn_tc && T > GRAPH_MAX_TOKENS) {
        n_short = 0;
        for (int32_t sq = 0; sq < plan->n_seqs; sq++)
            if (start[sq + 1] - start[sq] < ATTN_TC_MIN_RUN) n_short += start[sq + 1] - start[sq];
    } else if (s->attn_tc && T >= 64 && T >= 16 * plan->n_seqs) {
        n_short = 0;
    }
    const bool reorder = n_short > 0 && n_short < T;
    if (reorder && plan->n_seqs > w->seq_cap) {
        int32_t *grown = (int32_t *)realloc(w->seq_start, (size_t)plan->n_seqs * sizeof(int32_t));
        if (!grown) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (token order of %d sequences)",
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
                if (start[mid] <= j) lo = mid;
                else hi = mid - 1;
            }
            j = w->seq_start[lo] + (j - start[lo]);
        }
        h_logit[i] = j;
    }
    const int32_t *slide_src = plan->sliding_block_tables ? plan->sliding_block_tables : plan->block_tables;
    if (stride == plan->max_blocks_per_seq) {
        memcpy(h_full, plan->block_tables, (size_t)table_ints * 4);
        memcpy(h_slide, slide_src, (size_t)table_ints * 4);
    } else {
        const int32_t mb = plan->max_blocks_per_seq;
        for (int32_t sq = 0; sq < plan->n_seqs; sq++) {
            memcpy(h_full + (size_t)sq * stride, plan->block_tables + (size_t)sq * mb, (size_t)mb * 4);
            memcpy(h_slide + (size_t)sq * stride, slide_src + (size_t)sq * mb, (size_t)mb * 4);
            for (int32_t b = mb; b < stride; b++) h_full[(size_t)sq * stride + b] = h_slide[(size_t)sq * stride + b] = -1;
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
    key.splits_full = gptoss_cuda_attention_splits(NS, NKV, max_pos + 1, s->n_sms);
    int32_t win_span = (max_pos + 1 < c->sliding_window) ? max_pos + 1 : c->sliding_window;
    key.splits_sliding = gptoss_cuda_attention_splits(NS, NKV, win_span, s->n_sms);
    while ((size_t)T * NH * key.splits_full * (D + 2) > w->partial_floats && key.splits_full > 1) key.splits_full /= 2;
    while ((size_t)T * NH * key.splits_sliding * (D + 2) > w->partial_floats && key.splits_sliding > 1)
        key.splits_sliding /= 2;

    s->prof_n = 0;
    if (s->step_timing) CUDA_TRY(cudaEventRecord(s->timing_events[0], s->stream), "cudaEventRecord");
    if (!s->use_graphs || T > GRAPH_MAX_TOKENS || s->profiling) return enqueue_step(s, &key, error);

    for (int i = 0; i < GPTOSS_CUDA_MAX_GRAPHS; i++) {
        if (s->graphs[i].valid && key_equal(&s->graphs[i].key, &key)) {
            CUDA_TRY(cudaGraphLaunch(s->graphs[i].exec, s->stream), "cudaGraphLaunch");
            return GPTOSS_OK;
        }
    }
    cuda_graph_entry *slot = &s->graphs[s->graph_next];
    s->graph_next = (s->graph_next + 1) % GPTOSS_CUDA_MAX_GRAPHS;
    if (slot->valid) cudaGraphExecDestroy(slot->exec);
    slot->valid = false;
    CUDA_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    st = enqueue_step(s, &key, error);
    cudaGraph_t graph = NULL;
    cudaError_t ce = cudaStreamEndCapture(s->stream, &graph);
    if (st) {
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "cudaStreamEndCapture");
    ce = cudaGraphInstantiate(&slot->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess) return gptoss_cuda_error(error, ce, "cudaGraphInstantiate");
    slot->valid = true;
    slot->key = key;
    CUDA_TRY(cudaGraphLaunch(slot->exec, s->stream), "cudaGraphLaunch");
    return GPTOSS_OK;
}

/* ---- the ops table ---------------------------------------------------------------------- */

static gptoss_status cuda_create(const gptoss_model *model, gptoss_backend_options *options, void **state,
                                 gptoss_error *error) {
    gptoss_cuda_state *s = NULL;
    gptoss_status st = state_alloc(gptoss_model_config(model), options, &s, error);
    if (st == GPTOSS_OK) st = upload_weights(s, gptoss_model_weights(model), options, error);
    if (st == GPTOSS_OK) st = finish_weights(s, error);
    if (st) {
        gptoss_cuda_state_free(s);
        return st;
    }
    options->n_kv_blocks = s->n_kv_blocks;
    options->n_sliding_kv_blocks = s->n_sliding_kv_blocks;
    options->kv_shared_pages = s->kv_shared;
    *state = s;
    return GPTOSS_OK;
}

static gptoss_status cuda_create_random(const gptoss_config *config, gptoss_backend_options *options, uint64_t seed,
                                        void **state, gptoss_error *error) {
    gptoss_cuda_state *s = NULL;
    gptoss_status st = gptoss_cuda_state_create_random(config, options, seed, &s, error);
    if (st) return st;
    options->n_kv_blocks = s->n_kv_blocks;
    options->n_sliding_kv_blocks = s->n_sliding_kv_blocks;
    options->kv_shared_pages = s->kv_shared;
    *state = s;
    return GPTOSS_OK;
}

static void cuda_destroy(void *state) { gptoss_cuda_state_free((gptoss_cuda_state *)state); }

static gptoss_status cuda_forward(void *state, const gptoss_batch_plan *plan, float *logits, gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    gptoss_status st = gptoss_cuda_forward_device(s, plan, error);
    if (st) return st;
    if (plan->n_logits > 0)
        CUDA_TRY(cudaMemcpyAsync(logits, s->ws.logits, (size_t)plan->n_logits * s->config.vocab_size * sizeof(float),
                                 cudaMemcpyDeviceToHost, s->stream),
                 "logits download");
    CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
    return GPTOSS_OK;
}

/* The step, then the summaries reduced on the GPU: n_top ids and values and one float per
 * row cross to the host, plus only the rows asked for whole. */
static gptoss_status summary_step(gptoss_cuda_state *s, const gptoss_batch_plan *plan, const gptoss_logits_summary *out,
                                  gptoss_error *error);

static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static gptoss_status cuda_forward_summary(void *state, const gptoss_batch_plan *plan, const gptoss_logits_summary *out,
                                          gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    if (s->step_timing && !s->serve_profile) {
        double t0 = wall_ms();
        gptoss_status st = summary_step(s, plan, out, error);
        if (st) return st;
        float a = 0, b = 0;
        cudaEventElapsedTime(&a, s->timing_events[0], s->timing_events[1]);
        cudaEventElapsedTime(&b, s->timing_events[1], s->timing_events[2]);
        s->timing_ms[1] += a;
        s->timing_ms[2] += b;
        s->timing_ms[4] += wall_ms() - t0;
        s->timing_steps += 1;
        return GPTOSS_OK;
    }
    if (!s->serve_profile) return summary_step(s, plan, out, error);
    double t0 = wall_ms();
    s->profiling = true;
    gptoss_status st = summary_step(s, plan, out, error);
    s->profiling = false;
    if (st) return st;
    int k = plan->n_tokens == plan->n_seqs ? 0 : 1;
    for (int i = 1; i < s->prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, s->prof_events[i - 1], s->prof_events[i]);
        s->serve_prof_ms[k][s->prof_part[i]] += ms;
    }
    s->serve_prof_steps[k] += 1;
    s->serve_prof_tokens[k] += plan->n_tokens;
    s->serve_prof_wall_ms[k] += wall_ms() - t0;
    return GPTOSS_OK;
}

static gptoss_status summary_step(gptoss_cuda_state *s, const gptoss_batch_plan *plan, const gptoss_logits_summary *out,
                                  gptoss_error *error) {
    const bool timing = s->step_timing && !s->serve_profile;
    double t0 = timing ? wall_ms() : 0;
    gptoss_status st = gptoss_cuda_forward_device(s, plan, error);
    if (st) return st;
    if (timing) {
        s->timing_ms[0] += wall_ms() - t0;
        CUDA_TRY(cudaEventRecord(s->timing_events[1], s->stream), "cudaEventRecord");
    }
    const int32_t NL = plan->n_logits, V = s->config.vocab_size;
    if (NL > 0) {
        const int32_t n = out->n_top;
        size_t bytes = (size_t)NL * (2 * (size_t)n + 1) * 4; /* what comes back */
        int32_t rows_cap = s->ws.cap_logits > NL ? s->ws.cap_logits : NL;
        size_t out_cap = (size_t)rows_cap * (2 * GPTOSS_MAX_SUMMARY_TOP + 1) * 4;
        size_t want = gptoss_cuda_logits_summary_scratch(rows_cap, V);
        if (bytes > s->summary_bytes || want > s->summary_dev_bytes) {
            CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
            cudaFree(s->summary_dev);
            cudaFreeHost(s->summary_host);
            s->summary_dev = s->summary_host = NULL;
            s->summary_bytes = s->summary_dev_bytes = 0;
            st = dev_alloc(&s->summary_dev, want, "logits summaries", error);
            if (st) return st;
            CUDA_TRY(cudaMemset(s->summary_dev, 0, want), "logits summaries");
            /* mapped: the select kernel writes the summaries straight into host memory, with
             * no copy-engine transfer after it on the critical path of a decode token */
            CUDA_TRY(cudaHostAlloc(&s->summary_host, out_cap, cudaHostAllocMapped), "cudaHostAlloc");
            CUDA_TRY(cudaHostGetDevicePointer(&s->summary_mapped, s->summary_host, 0), "cudaHostGetDevicePointer");
            s->summary_bytes = out_cap;
            s->summary_dev_bytes = want;
            s->summary_scratch = s->summary_dev;
        }
        int32_t *ids = (int32_t *)s->summary_mapped;
        float *vals = (float *)(ids + (size_t)NL * n), *lse = vals + (size_t)NL * n;
        if (gptoss_cuda_logits_summary(s->ws.logits, NL, V, n, s->summary_scratch, ids, vals, lse, s->stream) != 0)
            return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                    "CUDA: logits summaries support vocabularies up to 1048576 and n_top up to %d",
                                    GPTOSS_MAX_SUMMARY_TOP);
        CUDA_TRY(cudaGetLastError(), "logits summary");
        prof_mark(s, PART_LM_HEAD);
        for (int32_t i = 0; out->full && i < NL;) {
            if (!out->full[i]) {
                i++;
                continue;
            }
            int32_t j = i;
            while (j < NL && out->full[j]) j++;
            CUDA_TRY(cudaMemcpyAsync(out->logits + (size_t)i * V, s->ws.logits + (size_t)i * V,
                                     (size_t)(j - i) * V * sizeof(float), cudaMemcpyDeviceToHost, s->stream),
                     "logits download");
            i = j;
        }
        if (timing) CUDA_TRY(cudaEventRecord(s->timing_events[2], s->stream), "cudaEventRecord");
        if (out->while_running) out->while_running(out->while_running_user);
        double tw = timing ? wall_ms() : 0;
        CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
        if (timing) s->timing_ms[3] += wall_ms() - tw;
        const int32_t *h_ids = (const int32_t *)s->summary_host;
        const float *h_vals = (const float *)(h_ids + (size_t)NL * n);
        memcpy(out->top_ids, h_ids, (size_t)NL * n * 4);
        memcpy(out->top_logits, h_vals, (size_t)NL * n * 4);
        if (out->logsumexp) memcpy(out->logsumexp, h_vals + (size_t)NL * n, (size_t)NL * 4);
        return GPTOSS_OK;
    }
    if (timing) CUDA_TRY(cudaEventRecord(s->timing_events[2], s->stream), "cudaEventRecord");
    if (out->while_running) out->while_running(out->while_running_user);
    CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
    return GPTOSS_OK;
}

extern "C" const gptoss_backend_ops gptoss_cuda_backend_ops = {"cuda", cuda_create, cuda_create_random, cuda_destroy,
                                                               cuda_forward, cuda_forward_summary};
