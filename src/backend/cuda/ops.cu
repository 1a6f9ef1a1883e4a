/*
 * ops.cu - the CUDA backend's public face: creating a state (tuning, device, weights,
 * workspace, KV pages, in that order), freeing it, and the ops table's forward calls,
 * including the summary step (the logits reduced to top-n on the GPU).
 *
 * Owns the state struct itself, its stream and cuBLAS handle, and the summary buffers; every
 * other allocation belongs to the file that makes it (weights.cu, kv_pool.cu, forward.cu,
 * diagnostics.cu) and is freed through it.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/diagnostics.h"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "model/config.h"
#include "model/model.h"
#include "util/clock.h"
}

gptoss_status gptoss_cublas_check(cublasStatus_t s, const char *what, gptoss_error *error) {
    if (s == CUBLAS_STATUS_SUCCESS) return GPTOSS_OK;
    return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "cuBLAS: %s failed with status %d", what,
                            (int)s);
}

static gptoss_status check_supported(const gptoss_config *c, gptoss_error *error) {
    if (c->hidden_size % 32 || c->intermediate_size % 32)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: hidden_size (%d) and intermediate_size (%d) must be "
                                "multiples of 32 (MXFP4 groups)",
                                c->hidden_size, c->intermediate_size);
    if (c->hidden_size > 4096 || c->intermediate_size > 4096)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA backend: hidden_size %d / intermediate_size %d exceed the 4096 the "
            "norm and GEMV kernels hold",
            c->hidden_size, c->intermediate_size);
    if (c->head_dim != 16 && c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "CUDA backend: head_dim %d not supported (16, 32, 64 or 128)",
                                c->head_dim);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > 32)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA backend: %d query heads per KV head not supported (at most 32)",
            c->n_kv_heads > 0 ? c->n_heads / c->n_kv_heads : 0);
    if (c->n_experts > 1024 || c->n_experts_per_token > 32 || c->n_experts_per_token > c->n_experts)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA backend: %d experts with top-%d not supported (at most 1024, top-32)",
            c->n_experts, c->n_experts_per_token);
    return GPTOSS_OK;
}

/* Creates everything except the weights' contents: tuning, device, stream, cuBLAS, weight
 * buffers, the workspace asked for, KV pages. n_experts > 0: only the experts [expert0,
 * expert0 + n_experts) are held (a tensor-parallel rank), else all; lm_rows > 0: only the
 * lm_head rows [lm_row0, lm_row0 + lm_rows), else all. */
static gptoss_status state_alloc(const gptoss_config *config, const gptoss_backend_options *options,
                                 int32_t expert0, int32_t n_experts, int32_t lm_row0,
                                 int32_t lm_rows, gptoss_cuda_state **out, gptoss_error *error) {
    gptoss_status st = check_supported(config, error);
    if (st) return st;
    gptoss_cuda_tuning tuning;
    st = gptoss_cuda_tuning_init(&tuning, options->cuda_tuning, error);
    if (st) return st;
    gptoss_cuda_device dev;
    memset(&dev, 0, sizeof dev);
    st = gptoss_cuda_device_open(&dev, options->device, options->cuda_profile, &tuning, error);
    if (st) return st;

    gptoss_cuda_state *s = (gptoss_cuda_state *)calloc(1, sizeof *s);
    if (!s) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of host memory");
    *out = s;
    s->config = *config;
    s->dev = dev;
    s->tuning = tuning;
    s->fp8_layers = options->fp8_layers;
    s->batch_invariant = options->batch_invariant;
    s->tp_size = 1;
    s->tp_expert0 = n_experts > 0 ? expert0 : 0;
    s->tp_n_experts = n_experts > 0 ? n_experts : config->n_experts;
    s->lm_row0 = lm_rows > 0 ? lm_row0 : 0;
    s->lm_rows = lm_rows > 0 ? lm_rows : config->vocab_size;
    st = gptoss_cuda_diagnostics_init(s, error);
    if (st) return st;
    CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    st = gptoss_cublas_check(cublasCreate(&s->cublas), "cublasCreate", error);
    if (st) return st;
    st = gptoss_cublas_check(cublasSetStream(s->cublas, s->stream), "cublasSetStream", error);
    if (st) return st;
    st = gptoss_cuda_device_prepare(&s->dev, config, &s->tuning, options->fp8_layers != 0, error);
    if (st) return st;
    gptoss_cuda_device_log_paths(&s->dev, config, options->fp8_layers != 0,
                                 options->kv_cache_dtype == GPTOSS_KV_CACHE_FP8);
    /* weights in host memory: asked for, or an integrated GPU (one memory: no copy) */
    s->weights_host =
        options->weights_in_host_memory || s->tuning.host_weights || s->dev.integrated;
    if (s->weights_host && n_experts > 0)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "weights in host memory are not supported with tensor parallelism");
    /* the experts held, and the router of every expert */
    gptoss_config held = *config;
    held.n_experts = s->tp_n_experts;
    size_t weight_bytes = gptoss_cuda_weights_bytes(&held, s->fp8_layers, s->weights_host) +
                          (size_t)config->n_layers * (config->n_experts - s->tp_n_experts) *
                              ((size_t)config->hidden_size * 6 + 4);
    /* lm_head rows not held (2 bytes a weight, or about 1 in FP8) */
    weight_bytes -= (size_t)(config->vocab_size - s->lm_rows) * config->hidden_size *
                    ((s->fp8_layers & GPTOSS_FP8_LM_HEAD) ? 1 : 2);
    st = gptoss_cuda_kv_plan(s, options, weight_bytes, error);
    if (st) return st;
    st = gptoss_cuda_weights_alloc(s, error);
    if (st) return st;
    if (options->max_step_tokens > 0) {
        /* the largest step's workspace first, so the KV cache below does not take its memory */
        int32_t T = options->max_step_tokens,
                NL = options->max_step_logits > 0 ? options->max_step_logits : 1;
        st = gptoss_cuda_workspace_ensure(s, T, NL, T * 64, error);
        if (st) return st;
    }
    return gptoss_cuda_kv_alloc(s, options, error);
}

