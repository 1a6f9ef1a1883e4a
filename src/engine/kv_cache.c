/*
 * kv_cache.c - KV block pools with reference counts and the prefix cache (see kv_cache.h).
 *
 * Each pool keeps a stack of free pages and a doubly linked LRU list of idle cached pages
 * (reference count 0 but named by a prefix-cache entry), oldest at the head. Allocation
 * prefers free pages and only then evicts the LRU head, so cached prefixes live as long as
 * memory allows. Entries live in a fixed array (at most one per FULL page) chained into a
 * hash table indexed by the (possibly truncated) digest.
 */
#include "engine/kv_cache.h"

#include "util/error.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_pool {
    int32_t n_blocks;
    int32_t *ref_count;  /* [n_blocks] sequences referencing the page */
    int32_t *entry;      /* [n_blocks] cache entry naming the page, or -1 */
    int32_t *lru_prev;   /* [n_blocks] idle cached list links, -1 = end */
    int32_t *lru_next;   /* [n_blocks] */
    int32_t lru_head;    /* least recently released idle cached page, -1 = empty */
    int32_t lru_tail;    /* most recently released */
    int32_t n_idle;      /* pages on the LRU list */
    int32_t *free_stack; /* [n_blocks] free pages (shared pages: FULL's stack serves both) */
    int32_t n_free;
    int32_t n_owned; /* pages taken from the free list: referenced or idle cached */
} kv_pool;

typedef struct kv_entry {
    uint64_t uid;        /* unique, never reused; 0 = slot unused */
    uint64_t parent_uid; /* entry of the previous block, 0 for a first block */
    uint64_t index_key;  /* digest bits used for the hash table (truncated by hash_bits) */
    uint8_t salt[GPTOSS_SHA256_BYTES]; /* digest of the request's cache salt */
    int32_t full_block;                /* FULL page */
    int32_t sliding_block;             /* SLIDING page or -1 */
    int32_t chain_next;                /* next entry in the same bucket, -1 = end */
} kv_entry;

struct gptoss_kv_manager {
    int32_t block_size;
    bool has_sliding;
    bool shared; /* one id space for both pools */
    bool prefix_cache;
    uint64_t index_mask;   /* applied to the first 8 digest bytes */
    kv_pool pools[2];      /* FULL, SLIDING */
    kv_entry *entries;     /* [n_blocks of FULL] */
    int32_t *entry_tokens; /* [n_blocks, block_size] token ids of each entry */
    int32_t *free_entries; /* stack of unused entry slots */
    int32_t n_free_entries;
    int32_t n_live_entries;
    int32_t *buckets;   /* [n_buckets] head entry or -1 */
    uint64_t n_buckets; /* power of two */
    uint64_t next_uid;
};

static bool pool_init(kv_pool *pool, int32_t n_blocks, bool with_free_pages) {
    memset(pool, 0, sizeof *pool);
    pool->n_blocks = n_blocks;
    pool->lru_head = pool->lru_tail = -1;
    if (n_blocks == 0) return true;
    size_t n = (size_t)n_blocks;
    pool->ref_count = calloc(n, sizeof(int32_t));
    pool->entry = malloc(n * sizeof(int32_t));
    pool->lru_prev = malloc(n * sizeof(int32_t));
    pool->lru_next = malloc(n * sizeof(int32_t));
    pool->free_stack = malloc(n * sizeof(int32_t));
    if (!pool->ref_count || !pool->entry || !pool->lru_prev || !pool->lru_next || !pool->free_stack)
        return false;
    for (int32_t i = 0; i < n_blocks; i++) {
        pool->entry[i] = -1;
        pool->lru_prev[i] = pool->lru_next[i] = -1;
        /* Pop order 0, 1, 2, ...: the stack holds pages in reverse. */
        pool->free_stack[i] = n_blocks - 1 - i;
    }
    pool->n_free = with_free_pages ? n_blocks : 0;
    return true;
}

static void pool_destroy(kv_pool *pool) {
    free(pool->ref_count);
    free(pool->entry);
    free(pool->lru_prev);
    free(pool->lru_next);
    free(pool->free_stack);
}

