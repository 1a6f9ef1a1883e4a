/*
 * fake_backend.h - a stand-in backend for engine tests (included by test_*.c; not a test).
 *
 * It keeps real paged KV pools, but a "KV entry" is a 32-bit chain value: like real KV, the
 * entry of position p depends on the token there and on everything before it (it is mixed
 * from the entry of p - 1, read back through the block table). For every new token it writes
 * its slot, then reads the visible context exactly as attention would: positions [0, p]
 * through the full table and the last `window` positions through the sliding table. Logits
 * are a hash of what it read. So any bookkeeping bug in the engine (a wrong page, a page reused or
 * shared while still needed, a missing window page, a bad prefix-cache hit) changes the logits and
 * the greedy output, while a correct engine reproduces fake_reference_logits(), which is computed
 * from the token list alone. fake_forward_sample() is the engine's seam: the logits, then the
 * batch's masks (fill_masks), then each row drawn by the host reference sampler, as a backend
 * without a device sampler does.
 */
#ifndef GPTOSS_TESTS_FAKE_BACKEND_H
#define GPTOSS_TESTS_FAKE_BACKEND_H

#include "backend/sampling_ref.h"
#include "gptoss.h"
#include "util/error.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct fake_backend {
    int32_t vocab;       /* logits row width */
    int32_t block_size;  /* tokens per page */
    int32_t n_blocks;    /* full pool pages */
    int32_t n_sliding;   /* sliding pool pages (0 = no sliding layers) */
    int32_t window;      /* sliding window incl. self; 0 = none */
    int64_t *full_slots; /* [n_blocks * block_size] (position << 32 | chain value) + 1, 0 = never
                            written */
    int64_t *sliding_slots;
    gptoss_config config;       /* what gptoss_batch_plan_validate checks against */
    atomic_int calls;           /* forward calls */
    atomic_int fail_at_call;    /* > 0: that call fails with GPTOSS_ERR_BACKEND */
    int32_t delay_us;           /* sleep per call (to make streaming observable) */
    int32_t max_tokens_in_plan; /* largest n_tokens seen */
    int32_t max_seqs_in_plan;   /* largest n_seqs seen */
    int32_t bad_reads;          /* slots read that did not hold the expected position */
    bool shared;                /* sliding pages are the full pages (fake_share_pages) */
    bool run_hook;              /* run the batch's while_running hook before computing */
    float *rows;                /* [cap_rows, vocab] logits of the last forward_sample */
    int32_t cap_rows;
    uint32_t *masks; /* [cap_masks, (vocab + 31) / 32] what the batch's fill_masks writes */
    int32_t cap_masks;
    int forward_done; /* calls whose forward finished before their masks were asked for */
    gptoss_sample_scratch *scratch;
} fake_backend;

static inline uint64_t fake_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* The logits a context hash pair maps to. */
static inline void fake_logits_from(uint64_t full_hash, uint64_t window_hash, int32_t vocab,
                                    float *row) {
    for (int32_t v = 0; v < vocab; v++) {
        uint64_t h =
            fake_mix(full_hash * 31 + window_hash * 0x9e3779b97f4a7c15ull + (uint64_t)v * 7919);
        row[v] = (float)((double)(h >> 40) / (double)(1 << 24) * 8.0 - 4.0);
    }
}

/* The KV "entry" of a position: the previous entry mixed with this token and position. */
static inline uint32_t fake_chain(uint32_t previous, int32_t token, int32_t position) {
    return (uint32_t)(fake_mix((uint64_t)previous << 32 ^ (uint64_t)(uint32_t)token << 8 ^
                               (uint64_t)position) >>
                      32);
}

/* Reference: logits after tokens[0..n) (the last token at position n-1), from the list. */
static inline void fake_reference_logits(const int32_t *tokens, int32_t n, int32_t window,
                                         int32_t vocab, float *row) {
    uint64_t full_hash = 1469598103934665603ull, window_hash = 7;
    uint32_t chain = 0;
    int32_t lo = window > 0 && n - window > 0 ? n - window : 0;
    for (int32_t j = 0; j < n; j++) {
        chain = fake_chain(chain, tokens[j], j);
        full_hash = fake_mix(full_hash ^ ((uint64_t)chain << 20 ^ (uint64_t)j));
        if (window > 0 && j >= lo)
            window_hash = fake_mix(window_hash ^ ((uint64_t)chain << 20 ^ (uint64_t)j));
    }
    fake_logits_from(full_hash, window_hash, vocab, row);
}

