/*
 * test_router.c - the data-parallel router (src/server/router.h): longest-prefix affinity,
 * least-loaded fallback and its balance bound, cache salts kept apart, the LRU bound on the
 * table, the allowed-engine mask, and consistent counts under concurrent routes.
 */
#include "test_support.h"

#include "server/router.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define BS 4 /* tokens per block in these tests */

static server_router *make_router(int32_t n_engines, int32_t max_blocks) {
    server_router_options o = server_router_options_default();
    o.n_engines = n_engines;
    o.kv_block_size = BS;
    o.max_blocks = max_blocks;
    server_router *r = NULL;
    gptoss_error err = {0};
    assert_int_equal(server_router_create(&o, &r, &err), GPTOSS_OK);
    return r;
}

/* prompt[i] = base + i for n tokens: prompts of different bases share nothing. */
static void fill(int32_t *prompt, int32_t n, int32_t base) {
    for (int32_t i = 0; i < n; i++)
        prompt[i] = base + i;
}

static server_route route(server_router *r, const int32_t *p, int32_t n) {
    return server_router_route(r, p, n, NULL, 0, ~0ull);
}

static void test_options_validated(void **state) {
    (void)state;
    server_router_options o = server_router_options_default();
    server_router *r = NULL;
    gptoss_error err = {0};
    o.n_engines = 0;
    assert_int_equal(server_router_create(&o, &r, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    o.n_engines = SERVER_ROUTER_MAX_ENGINES + 1;
    assert_int_equal(server_router_create(&o, &r, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    o = server_router_options_default();
    o.balance_rel = 0.5;
    assert_int_equal(server_router_create(&o, &r, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_null(r);
}

/* Unrelated prompts take turns; a prompt that extends an earlier one (the next turn of a
 * conversation) follows it, even when its engine is busier (within the balance bound). */
static void test_prefix_affinity(void **state) {
    (void)state;
    server_router *r = make_router(2, 1024);
    int32_t a[40], b[40];
    fill(a, 40, 1000);
    fill(b, 40, 5000);
    server_route ra = route(r, a, 20); /* conversation A, turn 1 */
    server_route rb = route(r, b, 20); /* conversation B, turn 1 */
    assert_int_equal(ra.engine, 0);
    assert_int_equal(rb.engine, 1);
    assert_false(ra.by_prefix);
    assert_int_equal(ra.match_blocks, 0);
    /* B finished; A still runs on engine 0, so engine 1 is the least loaded. */
    server_router_done(r, 1);
    server_route ra2 = route(r, a, 40); /* A, turn 2: turn 1 plus more */
    assert_int_equal(ra2.engine, 0);
    assert_true(ra2.by_prefix);
    assert_int_equal(ra2.match_blocks, 5); /* 20 tokens = 5 full blocks of turn 1 */
    assert_int_equal(ra2.load, 1);
    /* B's next turn goes back to engine 1, and finds its 5 blocks there. */
    server_route rb2 = route(r, b, 33);
    assert_int_equal(rb2.engine, 1);
    assert_int_equal(rb2.match_blocks, 5);
    /* A partial last block is never matched: a 3-token prompt has no full block. */
    server_route tiny = route(r, a, 3);
    assert_int_equal(tiny.match_blocks, 0);
    assert_false(tiny.by_prefix);
    server_router_free(r);
}

/* The longest match wins over a shorter one, and prompts that share only a common head
 * (a system prompt every engine has seen) go by load. */
static void test_longest_match(void **state) {
    (void)state;
    server_router *r = make_router(3, 1024);
    int32_t p[64];
    fill(p, 64, 1);
    assert_int_equal(route(r, p, 8).engine, 0);  /* blocks 0-1 on engine 0 */
    assert_int_equal(route(r, p, 24).engine, 0); /* follows: blocks 0-5 on engine 0 */
    server_router_done(r, 0);
    server_router_done(r, 0);
    /* Engine 1 and 2 see the 2-block head in other requests (forced by load). */
    int32_t q[64];
    memcpy(q, p, 8 * sizeof *q);
    fill(q + 8, 56, 90000);
    server_route x = server_router_route(r, q, 16, NULL, 0, 1ull << 1);
    assert_int_equal(x.engine, 1);
    assert_int_equal(x.match_blocks, 0); /* engine 1 had nothing of it */
    server_router_done(r, 1);
    /* Now p's 6 blocks: engine 0 has 6, engine 1 has 2 (the head), engine 2 none. */
    server_route y = route(r, p, 28);
    assert_int_equal(y.engine, 0);
    assert_int_equal(y.match_blocks, 6);
    server_router_done(r, 0);
    /* q's 4 blocks: engine 1 has all 4, engine 0 only the 2-block head. */
    server_route z = route(r, q, 16);
    assert_int_equal(z.engine, 1);
    assert_int_equal(z.match_blocks, 4);
    server_router_free(r);
}

/* A prefix engine far busier than the least loaded one loses the request: with the default
 * bound (8 more in flight, or 1.5x), the 9th extra request goes elsewhere. */
static void test_least_loaded_fallback(void **state) {
    (void)state;
    server_router *r = make_router(2, 1024);
    int32_t p[16];
    fill(p, 16, 7);
    assert_int_equal(route(r, p, 16).engine, 0);
    /* The same prompt again and again: it sticks to engine 0 while 0 has at most 8 more in
     * flight than engine 1 (which has none). */
    for (int i = 1; i <= 8; i++) {
        server_route x = route(r, p, 16);
        assert_int_equal(x.engine, 0);
        assert_true(x.by_prefix);
        assert_int_equal(x.load, i);
    }
    server_route over = route(r, p, 16); /* engine 0 has 9 in flight, engine 1 none */
    assert_int_equal(over.engine, 1);
    assert_false(over.by_prefix);
    assert_int_equal(server_router_in_flight(r, 0), 9);
    assert_int_equal(server_router_in_flight(r, 1), 1);
    /* Now both have the prompt: it goes by load (engine 1). */
    server_route both = route(r, p, 16);
    assert_int_equal(both.engine, 1);
    assert_int_equal(both.match_blocks, 4);
    assert_int_equal(server_router_routed_total(r, 0), 9);
    assert_int_equal(server_router_routed_total(r, 1), 2);
    server_router_free(r);
}

/* Without any prefix, requests go to the engine with the fewest in flight, and done()
 * frees capacity. */
static void test_least_loaded(void **state) {
    (void)state;
    server_router *r = make_router(4, 1024);
    int32_t p[8];
    int counts[4] = {0};
    for (int i = 0; i < 40; i++) {
        fill(p, 8, 100 * (i + 1));
        server_route x = route(r, p, 8);
        counts[x.engine]++;
    }
    for (int e = 0; e < 4; e++)
        assert_int_equal(counts[e], 10);
    for (int i = 0; i < 10; i++)
        server_router_done(r, 2);
    fill(p, 8, 77777);
    assert_int_equal(route(r, p, 8).engine, 2);
    server_router_done(r, -1); /* out of range: ignored */
    server_router_done(r, 4);
    server_router_free(r);
}

/* The same tokens under different salts never match each other. */
static void test_salts_separate(void **state) {
    (void)state;
    server_router *r = make_router(2, 1024);
    int32_t p[16];
    fill(p, 16, 3);
    const uint8_t alice[] = "alice", bob[] = "bob";
    server_route a = server_router_route(r, p, 16, alice, 5, ~0ull);
    assert_int_equal(a.engine, 0);
    server_router_done(r, 0);
    server_route b = server_router_route(r, p, 16, bob, 3, ~0ull);
    assert_int_equal(b.match_blocks, 0);
    assert_false(b.by_prefix);
    assert_int_equal(b.engine, 1); /* turns, not alice's engine */
    server_router_done(r, 1);
    server_route n = server_router_route(r, p, 16, NULL, 0, ~0ull); /* no salt: a third space */
    assert_int_equal(n.match_blocks, 0);
    server_router_done(r, n.engine);
    server_route a2 = server_router_route(r, p, 16, alice, 5, ~0ull);
    assert_int_equal(a2.engine, 0);
    assert_int_equal(a2.match_blocks, 4);
    /* ... and the same salt bytes of a different length are another salt. */
    server_route a3 = server_router_route(r, p, 16, alice, 4, ~0ull);
    assert_int_equal(a3.match_blocks, 0);
    server_router_free(r);
}

/* The table never holds more than max_blocks; the least recently routed prompts go first,
 * and a prompt's head outlives its tail. */
static void test_lru_bound(void **state) {
    (void)state;
    server_router *r = make_router(2, 8);
    int32_t a[16], b[16], c[16];
    fill(a, 16, 10000);
    fill(b, 16, 20000);
    fill(c, 16, 30000);
    route(r, a, 16); /* 4 blocks */
    route(r, b, 16); /* 8 blocks: full */
    assert_int_equal(server_router_table_size(r), 8);
    route(r, c, 16); /* evicts a's 4 blocks */
    assert_int_equal(server_router_table_size(r), 8);
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 2; i++)
            server_router_done(r, e);
    server_route a2 = route(r, a, 16);
    assert_int_equal(a2.match_blocks, 0); /* forgotten */
    /* a's 4 blocks took the place of b's (the least recent): c still matches fully. */
    server_route c2 = route(r, c, 16);
    assert_int_equal(c2.match_blocks, 4);
    /* A prompt longer than the table keeps its first max_blocks blocks. */
    server_router *small = make_router(2, 3);
    int32_t long_prompt[40];
    fill(long_prompt, 40, 1);
    route(small, long_prompt, 40);
    assert_int_equal(server_router_table_size(small), 3);
    server_router_done(small, 0);
    server_route l2 = route(small, long_prompt, 40);
    assert_int_equal(l2.match_blocks, 3);
    assert_int_equal(l2.engine, 0);
    /* Refreshing a prompt keeps its head: after d fills the rest, the head of e survives. */
    server_router *h = make_router(1, 4);
    int32_t d[16], e[16];
    fill(d, 16, 500);
    fill(e, 16, 900);
    route(h, e, 8);  /* e's 2 blocks */
    route(h, d, 8);  /* d's 2 blocks: full */
    route(h, e, 4);  /* e's first block becomes the most recent */
    route(h, d, 12); /* d's third block evicts the least recent: e's second block */
    server_route e2 = route(h, e, 8);
    assert_int_equal(e2.match_blocks, 1);
    server_router_free(h);
    server_router_free(small);
    server_router_free(r);
}

/* Engines outside the allowed mask are never chosen, even with the best prefix; none
 * allowed -> -1 and no count changes. */
static void test_allowed_mask(void **state) {
    (void)state;
    server_router *r = make_router(3, 1024);
    int32_t p[16];
    fill(p, 16, 42);
    assert_int_equal(route(r, p, 16).engine, 0);
    server_route x = server_router_route(r, p, 16, NULL, 0, 0x6); /* engines 1 and 2 */
    assert_true(x.engine == 1 || x.engine == 2);
    assert_int_equal(x.match_blocks, 0);
    server_route none = server_router_route(r, p, 16, NULL, 0, 0);
    assert_int_equal(none.engine, -1);
    server_route outside = server_router_route(r, p, 16, NULL, 0, 1ull << 5); /* no engine 5 */
    assert_int_equal(outside.engine, -1);
    assert_int_equal(server_router_in_flight(r, 0) + server_router_in_flight(r, 1) +
                         server_router_in_flight(r, 2),
                     2);
    server_router_free(r);
}

/* Concurrent routes and dones from several threads: every request is counted once, the
 * counts return to zero, and the table stays within its bound. */
typedef struct worker_arg {
    server_router *router;
    int id;
    int64_t routed[4];
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    int32_t prompt[64];
    for (int i = 0; i < 2000; i++) {
        /* conversations 0..15 shared by all threads, growing turns */
        int conv = (a->id * 7 + i) % 16;
        fill(prompt, 64, conv * 1000);
        int32_t n = 4 + (i % 15) * 4;
        server_route x = route(a->router, prompt, n);
        if (x.engine < 0 || x.engine >= 4) return (void *)1;
        a->routed[x.engine]++;
        server_router_done(a->router, x.engine);
    }
    return NULL;
}

static void test_thread_safety(void **state) {
    (void)state;
    server_router *r = make_router(4, 64);
    enum { N = 4 };
    pthread_t t[N];
    worker_arg args[N];
    memset(args, 0, sizeof args);
    for (int i = 0; i < N; i++) {
        args[i].router = r, args[i].id = i;
        assert_int_equal(pthread_create(&t[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        void *ret = NULL;
        pthread_join(t[i], &ret);
        assert_null(ret);
    }
    for (int e = 0; e < 4; e++) {
        int64_t sum = 0;
        for (int i = 0; i < N; i++)
            sum += args[i].routed[e];
        assert_int_equal(server_router_routed_total(r, e), (uint64_t)sum);
        assert_int_equal(server_router_in_flight(r, e), 0);
    }
    assert_true(server_router_table_size(r) <= 64);
    server_router_free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_validated), cmocka_unit_test(test_prefix_affinity),
        cmocka_unit_test(test_longest_match),     cmocka_unit_test(test_least_loaded_fallback),
        cmocka_unit_test(test_least_loaded),      cmocka_unit_test(test_salts_separate),
        cmocka_unit_test(test_lru_bound),         cmocka_unit_test(test_allowed_mask),
        cmocka_unit_test(test_thread_safety),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
