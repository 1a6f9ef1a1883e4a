/*
 * engine.c - the engine object (see gptoss_engine.h): options, create/start/drain/free and
 * statistics. The engine thread is in engine_thread.c, request handles and submission in
 * request.c; engine_internal.h holds what they share.
 *
 * Threads and locks:
 *   - engine->mutex guards the inbox of newly submitted requests, the registry of live
 *     requests (for cancel by id), the drain/stop flags and the published statistics.
 *   - request->mutex guards one request's event queue and reference count.
 *   - Everything else (scheduler, KV manager, sampler, sequences) belongs to the engine
 *     thread alone; other threads only set atomic flags (cancel, stop_choice) on requests.
 * Callbacks (notify) run on the engine thread without any lock held.
 * It must not parse text or talk HTTP.
 */
#include "engine/engine_internal.h"

#include "backend/backend.h"
#include "engine/kv_plan.h"
#include "model/config.h"
#include "util/clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double gptoss_latency_bucket_bounds[GPTOSS_LATENCY_BUCKETS] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 1e300};

const char *gptoss_finish_reason_name(gptoss_finish_reason reason) {
    switch (reason) {
    case GPTOSS_FINISH_NONE:
        return "none";
    case GPTOSS_FINISH_STOP:
        return "stop";
    case GPTOSS_FINISH_LENGTH:
        return "length";
    case GPTOSS_FINISH_CANCELLED:
        return "cancelled";
    case GPTOSS_FINISH_ERROR:
        return "error";
    }
    return "unknown";
}

/* ---- options ----------------------------------------------------------------------------- */

gptoss_engine_options gptoss_engine_options_default(void) {
    gptoss_engine_options o;
    memset(&o, 0, sizeof o);
    o.kv_block_size = 16;
    o.n_kv_blocks = 256;
    o.max_num_seqs = 64;
    o.max_num_batched_tokens = 2048;
    o.max_model_len = 8192;
    o.max_queue_len = 4096;
    o.enable_prefix_cache = true;
    o.admit_headroom = 1;
    o.draft = gptoss_draft_options_default();
    return o;
}

static gptoss_status backend_forward_sample(void *user, const gptoss_batch_plan *plan,
                                            const gptoss_sample_batch *batch, gptoss_error *error) {
    return gptoss_backend_forward_sample((gptoss_backend *)user, plan, batch, error);
}

static gptoss_status backend_capture_hidden(void *user, const int32_t *boundaries, int32_t n,
                                            gptoss_error *error) {
    return gptoss_backend_capture_hidden((gptoss_backend *)user, boundaries, n, error);
}

static const float *backend_captured_hidden(void *user, int32_t *n_tokens) {
    return gptoss_backend_captured_hidden((gptoss_backend *)user, n_tokens);
}

static gptoss_status backend_embed_tokens(void *user, const int32_t *tokens, int32_t n, float *out,
                                          gptoss_error *error) {
    return gptoss_backend_embed_tokens((gptoss_backend *)user, tokens, n, out, error);
}

static gptoss_status backend_head_exec(void *user, const struct gptoss_eagle3_head *head,
                                       struct gptoss_eagle3_exec *out, gptoss_error *error) {
    return gptoss_backend_head_exec((gptoss_backend *)user, head, out, error);
}

void gptoss_engine_options_for_backend(gptoss_engine_options *o, const gptoss_config *config,
                                       gptoss_backend *backend,
                                       const gptoss_backend_options *backend_options) {
    o->forward_sample = backend_forward_sample;
    o->forward_user = backend;
    o->draft_target = (gptoss_draft_target){.user = backend,
                                            .n_layers = config->n_layers,
                                            .hidden_size = config->hidden_size,
                                            .capture_hidden = backend_capture_hidden,
                                            .captured_hidden = backend_captured_hidden,
                                            .embed_tokens = backend_embed_tokens,
                                            .head_exec = backend_head_exec};
    o->vocab_size = config->vocab_size;
    o->sliding_window = gptoss_config_n_sliding_layers(config) > 0 ? config->sliding_window : 0;
    o->kv_block_size = backend_options->kv_block_size;
    o->n_kv_blocks = backend_options->n_kv_blocks;
    o->n_sliding_kv_blocks = backend_options->n_sliding_kv_blocks;
    o->kv_shared_pages = backend_options->kv_shared_pages;
    if (config->max_position_embeddings < o->max_model_len || o->max_model_len <= 0)
        o->max_model_len = config->max_position_embeddings;
    o->n_eos_token_ids = 0;
    if (config->eos_token_id >= 0 && config->eos_token_id < config->vocab_size)
        o->eos_token_ids[o->n_eos_token_ids++] = config->eos_token_id;
}

