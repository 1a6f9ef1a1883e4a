/*
 * scheduler.c - continuous batching, chunked prefill, prefix reuse and preemption
 * (see scheduler.h for the policy).
 *
 * Queues are arrays of sequence pointers kept sorted by (priority, index), so "FCFS" is
 * simply array order and the preemption victim is always the last running sequence.
 *
 * SLIDING pages are released with a block-aligned rule: block b is dropped once
 * (b + 1) * bs <= floor(n_cached / bs) * bs - window + 1, i.e. when no query at or after the
 * start of the sequence's current block can see it. Keeping that one extra page means a fork
 * or a prefix hit that resumes at a block boundary always finds the window it needs.
 */
#include "engine/scheduler.h"
#include "gptoss_engine.h"

#include "util/error.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

typedef struct seq_list {
    gptoss_seq **items;
    int32_t n, cap;
} seq_list;

struct gptoss_scheduler {
    gptoss_scheduler_options options;
    gptoss_kv_manager *kv;
    int32_t block_size;
    bool has_sliding;
    seq_list running; /* sorted by (priority, index) */
    seq_list waiting; /* sorted by (priority, index) */
    int32_t budget;   /* tokens left in the step being decided */
    /* The last plan (owned buffers). */
    gptoss_seq **plan_seqs;   /* [cap_seqs] */
    int32_t *seq_token_start; /* [cap_seqs + 1] */
    int32_t *seq_n_cached;    /* [cap_seqs] */
    gptoss_seq **logit_seqs;  /* [cap_logits] */
    int32_t *logit_index;     /* [cap_logits] */
    int32_t cap_seqs;
    int32_t cap_logits;
    int32_t *token_ids; /* [cap_tokens] */
    int32_t *positions; /* [cap_tokens] */
    int32_t cap_tokens;
    int32_t *block_tables;   /* [cap_table] */
    int32_t *sliding_tables; /* [cap_table] */
    int64_t cap_table;
    int32_t n_plan_seqs;
    gptoss_scheduler_counters counters;
};

/* ---- sequences --------------------------------------------------------------------------- */

static int32_t blocks_for(int32_t n_tokens, int32_t bs) {
    return (n_tokens + bs - 1) / bs;
}

gptoss_status gptoss_seq_create(const int32_t *prompt, int32_t n_prompt, int32_t cap_tokens,
                                int32_t block_size, uint64_t priority, int32_t index,
                                const uint8_t salt_digest[GPTOSS_SHA256_BYTES], gptoss_seq **out,
                                gptoss_error *error) {
    *out = NULL;
    if (n_prompt < 1 || cap_tokens < n_prompt)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "a sequence needs at least one prompt token (got %d, capacity %d)",
                                n_prompt, cap_tokens);
    gptoss_seq *seq = calloc(1, sizeof *seq);
    if (!seq) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (sequence)");
    seq->priority = priority;
    seq->index = index;
    seq->n_slots = 1;
    seq->cap_tokens = cap_tokens;
    seq->cap_blocks = blocks_for(cap_tokens, block_size) + 1;
    size_t nb = (size_t)seq->cap_blocks;
    seq->tokens = malloc((size_t)cap_tokens * sizeof(int32_t));
    seq->full_blocks = malloc(nb * sizeof(int32_t));
    seq->sliding_blocks = malloc(nb * sizeof(int32_t));
    seq->block_uids = calloc(nb, sizeof(uint64_t));
    seq->block_digests = malloc(nb * GPTOSS_SHA256_BYTES);
    if (!seq->tokens || !seq->full_blocks || !seq->sliding_blocks || !seq->block_uids ||
        !seq->block_digests) {
        gptoss_seq_free(seq);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory (sequence of %d tokens)", cap_tokens);
    }
    memcpy(seq->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    seq->n_tokens = seq->n_prompt = n_prompt;
    memcpy(seq->salt_digest, salt_digest, GPTOSS_SHA256_BYTES);
    seq->state = GPTOSS_SEQ_WAITING;
    *out = seq;
    return GPTOSS_OK;
}

