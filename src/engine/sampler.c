/*
 * sampler.c - sampling parameters, rows and edits (see sampler.h).
 */
#include "engine/sampler.h"

#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- random seeds ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void gptoss_rng_seed(gptoss_rng *rng, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (splitmix64(&(uint64_t){stream}) * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t gptoss_rng_next(gptoss_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* ---- rows -------------------------------------------------------------------------------- */

gptoss_sample_row gptoss_sampler_row(const gptoss_sampling_params *p, uint64_t seed,
                                     int64_t position, int32_t choice) {
    gptoss_sample_row row;
    memset(&row, 0, sizeof row);
    row.temperature = p->temperature < GPTOSS_GREEDY_TEMPERATURE ? 0.0f : p->temperature;
    row.top_p = p->top_p;
    row.top_k = p->top_k > 0 ? p->top_k : 0;
    row.min_p = p->min_p;
    row.repetition_penalty = p->repetition_penalty;
    row.frequency_penalty = p->frequency_penalty;
    row.presence_penalty = p->presence_penalty;
    row.seed = seed;
    row.position = position;
    row.choice = choice;
    row.n_top_logprobs = p->logprobs || p->top_logprobs > 0 ? p->top_logprobs : -1;
    row.allowed_row = -1;
    return row;
}

bool gptoss_sampler_needs_counts(const gptoss_sampling_params *p) {
    return p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
           p->presence_penalty != 0.0f;
}

/* ---- token counts ------------------------------------------------------------------------ */

/* Index of token in c, or -(insertion point) - 1. */
static int32_t find_token(const gptoss_token_counts *c, int32_t token) {
    int32_t lo = 0, hi = c->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (c->entries[mid].token < token)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->n && c->entries[lo].token == token ? lo : -lo - 1;
}