static void lru_remove(kv_pool *pool, int32_t b) {
    int32_t prev = pool->lru_prev[b], next = pool->lru_next[b];
    if (prev >= 0)
        pool->lru_next[prev] = next;
    else
        pool->lru_head = next;
    if (next >= 0)
        pool->lru_prev[next] = prev;
    else
        pool->lru_tail = prev;
    pool->lru_prev[b] = pool->lru_next[b] = -1;
    pool->n_idle--;
}

static void lru_push_tail(kv_pool *pool, int32_t b) {
    pool->lru_prev[b] = pool->lru_tail;
    pool->lru_next[b] = -1;
    if (pool->lru_tail >= 0)
        pool->lru_next[pool->lru_tail] = b;
    else
        pool->lru_head = b;
    pool->lru_tail = b;
    pool->n_idle++;
}

gptoss_status gptoss_kv_manager_create(const gptoss_kv_manager_options *options,
                                       gptoss_kv_manager **out, gptoss_error *error) {
    *out = NULL;
    if (options->block_size < 1 || options->block_size > 4096)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "kv block size %d is out of range [1, 4096]", options->block_size);
    if (options->n_blocks < 1 || options->n_sliding_blocks < 0)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "kv pools need at least one block (got %d full, %d sliding)",
                                options->n_blocks, options->n_sliding_blocks);
    if (options->shared_pages && options->n_sliding_blocks != 0 &&
        options->n_sliding_blocks != options->n_blocks)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "shared kv pages need one id space (got %d full, %d sliding)",
                                options->n_blocks, options->n_sliding_blocks);
    if (options->hash_bits < 0 || options->hash_bits > 64)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "prefix hash bits %d is out of range [0, 64]", options->hash_bits);
    gptoss_kv_manager *kv = calloc(1, sizeof *kv);
    if (!kv) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (kv manager)");
    kv->block_size = options->block_size;
    kv->has_sliding = options->n_sliding_blocks > 0;
    kv->shared = options->shared_pages && kv->has_sliding;
    kv->prefix_cache = options->enable_prefix_cache;
    int bits = options->hash_bits == 0 ? 64 : options->hash_bits;
    kv->index_mask = bits == 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
    kv->next_uid = 1;
    size_t n = (size_t)options->n_blocks;
    kv->n_buckets = 1;
    while (kv->n_buckets < n)
        kv->n_buckets <<= 1;
    bool ok = pool_init(&kv->pools[GPTOSS_KV_POOL_FULL], options->n_blocks, true) &&
              pool_init(&kv->pools[GPTOSS_KV_POOL_SLIDING], options->n_sliding_blocks, !kv->shared);
    kv->entries = calloc(n, sizeof(kv_entry));
    kv->entry_tokens = malloc(n * (size_t)kv->block_size * sizeof(int32_t));
    kv->free_entries = malloc(n * sizeof(int32_t));
    kv->buckets = malloc(kv->n_buckets * sizeof(int32_t));
    if (!ok || !kv->entries || !kv->entry_tokens || !kv->free_entries || !kv->buckets) {
        gptoss_kv_manager_free(kv);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory allocating bookkeeping for %d kv blocks",
                                options->n_blocks);
    }
    for (int32_t i = 0; i < options->n_blocks; i++)
        kv->free_entries[i] = options->n_blocks - 1 - i;
    kv->n_free_entries = options->n_blocks;
    for (uint64_t i = 0; i < kv->n_buckets; i++)
        kv->buckets[i] = -1;
    *out = kv;
    return GPTOSS_OK;
}

void gptoss_kv_manager_free(gptoss_kv_manager *kv) {
    if (!kv) return;
    pool_destroy(&kv->pools[0]);
    pool_destroy(&kv->pools[1]);
    free(kv->entries);
    free(kv->entry_tokens);
    free(kv->free_entries);
    free(kv->buckets);
    free(kv);
}

bool gptoss_kv_has_sliding(const gptoss_kv_manager *kv) {
    return kv->has_sliding;
}
bool gptoss_kv_shared_pages(const gptoss_kv_manager *kv) {
    return kv->shared;
}

