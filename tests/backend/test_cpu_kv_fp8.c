/*
 * test_cpu_kv_fp8.c - the CPU backend with an FP8 KV cache (kv_cache_dtype = FP8, emulated:
 * every K and V head vector is rounded through e4m3 + scale before it is stored).
 *
 * Models and prompts: the four golden fixtures (tests/golden: sliding window, YaRN, 32 experts
 * with GQA, the tiny preset with the real vocabulary), regenerated from their seeds, each
 * fixture's prompts plus, on the small-vocabulary models, one random prompt of 400 tokens (past
 * every sliding window). The real vocabulary makes every row of logits 400 times as wide: that
 * model runs only its fixture prompt (40 tokens, past its window of 16), where it adds what the
 * others cannot, the top-1 against transformers on real token ids.
 *
 * Reference: the same backend with the default cache and emulate_bf16_activations on both, so
 * the reference's pages hold bf16 K and V exactly as the CUDA backend's bf16 pages do, and
 * the only difference is the cache format.
 *
 * What to expect: e4m3 keeps 4 significant bits where bf16 keeps 8, so each K and V value
 * moves by up to 2^-4 of itself instead of 2^-8 (a head vector by 2-3% relative L2), and the
 * logits move about 16 times as much as from rounding K and V to bf16. Measured on these
 * models (fp32 pages against bf16-rounded ones, then against e4m3 ones): median row errors of
 * 1.3e-3 to 3.7e-3 for bf16 and 1.8e-2 to 7.1e-2 for e4m3 (ratios 14 to 27). These random
 * models amplify small changes: their logits are flat, and with top-k routing a near-tie
 * between experts flips (bf16 rounding of K and V alone moved single rows by up to 55%). So:
 *   - median of the per-row relative L2 error ||fp8 - ref|| / ||ref||: under 0.04 when every
 *     expert is selected (routing cannot flip; measured 1.8e-2, the yarn model) and under 0.15
 *     with top-k routing (measured 4.2e-2 to 7.1e-2): about twice what was measured. At least
 *     5e-3, or the cache was not quantized (the reference would give exactly 0);
 *   - every row finite, and with routing fixed every row under 0.10 (measured at most 4.7e-2);
 *     with routing, single rows are not bounded (a flipped expert reaches the later tokens);
 *   - top-1: the same pick on at least 99% of the rows where the choice is decisive (the
 *     reference's margin between its top-1 and the FP8 pick exceeds 5x the row's RMS logit
 *     difference, so rounding cannot explain a different pick; measured 100%), and on at
 *     least 65% of all rows (measured 77% on the tiny preset to 96%: flat logits make many
 *     rows near-ties); on the fixture prompts the FP8 top-1 also agrees with transformers' on
 *     at least 70% of the positions (measured 80% to 96%; the fp32 reference: 100%,
 *     test_golden.c).
 * A wrong head, scale or page gives errors of order 1 on every row.
 *
 * And the emulation keeps what the engine relies on: the same logits (to 1e-4 of the row's
 * max, as test_cpu_consistency.c) whether a prompt is prefilled at once, token by token or in
 * chunks, since each token's K and V are quantized on their own.
 */
#include "model_fixture.h"
#include "test_support.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP8_MEDIAN_FIXED 0.04  /* median row error, every expert selected */
#define FP8_MEDIAN_ROUTED 0.15 /* median row error, top-k routing */
#define FP8_ROW_FIXED 0.10     /* every row, every expert selected */
#define FP8_IN_EFFECT 5e-3     /* a median below this: the cache was not quantized */
#define DECISIVE_AGREE 0.99
#define RAW_AGREE 0.65
#define GOLDEN_AGREE 0.70