void gptoss_seq_free(gptoss_seq *seq) {
    if (!seq) return;
    free(seq->tokens);
    free(seq->full_blocks);
    free(seq->sliding_blocks);
    free(seq->block_uids);
    free(seq->block_digests);
    free(seq);
}

void gptoss_seq_append(gptoss_seq *seq, int32_t token) {
    assert(seq->n_tokens < seq->cap_tokens);
    seq->tokens[seq->n_tokens++] = token;
}

/* Digest of full block b (computing the chain up to it). */
static const uint8_t *seq_digest(gptoss_seq *seq, int32_t b, int32_t bs) {
    static const uint8_t zeros[GPTOSS_SHA256_BYTES];
    while (seq->n_digests <= b) {
        int32_t i = seq->n_digests;
        const uint8_t *parent = i == 0 ? zeros : seq->block_digests[i - 1];
        gptoss_kv_block_digest(parent, seq->salt_digest, &seq->tokens[(size_t)i * (size_t)bs], bs,
                               seq->block_digests[i]);
        seq->n_digests++;
    }
    return seq->block_digests[b];
}

/* ---- queues ------------------------------------------------------------------------------ */

static bool before(const gptoss_seq *a, const gptoss_seq *b) {
    return a->priority < b->priority || (a->priority == b->priority && a->index < b->index);
}

static void list_insert(seq_list *list, gptoss_seq *seq) {
    if (list->n == list->cap) {
        int32_t cap = list->cap ? list->cap * 2 : 64;
        gptoss_seq **items = realloc(list->items, (size_t)cap * sizeof *items);
        if (!items) abort(); /* a few pointers; failing here cannot be recovered sensibly */
        list->items = items;
        list->cap = cap;
    }
    int32_t pos = list->n;
    while (pos > 0 && before(seq, list->items[pos - 1]))
        pos--;
    memmove(&list->items[pos + 1], &list->items[pos],
            (size_t)(list->n - pos) * sizeof(gptoss_seq *));
    list->items[pos] = seq;
    list->n++;
}

static bool list_remove(seq_list *list, gptoss_seq *seq) {
    for (int32_t i = 0; i < list->n; i++) {
        if (list->items[i] != seq) continue;
        memmove(&list->items[i], &list->items[i + 1],
                (size_t)(list->n - i - 1) * sizeof(gptoss_seq *));
        list->n--;
        return true;
    }
    return false;
}

/* ---- pages ------------------------------------------------------------------------------- */

/* First block index a query at or after the start of block floor(n_cached / bs) can see. */
static int32_t window_low_block(const gptoss_scheduler *s, int32_t n_cached) {
    int32_t aligned = (n_cached / s->block_size) * s->block_size;
    int32_t low_position = aligned - s->options.sliding_window + 1;
    return low_position <= 0 ? 0 : low_position / s->block_size;
}

static void release_pages(gptoss_scheduler *s, gptoss_seq *seq) {
    /* Last block first: the LRU then evicts a prefix's tail before its head. */
    for (int32_t b = seq->n_blocks - 1; b >= 0; b--) {
        if (s->has_sliding && seq->sliding_blocks[b] >= 0)
            gptoss_kv_release(s->kv, GPTOSS_KV_POOL_SLIDING, seq->sliding_blocks[b]);
        gptoss_kv_release(s->kv, GPTOSS_KV_POOL_FULL, seq->full_blocks[b]);
    }
    seq->n_blocks = 0;
    seq->n_cached = 0;
    seq->n_published = 0;
    seq->sliding_low = 0;
}

