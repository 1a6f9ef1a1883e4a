/*
 * sampler.h - what the engine knows about sampling: the request parameters (defaults,
 * validation), how they become a gptoss_sample_row for one draw, and the per-choice token
 * counts from which each draw's edits (logit_bias, masked stop tokens, penalties) are built.
 *
 * The draw itself happens where the logits are (gptoss_backend_forward_sample; on the host,
 * the reference in backend/sampling_ref.c), by the one rule of backend/sampling_rule.h. This
 * file must not know about requests or threads: callers pass parameters and histories.
 */
#ifndef GPTOSS_ENGINE_SAMPLER_H
#define GPTOSS_ENGINE_SAMPLER_H

#include "gptoss_engine.h"

#include <stdint.h>

/* xoshiro256**: seeds for requests that bring none (the engine's own entropy). */
typedef struct gptoss_rng {
    uint64_t s[4];
} gptoss_rng;

/* Seeds from (seed, stream) through splitmix64. */
void gptoss_rng_seed(gptoss_rng *rng, uint64_t seed, uint64_t stream);
uint64_t gptoss_rng_next(gptoss_rng *rng);

/* Temperatures below this are greedy (temperature 0 in the row). */
#define GPTOSS_GREEDY_TEMPERATURE 1e-5f

/* The row of one draw: the parameters of p, Philox key `seed`, counter (position of the token
 * being drawn, choice). Edits and the allowed row are left empty (-1 for allowed_row). */
gptoss_sample_row gptoss_sampler_row(const gptoss_sampling_params *p, uint64_t seed,
                                     int64_t position, int32_t choice);

/* Whether draws with p need token counts (repetition, frequency or presence penalty). */
bool gptoss_sampler_needs_counts(const gptoss_sampling_params *p);

/*
 * One choice's tokens, each once, sorted by token: how often it was generated and whether the
 * prompt holds it. Appending a token costs O(log distinct) (plus a move when it is new), so
 * building a draw's edits costs O(distinct tokens), never O(history).
 */
typedef struct gptoss_token_count {
    int32_t token;
    int32_t output_count; /* times generated */
    uint8_t in_prompt;
} gptoss_token_count;

typedef struct gptoss_token_counts {
    gptoss_token_count *entries; /* [n] sorted by token */
    int32_t n, cap;
} gptoss_token_counts;

/* Counts of a prompt (nothing generated yet). false: out of memory. */
bool gptoss_token_counts_init(gptoss_token_counts *c, const int32_t *prompt, int32_t n_prompt);
/* One more generated token. false: out of memory (c unchanged). */
bool gptoss_token_counts_add_output(gptoss_token_counts *c, int32_t token);
/* dst = src (dst uninitialized). false: out of memory. */
bool gptoss_token_counts_copy(gptoss_token_counts *dst, const gptoss_token_counts *src);
void gptoss_token_counts_free(gptoss_token_counts *c);

/*
 * The edits of one draw, sorted by token, each token once, written to out (room for
 * p->n_logit_bias + n_masked + counts->n entries): p's logit_bias (its tokens sorted
 * ascending), masked[0..n_masked) (sorted ascending, distinct), and when counts is not NULL the
 * tokens the penalties of p touch (seen: in the prompt or generated, when the repetition
 * penalty is on; output_count when generated). Returns the number written.
 */
int32_t gptoss_sampler_edits(const gptoss_sampling_params *p, const int32_t *masked,
                             int32_t n_masked, const gptoss_token_counts *counts,
                             gptoss_sample_edit *out);

#endif
