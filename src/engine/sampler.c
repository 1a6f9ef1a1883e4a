/*
 * sampler.c - logits processing and sampling (see sampler.h).
 *
 * top_k / top_p need the most likely tokens in order, but sorting a 201k vocabulary per token
 * would cost more than a decode step. Instead the weights w = exp((l - max) / T), all in
 * (0, 1], are bucketed by binary exponent in one pass; the buckets tell how far down the
 * order top_k or top_p can reach, and only the tokens of those buckets are sorted. The result
 * is exact: the same set a full sort would keep.
 */
#include "engine/sampler.h"

#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 64
#define GREEDY_TEMPERATURE 1e-5f

/* ---- random numbers ---------------------------------------------------------------------- */

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

double gptoss_rng_uniform(gptoss_rng *rng) {
    return (double)(gptoss_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* ---- scratch ----------------------------------------------------------------------------- */

struct gptoss_sampler {
    int32_t vocab_size;
    float *work;         /* [vocab] processed logits, then weights */
    int32_t *counts;     /* [vocab] occurrence counts; all zero between calls */
    int32_t *candidates; /* [vocab] candidate token ids */
    double *probs;       /* [vocab] candidate probabilities */
    uint8_t *bucket;     /* [vocab] weight bucket of each token (top_k / top_p draws) */
    float *sparse_row;   /* [vocab] -inf between calls (draws from summaries) */
};

gptoss_status gptoss_sampler_create(int32_t vocab_size, gptoss_sampler **out, gptoss_error *error) {
    *out = NULL;
    if (vocab_size < 1)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "vocab size %d must be positive", vocab_size);
    gptoss_sampler *s = calloc(1, sizeof *s);
    if (!s) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (sampler)");
    size_t n = (size_t)vocab_size;
    s->vocab_size = vocab_size;
    s->work = malloc(n * sizeof(float));
    s->counts = calloc(n, sizeof(int32_t));
    s->candidates = malloc(n * sizeof(int32_t));
    s->probs = malloc(n * sizeof(double));
    s->bucket = malloc(n);
    s->sparse_row = malloc(n * sizeof(float));
    if (!s->work || !s->counts || !s->candidates || !s->probs || !s->bucket || !s->sparse_row) {
        gptoss_sampler_free(s);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory (sampler scratch for %d tokens)", vocab_size);
    }
    for (size_t i = 0; i < n; i++)
        s->sparse_row[i] = -INFINITY;
    *out = s;
    return GPTOSS_OK;
}

void gptoss_sampler_free(gptoss_sampler *s) {
    if (!s) return;
    free(s->sparse_row);
    free(s->work);
    free(s->counts);
    free(s->candidates);
    free(s->probs);
    free(s->bucket);
    free(s);
}

/* ---- processing -------------------------------------------------------------------------- */

static bool in_vocab(const gptoss_sampler *s, int32_t t) {
    return t >= 0 && t < s->vocab_size;
}

/* Penalties as vLLM applies them: repetition divides positive / multiplies negative logits of
 * every token seen in prompt or output; frequency and presence subtract per generated token. */
static void apply_penalties(gptoss_sampler *s, const gptoss_sampling_params *p,
                            const gptoss_sample_history *h) {
    float *work = s->work;
    int32_t *counts = s->counts;
    if (p->repetition_penalty != 1.0f) {
        const float rp = p->repetition_penalty;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *list = pass == 0 ? h->prompt : h->output;
            int32_t n = pass == 0 ? h->n_prompt : h->n_output;
            for (int32_t i = 0; i < n; i++) {
                int32_t t = list[i];
                if (!in_vocab(s, t) || counts[t]) continue;
                counts[t] = 1;
                work[t] = work[t] > 0 ? work[t] / rp : work[t] * rp;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *list = pass == 0 ? h->prompt : h->output;
            int32_t n = pass == 0 ? h->n_prompt : h->n_output;
            for (int32_t i = 0; i < n; i++)
                if (in_vocab(s, list[i])) counts[list[i]] = 0;
        }
    }
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        for (int32_t i = 0; i < h->n_output; i++)
            if (in_vocab(s, h->output[i])) counts[h->output[i]]++;
        for (int32_t i = 0; i < h->n_output; i++) {
            int32_t t = h->output[i];
            if (!in_vocab(s, t) || counts[t] == 0) continue;
            work[t] -= p->frequency_penalty * (float)counts[t] + p->presence_penalty;
            counts[t] = 0;
        }
    }
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}