/* The entry of token, inserted (zeroed) when new; NULL when out of memory. */
static gptoss_token_count *entry_of(gptoss_token_counts *c, int32_t token) {
    int32_t at = find_token(c, token);
    if (at >= 0) return &c->entries[at];
    at = -at - 1;
    if (c->n == c->cap) {
        int32_t cap = c->cap ? c->cap * 2 : 64;
        gptoss_token_count *grown = realloc(c->entries, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        c->entries = grown;
        c->cap = cap;
    }
    memmove(&c->entries[at + 1], &c->entries[at], (size_t)(c->n - at) * sizeof *c->entries);
    c->n++;
    c->entries[at] = (gptoss_token_count){token, 0, 0};
    return &c->entries[at];
}

static int compare_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

bool gptoss_token_counts_init(gptoss_token_counts *c, const int32_t *prompt, int32_t n_prompt) {
    memset(c, 0, sizeof *c);
    if (n_prompt <= 0) return true;
    /* Sort a copy once instead of inserting one by one (long prompts). */
    int32_t *sorted = malloc((size_t)n_prompt * sizeof *sorted);
    if (!sorted) return false;
    memcpy(sorted, prompt, (size_t)n_prompt * sizeof *sorted);
    qsort(sorted, (size_t)n_prompt, sizeof *sorted, compare_int32);
    int32_t distinct = 0;
    for (int32_t i = 0; i < n_prompt; i++)
        if (i == 0 || sorted[i] != sorted[i - 1]) distinct++;
    c->entries = malloc((size_t)distinct * sizeof *c->entries);
    if (!c->entries) {
        free(sorted);
        return false;
    }
    for (int32_t i = 0; i < n_prompt; i++)
        if (i == 0 || sorted[i] != sorted[i - 1])
            c->entries[c->n++] = (gptoss_token_count){sorted[i], 0, 1};
    c->cap = distinct;
    free(sorted);
    return true;
}

bool gptoss_token_counts_add_output(gptoss_token_counts *c, int32_t token) {
    gptoss_token_count *e = entry_of(c, token);
    if (!e) return false;
    e->output_count++;
    return true;
}

bool gptoss_token_counts_copy(gptoss_token_counts *dst, const gptoss_token_counts *src) {
    memset(dst, 0, sizeof *dst);
    if (src->n == 0) return true;
    dst->entries = malloc((size_t)src->n * sizeof *dst->entries);
    if (!dst->entries) return false;
    memcpy(dst->entries, src->entries, (size_t)src->n * sizeof *dst->entries);
    dst->n = dst->cap = src->n;
    return true;
}

void gptoss_token_counts_free(gptoss_token_counts *c) {
    if (!c) return;
    free(c->entries);
    memset(c, 0, sizeof *c);
}

/* ---- edits ------------------------------------------------------------------------------- */

int32_t gptoss_sampler_edits(const gptoss_sampling_params *p, const int32_t *masked,
                             int32_t n_masked, const gptoss_token_counts *counts,
                             gptoss_sample_edit *out) {
    const bool repetition = p->repetition_penalty != 1.0f;
    const int32_t n_bias = p->n_logit_bias, n_counts = counts ? counts->n : 0;
    int32_t ib = 0, im = 0, ic = 0, n = 0;
    for (;;) {
        /* Skip count entries that change nothing: prompt-only tokens without a repetition
         * penalty. */
        while (ic < n_counts && counts->entries[ic].output_count == 0 && !repetition)
            ic++;
        int32_t token = INT32_MAX;
        if (ib < n_bias && p->logit_bias_tokens[ib] < token) token = p->logit_bias_tokens[ib];
        if (im < n_masked && masked[im] < token) token = masked[im];
        if (ic < n_counts && counts->entries[ic].token < token) token = counts->entries[ic].token;
        if (token == INT32_MAX) break;
        gptoss_sample_edit e = {token, 0.0f, 0, 0, 0};
        if (ib < n_bias && p->logit_bias_tokens[ib] == token) e.bias = p->logit_bias_values[ib++];
        if (im < n_masked && masked[im] == token) e.masked = 1, im++;
        if (ic < n_counts && counts->entries[ic].token == token) {
            const gptoss_token_count *c = &counts->entries[ic++];
            e.output_count = c->output_count;
            e.seen = repetition && (c->in_prompt || c->output_count > 0);
        }
        out[n++] = e;
    }
    return n;
}

/* ---- parameters -------------------------------------------------------------------------- */

gptoss_sampling_params gptoss_sampling_params_default(void) {
    gptoss_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.top_k = 0;
    p.repetition_penalty = 1.0f;
    p.n = 1;
    return p;
}

static bool in_range(float x, float lo, float hi) {
    return x >= lo && x <= hi;
} /* NaN fails */

gptoss_status gptoss_sampling_params_validate(const gptoss_sampling_params *p, int32_t vocab_size,
                                              gptoss_error *error) {
    const gptoss_status bad = GPTOSS_ERR_INVALID_ARGUMENT;
    if (!in_range(p->temperature, 0.0f, 100.0f))
        return gptoss_set_error(error, bad, "temperature must be in [0, 100], got %g",
                                (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return gptoss_set_error(error, bad, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (p->top_k < -1)
        return gptoss_set_error(error, bad, "top_k must be -1, 0 (off) or positive, got %d",
                                p->top_k);
    if (!in_range(p->min_p, 0.0f, 1.0f))
        return gptoss_set_error(error, bad, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!in_range(p->presence_penalty, -2.0f, 2.0f))
        return gptoss_set_error(error, bad, "presence_penalty must be in [-2, 2], got %g",
                                (double)p->presence_penalty);
    if (!in_range(p->frequency_penalty, -2.0f, 2.0f))
        return gptoss_set_error(error, bad, "frequency_penalty must be in [-2, 2], got %g",
                                (double)p->frequency_penalty);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 10.0f))
        return gptoss_set_error(error, bad, "repetition_penalty must be in (0, 10], got %g",
                                (double)p->repetition_penalty);
    if (p->top_logprobs < 0 || p->top_logprobs > GPTOSS_MAX_TOP_LOGPROBS)
        return gptoss_set_error(error, bad, "top_logprobs must be in [0, %d], got %d",
                                GPTOSS_MAX_TOP_LOGPROBS, p->top_logprobs);
    if (p->max_tokens < 0)
        return gptoss_set_error(error, bad,
                                "max_tokens must be positive (or 0 for as many as fit), got %d",
                                p->max_tokens);
    if (p->min_tokens < 0 || (p->max_tokens > 0 && p->min_tokens > p->max_tokens))
        return gptoss_set_error(error, bad, "min_tokens must be in [0, max_tokens=%d], got %d",
                                p->max_tokens, p->min_tokens);
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > GPTOSS_MAX_STOP_TOKENS)
        return gptoss_set_error(error, bad, "at most %d stop token ids are supported, got %d",
                                GPTOSS_MAX_STOP_TOKENS, p->n_stop_token_ids);
    for (int32_t i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= vocab_size)
            return gptoss_set_error(error, bad,
                                    "stop token id %d is outside the vocabulary [0, %d)",
                                    p->stop_token_ids[i], vocab_size);
    if (p->n < 1 || p->n > 128)
        return gptoss_set_error(error, bad, "n must be in [1, 128], got %d", p->n);
    if (p->n_logit_bias < 0 || p->n_logit_bias > GPTOSS_MAX_LOGIT_BIAS)
        return gptoss_set_error(error, bad, "logit_bias may name at most %d tokens, got %d",
                                GPTOSS_MAX_LOGIT_BIAS, p->n_logit_bias);
    if (p->n_logit_bias > 0 && (!p->logit_bias_tokens || !p->logit_bias_values))
        return gptoss_set_error(error, bad, "logit_bias: %d entries without token or value arrays",
                                p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const int32_t t = p->logit_bias_tokens[i];
        if (t < 0 || t >= vocab_size)
            return gptoss_set_error(
                error, bad, "logit_bias token %d is outside the vocabulary [0, %d)", t, vocab_size);
        if (!in_range(p->logit_bias_values[i], -100.0f, 100.0f))
            return gptoss_set_error(error, bad,
                                    "logit_bias of token %d must be in [-100, 100], got %g", t,
                                    (double)p->logit_bias_values[i]);
    }
    if (p->n_logit_bias > 1) {
        /* Distinct tokens: sort a copy (at most GPTOSS_MAX_LOGIT_BIAS entries). */
        int32_t sorted[GPTOSS_MAX_LOGIT_BIAS];
        memcpy(sorted, p->logit_bias_tokens, (size_t)p->n_logit_bias * sizeof *sorted);
        qsort(sorted, (size_t)p->n_logit_bias, sizeof *sorted, compare_int32);
        for (int32_t i = 1; i < p->n_logit_bias; i++)
            if (sorted[i] == sorted[i - 1])
                return gptoss_set_error(error, bad, "logit_bias names token %d twice", sorted[i]);
    }
    return GPTOSS_OK;
}
