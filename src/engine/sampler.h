/*
 * sampler.h - turns one row of logits into the next token (host side).
 *
 * Owns per-engine scratch buffers (vocab-sized) so the hot path allocates nothing, and the
 * per-sequence random generator (xoshiro256**). Processing order follows vLLM: stop tokens
 * masked while fewer than min_tokens were generated, repetition / frequency / presence
 * penalties, then greedy argmax when temperature is 0, else temperature, min_p, top_k, top_p
 * and a draw from the remaining distribution. Logprobs are of the raw model distribution.
 * It must not know about requests or threads: callers pass the token history explicitly.
 */
#ifndef GPTOSS_ENGINE_SAMPLER_H
#define GPTOSS_ENGINE_SAMPLER_H

#include "engine/engine.h"

#include <stdint.h>

/* xoshiro256**: a small, fast generator; one per sequence so a seeded request draws the
 * same numbers whatever else runs in the batch. */
typedef struct gptoss_rng {
    uint64_t s[4];
} gptoss_rng;

/* Seeds from (seed, stream) through splitmix64; stream separates the n choices. */
void gptoss_rng_seed(gptoss_rng *rng, uint64_t seed, uint64_t stream);
uint64_t gptoss_rng_next(gptoss_rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double gptoss_rng_uniform(gptoss_rng *rng);

/* The token history the penalties and min_tokens look at. */
typedef struct gptoss_sample_history {
    const int32_t *prompt; /* [n_prompt] */
    int32_t n_prompt;
    const int32_t *output; /* [n_output] generated so far */
    int32_t n_output;
    const int32_t *masked; /* [n_masked] tokens forbidden this draw (stop tokens < min_tokens) */
    int32_t n_masked;
} gptoss_sample_history;

typedef struct gptoss_sampler gptoss_sampler;

gptoss_status gptoss_sampler_create(int32_t vocab_size, gptoss_sampler **out, gptoss_error *error);
void gptoss_sampler_free(gptoss_sampler *sampler);

/* The final distribution the draw uses: *n_out candidates in decreasing probability (ties by
 * token id), tokens and probabilities (summing to 1) in sampler-owned arrays valid until the
 * next call. Greedy yields the single argmax. Exposed so tests can compare every mask with
 * a brute-force reference. */
int32_t gptoss_sampler_distribution(gptoss_sampler *sampler, const gptoss_sampling_params *params,
                                    const gptoss_sample_history *history, const float *logits,
                                    const int32_t **tokens_out, const double **probs_out);

/* Draws the next token (one uniform from rng unless greedy). */
int32_t gptoss_sampler_sample(gptoss_sampler *sampler, const gptoss_sampling_params *params,
                              const gptoss_sample_history *history, const float *logits,
                              gptoss_rng *rng);

/*
 * Summaries (the n_top largest logits of a row, larger first, ties by lower id): whether a
 * draw with these parameters and n_masked masked tokens picks exactly what it would pick from
 * the whole row. True without penalties when greedy (n_masked < n_top) or when top_k keeps
 * fewer than n_top - n_masked tokens: nothing outside the summary can then be drawn, and the
 * kept set, its weights and the walk order are the same. (One caveat, also true of the whole
 * row: tokens whose different logits round to the same weight tie by id.)
 */
bool gptoss_sampler_summary_exact(const gptoss_sampling_params *params, int32_t n_masked,
                                  int32_t n_top);

/* Draws from a summary (top_ids / top_logits [n_top]); valid when summary_exact said so. */
int32_t gptoss_sampler_sample_summary(gptoss_sampler *sampler, const gptoss_sampling_params *params,
                                      const gptoss_sample_history *history, const int32_t *top_ids,
                                      const float *top_logits, int32_t n_top, gptoss_rng *rng);

/* Raw-model logprob of `token` and the n_top most likely tokens (n_top <= 20), highest
 * first, ties by token id. */
float gptoss_sampler_logprobs(const float *logits, int32_t vocab_size, int32_t token, int32_t n_top,
                              gptoss_token_logprob *top);

#endif
