/*
 * engine.c - the engine thread, request handles and their event queues (see engine.h).
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
#include "gptoss_engine.h"

#include "engine/draft.h"
#include "engine/kv_cache.h"
#include "engine/kv_plan.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "model/config.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/sha256.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double gptoss_latency_bucket_bounds[GPTOSS_LATENCY_BUCKETS] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 1e300};

struct gptoss_request {
    uint64_t id;
    pthread_mutex_t mutex;       /* guards events and refs */
    pthread_cond_t cond;         /* signalled when events arrive */
    gptoss_engine_event *events; /* ring buffer [cap_events] */
    int32_t head, n_events, cap_events;
    int32_t n_choices;       /* params.n */
    int32_t n_finish_events; /* finish events queued so far */
    int refs;                /* caller + engine */
    atomic_bool cancel_requested;
    atomic_bool *stop_requested; /* [n_choices] stop-string hits reported by the caller */
    atomic_int cached_prompt_tokens;
    char error_message[GPTOSS_ERROR_MESSAGE_MAX];
    gptoss_request_notify_fn notify;
    void *notify_user;
    gptoss_engine *engine; /* (mutex) NULL once the engine let go of the request */
    /* Registry links (engine->mutex). */
    gptoss_request *prev, *next;
    gptoss_request *inbox_next;
    /* Engine thread only. */
    gptoss_sampling_params params;
    int32_t max_tokens;          /* resolved (> 0) */
    gptoss_seq **seqs;           /* [n_choices] live sequences, NULL once finished/not forked */
    uint64_t seed;               /* Philox key of every draw (the request's, or drawn at submit) */
    gptoss_token_counts *counts; /* [n_choices] when penalties need them, else NULL */
    int32_t *bias_tokens;        /* [params.n_logit_bias] copied at submit, sorted by token */
    float *bias_values;
    gptoss_allowed_tokens_fn allowed_tokens; /* optional constraint on each draw */
    void *allowed_tokens_user;
    void (*allowed_tokens_free)(void *user); /* owned once submitted: called by request_free */
    bool allowed_tokens_stateless;           /* it may be asked about draft positions */
    double *last_token_time;                 /* [n_choices] seconds, 0 = none yet */
    bool *choice_done;                       /* [n_choices] finish event queued */
    int32_t n_done;
    bool forked;          /* children of choice 0 created */
    bool started;         /* choice 0 admitted once */
    double queue_seconds; /* submit until the step that admitted it began (-1 before) */
    bool failed_step;     /* a forward carrying this request failed */
    int32_t n_pending;    /* token events in the engine's pending list, not pushed yet */
    double submit_time;
    /* Speculative decoding (engine thread): each choice's drafting record, and the replay
     * drafter's continuation (copied at submit). */
    gptoss_spec_state *spec; /* [n_choices] */
    int32_t *replay;         /* [n_replay] or NULL */
    int32_t n_replay;
};

/* One token drawn this step (one row of the sample batch): for which sequence and choice.
 * At the end of a prompt with n > 1 the prompt's last logits row is asked for once per
 * choice; those rows name the prompt's sequence and the choice forked from it after the
 * step. */
typedef struct sample_job {
    gptoss_seq *seq;           /* its request is seq->user */
    int32_t choice;            /* != seq->index: a choice to fork from seq */
    bool refused;              /* the allowed-token callback refused: end the choice */
    int32_t n_ahead;           /* drafts between the choice's tokens and this row's draw */
    int32_t n_group;           /* on the first row of a decode with drafts: its rows (1 + the
                                  drafts, consecutive); 0 elsewhere */
    gptoss_engine_event event; /* filled from the batch's outputs */
} sample_job;

struct gptoss_engine {
    gptoss_engine_options options;
    gptoss_kv_manager *kv;
    gptoss_scheduler *sched;
    /* The sample batch of the current step, row k for jobs[k] (grown, never shrunk). */
    sample_job *jobs; /* [cap_jobs] */
    int32_t n_jobs, cap_jobs;
    int32_t *logit_index;      /* [cap_jobs] the plan's logit_token_index, per row */
    gptoss_sample_row *rows;   /* [cap_jobs] */
    int32_t *token_ids;        /* [cap_jobs] drawn tokens */
    float *logprobs;           /* [cap_jobs] */
    int32_t *top_ids;          /* [cap_jobs, GPTOSS_MAX_SAMPLE_LOGPROBS] */
    float *top_logprobs;       /* same */
    gptoss_sample_edit *edits; /* [cap_edits] */
    int32_t n_edits, cap_edits;
    int32_t n_masks; /* allowed-token rows of the batch, filled by fill_masks_hook */
    /* Token events of the last step not yet handed to their requests: pushing one locks the
     * request and may wake its reader, about 2 us, so a step of 1000 sequences would leave
     * the GPU idle for 2 ms. They are pushed while the device runs the next step (the
     * summary's while_running hook), or after its forward when the backend has no hook, in
     * order; a finish of a request with pending events pushes them first. */
    struct pending_push {
        gptoss_request *r;
        gptoss_engine_event event;
    } * pending;
    int32_t n_pending, cap_pending;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mutex;
    pthread_cond_t wake; /* engine thread waits here for work */
    pthread_cond_t idle; /* drain waits here for the registry to empty */
    gptoss_request *inbox_head, *inbox_tail;
    gptoss_request *registry; /* live requests (submitted, not fully finished) */
    int32_t n_live;           /* requests in the registry */
    int32_t n_queued;         /* submitted, not started */
    bool stop, draining;
    double step_start; /* engine thread: when the current step began */
    bool attention;    /* a cancel/stop flag was set since the last look */
    uint64_t next_id;
    gptoss_rng entropy;        /* seeds for requests without a seed (under mutex) */
    gptoss_engine_stats stats; /* published snapshot (under mutex) */
    /* Engine thread only. */
    gptoss_request **active; /* requests the engine thread is serving */
    int32_t n_active, cap_active;
    gptoss_engine_stats local; /* counters accumulated by the thread */
    /* Speculative decoding: the draft source (NULL: no drafting) and the step's draft
     * requests with the sequence each is for. */
    gptoss_drafter *drafter;
    gptoss_draft_seq *draft_seqs; /* [cap_draft_seqs] */
    gptoss_seq **draft_owners;    /* [cap_draft_seqs] */
    int32_t *draft_counts;        /* [cap_draft_seqs] drafts proposed */
    float *draft_p;               /* [cap_draft_seqs] each one's chance to be right */
    int32_t cap_draft_seqs;
    gptoss_spec_costs *spec_costs; /* measured seconds of decode steps by width */
    /* GPTOSS_STEP_TIMING=1: host seconds per phase of a step, printed at exit */
    bool timing;
    double t_schedule, t_forward, t_sample, t_between, t_mark, t_rows, t_flush;
    int64_t timed_steps;
};

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
    o.max_queue_len = 1024;
    o.enable_prefix_cache = true;
    o.admit_headroom = 1;
    o.draft = gptoss_draft_options_default();
    return o;
}

static gptoss_status backend_forward_sample(void *user, const gptoss_batch_plan *plan,
                                            const gptoss_sample_batch *batch, gptoss_error *error) {
    return gptoss_backend_forward_sample((gptoss_backend *)user, plan, batch, error);
}

