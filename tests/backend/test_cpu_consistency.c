/*
 * test_cpu_consistency.c - the CPU backend computes the same logits however a prompt is fed:
 * one prefill, token by token, chunks of 1, 3, 17 and 64 tokens, alone or batched with other
 * sequences of different lengths, with any page size; bad plans are refused without
 * touching state; FP8 dense layers (a CUDA option) and unknown layer bits are refused at
 * creation; and logits summaries (top-n, log-sum-exp) match a reference.
 *
 * The reference for each comparison is the same model run in one prefill; the bound is
 * 1e-4 relative to the row's max |logit| (the CPU backend is in fact exact here, because every
 * reduction has a fixed order per token).
 */
#include "model_fixture.h"
#include "test_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *model_dir;
static gptoss_model *model;

static int setup(void **state) {
    (void)state;
    /* The sliding-window config: prompts below run well past its window of 8. */
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/configs/swa.json", ts_env("GPTOSS_SOURCE_DIR"));
    model_dir = tm_make_model(NULL, path, 99);
    gptoss_error err = {0};
    if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_model_free(model);
    ts_rmtree(model_dir);
    free(model_dir);
    return 0;
}

static int32_t *random_ids(int32_t n, uint32_t seed) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    int32_t vocab = gptoss_model_config(model)->vocab_size;
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
    }
    return ids;
}

static void assert_close(const float *want, const float *got, int32_t rows, const char *what) {
    int32_t vocab = gptoss_model_config(model)->vocab_size;
    for (int32_t r = 0; r < rows; r++) {
        float max_abs = 0, max_diff = 0;
        for (int32_t v = 0; v < vocab; v++) {
            float w = want[(size_t)r * vocab + v], g = got[(size_t)r * vocab + v];
            if (!isfinite(g)) fail_msg("%s: row %d has a non-finite logit", what, r);
            max_abs = fmaxf(max_abs, fabsf(w));
            max_diff = fmaxf(max_diff, fabsf(w - g));
        }
        if (max_diff > 1e-4f * max_abs)
            fail_msg("%s: position %d differs by %.3g (max |logit| %.3g)", what, r, max_diff,
                     max_abs);
    }
}

static void test_chunking(void **state) {
    (void)state;
    const int32_t n = 150;
    int32_t *ids = random_ids(n, 1);
    tm_sequence seq = {ids, n};
    float *whole = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, &seq, 1, 0, 16);
    const int32_t chunks[] = {1, 3, 17, 64};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        float *chunked = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, &seq, 1, chunks[i], 16);
        char what[64];
        snprintf(what, sizeof what, "chunks of %d", chunks[i]);
        assert_close(whole, chunked, n, what);
        free(chunked);
    }
    /* Page size must not matter either. */
    const int32_t pages[] = {1, 5, 128};
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
        float *paged = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, &seq, 1, 7, pages[i]);
        char what[64];
        snprintf(what, sizeof what, "page size %d", pages[i]);
        assert_close(whole, paged, n, what);
        free(paged);
    }
    free(whole);
    free(ids);
}

static void test_batched_with_others(void **state) {
    (void)state;
    const int32_t lengths[] = {70, 1, 33, 129, 8};
    const int32_t n_seqs = 5;
    tm_sequence seqs[5];
    int32_t total = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        seqs[s].ids = random_ids(lengths[s], 100 + (uint32_t)s);
        seqs[s].n = lengths[s];
        total += lengths[s];
    }
    int32_t vocab = gptoss_model_config(model)->vocab_size;
    float *alone = malloc((size_t)total * vocab * sizeof *alone);
    for (int32_t s = 0, off = 0; s < n_seqs; s++) {
        float *one = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, &seqs[s], 1, 0, 16);
        memcpy(alone + (size_t)off * vocab, one, (size_t)lengths[s] * vocab * sizeof *one);
        off += lengths[s];
        free(one);
    }
    float *batched = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, seqs, n_seqs, 0, 16);
    assert_close(alone, batched, total, "batched prefill");
    free(batched);
    batched = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, seqs, n_seqs, 3, 16);
    assert_close(alone, batched, total, "batched chunks of 3");
    free(batched);
    batched = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, seqs, n_seqs, 1, 16);
    assert_close(alone, batched, total, "batched token by token");
    free(batched);
    free(alone);
    for (int32_t s = 0; s < n_seqs; s++)
        free((void *)seqs[s].ids);
}

/* A plan that names a block outside the pool, a wrong position, an out-of-vocabulary token or
 * a bad logit index is refused with a message, and the backend keeps working afterwards. */
