/*
 * test_sampler.c - the sampler against a brute-force reference written here: full softmax,
 * full sort, then min_p, top_k and top_p exactly as vLLM defines them; penalties applied by
 * hand; greedy and top_k=1 equal argmax; seeded draws reproducible; empirical frequencies
 * match the distribution.
 */
#include "test_support.h"

#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

static void random_logits(float *x, int n, double spread) {
    for (int i = 0; i < n; i++)
        x[i] = (float)((urand() * 2 - 1) * spread);
}

static const gptoss_sample_history empty_history = {0};

/* Brute force: probs[v] of the final distribution (0 for excluded tokens). */
static void reference(const gptoss_sampling_params *p, const float *logits_in, int n,
                      const int32_t *prompt, int n_prompt, const int32_t *out, int n_out,
                      double *probs) {
    double *l = malloc((size_t)n * sizeof(double));
    for (int v = 0; v < n; v++)
        l[v] = logits_in[v];
    if (p->repetition_penalty != 1.0f) {
        for (int v = 0; v < n; v++) {
            bool seen = false;
            for (int i = 0; i < n_prompt; i++)
                seen |= prompt[i] == v;
            for (int i = 0; i < n_out; i++)
                seen |= out[i] == v;
            if (seen)
                l[v] = l[v] > 0 ? (float)l[v] / p->repetition_penalty
                                : (float)l[v] * p->repetition_penalty;
        }
    }
    for (int v = 0; v < n; v++) {
        int count = 0;
        for (int i = 0; i < n_out; i++)
            count += out[i] == v;
        l[v] -= (double)p->frequency_penalty * count + (count > 0 ? p->presence_penalty : 0.0);
    }
    double m = -INFINITY;
    for (int v = 0; v < n; v++)
        m = l[v] > m ? l[v] : m;
    double sum = 0;
    for (int v = 0; v < n; v++)
        sum += probs[v] = exp((l[v] - m) / p->temperature);
    for (int v = 0; v < n; v++)
        probs[v] /= sum;
    double max_p = 0;
    for (int v = 0; v < n; v++)
        max_p = probs[v] > max_p ? probs[v] : max_p;
    for (int v = 0; v < n; v++)
        if (probs[v] < p->min_p * max_p) probs[v] = 0;
    /* order: descending, ties by id (selection sort is fine at these sizes) */
    int *order = malloc((size_t)n * sizeof(int));
    for (int v = 0; v < n; v++)
        order[v] = v;
    for (int i = 0; i < n; i++) {
        int best = i;
        for (int j = i + 1; j < n; j++)
            if (probs[order[j]] > probs[order[best]] ||
                (probs[order[j]] == probs[order[best]] && order[j] < order[best]))
                best = j;
        int t = order[i];
        order[i] = order[best];
        order[best] = t;
    }
    if (p->top_k > 0)
        for (int i = p->top_k; i < n; i++)
            probs[order[i]] = 0;
    sum = 0;
    for (int v = 0; v < n; v++)
        sum += probs[v];
    double before = 0;
    for (int i = 0; i < n; i++) {
        double q = probs[order[i]] / sum;
        if (p->top_p < 1.0f && before >= p->top_p && i > 0) probs[order[i]] = 0;
        before += q;
    }
    sum = 0;
    for (int v = 0; v < n; v++)
        sum += probs[v];
    for (int v = 0; v < n; v++)
        probs[v] /= sum;
    free(order);
    free(l);
}