void gptoss_engine_options_for_backend(gptoss_engine_options *o, const gptoss_config *config,
                                       gptoss_backend *backend,
                                       const gptoss_backend_options *backend_options) {
    o->forward_sample = backend_forward_sample;
    o->forward_user = backend;
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

/* ---- requests ---------------------------------------------------------------------------- */

static void request_free(gptoss_request *r) {
    if (!r) return;
    if (r->allowed_tokens_free) r->allowed_tokens_free(r->allowed_tokens_user);
    for (int32_t i = 0; r->seqs && i < r->n_choices; i++)
        gptoss_seq_free(r->seqs[i]);
    pthread_mutex_destroy(&r->mutex);
    pthread_cond_destroy(&r->cond);
    free(r->events);
    free(r->stop_requested);
    free(r->seqs);
    for (int32_t i = 0; r->counts && i < r->n_choices; i++)
        gptoss_token_counts_free(&r->counts[i]);
    free(r->counts);
    free(r->bias_tokens);
    free(r->bias_values);
    free(r->last_token_time);
    free(r->choice_done);
    free(r->spec);
    free(r->replay);
    free(r);
}

static void request_unref(gptoss_request *r) {
    pthread_mutex_lock(&r->mutex);
    int refs = --r->refs;
    pthread_mutex_unlock(&r->mutex);
    if (refs == 0) request_free(r);
}

/* Room for `need` events in the ring (caller holds r->mutex). */
static bool ring_room(gptoss_request *r, int32_t need) {
    if (need <= r->cap_events) return true;
    int32_t cap = r->cap_events ? r->cap_events * 2 : 16;
    while (cap < need)
        cap *= 2;
    gptoss_engine_event *events = malloc((size_t)cap * sizeof *events);
    if (!events) return false;
    for (int32_t i = 0; i < r->n_events; i++)
        events[i] = r->events[(r->head + i) % r->cap_events];
    free(r->events);
    r->events = events;
    r->head = 0;
    r->cap_events = cap;
    return true;
}

/* Makes room for the request's queued events plus `extra`, so pushing them cannot fail. */
static bool request_reserve(gptoss_request *r, int32_t extra) {
    pthread_mutex_lock(&r->mutex);
    bool ok = ring_room(r, r->n_events + extra);
    pthread_mutex_unlock(&r->mutex);
    return ok;
}

static bool request_push(gptoss_request *r, const gptoss_engine_event *event) {
    pthread_mutex_lock(&r->mutex);
    if (!ring_room(r, r->n_events + 1)) {
        pthread_mutex_unlock(&r->mutex);
        return false;
    }
    r->events[(r->head + r->n_events) % r->cap_events] = *event;
    r->n_events++;
    if (event->finish != GPTOSS_FINISH_NONE) r->n_finish_events++;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mutex);
    return true;
}

uint64_t gptoss_request_id(const gptoss_request *r) {
    return r->id;
}

/* Pops the oldest event (caller holds r->mutex and checked n_events > 0). */
static void pop_event(gptoss_request *r, gptoss_engine_event *event) {
    *event = r->events[r->head];
    r->head = (r->head + 1) % r->cap_events;
    r->n_events--;
}

int gptoss_request_next_event(gptoss_request *r, gptoss_engine_event *event, int64_t timeout_ms) {
    struct timespec deadline;
    if (timeout_ms > 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += (time_t)(timeout_ms / 1000);
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&r->mutex);
    int result = 0;
    bool timed_out = false;
    for (;;) {
        if (r->n_events > 0) {
            pop_event(r, event);
            result = 1;
            break;
        }
        if (r->n_finish_events >= r->n_choices) {
            result = -1; /* every choice finished and every event was taken */
            break;
        }
        if (timeout_ms == 0 || timed_out) break;
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cond, &r->mutex);
        else
            timed_out = pthread_cond_timedwait(&r->cond, &r->mutex, &deadline) == ETIMEDOUT;
    }
    pthread_mutex_unlock(&r->mutex);
    return result;
}

double gptoss_request_queue_seconds(const gptoss_request *r) {
    return r->queue_seconds;
}

int32_t gptoss_request_cached_prompt_tokens(const gptoss_request *r) {
    return atomic_load(&((gptoss_request *)r)->cached_prompt_tokens);
}

const char *gptoss_request_error(const gptoss_request *r) {
    return r->error_message;
}

/* Flags the engine thread; a request the engine already let go of needs nothing. Lock order:
 * request->mutex, then engine->mutex (the engine never holds its mutex while taking a
 * request's). */
static void poke_engine(gptoss_request *r) {
    pthread_mutex_lock(&r->mutex);
    gptoss_engine *e = r->engine;
    if (e) {
        pthread_mutex_lock(&e->mutex);
        e->attention = true;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mutex);
    }
    pthread_mutex_unlock(&r->mutex);
}

void gptoss_request_cancel(gptoss_request *r) {
    atomic_store(&r->cancel_requested, true);
    poke_engine(r);
}

void gptoss_request_stop_choice(gptoss_request *r, int32_t index) {
    if (index < 0 || index >= r->n_choices) return;
    atomic_store(&r->stop_requested[index], true);
    poke_engine(r);
}

void gptoss_request_release(gptoss_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mutex);
    bool finished = r->n_finish_events >= r->n_choices;
    pthread_mutex_unlock(&r->mutex);
    if (!finished) gptoss_request_cancel(r);
    request_unref(r);
}

/* ---- engine ------------------------------------------------------------------------------ */

static bool grow_rows(gptoss_engine *e, int32_t need);
/* Speculative decoding (the section "speculative decoding" below). */
static void attach_drafts(gptoss_engine *e);
static bool build_draft_rows(gptoss_engine *e, gptoss_seq *seq, const int32_t *logit_index);
static void deliver_drafted(gptoss_engine *e, int32_t k);
static void record_step_cost(gptoss_engine *e, const gptoss_batch_plan *plan, double seconds);

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
        (st = gptoss_drafter_create(&options->draft, options->vocab_size, &e->drafter, error)) !=
            GPTOSS_OK) {
        gptoss_engine_free(e);
        return st;
    }
    if (e->drafter && !options->draft.ignore_step_cost &&
        !(e->spec_costs = calloc(1, sizeof *e->spec_costs))) {
        gptoss_engine_free(e);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (draft costs)");
    }
    if (!grow_rows(e, options->max_num_seqs + 1)) {
        gptoss_engine_free(e);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (sample rows)");
    }
    e->stats.kv_blocks_total = options->n_kv_blocks;
    e->stats.sliding_blocks_total = kv_options.n_sliding_blocks;
    *out = e;
    return GPTOSS_OK;
}

/* ---- engine thread ----------------------------------------------------------------------- */

static void histogram_add(gptoss_latency_histogram *h, double seconds) {
    for (int i = 0; i < GPTOSS_LATENCY_BUCKETS; i++)
        if (seconds <= gptoss_latency_bucket_bounds[i]) h->buckets[i]++;
    h->count++;
    h->sum_seconds += seconds;
}

/* Records that a request's first sequence was admitted (queue length, cached prompt). */
static void note_started(gptoss_engine *e, gptoss_request *r) {
    if (r->started || !r->seqs[0] || !r->seqs[0]->started) return;
    r->started = true;
    r->queue_seconds = e->step_start > r->submit_time ? e->step_start - r->submit_time : 0.0;
    atomic_store(&r->cached_prompt_tokens, r->seqs[0]->n_cached_prompt);
    pthread_mutex_lock(&e->mutex);
    e->n_queued--;
    pthread_mutex_unlock(&e->mutex);
}

/* Pushes the pending token events, oldest first (room was reserved: they cannot fail). */
static void flush_pushes(gptoss_engine *e) {
    if (e->n_pending == 0) return;
    double t0 = e->timing ? gptoss_now_seconds() : 0;
    for (int32_t i = 0; i < e->n_pending; i++) {
        gptoss_request *r = e->pending[i].r;
        request_push(r, &e->pending[i].event);
        r->n_pending--;
        if (r->notify) r->notify(r->notify_user, r);
    }
    e->n_pending = 0;
    if (e->timing) e->t_flush += gptoss_now_seconds() - t0;
}

