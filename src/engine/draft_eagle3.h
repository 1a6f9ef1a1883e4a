/*
 * draft_eagle3.h - the `eagle3` draft source: an EAGLE3 head (model/eagle3.h) run on the CPU
 * (backend/cpu/eagle3_forward.h) over the target's hidden states, with one head KV cache per
 * sequence. Engine thread only; used through draft.h.
 *
 * Head position i reads the target's boundary states at position i and the embedding of token
 * i + 1, and predicts token i + 2. After each target step the head runs the positions whose
 * next token is committed (observe); before a step, for a sequence of n tokens, it runs the
 * rest up to position n - 2 (whose prediction is the first draft, of token n), then chains
 * k - 1 steps on its own output. The head's cache keeps only positions whose inputs are the
 * target's (accepted tokens); the chained positions are dropped after proposing, and a step
 * that recomputes positions (rollback, preemption) truncates the head's cache to match.
 */
#ifndef GPTOSS_ENGINE_DRAFT_EAGLE3_H
#define GPTOSS_ENGINE_DRAFT_EAGLE3_H

#include "engine/draft.h"

typedef struct gptoss_eagle3_drafter gptoss_eagle3_drafter;

/* Loads o->model_dir, checks it against the target and asks the target for its hidden
 * states (a backend that cannot hand them over refuses here). */
gptoss_status gptoss_eagle3_drafter_create(const gptoss_draft_options *o, int32_t vocab_size,
                                           const gptoss_draft_target *target,
                                           gptoss_eagle3_drafter **out, gptoss_error *error);
void gptoss_eagle3_drafter_free(gptoss_eagle3_drafter *d);

void gptoss_eagle3_drafter_observe(gptoss_eagle3_drafter *d, const gptoss_draft_observed *seqs,
                                   int32_t n);
void gptoss_eagle3_drafter_propose(gptoss_eagle3_drafter *d, gptoss_draft_seq *seqs, int32_t n);

#endif
