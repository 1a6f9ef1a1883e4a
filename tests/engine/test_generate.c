/*
 * test_generate.c - gptoss_engine_generate (engine/generate.c), the synchronous path the
 * terminal front ends use, against fake_backend.h: its greedy tokens equal
 * fake_reference_greedy() computed from token lists alone; eos tokens set through
 * gptoss_engine_options_set_eos end it; a callback or a stop flag stops it; a follow-up
 * prompt that extends the last one is served from the prefix cache and still matches the
 * reference; a backend failure is returned as an error.
 */
#include "test_support.h"

#include "gptoss_engine.h"
#include "fake_backend.h"

#include <string.h>

#define VOCAB 64
#define BLOCK 4
#define MAX_OUT 256

typedef struct collected {
    int32_t ids[MAX_OUT];
    int32_t n;
    int32_t stop_after; /* on_token returns false after this many (0 = never) */
} collected;

static bool collect(void *user, const gptoss_engine_event *event) {
    collected *c = user;
    assert_true(c->n < MAX_OUT);
    assert_int_equal(event->index, 0);
    c->ids[c->n++] = event->token_id;
    return !(c->stop_after > 0 && c->n >= c->stop_after);
}

static gptoss_engine *start_engine(fake_backend *f, const int32_t *eos, size_t n_eos) {
    gptoss_engine_options o = gptoss_engine_options_default();
    o.forward_sample = fake_forward_sample;
    o.forward_user = f;
    o.vocab_size = f->vocab;
    o.sliding_window = f->window;
    o.kv_block_size = f->block_size;
    o.n_kv_blocks = f->n_blocks;
    o.n_sliding_kv_blocks = f->n_sliding;
    o.max_model_len = 1024;
    o.max_num_seqs = 1;
    if (n_eos) gptoss_engine_options_set_eos(&o, eos, n_eos);
    gptoss_engine *e = NULL;
    gptoss_error err = {0};
    if (gptoss_engine_create(&o, &e, &err) != GPTOSS_OK ||
        gptoss_engine_start(e, &err) != GPTOSS_OK)
        fail_msg("engine: %s", err.message);
    return e;
}

static gptoss_sampling_params greedy(int32_t max_tokens, bool ignore_eos) {
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = ignore_eos;
    return p;
}

static void random_prompt(int32_t *prompt, int32_t n, uint32_t seed) {
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        prompt[i] = (int32_t)((seed >> 16) % VOCAB);
    }
}

static void expect_ids(const int32_t *got, int32_t n_got, const int32_t *want, int32_t n_want) {
    assert_int_equal(n_got, n_want);
    for (int32_t i = 0; i < n_want; i++)
        if (got[i] != want[i]) fail_msg("token %d is %d, reference %d", i, got[i], want[i]);
}

