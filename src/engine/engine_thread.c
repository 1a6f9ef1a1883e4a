/*
 * engine_thread.c - the engine thread (see engine.c for its locks): its loop, admitting
 * submitted requests, and each step (the batch plan, the sample rows and allowed-token masks,
 * the forward, delivering drawn tokens to their requests, speculative drafts), plus finishing
 * requests and publishing statistics. Everything here runs on the engine thread.
 */
#include "engine/engine_internal.h"

#include "util/clock.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Speculative decoding (the section "speculative decoding" below). */
static void attach_drafts(gptoss_engine *e);
static bool build_draft_rows(gptoss_engine *e, gptoss_seq *seq, const int32_t *logit_index);
static void deliver_drafted(gptoss_engine *e, int32_t k);
static void record_step_cost(gptoss_engine *e, const gptoss_batch_plan *plan, double seconds);

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
        engine_request_push(r, &e->pending[i].event);
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
    if (!engine_request_reserve(r, r->n_pending + 1)) return false;
    if (e->n_pending == e->cap_pending) {
        int32_t cap = e->cap_pending ? e->cap_pending * 2 : 256;
        struct pending_push *grown = realloc(e->pending, (size_t)cap * sizeof *grown);
        if (!grown) {
            flush_pushes(e); /* keep the order, then this one directly */
            bool ok = engine_request_push(r, event);
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
    if (!engine_request_push(r, &finish)) {
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
bool engine_grow_rows(gptoss_engine *e, int32_t need) {
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
        if (!engine_grow_rows(e, e->n_jobs + n_rows) ||
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
    e->propose_seconds = 0;
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
        d->seq_priority = seq->priority;
        d->seq_index = (uint64_t)seq->index;
        d->k = k;
        d->out = seq->tokens + seq->n_tokens; /* the drafts live after the sequence's tokens */
        d->n_out = 0;
        e->draft_owners[n++] = seq;
    }
    /* As many as the measured cost of the wider step pays for: judged first on the drafts
     * asked for, so that a source whose proposals cost time (a draft head's forwards) is
     * not asked for drafts that no step would verify, then on those it gave. */
    if (e->spec_costs) {
        for (int32_t i = 0; i < n; i++) {
            const gptoss_seq *seq = e->draft_owners[i];
            const gptoss_request *r = seq->user;
            e->draft_counts[i] = e->draft_seqs[i].k;
            e->draft_p[i] = gptoss_spec_acceptance(&r->spec[seq->index]);
        }
        const int32_t asked =
            gptoss_spec_best_cap(e->spec_costs, n_decoding, e->draft_counts, e->draft_p, n);
        if (asked == 0) return;
        for (int32_t i = 0; i < n; i++)
            if (e->draft_seqs[i].k > asked) e->draft_seqs[i].k = asked;
    }
    const double t0 = gptoss_now_seconds();
    gptoss_drafter_propose(e->drafter, e->draft_seqs, n);
    e->propose_seconds = gptoss_now_seconds() - t0;
    e->local.draft_seconds += e->propose_seconds;
    for (int32_t i = 0; i < n; i++) {
        const gptoss_seq *seq = e->draft_owners[i];
        const gptoss_request *r = seq->user;
        e->local.draft_proposed_tokens += (uint64_t)e->draft_seqs[i].n_out;
        e->draft_counts[i] = e->draft_seqs[i].n_out;
        e->draft_p[i] = gptoss_spec_acceptance(&r->spec[seq->index]);
    }
    const int32_t cap = e->spec_costs ? gptoss_spec_best_cap(e->spec_costs, n_decoding,
                                                             e->draft_counts, e->draft_p, n)
                                      : GPTOSS_MAX_SPECULATIVE_TOKENS;
    for (int32_t i = 0; i < n; i++)
        e->draft_owners[i]->n_draft = e->draft_counts[i] < cap ? e->draft_counts[i] : cap;
}

/* Hands a draft head what the step's forward computed for each sequence (its hidden states
 * are read now, before the next forward replaces them). */
static void observe_step(gptoss_engine *e, const gptoss_batch_plan *plan) {
    if (!e->drafter || !gptoss_drafter_observes(e->drafter)) return;
    if (plan->n_seqs > e->cap_observed) {
        gptoss_draft_observed *grown =
            realloc(e->observed, (size_t)plan->n_seqs * sizeof *e->observed);
        if (!grown) return; /* the head restarts those sequences later: fewer drafts only */
        e->observed = grown;
        e->cap_observed = plan->n_seqs;
    }
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        const gptoss_seq *seq = gptoss_scheduler_plan_seq(e->sched, i);
        e->observed[i] = (gptoss_draft_observed){
            .seq_priority = seq->priority,
            .seq_index = (uint64_t)seq->index,
            .tokens = seq->tokens,
            .n_tokens = seq->n_tokens,
            .first_position = plan->seq_n_cached[i],
            .n_computed = plan->seq_token_start[i + 1] - plan->seq_token_start[i],
            .first_row = plan->seq_token_start[i],
        };
    }
    const double t0 = gptoss_now_seconds();
    gptoss_drafter_observe(e->drafter, e->observed, plan->n_seqs);
    e->local.draft_seconds += gptoss_now_seconds() - t0;
}

/* Records the seconds of a step where every token had a logits row (decodes, with or without
 * drafts): what the switch weighs drafts against. A step that verifies drafts is charged the
 * time the draft source took to propose them (a draft head's forwards). */
static void record_step_cost(gptoss_engine *e, const gptoss_batch_plan *plan, double seconds) {
    if (!e->spec_costs || plan->n_logits != plan->n_tokens) return;
    if (plan->n_tokens > plan->n_seqs) seconds += e->propose_seconds;
    gptoss_spec_costs_record(e->spec_costs, plan->n_tokens, seconds);
}

/* The rows of a decode with drafts (see above): row j for the token at n_tokens + j, with
 * the edits of a history that includes d[0..j). False: out of memory. */
static bool build_draft_rows(gptoss_engine *e, gptoss_seq *seq, const int32_t *logit_index) {
    gptoss_request *r = seq->user;
    const int32_t n_rows = 1 + seq->n_draft;
    const int32_t *drafts = seq->tokens + seq->n_tokens;
    if (!engine_grow_rows(e, e->n_jobs + n_rows)) return false;
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
        engine_request_unref(r);
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
    observe_step(e, &plan);
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

void engine_shutdown_requests(gptoss_engine *e) {
    pthread_mutex_lock(&e->mutex);
    gptoss_request *list = take_inbox(e);
    pthread_mutex_unlock(&e->mutex);
    admit_list(e, list);
    for (int32_t i = 0; i < e->n_active; i++)
        finish_request(e, e->active[i], GPTOSS_FINISH_CANCELLED);
    sweep(e);
    publish_stats(e);
}

void *engine_main(void *arg) {
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
    engine_shutdown_requests(e);
    return NULL;
}