static void release_out_of_window(gptoss_scheduler *s, gptoss_seq *seq) {
    if (!s->has_sliding) return;
    int32_t low = window_low_block(s, seq->n_cached);
    if (low > seq->n_blocks) low = seq->n_blocks;
    for (int32_t b = seq->sliding_low; b < low; b++) {
        if (seq->sliding_blocks[b] >= 0) {
            gptoss_kv_release(s->kv, GPTOSS_KV_POOL_SLIDING, seq->sliding_blocks[b]);
            seq->sliding_blocks[b] = -1;
        }
    }
    if (low > seq->sliding_low) seq->sliding_low = low;
}

/* Tokens of seq that fit in its pages plus what the pools can still provide. */
static int32_t tokens_that_fit(const gptoss_scheduler *s, const gptoss_seq *seq) {
    int32_t pages = gptoss_kv_available(s->kv, GPTOSS_KV_POOL_FULL);
    if (s->has_sliding && gptoss_kv_shared_pages(s->kv)) {
        pages /= 2; /* one id space: each new block takes a FULL and a SLIDING page */
    } else if (s->has_sliding) {
        int32_t sliding = gptoss_kv_available(s->kv, GPTOSS_KV_POOL_SLIDING);
        if (sliding < pages) pages = sliding;
    }
    int64_t fit = (int64_t)(seq->n_blocks + pages) * s->block_size - seq->n_cached;
    return fit > INT32_MAX ? INT32_MAX : (int32_t)fit;
}

/* Allocates the pages for `n` more tokens; the caller checked they fit. */
static void grow(gptoss_scheduler *s, gptoss_seq *seq, int32_t n) {
    int32_t want = blocks_for(seq->n_cached + n, s->block_size);
    assert(want <= seq->cap_blocks);
    while (seq->n_blocks < want) {
        int32_t b = seq->n_blocks;
        seq->full_blocks[b] = gptoss_kv_alloc(s->kv, GPTOSS_KV_POOL_FULL);
        seq->sliding_blocks[b] =
            s->has_sliding ? gptoss_kv_alloc(s->kv, GPTOSS_KV_POOL_SLIDING) : -1;
        assert(seq->full_blocks[b] >= 0 && (!s->has_sliding || seq->sliding_blocks[b] >= 0));
        seq->block_uids[b] = 0;
        seq->n_blocks++;
    }
}

static void preempt(gptoss_scheduler *s, gptoss_seq *seq) {
    s->budget += seq->n_sched;
    seq->n_sched = 0;
    seq->n_draft = 0;
    list_remove(&s->running, seq);
    release_pages(s, seq);
    seq->state = GPTOSS_SEQ_WAITING;
    seq->n_preemptions++;
    s->counters.preemptions++;
    list_insert(&s->waiting, seq);
}

typedef enum reserve_mode {
    RESERVE_DECODE,  /* preempt later sequences, else preempt itself */
    RESERVE_PREFILL, /* preempt later sequences, else shrink the chunk */
    RESERVE_ADMIT,   /* never preempt: shrink the chunk */
} reserve_mode;

/* Makes room for up to `want` tokens of seq; returns the tokens granted (pages allocated). */
static int32_t reserve(gptoss_scheduler *s, gptoss_seq *seq, int32_t want, reserve_mode mode) {
    for (;;) {
        int32_t fit = tokens_that_fit(s, seq);
        if (fit >= want) {
            grow(s, seq, want);
            return want;
        }
        if (mode != RESERVE_ADMIT && s->running.n > 0) {
            gptoss_seq *victim = s->running.items[s->running.n - 1];
            if (victim != seq) {
                preempt(s, victim);
                continue;
            }
        }
        if (mode == RESERVE_DECODE) {
            preempt(s, seq);
            return 0;
        }
        if (fit <= 0) return 0;
        grow(s, seq, fit);
        return fit;
    }
}

/* ---- prefix cache ------------------------------------------------------------------------ */

