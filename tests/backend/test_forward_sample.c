/*
 * test_forward_sample.c - gptoss_backend_forward_sample on the CPU backend (no device sampler:
 * forward, then the host reference per row): the tokens and logprobs equal the reference
 * applied to the logits gptoss_backend_forward returns for the same plan, with rows asked for
 * more than once, edits and allowed-token masks (given, or written by the batch's fill_masks
 * hook once the logits exist); and every malformed batch is refused with a message naming the
 * problem, before anything runs (outputs untouched).
 */
#include "model_fixture.h"
#include "test_support.h"

#include "backend/sampling_ref.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *model_dir;
static gptoss_model *model;

static int setup(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/golden/configs/swa.json", ts_env("GPTOSS_SOURCE_DIR"));
    model_dir = tm_make_model(NULL, path, 7);
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

enum { T = 6, ROWS = 6 };

typedef struct fixture {
    gptoss_backend *backend;
    int32_t vocab;
    int32_t tokens[T], positions[T], starts[2], cached, table[1], all_index[T], index[ROWS];
    gptoss_batch_plan plan;
    gptoss_sample_row rows[ROWS];
    gptoss_sample_edit edits[4];
    uint32_t *mask;
    int32_t token_ids[ROWS];
    float logprobs[ROWS];
    int32_t top_ids[ROWS * GPTOSS_MAX_SAMPLE_LOGPROBS];
    float top_logprobs[ROWS * GPTOSS_MAX_SAMPLE_LOGPROBS];
    gptoss_sample_batch batch;
} fixture;

static gptoss_sample_row plain_row(float temperature, uint64_t seed) {
    gptoss_sample_row r = {0};
    r.temperature = temperature;
    r.top_p = 1.0f;
    r.repetition_penalty = 1.0f;
    r.seed = seed;
    r.position = T;
    r.n_top_logprobs = -1;
    r.allowed_row = -1;
    return r;
}

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    gptoss_backend_options options = gptoss_backend_options_default();
    gptoss_error err = {0};
    assert_int_equal(gptoss_backend_create(model, &options, &f->backend, &err), GPTOSS_OK);
    f->vocab = gptoss_model_config(model)->vocab_size;
    for (int32_t i = 0; i < T; i++) {
        f->tokens[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)f->vocab);
        f->positions[i] = i;
        f->all_index[i] = i;
    }
    f->starts[1] = T;
    const int32_t index[ROWS] = {5, 5, 5, 2, 4, 5}; /* the last row three times more */
    memcpy(f->index, index, sizeof index);
    f->plan = (gptoss_batch_plan){.n_tokens = T,
                                  .token_ids = f->tokens,
                                  .positions = f->positions,
                                  .n_seqs = 1,
                                  .seq_token_start = f->starts,
                                  .seq_n_cached = &f->cached,
                                  .max_blocks_per_seq = 1,
                                  .block_tables = f->table,
                                  .n_logits = ROWS,
                                  .logit_token_index = f->index};
    f->rows[0] = plain_row(0.0f, 0);  /* greedy */
    f->rows[1] = plain_row(1.0f, 42); /* temperature 1 */
    f->rows[2] = plain_row(1.0f, 42); /* same seed, other choice */
    f->rows[2].choice = 1;
    f->rows[3] = plain_row(0.7f, 9); /* top_k, top_p, min_p, penalties, edits */
    f->rows[3].top_k = 5;
    f->rows[3].top_p = 0.8f;
    f->rows[3].min_p = 0.01f;
    f->rows[3].repetition_penalty = 1.2f;
    f->rows[3].frequency_penalty = 0.5f;
    f->rows[3].position = 3;
    f->rows[3].n_edits = 4;
    f->rows[3].n_top_logprobs = 5;
    for (int32_t e = 0; e < 4; e++)
        f->edits[e] = (gptoss_sample_edit){.token = 3 + 11 * e,
                                           .bias = (float)e - 1.5f,
                                           .output_count = e,
                                           .seen = (uint8_t)(e % 2),
                                           .masked = e == 2};
    f->rows[4] = plain_row(2.0f, 5); /* allowed-token mask */
    f->rows[4].position = 5;
    f->rows[4].allowed_row = 0;
    f->rows[4].n_top_logprobs = 0;
    f->rows[5] = plain_row(1.0f, 42); /* choice 2 of the same seed */
    f->rows[5].choice = 2;
    const size_t words = ((size_t)f->vocab + 31) / 32;
    f->mask = calloc(words, sizeof *f->mask);
    for (int32_t t = 0; t < f->vocab; t += 5)
        f->mask[t / 32] |= 1u << (t % 32);
    for (int32_t i = 0; i < ROWS; i++)
        f->token_ids[i] = -7;
    f->batch = (gptoss_sample_batch){.rows = f->rows,
                                     .edits = f->edits,
                                     .n_edits = 4,
                                     .allowed_masks = f->mask,
                                     .n_allowed_rows = 1,
                                     .token_ids = f->token_ids,
                                     .logprobs = f->logprobs,
                                     .top_ids = f->top_ids,
                                     .top_logprobs = f->top_logprobs};
}