/* qsort has no context argument in C11; thread-local because rows are sampled in parallel. */
static _Thread_local gptoss_sampler *sort_context;

static int compare_candidates(const void *a, const void *b) {
    int32_t ta = *(const int32_t *)a, tb = *(const int32_t *)b;
    float wa = sort_context->work[ta], wb = sort_context->work[tb];
    if (wa != wb) return wa > wb ? -1 : 1;
    return (ta > tb) - (ta < tb);
}

/* 2^t for t <= 0 (NaN and t < -126 give 0), relative error ~1e-7: round t to the nearest
 * integer k, a degree-6 polynomial for 2^f on f in [-0.5, 0.5], and k goes into the
 * exponent bits. Branch-free so the weight loop vectorizes; libm's expf is the costliest
 * part of sampling a 201k vocabulary otherwise. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-trapping-math")))
#endif
static inline float
exp2_nonpositive(float t) {
    t = t > -127.0f ? t : -127.0f;             /* also maps NaN to -127 */
    float k = (t + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 * 2^23 trick) */
    float f = (t - k) * 0.6931471805599453f;   /* ln(2^(t-k)) in [-0.35, 0.35] */
    float poly =
        1.0f +
        f * (1.0f +
             f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720))))));
    int32_t ki = (int32_t)k;
    union {
        uint32_t u;
        float f;
    } scale = {.u = (uint32_t)(ki + 127) << 23};
    return ki > -127 ? poly * scale.f : 0.0f;
}

/* w[i] = 2^((w[i] - max_logit) * scale), or 0 below min_weight. GCC only if-converts the
 * selects (and so vectorizes the loop) when told FP compares need not preserve exception
 * flags, which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-trapping-math")))
#endif
static void
compute_weights(float *restrict w, int32_t n, float max_logit, float scale, float min_weight) {
    for (int32_t i = 0; i < n; i++) {
        float x = exp2_nonpositive((w[i] - max_logit) * scale);
        w[i] = x >= min_weight ? x : 0.0f;
    }
}

/* Bucket of a weight in (0, 1] by binary exponent: 1 -> 0, [0.5, 1) -> 1, ...; the
 * last bucket takes everything below 2^-62. */
static inline int weight_bucket(float x) {
    union {
        float f;
        uint32_t u;
    } bits = {.f = x};
    int b = 127 - (int)((bits.u >> 23) & 0xff);
    return b < N_BUCKETS - 1 ? b : N_BUCKETS - 1;
}

static bool is_greedy(const gptoss_sampling_params *p) {
    return p->temperature < GREEDY_TEMPERATURE;
}

/* The tokens a draw may pick, with weights s->work[token] (unnormalized). */
typedef struct kept_set {
    bool all;   /* every token with a nonzero weight; no list is built */
    int32_t n;  /* otherwise: s->candidates[0..n) */
    double sum; /* total weight of the kept tokens */
} kept_set;

/* Sorts candidates [from, to) by decreasing weight (ties by token id). */
static void sort_range(gptoss_sampler *s, int32_t from, int32_t to) {
    sort_context = s;
    qsort(s->candidates + from, (size_t)(to - from), sizeof(int32_t), compare_candidates);
    sort_context = NULL;
}

/* Lists the tokens of buckets < cutoff (any order), then those of bucket `cutoff` sorted.
 * Returns the list length; *n_before = tokens before the sorted bucket. */
static int32_t list_to_bucket(gptoss_sampler *s, int cutoff, int32_t *n_before) {
    const float *w = s->work;
    int32_t n = 0;
    for (int32_t i = 0; i < s->vocab_size; i++)
        if (w[i] != 0.0f && s->bucket[i] < cutoff) s->candidates[n++] = i;
    *n_before = n;
    for (int32_t i = 0; i < s->vocab_size; i++)
        if (w[i] != 0.0f && s->bucket[i] == cutoff) s->candidates[n++] = i;
    sort_range(s, *n_before, n);
    return n;
}