/* Takes the longest usable prefix-cache hit for a sequence with nothing cached. */
static void acquire_prefix(gptoss_scheduler *s, gptoss_seq *seq) {
    const int32_t bs = s->block_size;
    if (!gptoss_kv_prefix_cache_enabled(s->kv)) return;
    /* Leave at least one token to compute: its logits produce the next token. */
    int32_t max_blocks = (seq->n_tokens - 1) / bs;
    gptoss_kv_hit hits_small[64];
    gptoss_kv_hit *hits = max_blocks <= 64 ? hits_small : malloc((size_t)max_blocks * sizeof *hits);
    if (!hits) return; /* a miss costs time, not correctness */
    int32_t n_hit = 0;
    uint64_t parent = 0;
    while (n_hit < max_blocks) {
        const uint8_t *digest = seq_digest(seq, n_hit, bs);
        if (!gptoss_kv_lookup(s->kv, digest, parent, seq->salt_digest,
                              &seq->tokens[(size_t)n_hit * (size_t)bs], &hits[n_hit]))
            break;
        parent = hits[n_hit].uid;
        n_hit++;
    }
    /* Sliding layers need the window before the resume point: shorten the hit until every
     * SLIDING page it needs is still cached. */
    int32_t k = n_hit;
    while (s->has_sliding && k > 0) {
        int32_t low = window_low_block(s, k * bs);
        bool complete = true;
        for (int32_t b = low; b < k && complete; b++)
            complete = hits[b].sliding_block >= 0;
        if (complete) break;
        k--;
    }
    int32_t low = s->has_sliding ? window_low_block(s, k * bs) : 0;
    for (int32_t b = 0; b < k; b++) {
        gptoss_kv_retain(s->kv, GPTOSS_KV_POOL_FULL, hits[b].full_block);
        seq->full_blocks[b] = hits[b].full_block;
        seq->sliding_blocks[b] = -1;
        if (s->has_sliding && b >= low) {
            gptoss_kv_retain(s->kv, GPTOSS_KV_POOL_SLIDING, hits[b].sliding_block);
            seq->sliding_blocks[b] = hits[b].sliding_block;
        }
        seq->block_uids[b] = hits[b].uid;
    }
    seq->n_blocks = k;
    seq->n_cached = k * bs;
    seq->n_published = k;
    seq->sliding_low = low;
    if (hits != hits_small) free(hits);
}

/* Offers newly completed full blocks to the prefix cache. */
static void publish(gptoss_scheduler *s, gptoss_seq *seq) {
    const int32_t bs = s->block_size;
    if (!gptoss_kv_prefix_cache_enabled(s->kv)) return;
    int32_t n_full = seq->n_cached / bs;
    for (int32_t b = seq->n_published; b < n_full; b++) {
        uint64_t parent = b == 0 ? 0 : seq->block_uids[b - 1];
        /* A block whose parent is not in the cache cannot be named: a child entry with a
         * missing parent would be unreachable, and parent 0 means "first block". */
        if (b > 0 && parent == 0) {
            seq->block_uids[b] = 0;
            continue;
        }
        const uint8_t *digest = seq_digest(seq, b, bs);
        seq->block_uids[b] = gptoss_kv_register(
            s->kv, digest, parent, seq->salt_digest, &seq->tokens[(size_t)b * (size_t)bs],
            seq->full_blocks[b], s->has_sliding ? seq->sliding_blocks[b] : -1);
    }
    if (n_full > seq->n_published) seq->n_published = n_full;
}

/* ---- scheduler --------------------------------------------------------------------------- */

