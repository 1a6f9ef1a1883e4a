/*
 * request.c - request handles (see gptoss_engine.h): their event queues and reference counts,
 * the calls other threads make on them (next_event, cancel, stop_choice, release), and
 * submission (validating a request and handing it to the engine thread's inbox).
 *
 * Locks as in engine.c: request->mutex guards one request's event queue and reference count;
 * lock order is request->mutex, then engine->mutex.
 */
#include "engine/engine_internal.h"

#include "util/clock.h"
#include "util/sha256.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

void engine_request_unref(gptoss_request *r) {
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
bool engine_request_reserve(gptoss_request *r, int32_t extra) {
    pthread_mutex_lock(&r->mutex);
    bool ok = ring_room(r, r->n_events + extra);
    pthread_mutex_unlock(&r->mutex);
    return ok;
}

bool engine_request_push(gptoss_request *r, const gptoss_engine_event *event) {
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
    engine_request_unref(r);
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
