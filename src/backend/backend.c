/*
 * backend.c - the public gptoss_backend_* API: option defaults, plan validation, and dispatch
 * to the chosen backend's ops table (backend.h). Validation lives here, once, so no backend
 * ever sees a plan that could make it read or write outside its KV pools.
 */
#include "backend/backend.h"
#include "backend/cpu/eagle3_forward.h"
#include "backend/tp_split.h"
#include "backend/kv_fp8.h"
#include "backend/sampling_ref.h"
#include "util/error.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct gptoss_backend {
    const gptoss_backend_ops *ops;
    void *state;
    const gptoss_model *model;      /* NULL for random weights */
    gptoss_config config;           /* the shape it runs */
    gptoss_backend_options options; /* defaults and automatic sizes resolved */
    float *scratch;                 /* host logits of backends without forward_summary / _sample */
    size_t scratch_floats;
    gptoss_sample_scratch **samplers; /* [n_samplers] one per drawing thread (no forward_sample) */
    int32_t n_samplers;
    uint32_t *masks; /* [mask_rows, (vocab + 31) / 32] a batch's fill_masks target (same) */
    int32_t mask_rows;
};

static gptoss_status ensure_logits(gptoss_backend *b, int32_t n_logits, gptoss_error *error);

gptoss_backend_options gptoss_backend_options_default(void) {
    gptoss_backend_options o;
    memset(&o, 0, sizeof o);
    o.kind = GPTOSS_BACKEND_CPU;
    o.kv_block_size = 16;
    o.n_kv_blocks = 256;
    o.kv_cache_dtype = GPTOSS_KV_CACHE_BF16;
    return o;
}

size_t gptoss_kv_cache_token_bytes(const gptoss_config *c, gptoss_backend_kind kind,
                                   gptoss_kv_cache_dtype dtype) {
    size_t values = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    if (kind == GPTOSS_BACKEND_CPU) return 2 * values * sizeof(float);
    if (dtype == GPTOSS_KV_CACHE_FP8)
        return 2 * (size_t)c->n_kv_heads * GPTOSS_KV_FP8_HEAD_BYTES(c->head_dim);
    return 2 * values * 2;
}

const char *gptoss_kv_cache_dtype_name(gptoss_kv_cache_dtype dtype) {
    switch (dtype) {
    case GPTOSS_KV_CACHE_BF16:
        return "bf16";
    case GPTOSS_KV_CACHE_FP8:
        return "fp8";
    }
    return "?";
}

bool gptoss_has_cuda(void) {
#ifdef GPTOSS_WITH_CUDA
    return true;
#else
    return false;
#endif
}

gptoss_status gptoss_backend_check_device(gptoss_backend_kind kind, int32_t device,
                                          gptoss_error *error) {
    if (kind == GPTOSS_BACKEND_CPU) return GPTOSS_OK;
    if (kind != GPTOSS_BACKEND_CUDA)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "unknown backend kind %d",
                                (int)kind);
#ifdef GPTOSS_WITH_CUDA
    return gptoss_cuda_check_device(device, error);
#else
    (void)device;
    return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED, "this gptoss was built without CUDA");
#endif
}

int32_t gptoss_cuda_device_count(void) {
#ifdef GPTOSS_WITH_CUDA
    return gptoss_cuda_count_devices();
#else
    return 0;
#endif
}

