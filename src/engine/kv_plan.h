/*
 * kv_plan.h - how many KV pages a front end asks the backend for, and how they are split
 * between the full-attention and the sliding-window layers.
 *
 * Owns the KV sizing policy: the default memory fraction, the CPU memory budget, page
 * sharing between the two pools, the size of a separate sliding pool, and the least a
 * sliding pool may hold. The engine, `gptoss serve` and `gptoss chat`/`run` ask here instead
 * of deciding themselves.
 *
 * Never measures a device: where the CUDA backend sizes its pool from a memory fraction, it
 * measures the free memory and subtracts its reserve itself (cuda_backend.cu, state_alloc);
 * this file only chooses the fraction and the pages it must leave room for.
 */
#ifndef GPTOSS_ENGINE_KV_PLAN_H
#define GPTOSS_ENGINE_KV_PLAN_H

#include "gptoss.h"

#include <stdbool.h>
#include <stdint.h>

/* CUDA serving: fill this fraction of the GPU's memory by default. At 0.95 what the process
 * allocates after the cache is sized stays inside the backend's 512 MiB reserve, and on an
 * H100 (120b, FP8 pages) it holds 647k tokens against 430k at 0.9 (bench/RESULTS.md). */
#define GPTOSS_KV_MEMORY_FRACTION_DEFAULT 0.95

/* CPU serving without a memory fraction: at most this many bytes of pages, and at most
 * GPTOSS_KV_CPU_MAX_BLOCKS pages. With a fraction F: half of F of the physical memory. */
#define GPTOSS_KV_CPU_BUDGET_BYTES (4.0 * 1024 * 1024 * 1024)
#define GPTOSS_KV_CPU_MAX_BLOCKS 8192

/* What a server asks of the cache. */
typedef struct gptoss_kv_plan_options {
    int64_t n_kv_blocks;            /* pages asked for; 0 = size them from memory */
    double memory_fraction;         /* (0, 1]; 0 = the default (see above) */
    int32_t max_num_seqs;           /* sequences per step: the sliding pool holds their windows */
    int32_t max_num_batched_tokens; /* new tokens per step: one prefill chunk */
} gptoss_kv_plan_options;

/* Fills the KV fields of backend options for serving: n_kv_blocks, n_sliding_kv_blocks,
 * kv_shared_pages, gpu_memory_utilization, max_step_tokens and max_step_logits. bo->kind,
 * kv_block_size and kv_cache_dtype must be set. CPU: the pages that fit the budget (a
 * CAPACITY error when not even one does). CUDA: shared pages, a separate sliding pool for a
 * model whose layers cannot share, and the fraction the backend sizes its pool from. The
 * backend may still change them: read them back with gptoss_backend_get_options. */
gptoss_status gptoss_kv_plan_serve(const gptoss_config *config,
                                   const gptoss_kv_plan_options *options,
                                   gptoss_backend_options *bo, gptoss_error *error);

/* Fills n_kv_blocks and n_sliding_kv_blocks for a front end that runs one sequence of up to
 * context_tokens tokens at a time (gptoss chat, gptoss run): pages for the context, and a
 * sliding pool as large, but never below one window (the engine refuses less). */
void gptoss_kv_plan_context(const gptoss_config *config, int64_t context_tokens,
                            gptoss_backend_options *bo);

/* The longest sequence (prompt + generated tokens) a server admits: `requested` (0: the
 * model's context, max_position_embeddings, 131072 for gpt-oss), never beyond the model's
 * context, and never beyond the tokens the KV cache holds as the backend sized it (bo read
 * back with gptoss_backend_get_options), since no sequence longer than the cache can run.
 * *kv_capped says the KV cache was the limit. */
int32_t gptoss_kv_plan_max_model_len(const gptoss_config *config, int64_t requested,
                                     const gptoss_backend_options *bo, bool *kv_capped);

/* Pages a separate sliding pool needs for max_num_seqs windows plus one prefill chunk of
 * max_num_batched_tokens: each window may straddle a page on each side, and 16 pages of slack
 * absorb the chunk's rounding. */
int64_t gptoss_kv_sliding_pool_blocks(int32_t sliding_window, int32_t block_size,
                                      int32_t max_num_seqs, int32_t max_num_batched_tokens);

/* The least pages a sliding pool may hold: one sequence's window (sliding_window - 1 earlier
 * tokens plus the new one) when it starts mid-page. */
int32_t gptoss_kv_min_sliding_blocks(int32_t sliding_window, int32_t block_size);

/* MiB both pools take as the backend options describe them (full layers x the full pool,
 * sliding layers x the sliding pool; shared pages: the sliding layers cost nothing extra). */
double gptoss_kv_plan_mib(const gptoss_config *config, const gptoss_backend_options *bo);

#endif