typedef struct row_stats {
    int rows, agree, decisive, decisive_agree, golden_rows, golden_agree;
    double rel[4096];
    double worst;
} row_stats;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int32_t argmax(const float *row, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* Adds n rows of fp8 logits against the reference; golden_top: transformers' top-1 per row or
 * NULL. */
static void compare(row_stats *st, const float *ref, const float *got, int32_t n, int32_t vocab,
                    const int32_t *golden_top) {
    for (int32_t r = 0; r < n; r++) {
        const float *a = ref + (size_t)r * vocab, *b = got + (size_t)r * vocab;
        double num = 0, den = 0;
        for (int32_t v = 0; v < vocab; v++) {
            assert_true(isfinite(b[v]));
            double d = (double)b[v] - a[v];
            num += d * d;
            den += (double)a[v] * a[v];
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        int32_t am = argmax(a, vocab), bm = argmax(b, vocab);
        if (am == bm || (double)a[am] - a[bm] > 5 * sqrt(num / vocab)) {
            st->decisive++;
            st->decisive_agree += am == bm;
        }
        st->agree += am == bm;
        if (golden_top) {
            st->golden_rows++;
            st->golden_agree += bm == golden_top[r];
        }
        if (st->rows < 4096) st->rel[st->rows] = rel;
        st->rows++;
        if (rel > st->worst) st->worst = rel;
    }
}

static void check_fixture(const char *name) {
    char *dir = NULL;
    uint64_t seed = 0;
    json_t *fx = tm_golden_fixture(name, &dir, &seed);
    gptoss_model *model = NULL;
    gptoss_error err = {0};
    if (gptoss_model_load(dir, &model, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    const gptoss_config *c = gptoss_model_config(model);
    int32_t vocab = c->vocab_size;

    gptoss_backend_options ref_options = gptoss_backend_options_default();
    ref_options.testing.emulate_bf16_activations = true;
    gptoss_backend_options fp8_options = ref_options;
    fp8_options.kv_cache_dtype = GPTOSS_KV_CACHE_FP8;
    row_stats *st = calloc(1, sizeof *st);
    json_t *prompts = json_object_get(fx, "prompts");
    size_t n_prompts = json_array_size(prompts);
    size_t n_runs = vocab > 100000 ? n_prompts : n_prompts + 1;
    for (size_t p = 0; p < n_runs; p++) {
        /* the fixture's prompts, then one random prompt of 400 tokens */
        json_t *prompt_ids =
            p < n_prompts ? json_object_get(json_array_get(prompts, p), "ids") : NULL;
        int32_t n = prompt_ids ? (int32_t)json_array_size(prompt_ids) : 400;
        int32_t *ids = malloc((size_t)n * sizeof *ids), *golden_top = NULL;
        uint64_t h = 0x9e3779b97f4a7c15ull ^ seed;
        for (int32_t i = 0; i < n; i++) {
            if (p < n_prompts) {
                ids[i] = (int32_t)json_integer_value(json_array_get(prompt_ids, (size_t)i));
            } else {
                h ^= h << 13, h ^= h >> 7, h ^= h << 17;
                ids[i] = (int32_t)(h % (uint64_t)vocab);
            }
        }
        if (p < n_prompts) {
            golden_top = malloc((size_t)n * sizeof *golden_top);
            json_t *tops = json_object_get(json_array_get(prompts, p), "top_ids");
            for (int32_t i = 0; i < n; i++)
                golden_top[i] =
                    (int32_t)json_integer_value(json_array_get(json_array_get(tops, i), 0));
        }
        tm_sequence seq = {ids, n};
        float *ref = tm_run_all_logits_with(model, &ref_options, &seq, 1, 0);
        float *fp8 = tm_run_all_logits_with(model, &fp8_options, &seq, 1, 0);
        compare(st, ref, fp8, n, vocab, golden_top);
        if (p == n_runs - 1 && c->sliding_window > 0 && c->sliding_window < n) {
            /* chunked and token-by-token prefill store the same quantized vectors (on the
             * last prompt of the models whose window it crosses; the others only add run
             * time, which the sanitizer build multiplies) */
            const int32_t chunks[] = {1, 37};
            for (size_t k = 0; k < 2; k++) {
                float *chunked = tm_run_all_logits_with(model, &fp8_options, &seq, 1, chunks[k]);
                for (int32_t r = 0; r < n; r++) {
                    const float *a = fp8 + (size_t)r * vocab, *b = chunked + (size_t)r * vocab;
                    float mx = 0, diff = 0;
                    for (int32_t v = 0; v < vocab; v++) {
                        mx = fmaxf(mx, fabsf(a[v]));
                        diff = fmaxf(diff, fabsf(a[v] - b[v]));
                    }
                    if (diff > 1e-4f * mx)
                        fail_msg("%s: chunks of %d, row %d: max |dlogit| %.3g over 1e-4 x %.3g",
                                 name, chunks[k], r, (double)diff, (double)mx);
                }
                free(chunked);
            }
        }
        free(ref), free(fp8), free(ids), free(golden_top);
    }
    int rows = st->rows < 4096 ? st->rows : 4096;
    qsort(st->rel, (size_t)rows, sizeof(double), cmp_double);
    double median = st->rel[rows / 2];
    double decisive = st->decisive ? (double)st->decisive_agree / st->decisive : 0;
    double raw = (double)st->agree / st->rows, golden = (double)st->golden_agree / st->golden_rows;
    bool routing_fixed = c->n_experts == c->n_experts_per_token;
    double median_bar = routing_fixed ? FP8_MEDIAN_FIXED : FP8_MEDIAN_ROUTED;
    printf("fp8 KV vs bf16 KV, %s: %d rows, row rel L2 median %.2e (bar %.2f, >= %.0e) max %.2e "
           "(bar %s); top-1 "
           "%.1f%% (bar %.0f%%), decisive %.1f%% of %d (bar %.0f%%), vs transformers %.1f%% (bar "
           "%.0f%%)\n",
           name, st->rows, median, median_bar, FP8_IN_EFFECT, st->worst,
           routing_fixed ? "0.10" : "finite", 100 * raw, 100 * RAW_AGREE, 100 * decisive,
           st->decisive, 100 * DECISIVE_AGREE, 100 * golden, 100 * GOLDEN_AGREE);
    assert_true(median < median_bar);
    assert_true(median >= FP8_IN_EFFECT);
    assert_true(isfinite(st->worst));
    if (routing_fixed) assert_true(st->worst < FP8_ROW_FIXED);
    assert_true(decisive >= DECISIVE_AGREE);
    assert_true(raw >= RAW_AGREE);
    assert_true(golden >= GOLDEN_AGREE);
    free(st);
    gptoss_model_free(model);
    ts_rmtree(dir);
    free(dir);
    json_decref(fx);
}

static void test_sliding_window(void **state) {
    (void)state;
    check_fixture("swa");
}

static void test_yarn(void **state) {
    (void)state;
    check_fixture("yarn");
}

static void test_many_experts_gqa(void **state) {
    (void)state;
    check_fixture("moe");
}

static void test_tiny_preset(void **state) {
    (void)state;
    check_fixture("tiny");
}

/* Refused: a dtype outside the enum, whatever the backend. */
static void test_bad_dtype_refused(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/support/micro_vocab.json", ts_env("GPTOSS_SOURCE_DIR"));
    char *dir = tm_make_model(NULL, path, 1);
    gptoss_model *model = NULL;
    gptoss_error err = {0};
    if (gptoss_model_load(dir, &model, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    gptoss_backend_options options = gptoss_backend_options_default();
    options.kv_cache_dtype = (gptoss_kv_cache_dtype)7;
    gptoss_backend *backend = NULL;
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_null(backend);
    assert_non_null(strstr(err.message, "kv_cache_dtype"));
    options.kv_cache_dtype = GPTOSS_KV_CACHE_FP8;
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err), GPTOSS_OK);
    assert_int_equal(gptoss_backend_get_options(backend).kv_cache_dtype, GPTOSS_KV_CACHE_FP8);
    gptoss_backend_free(backend);
    gptoss_model_free(model);
    ts_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sliding_window),    cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_many_experts_gqa),  cmocka_unit_test(test_tiny_preset),
        cmocka_unit_test(test_bad_dtype_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