/* Greedy continuation per the reference (argmax, lowest id on ties), stopping at eos (>= 0)
 * or after max_new tokens. Returns tokens generated, written to out. */
static inline int32_t fake_reference_greedy(const int32_t *prompt, int32_t n_prompt,
                                            int32_t max_new, int32_t eos, int32_t window,
                                            int32_t vocab, int32_t *out) {
    int32_t *ctx = malloc((size_t)(n_prompt + max_new) * sizeof(int32_t));
    float *row = malloc((size_t)vocab * sizeof(float));
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof(int32_t));
    int32_t n = n_prompt, made = 0;
    while (made < max_new) {
        fake_reference_logits(ctx, n, window, vocab, row);
        int32_t best = 0;
        for (int32_t v = 1; v < vocab; v++)
            if (row[v] > row[best]) best = v;
        ctx[n++] = best;
        out[made++] = best;
        if (best == eos) break;
    }
    free(ctx);
    free(row);
    return made;
}

static inline gptoss_status fake_forward(void *user, const gptoss_batch_plan *plan, float *logits,
                                         gptoss_error *error) {
    fake_backend *f = user;
    int call = atomic_fetch_add(&f->calls, 1) + 1;
    if (f->delay_us > 0) nanosleep(&(struct timespec){0, (long)f->delay_us * 1000L}, NULL);
    if (atomic_load(&f->fail_at_call) == call)
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "injected device failure at call %d",
                                call);
    gptoss_status st = gptoss_batch_plan_validate(plan, &f->config, f->block_size, f->n_blocks,
                                                  f->n_sliding ? f->n_sliding : f->n_blocks, error);
    if (st != GPTOSS_OK) return st;
    if (plan->n_tokens > f->max_tokens_in_plan) f->max_tokens_in_plan = plan->n_tokens;
    if (plan->n_seqs > f->max_seqs_in_plan) f->max_seqs_in_plan = plan->n_seqs;
    const int32_t bs = f->block_size;
    int32_t next_logit = 0;
    for (int32_t s = 0; s < plan->n_seqs; s++) {
        const int32_t *full = plan->block_tables + (size_t)s * (size_t)plan->max_blocks_per_seq;
        const int32_t *sliding =
            plan->sliding_block_tables
                ? plan->sliding_block_tables + (size_t)s * (size_t)plan->max_blocks_per_seq
                : full;
        int64_t *sliding_pool =
            f->window > 0 && plan->sliding_block_tables ? f->sliding_slots : f->full_slots;
        for (int32_t t = plan->seq_token_start[s]; t < plan->seq_token_start[s + 1]; t++) {
            int32_t pos = plan->positions[t];
            uint32_t previous = 0;
            if (pos > 0) {
                int64_t e = f->full_slots[(size_t)full[(pos - 1) / bs] * bs + (pos - 1) % bs] - 1;
                if (e < 0 || (e >> 32) != pos - 1) f->bad_reads++;
                previous = (uint32_t)(e & 0xffffffff);
            }
            int64_t entry =
                ((int64_t)pos << 32 | fake_chain(previous, plan->token_ids[t], pos)) + 1;
            f->full_slots[(size_t)full[pos / bs] * bs + pos % bs] = entry;
            if (f->window > 0) sliding_pool[(size_t)sliding[pos / bs] * bs + pos % bs] = entry;
            /* Attention reads: every cached position through the tables. */
            uint64_t full_hash = 1469598103934665603ull, window_hash = 7;
            for (int32_t j = 0; j <= pos; j++) {
                int64_t e = f->full_slots[(size_t)full[j / bs] * bs + j % bs] - 1;
                if (e < 0 || (e >> 32) != j) f->bad_reads++;
                full_hash = fake_mix(full_hash ^ ((uint64_t)(e & 0xffffffff) << 20 ^ (uint64_t)j));
            }
            if (f->window > 0) {
                int32_t lo = pos + 1 - f->window < 0 ? 0 : pos + 1 - f->window;
                for (int32_t j = lo; j <= pos; j++) {
                    int64_t e = sliding_pool[(size_t)sliding[j / bs] * bs + j % bs] - 1;
                    if (e < 0 || (e >> 32) != j) f->bad_reads++;
                    window_hash =
                        fake_mix(window_hash ^ ((uint64_t)(e & 0xffffffff) << 20 ^ (uint64_t)j));
                }
            }
            while (next_logit < plan->n_logits && plan->logit_token_index[next_logit] == t) {
                fake_logits_from(full_hash, window_hash, f->vocab,
                                 logits + (size_t)next_logit * f->vocab);
                next_logit++;
            }
        }
    }
    return GPTOSS_OK;
}

