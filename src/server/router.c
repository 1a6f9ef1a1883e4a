/*
 * router.c - engine choice for a data-parallel server: prefix table + in-flight counts
 * (see router.h for the rule).
 *
 * The table is a hash map from a block's chain hash (the hash of the salt and every token up
 * to the end of that block) to the set of engines it was routed to, threaded on one LRU list.
 * Entries live in one array of max_blocks slots; buckets chain through slot indices, so the
 * table never allocates after creation.
 */
#include "server/router.h"

#include "util/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct router_entry {
    uint64_t key;     /* chain hash of the block */
    uint64_t engines; /* bit e: the block was routed to engine e */
    int32_t next;     /* next slot in the bucket, -1 = end */
    int32_t lru_prev; /* towards the most recent, -1 = head */
    int32_t lru_next; /* towards the least recent, -1 = tail */
} router_entry;

struct server_router {
    server_router_options options;
    pthread_mutex_t lock;
    router_entry *entries; /* [max_blocks] */
    int32_t n_used;        /* slots handed out so far */
    int32_t *buckets;      /* [n_buckets] first slot, -1 = empty */
    uint64_t bucket_mask;  /* n_buckets - 1 (a power of two) */
    int32_t lru_head, lru_tail;
    int64_t in_flight[SERVER_ROUTER_MAX_ENGINES];
    uint64_t routed[SERVER_ROUTER_MAX_ENGINES];
    int32_t last_engine; /* the engine picked last, for taking turns on ties */
};

server_router_options server_router_options_default(void) {
    return (server_router_options){.n_engines = 1,
                                   .kv_block_size = 16,
                                   .max_blocks = 65536,
                                   .min_match_blocks = 1,
                                   .balance_abs = 8,
                                   .balance_rel = 1.5};
}

gptoss_status server_router_create(const server_router_options *o, server_router **out,
                                   gptoss_error *error) {
    *out = NULL;
    if (o->n_engines < 1 || o->n_engines > SERVER_ROUTER_MAX_ENGINES)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "router: %d engines (1..%d supported)", o->n_engines,
                                SERVER_ROUTER_MAX_ENGINES);
    if (o->kv_block_size < 1 || o->max_blocks < 1 || o->min_match_blocks < 1 ||
        o->balance_abs < 0 || !(o->balance_rel >= 1.0))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "router: block size, table size and min match must be positive, "
                                "balance_abs >= 0 and balance_rel >= 1");
    server_router *r = calloc(1, sizeof *r);
    if (!r) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    r->options = *o;
    size_t n_buckets = 16;
    while (n_buckets < 2 * (size_t)o->max_blocks)
        n_buckets *= 2;
    r->entries = malloc((size_t)o->max_blocks * sizeof *r->entries);
    r->buckets = malloc(n_buckets * sizeof *r->buckets);
    if (!r->entries || !r->buckets) {
        server_router_free(r);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    memset(r->buckets, 0xff, n_buckets * sizeof *r->buckets);
    r->bucket_mask = n_buckets - 1;
    r->lru_head = r->lru_tail = -1;
    r->last_engine = o->n_engines - 1; /* the first route starts at engine 0 */
    pthread_mutex_init(&r->lock, NULL);
    *out = r;
    return GPTOSS_OK;
}

void server_router_free(server_router *r) {
    if (!r) return;
    if (r->entries && r->buckets) pthread_mutex_destroy(&r->lock);
    free(r->entries);
    free(r->buckets);
    free(r);
}

/* ---- hashing ------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t salt_hash(const uint8_t *salt, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then mixed */
    for (size_t i = 0; i < len; i++)
        h = (h ^ salt[i]) * 0x100000001b3ull;
    return mix64(h ^ len);
}

/* The chain hash after one more block. */
static uint64_t block_hash(uint64_t prev, const int32_t *tokens, int32_t n) {
    uint64_t h = prev;
    for (int32_t i = 0; i < n; i++)
        h = mix64(h + 0x9e3779b97f4a7c15ull + (uint32_t)tokens[i]);
    return h;
}

/* ---- the table ----------------------------------------------------------------------------- */

static int32_t table_find(const server_router *r, uint64_t key) {
    for (int32_t s = r->buckets[key & r->bucket_mask]; s >= 0; s = r->entries[s].next)
        if (r->entries[s].key == key) return s;
    return -1;
}

static void lru_unlink(server_router *r, int32_t s) {
    router_entry *e = &r->entries[s];
    if (e->lru_prev >= 0)
        r->entries[e->lru_prev].lru_next = e->lru_next;
    else
        r->lru_head = e->lru_next;
    if (e->lru_next >= 0)
        r->entries[e->lru_next].lru_prev = e->lru_prev;
    else
        r->lru_tail = e->lru_prev;
}

static void lru_push_front(server_router *r, int32_t s) {
    router_entry *e = &r->entries[s];
    e->lru_prev = -1;
    e->lru_next = r->lru_head;
    if (r->lru_head >= 0) r->entries[r->lru_head].lru_prev = s;
    r->lru_head = s;
    if (r->lru_tail < 0) r->lru_tail = s;
}

static void bucket_unlink(server_router *r, int32_t s) {
    int32_t *link = &r->buckets[r->entries[s].key & r->bucket_mask];
    while (*link != s)
        link = &r->entries[*link].next;
    *link = r->entries[s].next;
}