gptoss_status gptoss_scheduler_create(const gptoss_scheduler_options *options,
                                      gptoss_kv_manager *kv, gptoss_scheduler **out,
                                      gptoss_error *error) {
    *out = NULL;
    if (options->max_num_seqs < 1 || options->max_num_batched_tokens < 1 ||
        options->sliding_window < 0 || options->admit_headroom < 0)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "scheduler limits must be positive (max_num_seqs %d, "
                                "max_num_batched_tokens %d, sliding_window %d, admit_headroom %d)",
                                options->max_num_seqs, options->max_num_batched_tokens,
                                options->sliding_window, options->admit_headroom);
    if (options->sliding_window > 0 && !gptoss_kv_has_sliding(kv))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "a sliding window needs a sliding KV pool");
    gptoss_scheduler *s = calloc(1, sizeof *s);
    if (!s) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (scheduler)");
    s->options = *options;
    s->kv = kv;
    s->block_size = gptoss_kv_block_size(kv);
    s->has_sliding = options->sliding_window > 0;
    s->cap_seqs = options->max_num_seqs + 1;
    /* a decode with drafts asks a logits row per token */
    s->cap_logits = s->cap_seqs * (1 + GPTOSS_MAX_SPECULATIVE_TOKENS);
    s->cap_tokens = options->max_num_batched_tokens;
    s->plan_seqs = malloc((size_t)s->cap_seqs * sizeof(gptoss_seq *));
    s->seq_token_start = malloc((size_t)(s->cap_seqs + 1) * sizeof(int32_t));
    s->seq_n_cached = malloc((size_t)s->cap_seqs * sizeof(int32_t));
    s->logit_seqs = malloc((size_t)s->cap_logits * sizeof(gptoss_seq *));
    s->logit_index = malloc((size_t)s->cap_logits * sizeof(int32_t));
    s->token_ids = malloc((size_t)s->cap_tokens * sizeof(int32_t));
    s->positions = malloc((size_t)s->cap_tokens * sizeof(int32_t));
    if (!s->plan_seqs || !s->seq_token_start || !s->seq_n_cached || !s->logit_seqs ||
        !s->logit_index || !s->token_ids || !s->positions) {
        gptoss_scheduler_free(s);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory (scheduler buffers)");
    }
    *out = s;
    return GPTOSS_OK;
}

void gptoss_scheduler_free(gptoss_scheduler *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->running.n; i++) {
        release_pages(s, s->running.items[i]);
        gptoss_seq_free(s->running.items[i]);
    }
    for (int32_t i = 0; i < s->waiting.n; i++)
        gptoss_seq_free(s->waiting.items[i]);
    free(s->running.items);
    free(s->waiting.items);
    free(s->plan_seqs);
    free(s->seq_token_start);
    free(s->seq_n_cached);
    free(s->logit_seqs);
    free(s->logit_index);
    free(s->token_ids);
    free(s->positions);
    free(s->block_tables);
    free(s->sliding_tables);
    free(s);
}

void gptoss_scheduler_add(gptoss_scheduler *s, gptoss_seq *seq) {
    seq->state = GPTOSS_SEQ_WAITING;
    list_insert(&s->waiting, seq);
}