static void flush_pushes_hook(void *user) {
    flush_pushes(user);
}

/* Queues a token event for flush_pushes; pushes it at once when the list cannot grow.
 * False: no memory for the event at all. */
static bool queue_push(gptoss_engine *e, gptoss_request *r, const gptoss_engine_event *event) {
    if (!request_reserve(r, r->n_pending + 1)) return false;
    if (e->n_pending == e->cap_pending) {
        int32_t cap = e->cap_pending ? e->cap_pending * 2 : 256;
        struct pending_push *grown = realloc(e->pending, (size_t)cap * sizeof *grown);
        if (!grown) {
            flush_pushes(e); /* keep the order, then this one directly */
            bool ok = request_push(r, event);
            if (ok && r->notify) r->notify(r->notify_user, r);
            return ok;
        }
        e->pending = grown;
        e->cap_pending = cap;
    }
    e->pending[e->n_pending].r = r;
    e->pending[e->n_pending].event = *event;
    e->n_pending++;
    r->n_pending++;
    return true;
}

/* Ends one choice: releases its sequence and queues its last event (`event` may carry the
 * final token; NULL for a finish without one). */
static void finish_choice(gptoss_engine *e, gptoss_request *r, int32_t index,
                          gptoss_finish_reason reason, gptoss_engine_event *event,
                          int32_t stop_token) {
    if (r->choice_done[index]) return;
    if (r->n_pending > 0) flush_pushes(e); /* its earlier tokens go before the finish */
    note_started(e, r);
    gptoss_seq *seq = r->seqs[index];
    if (seq) {
        gptoss_scheduler_finish(e->sched, seq);
        gptoss_seq_free(seq);
        r->seqs[index] = NULL;
    }
    gptoss_engine_event finish;
    if (event) {
        finish = *event;
    } else {
        memset(&finish, 0, sizeof finish);
        finish.index = index;
        finish.token_id = -1;
    }
    finish.finish = reason;
    finish.stop_token_id = stop_token;
    r->choice_done[index] = true;
    r->n_done++;
    e->local.requests_finished[reason]++;
    if (!request_push(r, &finish)) {
        /* Out of memory for one event: still count the choice as finished so readers end. */
        pthread_mutex_lock(&r->mutex);
        r->n_finish_events++;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->mutex);
    }
    if (r->notify) r->notify(r->notify_user, r);
}

static void finish_request(gptoss_engine *e, gptoss_request *r, gptoss_finish_reason reason) {
    for (int32_t i = 0; i < r->n_choices; i++)
        finish_choice(e, r, i, reason, NULL, -1);
}

static bool is_in(int32_t token, const int32_t *list, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (list[i] == token) return true;
    return false;
}

/* Tokens a draw of seq may not pick now: stop tokens (and EOS unless ignored) while fewer
 * than min_tokens were generated (n_generated of them, drafts before the draw included).
 * masked has room for both lists. */
static int32_t masked_tokens(const gptoss_engine *e, const gptoss_seq *seq, int32_t n_generated,
                             int32_t *masked) {
    const gptoss_request *r = seq->user;
    const gptoss_sampling_params *p = &r->params;
    int32_t n_masked = 0;
    if (n_generated < p->min_tokens) {
        for (int32_t i = 0; i < p->n_stop_token_ids; i++)
            masked[n_masked++] = p->stop_token_ids[i];
        if (!p->ignore_eos)
            for (int32_t i = 0; i < e->options.n_eos_token_ids; i++)
                masked[n_masked++] = e->options.eos_token_ids[i];
    }
    return n_masked;
}

/* Room for `need` rows in the step's sample batch. */
static bool grow_rows(gptoss_engine *e, int32_t need) {
    if (need <= e->cap_jobs) return true;
    int32_t cap = e->cap_jobs ? e->cap_jobs : 64;
    while (cap < need)
        cap *= 2;
    const size_t n = (size_t)cap, top = n * GPTOSS_MAX_SAMPLE_LOGPROBS;
    sample_job *jobs = realloc(e->jobs, n * sizeof *jobs);
    if (jobs) e->jobs = jobs;
    int32_t *logit_index = realloc(e->logit_index, n * sizeof *logit_index);
    if (logit_index) e->logit_index = logit_index;
    gptoss_sample_row *rows = realloc(e->rows, n * sizeof *rows);
    if (rows) e->rows = rows;
    int32_t *token_ids = realloc(e->token_ids, n * sizeof *token_ids);
    if (token_ids) e->token_ids = token_ids;
    float *logprobs = realloc(e->logprobs, n * sizeof *logprobs);
    if (logprobs) e->logprobs = logprobs;
    int32_t *top_ids = realloc(e->top_ids, top * sizeof *top_ids);
    if (top_ids) e->top_ids = top_ids;
    float *top_logprobs = realloc(e->top_logprobs, top * sizeof *top_logprobs);
    if (top_logprobs) e->top_logprobs = top_logprobs;
    if (!jobs || !logit_index || !rows || !token_ids || !logprobs || !top_ids || !top_logprobs)
        return false;
    e->cap_jobs = cap;
    return true;
}

/* Room for `need` edits. */
static bool grow_edits(gptoss_engine *e, int32_t need) {
    if (need <= e->cap_edits) return true;
    int32_t cap = e->cap_edits ? e->cap_edits : 1024;
    while (cap < need)
        cap *= 2;
    gptoss_sample_edit *edits = realloc(e->edits, (size_t)cap * sizeof *edits);
    if (!edits) return false;
    e->edits = edits;
    e->cap_edits = cap;
    return true;
}