void gptoss_engine_options_set_eos(gptoss_engine_options *o, const int32_t *ids, size_t n) {
    int32_t kept[GPTOSS_ENGINE_MAX_EOS], n_kept = 0;
    for (size_t i = 0; i < n && n_kept < GPTOSS_ENGINE_MAX_EOS; i++)
        if (ids[i] >= 0 && ids[i] < o->vocab_size) kept[n_kept++] = ids[i];
    if (n_kept == 0) return;
    memcpy(o->eos_token_ids, kept, (size_t)n_kept * sizeof *kept);
    o->n_eos_token_ids = n_kept;
}

static gptoss_status validate_options(const gptoss_engine_options *o, gptoss_error *error) {
    const gptoss_status bad = GPTOSS_ERR_INVALID_ARGUMENT;
    if (!o->forward_sample)
        return gptoss_set_error(error, bad, "engine options: no forward_sample function");
    if (o->vocab_size < 1)
        return gptoss_set_error(error, bad, "engine options: vocab_size must be positive");
    if (o->kv_block_size < 1 || o->kv_block_size > 4096)
        return gptoss_set_error(error, bad,
                                "engine options: kv_block_size %d is out of range [1, 4096]",
                                o->kv_block_size);
    if (o->n_kv_blocks < 1 || o->n_sliding_kv_blocks < 0 || o->sliding_window < 0)
        return gptoss_set_error(error, bad,
                                "engine options: KV pools need blocks (full %d, sliding %d)",
                                o->n_kv_blocks, o->n_sliding_kv_blocks);
    if (o->max_num_seqs < 1 || o->max_num_seqs > 4096)
        return gptoss_set_error(error, bad,
                                "engine options: max_num_seqs %d is out of range [1, 4096]",
                                o->max_num_seqs);
    if (o->max_num_batched_tokens < 1)
        return gptoss_set_error(error, bad,
                                "engine options: max_num_batched_tokens must be positive");
    if (o->admit_headroom < 0 || o->admit_headroom > 4096)
        return gptoss_set_error(error, bad,
                                "engine options: admit_headroom %d is out of range [0, 4096]",
                                o->admit_headroom);
    if (o->max_model_len < 2)
        return gptoss_set_error(error, bad, "engine options: max_model_len must be at least 2");
    if (o->max_queue_len < 1)
        return gptoss_set_error(error, bad, "engine options: max_queue_len must be positive");
    if (o->testing.prefix_hash_bits < 0 || o->testing.prefix_hash_bits > 64)
        return gptoss_set_error(
            error, bad, "engine options: testing.prefix_hash_bits %d is out of range [0, 64]",
            o->testing.prefix_hash_bits);
    gptoss_status st = gptoss_draft_options_validate(&o->draft, error);
    if (st != GPTOSS_OK) return st;
    if (o->n_eos_token_ids < 0 || o->n_eos_token_ids > GPTOSS_ENGINE_MAX_EOS)
        return gptoss_set_error(error, bad, "engine options: at most %d eos tokens",
                                GPTOSS_ENGINE_MAX_EOS);
    for (int32_t i = 0; i < o->n_eos_token_ids; i++)
        if (o->eos_token_ids[i] < 0 || o->eos_token_ids[i] >= o->vocab_size)
            return gptoss_set_error(error, bad,
                                    "engine options: eos token %d is outside the vocabulary",
                                    o->eos_token_ids[i]);
    if (o->sliding_window > 0) {
        int32_t sliding =
            o->n_sliding_kv_blocks && !o->kv_shared_pages ? o->n_sliding_kv_blocks : o->n_kv_blocks;
        int32_t need = gptoss_kv_min_sliding_blocks(o->sliding_window, o->kv_block_size);
        if (sliding < need)
            return gptoss_set_error(error, GPTOSS_ERR_CAPACITY,
                                    "the sliding KV pool has %d blocks but one sequence needs %d "
                                    "(window %d, block size %d); give it more blocks",
                                    sliding, need, o->sliding_window, o->kv_block_size);
    }
    return GPTOSS_OK;
}

/* ---- engine ------------------------------------------------------------------------------ */