/* The pool whose free list serves pool_id. */
static kv_pool *free_list(gptoss_kv_manager *kv, gptoss_kv_pool_id pool_id) {
    return &kv->pools[kv->shared ? GPTOSS_KV_POOL_FULL : pool_id];
}

/* Page b leaves pool_id (unreferenced, unnamed, off the LRU list) for the free list. */
static void page_free(gptoss_kv_manager *kv, gptoss_kv_pool_id pool_id, int32_t b) {
    kv_pool *fl = free_list(kv, pool_id);
    kv->pools[pool_id].n_owned--;
    fl->free_stack[fl->n_free++] = b;
}
int32_t gptoss_kv_block_size(const gptoss_kv_manager *kv) {
    return kv->block_size;
}
bool gptoss_kv_prefix_cache_enabled(const gptoss_kv_manager *kv) {
    return kv->prefix_cache;
}

static uint64_t index_key_of(const gptoss_kv_manager *kv,
                             const uint8_t digest[GPTOSS_SHA256_BYTES]) {
    uint64_t key = 0;
    for (int i = 0; i < 8; i++)
        key = key << 8 | digest[i];
    return key & kv->index_mask;
}

static uint64_t bucket_of(const gptoss_kv_manager *kv, uint64_t index_key) {
    /* Mix so truncated keys still spread when few bits remain (and vice versa). */
    uint64_t x = index_key * 0x9e3779b97f4a7c15ull;
    return (x ^ (x >> 29)) & (kv->n_buckets - 1);
}

/* Removes entry e from the hash table and frees its slot; unlinks it from its pages. An
 * idle SLIDING page of the entry becomes free. */
static void entry_drop(gptoss_kv_manager *kv, int32_t e) {
    kv_entry *entry = &kv->entries[e];
    int32_t *link = &kv->buckets[bucket_of(kv, entry->index_key)];
    while (*link != e) {
        assert(*link >= 0);
        link = &kv->entries[*link].chain_next;
    }
    *link = entry->chain_next;
    kv_pool *full = &kv->pools[GPTOSS_KV_POOL_FULL];
    if (full->entry[entry->full_block] == e) full->entry[entry->full_block] = -1;
    if (entry->sliding_block >= 0) {
        kv_pool *sliding = &kv->pools[GPTOSS_KV_POOL_SLIDING];
        int32_t s = entry->sliding_block;
        sliding->entry[s] = -1;
        if (sliding->ref_count[s] == 0) {
            lru_remove(sliding, s);
            page_free(kv, GPTOSS_KV_POOL_SLIDING, s);
        }
    }
    entry->uid = 0;
    kv->free_entries[kv->n_free_entries++] = e;
    kv->n_live_entries--;
}

/* Evicts the LRU head of a pool; the page is left unreferenced and unnamed, still counted as
 * the pool's (n_owned). */
static int32_t evict_one(gptoss_kv_manager *kv, gptoss_kv_pool_id pool_id) {
    kv_pool *pool = &kv->pools[pool_id];
    int32_t b = pool->lru_head;
    if (b < 0) return -1;
    lru_remove(pool, b);
    int32_t e = pool->entry[b];
    assert(e >= 0);
    if (pool_id == GPTOSS_KV_POOL_FULL) {
        entry_drop(kv, e);
    } else {
        /* The entry keeps its FULL page; prefixes ending past this page's window still hit. */
        kv->entries[e].sliding_block = -1;
        pool->entry[b] = -1;
    }
    return b;
}

int32_t gptoss_kv_alloc(gptoss_kv_manager *kv, gptoss_kv_pool_id pool_id) {
    kv_pool *pool = &kv->pools[pool_id];
    kv_pool *fl = free_list(kv, pool_id);
    int32_t b;
    if (fl->n_free > 0) {
        b = fl->free_stack[--fl->n_free];
        pool->n_owned++;
    } else if ((b = evict_one(kv, pool_id)) < 0) {
        if (!kv->shared) return -1;
        /* nothing idle here: the other pool's least recently used idle page moves over */
        gptoss_kv_pool_id other =
            pool_id == GPTOSS_KV_POOL_FULL ? GPTOSS_KV_POOL_SLIDING : GPTOSS_KV_POOL_FULL;
        b = evict_one(kv, other);
        if (b < 0) return -1;
        kv->pools[other].n_owned--;
        pool->n_owned++;
    }
    assert(pool->ref_count[b] == 0 && pool->entry[b] < 0);
    pool->ref_count[b] = 1;
    return b;
}