static void test_bad_plans_refused(void **state) {
    (void)state;
    gptoss_backend_options options = gptoss_backend_options_default();
    options.n_kv_blocks = 4;
    gptoss_backend *backend = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err), GPTOSS_OK);
    int32_t vocab = gptoss_model_config(model)->vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    int32_t ids[2] = {5, 6}, positions[2] = {0, 1}, starts[2] = {0, 2}, cached = 0,
            table[4] = {0, 1, 2, 3}, index = 1;
    gptoss_batch_plan good = {.n_tokens = 2,
                              .token_ids = ids,
                              .positions = positions,
                              .n_seqs = 1,
                              .seq_token_start = starts,
                              .seq_n_cached = &cached,
                              .max_blocks_per_seq = 4,
                              .block_tables = table,
                              .n_logits = 1,
                              .logit_token_index = &index};
    gptoss_batch_plan p;
    int32_t bad_table[4] = {9, 1, 2, 3};
    p = good, p.block_tables = bad_table;
    assert_int_equal(gptoss_backend_forward(backend, &p, logits, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "not a block"));
    int32_t bad_positions[2] = {0, 2};
    p = good, p.positions = bad_positions;
    assert_int_equal(gptoss_backend_forward(backend, &p, logits, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "has position 2, expected 1"));
    int32_t bad_ids[2] = {5, vocab};
    p = good, p.token_ids = bad_ids;
    assert_int_equal(gptoss_backend_forward(backend, &p, logits, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "outside the model's vocabulary"));
    int32_t bad_index = 2;
    p = good, p.logit_token_index = &bad_index;
    assert_int_equal(gptoss_backend_forward(backend, &p, logits, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "logit_token_index"));
    int32_t too_long_cached = 63;
    p = good, p.seq_n_cached = &too_long_cached;
    int32_t far_positions[2] = {63, 64};
    p.positions = far_positions;
    assert_int_equal(gptoss_backend_forward(backend, &p, logits, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "KV slots"));
    /* Still fine afterwards. */
    assert_int_equal(gptoss_backend_forward(backend, &good, logits, &err), GPTOSS_OK);
    for (int32_t v = 0; v < vocab; v++)
        assert_true(isfinite(logits[v]));
    free(logits);
    gptoss_backend_free(backend);
}

/* fp8_layers: the CPU backend computes in fp32 and says so rather than ignoring the request;
 * bits that name no layer are refused whatever the backend. */
static void test_fp8_layers_refused(void **state) {
    (void)state;
    gptoss_backend_options options = gptoss_backend_options_default();
    gptoss_backend *backend = NULL;
    gptoss_error err = {0};
    options.fp8_layers = GPTOSS_FP8_QKV;
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err),
                     GPTOSS_ERR_UNSUPPORTED);
    assert_null(backend);
    assert_non_null(strstr(err.message, "CUDA backend option"));
    options.fp8_layers = GPTOSS_FP8_ALL + 1;
    options.kind = GPTOSS_BACKEND_CUDA;
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_null(backend);
    assert_non_null(strstr(err.message, "fp8_layers"));
    options.kind = GPTOSS_BACKEND_CPU;
    options.fp8_layers = 0;
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err), GPTOSS_OK);
    gptoss_backend_free(backend);
}

/* Reference summary written here: repeated selection of the largest (NaN as -inf, first of
 * equals wins) and a double-precision log-sum-exp skipping NaN. */
static void reference_summary(const float *row, int32_t n, int32_t n_top, int32_t *ids, float *vals,
                              double *lse) {
    char *taken = calloc((size_t)n, 1);
    for (int32_t j = 0; j < n_top; j++) {
        int32_t best = -1;
        double best_v = 0;
        for (int32_t v = 0; v < n; v++) {
            double x = isnan(row[v]) ? -INFINITY : row[v];
            if (!taken[v] && (best < 0 || x > best_v)) best = v, best_v = x;
        }
        taken[best] = 1;
        ids[j] = best;
        vals[j] = (float)best_v;
    }
    double m = -INFINITY, sum = 0;
    for (int32_t v = 0; v < n; v++)
        if (!isnan(row[v]) && row[v] > m) m = row[v];
    for (int32_t v = 0; v < n; v++)
        if (!isnan(row[v])) sum += exp((double)row[v] - m);
    *lse = m + log(sum);
    free(taken);
}

/* Host summaries of odd rows (ties, NaN, -inf, signed zeros) match the reference, and the
 * backend's summary of a real step equals summarizing its full logits, with whole rows
 * returned exactly where asked. */
