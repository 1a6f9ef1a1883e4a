/*
 * kv_plan.c - KV page counts for every front end (see kv_plan.h).
 */
#include "engine/kv_plan.h"

#include "model/config.h"
#include "util/error.h"

#include <unistd.h>

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

int32_t gptoss_kv_min_sliding_blocks(int32_t sliding_window, int32_t block_size) {
    if (sliding_window <= 0 || block_size <= 0) return 0;
    return (int32_t)(ceil_div(sliding_window - 1, block_size) + 1);
}

int64_t gptoss_kv_sliding_pool_blocks(int32_t sliding_window, int32_t block_size,
                                      int32_t max_num_seqs, int32_t max_num_batched_tokens) {
    if (sliding_window <= 0) return 0;
    return (int64_t)max_num_seqs * (ceil_div(sliding_window, block_size) + 2) +
           ceil_div(max_num_batched_tokens, block_size) + 16;
}

gptoss_status gptoss_kv_plan_serve(const gptoss_config *c, const gptoss_kv_plan_options *o,
                                   gptoss_backend_options *bo, gptoss_error *error) {
    int64_t blocks = o->n_kv_blocks;
    if (bo->kind == GPTOSS_BACKEND_CUDA) {
        /* Sliding and full layers share one space of pages (the engine hands each page to
         * one pool at a time), so nothing is set aside for the windows of sequences that may
         * never run. A backend that cannot share (unequal layer counts) clears the flag and
         * uses the separate pool sized here. */
        bo->kv_shared_pages = true;
        if (gptoss_config_n_sliding_layers(c) > 0) {
            int64_t sliding = gptoss_kv_sliding_pool_blocks(
                c->sliding_window, bo->kv_block_size, o->max_num_seqs, o->max_num_batched_tokens);
            if (blocks && sliding > blocks) sliding = blocks;
            bo->n_sliding_kv_blocks = (int32_t)sliding;
        }
        if (blocks == 0)
            bo->gpu_memory_utilization =
                o->memory_fraction > 0 ? o->memory_fraction : GPTOSS_KV_MEMORY_FRACTION_DEFAULT;
        /* The largest step's workspace is allocated before the pool takes the memory. */
        bo->max_step_tokens = o->max_num_batched_tokens;
        bo->max_step_logits = o->max_num_seqs + 1;
    } else if (blocks == 0) {
        double per_block = (double)c->n_layers *
                           (double)gptoss_kv_cache_token_bytes(c, bo->kind, bo->kv_cache_dtype) *
                           bo->kv_block_size;
        double budget = GPTOSS_KV_CPU_BUDGET_BYTES;
        if (o->memory_fraction > 0)
            budget = o->memory_fraction * (double)sysconf(_SC_PHYS_PAGES) *
                     (double)sysconf(_SC_PAGESIZE) * 0.5;
        blocks = (int64_t)(budget / per_block);
        if (o->memory_fraction == 0 && blocks > GPTOSS_KV_CPU_MAX_BLOCKS)
            blocks = GPTOSS_KV_CPU_MAX_BLOCKS;
        if (blocks > (1 << 24)) blocks = 1 << 24;
        if (blocks < 1)
            return gptoss_set_error(error, GPTOSS_ERR_CAPACITY,
                                    "no KV block fits the memory budget; use --kv-blocks N");
    }
    if (blocks) bo->n_kv_blocks = (int32_t)blocks;
    return GPTOSS_OK;
}

void gptoss_kv_plan_context(const gptoss_config *c, int64_t context_tokens,
                            gptoss_backend_options *bo) {
    bo->n_kv_blocks = (int32_t)ceil_div(context_tokens > 0 ? context_tokens : 1, bo->kv_block_size);
    int32_t window = gptoss_config_n_sliding_layers(c) > 0 ? c->sliding_window : 0;
    int32_t least = gptoss_kv_min_sliding_blocks(window, bo->kv_block_size);
    bo->n_sliding_kv_blocks = bo->n_kv_blocks > least ? bo->n_kv_blocks : least;
    bo->kv_shared_pages = false;
}

int32_t gptoss_kv_plan_max_model_len(const gptoss_config *c, int64_t requested,
                                     const gptoss_backend_options *bo, bool *kv_capped) {
    int64_t len = requested > 0 ? requested : c->max_position_embeddings;
    if (len > c->max_position_embeddings) len = c->max_position_embeddings;
    int64_t kv_tokens = (int64_t)bo->n_kv_blocks * bo->kv_block_size;
    *kv_capped = len > kv_tokens;
    if (*kv_capped) len = kv_tokens;
    return (int32_t)len;
}

double gptoss_kv_plan_mib(const gptoss_config *c, const gptoss_backend_options *bo) {
    double per_layer_token = (double)gptoss_kv_cache_token_bytes(c, bo->kind, bo->kv_cache_dtype);
    int32_t n_sliding = gptoss_config_n_sliding_layers(c);
    int32_t sliding_blocks =
        bo->n_sliding_kv_blocks > 0 ? bo->n_sliding_kv_blocks : bo->n_kv_blocks;
    if (bo->kv_shared_pages) sliding_blocks = 0; /* in the full layers' memory */
    double tokens_full = (double)bo->n_kv_blocks * bo->kv_block_size;
    double tokens_sliding = (double)sliding_blocks * bo->kv_block_size;
    return per_layer_token *
           ((c->n_layers - n_sliding) * tokens_full + n_sliding * tokens_sliding) / (1 << 20);
}