void gptoss_kv_retain(gptoss_kv_manager *kv, gptoss_kv_pool_id pool_id, int32_t block) {
    kv_pool *pool = &kv->pools[pool_id];
    assert(block >= 0 && block < pool->n_blocks);
    if (pool->ref_count[block] == 0) {
        assert(pool->entry[block] >= 0); /* only idle cached pages can be revived */
        lru_remove(pool, block);
    }
    pool->ref_count[block]++;
}

void gptoss_kv_release(gptoss_kv_manager *kv, gptoss_kv_pool_id pool_id, int32_t block) {
    kv_pool *pool = &kv->pools[pool_id];
    assert(block >= 0 && block < pool->n_blocks && pool->ref_count[block] > 0);
    if (--pool->ref_count[block] > 0) return;
    if (pool->entry[block] >= 0)
        lru_push_tail(pool, block);
    else
        page_free(kv, pool_id, block);
}

int32_t gptoss_kv_ref_count(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool, int32_t block) {
    return kv->pools[pool].ref_count[block];
}
int32_t gptoss_kv_total(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool) {
    return kv->pools[pool].n_blocks;
}
int32_t gptoss_kv_used(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool) {
    const kv_pool *p = &kv->pools[pool];
    return p->n_owned - p->n_idle;
}
int32_t gptoss_kv_idle_cached(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool) {
    return kv->pools[pool].n_idle;
}
int32_t gptoss_kv_available(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool) {
    if (kv->shared)
        return kv->pools[GPTOSS_KV_POOL_FULL].n_free + kv->pools[GPTOSS_KV_POOL_FULL].n_idle +
               kv->pools[GPTOSS_KV_POOL_SLIDING].n_idle;
    return kv->pools[pool].n_free + kv->pools[pool].n_idle;
}
int32_t gptoss_kv_n_entries(const gptoss_kv_manager *kv) {
    return kv->n_live_entries;
}

void gptoss_kv_block_digest(const uint8_t parent_digest[GPTOSS_SHA256_BYTES],
                            const uint8_t salt_digest[GPTOSS_SHA256_BYTES], const int32_t *tokens,
                            int32_t n_tokens, uint8_t out[GPTOSS_SHA256_BYTES]) {
    gptoss_sha256 ctx;
    gptoss_sha256_init(&ctx);
    gptoss_sha256_update(&ctx, parent_digest, GPTOSS_SHA256_BYTES);
    gptoss_sha256_update(&ctx, salt_digest, GPTOSS_SHA256_BYTES);
    for (int32_t i = 0; i < n_tokens; i++) {
        uint32_t t = (uint32_t)tokens[i];
        uint8_t le[4] = {(uint8_t)t, (uint8_t)(t >> 8), (uint8_t)(t >> 16), (uint8_t)(t >> 24)};
        gptoss_sha256_update(&ctx, le, 4);
    }
    gptoss_sha256_final(&ctx, out);
}

static int32_t find_entry(const gptoss_kv_manager *kv, uint64_t index_key, uint64_t parent_uid,
                          const uint8_t salt_digest[GPTOSS_SHA256_BYTES], const int32_t *tokens) {
    size_t row_bytes = (size_t)kv->block_size * sizeof(int32_t);
    for (int32_t e = kv->buckets[bucket_of(kv, index_key)]; e >= 0; e = kv->entries[e].chain_next) {
        const kv_entry *entry = &kv->entries[e];
        /* The digest only narrows the search; identity is parent + salt + tokens. */
        if (entry->index_key != index_key || entry->parent_uid != parent_uid) continue;
        if (memcmp(entry->salt, salt_digest, GPTOSS_SHA256_BYTES) != 0) continue;
        if (memcmp(&kv->entry_tokens[(size_t)e * (size_t)kv->block_size], tokens, row_bytes) != 0)
            continue;
        return e;
    }
    return -1;
}