gptoss_status gptoss_batch_plan_validate(const gptoss_batch_plan *p, const gptoss_config *c,
                                         int32_t block_size, int32_t n_blocks,
                                         int32_t n_sliding_blocks, gptoss_error *error) {
    if (!p) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "plan is NULL");
    if (p->n_tokens < 1 || p->n_seqs < 1 || p->n_seqs > p->n_tokens)
        return gptoss_set_error(
            error, GPTOSS_ERR_INVALID_ARGUMENT,
            "plan: n_tokens (%d) and n_seqs (%d) must be positive with n_seqs <= n_tokens",
            p->n_tokens, p->n_seqs);
    if (!p->token_ids || !p->positions || !p->seq_token_start || !p->seq_n_cached ||
        !p->block_tables)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "plan: a required array is NULL");
    if (p->n_logits < 0 || p->n_logits > 128 * (int64_t)p->n_tokens ||
        (p->n_logits > 0 && !p->logit_token_index))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "plan: n_logits = %d is invalid", p->n_logits);
    if (p->max_blocks_per_seq < 1)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "plan: max_blocks_per_seq must be positive");
    if (p->seq_token_start[0] != 0 || p->seq_token_start[p->n_seqs] != p->n_tokens)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "plan: seq_token_start must run from 0 to n_tokens (%d)",
                                p->n_tokens);
    for (int32_t t = 0; t < p->n_tokens; t++)
        if (p->token_ids[t] < 0 || p->token_ids[t] >= c->vocab_size)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "token id %d at index %d is outside the model's vocabulary [0, %d)",
                p->token_ids[t], t, c->vocab_size);
    for (int32_t s = 0; s < p->n_seqs; s++) {
        int32_t begin = p->seq_token_start[s], end = p->seq_token_start[s + 1];
        if (end <= begin)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "plan: sequence %d has no tokens", s);
        int64_t cached = p->seq_n_cached[s];
        int64_t total = cached + (end - begin);
        if (cached < 0 || total > (int64_t)p->max_blocks_per_seq * block_size)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "plan: sequence %d needs %lld KV slots but its block table holds %lld", s,
                (long long)total, (long long)p->max_blocks_per_seq * block_size);
        if (total > c->max_position_embeddings)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "plan: sequence %d reaches position %lld, beyond max_position_embeddings (%d)", s,
                (long long)total - 1, c->max_position_embeddings);
        for (int32_t t = begin; t < end; t++)
            if (p->positions[t] != cached + (t - begin))
                return gptoss_set_error(
                    error, GPTOSS_ERR_INVALID_ARGUMENT,
                    "plan: token %d of sequence %d has position %d, expected %lld", t, s,
                    p->positions[t], (long long)(cached + (t - begin)));
        /* Full layers read [0, total): every block up to there must exist. Sliding layers read
         * only the last window before each new token. */
        const int32_t *row = p->block_tables + (size_t)s * p->max_blocks_per_seq;
        int64_t last_block = (total - 1) / block_size;
        for (int64_t b = 0; b <= last_block; b++)
            if (row[b] < 0 || row[b] >= n_blocks)
                return gptoss_set_error(
                    error, GPTOSS_ERR_INVALID_ARGUMENT,
                    "plan: sequence %d block table entry %lld = %d is not a block in [0, %d)", s,
                    (long long)b, row[b], n_blocks);
        if (p->sliding_block_tables) {
            const int32_t *srow = p->sliding_block_tables + (size_t)s * p->max_blocks_per_seq;
            int64_t first_pos = cached - (c->sliding_window - 1);
            if (first_pos < 0) first_pos = 0;
            for (int64_t b = first_pos / block_size; b <= last_block; b++)
                if (srow[b] < 0 || srow[b] >= n_sliding_blocks)
                    return gptoss_set_error(
                        error, GPTOSS_ERR_INVALID_ARGUMENT,
                        "plan: sequence %d sliding block table entry %lld = %d is not a block in "
                        "[0, %d)",
                        s, (long long)b, srow[b], n_sliding_blocks);
        }
    }
    for (int32_t i = 0; i < p->n_logits; i++)
        if (p->logit_token_index[i] < 0 || p->logit_token_index[i] >= p->n_tokens)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "plan: logit_token_index[%d] = %d is out of range", i,
                                    p->logit_token_index[i]);
    return GPTOSS_OK;
}

