/*
 * speculative.h - the rules of speculative decoding that need no engine state: how many
 * drafts a sequence gets this step (the automatic switch), how many of them a step accepted,
 * and each sequence's moving acceptance.
 *
 * The switch: drafting costs compute (1 + k positions per sequence and step instead of 1),
 * which is free while a step is bound by reading the weights (few decoding sequences) and a
 * loss once it is bound by arithmetic. So above max_batch decoding sequences nobody drafts and
 * above max_batch / 2 k is halved; a sequence whose drafts keep failing (moving acceptance
 * below min_acceptance) stops drafting for cooldown_steps of its steps, then tries again; and
 * each step verifies only as many drafts as the measured cost of wider steps pays for.
 * Engine thread only.
 */
#ifndef GPTOSS_ENGINE_SPECULATIVE_H
#define GPTOSS_ENGINE_SPECULATIVE_H

#include "gptoss_engine.h"

#include <stdint.h>

/* One sequence's drafting record. */
/* One sequence's drafting record. Its acceptance is the probability that a draft is right
 * given the drafts before it were: a step judges its accepted drafts and the first rejected
 * one (the drafts after that one say nothing), and acceptance = hits / judged over decaying
 * counts (the past decays by 0.8 a step, from a prior of 2 of 2), so it does not depend on
 * k. */
typedef struct gptoss_spec_state {
    float hits, judged; /* decaying counts of drafts accepted / judged */
    int32_t cooldown;   /* steps left without drafting */
} gptoss_spec_state;

/* The acceptance of a record (see above). */
float gptoss_spec_acceptance(const gptoss_spec_state *st);

/* A fresh record (drafting on). */
gptoss_spec_state gptoss_spec_state_init(void);

/* The k of a step with n_decoding decoding sequences: 0 (nobody drafts) above max_batch,
 * k halved (rounded up) above max_batch / 2, else num_speculative_tokens. */
int32_t gptoss_spec_step_k(const gptoss_draft_options *o, int32_t n_decoding);

/* The k of one sequence this step: step_k, or 0 while it cools down (counting the step). */
int32_t gptoss_spec_seq_k(gptoss_spec_state *st, int32_t step_k);

/* Records a verified step: n_accepted of n_drafted drafts matched (n_drafted > 0). Starts
 * the cooldown when the acceptance fell below min_acceptance. */
void gptoss_spec_seq_update(const gptoss_draft_options *o, gptoss_spec_state *st, int32_t n_drafted,
                            int32_t n_accepted);

/*
 * What drafting costs, measured: the seconds of a decode step (every token of it has a logits
 * row) by its width in tokens, a moving average per width. A width's first sample is dropped
 * (it may include one-time work such as capturing a CUDA graph), the average starts from the
 * lower of the next two (a step slowed by something else, such as a busy host, does not
 * decide), and every GPTOSS_SPEC_COST_REFRESH recorded steps all widths are sampled again, so
 * one slow step does not rule a width out for good.
 */
#define GPTOSS_SPEC_MAX_WIDTH 1024
#define GPTOSS_SPEC_COST_REFRESH 512

typedef struct gptoss_spec_costs {
    float seconds[GPTOSS_SPEC_MAX_WIDTH + 1]; /* by width; valid where samples >= 3 */
    uint8_t samples[GPTOSS_SPEC_MAX_WIDTH + 1];
    int32_t n_recorded;
} gptoss_spec_costs;

void gptoss_spec_costs_record(gptoss_spec_costs *c, int32_t width, double seconds);

/* The cap on drafts per sequence that maximizes expected tokens per second for a step of
 * n_decoding decoding sequences, of which n propose n_drafts[i] drafts, each right with
 * probability p[i] given the ones before it were (expected accepted of c drafts:
 * p + p^2 + ... + p^c). Until the step with every draft is measured every draft is kept,
 * then until the step without drafts is, none (so both get measured). Returns
 * 0..max n_drafts[i]. */
int32_t gptoss_spec_best_cap(const gptoss_spec_costs *c, int32_t n_decoding,
                             const int32_t *n_drafts, const float *p, int32_t n);

/* How many drafts a step accepts: the longest prefix with sampled[j] == drafts[j]. The
 * tokens emitted are sampled[0..m] (m + 1 of them: the accepted drafts, then the first token
 * that differs or, when all n matched, the one after them). */
int32_t gptoss_spec_n_accepted(const int32_t *drafts, const int32_t *sampled, int32_t n);

#endif
