/*
 * test_kv_cache.c - the KV block manager: reference counts, LRU eviction of idle cached
 * pages, sliding pages evicted apart from their entry, prefix-cache identity checks that
 * hold even when every digest collides (hash cut to 1 bit), and shared pages (one id space
 * for both pools).
 */
#include "test_support.h"

#include "engine/kv_cache.h"

#include <string.h>

#define BS 4

static const uint8_t salt_a[GPTOSS_SHA256_BYTES] = {1};
static const uint8_t salt_b[GPTOSS_SHA256_BYTES] = {2};

static gptoss_kv_manager *make(int32_t n, int32_t n_sliding, bool cache, int32_t bits) {
    gptoss_kv_manager_options o = {BS, n, n_sliding, cache, bits, false};
    gptoss_kv_manager *kv;
    gptoss_error err;
    assert_int_equal(gptoss_kv_manager_create(&o, &kv, &err), GPTOSS_OK);
    return kv;
}

static void digest_of(const uint8_t parent[32], const uint8_t salt[32], const int32_t *tokens,
                      uint8_t out[32]) {
    gptoss_kv_block_digest(parent, salt, tokens, BS, out);
}

static void test_ref_counts(void **state) {
    (void)state;
    gptoss_kv_manager *kv = make(3, 0, true, 0);
    int32_t a = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    int32_t b = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    int32_t c = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    assert_true(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), -1);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), 3);
    gptoss_kv_retain(kv, GPTOSS_KV_POOL_FULL, b);
    assert_int_equal(gptoss_kv_ref_count(kv, GPTOSS_KV_POOL_FULL, b), 2);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, b);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 0);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, b);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 1);
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), b);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, a);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, b);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, c);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), 0);
    gptoss_kv_manager_free(kv);
}

/* Idle cached pages are reused least recently released first; a hit revives a page. */
static void test_lru_eviction(void **state) {
    (void)state;
    gptoss_kv_manager *kv = make(3, 0, true, 0);
    uint8_t zero[32] = {0}, d[3][32];
    int32_t tokens[3][BS] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
    int32_t page[3];
    uint64_t uid[3];
    for (int i = 0; i < 3; i++) {
        page[i] = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
        digest_of(zero, salt_a, tokens[i], d[i]);
        uid[i] = gptoss_kv_register(kv, d[i], 0, salt_a, tokens[i], page[i], -1);
        assert_true(uid[i] > 0);
    }
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, page[1]);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, page[0]);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, page[2]);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), 0);
    assert_int_equal(gptoss_kv_idle_cached(kv, GPTOSS_KV_POOL_FULL), 3);
    /* A hit on page[1] takes it out of the LRU list. */
    gptoss_kv_hit hit;
    assert_true(gptoss_kv_lookup(kv, d[1], 0, salt_a, tokens[1], &hit));
    assert_int_equal(hit.full_block, page[1]);
    assert_int_equal(hit.uid, uid[1]);
    gptoss_kv_retain(kv, GPTOSS_KV_POOL_FULL, page[1]);
    /* Next allocations evict page[0] (released before page[2]), then page[2]. */
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), page[0]);
    assert_false(gptoss_kv_lookup(kv, d[0], 0, salt_a, tokens[0], &hit));
    assert_true(gptoss_kv_lookup(kv, d[2], 0, salt_a, tokens[2], &hit));
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), page[2]);
    assert_false(gptoss_kv_lookup(kv, d[2], 0, salt_a, tokens[2], &hit));
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), -1);
    assert_int_equal(gptoss_kv_n_entries(kv), 1);
    /* Registering the same block again keeps the existing entry. */
    assert_int_equal(gptoss_kv_register(kv, d[1], 0, salt_a, tokens[1], page[0], -1), uid[1]);
    gptoss_kv_manager_free(kv);
}

/* A sliding page can be evicted alone (the entry stays, without it); evicting the full page
 * drops the entry and frees its idle sliding page. */
static void test_sliding_pages(void **state) {
    (void)state;
    gptoss_kv_manager *kv = make(2, 1, true, 0);
    uint8_t zero[32] = {0}, d[32];
    int32_t tokens[BS] = {4, 3, 2, 1};
    int32_t full = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    int32_t sliding = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING);
    digest_of(zero, salt_a, tokens, d);
    assert_true(gptoss_kv_register(kv, d, 0, salt_a, tokens, full, sliding) > 0);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_SLIDING, sliding);
    assert_int_equal(gptoss_kv_idle_cached(kv, GPTOSS_KV_POOL_SLIDING), 1);
    gptoss_kv_hit hit;
    assert_true(gptoss_kv_lookup(kv, d, 0, salt_a, tokens, &hit));
    assert_int_equal(hit.sliding_block, sliding);
    int32_t other = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING); /* evicts it */
    assert_int_equal(other, sliding);
    assert_true(gptoss_kv_lookup(kv, d, 0, salt_a, tokens, &hit));
    assert_int_equal(hit.sliding_block, -1);
    assert_int_equal(hit.full_block, full);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_SLIDING, other);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_SLIDING), 1);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, full);
    gptoss_kv_clear_idle(kv);
    assert_false(gptoss_kv_lookup(kv, d, 0, salt_a, tokens, &hit));
    assert_int_equal(gptoss_kv_n_entries(kv), 0);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 2);

    /* Full-page eviction takes the entry's idle sliding page with it. */
    full = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    sliding = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING);
    assert_true(gptoss_kv_register(kv, d, 0, salt_a, tokens, full, sliding) > 0);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_SLIDING, sliding);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, full);
    int32_t x = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    int32_t y = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    assert_true(x >= 0 && y >= 0);
    assert_int_equal(gptoss_kv_n_entries(kv), 0);
    assert_int_equal(gptoss_kv_idle_cached(kv, GPTOSS_KV_POOL_SLIDING), 0);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_SLIDING), 1);
    gptoss_kv_manager_free(kv);
}

