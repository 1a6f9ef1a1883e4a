/*
 * speculative.c - the automatic switch and acceptance of speculative decoding (see
 * speculative.h).
 */
#include "engine/speculative.h"

/* Decay of the acceptance counts per step, and their prior (2 hits of 2 judged): a sequence
 * whose drafts are all wrong falls to 0.22 after 4 steps, below the default threshold 0.25. */
#define ACCEPTANCE_DECAY 0.8f
#define ACCEPTANCE_PRIOR 2.0f

gptoss_spec_state gptoss_spec_state_init(void) {
    gptoss_spec_state st = {.hits = ACCEPTANCE_PRIOR, .judged = ACCEPTANCE_PRIOR, .cooldown = 0};
    return st;
}

float gptoss_spec_acceptance(const gptoss_spec_state *st) {
    return st->judged > 0.0f ? st->hits / st->judged : 1.0f;
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

int32_t gptoss_spec_seq_k(gptoss_spec_state *st, int32_t step_k) {
    if (step_k <= 0) return 0;
    if (st->cooldown > 0) {
        if (--st->cooldown == 0) *st = gptoss_spec_state_init(); /* next step: try again */
        return 0;
    }
    return step_k;
}

void gptoss_spec_seq_update(const gptoss_draft_options *o, gptoss_spec_state *st, int32_t n_drafted,
                            int32_t n_accepted) {
    if (n_drafted <= 0) return;
    st->hits = ACCEPTANCE_DECAY * st->hits + (float)n_accepted;
    st->judged =
        ACCEPTANCE_DECAY * st->judged + (float)n_accepted + (n_accepted < n_drafted ? 1.0f : 0.0f);
    if (gptoss_spec_acceptance(st) < o->min_acceptance)
        st->cooldown = o->cooldown_steps > 0 ? o->cooldown_steps : 1;
}

int32_t gptoss_spec_n_accepted(const int32_t *drafts, const int32_t *sampled, int32_t n) {
    int32_t m = 0;
    while (m < n && sampled[m] == drafts[m])
        m++;
    return m;
}

/* ---- measured cost ------------------------------------------------------------------------ */

void gptoss_spec_costs_record(gptoss_spec_costs *c, int32_t width, double seconds) {
    if (width < 1 || width > GPTOSS_SPEC_MAX_WIDTH || !(seconds >= 0.0)) return;
    if (++c->n_recorded >= GPTOSS_SPEC_COST_REFRESH) {
        c->n_recorded = 0;
        for (int32_t w = 0; w <= GPTOSS_SPEC_MAX_WIDTH; w++)
            if (c->samples[w] > 1) c->samples[w] = 1; /* the next two samples decide again */
    }
    switch (c->samples[width]) {
    case 0: /* a first sample: warm-up, not kept */
        break;
    case 1: /* the first kept: a candidate */
        c->seconds[width] = (float)seconds;
        break;
    case 2: /* the lower of two, so that one step slowed by something else does not decide */
        if ((float)seconds < c->seconds[width]) c->seconds[width] = (float)seconds;
        break;
    default:
        c->seconds[width] = 0.8f * c->seconds[width] + 0.2f * (float)seconds;
        return;
    }
    c->samples[width]++;
}

static float cost_of(const gptoss_spec_costs *c, int32_t width) {
    if (width < 1 || width > GPTOSS_SPEC_MAX_WIDTH || c->samples[width] < 3) return -1.0f;
    return c->seconds[width];
}

int32_t gptoss_spec_best_cap(const gptoss_spec_costs *c, int32_t n_decoding,
                             const int32_t *n_drafts, const float *p, int32_t n) {
    int32_t max_cap = 0;
    for (int32_t i = 0; i < n; i++)
        if (n_drafts[i] > max_cap) max_cap = n_drafts[i];
    if (max_cap == 0 || n_decoding < 1) return max_cap;
    int32_t full_width = n_decoding;
    for (int32_t i = 0; i < n; i++)
        full_width += n_drafts[i];
    if (cost_of(c, full_width) <= 0.0f) return max_cap; /* measure the step with drafts */
    if (cost_of(c, n_decoding) <= 0.0f) return 0;       /* then the step without */
    int32_t best = 0;
    double best_rate = (double)n_decoding / cost_of(c, n_decoding);
    for (int32_t cap = 1; cap <= max_cap; cap++) {
        int32_t width = n_decoding;
        double tokens = n_decoding;
        for (int32_t i = 0; i < n; i++) {
            int32_t d = n_drafts[i] < cap ? n_drafts[i] : cap;
            width += d;
            double power = 1.0;
            for (int32_t j = 0; j < d; j++) {
                power *= (double)p[i];
                tokens += power;
            }
        }
        float seconds = cost_of(c, width);
        if (seconds <= 0.0f) continue;
        double rate = tokens / seconds;
        if (rate > best_rate) best = cap, best_rate = rate;
    }
    return best;
}