static void fixture_free(fixture *f) {
    gptoss_backend_free(f->backend);
    free(f->mask);
}

static void test_equals_reference_on_forward_logits(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    gptoss_error err = {0};
    gptoss_batch_plan all = f.plan;
    all.n_logits = T;
    all.logit_token_index = f.all_index;
    float *logits = malloc((size_t)T * f.vocab * sizeof *logits);
    assert_int_equal(gptoss_backend_forward(f.backend, &all, logits, &err), GPTOSS_OK);
    /* The same plan again rewrites the same KV values: the same logits. */
    assert_int_equal(gptoss_backend_forward_sample(f.backend, &f.plan, &f.batch, &err), GPTOSS_OK);
    gptoss_sample_scratch *s;
    assert_int_equal(gptoss_sample_scratch_create(f.vocab, &s, &err), GPTOSS_OK);
    for (int32_t i = 0; i < ROWS; i++) {
        const float *row = logits + (size_t)f.index[i] * f.vocab;
        const gptoss_sample_row *r = &f.rows[i];
        int32_t want =
            gptoss_sample_reference(row, f.vocab, r, r->n_edits ? f.edits + r->edit_start : NULL,
                                    r->allowed_row >= 0 ? f.mask : NULL, s);
        assert_int_equal(f.token_ids[i], want);
        if (r->n_top_logprobs >= 0) {
            int32_t ids[GPTOSS_MAX_SAMPLE_LOGPROBS];
            float lps[GPTOSS_MAX_SAMPLE_LOGPROBS];
            float lp = gptoss_sample_logprobs(row, f.vocab, want, r->n_top_logprobs, ids, lps);
            assert_true(f.logprobs[i] == lp);
            for (int32_t k = 0; k < r->n_top_logprobs; k++) {
                assert_int_equal(f.top_ids[i * GPTOSS_MAX_SAMPLE_LOGPROBS + k], ids[k]);
                assert_true(f.top_logprobs[i * GPTOSS_MAX_SAMPLE_LOGPROBS + k] == lps[k]);
            }
        }
    }
    /* greedy is the argmax; the masked row drew an allowed token; choices of one seed differ
     * somewhere (three draws from one temperature-1 row) */
    int32_t best = 0;
    for (int32_t v = 1; v < f.vocab; v++)
        if (logits[5 * (size_t)f.vocab + v] > logits[5 * (size_t)f.vocab + best]) best = v;
    assert_int_equal(f.token_ids[0], best);
    assert_int_equal(f.token_ids[4] % 5, 0);
    assert_true(f.token_ids[1] != f.token_ids[2] || f.token_ids[2] != f.token_ids[5]);
    gptoss_sample_scratch_free(s);
    free(logits);
    fixture_free(&f);
}