void gptoss_cuda_state_free(gptoss_cuda_state *s) {
    if (!s) return;
    cudaSetDevice(s->dev.ordinal);
    gptoss_cuda_device_unbind(&s->dev);
    if (s->stream) cudaStreamSynchronize(s->stream);
    gptoss_cuda_graphs_clear(s);
    gptoss_cuda_sampler_free(s->sampler);
    gptoss_cuda_capture_free(s);
    gptoss_cuda_diagnostics_free(s);
    gptoss_cuda_kv_free(s);
    gptoss_cuda_weights_free(s);
    free(s->layers);
    cudaFree(s->summary_dev);
    cudaFreeHost(s->summary_host);
    gptoss_cuda_workspace_free(s);
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

gptoss_status gptoss_cuda_state_create_random(const gptoss_config *config,
                                              const gptoss_backend_options *options, uint64_t seed,
                                              gptoss_cuda_state **out, gptoss_error *error) {
    gptoss_cuda_state *s = NULL;
    gptoss_status st = state_alloc(config, options, 0, 0, 0, 0, &s, error);
    if (st == GPTOSS_OK) st = gptoss_cuda_weights_random(s, options, seed, error);
    if (st == GPTOSS_OK) st = gptoss_cuda_weights_finish(s, error);
    if (st) {
        gptoss_cuda_state_free(s);
        return st;
    }
    *out = s;
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_state_create_rank(const gptoss_config *config,
                                            const gptoss_backend_options *options,
                                            const gptoss_weights *w, uint64_t seed, int32_t expert0,
                                            int32_t n_experts, int32_t lm_row0, int32_t lm_rows,
                                            gptoss_cuda_state **out, gptoss_error *error) {
    gptoss_cuda_state *s = NULL;
    gptoss_status st =
        state_alloc(config, options, expert0, n_experts, lm_row0, lm_rows, &s, error);
    if (st == GPTOSS_OK)
        st = w ? gptoss_cuda_weights_upload(s, w, options, error)
               : gptoss_cuda_weights_random(s, options, seed, error);
    if (st == GPTOSS_OK) st = gptoss_cuda_weights_finish(s, error);
    if (st) {
        gptoss_cuda_state_free(s);
        return st;
    }
    *out = s;
    return GPTOSS_OK;
}

/* Whether a backend for these options will keep its weights in host memory (state_alloc decides
 * the same from the device it opens): asked for, the tuning's host_weights, or an integrated
 * GPU. */
static bool host_weights_wanted(const gptoss_backend_options *options) {
    if (options->weights_in_host_memory) return true;
    gptoss_cuda_tuning t;
    gptoss_error ignored;
    if (gptoss_cuda_tuning_init(&t, options->cuda_tuning, &ignored) == GPTOSS_OK && t.host_weights)
        return true;
    int integrated = 0;
    return cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, options->device) ==
               cudaSuccess &&
           integrated;
}

/* ---- the ops table ---------------------------------------------------------------------- */

static gptoss_status cuda_create(const gptoss_model *model, gptoss_backend_options *options,
                                 void **state, gptoss_error *error) {
    gptoss_cuda_state *s = NULL;
    gptoss_status st = GPTOSS_OK;
    /* weights used in place from host memory need the experts in our layout there: a GGUF
     * file's are converted into host buffers once (else the upload converts on the device) */
    if (gptoss_model_weights(model)->ggml_experts && host_weights_wanted(options))
        st = gptoss_model_unpack_experts(model, error);
    if (st == GPTOSS_OK)
        st = gptoss_cuda_state_create_rank(gptoss_model_config(model), options,
                                           gptoss_model_weights(model), 0, 0, 0, 0, 0, &s, error);
    if (st) return st;
    options->n_kv_blocks = s->n_kv_blocks;
    options->n_sliding_kv_blocks = s->n_sliding_kv_blocks;
    options->kv_shared_pages = s->kv_shared;
    *state = s;
    return GPTOSS_OK;
}

static gptoss_status cuda_create_random(const gptoss_config *config,
                                        gptoss_backend_options *options, uint64_t seed,
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

static void cuda_destroy(void *state) {
    gptoss_cuda_state_free((gptoss_cuda_state *)state);
}

static gptoss_status cuda_forward(void *state, const gptoss_batch_plan *plan, float *logits,
                                  gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    gptoss_status st = gptoss_cuda_forward_device(s, plan, error);
    if (st) return st;
    if (plan->n_logits > 0)
        CUDA_TRY(cudaMemcpyAsync(logits, s->ws.logits,
                                 (size_t)plan->n_logits * s->config.vocab_size * sizeof(float),
                                 cudaMemcpyDeviceToHost, s->stream),
                 "logits download");
    CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
    return GPTOSS_OK;
}

static gptoss_status cuda_forward_summary(void *state, const gptoss_batch_plan *plan,
                                          const gptoss_logits_summary *out, gptoss_error *error) {
    gptoss_cuda_state *s = (gptoss_cuda_state *)state;
    if (s->tuning.profile || s->tuning.step_timing)
        return gptoss_cuda_summary_step_measured(s, plan, out, error);
    return gptoss_cuda_summary_step(s, plan, out, error);
}

gptoss_status gptoss_cuda_summary_step(gptoss_cuda_state *s, const gptoss_batch_plan *plan,
                                       const gptoss_logits_summary *out, gptoss_error *error) {
    const bool timing = s->tuning.step_timing && !s->tuning.profile;
    double t0 = timing ? gptoss_now_ms() : 0;
    gptoss_status st = gptoss_cuda_forward_device(s, plan, error);
    if (st) return st;
    if (timing) {
        s->timing_ms[0] += gptoss_now_ms() - t0;
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
            st = gptoss_cuda_alloc(&s->summary_dev, want, "logits summaries", error);
            if (st) return st;
            CUDA_TRY(cudaMemset(s->summary_dev, 0, want), "logits summaries");
            /* mapped: the select kernel writes the summaries straight into host memory, with
             * no copy-engine transfer after it on the critical path of a decode token */
            CUDA_TRY(cudaHostAlloc(&s->summary_host, out_cap, cudaHostAllocMapped),
                     "cudaHostAlloc");
            CUDA_TRY(cudaHostGetDevicePointer(&s->summary_mapped, s->summary_host, 0),
                     "cudaHostGetDevicePointer");
            s->summary_bytes = out_cap;
            s->summary_dev_bytes = want;
            s->summary_scratch = s->summary_dev;
        }
        int32_t *ids = (int32_t *)s->summary_mapped;
        float *vals = (float *)(ids + (size_t)NL * n), *lse = vals + (size_t)NL * n;
        if (gptoss_cuda_logits_summary(s->ws.logits, NL, V, n, s->summary_scratch, ids, vals, lse,
                                       s->stream) != 0)
            return gptoss_set_error(
                error, GPTOSS_ERR_UNSUPPORTED,
                "CUDA: logits summaries support vocabularies up to 1048576 and n_top up to %d",
                GPTOSS_MAX_SUMMARY_TOP);
        CUDA_TRY(cudaGetLastError(), "logits summary");
        gptoss_cuda_prof_mark(s, PART_LM_HEAD);
        for (int32_t i = 0; out->full && i < NL;) {
            if (!out->full[i]) {
                i++;
                continue;
            }
            int32_t j = i;
            while (j < NL && out->full[j])
                j++;
            CUDA_TRY(cudaMemcpyAsync(out->logits + (size_t)i * V, s->ws.logits + (size_t)i * V,
                                     (size_t)(j - i) * V * sizeof(float), cudaMemcpyDeviceToHost,
                                     s->stream),
                     "logits download");
            i = j;
        }
        if (timing) CUDA_TRY(cudaEventRecord(s->timing_events[2], s->stream), "cudaEventRecord");
        if (out->while_running) out->while_running(out->while_running_user);
        double tw = timing ? gptoss_now_ms() : 0;
        CUDA_TRY(cudaStreamSynchronize(s->stream), "forward pass");
        if (timing) s->timing_ms[3] += gptoss_now_ms() - tw;
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

extern "C" const gptoss_backend_ops gptoss_cuda_backend_ops = {
    "cuda",
    cuda_create,
    cuda_create_random,
    cuda_destroy,
    cuda_forward,
    cuda_forward_summary,
    gptoss_cuda_forward_sample,
    true /* converts_ggml_experts: weights.cu converts them on the device */};
