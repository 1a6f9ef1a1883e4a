/*
 * test_sampler.c - the engine's side of sampling: parameter validation (logit_bias included),
 * the row a draw gets from its parameters, and the edits built from incrementally kept token
 * counts, against edits computed here from the whole history by brute force.
 */
#include "test_support.h"

#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 88172645463325252ull;
static uint32_t next32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* Brute force: the edit of token t from the whole history, or false when t needs none. */
static bool expected_edit(const gptoss_sampling_params *p, const int32_t *prompt, int n_prompt,
                          const int32_t *out, int n_out, const int32_t *masked, int n_masked,
                          int32_t t, gptoss_sample_edit *e) {
    memset(e, 0, sizeof *e);
    e->token = t;
    bool any = false;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias_tokens[i] == t) e->bias = p->logit_bias_values[i], any = true;
    for (int i = 0; i < n_masked; i++)
        if (masked[i] == t) e->masked = 1, any = true;
    const bool penalties = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                           p->presence_penalty != 0.0f;
    if (!penalties) return any;
    int count = 0;
    bool in_prompt = false;
    for (int i = 0; i < n_out; i++)
        count += out[i] == t;
    for (int i = 0; i < n_prompt; i++)
        in_prompt |= prompt[i] == t;
    e->output_count = count;
    e->seen = p->repetition_penalty != 1.0f && (in_prompt || count > 0);
    return any || count > 0 || e->seen;
}

/* Random histories grown one token at a time: after every token the edits built from the
 * incremental counts equal the brute force's, sorted and distinct; forks (copies) diverge. */
static void test_edits_match_brute_force(void **state) {
    (void)state;
    enum { V = 50, MAX_OUT = 120 };
    for (int trial = 0; trial < 40; trial++) {
        gptoss_sampling_params p = gptoss_sampling_params_default();
        if (trial % 4 != 3) p.repetition_penalty = trial % 2 ? 1.2f : 1.0f;
        if (trial % 3 == 0) p.frequency_penalty = 0.5f;
        if (trial % 5 == 1) p.presence_penalty = -1.0f;
        int32_t bias_tokens[8] = {3, 9, 17, 25, 33, 41, 44, 49};
        float bias_values[8] = {1, -2, 100, -100, 0.5f, 0, 7, -7};
        if (trial % 2 == 0) {
            p.logit_bias_tokens = bias_tokens;
            p.logit_bias_values = bias_values;
            p.n_logit_bias = 1 + trial % 8;
        }
        int32_t prompt[40], out[MAX_OUT];
        const int n_prompt = 1 + (int)(next32() % 40);
        for (int i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)(next32() % V);
        int32_t masked[3] = {4, 9, 30};
        const int n_masked = trial % 3;
        gptoss_token_counts counts, fork;
        const bool need = gptoss_sampler_needs_counts(&p);
        assert_true(gptoss_token_counts_init(&counts, prompt, n_prompt));
        gptoss_sample_edit got[8 + 3 + V], want;
        for (int n_out = 0; n_out <= MAX_OUT; n_out++) {
            if (n_out == MAX_OUT / 2) {
                assert_true(gptoss_token_counts_copy(&fork, &counts));
                gptoss_token_counts_free(&fork); /* a copy owns its own entries */
            }
            int32_t n = gptoss_sampler_edits(&p, masked, n_masked, need ? &counts : NULL, got);
            int32_t k = 0;
            for (int32_t t = 0; t < V; t++) {
                if (!expected_edit(&p, prompt, n_prompt, out, need ? n_out : 0, masked, n_masked, t,
                                   &want))
                    continue;
                if (k >= n)
                    fail_msg("trial %d after %d tokens: no edit for token %d", trial, n_out, t);
                assert_int_equal(got[k].token, t);
                assert_true(got[k].bias == want.bias);
                assert_int_equal(got[k].masked, want.masked);
                assert_int_equal(got[k].seen, want.seen);
                assert_int_equal(got[k].output_count, want.output_count);
                k++;
            }
            assert_int_equal(n, k);
            if (n_out < MAX_OUT) {
                /* a small alphabet for a while, so tokens repeat */
                out[n_out] = (int32_t)(next32() % (n_out < 60 ? 8 : V));
                assert_true(gptoss_token_counts_add_output(&counts, out[n_out]));
            }
        }
        assert_true(counts.n <= V);
        gptoss_token_counts_free(&counts);
    }
}

static void test_row_from_params(void **state) {
    (void)state;
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.temperature = 1e-6f; /* below GPTOSS_GREEDY_TEMPERATURE: greedy */
    p.top_k = -1;
    gptoss_sample_row r = gptoss_sampler_row(&p, 99, 1234, 2);
    assert_true(r.temperature == 0.0f);
    assert_int_equal(r.top_k, 0);
    assert_int_equal(r.n_top_logprobs, -1);
    assert_int_equal(r.allowed_row, -1);
    assert_true(r.seed == 99 && r.position == 1234 && r.choice == 2);
    p.temperature = 0.7f;
    p.top_k = 40;
    p.top_p = 0.8f;
    p.min_p = 0.05f;
    p.logprobs = true;
    r = gptoss_sampler_row(&p, 1, 0, 0);
    assert_true(r.temperature == 0.7f && r.top_k == 40 && r.top_p == 0.8f && r.min_p == 0.05f);
    assert_int_equal(r.n_top_logprobs, 0);
    p.top_logprobs = 5;
    assert_int_equal(gptoss_sampler_row(&p, 1, 0, 0).n_top_logprobs, 5);
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

    /* logit_bias: tokens in the vocabulary, distinct, values finite in [-100, 100], at most
     * GPTOSS_MAX_LOGIT_BIAS, arrays present. */
    int32_t tokens[3] = {5, 7, 99};
    float values[3] = {1.0f, -100.0f, 100.0f};
    p = gptoss_sampling_params_default();
    p.logit_bias_tokens = tokens;
    p.logit_bias_values = values;
    p.n_logit_bias = 3;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_OK);
    tokens[2] = 100;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "logit_bias token 100"));
    tokens[2] = 5;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "twice"));
    tokens[2] = 6;
    values[1] = -100.5f;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "[-100, 100]"));
    values[1] = NAN;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    values[1] = INFINITY;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    values[1] = 0.0f;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_OK);
    p.n_logit_bias = GPTOSS_MAX_LOGIT_BIAS + 1;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    p.n_logit_bias = 2;
    p.logit_bias_values = NULL;
    assert_int_equal(gptoss_sampling_params_validate(&p, 100, &err), GPTOSS_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edits_match_brute_force),
        cmocka_unit_test(test_row_from_params),
        cmocka_unit_test(test_params_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