/* With 1 index bit every entry collides; lookups still find exactly the right entry and
 * refuse wrong tokens, wrong parents and wrong salts. */
static void test_forced_collisions(void **state) {
    (void)state;
    enum { N = 40 };
    gptoss_kv_manager *kv = make(N, 0, true, 1);
    uint8_t zero[32] = {0};
    int32_t tokens[N][BS];
    uint8_t d[N][32];
    uint64_t uid[N];
    int32_t page[N];
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < BS; k++)
            tokens[i][k] = (i % 10) * 10 + k; /* i and i+10 share tokens */
        page[i] = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
        /* entries 0..9 are first blocks; 10..39 children of entry i-10 */
        uint64_t parent = i < 10 ? 0 : uid[i - 10];
        digest_of(i < 10 ? zero : d[i - 10], salt_a, tokens[i], d[i]);
        uid[i] = gptoss_kv_register(kv, d[i], parent, salt_a, tokens[i], page[i], -1);
        assert_true(uid[i] > 0);
    }
    assert_int_equal(gptoss_kv_n_entries(kv), N);
    for (int i = 0; i < N; i++) {
        gptoss_kv_hit hit;
        uint64_t parent = i < 10 ? 0 : uid[i - 10];
        assert_true(gptoss_kv_lookup(kv, d[i], parent, salt_a, tokens[i], &hit));
        assert_int_equal(hit.uid, uid[i]);
        assert_int_equal(hit.full_block, page[i]);
        /* same tokens under another parent: a different prefix */
        uint64_t wrong_parent = i < 10 ? uid[(i + 1) % 10] : 0;
        assert_false(gptoss_kv_lookup(kv, d[i], wrong_parent, salt_a, tokens[i], &hit) &&
                     hit.uid == uid[i]);
        assert_false(gptoss_kv_lookup(kv, d[i], parent, salt_b, tokens[i], &hit));
        int32_t other[BS];
        memcpy(other, tokens[i], sizeof other);
        other[BS - 1] += 1000;
        assert_false(gptoss_kv_lookup(kv, d[i], parent, salt_a, other, &hit));
    }
    gptoss_kv_manager_free(kv);
}

static void test_disabled_cache(void **state) {
    (void)state;
    gptoss_kv_manager *kv = make(2, 0, false, 0);
    uint8_t zero[32] = {0}, d[32];
    int32_t tokens[BS] = {1, 1, 1, 1};
    int32_t p = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL);
    digest_of(zero, salt_a, tokens, d);
    assert_int_equal(gptoss_kv_register(kv, d, 0, salt_a, tokens, p, -1), 0);
    gptoss_kv_hit hit;
    assert_false(gptoss_kv_lookup(kv, d, 0, salt_a, tokens, &hit));
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, p);
    assert_int_equal(gptoss_kv_idle_cached(kv, GPTOSS_KV_POOL_FULL), 0);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 2);
    gptoss_kv_manager_free(kv);
}

static gptoss_kv_manager *make_shared(int32_t n, bool cache) {
    gptoss_kv_manager_options o = {BS, n, n, cache, 0, true};
    gptoss_kv_manager *kv;
    gptoss_error err;
    assert_int_equal(gptoss_kv_manager_create(&o, &kv, &err), GPTOSS_OK);
    assert_true(gptoss_kv_shared_pages(kv));
    return kv;
}

/* Shared pages: both pools draw from one id space; a page freed by one pool serves the other;
 * with nothing free, an allocation evicts its own pool's idle page first, then the other's. */
