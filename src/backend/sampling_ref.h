/*
 * sampling_ref.h - the host reference of the sampling rule (sampling_rule.h): one logits row
 * and one gptoss_sample_row in, the token the rule picks out. Backends without a sampler of
 * their own (the CPU backend) draw with it, and every device sampler is tested against it.
 *
 * Also here: the raw-model logprobs a row asks for, the validation of a gptoss_sample_batch
 * (shared by backend.c and test fakes), and a batch helper that samples host rows in parallel.
 * It owns per-thread scratch (vocabulary-sized, allocated once); it must not allocate while
 * drawing.
 */
#ifndef GPTOSS_BACKEND_SAMPLING_REF_H
#define GPTOSS_BACKEND_SAMPLING_REF_H

#include "gptoss.h"

#include <stdint.h>

/* Scratch for one thread's draws over a vocabulary of a given size. */
typedef struct gptoss_sample_scratch gptoss_sample_scratch;

gptoss_status gptoss_sample_scratch_create(int32_t vocab_size, gptoss_sample_scratch **out,
                                           gptoss_error *error);
void gptoss_sample_scratch_free(gptoss_sample_scratch *scratch); /* NULL ok */

/*
 * The token the rule picks from logits[0..vocab) for `row`. edits: the row's own edits
 * (row->n_edits entries, sorted by token, distinct, tokens in range: the caller validated
 * them); allowed_mask: (vocab + 31) / 32 words, or NULL (every token allowed). scratch must
 * have been created for at least `vocab` tokens.
 *
 * When no token has a positive weight (every processed logit is -inf, or a logit is +inf)
 * the rule has nothing to draw from; the result is then the greedy token (largest processed
 * logit, lowest id; token 0 when all are -inf).
 */
int32_t gptoss_sample_reference(const float *logits, int32_t vocab, const gptoss_sample_row *row,
                                const gptoss_sample_edit *edits, const uint32_t *allowed_mask,
                                gptoss_sample_scratch *scratch);

/* weight[j] = W of processed logit m[j] for the row's maximum mx and scale (the rule's
 * gptoss_sampling_weight(gptoss_sampling_log2_weight(m[j], mx, scale)), an integer up to 2^32
 * held exactly as a float), for all n tokens at once (vectorized). */
void gptoss_sample_weights(const float *m, float *weight, int32_t n, float mx, float scale);

/*
 * Raw-model logprobs of one row (l - logsumexp(l), NaN logits as -inf): returns the logprob of
 * `token`, and writes the n_top (0..GPTOSS_MAX_SAMPLE_LOGPROBS) most likely tokens, highest
 * first, ties by lower id, to top_ids / top_logprobs (may be NULL when n_top is 0).
 */
float gptoss_sample_logprobs(const float *logits, int32_t vocab, int32_t token, int32_t n_top,
                             int32_t *top_ids, float *top_logprobs);

/* Checks a batch of n_rows rows for a vocabulary: rows' parameters in range, edits in range,
 * sorted and distinct per row, allowed rows in range, the output arrays the rows need. */
gptoss_status gptoss_sample_batch_validate(const gptoss_sample_batch *batch, int32_t n_rows,
                                           int32_t vocab, gptoss_error *error);

/* The batch with its masks in host memory: *out = *batch, and when batch->fill_masks is set,
 * the hook is run into masks (room for batch->n_allowed_rows rows of (vocab + 31) / 32 words)
 * and *out reads them instead. Call it after the logits exist, before drawing. */
gptoss_status gptoss_sample_batch_fill_masks(const gptoss_sample_batch *batch, uint32_t *masks,
                                             gptoss_sample_batch *out, gptoss_error *error);

/* Samples n_rows host rows (logits [n_rows, vocab]) into batch's outputs, rows spread over
 * up to n_scratch threads (OpenMP), thread t using scratch[t]. The batch must be valid. */
void gptoss_sample_rows(const float *logits, int32_t vocab, int32_t n_rows,
                        const gptoss_sample_batch *batch, gptoss_sample_scratch *const *scratch,
                        int32_t n_scratch);

#endif