static kept_set prepare(gptoss_sampler *s, const gptoss_sampling_params *p,
                        const gptoss_sample_history *h, const float *logits) {
    const int32_t V = s->vocab_size;
    float *w = s->work;
    kept_set kept = {false, 0, 0.0};
    memcpy(w, logits, (size_t)V * sizeof(float));
    for (int32_t i = 0; i < h->n_masked; i++)
        if (in_vocab(s, h->masked[i])) w[h->masked[i]] = -INFINITY;
    apply_penalties(s, p, h);
    int32_t best = argmax(w, V);
    if (is_greedy(p) || !isfinite(w[best])) {
        s->candidates[0] = best;
        w[best] = 1.0f;
        kept.n = 1;
        kept.sum = 1.0;
        return kept;
    }
    /* Weights in (0, 1]: the best token has weight 1; min_p is a floor on the weight. */
    const float max_logit = w[best];
    const float scale = 1.4426950408889634f / p->temperature; /* log2(e) / T */
    const float min_weight = p->min_p > 0.0f ? p->min_p : 0.0f;
    compute_weights(w, V, max_logit, scale, min_weight);
    const bool use_top_p = p->top_p < 1.0f;
    const bool need_buckets = (p->top_k > 0 && p->top_k < V) || use_top_p;
    uint32_t bucket_count[N_BUCKETS] = {0};
    double bucket_mass[N_BUCKETS] = {0};
    int32_t n_kept = 0;
    double total = 0.0;
    for (int32_t i = 0; i < V; i++) {
        float x = w[i];
        if (x == 0.0f) continue;
        n_kept++;
        total += x;
        if (!need_buckets) continue;
        int b = weight_bucket(x);
        s->bucket[i] = (uint8_t)b;
        bucket_count[b]++;
        bucket_mass[b] += x;
    }
    const bool use_top_k = p->top_k > 0 && p->top_k < n_kept;
    if (!use_top_k && !use_top_p) {
        kept.all = true;
        kept.sum = total;
        return kept;
    }
    int32_t n = 0;
    if (use_top_k) {
        /* The k-th largest weight lies in the first bucket where the count reaches k; the
         * buckets above it are kept whole, that one sorted and cut. */
        int cutoff = N_BUCKETS - 1;
        uint32_t count = 0;
        for (int b = 0; b < N_BUCKETS; b++) {
            count += bucket_count[b];
            if (count >= (uint32_t)p->top_k) {
                cutoff = b;
                break;
            }
        }
        int32_t n_before;
        n = list_to_bucket(s, cutoff, &n_before);
        if (n > p->top_k) n = p->top_k;
        if (use_top_p) {
            /* top_p applies to the top-k tokens, renormalized: sort them all (k is small). */
            sort_range(s, 0, n);
            double sum = 0.0;
            for (int32_t i = 0; i < n; i++)
                sum += w[s->candidates[i]];
            double before = 0.0;
            int32_t keep = 0;
            while (keep < n && (keep == 0 || before < (double)p->top_p * sum))
                before += w[s->candidates[keep++]];
            n = keep;
        }
    } else {
        /* Nucleus: buckets whose cumulative mass stays below top_p are kept whole; the bucket
         * where it crosses is sorted and cut at the token that reaches top_p. */
        const double target = (double)p->top_p * total;
        int cutoff = N_BUCKETS - 1;
        double mass = 0.0;
        for (int b = 0; b < N_BUCKETS; b++) {
            if (mass + bucket_mass[b] >= target) {
                cutoff = b;
                break;
            }
            mass += bucket_mass[b];
        }
        int32_t n_before;
        n = list_to_bucket(s, cutoff, &n_before);
        double before = mass;
        int32_t keep = n_before;
        while (keep < n && (keep == 0 || before < target))
            before += w[s->candidates[keep++]];
        n = keep;
    }
    kept.n = n;
    for (int32_t i = 0; i < n; i++)
        kept.sum += w[s->candidates[i]];
    return kept;
}

int32_t gptoss_sampler_distribution(gptoss_sampler *s, const gptoss_sampling_params *params,
                                    const gptoss_sample_history *history, const float *logits,
                                    const int32_t **tokens_out, const double **probs_out) {
    kept_set kept = prepare(s, params, history, logits);
    int32_t n = kept.n;
    if (kept.all) {
        n = 0;
        for (int32_t i = 0; i < s->vocab_size; i++)
            if (s->work[i] != 0.0f) s->candidates[n++] = i;
    }
    sort_range(s, 0, n);
    for (int32_t i = 0; i < n; i++)
        s->probs[i] = s->work[s->candidates[i]] / kept.sum;
    *tokens_out = s->candidates;
    *probs_out = s->probs;
    return n;
}