static void test_shared_pages(void **state) {
    (void)state;
    gptoss_kv_manager *kv = make_shared(4, true);
    assert_int_equal(gptoss_kv_total(kv, GPTOSS_KV_POOL_FULL), 4);
    assert_int_equal(gptoss_kv_total(kv, GPTOSS_KV_POOL_SLIDING), 4);
    int32_t f0 = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL),
            s0 = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING);
    int32_t f1 = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL),
            s1 = gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING);
    int32_t ids[4] = {f0, s0, f1, s1};
    for (int i = 0; i < 4; i++) {
        assert_in_range(ids[i], 0, 3);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(ids[i], ids[j]);
    }
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), -1);
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING), -1);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 0);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), 2);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_SLIDING), 2);
    /* a released sliding page goes to the full pool */
    gptoss_kv_release(kv, GPTOSS_KV_POOL_SLIDING, s1);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 1);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_SLIDING), 1);
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), s1);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), 3);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_SLIDING), 1);
    /* cache f0 + s0 as one entry, both idle */
    uint8_t zero[32] = {0}, d[32];
    int32_t tokens[BS] = {7, 7, 7, 7};
    digest_of(zero, salt_a, tokens, d);
    assert_true(gptoss_kv_register(kv, d, 0, salt_a, tokens, f0, s0) > 0);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_SLIDING, s0);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, f0);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_SLIDING), 2); /* both idle pages */
    /* full allocation, nothing free, no idle full page other than f0: evicts its own first */
    gptoss_kv_hit hit;
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_FULL), f0);
    /* the entry went with f0 and freed its idle sliding page: a sliding allocation gets it */
    assert_false(gptoss_kv_lookup(kv, d, 0, salt_a, tokens, &hit));
    assert_int_equal(gptoss_kv_idle_cached(kv, GPTOSS_KV_POOL_SLIDING), 0);
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING), s0);
    assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), 0);
    /* a sliding allocation with only a full page idle takes that page over */
    int32_t g = f1;
    digest_of(zero, salt_b, tokens, d);
    assert_true(gptoss_kv_register(kv, d, 0, salt_b, tokens, g, -1) > 0);
    gptoss_kv_release(kv, GPTOSS_KV_POOL_FULL, g);
    assert_int_equal(gptoss_kv_idle_cached(kv, GPTOSS_KV_POOL_FULL), 1);
    assert_int_equal(gptoss_kv_alloc(kv, GPTOSS_KV_POOL_SLIDING), g);
    assert_false(gptoss_kv_lookup(kv, d, 0, salt_b, tokens, &hit));
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_SLIDING), 2);
    assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), 2);
    gptoss_kv_manager_free(kv);

    /* random operations: an id is never held by both pools, and the counts add up */
    enum { N = 24, OPS = 20000 };
    kv = make_shared(N, true);
    int owner[N]; /* -1 free or unknown-idle, 0 full, 1 sliding: referenced pages only */
    int refs[N];
    for (int i = 0; i < N; i++)
        owner[i] = -1, refs[i] = 0;
    uint64_t x = 99;
    for (int op = 0; op < OPS; op++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int r = (int)(x >> 33), pool = r & 1;
        if ((r >> 1) % 3 != 0) {
            int32_t b = gptoss_kv_alloc(kv, (gptoss_kv_pool_id)pool);
            if (b < 0) {
                assert_int_equal(gptoss_kv_available(kv, (gptoss_kv_pool_id)pool), 0);
                continue;
            }
            assert_int_equal(refs[b], 0); /* never a page the other pool (or this one) holds */
            owner[b] = pool, refs[b] = 1;
            if (((r >> 4) & 3) ==
                0) { /* name it in the cache (as a full page, or sliding of a full one) */
                int32_t t4[BS] = {op, op >> 8, 1, 2};
                digest_of(zero, salt_a, t4, d);
                if (pool == 0) gptoss_kv_register(kv, d, 0, salt_a, t4, b, -1);
            }
        } else {
            int32_t b = (int32_t)((r >> 6) % N);
            if (refs[b] == 0) continue;
            gptoss_kv_release(kv, (gptoss_kv_pool_id)owner[b], b);
            refs[b] = 0, owner[b] = -1;
        }
        int held[2] = {0, 0};
        for (int i = 0; i < N; i++)
            if (refs[i]) held[owner[i]]++;
        assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_FULL), held[0]);
        assert_int_equal(gptoss_kv_used(kv, GPTOSS_KV_POOL_SLIDING), held[1]);
        assert_int_equal(gptoss_kv_available(kv, GPTOSS_KV_POOL_FULL), N - held[0] - held[1]);
    }
    gptoss_kv_manager_free(kv);
}

static void test_bad_options(void **state) {
    (void)state;
    gptoss_kv_manager *kv;
    gptoss_error err;
    gptoss_kv_manager_options o = {0, 8, 0, true, 0, false};
    assert_int_equal(gptoss_kv_manager_create(&o, &kv, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "block size"));
    o = (gptoss_kv_manager_options){16, 0, 0, true, 0, false};
    assert_int_equal(gptoss_kv_manager_create(&o, &kv, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    o = (gptoss_kv_manager_options){16, 8, 0, true, 65, false};
    assert_int_equal(gptoss_kv_manager_create(&o, &kv, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    o = (gptoss_kv_manager_options){16, 8, 4, true, 0, true}; /* shared pages: one id space */
    assert_int_equal(gptoss_kv_manager_create(&o, &kv, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "shared"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_counts),     cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_sliding_pages),  cmocka_unit_test(test_forced_collisions),
        cmocka_unit_test(test_disabled_cache), cmocka_unit_test(test_shared_pages),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