/* One malformed field at a time: refused, the message names it, no token written. */
static void expect_refused(fixture *f, const char *what) {
    gptoss_error err = {0};
    for (int32_t i = 0; i < ROWS; i++)
        f->token_ids[i] = -7;
    assert_int_equal(gptoss_backend_forward_sample(f->backend, &f->plan, &f->batch, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    if (!strstr(err.message, what))
        fail_msg("expected a message about \"%s\", got: %s", what, err.message);
    for (int32_t i = 0; i < ROWS; i++)
        assert_int_equal(f->token_ids[i], -7);
}

static void test_bad_batches_refused(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    gptoss_error err = {0};
    assert_int_equal(gptoss_backend_forward_sample(f.backend, &f.plan, NULL, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    gptoss_sample_row saved;
#define BAD_ROW(i, field, value, what)                                                             \
    do {                                                                                           \
        saved = f.rows[i];                                                                         \
        f.rows[i].field = value;                                                                   \
        expect_refused(&f, what);                                                                  \
        f.rows[i] = saved;                                                                         \
    } while (0)
    BAD_ROW(1, temperature, -1.0f, "temperature");
    BAD_ROW(1, temperature, NAN, "temperature");
    BAD_ROW(1, temperature, 1e-45f, "temperature"); /* log2(e) / T overflows */
    BAD_ROW(1, top_p, 0.0f, "top_p");
    BAD_ROW(1, top_p, 1.5f, "top_p");
    BAD_ROW(1, min_p, -0.1f, "min_p");
    BAD_ROW(1, min_p, NAN, "min_p");
    BAD_ROW(1, repetition_penalty, 0.0f, "repetition_penalty");
    BAD_ROW(1, repetition_penalty, INFINITY, "repetition_penalty");
    BAD_ROW(1, frequency_penalty, NAN, "penalties");
    BAD_ROW(1, position, -1, "position");
    BAD_ROW(1, choice, -1, "choice");
    BAD_ROW(1, n_top_logprobs, 21, "n_top_logprobs");
    BAD_ROW(1, n_top_logprobs, -2, "n_top_logprobs");
    BAD_ROW(1, allowed_row, 1, "allowed_row");
    BAD_ROW(1, allowed_row, -2, "allowed_row");
    BAD_ROW(3, n_edits, 5, "edits");
    BAD_ROW(3, edit_start, 1, "edits");
    BAD_ROW(3, n_edits, -1, "edits");
#undef BAD_ROW
    /* Edits: in range, sorted, distinct, finite. */
    gptoss_sample_edit e1 = f.edits[1];
    f.edits[1].token = f.vocab;
    expect_refused(&f, "outside the vocabulary");
    f.edits[1].token = f.edits[0].token;
    expect_refused(&f, "sorted");
    f.edits[1].token = f.edits[0].token - 1;
    expect_refused(&f, "sorted");
    f.edits[1] = e1;
    f.edits[1].bias = INFINITY;
    expect_refused(&f, "bias");
    f.edits[1] = e1;
    f.edits[1].output_count = -1;
    expect_refused(&f, "output_count");
    f.edits[1] = e1;
    /* Outputs and arrays. */
    f.batch.logprobs = NULL;
    expect_refused(&f, "logprobs");
    f.batch.logprobs = f.logprobs;
    f.batch.top_ids = NULL;
    expect_refused(&f, "top_ids");
    f.batch.top_ids = f.top_ids;
    f.batch.allowed_masks = NULL;
    expect_refused(&f, "allowed_masks");
    f.batch.allowed_masks = f.mask;
    f.batch.edits = NULL;
    expect_refused(&f, "edits");
    f.batch.edits = f.edits;
    f.batch.rows = NULL;
    expect_refused(&f, "rows");
    f.batch.rows = f.rows;
    /* A bad plan is refused too (and with it nothing drawn). */
    f.index[2] = T;
    expect_refused(&f, "logit_token_index");
    f.index[2] = 5;
    /* Everything restored: accepted. */
    assert_int_equal(gptoss_backend_forward_sample(f.backend, &f.plan, &f.batch, &err), GPTOSS_OK);
    fixture_free(&f);
}

/* A batch's fill_masks: writes the fixture's mask (or fails), counting its calls. */
typedef struct fill_state {
    const uint32_t *mask;
    size_t words;
    int calls;
    bool fail;
} fill_state;

static gptoss_status fill_from_fixture(void *user, uint32_t *masks, gptoss_error *error) {
    fill_state *fs = user;
    fs->calls++;
    if (fs->fail)
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "constraint state out of memory");
    memcpy(masks, fs->mask, fs->words * sizeof *masks);
    return GPTOSS_OK;
}

/* Masks written through fill_masks draw exactly what the same masks in allowed_masks draw,
 * the hook runs once per call; a failing hook is the call's error, with no token drawn; a
 * batch with both or neither of allowed_masks / fill_masks is refused. */
static void test_fill_masks(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    gptoss_error err = {0};
    int32_t want[ROWS];
    assert_int_equal(gptoss_backend_forward_sample(f.backend, &f.plan, &f.batch, &err), GPTOSS_OK);
    memcpy(want, f.token_ids, sizeof want);

    fill_state fs = {.mask = f.mask, .words = ((size_t)f.vocab + 31) / 32};
    f.batch.allowed_masks = NULL;
    f.batch.fill_masks = fill_from_fixture;
    f.batch.fill_masks_user = &fs;
    for (int32_t i = 0; i < ROWS; i++)
        f.token_ids[i] = -7;
    assert_int_equal(gptoss_backend_forward_sample(f.backend, &f.plan, &f.batch, &err), GPTOSS_OK);
    assert_int_equal(fs.calls, 1);
    assert_memory_equal(f.token_ids, want, sizeof want);
    assert_int_equal(f.token_ids[4] % 5, 0);

    fs.fail = true;
    for (int32_t i = 0; i < ROWS; i++)
        f.token_ids[i] = -7;
    assert_int_equal(gptoss_backend_forward_sample(f.backend, &f.plan, &f.batch, &err),
                     GPTOSS_ERR_BACKEND);
    assert_int_equal(fs.calls, 2);
    assert_non_null(strstr(err.message, "constraint state out of memory"));
    for (int32_t i = 0; i < ROWS; i++)
        assert_int_equal(f.token_ids[i], -7);

    f.batch.allowed_masks = f.mask; /* both */
    expect_refused(&f, "fill_masks");
    f.batch.allowed_masks = NULL;
    f.batch.fill_masks = NULL; /* neither */
    expect_refused(&f, "fill_masks");
    assert_int_equal(fs.calls, 2);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_reference_on_forward_logits),
        cmocka_unit_test(test_bad_batches_refused),
        cmocka_unit_test(test_fill_masks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