static int compare_token(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The edits of a draw of seq (logit_bias, masked stop tokens, penalties), appended to the
 * step's edits; *start / *n name them. n_ahead: drafts before the draw (0 for its next
 * token), whose counts `ahead` then holds (NULL: the choice's own). False: out of memory. */
static bool build_edits(gptoss_engine *e, const gptoss_seq *seq, int32_t n_ahead,
                        const gptoss_token_counts *ahead, int32_t *start, int32_t *n) {
    const gptoss_request *r = seq->user;
    int32_t masked[GPTOSS_MAX_STOP_TOKENS + GPTOSS_ENGINE_MAX_EOS];
    int32_t n_masked = masked_tokens(e, seq, seq->n_tokens - seq->n_prompt + n_ahead, masked);
    int32_t n_distinct = 0;
    if (n_masked > 1) qsort(masked, (size_t)n_masked, sizeof *masked, compare_token);
    for (int32_t i = 0; i < n_masked; i++)
        if (i == 0 || masked[i] != masked[i - 1]) masked[n_distinct++] = masked[i];
    const gptoss_token_counts *counts = ahead ? ahead : r->counts ? &r->counts[seq->index] : NULL;
    const int32_t room = r->params.n_logit_bias + n_distinct + (counts ? counts->n : 0);
    *start = e->n_edits;
    *n = 0;
    if (room == 0) return true;
    if (!grow_edits(e, e->n_edits + room)) return false;
    *n = gptoss_sampler_edits(&r->params, masked, n_distinct, counts, e->edits + e->n_edits);
    e->n_edits += *n;
    return true;
}

/* The allowed row of job k's draw (n_ahead drafts after its choice's tokens): a new row of
 * the batch when its request has a callback (filled later, by fill_masks_hook), else -1. */
static int32_t reserve_mask(gptoss_engine *e, int32_t k, int32_t n_ahead) {
    sample_job *job = &e->jobs[k];
    const gptoss_request *r = job->seq->user;
    job->refused = false;
    job->n_ahead = n_ahead;
    return r->allowed_tokens ? e->n_masks++ : -1;
}

/* The batch's fill_masks, run by the backend once the step's forward is launched, so the
 * callbacks' work (a first visit of an automaton state walks the token trie, ~2 ms) overlaps
 * the device's. Asks each constrained row's callback which tokens it may draw, given its
 * choice's tokens and the drafts before the row. A refusal, or a mask that allows nothing,
 * marks the job refused (its choice ends with an error when the step is delivered) and
 * allows every token, so the draw itself goes on harmlessly. Never fails: a refusal is the
 * request's error, not the step's. */
static gptoss_status fill_masks_hook(void *user, uint32_t *masks, gptoss_error *error) {
    (void)error;
    gptoss_engine *e = user;
    const int32_t V = e->options.vocab_size;
    const size_t words = ((size_t)V + 31) / 32;
    const uint32_t tail = V % 32 ? (1u << (V % 32)) - 1u : ~0u; /* bits past the vocabulary */
    for (int32_t k = 0; k < e->n_jobs; k++) {
        const int32_t row = e->rows[k].allowed_row;
        if (row < 0) continue;
        assert(row < e->n_masks);
        sample_job *job = &e->jobs[k];
        const gptoss_seq *seq = job->seq;
        const gptoss_request *r = seq->user;
        uint32_t *mask = masks + (size_t)row * words;
        memset(mask, 0, words * sizeof *mask);
        bool ok =
            r->allowed_tokens(r->allowed_tokens_user, job->choice, seq->tokens + seq->n_prompt,
                              seq->n_tokens - seq->n_prompt + job->n_ahead, mask, V);
        mask[words - 1] &= tail;
        uint32_t any = 0;
        for (size_t w = 0; ok && w < words; w++)
            any |= mask[w];
        if (!ok || !any) {
            job->refused = true;
            memset(mask, 0xff, words * sizeof *mask);
            mask[words - 1] &= tail;
        }
    }
    return GPTOSS_OK;
}

/* The sample batch of a scheduled plan: one row per logits row, and at the end of a prompt
 * with n > 1 one row per choice (the same logits row asked for again: each choice draws with
 * its own Philox counter). Replaces plan->n_logits / logit_token_index with the rows' own.
 * False: out of memory (nothing ran yet). */
static bool build_rows(gptoss_engine *e, gptoss_batch_plan *plan) {
    e->n_jobs = 0;
    e->n_edits = 0;
    e->n_masks = 0; /* (rows reserved here, filled by the backend through fill_masks_hook) */
    for (int32_t i = 0; i < plan->n_logits; i++) {
        gptoss_seq *seq = gptoss_scheduler_logit_seq(e->sched, i);
        gptoss_request *r = seq->user;
        const bool forks = seq->index == 0 && r->n_choices > 1 && !r->forked;
        const int32_t n_rows = forks ? r->n_choices : 1;
        int32_t edit_start = 0, n_edits = 0;
        if (seq->n_draft > 0) { /* rows i .. i + n_draft: a decode with drafts */
            if (!build_draft_rows(e, seq, plan->logit_token_index + i)) return false;
            i += seq->n_draft;
            continue;
        }
        if (!grow_rows(e, e->n_jobs + n_rows) ||
            !build_edits(e, seq, 0, NULL, &edit_start, &n_edits))
            return false;
        for (int32_t c = 0; c < n_rows; c++) {
            const int32_t choice = forks ? c : seq->index;
            if (forks && c > 0 && r->choice_done[c]) continue;
            const int32_t k = e->n_jobs++;
            sample_job *job = &e->jobs[k];
            job->seq = seq;
            job->choice = choice;
            job->n_group = 0;
            gptoss_sample_row row = gptoss_sampler_row(&r->params, r->seed, seq->n_tokens, choice);
            row.edit_start = edit_start; /* forks share the prompt's history */
            row.n_edits = n_edits;
            row.allowed_row = reserve_mask(e, k, 0);
            e->rows[k] = row;
            e->logit_index[k] = plan->logit_token_index[i];
        }
    }
    plan->n_logits = e->n_jobs;
    plan->logit_token_index = e->logit_index;
    return true;
}

/* The event of job k from the batch's outputs. */
static void fill_event(const gptoss_engine *e, int32_t k, sample_job *job) {
    const gptoss_request *r = job->seq->user;
    const gptoss_sampling_params *p = &r->params;
    gptoss_engine_event *event = &job->event;
    memset(event, 0, sizeof *event);
    event->index = job->choice;
    event->stop_token_id = -1;
    event->token_id = e->token_ids[k];
    if (e->rows[k].n_top_logprobs >= 0) {
        event->logprob = e->logprobs[k];
        int32_t n_top =
            p->top_logprobs < e->options.vocab_size ? p->top_logprobs : e->options.vocab_size;
        const size_t at = (size_t)k * GPTOSS_MAX_SAMPLE_LOGPROBS;
        for (int32_t i = 0; i < n_top; i++) {
            event->top_logprobs[i].token_id = e->top_ids[at + i];
            event->top_logprobs[i].logprob = e->top_logprobs[at + i];
        }
        event->n_top_logprobs = n_top;
    }
}

/* Appends a drawn token, updates statistics and reports it (engine thread, in job order). */
static void deliver(gptoss_engine *e, sample_job *job) {
    gptoss_seq *seq = job->seq;
    gptoss_request *r = seq->user;
    const gptoss_sampling_params *p = &r->params;
    const int32_t index = seq->index;
    const int32_t n_generated = seq->n_tokens - seq->n_prompt;
    const int32_t token = job->event.token_id;
    if (job->refused) {
        snprintf(r->error_message, sizeof r->error_message,
                 "the allowed-token callback refused choice %d or allowed no token", index);
        finish_choice(e, r, index, GPTOSS_FINISH_ERROR, NULL, -1);
        return;
    }
    gptoss_seq_append(seq, token);
    if (r->counts && !gptoss_token_counts_add_output(&r->counts[index], token)) {
        snprintf(r->error_message, sizeof r->error_message, "out of memory counting tokens");
        finish_choice(e, r, index, GPTOSS_FINISH_ERROR, NULL, -1);
        return;
    }
    double now = gptoss_now_seconds();
    if (n_generated == 0 && index == 0) {
        histogram_add(&e->local.ttft, now - r->submit_time);
        e->local.prompt_tokens += (uint64_t)seq->n_prompt;
    }
    if (r->last_token_time[index] > 0)
        histogram_add(&e->local.itl, now - r->last_token_time[index]);
    r->last_token_time[index] = now;
    e->local.generation_tokens++;

    if (is_in(token, p->stop_token_ids, p->n_stop_token_ids) ||
        (!p->ignore_eos && is_in(token, e->options.eos_token_ids, e->options.n_eos_token_ids))) {
        finish_choice(e, r, index, GPTOSS_FINISH_STOP, &job->event, token);
    } else if (n_generated + 1 >= r->max_tokens || seq->n_tokens >= seq->cap_tokens) {
        finish_choice(e, r, index, GPTOSS_FINISH_LENGTH, &job->event, -1);
    } else if (!queue_push(e, r, &job->event)) {
        snprintf(r->error_message, sizeof r->error_message, "out of memory queueing a token");
        finish_choice(e, r, index, GPTOSS_FINISH_ERROR, NULL, -1);
    }
}

/* The choice of job, forked from the prompt's sequence now that the prompt is cached (it
 * shares the prompt's KV). NULL when the fork failed (the choice is then finished). */
static gptoss_seq *fork_choice(gptoss_engine *e, sample_job *job) {
    gptoss_seq *parent = job->seq;
    gptoss_request *r = parent->user;
    const int32_t j = job->choice;
    gptoss_seq *child;
    gptoss_error err;
    if (gptoss_scheduler_fork(e->sched, parent, j, &child, &err) != GPTOSS_OK) {
        snprintf(r->error_message, sizeof r->error_message, "%s", err.message);
        finish_choice(e, r, j, GPTOSS_FINISH_ERROR, NULL, -1);
        return NULL;
    }
    child->user = r;
    r->seqs[j] = child;
    if (r->counts && !gptoss_token_counts_copy(&r->counts[j], &r->counts[parent->index])) {
        snprintf(r->error_message, sizeof r->error_message, "out of memory counting tokens");
        finish_choice(e, r, j, GPTOSS_FINISH_ERROR, NULL, -1);
        return NULL;
    }
    return child;
}

/* ---- speculative decoding ---------------------------------------------------------------- */
/*
 * A decoding sequence with drafts d[0..n) puts 1 + n tokens in the step (its last token, then
 * the drafts) and gets a row for each. Row j draws the token at position n_tokens + j exactly
 * as a step without drafts would draw it after d[0..j) had been generated: the same Philox
 * counter (position, choice), the same stop-token mask (min_tokens counts the drafts before
 * it) and penalties counting them. The drafts are deterministic (the draft distribution is
 * one-hot), so the speculative-sampling rule (accept d[j] with probability p(d[j]), else draw
 * from p without d[j]) is the same as: draw y[j] from p, accept while y[j] == d[j]. The step
 * emits y[0..m], m the accepted drafts, which is token for token what decoding without drafts
 * emits. An allowed-token callback is asked about each row's history, drafts included, so
 * only stateless callbacks allow drafting (request_options.allowed_tokens_stateless).
 */

/* Drafts for the decoding sequences (before schedule), as many as the switch allows. */
static void attach_drafts(gptoss_engine *e) {
    if (!e->drafter) return;
    const gptoss_draft_options *o = &e->options.draft;
    const int32_t n_running = gptoss_scheduler_n_running(e->sched);
    int32_t n_decoding = 0;
    for (int32_t i = 0; i < n_running; i++) {
        const gptoss_seq *seq = gptoss_scheduler_running(e->sched, i);
        if (seq->n_tokens - seq->n_cached == 1) n_decoding++;
    }
    const int32_t step_k = gptoss_spec_step_k(o, n_decoding);
    if (step_k == 0 || n_decoding == 0) return;
    if (n_decoding > e->cap_draft_seqs) {
        gptoss_draft_seq *seqs = realloc(e->draft_seqs, (size_t)n_decoding * sizeof *seqs);
        if (seqs) e->draft_seqs = seqs;
        gptoss_seq **owners = realloc(e->draft_owners, (size_t)n_decoding * sizeof *owners);
        if (owners) e->draft_owners = owners;
        int32_t *counts = realloc(e->draft_counts, (size_t)n_decoding * sizeof *counts);
        if (counts) e->draft_counts = counts;
        float *p = realloc(e->draft_p, (size_t)n_decoding * sizeof *p);
        if (p) e->draft_p = p;
        if (!seqs || !owners || !counts || !p) return; /* no memory: decode without drafts */
        e->cap_draft_seqs = n_decoding;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < n_running; i++) {
        gptoss_seq *seq = gptoss_scheduler_running(e->sched, i);
        gptoss_request *r = seq->user;
        seq->n_draft = 0;
        if (seq->n_tokens - seq->n_cached != 1 || !r ||
            (r->allowed_tokens && !r->allowed_tokens_stateless) || r->choice_done[seq->index] ||
            (r->n_choices > 1 && !r->forked))
            continue;
        int32_t k = gptoss_spec_seq_k(&r->spec[seq->index], step_k);
        /* Every token a step may emit (the drafts and the one after them) must be allowed. */
        const int32_t left = r->max_tokens - (seq->n_tokens - seq->n_prompt) - 1;
        if (k > left) k = left;
        if (k > seq->cap_tokens - seq->n_tokens - 1) k = seq->cap_tokens - seq->n_tokens - 1;
        if (k <= 0) continue;
        gptoss_draft_seq *d = &e->draft_seqs[n];
        d->tokens = seq->tokens;
        d->n_tokens = seq->n_tokens;
        d->n_prompt = seq->n_prompt;
        d->replay = r->replay;
        d->n_replay = r->n_replay;
        d->key = r->seed ^ ((uint64_t)seq->index * 0x9e3779b97f4a7c15ull);
        d->k = k;
        d->out = seq->tokens + seq->n_tokens; /* the drafts live after the sequence's tokens */
        d->n_out = 0;
        e->draft_owners[n++] = seq;
    }
    gptoss_drafter_propose(e->drafter, e->draft_seqs, n);
    /* As many as the measured cost of the wider step pays for. */
    for (int32_t i = 0; i < n; i++) {
        const gptoss_seq *seq = e->draft_owners[i];
        const gptoss_request *r = seq->user;
        e->draft_counts[i] = e->draft_seqs[i].n_out;
        e->draft_p[i] = gptoss_spec_acceptance(&r->spec[seq->index]);
    }
    const int32_t cap = e->spec_costs ? gptoss_spec_best_cap(e->spec_costs, n_decoding,
                                                             e->draft_counts, e->draft_p, n)
                                      : GPTOSS_MAX_SPECULATIVE_TOKENS;
    for (int32_t i = 0; i < n; i++)
        e->draft_owners[i]->n_draft = e->draft_counts[i] < cap ? e->draft_counts[i] : cap;
}

/* Records the seconds of a step where every token had a logits row (decodes, with or without
 * drafts): what the switch weighs drafts against. */
static void record_step_cost(gptoss_engine *e, const gptoss_batch_plan *plan, double seconds) {
    if (e->spec_costs && plan->n_logits == plan->n_tokens)
        gptoss_spec_costs_record(e->spec_costs, plan->n_tokens, seconds);
}

/* The rows of a decode with drafts (see above): row j for the token at n_tokens + j, with
 * the edits of a history that includes d[0..j). False: out of memory. */
static bool build_draft_rows(gptoss_engine *e, gptoss_seq *seq, const int32_t *logit_index) {
    gptoss_request *r = seq->user;
    const int32_t n_rows = 1 + seq->n_draft;
    const int32_t *drafts = seq->tokens + seq->n_tokens;
    if (!grow_rows(e, e->n_jobs + n_rows)) return false;
    gptoss_token_counts ahead; /* the choice's counts plus the drafts so far */
    const bool counted = r->counts != NULL;
    if (counted && !gptoss_token_counts_copy(&ahead, &r->counts[seq->index])) return false;
    bool ok = true;
    for (int32_t j = 0; j < n_rows && ok; j++) {
        int32_t edit_start = 0, n_edits = 0;
        ok = build_edits(e, seq, j, counted ? &ahead : NULL, &edit_start, &n_edits);
        if (ok && counted && j + 1 < n_rows) ok = gptoss_token_counts_add_output(&ahead, drafts[j]);
        if (!ok) break;
        const int32_t k = e->n_jobs++;
        sample_job *job = &e->jobs[k];
        job->seq = seq;
        job->choice = seq->index;
        job->n_group = j == 0 ? n_rows : 0;
        gptoss_sample_row row =
            gptoss_sampler_row(&r->params, r->seed, seq->n_tokens + j, seq->index);
        row.edit_start = edit_start;
        row.n_edits = n_edits;
        /* A refusal matters only if the drafts before this row are accepted: delivery stops
         * there, as the draw without drafts would. */
        row.allowed_row = reserve_mask(e, k, j);
        e->rows[k] = row;
        e->logit_index[k] = logit_index[j];
    }
    if (counted) gptoss_token_counts_free(&ahead);
    return ok;
}

/* Verifies the drafts of the decode whose rows start at job k, rolls the KV back to the
 * accepted tokens and delivers them one by one (a stop token, max_tokens or the end of the
 * sequence's room ends the choice exactly where decoding without drafts would). */
static void deliver_drafted(gptoss_engine *e, int32_t k) {
    sample_job *first = &e->jobs[k];
    gptoss_seq *seq = first->seq;
    gptoss_request *r = seq->user;
    const int32_t index = seq->index, n_draft = first->n_group - 1;
    int32_t sampled[GPTOSS_MAX_SPECULATIVE_TOKENS + 1];
    for (int32_t j = 0; j <= n_draft; j++)
        sampled[j] = e->jobs[k + j].event.token_id;
    const int32_t m = gptoss_spec_n_accepted(seq->tokens + seq->n_tokens, sampled, n_draft);
    gptoss_scheduler_accept_drafts(e->sched, seq, m);
    gptoss_spec_seq_update(&e->options.draft, &r->spec[index], n_draft, m);
    e->local.draft_tokens += (uint64_t)n_draft;
    e->local.draft_accepted_tokens += (uint64_t)m;
    e->local.draft_seq_steps++;
    for (int32_t j = 0; j <= m && r->seqs[index] == seq && !r->choice_done[index]; j++)
        deliver(e, &e->jobs[k + j]);
}

/* After a successful step: forks the choices of prompts that ended (before any of their
 * tokens is appended), then delivers every drawn token in row order. */
static void run_jobs(gptoss_engine *e) {
    const int32_t n = e->n_jobs;
    for (int32_t k = 0; k < n; k++) {
        sample_job *job = &e->jobs[k];
        fill_event(e, k, job);
        gptoss_request *r = job->seq->user;
        if (job->n_group == 0 && job->seq->index == 0 && r->n_choices > 1 && !r->forked) {
            r->forked = true;
            job->seq->n_slots = 1;
        }
        if (job->choice != job->seq->index) job->seq = fork_choice(e, job);
    }
    for (int32_t k = 0; k < n; k++) {
        if (e->jobs[k].n_group > 0) {
            deliver_drafted(e, k);
            k += e->jobs[k].n_group - 1;
        } else if (e->jobs[k].seq) {
            deliver(e, &e->jobs[k]);
        }
    }
    e->n_jobs = 0;
}

/* Applies cancel and stop-string flags set by other threads. */
static void apply_flags(gptoss_engine *e) {
    for (int32_t i = 0; i < e->n_active; i++) {
        gptoss_request *r = e->active[i];
        if (r->n_done == r->n_choices) continue;
        if (atomic_load(&r->cancel_requested)) {
            finish_request(e, r, GPTOSS_FINISH_CANCELLED);
            continue;
        }
        for (int32_t j = 0; j < r->n_choices; j++) {
            if (!atomic_load(&r->stop_requested[j]) || r->choice_done[j]) continue;
            if (j > 0 && !r->forked) continue; /* not born yet: finished once forked */
            finish_choice(e, r, j, GPTOSS_FINISH_STOP, NULL, -1);
        }
    }
}

/* Lets go of finished requests: registry, counters, the engine's reference. */
static void sweep(gptoss_engine *e) {
    int32_t kept = 0;
    for (int32_t i = 0; i < e->n_active; i++) {
        gptoss_request *r = e->active[i];
        note_started(e, r);
        if (r->n_done < r->n_choices) {
            e->active[kept++] = r;
            continue;
        }
        if (r->n_pending > 0) flush_pushes(e); /* (a finished choice already flushed them) */
        pthread_mutex_lock(&e->mutex);
        if (r->prev)
            r->prev->next = r->next;
        else
            e->registry = r->next;
        if (r->next) r->next->prev = r->prev;
        e->n_live--;
        if (!r->started) e->n_queued--;
        if (e->n_live == 0) pthread_cond_broadcast(&e->idle);
        pthread_mutex_unlock(&e->mutex);
        pthread_mutex_lock(&r->mutex);
        r->engine = NULL;
        pthread_mutex_unlock(&r->mutex);
        request_unref(r);
    }
    e->n_active = kept;
}

static void publish_stats(gptoss_engine *e) {
    pthread_mutex_lock(&e->mutex);
    gptoss_engine_stats *s = &e->stats;
    *s = e->local;
    s->n_running = gptoss_scheduler_n_running(e->sched);
    s->n_waiting = gptoss_scheduler_n_waiting(e->sched);
    s->n_waiting_requests = e->n_queued;
    s->kv_blocks_total = gptoss_kv_total(e->kv, GPTOSS_KV_POOL_FULL);
    s->kv_blocks_used = gptoss_kv_used(e->kv, GPTOSS_KV_POOL_FULL);
    if (gptoss_kv_shared_pages(e->kv))
        s->kv_blocks_used += gptoss_kv_used(e->kv, GPTOSS_KV_POOL_SLIDING);
    s->kv_blocks_cached = gptoss_kv_idle_cached(e->kv, GPTOSS_KV_POOL_FULL);
    s->sliding_blocks_total = gptoss_kv_total(e->kv, GPTOSS_KV_POOL_SLIDING);
    s->sliding_blocks_used = gptoss_kv_used(e->kv, GPTOSS_KV_POOL_SLIDING);
    gptoss_scheduler_counters c = gptoss_scheduler_get_counters(e->sched);
    s->prefix_cache_queries = c.prefix_query_tokens;
    s->prefix_cache_hits = c.prefix_hit_tokens;
    s->preemptions = c.preemptions;
    s->draining = e->draining;
    pthread_mutex_unlock(&e->mutex);
}

/* One scheduler step: plan, forward, sample. Returns false when there was nothing to run. */
static bool step(gptoss_engine *e) {
    gptoss_batch_plan plan;
    gptoss_error err;
    gptoss_error_clear(&err);
    memset(&plan, 0, sizeof plan);
    e->step_start = gptoss_now_seconds(); /* the requests it admits stop waiting here */
    double t0 = e->timing ? e->step_start : 0;
    attach_drafts(e);
    gptoss_status st = gptoss_scheduler_schedule(e->sched, &plan, &err);
    double t1 = e->timing ? gptoss_now_seconds() : 0;
    if (st != GPTOSS_OK) {
        /* Only host memory can fail here; retrying would spin, so fail what is live. */
        gptoss_scheduler_abort_step(e->sched);
        for (int32_t a = 0; a < e->n_active; a++) {
            gptoss_request *r = e->active[a];
            if (!r->error_message[0])
                snprintf(r->error_message, sizeof r->error_message, "%s", err.message);
            finish_request(e, r, GPTOSS_FINISH_ERROR);
        }
        return true;
    }
    if (plan.n_seqs == 0) {
        flush_pushes(e); /* nothing runs: no hook will push them */
        return false;
    }
    /* Each row's parameters, seed and edits; the backend draws where the logits are, and
     * builds the allowed-token masks (fill_masks) and pushes the last step's tokens
     * (while_running) while its device computes. */
    if (!build_rows(e, &plan)) {
        st = gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (sample rows)");
    } else {
        gptoss_sample_batch batch = {
            .rows = e->rows,
            .edits = e->edits,
            .n_edits = e->n_edits,
            .n_allowed_rows = e->n_masks,
            .fill_masks = e->n_masks > 0 ? fill_masks_hook : NULL,
            .fill_masks_user = e,
            .token_ids = e->token_ids,
            .logprobs = e->logprobs,
            .top_ids = e->top_ids,
            .top_logprobs = e->top_logprobs,
            .while_running = flush_pushes_hook,
            .while_running_user = e,
        };
        if (e->timing) e->t_rows += gptoss_now_seconds() - t1;
        const double started = e->spec_costs ? gptoss_now_seconds() : 0;
        st = e->options.forward_sample(e->options.forward_user, &plan, &batch, &err);
        if (st == GPTOSS_OK && e->spec_costs)
            record_step_cost(e, &plan, gptoss_now_seconds() - started);
    }
    flush_pushes(e); /* when the backend did not run the hook */
    double t2 = e->timing ? gptoss_now_seconds() : 0;
    e->local.steps++;
    if (st != GPTOSS_OK) {
        /* Nothing of this step reached the KV cache: fail the requests it carried. Mark the
         * requests first: finishing one frees all of its sequences (siblings too), and the
         * scheduler must forget the step before any sequence is freed. */
        for (int32_t i = 0; i < plan.n_seqs; i++) {
            gptoss_request *r = gptoss_scheduler_plan_seq(e->sched, i)->user;
            r->failed_step = true;
            if (!r->error_message[0])
                snprintf(r->error_message, sizeof r->error_message, "%s: %s",
                         gptoss_status_name(st), err.message);
        }
        gptoss_scheduler_abort_step(e->sched);
        e->n_jobs = 0;
        for (int32_t a = 0; a < e->n_active; a++)
            if (e->active[a]->failed_step) finish_request(e, e->active[a], GPTOSS_FINISH_ERROR);
        return true;
    }
    gptoss_scheduler_commit(e->sched);
    run_jobs(e);
    if (e->timing) {
        double t3 = gptoss_now_seconds();
        if (e->timed_steps > 0) e->t_between += t0 - e->t_mark;
        e->t_schedule += t1 - t0;
        e->t_forward += t2 - t1;
        e->t_sample += t3 - t2;
        e->t_mark = t3;
        e->timed_steps++;
    }
    return true;
}

static bool activate(gptoss_engine *e, gptoss_request *r) {
    if (e->n_active == e->cap_active) {
        int32_t cap = e->cap_active ? e->cap_active * 2 : 64;
        gptoss_request **active = realloc(e->active, (size_t)cap * sizeof *active);
        if (!active) return false;
        e->active = active;
        e->cap_active = cap;
    }
    e->active[e->n_active++] = r;
    r->seqs[0]->user = r;
    gptoss_scheduler_add(e->sched, r->seqs[0]);
    return true;
}

/* Moves the inbox into the scheduler (caller holds e->mutex; released around the work). */
static gptoss_request *take_inbox(gptoss_engine *e) {
    gptoss_request *list = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    return list;
}

static void admit_list(gptoss_engine *e, gptoss_request *list) {
    while (list) {
        gptoss_request *r = list;
        list = r->inbox_next;
        r->inbox_next = NULL;
        if (!activate(e, r)) {
            /* Could not even track it: finish it so its reader ends. */
            snprintf(r->error_message, sizeof r->error_message,
                     "out of memory admitting the request");
            for (int32_t i = 0; i < r->n_choices; i++) {
                gptoss_seq_free(r->seqs[i]);
                r->seqs[i] = NULL;
            }
            if (e->n_active < e->cap_active) e->active[e->n_active++] = r;
            finish_request(e, r, GPTOSS_FINISH_ERROR);
        }
    }
}

static void shutdown_requests(gptoss_engine *e) {
    pthread_mutex_lock(&e->mutex);
    gptoss_request *list = take_inbox(e);
    pthread_mutex_unlock(&e->mutex);
    admit_list(e, list);
    for (int32_t i = 0; i < e->n_active; i++)
        finish_request(e, e->active[i], GPTOSS_FINISH_CANCELLED);
    sweep(e);
    publish_stats(e);
}

static void *engine_main(void *arg) {
    gptoss_engine *e = arg;
    pthread_mutex_lock(&e->mutex);
    for (;;) {
        if (e->stop) break;
        gptoss_request *list = take_inbox(e);
        bool attention = e->attention;
        e->attention = false;
        if (!list && !attention && e->n_active == 0) {
            pthread_cond_wait(&e->wake, &e->mutex);
            continue;
        }
        pthread_mutex_unlock(&e->mutex);
        admit_list(e, list);
        apply_flags(e);
        bool ran = step(e);
        sweep(e);
        publish_stats(e);
        pthread_mutex_lock(&e->mutex);
        if (!ran && e->n_active > 0 && !e->inbox_head && !e->attention && !e->stop) {
            /* Nothing could run although requests are live (should not happen: submit checks
             * that every sequence fits). Wait for a change instead of spinning. */
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 10 * 1000000L;
            if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&e->wake, &e->mutex, &t);
        }
    }
    pthread_mutex_unlock(&e->mutex);
    shutdown_requests(e);
    return NULL;
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
        shutdown_requests(e);
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
    free(e->spec_costs);
    pthread_mutex_destroy(&e->mutex);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->idle);
    free(e);
}