static gptoss_status build_plan(gptoss_scheduler *s, gptoss_batch_plan *plan, gptoss_error *error) {
    int32_t n_seqs = 0, n_tokens = 0, n_logits = 0, max_blocks = 1;
    for (int32_t i = 0; i < s->running.n; i++) {
        gptoss_seq *seq = s->running.items[i];
        if (seq->n_sched == 0) seq->n_draft = 0; /* not verified this step */
        if (seq->n_sched == 0) continue;
        if (seq->n_blocks > max_blocks) max_blocks = seq->n_blocks;
        assert(n_seqs < s->cap_seqs && n_tokens + seq->n_sched <= s->cap_tokens);
        s->plan_seqs[n_seqs] = seq;
        s->seq_token_start[n_seqs] = n_tokens;
        s->seq_n_cached[n_seqs] = seq->n_cached;
        for (int32_t t = 0; t < seq->n_sched; t++) {
            s->token_ids[n_tokens + t] = seq->tokens[seq->n_cached + t];
            s->positions[n_tokens + t] = seq->n_cached + t;
        }
        n_tokens += seq->n_sched;
        if (seq->n_draft > 0) { /* a decode with drafts: a row for each of its tokens */
            for (int32_t t = 0; t < seq->n_sched; t++) {
                s->logit_seqs[n_logits] = seq;
                s->logit_index[n_logits++] = n_tokens - seq->n_sched + t;
            }
        } else if (seq->n_cached + seq->n_sched == seq->n_tokens) {
            s->logit_seqs[n_logits] = seq;
            s->logit_index[n_logits++] = n_tokens - 1;
        }
        n_seqs++;
    }
    s->seq_token_start[n_seqs] = n_tokens;
    int64_t table = (int64_t)(n_seqs > 0 ? n_seqs : 1) * max_blocks;
    if (table > s->cap_table) {
        int32_t *full = realloc(s->block_tables, (size_t)table * sizeof(int32_t));
        if (full) s->block_tables = full;
        int32_t *sliding = realloc(s->sliding_tables, (size_t)table * sizeof(int32_t));
        if (sliding) s->sliding_tables = sliding;
        if (!full || !sliding)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                    "out of memory (block tables of %lld entries)",
                                    (long long)table);
        s->cap_table = table;
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        const gptoss_seq *seq = s->plan_seqs[i];
        int32_t *full = &s->block_tables[(size_t)i * (size_t)max_blocks];
        int32_t *sliding = &s->sliding_tables[(size_t)i * (size_t)max_blocks];
        for (int32_t b = 0; b < max_blocks; b++) {
            full[b] = b < seq->n_blocks ? seq->full_blocks[b] : -1;
            sliding[b] = b < seq->n_blocks ? seq->sliding_blocks[b] : -1;
        }
    }
    s->n_plan_seqs = n_seqs;
    memset(plan, 0, sizeof *plan);
    plan->n_tokens = n_tokens;
    plan->token_ids = s->token_ids;
    plan->positions = s->positions;
    plan->n_seqs = n_seqs;
    plan->seq_token_start = s->seq_token_start;
    plan->seq_n_cached = s->seq_n_cached;
    plan->max_blocks_per_seq = max_blocks;
    plan->block_tables = s->block_tables;
    plan->sliding_block_tables = s->has_sliding ? s->sliding_tables : NULL;
    plan->n_logits = n_logits;
    plan->logit_token_index = s->logit_index;
    return GPTOSS_OK;
}