/* Defaults the options and picks the ops table; shared by both ways of creating a backend. */
static gptoss_status backend_prepare(const gptoss_backend_options *options, gptoss_backend **out,
                                     gptoss_error *error) {
    *out = NULL;
    gptoss_backend_options o = options ? *options : gptoss_backend_options_default();
    if (o.kv_block_size <= 0) o.kv_block_size = 16;
    if (o.n_kv_blocks <= 0) o.n_kv_blocks = 256;
    if (o.n_sliding_kv_blocks <= 0) o.n_sliding_kv_blocks = o.n_kv_blocks;
    /* the CPU backend keeps its sliding pages apart: nothing to share */
    if (o.kind == GPTOSS_BACKEND_CPU) o.kv_shared_pages = false;
    if (o.kv_block_size > 4096)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "backend: kv_block_size %d is too large", o.kv_block_size);
    if (!(o.gpu_memory_utilization >= 0 && o.gpu_memory_utilization <= 1))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "backend: gpu_memory_utilization must be in (0, 1], got %g",
                                o.gpu_memory_utilization);
    if (o.max_step_tokens < 0 || o.max_step_logits < 0 ||
        o.max_step_logits > o.max_step_tokens + 1024)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "backend: max_step_tokens %d / max_step_logits %d are invalid",
                                o.max_step_tokens, o.max_step_logits);
    if (o.fp8_layers & ~(uint32_t)GPTOSS_FP8_ALL)
        return gptoss_set_error(
            error, GPTOSS_ERR_INVALID_ARGUMENT,
            "backend: fp8_layers 0x%x has bits other than QKV, O and LM_HEAD (0x%x)",
            (unsigned)o.fp8_layers, (unsigned)GPTOSS_FP8_ALL);
    if (o.fp8_layers && o.kind == GPTOSS_BACKEND_CPU)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "backend: FP8 dense layers are a CUDA backend option; the CPU backend computes "
            "every layer in fp32 (leave fp8_layers at 0)");
    if (o.kv_cache_dtype != GPTOSS_KV_CACHE_BF16 && o.kv_cache_dtype != GPTOSS_KV_CACHE_FP8)
        return gptoss_set_error(
            error, GPTOSS_ERR_INVALID_ARGUMENT,
            "backend: kv_cache_dtype %d is neither GPTOSS_KV_CACHE_BF16 nor GPTOSS_KV_CACHE_FP8",
            (int)o.kv_cache_dtype);
    gptoss_status tp_st = gptoss_tp_check_options(o.tensor_parallel_size, o.kind, error);
    if (tp_st) return tp_st;
    if (o.tensor_parallel_size < 1) o.tensor_parallel_size = 1;
    const gptoss_backend_ops *ops = NULL;
    if (o.kind == GPTOSS_BACKEND_CPU) ops = &gptoss_cpu_backend_ops;
#ifdef GPTOSS_WITH_CUDA
    else if (o.kind == GPTOSS_BACKEND_CUDA)
        ops = o.tensor_parallel_size > 1 ? &gptoss_cuda_tp_backend_ops : &gptoss_cuda_backend_ops;
#endif
    else if (o.kind == GPTOSS_BACKEND_CUDA)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "this gptoss was built without CUDA");
    else
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "unknown backend kind %d",
                                (int)o.kind);
    /* the plan validation divides by and indexes with these */
    assert(o.kv_block_size > 0 && o.n_kv_blocks > 0 && o.n_sliding_kv_blocks > 0);
    gptoss_backend *b = calloc(1, sizeof *b);
    if (!b) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    b->ops = ops;
    b->options = o;
    *out = b;
    return GPTOSS_OK;
}

gptoss_status gptoss_backend_create(const gptoss_model *model,
                                    const gptoss_backend_options *options, gptoss_backend **out,
                                    gptoss_error *error) {
    *out = NULL;
    if (!model) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "backend: no model");
    gptoss_backend *b = NULL;
    gptoss_status st = backend_prepare(options, &b, error);
    if (st != GPTOSS_OK) return st;
    b->model = model;
    b->config = *gptoss_model_config(model);
    if (!b->ops->converts_ggml_experts) st = gptoss_model_unpack_experts(model, error);
    if (st == GPTOSS_OK) st = b->ops->create(model, &b->options, &b->state, error);
    if (st != GPTOSS_OK) {
        free(b);
        return st;
    }
    b->options.cuda_tuning = NULL; /* read during creation only: the caller's string may go */
    assert(b->state);
    *out = b;
    return GPTOSS_OK;
}

