/*
 * speculative.c - the automatic switch and acceptance of speculative decoding (see
 * speculative.h).
 */
#include "engine/speculative.h"

/* Weight of the latest step in the moving acceptance: after 4 steps of nothing accepted
 * from the start value 1, it is 0.24, below the default threshold 0.25. */
#define ACCEPTANCE_ALPHA 0.3f

gptoss_spec_state gptoss_spec_state_init(void) {
    gptoss_spec_state st = {.acceptance = 1.0f, .cooldown = 0};
    return st;
}

int32_t gptoss_spec_step_k(const gptoss_draft_options *o, int32_t n_decoding) {
    if (o->kind == GPTOSS_DRAFT_NONE) return 0;
    int32_t k = o->num_speculative_tokens;
    if (o->max_batch > 0) {
        if (n_decoding > o->max_batch) return 0;
        if (2 * n_decoding > o->max_batch) k = (k + 1) / 2;
    }
    return k;
}

int32_t gptoss_spec_seq_k(const gptoss_draft_options *o, gptoss_spec_state *st, int32_t step_k) {
    if (step_k <= 0) return 0;
    if (st->cooldown > 0) {
        if (--st->cooldown == 0) *st = gptoss_spec_state_init(); /* next step: try again */
        return 0;
    }
    if (st->acceptance < 2.0f * o->min_acceptance) return (step_k + 1) / 2;
    return step_k;
}

void gptoss_spec_seq_update(const gptoss_draft_options *o, gptoss_spec_state *st, int32_t n_drafted,
                            int32_t n_accepted) {
    if (n_drafted <= 0) return;
    float rate = (float)n_accepted / (float)n_drafted;
    st->acceptance = (1.0f - ACCEPTANCE_ALPHA) * st->acceptance + ACCEPTANCE_ALPHA * rate;
    if (st->acceptance < o->min_acceptance)
        st->cooldown = o->cooldown_steps > 0 ? o->cooldown_steps : 1;
}

int32_t gptoss_spec_n_accepted(const int32_t *drafts, const int32_t *sampled, int32_t n) {
    int32_t m = 0;
    while (m < n && sampled[m] == drafts[m])
        m++;
    return m;
}
