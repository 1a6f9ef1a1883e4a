/*
 * scheduler.h - sequences and the per-step batching decisions.
 *
 * Owns the waiting and running queues and every sequence's KV page lists (through the
 * gptoss_kv_manager), and builds one gptoss_batch_plan per step:
 *   1. decodes of running sequences, in FCFS order, one token each (plus the drafts the engine
 *      attached, while KV and the token budget allow, each with its own logits row);
 *   2. prefill chunks of running sequences (chunked prefill, forks' recomputed tails);
 *   3. waiting sequences in FCFS order while the token budget, max_num_seqs and KV allow,
 *      starting from their longest prefix-cache hit; while others run, only when the whole
 *      remaining prompt fits and leaves admit_headroom free tokens per running sequence.
 * When a running sequence needs a KV page and none is left, the lowest-priority running
 * sequence (latest arrival) is preempted: its pages are released (full ones stay in the prefix
 * cache) and it goes back to the waiting queue to be recomputed later. It must not sample or
 * call the backend: the engine does both and reports back through commit/append/finish.
 * Engine thread only.
 */
#ifndef GPTOSS_ENGINE_SCHEDULER_H
#define GPTOSS_ENGINE_SCHEDULER_H

#include "engine/kv_cache.h"
#include "gptoss.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum gptoss_seq_state {
    GPTOSS_SEQ_WAITING = 0,
    GPTOSS_SEQ_RUNNING = 1,
    GPTOSS_SEQ_FINISHED = 2,
} gptoss_seq_state;

typedef struct gptoss_seq {
    uint64_t priority; /* FCFS: the request's arrival number, lower runs first */
    int32_t index;     /* choice index within the request (orders equal priorities) */
    int32_t n_slots;   /* running slots to reserve at admission (n before a fork) */
    gptoss_seq_state state;
    int32_t *tokens; /* [cap_tokens] prompt then generated tokens */
    int32_t n_tokens;
    int32_t cap_tokens; /* n_prompt + max_tokens */
    int32_t n_prompt;
    int32_t n_cached;        /* leading tokens whose KV is written */
    int32_t *full_blocks;    /* [cap_blocks] FULL page of block i (positions i*bs ..) */
    int32_t *sliding_blocks; /* [cap_blocks] SLIDING page, -1 once out of every window */
    uint64_t *block_uids;    /* [cap_blocks] prefix-cache entry of block i, 0 = none */
    uint8_t (*block_digests)[GPTOSS_SHA256_BYTES]; /* [cap_blocks] chain digests */
    int32_t n_blocks; /* pages held (FULL), covering positions < n_blocks * bs */
    int32_t cap_blocks;
    int32_t n_digests;   /* leading full blocks whose digests are computed */
    int32_t n_published; /* leading full blocks offered to the prefix cache */
    int32_t sliding_low; /* SLIDING pages below this block index are released */
    uint8_t salt_digest[GPTOSS_SHA256_BYTES]; /* SHA-256 of the request's cache salt */
    int32_t n_sched;                          /* tokens scheduled this step */
    /* Speculative decoding: draft tokens stored at tokens[n_tokens, n_tokens + n_draft) (not
     * counted in n_tokens), verified by this step after the sequence's last token. The
     * engine sets them on a decoding sequence before schedule; schedule may shorten them (KV
     * or token budget) or drop them (not scheduled, preempted). */
    int32_t n_draft;
    int32_t n_cached_prompt; /* prompt tokens served by the prefix cache at first start */
    bool started;            /* admitted at least once */
    int32_t n_preemptions;
    void *user; /* the engine's per-sequence record */
} gptoss_seq;

/* A new waiting sequence. cap_tokens >= n_prompt bounds prompt + generated tokens. */
gptoss_status gptoss_seq_create(const int32_t *prompt, int32_t n_prompt, int32_t cap_tokens,
                                int32_t block_size, uint64_t priority, int32_t index,
                                const uint8_t salt_digest[GPTOSS_SHA256_BYTES], gptoss_seq **out,
                                gptoss_error *error);