bool gptoss_kv_lookup(const gptoss_kv_manager *kv, const uint8_t digest[GPTOSS_SHA256_BYTES],
                      uint64_t parent_uid, const uint8_t salt_digest[GPTOSS_SHA256_BYTES],
                      const int32_t *tokens, gptoss_kv_hit *hit) {
    memset(hit, 0, sizeof *hit);
    hit->full_block = hit->sliding_block = -1;
    if (!kv->prefix_cache) return false;
    int32_t e = find_entry(kv, index_key_of(kv, digest), parent_uid, salt_digest, tokens);
    if (e < 0) return false;
    hit->uid = kv->entries[e].uid;
    hit->full_block = kv->entries[e].full_block;
    hit->sliding_block = kv->entries[e].sliding_block;
    return true;
}

uint64_t gptoss_kv_register(gptoss_kv_manager *kv, const uint8_t digest[GPTOSS_SHA256_BYTES],
                            uint64_t parent_uid, const uint8_t salt_digest[GPTOSS_SHA256_BYTES],
                            const int32_t *tokens, int32_t full_block, int32_t sliding_block) {
    if (!kv->prefix_cache) return 0;
    /* The caller references the pages it publishes, so they are neither free nor idle. */
    assert(kv->pools[GPTOSS_KV_POOL_FULL].ref_count[full_block] > 0);
    assert(sliding_block < 0 || kv->pools[GPTOSS_KV_POOL_SLIDING].ref_count[sliding_block] > 0);
    uint64_t index_key = index_key_of(kv, digest);
    int32_t existing = find_entry(kv, index_key, parent_uid, salt_digest, tokens);
    if (existing >= 0) {
        /* Same prefix, recomputed because its SLIDING page had been evicted: adopt the new
         * one so later hits can resume past it again. */
        kv_entry *entry = &kv->entries[existing];
        kv_pool *sliding = &kv->pools[GPTOSS_KV_POOL_SLIDING];
        if (entry->sliding_block < 0 && sliding_block >= 0 && sliding->entry[sliding_block] < 0) {
            entry->sliding_block = sliding_block;
            sliding->entry[sliding_block] = existing;
        }
        return entry->uid;
    }
    kv_pool *full = &kv->pools[GPTOSS_KV_POOL_FULL];
    kv_pool *sliding = &kv->pools[GPTOSS_KV_POOL_SLIDING];
    /* A page already named by another entry (same KV under a different identity cannot
     * happen) or an exhausted entry table: do not cache. */
    if (full->entry[full_block] >= 0 || kv->n_free_entries == 0) return 0;
    if (sliding_block >= 0 && sliding->entry[sliding_block] >= 0) sliding_block = -1;
    int32_t e = kv->free_entries[--kv->n_free_entries];
    kv_entry *entry = &kv->entries[e];
    entry->uid = kv->next_uid++;
    entry->parent_uid = parent_uid;
    entry->index_key = index_key;
    memcpy(entry->salt, salt_digest, GPTOSS_SHA256_BYTES);
    entry->full_block = full_block;
    entry->sliding_block = sliding_block;
    memcpy(&kv->entry_tokens[(size_t)e * (size_t)kv->block_size], tokens,
           (size_t)kv->block_size * sizeof(int32_t));
    uint64_t bucket = bucket_of(kv, index_key);
    entry->chain_next = kv->buckets[bucket];
    kv->buckets[bucket] = e;
    full->entry[full_block] = e;
    if (sliding_block >= 0) sliding->entry[sliding_block] = e;
    kv->n_live_entries++;
    return entry->uid;
}

void gptoss_kv_clear_idle(gptoss_kv_manager *kv) {
    for (int pool_id = 0; pool_id < 2; pool_id++) {
        int32_t b;
        while ((b = evict_one(kv, (gptoss_kv_pool_id)pool_id)) >= 0)
            page_free(kv, (gptoss_kv_pool_id)pool_id, b);
    }
}