/* gptoss_backend_forward_sample's contract: the batch is validated, the logits computed, each
 * row drawn by the host reference (sampling_ref.h). */
static inline gptoss_status fake_forward_sample(void *user, const gptoss_batch_plan *plan,
                                                const gptoss_sample_batch *batch,
                                                gptoss_error *error) {
    fake_backend *f = user;
    gptoss_status st = gptoss_sample_batch_validate(batch, plan->n_logits, f->vocab, error);
    if (st != GPTOSS_OK) return st;
    if (plan->n_logits > f->cap_rows) {
        free(f->rows);
        f->cap_rows = plan->n_logits;
        f->rows = malloc((size_t)f->cap_rows * (size_t)f->vocab * sizeof(float));
        if (!f->rows) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (!f->scratch && gptoss_sample_scratch_create(f->vocab, &f->scratch, error) != GPTOSS_OK)
        return error ? error->status : GPTOSS_ERR_OUT_OF_MEMORY;
    if (f->run_hook && batch->while_running) batch->while_running(batch->while_running_user);
    if (batch && batch->fill_masks && batch->n_allowed_rows > f->cap_masks) {
        free(f->masks);
        f->cap_masks = batch->n_allowed_rows;
        f->masks = malloc((size_t)f->cap_masks * (((size_t)f->vocab + 31) / 32) * sizeof(uint32_t));
        if (!f->masks) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    st = fake_forward(user, plan, f->rows, error);
    if (st != GPTOSS_OK || plan->n_logits == 0) return st;
    /* the logits exist: the masks are built now, as a device backend builds them while its
     * forward runs */
    f->forward_done = atomic_load(&f->calls);
    gptoss_sample_batch filled;
    st = gptoss_sample_batch_fill_masks(batch, f->masks, &filled, error);
    if (st != GPTOSS_OK) return st;
    gptoss_sample_rows(f->rows, f->vocab, plan->n_logits, &filled, &f->scratch, 1);
    return GPTOSS_OK;
}

static inline fake_backend *fake_create(int32_t vocab, int32_t block_size, int32_t n_blocks,
                                        int32_t n_sliding, int32_t window) {
    fake_backend *f = calloc(1, sizeof *f);
    f->vocab = vocab;
    f->block_size = block_size;
    f->n_blocks = n_blocks;
    f->n_sliding = window > 0 ? (n_sliding ? n_sliding : n_blocks) : 0;
    f->window = window;
    f->full_slots = calloc((size_t)n_blocks * block_size, sizeof(int64_t));
    f->sliding_slots =
        calloc((size_t)(f->n_sliding ? f->n_sliding : 1) * block_size, sizeof(int64_t));
    f->config.vocab_size = vocab;
    f->config.sliding_window = window > 0 ? window : 1 << 30;
    f->config.max_position_embeddings = 1 << 30;
    atomic_init(&f->calls, 0);
    atomic_init(&f->fail_at_call, 0);
    return f;
}

/* Sliding pages become the full pages' memory, as a backend with kv_shared_pages does: the
 * engine must then never hand one page id to both pools at once. */
static inline void fake_share_pages(fake_backend *f) {
    if (f->window <= 0 || f->shared) return;
    free(f->sliding_slots);
    f->sliding_slots = f->full_slots;
    f->n_sliding = f->n_blocks;
    f->shared = true;
}

static inline void fake_free(fake_backend *f) {
    if (!f) return;
    free(f->full_slots);
    if (!f->shared) free(f->sliding_slots);
    free(f->rows);
    free(f->masks);
    gptoss_sample_scratch_free(f->scratch);
    free(f);
}

#endif