static void test_logits_summary(void **state) {
    (void)state;
    enum { N = 700, TOP = 64 };
    float row[N];
    int32_t ids[TOP], want_ids[TOP];
    float vals[TOP], want_vals[TOP], lse;
    double want_lse;
    uint32_t seed = 5;
    for (int trial = 0; trial < 20; trial++) {
        for (int32_t v = 0; v < N; v++) {
            seed = seed * 1664525u + 1013904223u;
            row[v] =
                (float)((int32_t)(seed >> 20) - 2048) / (trial % 2 ? 256.0f : 16.0f); /* ties */
        }
        row[(trial * 37) % N] = NAN;
        row[(trial * 11 + 3) % N] = -INFINITY;
        row[(trial * 13 + 5) % N] = -0.0f;
        row[(trial * 17 + 9) % N] = 0.0f;
        int32_t n_top = trial == 0 ? 1 : TOP - trial % 3;
        gptoss_logits_summarize_row(row, N, n_top, ids, vals, &lse);
        reference_summary(row, N, n_top, want_ids, want_vals, &want_lse);
        for (int32_t j = 0; j < n_top; j++) {
            if (ids[j] != want_ids[j] || vals[j] != want_vals[j])
                fail_msg("trial %d rank %d: got %d (%g), want %d (%g)", trial, j, ids[j],
                         (double)vals[j], want_ids[j], (double)want_vals[j]);
        }
        assert_true(fabs(lse - want_lse) < 1e-5 * fmax(1.0, fabs(want_lse)));
    }

    gptoss_backend_options options = gptoss_backend_options_default();
    gptoss_backend *backend = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_backend_create(model, &options, &backend, &err), GPTOSS_OK);
    const int32_t vocab = gptoss_model_config(model)->vocab_size, T = 6;
    int32_t *tok = random_ids(T, 77);
    int32_t positions[6] = {0, 1, 2, 3, 4, 5}, starts[2] = {0, T}, cached = 0, table[1] = {0},
            index[6] = {0, 1, 2, 3, 4, 5};
    gptoss_batch_plan plan = {.n_tokens = T,
                              .token_ids = tok,
                              .positions = positions,
                              .n_seqs = 1,
                              .seq_token_start = starts,
                              .seq_n_cached = &cached,
                              .max_blocks_per_seq = 1,
                              .block_tables = table,
                              .n_logits = T,
                              .logit_token_index = index};
    float *full = malloc((size_t)T * vocab * sizeof *full);
    assert_int_equal(gptoss_backend_forward(backend, &plan, full, &err), GPTOSS_OK);
    /* Same plan again: the KV slots are rewritten with the same values, so the logits repeat. */
    int32_t s_ids[6 * TOP];
    float s_vals[6 * TOP], s_lse[6];
    uint8_t want_full[6] = {0, 1, 0, 0, 1, 1};
    float *rows = malloc((size_t)T * vocab * sizeof *rows);
    for (size_t i = 0; i < (size_t)T * vocab; i++)
        rows[i] = 12345.0f;
    gptoss_logits_summary out = {.n_top = TOP,
                                 .top_ids = s_ids,
                                 .top_logits = s_vals,
                                 .logsumexp = s_lse,
                                 .full = want_full,
                                 .logits = rows};
    assert_int_equal(gptoss_backend_forward_summary(backend, &plan, &out, &err), GPTOSS_OK);
    for (int32_t r = 0; r < T; r++) {
        const float *fr = full + (size_t)r * vocab;
        reference_summary(fr, vocab, TOP, want_ids, want_vals, &want_lse);
        assert_memory_equal(s_ids + r * TOP, want_ids, sizeof want_ids);
        assert_memory_equal(s_vals + r * TOP, want_vals, sizeof want_vals);
        assert_true(fabs(s_lse[r] - want_lse) < 1e-5 * fmax(1.0, fabs(want_lse)));
        if (want_full[r])
            assert_memory_equal(rows + (size_t)r * vocab, fr, (size_t)vocab * sizeof *fr);
        else
            assert_true(rows[(size_t)r * vocab] == 12345.0f &&
                        rows[(size_t)r * vocab + vocab - 1] == 12345.0f);
    }
    /* Bad summary requests are refused. */
    out.n_top = 0;
    assert_int_equal(gptoss_backend_forward_summary(backend, &plan, &out, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    out.n_top = TOP;
    out.logits = NULL;
    assert_int_equal(gptoss_backend_forward_summary(backend, &plan, &out, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    free(rows);
    free(full);
    free(tok);
    gptoss_backend_free(backend);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunking),          cmocka_unit_test(test_batched_with_others),
        cmocka_unit_test(test_bad_plans_refused), cmocka_unit_test(test_fp8_layers_refused),
        cmocka_unit_test(test_logits_summary),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