gptoss_status gptoss_backend_create_random(const gptoss_config *config,
                                           const gptoss_backend_options *options, uint64_t seed,
                                           gptoss_backend **out, gptoss_error *error) {
    *out = NULL;
    if (!config) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "backend: no config");
    gptoss_backend *b = NULL;
    gptoss_status st = backend_prepare(options, &b, error);
    if (st != GPTOSS_OK) return st;
    if (!b->ops->create_random) {
        st = gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "the %s backend cannot generate random weights; write a checkpoint with "
            "`gptoss make-model` and load it with -m DIR",
            b->ops->name);
        free(b);
        return st;
    }
    b->config = *config;
    st = b->ops->create_random(&b->config, &b->options, seed, &b->state, error);
    if (st != GPTOSS_OK) {
        free(b);
        return st;
    }
    b->options.cuda_tuning = NULL; /* read during creation only: the caller's string may go */
    assert(b->state);
    *out = b;
    return GPTOSS_OK;
}

gptoss_backend_options gptoss_backend_get_options(const gptoss_backend *b) {
    return b ? b->options : gptoss_backend_options_default();
}

const gptoss_config *gptoss_backend_config(const gptoss_backend *b) {
    return b ? &b->config : NULL;
}

gptoss_status gptoss_backend_forward(gptoss_backend *b, const gptoss_batch_plan *plan,
                                     float *logits, gptoss_error *error) {
    if (!b) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "backend is NULL");
    gptoss_status st =
        gptoss_batch_plan_validate(plan, &b->config, b->options.kv_block_size,
                                   b->options.n_kv_blocks, b->options.n_sliding_kv_blocks, error);
    if (st != GPTOSS_OK) return st;
    if (plan->n_logits > 0 && !logits)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "plan asks for logits but the buffer is NULL");
    return b->ops->forward(b->state, plan, logits, error);
}

/* Order of the summary: larger first, NaN as -inf, ties by lower id. */
static bool ranks_before(float a, int32_t ia, float b, int32_t ib) {
    if (isnan(a)) a = -INFINITY;
    if (isnan(b)) b = -INFINITY;
    return a > b || (a == b && ia < ib);
}

void gptoss_logits_summarize_row(const float *row, int32_t vocab_size, int32_t n_top,
                                 int32_t *top_ids, float *top_logits, float *logsumexp) {
    assert(n_top >= 1 && vocab_size >= 1); /* callers check; n_top = 0 would read top_ids[-1] */
    if (n_top > vocab_size) n_top = vocab_size;
    int32_t n_have = 0;
    float max = -INFINITY;
    for (int32_t i = 0; i < vocab_size; i++) {
        float x = row[i];
        if (x > max) max = x;
        if (n_have == n_top && !ranks_before(x, i, row[top_ids[n_top - 1]], top_ids[n_top - 1]))
            continue;
        int32_t pos = n_have < n_top ? n_have++ : n_top - 1;
        while (pos > 0 && ranks_before(x, i, row[top_ids[pos - 1]], top_ids[pos - 1])) {
            top_ids[pos] = top_ids[pos - 1];
            pos--;
        }
        top_ids[pos] = i;
    }
    assert(n_have == n_top);
    for (int32_t j = 0; j < n_have; j++) {
        assert(j == 0 ||
               ranks_before(row[top_ids[j - 1]], top_ids[j - 1], row[top_ids[j]], top_ids[j]));
        top_logits[j] = isnan(row[top_ids[j]]) ? -INFINITY : row[top_ids[j]];
    }
    if (!logsumexp) return;
    if (!isfinite(max)) {
        *logsumexp = max; /* -inf (no finite logit) or +inf */
        return;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < vocab_size; i++)
        if (!isnan(row[i])) sum += exp((double)row[i] - (double)max);
    *logsumexp = (float)((double)max + log(sum));
}

