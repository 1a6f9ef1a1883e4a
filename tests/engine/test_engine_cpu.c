/*
 * test_engine_cpu.c - the engine on the real CPU backend with a tiny random checkpoint
 * (`gptoss make-model --config tests/support/micro_vocab.json`: the `tiny` preset's 4 layers,
 * sliding window 16, GQA and top-4 of 8 experts, with a 512-token vocabulary: these are
 * engine mechanics on random token ids, and the real vocabulary's 201k-wide logits rows would
 * be most of the run time).
 *
 * Reference: each prompt run alone straight through gptoss_backend_forward (one sequence,
 * whole prompt in one plan, pages 0..n in order, greedy argmax), with no engine code. The
 * engine must reproduce those tokens exactly when requests are batched with 30 others,
 * chunked, served from the prefix cache (also with the hash cut to 2 bits so every lookup
 * collides), and preempted for lack of KV; cancellation must give every page back.
 *
 * Batch invariance, sampled: a seeded request at temperature 1 with 20 top logprobs gets
 * bitwise the same tokens, logprobs and alternatives alone, among 6 and among 255 other
 * requests, with its prompt prefilled in one plan or in chunks of 5, 13 and 64 tokens, with
 * its prefix served from the prefix cache or computed afresh, and on a second run. The
 * reference is the same request alone in a fresh engine: the property under test is that
 * nothing around a request changes a bit of what it gets.
 */
#include "test_support.h"

#include "gptoss_engine.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 16
#define N_NEW 5
#define MAX_PROMPT 80

static char *model_dir;
static gptoss_model *model;
static const gptoss_config *config;

typedef struct case_ {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t want[N_NEW]; /* reference greedy tokens */
} case_;

static int setup(void **state) {
    (void)state;
    model_dir = ts_mkdtemp();
    char *out = NULL;
    int rc = ts_run(&out, "'%s' make-model --config '%s/tests/support/micro_vocab.json' -o '%s'",
                    ts_env("GPTOSS_BIN"), ts_env("GPTOSS_SOURCE_DIR"), model_dir);
    if (rc != 0) {
        fprintf(stderr, "make-model failed: %s\n", out ? out : "");
        free(out);
        return -1;
    }
    free(out);
    gptoss_error err = {0};
    if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) {
        fprintf(stderr, "model load: %s\n", err.message);
        return -1;
    }
    config = gptoss_model_config(model);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_model_free(model);
    ts_rmtree(model_dir);
    free(model_dir);
    return 0;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy tokens for one prompt without the engine. */
static void reference(case_ *c) {
    gptoss_backend_options bo = gptoss_backend_options_default();
    bo.kv_block_size = BLOCK;
    bo.n_kv_blocks = (MAX_PROMPT + N_NEW) / BLOCK + 2;
    gptoss_backend *b;
    gptoss_error err = {0};
    if (gptoss_backend_create(model, &bo, &b, &err) != GPTOSS_OK)
        fail_msg("backend: %s", err.message);
    int32_t table[16];
    for (int i = 0; i < 16; i++)
        table[i] = i;
    float *logits = malloc((size_t)config->vocab_size * sizeof(float));
    int32_t tokens[MAX_PROMPT + N_NEW], positions[MAX_PROMPT + N_NEW];
    memcpy(tokens, c->prompt, (size_t)c->n_prompt * sizeof(int32_t));
    int32_t n_cached = 0, n = c->n_prompt;
    for (int k = 0; k < N_NEW; k++) {
        int32_t n_new = n - n_cached;
        for (int32_t i = 0; i < n_new; i++)
            positions[i] = n_cached + i;
        int32_t start[2] = {0, n_new}, cached[1] = {n_cached}, last[1] = {n_new - 1};
        gptoss_batch_plan plan = {n_new,  tokens + n_cached, positions, 1,    start,
                                  cached, bo.n_kv_blocks,    table,     NULL, 1,
                                  last};
        if (gptoss_backend_forward(b, &plan, logits, &err) != GPTOSS_OK)
            fail_msg("forward: %s", err.message);
        c->want[k] = argmax(logits, config->vocab_size);
        tokens[n] = c->want[k];
        n_cached = n;
        n++;
    }
    free(logits);
    gptoss_backend_free(b);
}

typedef struct run_options {
    int32_t n_kv_blocks;
    int32_t budget;
    bool prefix_cache;
    int32_t hash_bits;
    bool one_at_a_time;
    bool no_admit_headroom; /* admit into the last free pages (preemption follows) */
} run_options;