int32_t gptoss_sampler_sample(gptoss_sampler *s, const gptoss_sampling_params *params,
                              const gptoss_sample_history *history, const float *logits,
                              gptoss_rng *rng) {
    kept_set kept = prepare(s, params, history, logits);
    if (is_greedy(params) && !kept.all) return s->candidates[0];
    const float *w = s->work;
    double target = gptoss_rng_uniform(rng) * kept.sum;
    double cumulative = 0.0;
    if (kept.all) {
        int32_t last = 0;
        for (int32_t i = 0; i < s->vocab_size; i++) {
            if (w[i] == 0.0f) continue;
            cumulative += w[i];
            last = i;
            if (target < cumulative) return i;
        }
        return last; /* target within rounding of the sum */
    }
    for (int32_t i = 0; i < kept.n; i++) {
        cumulative += w[s->candidates[i]];
        if (target < cumulative) return s->candidates[i];
    }
    return s->candidates[kept.n - 1];
}

bool gptoss_sampler_summary_exact(const gptoss_sampling_params *p, int32_t n_masked, int32_t n_top) {
    if (p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)
        return false;
    if (p->top_logprobs > n_top) return false;
    if (is_greedy(p)) return n_masked < n_top;
    return p->top_k > 0 && p->top_k < n_top - n_masked;
}

int32_t gptoss_sampler_sample_summary(gptoss_sampler *s, const gptoss_sampling_params *params,
                                      const gptoss_sample_history *history, const int32_t *top_ids,
                                      const float *top_logits, int32_t n_top, gptoss_rng *rng) {
    if (is_greedy(params)) {
        /* the first candidate not masked is the argmax of the masked row */
        for (int32_t i = 0; i < n_top; i++) {
            bool masked = false;
            for (int32_t j = 0; j < history->n_masked && !masked; j++)
                masked = history->masked[j] == top_ids[i];
            if (!masked) return top_ids[i];
        }
        return top_ids[0];
    }
    /* The whole-row sampler on a row that is -inf outside the summary: tokens outside it
     * have weight 0 there and cannot survive top_k here anyway. */
    float *row = s->sparse_row;
    for (int32_t i = 0; i < n_top; i++)
        if (top_ids[i] >= 0 && top_ids[i] < s->vocab_size) row[top_ids[i]] = top_logits[i];
    int32_t token = gptoss_sampler_sample(s, params, history, row, rng);
    for (int32_t i = 0; i < n_top; i++)
        if (top_ids[i] >= 0 && top_ids[i] < s->vocab_size) row[top_ids[i]] = -INFINITY;
    return token;
}

float gptoss_sampler_logprobs(const float *logits, int32_t vocab_size, int32_t token, int32_t n_top,
                              gptoss_token_logprob *top) {
    float max_logit = logits[argmax(logits, vocab_size)];
    double sum = 0.0;
    for (int32_t i = 0; i < vocab_size; i++)
        sum += exp2_nonpositive((logits[i] - max_logit) * 1.4426950408889634f);
    double log_norm = (double)max_logit + log(sum);
    if (n_top > GPTOSS_MAX_TOP_LOGPROBS) n_top = GPTOSS_MAX_TOP_LOGPROBS;
    if (n_top > vocab_size) n_top = vocab_size;
    /* Insertion into a short sorted list: n_top <= 20, and most tokens fail the first test. */
    int32_t n_have = 0;
    for (int32_t i = 0; i < vocab_size && n_top > 0; i++) {
        float x = logits[i];
        if (n_have == n_top && !(x > logits[top[n_have - 1].token_id])) continue;
        int32_t pos = n_have < n_top ? n_have++ : n_top - 1;
        while (pos > 0 && x > logits[top[pos - 1].token_id]) {
            top[pos] = top[pos - 1];
            pos--;
        }
        top[pos].token_id = i;
    }
    for (int32_t i = 0; i < n_have; i++)
        top[i].logprob = (float)((double)logits[top[i].token_id] - log_norm);
    return (float)((double)logits[token] - log_norm);
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
    return GPTOSS_OK;
}