gptoss_status gptoss_backend_forward_summary(gptoss_backend *b, const gptoss_batch_plan *plan,
                                             const gptoss_logits_summary *out,
                                             gptoss_error *error) {
    if (!b) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "backend is NULL");
    gptoss_status st =
        gptoss_batch_plan_validate(plan, &b->config, b->options.kv_block_size,
                                   b->options.n_kv_blocks, b->options.n_sliding_kv_blocks, error);
    if (st != GPTOSS_OK) return st;
    const int32_t NL = plan->n_logits, V = b->config.vocab_size;
    if (NL > 0) {
        if (!out || out->n_top < 1 || out->n_top > GPTOSS_MAX_SUMMARY_TOP || out->n_top > V ||
            !out->top_ids || !out->top_logits)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "logits summary: n_top must be in [1, %d] and the output arrays set",
                GPTOSS_MAX_SUMMARY_TOP);
        bool any_full = false;
        for (int32_t i = 0; out->full && i < NL; i++)
            any_full |= out->full[i] != 0;
        if (any_full && !out->logits)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "logits summary: full rows asked for but the logits buffer is NULL");
    }
    if (b->ops->forward_summary) return b->ops->forward_summary(b->state, plan, out, error);
    if ((st = ensure_logits(b, NL, error)) != GPTOSS_OK) return st;
    st = b->ops->forward(b->state, plan, b->scratch, error);
    if (st != GPTOSS_OK) return st;
    for (int32_t i = 0; i < NL; i++) {
        const float *row = b->scratch + (size_t)i * V;
        gptoss_logits_summarize_row(row, V, out->n_top, out->top_ids + (size_t)i * out->n_top,
                                    out->top_logits + (size_t)i * out->n_top,
                                    out->logsumexp ? &out->logsumexp[i] : NULL);
        if (out->full && out->full[i])
            memcpy(out->logits + (size_t)i * V, row, (size_t)V * sizeof(float));
    }
    return GPTOSS_OK;
}

/* Host logits for n_logits rows (grown, never shrunk). */
static gptoss_status ensure_logits(gptoss_backend *b, int32_t n_logits, gptoss_error *error) {
    size_t need = (size_t)n_logits * (size_t)b->config.vocab_size;
    if (need <= b->scratch_floats) return GPTOSS_OK;
    float *p = realloc(b->scratch, need * sizeof(float));
    if (!p) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (logits)");
    b->scratch = p;
    b->scratch_floats = need;
    return GPTOSS_OK;
}

/* Drawing threads for host sampling: the OpenMP default, at most 8 (each holds ~4 MB of
 * scratch for a 201k vocabulary). Created on first use, kept for the backend's life. */
static gptoss_status ensure_samplers(gptoss_backend *b, gptoss_error *error) {
    if (b->n_samplers > 0) return GPTOSS_OK;
    int n = omp_get_max_threads();
    if (n > 8) n = 8;
    if (n < 1) n = 1;
    b->samplers = calloc((size_t)n, sizeof *b->samplers);
    if (!b->samplers)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (samplers)");
    for (int i = 0; i < n; i++) {
        gptoss_status st =
            gptoss_sample_scratch_create(b->config.vocab_size, &b->samplers[i], error);
        if (st != GPTOSS_OK) {
            for (int k = 0; k < i; k++)
                gptoss_sample_scratch_free(b->samplers[k]);
            free(b->samplers);
            b->samplers = NULL;
            return st;
        }
    }
    b->n_samplers = n;
    return GPTOSS_OK;
}