/* Runs the cases through an engine; fails on any token that differs from the reference. */
static gptoss_engine_stats run(case_ *cases, int n, run_options ro) {
    gptoss_backend_options bo = gptoss_backend_options_default();
    bo.kv_block_size = BLOCK;
    bo.n_kv_blocks = ro.n_kv_blocks;
    bo.n_sliding_kv_blocks = ro.n_kv_blocks;
    gptoss_backend *b;
    gptoss_error err = {0};
    if (gptoss_backend_create(model, &bo, &b, &err) != GPTOSS_OK)
        fail_msg("backend: %s", err.message);
    gptoss_engine_options eo = gptoss_engine_options_default();
    gptoss_engine_options_for_backend(&eo, config, b, &bo);
    eo.max_num_batched_tokens = ro.budget;
    if (ro.no_admit_headroom) eo.admit_headroom = 0;
    eo.max_num_seqs = 32;
    eo.enable_prefix_cache = ro.prefix_cache;
    eo.testing.prefix_hash_bits = ro.hash_bits;
    gptoss_engine *e;
    if (gptoss_engine_create(&eo, &e, &err) != GPTOSS_OK) fail_msg("engine: %s", err.message);
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.temperature = 0.0f;
    p.max_tokens = N_NEW;
    p.ignore_eos = true;
    gptoss_request **req = calloc((size_t)n, sizeof *req);
    if (!ro.one_at_a_time)
        for (int i = 0; i < n; i++)
            if (gptoss_engine_submit(e, cases[i].prompt, cases[i].n_prompt, &p, NULL, &req[i],
                                     &err) != GPTOSS_OK)
                fail_msg("submit: %s", err.message);
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    for (int i = 0; i < n; i++) {
        if (ro.one_at_a_time && gptoss_engine_submit(e, cases[i].prompt, cases[i].n_prompt, &p,
                                                     NULL, &req[i], &err) != GPTOSS_OK)
            fail_msg("submit: %s", err.message);
        gptoss_engine_event ev;
        int k = 0, rc;
        while ((rc = gptoss_request_next_event(req[i], &ev, 120000)) == 1) {
            assert_true(k < N_NEW);
            if (ev.token_id != cases[i].want[k])
                fail_msg("case %d (%d prompt tokens): token %d is %d, reference %d", i,
                         cases[i].n_prompt, k, ev.token_id, cases[i].want[k]);
            k++;
        }
        assert_int_equal(rc, -1);
        assert_int_equal(k, N_NEW);
        gptoss_request_release(req[i]);
    }
    gptoss_engine_stats s;
    for (int t = 0; t < 1000; t++) {
        gptoss_engine_get_stats(e, &s);
        if (s.kv_blocks_used == 0 && s.n_running == 0) break;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(s.sliding_blocks_used, 0);
    free(req);
    gptoss_engine_free(e);
    gptoss_backend_free(b);
    return s;
}

/* Under the sanitizers these cases run about 6x slower: fewer requests keep the suite within
 * minutes (the full counts run in the normal build). */
static bool sanitized(void) {
    const char *v = getenv("GPTOSS_SANITIZE");
    return v && strcmp(v, "1") == 0;
}

static uint64_t lcg_state = 2024;
static int32_t next_token(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((lcg_state >> 33) % (uint64_t)config->vocab_size);
}

/* 31 prompts of different lengths, alone and batched (budget 48: chunked prefill). */
static void test_batched_equals_alone(void **state) {
    (void)state;
    const int N = sanitized() ? 8 : 31;
    case_ *cases = calloc((size_t)N, sizeof *cases);
    for (int i = 0; i < N; i++) {
        cases[i].n_prompt = 1 + (i * 37) % 70;
        for (int32_t k = 0; k < cases[i].n_prompt; k++)
            cases[i].prompt[k] = next_token();
        reference(&cases[i]);
    }
    run(cases, 1, (run_options){64, 48, true, 0, true, false});
    gptoss_engine_stats s = run(cases, N, (run_options){256, 48, true, 0, false, false});
    assert_int_equal(s.ttft.count, N);
    free(cases);
}

/* Shared and unshared prefixes: cache off, on, and on with 2-bit hashes. */
static void test_prefix_cache_variants(void **state) {
    (void)state;
    const int N = sanitized() ? 6 : 12;
    case_ *cases = calloc((size_t)N, sizeof *cases);
    int32_t shared[2][MAX_PROMPT];
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < MAX_PROMPT; k++)
            shared[p][k] = next_token();
    for (int i = 0; i < N; i++) {
        int32_t len = 34 + (i * 13) % 40;
        cases[i].n_prompt = len;
        if (i % 4 == 3) {
            for (int32_t k = 0; k < len; k++)
                cases[i].prompt[k] = next_token();
        } else {
            memcpy(cases[i].prompt, shared[i % 2], (size_t)len * sizeof(int32_t));
            cases[i].prompt[len - 1] = next_token(); /* differ in the last token */
            if (i % 4 == 2)                          /* same tokens after a different first block */
                for (int k = 0; k < BLOCK; k++)
                    cases[i].prompt[k] = next_token();
        }
        reference(&cases[i]);
    }
    gptoss_engine_stats off = run(cases, N, (run_options){256, 256, false, 0, true, false});
    gptoss_engine_stats on = run(cases, N, (run_options){256, 256, true, 0, true, false});
    gptoss_engine_stats collide = run(cases, N, (run_options){256, 256, true, 2, true, false});
    assert_int_equal(off.prefix_cache_hits, 0);
    assert_true(on.prefix_cache_hits > 0);
    assert_int_equal(collide.prefix_cache_hits, on.prefix_cache_hits);
    /* all of them at once too */
    if (!sanitized()) run(cases, N, (run_options){256, 64, true, 2, false, false});
    free(cases);
}