static void test_greedy_and_eos(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, BLOCK, 64, 32, 8);
    int32_t prompt[20], ref[MAX_OUT];
    random_prompt(prompt, 20, 7);
    int32_t n_ref = fake_reference_greedy(prompt, 20, 24, -1, f->window, VOCAB, ref);
    assert_int_equal(n_ref, 24);

    gptoss_engine *e = start_engine(f, NULL, 0);
    gptoss_sampling_params p = greedy(24, true);
    collected c = {0};
    gptoss_generate_options go = {.on_token = collect, .user = &c};
    gptoss_generate_result r;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_generate(e, prompt, 20, &p, &go, &r, &err), GPTOSS_OK);
    expect_ids(c.ids, c.n, ref, n_ref);
    assert_int_equal(r.finish, GPTOSS_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 24);
    assert_int_equal(r.stop_token_id, -1);
    assert_true(r.seconds >= r.first_token_seconds && r.first_token_seconds > 0);
    gptoss_engine_free(e);

    /* An eos token, and one outside the vocabulary that set_eos leaves out: the request ends
     * at the first eos the reference produces, that token delivered. */
    int32_t eos[2] = {VOCAB + 100, ref[5]};
    int32_t k = 0;
    while (ref[k] != eos[1])
        k++; /* its first occurrence */
    e = start_engine(f, eos, 2);
    p = greedy(24, false);
    memset(&c, 0, sizeof c);
    assert_int_equal(gptoss_engine_generate(e, prompt, 20, &p, &go, &r, &err), GPTOSS_OK);
    expect_ids(c.ids, c.n, ref, k + 1);
    assert_int_equal(r.finish, GPTOSS_FINISH_STOP);
    assert_int_equal(r.stop_token_id, eos[1]);

    /* More than one choice is the event API's job. */
    p.n = 2;
    assert_int_equal(gptoss_engine_generate(e, prompt, 20, &p, &go, &r, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    gptoss_engine_free(e);
    fake_free(f);
}

static void test_set_eos(void **state) {
    (void)state;
    gptoss_engine_options o = gptoss_engine_options_default();
    o.vocab_size = VOCAB;
    o.eos_token_ids[0] = 9;
    o.n_eos_token_ids = 1;
    const int32_t none_inside[2] = {VOCAB, 200002};
    gptoss_engine_options_set_eos(&o, none_inside, 2); /* keeps what was there */
    assert_int_equal(o.n_eos_token_ids, 1);
    assert_int_equal(o.eos_token_ids[0], 9);
    const int32_t some[4] = {VOCAB + 1, 3, -1, 5};
    gptoss_engine_options_set_eos(&o, some, 4);
    assert_int_equal(o.n_eos_token_ids, 2);
    assert_int_equal(o.eos_token_ids[0], 3);
    assert_int_equal(o.eos_token_ids[1], 5);
}

static bool always(void *user) {
    (void)user;
    return true;
}

static void test_stopping(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, BLOCK, 64, 0, 0);
    f->delay_us = 1000; /* 200 tokens would take 0.2 s: a stop must cut that short */
    gptoss_engine *e = start_engine(f, NULL, 0);
    int32_t prompt[8];
    random_prompt(prompt, 8, 3);
    gptoss_sampling_params p = greedy(200, true);
    gptoss_error err = {0};
    gptoss_generate_result r;

    collected c = {.stop_after = 3};
    gptoss_generate_options go = {.on_token = collect, .user = &c};
    assert_int_equal(gptoss_engine_generate(e, prompt, 8, &p, &go, &r, &err), GPTOSS_OK);
    assert_int_equal(r.finish, GPTOSS_FINISH_CANCELLED);
    assert_int_equal(c.n, 3);
    assert_int_equal(r.n_generated, 3);

    /* A stop flag that is already up: no token reaches the callback. */
    memset(&c, 0, sizeof c);
    go.should_stop = always;
    assert_int_equal(gptoss_engine_generate(e, prompt, 8, &p, &go, &r, &err), GPTOSS_OK);
    assert_int_equal(r.finish, GPTOSS_FINISH_CANCELLED);
    assert_int_equal(c.n, 0);

    /* The stopped requests gave their pages back: a request needing all of them runs. */
    p = greedy(64 * BLOCK - 8 + 1, true);
    f->delay_us = 0;
    memset(&c, 0, sizeof c);
    go.should_stop = NULL;
    assert_int_equal(gptoss_engine_generate(e, prompt, 8, &p, &go, &r, &err), GPTOSS_OK);
    assert_int_equal(r.finish, GPTOSS_FINISH_LENGTH);
    assert_int_equal(c.n, 64 * BLOCK - 8 + 1);
    gptoss_engine_free(e);
    fake_free(f);
}

/* A chat's next turn: the last prompt and reply, then more. The shared pages come from the
 * prefix cache, and the reply still matches the reference. */
static void test_next_turn_reuses_kv(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, BLOCK, 64, 32, 8);
    gptoss_engine *e = start_engine(f, NULL, 0);
    int32_t turn[96], ref[MAX_OUT];
    random_prompt(turn, 30, 11);
    gptoss_sampling_params p = greedy(10, true);
    collected c = {0};
    gptoss_generate_options go = {.on_token = collect, .user = &c};
    gptoss_generate_result r;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_generate(e, turn, 30, &p, &go, &r, &err), GPTOSS_OK);
    assert_int_equal(r.n_cached_prompt, 0);
    memcpy(turn + 30, c.ids, 10 * sizeof(int32_t));
    random_prompt(turn + 40, 7, 12);
    int32_t n_ref = fake_reference_greedy(turn, 47, 10, -1, f->window, VOCAB, ref);
    memset(&c, 0, sizeof c);
    assert_int_equal(gptoss_engine_generate(e, turn, 47, &p, &go, &r, &err), GPTOSS_OK);
    expect_ids(c.ids, c.n, ref, n_ref);
    assert_true(r.n_cached_prompt >= 28); /* at least the first prompt's full pages */
    assert_int_equal(f->bad_reads, 0);
    gptoss_engine_free(e);
    fake_free(f);
}

static void test_backend_failure(void **state) {
    (void)state;
    fake_backend *f = fake_create(VOCAB, BLOCK, 64, 0, 0);
    atomic_store(&f->fail_at_call, 3);
    gptoss_engine *e = start_engine(f, NULL, 0);
    int32_t prompt[8];
    random_prompt(prompt, 8, 5);
    gptoss_sampling_params p = greedy(20, true);
    collected c = {0};
    gptoss_generate_options go = {.on_token = collect, .user = &c};
    gptoss_generate_result r;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_generate(e, prompt, 8, &p, &go, &r, &err), GPTOSS_ERR_BACKEND);
    assert_non_null(strstr(err.message, "injected device failure"));
    assert_int_equal(r.finish, GPTOSS_FINISH_ERROR);
    assert_int_equal(c.n, 2); /* the tokens of the two steps before it */
    gptoss_engine_free(e);
    fake_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_eos),  cmocka_unit_test(test_set_eos),
        cmocka_unit_test(test_stopping),        cmocka_unit_test(test_next_turn_reuses_kv),
        cmocka_unit_test(test_backend_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