gptoss_status gptoss_backend_forward_sample(gptoss_backend *b, const gptoss_batch_plan *plan,
                                            const gptoss_sample_batch *batch, gptoss_error *error) {
    if (!b) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "backend is NULL");
    gptoss_status st =
        gptoss_batch_plan_validate(plan, &b->config, b->options.kv_block_size,
                                   b->options.n_kv_blocks, b->options.n_sliding_kv_blocks, error);
    if (st != GPTOSS_OK) return st;
    const int32_t NL = plan->n_logits, V = b->config.vocab_size;
    if (NL > 0 && !batch)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "plan asks for logits but the sample batch is NULL");
    if ((st = gptoss_sample_batch_validate(batch, NL, V, error)) != GPTOSS_OK) return st;
    if (b->ops->forward_sample) return b->ops->forward_sample(b->state, plan, batch, error);
    if ((st = ensure_logits(b, NL, error)) != GPTOSS_OK) return st;
    if (NL > 0 && (st = ensure_samplers(b, error)) != GPTOSS_OK) return st;
    if (NL > 0 && batch->fill_masks && batch->n_allowed_rows > b->mask_rows) {
        const size_t words = ((size_t)V + 31) / 32;
        uint32_t *masks = realloc(b->masks, (size_t)batch->n_allowed_rows * words * sizeof *masks);
        if (!masks)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (masks)");
        b->masks = masks;
        b->mask_rows = batch->n_allowed_rows;
    }
    st = b->ops->forward(b->state, plan, b->scratch, error);
    if (st != GPTOSS_OK || NL == 0) return st;
    /* The masks are built once the logits exist, as the CUDA backend builds them while its
     * forward runs: the same order on every backend. */
    gptoss_sample_batch filled;
    if ((st = gptoss_sample_batch_fill_masks(batch, b->masks, &filled, error)) != GPTOSS_OK)
        return st;
    gptoss_sample_rows(b->scratch, V, NL, &filled, b->samplers, b->n_samplers);
    return GPTOSS_OK;
}

const char *gptoss_backend_name(const gptoss_backend *b) {
    return b ? b->ops->name : "none";
}

void gptoss_backend_free(gptoss_backend *b) {
    if (!b) return;
    b->ops->destroy(b->state);
    for (int32_t i = 0; i < b->n_samplers; i++)
        gptoss_sample_scratch_free(b->samplers[i]);
    free(b->samplers);
    free(b->masks);
    free(b->scratch);
    free(b);
}

/* ---- EAGLE3 drafting: hidden states and embeddings of the target ------------------------ */

static const gptoss_backend_draft_ops *draft_ops(const gptoss_backend *b) {
    if (b->ops == &gptoss_cpu_backend_ops) return &gptoss_cpu_backend_draft_ops;
#ifdef GPTOSS_WITH_CUDA
    if (b->ops == &gptoss_cuda_backend_ops) return &gptoss_cuda_backend_draft_ops;
#endif
    return NULL;
}

gptoss_status gptoss_backend_capture_hidden(gptoss_backend *b, const int32_t *boundaries, int32_t n,
                                            gptoss_error *error) {
    const gptoss_backend_draft_ops *ops = draft_ops(b);
    if (!ops)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "the %s backend does not hand hidden states to a draft head yet; "
                                "--draft eagle3 runs on the CPU backend and on one GPU",
                                b->ops->name);
    for (int32_t i = 0; i < n; i++)
        if (boundaries[i] < 0 || boundaries[i] > b->config.n_layers)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "hidden-state boundary %d is outside [0, %d]", boundaries[i],
                                    b->config.n_layers);
    return ops->capture_hidden(b->state, boundaries, n, error);
}

const float *gptoss_backend_captured_hidden(gptoss_backend *b, int32_t *n_tokens) {
    *n_tokens = 0;
    const gptoss_backend_draft_ops *ops = draft_ops(b);
    return ops ? ops->captured_hidden(b->state, n_tokens) : NULL;
}

gptoss_status gptoss_backend_embed_tokens(gptoss_backend *b, const int32_t *tokens, int32_t n,
                                          float *out, gptoss_error *error) {
    const gptoss_backend_draft_ops *ops = draft_ops(b);
    if (!ops)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "the %s backend cannot read its embedding rows", b->ops->name);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= b->config.vocab_size)
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "token %d is outside the vocabulary", tokens[i]);
    return ops->embed_tokens(b->state, tokens, n, out, error);
}

gptoss_status gptoss_backend_head_exec(gptoss_backend *b, const struct gptoss_eagle3_head *head,
                                       struct gptoss_eagle3_exec *out, gptoss_error *error) {
    const gptoss_backend_draft_ops *ops = draft_ops(b);
    if (ops && ops->head_exec) return ops->head_exec(b->state, head, out, error);
    return gptoss_eagle3_cpu_exec(head, out, error);
}