/* KV for barely two sequences, eight requests: preemption, same tokens. Admission without
 * headroom, so that sequences start in the last free pages and are preempted as they grow
 * (with it, these short requests never outgrow the pool). */
static void test_preemption(void **state) {
    (void)state;
    const int N = sanitized() ? 5 : 8;
    case_ *cases = calloc((size_t)N, sizeof *cases);
    for (int i = 0; i < N; i++) {
        cases[i].n_prompt = 40 + i * 3;
        for (int32_t k = 0; k < cases[i].n_prompt; k++)
            cases[i].prompt[k] = next_token();
        reference(&cases[i]);
    }
    for (int cache = sanitized() ? 1 : 0; cache < 2; cache++) {
        gptoss_engine_stats s = run(cases, N, (run_options){8, 64, cache, 0, false, true});
        assert_true(s.preemptions > 0);
    }
    free(cases);
}

/* ---- batch invariance of sampled requests ------------------------------------------------- */

#define INV_NEW 6
#define INV_TOP 20

typedef struct trace_ {
    int32_t token[INV_NEW];
    float logprob[INV_NEW];
    int32_t top_id[INV_NEW][INV_TOP];
    float top_lp[INV_NEW][INV_TOP];
    int32_t n;
} trace_;

static void inv_params(gptoss_sampling_params *p, uint64_t seed) {
    p->temperature = 1.0f;
    p->max_tokens = INV_NEW;
    p->ignore_eos = true;
    p->has_seed = true;
    p->seed = seed;
    p->logprobs = true;
    p->top_logprobs = INV_TOP;
}

/* Reads a request's events to its end; records its tokens into t (NULL: discards them). */
static void inv_collect(gptoss_request *r, trace_ *t) {
    gptoss_engine_event ev;
    int rc;
    while ((rc = gptoss_request_next_event(r, &ev, 120000)) == 1) {
        if (!t || ev.token_id < 0) continue;
        assert_true(t->n < INV_NEW);
        assert_int_equal(ev.n_top_logprobs, INV_TOP);
        t->token[t->n] = ev.token_id;
        t->logprob[t->n] = ev.logprob;
        for (int k = 0; k < INV_TOP; k++) {
            t->top_id[t->n][k] = ev.top_logprobs[k].token_id;
            t->top_lp[t->n][k] = ev.top_logprobs[k].logprob;
        }
        t->n++;
    }
    assert_int_equal(rc, -1);
}

typedef struct inv_run {
    int32_t budget;    /* max_num_batched_tokens: prefill chunk size */
    bool prefix_cache; /* on: each prompt is sent twice, the second served from the cache */
} inv_run;

#define WATCH_SEED 7777

/* Runs prompts[0..n) at once (seed 1000 + i; WATCH_SEED for request `watch`) and records
 * request `watch` (and, with the prefix cache, the same request submitted again alone once
 * everything finished, its prefix then served from the cache). */