static void compare(gptoss_sampler *s, const gptoss_sampling_params *p, const float *logits, int n,
                    const gptoss_sample_history *h) {
    double *want = calloc((size_t)n, sizeof(double));
    reference(p, logits, n, h->prompt, h->n_prompt, h->output, h->n_output, want);
    const int32_t *tokens;
    const double *probs;
    int32_t k = gptoss_sampler_distribution(s, p, h, logits, &tokens, &probs);
    double *got = calloc((size_t)n, sizeof(double));
    for (int i = 0; i < k; i++) {
        if (i > 0) assert_true(probs[i] <= probs[i - 1] + 1e-12);
        got[tokens[i]] = probs[i];
    }
    for (int v = 0; v < n; v++)
        /* Kept or excluded must agree, except for probabilities that underflow float. */
        if ((want[v] == 0 && got[v] > 1e-30) || (got[v] == 0 && want[v] > 1e-30) ||
            fabs(want[v] - got[v]) > 1e-5)
            fail_msg("T=%g top_k=%d top_p=%g min_p=%g: token %d p=%g, reference %g",
                     (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p, v,
                     got[v], want[v]);
    free(want);
    free(got);
}

static void test_masks_match_brute_force(void **state) {
    (void)state;
    enum { V = 500 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    float logits[V];
    const float temps[] = {0.3f, 1.0f, 2.5f};
    const int ks[] = {0, 1, 7, 100, 499, 10000};
    const float ps[] = {1.0f, 0.95f, 0.5f, 0.05f};
    const float minps[] = {0.0f, 0.01f, 0.3f};
    const double spreads[] = {0.5, 8.0, 60.0}; /* flat, peaked, extreme (tiny tails) */
    for (int a = 0; a < 3; a++)
        for (int sp = 0; sp < 3; sp++) {
            random_logits(logits, V, spreads[sp]);
            logits[17] = logits[18]; /* a tie */
            for (int b = 0; b < 6; b++)
                for (int c = 0; c < 4; c++)
                    for (int d = 0; d < 3; d++) {
                        gptoss_sampling_params p = gptoss_sampling_params_default();
                        p.temperature = temps[a];
                        p.top_k = ks[b];
                        p.top_p = ps[c];
                        p.min_p = minps[d];
                        compare(s, &p, logits, V, &empty_history);
                    }
        }
    gptoss_sampler_free(s);
}

static void test_penalties_change_the_right_logits(void **state) {
    (void)state;
    enum { V = 50 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    float logits[V];
    random_logits(logits, V, 3.0);
    int32_t prompt[] = {1, 2, 3, 3, 40};
    int32_t out[] = {3, 7, 7, 7, 9, 40};
    gptoss_sample_history h = {prompt, 5, out, 6, NULL, 0};
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.repetition_penalty = 1.3f;
    compare(s, &p, logits, V, &h);
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = 0.7f;
    compare(s, &p, logits, V, &h);
    p.frequency_penalty = -0.4f;
    p.presence_penalty = 1.5f;
    compare(s, &p, logits, V, &h);
    p.repetition_penalty = 0.8f;
    p.frequency_penalty = 0.2f;
    p.top_k = 10;
    compare(s, &p, logits, V, &h);
    /* Greedy follows the penalized logits: make token 7 the argmax, then penalize it. */
    logits[7] = 100.0f;
    p = gptoss_sampling_params_default();
    p.temperature = 0.0f;
    gptoss_rng rng;
    gptoss_rng_seed(&rng, 1, 0);
    assert_int_equal(gptoss_sampler_sample(s, &p, &h, logits, &rng), 7);
    p.frequency_penalty = 2.0f; /* 3 occurrences: -6 */
    logits[8] = 95.0f;
    assert_int_equal(gptoss_sampler_sample(s, &p, &h, logits, &rng), 8);
    /* Masked tokens (stop tokens before min_tokens) are never drawn, even as argmax. */
    int32_t masked[] = {8, 7};
    h.masked = masked;
    h.n_masked = 2;
    int32_t t = gptoss_sampler_sample(s, &p, &h, logits, &rng);
    assert_true(t != 7 && t != 8);
    gptoss_sampler_free(s);
}

static void test_greedy_and_top_k_1_are_argmax(void **state) {
    (void)state;
    enum { V = 1000 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    float logits[V];
    for (int trial = 0; trial < 20; trial++) {
        random_logits(logits, V, 5.0);
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        gptoss_sampling_params p = gptoss_sampling_params_default();
        gptoss_rng rng;
        gptoss_rng_seed(&rng, (uint64_t)trial, 0);
        p.temperature = 0.0f;
        assert_int_equal(gptoss_sampler_sample(s, &p, &empty_history, logits, &rng), best);
        p.temperature = 1.5f;
        p.top_k = 1;
        assert_int_equal(gptoss_sampler_sample(s, &p, &empty_history, logits, &rng), best);
    }
    gptoss_sampler_free(s);
}

static void test_seeded_reproducible(void **state) {
    (void)state;
    enum { V = 300 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    float logits[V];
    random_logits(logits, V, 2.0);
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.top_p = 0.9f;
    int32_t a[64], b[64], c[64];
    gptoss_rng r1, r2, r3;
    gptoss_rng_seed(&r1, 42, 0);
    gptoss_rng_seed(&r2, 42, 0);
    gptoss_rng_seed(&r3, 42, 1);
    for (int i = 0; i < 64; i++) {
        a[i] = gptoss_sampler_sample(s, &p, &empty_history, logits, &r1);
        b[i] = gptoss_sampler_sample(s, &p, &empty_history, logits, &r2);
        c[i] = gptoss_sampler_sample(s, &p, &empty_history, logits, &r3);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    gptoss_sampler_free(s);
}

/* The n largest of a row, larger first, ties by lower id (selection, written here). */
static void reference_top(const float *x, int n, int n_top, int32_t *ids, float *vals) {
    bool *taken = calloc((size_t)n, 1);
    for (int j = 0; j < n_top; j++) {
        int best = -1;
        for (int v = 0; v < n; v++)
            if (!taken[v] && (best < 0 || x[v] > x[best])) best = v; /* first of equals wins */
        taken[best] = true;
        ids[j] = best;
        vals[j] = x[best];
    }
    free(taken);
}

/* Draws from a row's top-64 summary equal draws from the whole row, with the same generator,
 * for every parameter set the summary is declared exact for; and it is declared inexact for
 * penalties, plain temperature sampling and top_k too wide for the summary. */
static void test_summary_draws_match_whole_row(void **state) {
    (void)state;
    enum { V = 3000, N_TOP = 64 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    static float logits[V];
    int32_t ids[N_TOP];
    float vals[N_TOP];
    int checked = 0;
    for (int trial = 0; trial < 60; trial++) {
        random_logits(logits, V, 4.0);
        if (trial % 3 == 0) /* coarse values: many ties, some across the summary's edge */
            for (int v = 0; v < V; v++)
                logits[v] = roundf(logits[v] * 4.0f) / 4.0f;
        reference_top(logits, V, N_TOP, ids, vals);
        int32_t masked[3] = {ids[0], ids[2], 7};
        gptoss_sample_history h = {0};
        if (trial % 4 == 1) {
            h.masked = masked;
            h.n_masked = 3;
        }
        gptoss_sampling_params p = gptoss_sampling_params_default();
        p.temperature = trial % 5 == 0 ? 0.0f : (float)(0.3 + urand() * 1.5);
        p.top_k = 1 + (int32_t)(urand() * (N_TOP - 1 - h.n_masked - 1));
        p.top_p = trial % 2 ? 1.0f : (float)(0.5 + 0.5 * urand());
        p.min_p = trial % 7 == 3 ? 0.05f : 0.0f;
        assert_true(gptoss_sampler_summary_exact(&p, h.n_masked, N_TOP));
        for (int seed = 0; seed < 20; seed++) {
            gptoss_rng r1, r2;
            gptoss_rng_seed(&r1, (uint64_t)seed, (uint64_t)trial);
            gptoss_rng_seed(&r2, (uint64_t)seed, (uint64_t)trial);
            int32_t whole = gptoss_sampler_sample(s, &p, &h, logits, &r1);
            int32_t part = gptoss_sampler_sample_summary(s, &p, &h, ids, vals, N_TOP, &r2);
            if (whole != part)
                fail_msg("trial %d seed %d (T=%g top_k=%d top_p=%g masked %d): whole row %d, summary %d",
                         trial, seed, (double)p.temperature, p.top_k, (double)p.top_p, h.n_masked, whole,
                         part);
            assert_int_equal(gptoss_rng_next(&r1), gptoss_rng_next(&r2)); /* same draws used */
            checked++;
        }
    }
    assert_int_equal(checked, 60 * 20);

    gptoss_sampling_params p = gptoss_sampling_params_default();
    assert_false(gptoss_sampler_summary_exact(&p, 0, N_TOP)); /* T=1 over the whole vocabulary */
    p.top_p = 0.9f;
    assert_false(gptoss_sampler_summary_exact(&p, 0, N_TOP));
    p.top_k = N_TOP;
    assert_false(gptoss_sampler_summary_exact(&p, 0, N_TOP));
    p.top_k = N_TOP - 2;
    assert_false(gptoss_sampler_summary_exact(&p, 2, N_TOP));
    assert_true(gptoss_sampler_summary_exact(&p, 1, N_TOP));
    p.temperature = 0.0f;
    assert_true(gptoss_sampler_summary_exact(&p, 10, N_TOP));
    assert_false(gptoss_sampler_summary_exact(&p, N_TOP, N_TOP));
    p.repetition_penalty = 1.1f;
    assert_false(gptoss_sampler_summary_exact(&p, 0, N_TOP));
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.5f;
    assert_false(gptoss_sampler_summary_exact(&p, 0, N_TOP));
    gptoss_sampler_free(s);
}

/* Draw frequencies agree with the reference distribution (chi-square, fixed seed). */
static void test_empirical_frequencies(void **state) {
    (void)state;
    enum { V = 6, DRAWS = 30000 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    float logits[V] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f};
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    double want[V];
    reference(&p, logits, V, NULL, 0, NULL, 0, want);
    int counts[V] = {0};
    gptoss_rng rng;
    gptoss_rng_seed(&rng, 7, 0);
    for (int i = 0; i < DRAWS; i++)
        counts[gptoss_sampler_sample(s, &p, &empty_history, logits, &rng)]++;
    double chi2 = 0;
    int dof = -1;
    for (int v = 0; v < V; v++) {
        if (want[v] == 0) {
            assert_int_equal(counts[v], 0);
            continue;
        }
        double e = want[v] * DRAWS;
        chi2 += (counts[v] - e) * (counts[v] - e) / e;
        dof++;
    }
    assert_true(dof >= 2);
    assert_true(chi2 < 20.0); /* p < 0.001 for dof <= 5 */
    gptoss_sampler_free(s);
}

/* Full vocabulary (201088): top_p without top_k must not sort everything on peaked logits. */
static void test_full_vocab_speed(void **state) {
    (void)state;
    enum { V = 201088 };
    gptoss_sampler *s;
    gptoss_error err;
    assert_int_equal(gptoss_sampler_create(V, &s, &err), GPTOSS_OK);
    float *logits = malloc(V * sizeof(float));
    random_logits(logits, V, 20.0);
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.top_p = 0.9f;
    p.top_k = 50;
    gptoss_rng rng;
    gptoss_rng_seed(&rng, 3, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 20; i++)
        gptoss_sampler_sample(s, &p, &empty_history, logits, &rng);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms =
        ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / 20;
    print_message("sampler: %.2f ms per token over 201088 logits (top_k 50, top_p 0.9)\n", ms);
    gptoss_sampler_free(s);
    assert_int_equal(gptoss_sampler_create(2000, &s, &err), GPTOSS_OK);
    p.top_k = 0;
    compare(s, &p, logits, 2000, &empty_history); /* same kind of logits, checkable size */
    free(logits);
    gptoss_sampler_free(s);
}

static void test_params_validation(void **state) {
    (void)state;
    gptoss_error err;
    gptoss_sampling_params p = gptoss_sampling_params_default();
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_OK);
    p.top_p = 0.0f;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "top_p"));
    p = gptoss_sampling_params_default();
    p.min_p = NAN;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    p = gptoss_sampling_params_default();
    p.stop_token_ids[0] = 100;
    p.n_stop_token_ids = 1;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "stop token"));
    p = gptoss_sampling_params_default();
    p.max_tokens = 5;
    p.min_tokens = 6;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    p = gptoss_sampling_params_default();
    p.top_logprobs = 21;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masks_match_brute_force),
        cmocka_unit_test(test_penalties_change_the_right_logits),
        cmocka_unit_test(test_greedy_and_top_k_1_are_argmax),
        cmocka_unit_test(test_seeded_reproducible),
        cmocka_unit_test(test_summary_draws_match_whole_row),
        cmocka_unit_test(test_empirical_frequencies),
        cmocka_unit_test(test_full_vocab_speed),
        cmocka_unit_test(test_params_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