/* ---- submission -------------------------------------------------------------------------- */

gptoss_status gptoss_engine_submit(gptoss_engine *e, const int32_t *prompt, int32_t n_prompt,
                                   const gptoss_sampling_params *params,
                                   const gptoss_request_options *request_options,
                                   gptoss_request **out, gptoss_error *error) {
    *out = NULL;
    const gptoss_engine_options *o = &e->options;
    const gptoss_status bad = GPTOSS_ERR_INVALID_ARGUMENT;
    gptoss_sampling_params defaults = gptoss_sampling_params_default();
    if (!params) params = &defaults;
    gptoss_status st = gptoss_sampling_params_validate(params, o->vocab_size, error);
    if (st != GPTOSS_OK) return st;
    if (!prompt || n_prompt < 1) return gptoss_set_error(error, bad, "the prompt is empty");
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= o->vocab_size)
            return gptoss_set_error(error, bad,
                                    "prompt token %d (at %d) is outside the vocabulary [0, %d)",
                                    prompt[i], i, o->vocab_size);
    if (params->n > o->max_num_seqs)
        return gptoss_set_error(error, bad, "n=%d exceeds the engine's max_num_seqs=%d", params->n,
                                o->max_num_seqs);
    if (request_options && request_options->cache_salt_len > GPTOSS_MAX_SALT_BYTES)
        return gptoss_set_error(error, bad, "cache salt has %zu bytes; at most %d are allowed",
                                request_options->cache_salt_len, GPTOSS_MAX_SALT_BYTES);
    if (request_options && request_options->cache_salt_len > 0 && !request_options->cache_salt)
        return gptoss_set_error(error, bad, "cache salt length given without bytes");
    if (request_options &&
        (request_options->n_draft_replay < 0 ||
         (request_options->n_draft_replay > 0 && !request_options->draft_replay)))
        return gptoss_set_error(error, bad, "draft_replay: %d tokens given without an array",
                                request_options->n_draft_replay);
    for (int32_t i = 0; request_options && i < request_options->n_draft_replay; i++)
        if (request_options->draft_replay[i] < 0 ||
            request_options->draft_replay[i] >= o->vocab_size)
            return gptoss_set_error(
                error, bad, "draft_replay token %d (at %d) is outside the vocabulary [0, %d)",
                request_options->draft_replay[i], i, o->vocab_size);
    /* Length: the prompt plus at least one token must fit max_model_len and the KV pool. The
     * last sampled token is never fed back, so n_prompt + max_tokens - 1 positions need KV. */
    const int64_t kv_tokens = (int64_t)o->n_kv_blocks * o->kv_block_size;
    if (n_prompt >= o->max_model_len)
        return gptoss_set_error(
            error, GPTOSS_ERR_CAPACITY,
            "the prompt has %d tokens; this engine's max_model_len is %d, which "
            "leaves no room to generate",
            n_prompt, o->max_model_len);
    if (n_prompt > kv_tokens)
        return gptoss_set_error(
            error, GPTOSS_ERR_CAPACITY,
            "the prompt has %d tokens but the KV cache holds %lld; it can never run", n_prompt,
            (long long)kv_tokens);
    int64_t max_tokens = params->max_tokens;
    if (max_tokens == 0) {
        max_tokens = o->max_model_len - n_prompt;
        if (max_tokens > kv_tokens - n_prompt + 1) max_tokens = kv_tokens - n_prompt + 1;
    } else if (n_prompt + max_tokens > o->max_model_len) {
        return gptoss_set_error(error, GPTOSS_ERR_CAPACITY,
                                "prompt (%d tokens) + max_tokens (%lld) exceeds max_model_len %d",
                                n_prompt, (long long)max_tokens, o->max_model_len);
    } else if (n_prompt + max_tokens - 1 > kv_tokens) {
        return gptoss_set_error(
            error, GPTOSS_ERR_CAPACITY,
            "prompt (%d tokens) + max_tokens (%lld) needs %lld KV tokens but the "
            "cache holds %lld (%d blocks of %d); lower max_tokens",
            n_prompt, (long long)max_tokens, (long long)(n_prompt + max_tokens - 1),
            (long long)kv_tokens, o->n_kv_blocks, o->kv_block_size);
    }
    if (params->min_tokens > max_tokens)
        return gptoss_set_error(error, bad,
                                "min_tokens %d exceeds the %lld tokens this request may generate",
                                params->min_tokens, (long long)max_tokens);

    gptoss_request *r = calloc(1, sizeof *r);
    if (!r) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (request)");
    const int32_t n = params->n;
    r->n_choices = n;
    r->params = *params;
    r->max_tokens = (int32_t)max_tokens;
    r->refs = 2;
    pthread_mutex_init(&r->mutex, NULL);
    pthread_cond_init(&r->cond, NULL);
    atomic_init(&r->cancel_requested, false);
    atomic_init(&r->cached_prompt_tokens, 0);
    r->stop_requested = malloc((size_t)n * sizeof(atomic_bool));
    r->seqs = calloc((size_t)n, sizeof(gptoss_seq *));
    /* Penalties need each choice's token counts (choice 0's now, the others' at the fork);
     * logit_bias is copied, sorted by token as the edits are. */
    bool counts_ok = true, bias_ok = true;
    if (gptoss_sampler_needs_counts(params)) {
        r->counts = calloc((size_t)n, sizeof *r->counts);
        counts_ok = r->counts && gptoss_token_counts_init(&r->counts[0], prompt, n_prompt);
    }
    if (params->n_logit_bias > 0) {
        const int32_t nb = params->n_logit_bias;
        r->bias_tokens = malloc((size_t)nb * sizeof *r->bias_tokens);
        r->bias_values = malloc((size_t)nb * sizeof *r->bias_values);
        bias_ok = r->bias_tokens && r->bias_values;
        for (int32_t i = 0; bias_ok && i < nb; i++) { /* insertion sort: nb <= 1024, once */
            int32_t t = params->logit_bias_tokens[i], at = i;
            float v = params->logit_bias_values[i];
            while (at > 0 && r->bias_tokens[at - 1] > t) {
                r->bias_tokens[at] = r->bias_tokens[at - 1];
                r->bias_values[at] = r->bias_values[at - 1];
                at--;
            }
            r->bias_tokens[at] = t;
            r->bias_values[at] = v;
        }
    }
    r->params.logit_bias_tokens = r->bias_tokens;
    r->params.logit_bias_values = r->bias_values;
    r->last_token_time = calloc((size_t)n, sizeof(double));
    r->choice_done = calloc((size_t)n, sizeof(bool));
    r->spec = malloc((size_t)n * sizeof *r->spec);
    bool replay_ok = true;
    for (int32_t i = 0; r->spec && i < n; i++)
        r->spec[i] = gptoss_spec_state_init();
    if (request_options && request_options->n_draft_replay > 0 &&
        o->draft.kind == GPTOSS_DRAFT_REPLAY) {
        const int32_t nr = request_options->n_draft_replay;
        r->replay = malloc((size_t)nr * sizeof *r->replay);
        replay_ok = r->replay != NULL;
        if (replay_ok)
            memcpy(r->replay, request_options->draft_replay, (size_t)nr * sizeof(int32_t));
        r->n_replay = nr;
    }
    if (request_options) {
        r->notify = request_options->notify;
        r->notify_user = request_options->notify_user;
        r->allowed_tokens = request_options->allowed_tokens;
        r->allowed_tokens_user = request_options->allowed_tokens_user;
        r->allowed_tokens_stateless = request_options->allowed_tokens_stateless;
    }
    uint8_t salt[GPTOSS_SHA256_BYTES] = {0};
    if (request_options && request_options->cache_salt_len > 0)
        gptoss_sha256_digest(request_options->cache_salt, request_options->cache_salt_len, salt);
    if (!r->stop_requested || !r->seqs || !counts_ok || !bias_ok || !r->last_token_time ||
        !r->choice_done || !r->spec || !replay_ok) {
        request_free(r);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (request)");
    }
    for (int32_t i = 0; i < n; i++)
        atomic_init(&r->stop_requested[i], false);
    st = gptoss_seq_create(prompt, n_prompt, n_prompt + (int32_t)max_tokens, o->kv_block_size, 0, 0,
                           salt, &r->seqs[0], error);
    if (st != GPTOSS_OK) {
        request_free(r);
        return st;
    }
    r->seqs[0]->n_slots = n;

    pthread_mutex_lock(&e->mutex);
    if (e->draining || e->stop) {
        pthread_mutex_unlock(&e->mutex);
        request_free(r);
        return gptoss_set_error(error, GPTOSS_ERR_CAPACITY,
                                "the engine is shutting down; not accepting requests");
    }
    if (e->n_queued >= o->max_queue_len) {
        int32_t queued = e->n_queued;
        pthread_mutex_unlock(&e->mutex);
        request_free(r);
        return gptoss_set_error(error, GPTOSS_ERR_CAPACITY,
                                "the request queue is full (%d waiting); retry later", queued);
    }
    r->id = e->next_id++;
    r->seqs[0]->priority = r->id;
    r->seed = params->has_seed ? params->seed : gptoss_rng_next(&e->entropy);
    r->submit_time = gptoss_now_seconds();
    r->queue_seconds = -1;
    r->engine = e;
    r->next = e->registry;
    if (e->registry) e->registry->prev = r;
    e->registry = r;
    if (e->inbox_tail)
        e->inbox_tail->inbox_next = r;
    else
        e->inbox_head = r;
    e->inbox_tail = r;
    e->n_live++;
    e->n_queued++;
    /* From here on the request owns the constraint; before, a refused submit left it to the
     * caller. */
    if (request_options) r->allowed_tokens_free = request_options->allowed_tokens_free;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mutex);
    *out = r;
    return GPTOSS_OK;
}

bool gptoss_engine_queue_full(gptoss_engine *e) {
    pthread_mutex_lock(&e->mutex);
    bool full = e->draining || e->stop || e->n_queued >= e->options.max_queue_len;
    pthread_mutex_unlock(&e->mutex);
    return full;
}

bool gptoss_engine_cancel(gptoss_engine *e, uint64_t request_id) {
    pthread_mutex_lock(&e->mutex);
    gptoss_request *r = e->registry;
    while (r && r->id != request_id)
        r = r->next;
    if (r) {
        atomic_store(&r->cancel_requested, true);
        e->attention = true;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->mutex);
    return r != NULL;
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