static void inv_engine_run(int32_t (*prompts)[MAX_PROMPT], const int32_t *lens, int n, int watch,
                           inv_run ro, trace_ *out, trace_ *out_cached) {
    gptoss_backend_options bo = gptoss_backend_options_default();
    bo.kv_block_size = BLOCK;
    bo.n_kv_blocks = n * ((MAX_PROMPT + INV_NEW) / BLOCK + 2) + 8;
    bo.n_sliding_kv_blocks = bo.n_kv_blocks;
    gptoss_backend *b;
    gptoss_error err = {0};
    if (gptoss_backend_create(model, &bo, &b, &err) != GPTOSS_OK)
        fail_msg("backend: %s", err.message);
    gptoss_engine_options eo = gptoss_engine_options_default();
    gptoss_engine_options_for_backend(&eo, config, b, &bo);
    eo.max_num_batched_tokens = ro.budget;
    eo.max_num_seqs = n < 256 ? 256 : n;
    eo.enable_prefix_cache = ro.prefix_cache;
    gptoss_engine *e;
    if (gptoss_engine_create(&eo, &e, &err) != GPTOSS_OK) fail_msg("engine: %s", err.message);
    gptoss_request **req = calloc((size_t)n, sizeof *req);
    for (int i = 0; i < n; i++) {
        gptoss_sampling_params p = gptoss_sampling_params_default();
        inv_params(&p, i == watch ? WATCH_SEED : 1000 + (uint64_t)i);
        if (gptoss_engine_submit(e, prompts[i], lens[i], &p, NULL, &req[i], &err) != GPTOSS_OK)
            fail_msg("submit: %s", err.message);
    }
    assert_int_equal(gptoss_engine_start(e, &err), GPTOSS_OK);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++) {
        if (i == watch)
            inv_collect(req[i], out);
        else
            inv_collect(req[i], NULL);
        gptoss_request_release(req[i]);
    }
    if (ro.prefix_cache) {
        /* the watched request again, alone, once its pages were published */
        gptoss_sampling_params p = gptoss_sampling_params_default();
        inv_params(&p, WATCH_SEED);
        gptoss_engine_stats before, after;
        gptoss_engine_get_stats(e, &before);
        gptoss_request *again;
        if (gptoss_engine_submit(e, prompts[watch], lens[watch], &p, NULL, &again, &err) !=
            GPTOSS_OK)
            fail_msg("submit: %s", err.message);
        trace_ scratch;
        trace_ *dst = out_cached ? out_cached : &scratch;
        memset(dst, 0, sizeof *dst);
        inv_collect(again, dst);
        gptoss_request_release(again);
        gptoss_engine_get_stats(e, &after);
        assert_true(after.prefix_cache_hits > before.prefix_cache_hits);
    }
    free(req);
    gptoss_engine_free(e);
    gptoss_backend_free(b);
}

/* Bitwise: tokens, logprobs (as bits, so -0.0 and NaN payloads count) and alternatives. */
static void assert_same_trace(const trace_ *want, const trace_ *got, const char *what) {
    if (got->n != want->n) fail_msg("%s: %d tokens, alone %d", what, got->n, want->n);
    for (int k = 0; k < want->n; k++) {
        if (got->token[k] != want->token[k])
            fail_msg("%s: token %d is %d, alone %d", what, k, got->token[k], want->token[k]);
        if (memcmp(&got->logprob[k], &want->logprob[k], sizeof(float)) != 0)
            fail_msg("%s: token %d logprob %.9g, alone %.9g", what, k, got->logprob[k],
                     want->logprob[k]);
        if (memcmp(got->top_id[k], want->top_id[k], sizeof want->top_id[k]) != 0 ||
            memcmp(got->top_lp[k], want->top_lp[k], sizeof want->top_lp[k]) != 0)
            fail_msg("%s: token %d top logprobs differ from alone", what, k);
    }
}

static void test_sampled_batch_invariance(void **state) {
    (void)state;
    const int big = sanitized() ? 32 : 256;
    int32_t(*prompts)[MAX_PROMPT] = calloc((size_t)big, sizeof *prompts);
    int32_t *lens = calloc((size_t)big, sizeof *lens);
    for (int i = 0; i < big; i++) {
        lens[i] = 20 + (i * 29) % 60;
        for (int32_t k = 0; k < lens[i]; k++)
            prompts[i][k] = next_token();
    }
    const int watch = 3;
    trace_ alone, got, cached;
    inv_engine_run(prompts + watch, lens + watch, 1, 0, (inv_run){2048, false}, &alone, NULL);
    assert_int_equal(alone.n, INV_NEW);
    inv_engine_run(prompts + watch, lens + watch, 1, 0, (inv_run){2048, false}, &got, NULL);
    assert_same_trace(&alone, &got, "a second run");
    inv_engine_run(prompts, lens, 7, watch, (inv_run){2048, false}, &got, NULL);
    assert_same_trace(&alone, &got, "among 6 others");
    inv_engine_run(prompts, lens, big, watch, (inv_run){2048, false}, &got, NULL);
    assert_same_trace(&alone, &got, "among many others");
    const int32_t chunks[] = {5, 13, 64};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        inv_engine_run(prompts, lens, 7, watch, (inv_run){chunks[c], false}, &got, NULL);
        char what[64];
        snprintf(what, sizeof what, "prefill in chunks of %d", chunks[c]);
        assert_same_trace(&alone, &got, what);
    }
    inv_engine_run(prompts, lens, 7, watch, (inv_run){2048, true}, &got, &cached);
    assert_same_trace(&alone, &got, "with the prefix cache on");
    assert_same_trace(&alone, &cached, "served from the prefix cache");
    free(lens);
    free(prompts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_prefix_cache_variants),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_sampled_batch_invariance),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