/* Marks the block `key` as routed to engine `e` and makes it the most recent. */
static void table_record(server_router *r, uint64_t key, int32_t engine) {
    int32_t s = table_find(r, key);
    if (s >= 0) {
        r->entries[s].engines |= 1ull << engine;
        lru_unlink(r, s);
        lru_push_front(r, s);
        return;
    }
    if (r->n_used < r->options.max_blocks) {
        s = r->n_used++;
    } else { /* forget the least recently routed block */
        s = r->lru_tail;
        lru_unlink(r, s);
        bucket_unlink(r, s);
    }
    router_entry *e = &r->entries[s];
    e->key = key;
    e->engines = 1ull << engine;
    uint64_t b = key & r->bucket_mask;
    e->next = r->buckets[b];
    r->buckets[b] = s;
    lru_push_front(r, s);
}

/* ---- routing ------------------------------------------------------------------------------- */

server_route server_router_route(server_router *r, const int32_t *prompt, int32_t n_prompt,
                                 const uint8_t *salt, size_t salt_len, uint64_t allowed_mask) {
    const server_router_options *o = &r->options;
    uint64_t all = o->n_engines == 64 ? ~0ull : (1ull << o->n_engines) - 1;
    allowed_mask &= all;
    server_route route = {.engine = -1};
    if (!allowed_mask) return route;
    int32_t bs = o->kv_block_size;
    int32_t n_blocks = n_prompt > 0 ? n_prompt / bs : 0;
    if (n_blocks > o->max_blocks) n_blocks = o->max_blocks; /* never evict its own blocks */
    /* Hashes first, outside the lock. Out of memory: the prompt is routed by load alone and
     * not remembered. */
    uint64_t *hashes = n_blocks > 0 ? malloc((size_t)n_blocks * sizeof *hashes) : NULL;
    if (!hashes) n_blocks = 0;
    uint64_t h = salt_hash(salt, salt_len);
    for (int32_t i = 0; i < n_blocks; i++)
        hashes[i] = h = block_hash(h, prompt + (size_t)i * bs, bs);

    pthread_mutex_lock(&r->lock);
    /* 1. matches: match[e] = leading blocks found for engine e */
    int32_t match[SERVER_ROUTER_MAX_ENGINES] = {0};
    uint64_t alive = allowed_mask;
    for (int32_t i = 0; i < n_blocks && alive; i++) {
        int32_t s = table_find(r, hashes[i]);
        if (s < 0) break;
        alive &= r->entries[s].engines;
        for (int32_t e = 0; e < o->n_engines; e++)
            if (alive >> e & 1) match[e] = i + 1;
    }
    /* 2. least loaded, and 3. longest match; both scan from the engine after the last pick */
    int32_t least = -1, best = -1;
    for (int32_t k = 1; k <= o->n_engines; k++) {
        int32_t e = (r->last_engine + k) % o->n_engines;
        if (!(allowed_mask >> e & 1)) continue;
        if (least < 0 || r->in_flight[e] < r->in_flight[least]) least = e;
        if (best < 0 || match[e] > match[best] ||
            (match[e] == match[best] && r->in_flight[e] < r->in_flight[best]))
            best = e;
    }
    int64_t low = r->in_flight[least], load = r->in_flight[best];
    bool balanced = load <= low + o->balance_abs || (double)load <= (double)low * o->balance_rel;
    int32_t chosen = least;
    if (match[best] - match[least] >= o->min_match_blocks && balanced) chosen = best;
    route.engine = chosen;
    route.match_blocks = match[chosen];
    route.load = (int32_t)r->in_flight[chosen];
    route.by_prefix = chosen != least;
    r->in_flight[chosen]++;
    r->routed[chosen]++;
    r->last_engine = chosen;
    /* 4. record, deepest block first so the prompt's first blocks are the most recent (the
     * LRU then forgets the tails of prompts before their heads, which every match needs). */
    for (int32_t i = n_blocks - 1; i >= 0; i--)
        table_record(r, hashes[i], chosen);
    pthread_mutex_unlock(&r->lock);
    free(hashes);
    return route;
}

void server_router_done(server_router *r, int32_t engine) {
    if (!r || engine < 0 || engine >= r->options.n_engines) return;
    pthread_mutex_lock(&r->lock);
    if (r->in_flight[engine] > 0) r->in_flight[engine]--;
    pthread_mutex_unlock(&r->lock);
}

int64_t server_router_in_flight(server_router *r, int32_t engine) {
    if (engine < 0 || engine >= r->options.n_engines) return 0;
    pthread_mutex_lock(&r->lock);
    int64_t n = r->in_flight[engine];
    pthread_mutex_unlock(&r->lock);
    return n;
}

uint64_t server_router_routed_total(server_router *r, int32_t engine) {
    if (engine < 0 || engine >= r->options.n_engines) return 0;
    pthread_mutex_lock(&r->lock);
    uint64_t n = r->routed[engine];
    pthread_mutex_unlock(&r->lock);
    return n;
}

int32_t server_router_table_size(server_router *r) {
    pthread_mutex_lock(&r->lock);
    int32_t n = r->n_used;
    pthread_mutex_unlock(&r->lock);
    return n;
}