gptoss_status gptoss_scheduler_schedule(gptoss_scheduler *s, gptoss_batch_plan *plan,
                                        gptoss_error *error) {
    s->budget = s->options.max_num_batched_tokens;
    const uint64_t preemptions_before = s->counters.preemptions;
    for (int32_t i = 0; i < s->running.n; i++)
        s->running.items[i]->n_sched = 0;

    /* 1. Decodes first, FCFS: a long prompt never delays the token of a running request. */
    for (int32_t i = 0; i < s->running.n && s->budget > 0; i++) {
        gptoss_seq *seq = s->running.items[i];
        if (seq->n_tokens - seq->n_cached != 1) {
            seq->n_draft = 0;
            continue;
        }
        /* Drafts only in what is free: they never preempt anyone nor take the budget's last
         * token from this decode. */
        if (seq->n_draft > 0) {
            int32_t room = tokens_that_fit(s, seq) - 1;
            if (room > s->budget - 1) room = s->budget - 1;
            if (seq->n_draft > room) seq->n_draft = room > 0 ? room : 0;
        }
        const int32_t want = 1 + seq->n_draft;
        if (reserve(s, seq, want, RESERVE_DECODE) == want) {
            seq->n_sched = want;
            s->budget -= want;
        } else {
            i--; /* seq left the running list */
        }
    }
    /* 2. Prefill chunks of running sequences, FCFS. */
    for (int32_t i = 0; i < s->running.n && s->budget > 0; i++) {
        gptoss_seq *seq = s->running.items[i];
        int32_t remaining = seq->n_tokens - seq->n_cached;
        if (remaining <= 1 || seq->n_sched > 0) continue;
        int32_t want = remaining < s->budget ? remaining : s->budget;
        int32_t got = reserve(s, seq, want, RESERVE_PREFILL);
        seq->n_sched = got;
        s->budget -= got;
    }
    /* 3. Admit waiting sequences, FCFS: stop at the first that cannot start. Not in a step
     * that had to preempt: memory is short, and readmitting the victim would only thrash.
     * Nor, while others run, when its whole remaining prompt would leave fewer than
     * admit_headroom free tokens per running sequence: the decode steps that follow would
     * preempt the newest sequence, this one, and its prompt would be computed again. With
     * admit_headroom 0 a sequence starts in whatever pages are free, its prompt cut short. */
    while (s->waiting.n > 0 && s->budget > 0 && s->counters.preemptions == preemptions_before) {
        gptoss_seq *seq = s->waiting.items[0];
        if (s->running.n > 0 && s->running.n + seq->n_slots > s->options.max_num_seqs) break;
        bool looked_up = seq->n_cached == 0 && seq->n_blocks == 0;
        if (looked_up) acquire_prefix(s, seq);
        int32_t remaining = seq->n_tokens - seq->n_cached;
        if (s->options.admit_headroom > 0 && s->running.n > 0 &&
            (int64_t)tokens_that_fit(s, seq) - remaining <
                (int64_t)s->options.admit_headroom * s->running.n) {
            release_pages(s, seq);
            break;
        }
        int32_t want = remaining < s->budget ? remaining : s->budget;
        int32_t got = reserve(s, seq, want, RESERVE_ADMIT);
        if (got == 0) {
            release_pages(s, seq);
            break;
        }
        if (looked_up && gptoss_kv_prefix_cache_enabled(s->kv)) {
            s->counters.prefix_query_tokens += (uint64_t)seq->n_tokens;
            s->counters.prefix_hit_tokens += (uint64_t)seq->n_cached;
        }
        if (!seq->started) {
            seq->started = true;
            seq->n_cached_prompt = seq->n_cached < seq->n_prompt ? seq->n_cached : seq->n_prompt;
        }
        list_remove(&s->waiting, seq);
        seq->state = GPTOSS_SEQ_RUNNING;
        seq->n_sched = got;
        s->budget -= got;
        list_insert(&s->running, seq);
    }
    return build_plan(s, plan, error);
}

gptoss_seq *gptoss_scheduler_logit_seq(const gptoss_scheduler *s, int32_t i) {
    return s->logit_seqs[i];
}
gptoss_seq *gptoss_scheduler_plan_seq(const gptoss_scheduler *s, int32_t i) {
    return s->plan_seqs[i];
}

void gptoss_scheduler_commit(gptoss_scheduler *s) {
    for (int32_t i = 0; i < s->n_plan_seqs; i++) {
        gptoss_seq *seq = s->plan_seqs[i];
        seq->n_cached += seq->n_sched;
        /* Drafts' KV counts only once accepted (gptoss_scheduler_accept_drafts). */
        if (seq->n_cached > seq->n_tokens) seq->n_cached = seq->n_tokens;
        seq->n_sched = 0;
        publish(s, seq);
        release_out_of_window(s, seq);
    }
    s->n_plan_seqs = 0;
}

void gptoss_scheduler_abort_step(gptoss_scheduler *s) {
    for (int32_t i = 0; i < s->n_plan_seqs; i++) {
        s->plan_seqs[i]->n_sched = 0;
        s->plan_seqs[i]->n_draft = 0;
    }
    s->n_plan_seqs = 0;
}