/* Frees a sequence that is not in a scheduler (finished or never added). NULL ok. */
void gptoss_seq_free(gptoss_seq *seq);
/* Appends a sampled token (the caller checks cap_tokens first). */
void gptoss_seq_append(gptoss_seq *seq, int32_t token);

typedef struct gptoss_scheduler_options {
    int32_t max_num_seqs;           /* sequences per step */
    int32_t max_num_batched_tokens; /* new tokens per step */
    int32_t sliding_window;         /* tokens incl. self; 0 = no sliding layers */
    int32_t admit_headroom;         /* free KV tokens per running sequence that admitting a
                                       waiting one must leave (step 3 above); 0 = none: it
                                       starts in whatever pages are free */
} gptoss_scheduler_options;

typedef struct gptoss_scheduler gptoss_scheduler;

/* kv is borrowed and must outlive the scheduler. */
gptoss_status gptoss_scheduler_create(const gptoss_scheduler_options *options,
                                      gptoss_kv_manager *kv, gptoss_scheduler **out,
                                      gptoss_error *error);
/* Frees the scheduler and every sequence still queued in it. */
void gptoss_scheduler_free(gptoss_scheduler *sched);

/* Queues a sequence (takes ownership until finish). */
void gptoss_scheduler_add(gptoss_scheduler *sched, gptoss_seq *seq);

/* Decides one step and fills *plan (arrays owned by the scheduler, valid until the next
 * schedule). plan->n_seqs == 0 means nothing can run. Only OUT_OF_MEMORY can fail. */
gptoss_status gptoss_scheduler_schedule(gptoss_scheduler *sched, gptoss_batch_plan *plan,
                                        gptoss_error *error);
/* The sequence that owns logits row i of the last plan. */
gptoss_seq *gptoss_scheduler_logit_seq(const gptoss_scheduler *sched, int32_t i);
/* The sequence of plan sequence i of the last plan. */
gptoss_seq *gptoss_scheduler_plan_seq(const gptoss_scheduler *sched, int32_t i);

/* After a successful forward: the scheduled tokens are now cached; full blocks are offered
 * to the prefix cache and SLIDING pages out of every window are released. */
void gptoss_scheduler_commit(gptoss_scheduler *sched);

/* After the commit of a step that verified seq's n_draft drafts: the first n_accepted of them
 * (0..n_draft) were right, so their KV, written by the step, is kept (n_cached grows by
 * n_accepted; the caller then appends them and the token after them); the KV of the rest is
 * dropped: the pages wholly past the new end are released and later steps overwrite the
 * rest. Only accepted tokens reach the prefix cache. */
void gptoss_scheduler_accept_drafts(gptoss_scheduler *sched, gptoss_seq *seq, int32_t n_accepted);

/* After a failed forward: forget the step (nothing was cached). */
void gptoss_scheduler_abort_step(gptoss_scheduler *sched);

/* Removes a sequence from its queue and releases its pages; the caller then frees it. */
void gptoss_scheduler_finish(gptoss_scheduler *sched, gptoss_seq *seq);

/* A running sibling of `parent` for choice `index`: shares the parent's full prompt blocks
 * (reference counts, no copy); the partially filled last block is recomputed into the
 * child's own page, so shared pages are never written. Copies the first n_prompt tokens. */
gptoss_status gptoss_scheduler_fork(gptoss_scheduler *sched, gptoss_seq *parent, int32_t index,
                                    gptoss_seq **child, gptoss_error *error);

int32_t gptoss_scheduler_n_running(const gptoss_scheduler *sched);
int32_t gptoss_scheduler_n_waiting(const gptoss_scheduler *sched);
gptoss_seq *gptoss_scheduler_running(const gptoss_scheduler *sched, int32_t i);
gptoss_seq *gptoss_scheduler_waiting(const gptoss_scheduler *sched, int32_t i);

typedef struct gptoss_scheduler_counters {
    uint64_t preemptions;         /* sequences preempted */
    uint64_t prefix_query_tokens; /* tokens looked up at admission */
    uint64_t prefix_hit_tokens;   /* tokens served by the prefix cache */
} gptoss_scheduler_counters;

gptoss_scheduler_counters gptoss_scheduler_get_counters(const gptoss_scheduler *sched);

#endif
