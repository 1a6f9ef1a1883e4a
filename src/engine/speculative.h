/*
 * speculative.h - the rules of speculative decoding that need no engine state: how many
 * drafts a sequence gets this step (the automatic switch), how many of them a step accepted,
 * and each sequence's moving acceptance.
 *
 * The switch: drafting costs compute (1 + k positions per sequence and step instead of 1),
 * which is free while a step is bound by reading the weights (few decoding sequences) and a
 * loss once it is bound by arithmetic. So above max_batch decoding sequences nobody drafts and
 * above max_batch / 2 k is halved; and a sequence whose drafts keep failing (moving acceptance
 * below min_acceptance) stops drafting for cooldown_steps of its steps, then tries again.
 * Engine thread only.
 */
#ifndef GPTOSS_ENGINE_SPECULATIVE_H
#define GPTOSS_ENGINE_SPECULATIVE_H

#include "gptoss_engine.h"

#include <stdint.h>

/* One sequence's drafting record. */
typedef struct gptoss_spec_state {
    float acceptance; /* moving average of accepted / drafted (starts at 1) */
    int32_t cooldown; /* steps left without drafting */
} gptoss_spec_state;

/* A fresh record (drafting on). */
gptoss_spec_state gptoss_spec_state_init(void);

/* The k of a step with n_decoding decoding sequences: 0 (nobody drafts) above max_batch,
 * k halved (rounded up) above max_batch / 2, else num_speculative_tokens. */
int32_t gptoss_spec_step_k(const gptoss_draft_options *o, int32_t n_decoding);

/* The k of one sequence this step (at most step_k; 0 while it cools down, counting the step).
 * A sequence with middling acceptance (below twice min_acceptance) drafts half as many. */
int32_t gptoss_spec_seq_k(const gptoss_draft_options *o, gptoss_spec_state *st, int32_t step_k);

/* Records a verified step: n_accepted of n_drafted drafts matched (n_drafted > 0). Starts
 * the cooldown when the moving acceptance fell below min_acceptance. */
void gptoss_spec_seq_update(const gptoss_draft_options *o, gptoss_spec_state *st, int32_t n_drafted,
                            int32_t n_accepted);

/* How many drafts a step accepts: the longest prefix with sampled[j] == drafts[j]. The
 * tokens emitted are sampled[0..m] (m + 1 of them: the accepted drafts, then the first token
 * that differs or, when all n matched, the one after them). */
int32_t gptoss_spec_n_accepted(const int32_t *drafts, const int32_t *sampled, int32_t n);

#endif