gptoss_status gptoss_engine_create(const gptoss_engine_options *options, gptoss_engine **out,
                                   gptoss_error *error) {
    *out = NULL;
    gptoss_status st = validate_options(options, error);
    if (st != GPTOSS_OK) return st;
    gptoss_engine *e = calloc(1, sizeof *e);
    if (!e) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (engine)");
    e->options = *options;
    if (e->options.sliding_window > 0 &&
        (e->options.n_sliding_kv_blocks == 0 || options->kv_shared_pages))
        e->options.n_sliding_kv_blocks = e->options.n_kv_blocks;
    gptoss_kv_manager_options kv_options = {
        .block_size = options->kv_block_size,
        .n_blocks = options->n_kv_blocks,
        .n_sliding_blocks = e->options.sliding_window > 0 ? e->options.n_sliding_kv_blocks : 0,
        .shared_pages = options->kv_shared_pages,
        .enable_prefix_cache = options->enable_prefix_cache,
        .hash_bits = options->testing.prefix_hash_bits,
    };
    gptoss_scheduler_options sched_options = {
        .max_num_seqs = options->max_num_seqs,
        .max_num_batched_tokens = options->max_num_batched_tokens,
        .sliding_window = e->options.sliding_window,
        .admit_headroom = options->admit_headroom,
    };
    pthread_mutex_init(&e->mutex, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->idle, NULL);
    e->next_id = 1;
    e->timing = getenv("GPTOSS_STEP_TIMING") && strcmp(getenv("GPTOSS_STEP_TIMING"), "0") != 0;
    uint64_t seed =
        (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)e ^ (uint64_t)(gptoss_now_seconds() * 1e9);
    gptoss_rng_seed(&e->entropy, seed, 0);
    if ((st = gptoss_kv_manager_create(&kv_options, &e->kv, error)) != GPTOSS_OK ||
        (st = gptoss_scheduler_create(&sched_options, e->kv, &e->sched, error)) != GPTOSS_OK) {
        gptoss_engine_free(e);
        return st;
    }
    if (options->draft.kind != GPTOSS_DRAFT_NONE &&
        (st = gptoss_drafter_create(&options->draft, options->vocab_size, &options->draft_target,
                                    &e->drafter, error)) != GPTOSS_OK) {
        gptoss_engine_free(e);
        return st;
    }
    if (e->drafter && !options->draft.ignore_step_cost &&
        !(e->spec_costs = calloc(1, sizeof *e->spec_costs))) {
        gptoss_engine_free(e);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (draft costs)");
    }
    if (!engine_grow_rows(e, options->max_num_seqs + 1)) {
        gptoss_engine_free(e);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (sample rows)");
    }
    e->stats.kv_blocks_total = options->n_kv_blocks;
    e->stats.sliding_blocks_total = kv_options.n_sliding_blocks;
    *out = e;
    return GPTOSS_OK;
}

gptoss_status gptoss_engine_start(gptoss_engine *e, gptoss_error *error) {
    if (e->thread_started)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "the engine thread is already running");
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc != 0)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "cannot start the engine thread: %s", strerror(rc));
    e->thread_started = true;
    return GPTOSS_OK;
}

bool gptoss_engine_drain(gptoss_engine *e, int64_t timeout_ms) {
    struct timespec deadline;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += (time_t)(timeout_ms / 1000);
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&e->mutex);
    e->draining = true;
    e->stats.draining = true;
    while (e->n_live > 0) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&e->idle, &e->mutex);
        } else if (pthread_cond_timedwait(&e->idle, &e->mutex, &deadline) == ETIMEDOUT) {
            break;
        }
    }
    bool empty = e->n_live == 0;
    pthread_mutex_unlock(&e->mutex);
    return empty;
}

void gptoss_engine_free(gptoss_engine *e) {
    if (!e) return;
    if (e->timing && e->timed_steps > 1) {
        const double n = (double)e->timed_steps, us = 1e6;
        fprintf(
            stderr,
            "engine step timing, %lld steps, us per step: schedule %.1f, forward %.1f (of which "
            "token pushes while the device runs %.1f), sample rows %.1f, deliver %.1f, between "
            "steps %.1f\n",
            (long long)e->timed_steps, e->t_schedule / n * us, e->t_forward / n * us,
            e->t_flush / n * us, e->t_rows / n * us, e->t_sample / n * us,
            e->t_between / (n - 1) * us);
    }
    if (e->thread_started) {
        pthread_mutex_lock(&e->mutex);
        e->stop = true;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mutex);
        pthread_join(e->thread, NULL);
    } else if (e->sched) {
        engine_shutdown_requests(e);
    }
    gptoss_scheduler_free(e->sched);
    gptoss_kv_manager_free(e->kv);
    free(e->jobs);
    free(e->logit_index);
    free(e->rows);
    free(e->token_ids);
    free(e->logprobs);
    free(e->top_ids);
    free(e->top_logprobs);
    free(e->edits);
    free(e->pending);
    free(e->active);
    gptoss_drafter_free(e->drafter);
    free(e->draft_seqs);
    free(e->draft_owners);
    free(e->draft_counts);
    free(e->draft_p);
    free(e->observed);
    free(e->spec_costs);
    pthread_mutex_destroy(&e->mutex);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->idle);
    free(e);
}

void gptoss_engine_get_stats(gptoss_engine *e, gptoss_engine_stats *stats) {
    pthread_mutex_lock(&e->mutex);
    *stats = e->stats;
    stats->n_waiting_requests = e->n_queued;
    stats->draining = e->draining;
    /* The snapshot is published after each step; a request submitted since (still in the
     * inbox) is live but neither running nor in the scheduler's queue yet: count it as
     * waiting, so an idle-looking engine never hides work it is about to start. */
    int32_t pending = e->n_live - stats->n_running;
    if (pending > stats->n_waiting) stats->n_waiting = pending;
    pthread_mutex_unlock(&e->mutex);
}