void gptoss_scheduler_accept_drafts(gptoss_scheduler *s, gptoss_seq *seq, int32_t n_accepted) {
    assert(n_accepted >= 0 && n_accepted <= seq->n_draft && seq->n_cached == seq->n_tokens);
    seq->n_cached += n_accepted;
    seq->n_draft = 0;
    /* Pages wholly past the accepted KV go back; the partly written last one is kept and its
     * rejected slots are overwritten by the next steps before anything reads them. */
    const int32_t keep = blocks_for(seq->n_cached, s->block_size);
    for (int32_t b = seq->n_blocks - 1; b >= keep; b--) {
        if (s->has_sliding && seq->sliding_blocks[b] >= 0)
            gptoss_kv_release(s->kv, GPTOSS_KV_POOL_SLIDING, seq->sliding_blocks[b]);
        gptoss_kv_release(s->kv, GPTOSS_KV_POOL_FULL, seq->full_blocks[b]);
        seq->n_blocks--;
    }
    publish(s, seq);
    release_out_of_window(s, seq);
}

void gptoss_scheduler_finish(gptoss_scheduler *s, gptoss_seq *seq) {
    if (seq->state == GPTOSS_SEQ_RUNNING)
        list_remove(&s->running, seq);
    else if (seq->state == GPTOSS_SEQ_WAITING)
        list_remove(&s->waiting, seq);
    release_pages(s, seq);
    seq->n_sched = 0;
    seq->state = GPTOSS_SEQ_FINISHED;
}

gptoss_status gptoss_scheduler_fork(gptoss_scheduler *s, gptoss_seq *parent, int32_t index,
                                    gptoss_seq **out, gptoss_error *error) {
    const int32_t bs = s->block_size;
    gptoss_seq *child;
    gptoss_status st =
        gptoss_seq_create(parent->tokens, parent->n_prompt, parent->cap_tokens, bs,
                          parent->priority, index, parent->salt_digest, &child, error);
    if (st != GPTOSS_OK) return st;
    /* Share only full, completely written blocks: they are immutable. */
    int32_t shared = parent->n_cached < parent->n_prompt ? parent->n_cached : parent->n_prompt;
    shared /= bs;
    if (shared > parent->n_blocks) shared = parent->n_blocks;
    for (int32_t b = 0; b < shared; b++) {
        gptoss_kv_retain(s->kv, GPTOSS_KV_POOL_FULL, parent->full_blocks[b]);
        child->full_blocks[b] = parent->full_blocks[b];
        child->sliding_blocks[b] = -1;
        if (s->has_sliding && parent->sliding_blocks[b] >= 0) {
            gptoss_kv_retain(s->kv, GPTOSS_KV_POOL_SLIDING, parent->sliding_blocks[b]);
            child->sliding_blocks[b] = parent->sliding_blocks[b];
        }
        child->block_uids[b] = b < parent->n_published ? parent->block_uids[b] : 0;
    }
    int32_t n_digests = parent->n_digests < shared ? parent->n_digests : shared;
    memcpy(child->block_digests, parent->block_digests, (size_t)n_digests * GPTOSS_SHA256_BYTES);
    child->n_digests = n_digests;
    child->n_blocks = shared;
    child->n_cached = shared * bs;
    child->n_published = parent->n_published < shared ? parent->n_published : shared;
    child->sliding_low = s->has_sliding ? window_low_block(s, child->n_cached) : 0;
    /* Pages below the child's window were dropped by the parent already (same block-aligned
     * rule), and those at or above it are present. */
    child->started = true;
    child->n_cached_prompt = parent->n_cached_prompt;
    child->user = NULL;
    child->state = GPTOSS_SEQ_RUNNING;
    list_insert(&s->running, child);
    *out = child;
    return GPTOSS_OK;
}

int32_t gptoss_scheduler_n_running(const gptoss_scheduler *s) {
    return s->running.n;
}
int32_t gptoss_scheduler_n_waiting(const gptoss_scheduler *s) {
    return s->waiting.n;
}
gptoss_seq *gptoss_scheduler_running(const gptoss_scheduler *s, int32_t i) {
    return s->running.items[i];
}
gptoss_seq *gptoss_scheduler_waiting(const gptoss_scheduler *s, int32_t i) {
    return s->waiting.items[i];
}
gptoss_scheduler_counters gptoss_scheduler_get_counters(const gptoss_scheduler *s) {
    return s->counters;
}
