/*
 * kv_cache.h - the KV block manager: paged KV pools with reference counts, and the prefix
 * cache that lets requests share full blocks of identical prefixes.
 *
 * Owns the bookkeeping of which physical KV page is free, used (how many sequences reference
 * it) or idle-but-cached (reference count 0, kept in LRU order for reuse). It never touches
 * KV data: the backend owns the pages and only reads and writes those a plan names.
 *
 * Two pools of the same block size: FULL (full-attention layers, every position of every
 * sequence) and SLIDING (sliding-window layers; a sequence drops the blocks its window can no
 * longer see). Without sliding layers only FULL is used.
 *
 * Shared pages (shared_pages): both pools draw their page ids from one space of n_blocks ids,
 * for a backend whose sliding layers' pages live in the same memory as its full layers' (page
 * p of a sliding layer is page p of a full layer's buffer), so memory goes to whichever pool
 * needs it instead of being split up front. An id then belongs to at most one pool at a time:
 * free (one shared free list), referenced, or idle-cached in its pool's LRU list; an
 * allocation that finds nothing free evicts its own pool's LRU head first, then the other's.
 *
 * Prefix cache: an entry names one full block of tokens of some prefix: its token ids, the
 * identity (uid) of the entry for the previous block, the digest of the request's cache salt,
 * plus the FULL page holding its KV and the SLIDING page (or -1 once evicted). Entries are
 * indexed by a SHA-256 chain digest, but a hit is only ever confirmed by comparing parent
 * uid, salt digest and token ids, so a hash collision (forced in tests with hash_bits) can
 * never hand out the wrong KV.
 *
 * Invariant: a page referenced by more than one sequence, or named by an entry, is full and
 * completely written; nobody writes to it again. Not thread-safe (engine thread only).
 */
#ifndef GPTOSS_ENGINE_KV_CACHE_H
#define GPTOSS_ENGINE_KV_CACHE_H

#include "util/sha256.h"
#include "gptoss.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum gptoss_kv_pool_id {
    GPTOSS_KV_POOL_FULL = 0,
    GPTOSS_KV_POOL_SLIDING = 1,
} gptoss_kv_pool_id;

typedef struct gptoss_kv_manager_options {
    int32_t block_size;       /* tokens per page */
    int32_t n_blocks;         /* FULL pool pages */
    int32_t n_sliding_blocks; /* SLIDING pool pages; 0 = no sliding pool */
    bool enable_prefix_cache;
    int32_t hash_bits; /* index bits kept from the digest (1..64); 0 = 64 */
    bool shared_pages; /* one id space of n_blocks for both pools (n_sliding_blocks must then
                          be 0 or n_blocks; see above) */
} gptoss_kv_manager_options;

typedef struct gptoss_kv_manager gptoss_kv_manager;

gptoss_status gptoss_kv_manager_create(const gptoss_kv_manager_options *options,
                                       gptoss_kv_manager **out, gptoss_error *error);
void gptoss_kv_manager_free(gptoss_kv_manager *kv);

bool gptoss_kv_has_sliding(const gptoss_kv_manager *kv);
bool gptoss_kv_shared_pages(const gptoss_kv_manager *kv); /* both pools in one id space */
int32_t gptoss_kv_block_size(const gptoss_kv_manager *kv);
bool gptoss_kv_prefix_cache_enabled(const gptoss_kv_manager *kv);

/* Takes a page with reference count 1: a free one, else the least recently used idle cached
 * one (dropping its cache entry, or for SLIDING only the entry's sliding page). -1 if none. */
int32_t gptoss_kv_alloc(gptoss_kv_manager *kv, gptoss_kv_pool_id pool);
/* One more reference (an idle cached page leaves the LRU list). */
void gptoss_kv_retain(gptoss_kv_manager *kv, gptoss_kv_pool_id pool, int32_t block);
/* One reference less; at zero the page becomes idle-cached (if an entry names it) or free. */
void gptoss_kv_release(gptoss_kv_manager *kv, gptoss_kv_pool_id pool, int32_t block);

int32_t gptoss_kv_ref_count(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool, int32_t block);
/* Pages the pool can hold (with shared pages: the whole id space, for both pools). */
int32_t gptoss_kv_total(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool);
int32_t gptoss_kv_used(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool); /* ref > 0 */
int32_t gptoss_kv_idle_cached(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool);
/* Pages an allocation from this pool could get: free + idle cached (with shared pages: the
 * shared free list + both pools' idle pages, the same number for both pools). */
int32_t gptoss_kv_available(const gptoss_kv_manager *kv, gptoss_kv_pool_id pool);

/* Chain digest of one block: SHA-256(parent_digest || salt_digest || token ids as LE int32).
 * parent_digest is all zeros for a sequence's first block. */
void gptoss_kv_block_digest(const uint8_t parent_digest[GPTOSS_SHA256_BYTES],
                            const uint8_t salt_digest[GPTOSS_SHA256_BYTES], const int32_t *tokens,
                            int32_t n_tokens, uint8_t out[GPTOSS_SHA256_BYTES]);

/* A confirmed cache entry (uid 0 = none). */
typedef struct gptoss_kv_hit {
    uint64_t uid;          /* entry identity; parent of the next block's entry */
    int32_t full_block;    /* FULL page */
    int32_t sliding_block; /* SLIDING page, or -1 when evicted (or no sliding pool) */
} gptoss_kv_hit;

/* Finds the entry for a block whose chain digest is `digest`, confirmed by parent uid
 * (0 for a first block), salt digest and tokens [block_size]. Takes no reference and does
 * not change LRU order. Returns false on a miss (or when the cache is disabled). */
bool gptoss_kv_lookup(const gptoss_kv_manager *kv, const uint8_t digest[GPTOSS_SHA256_BYTES],
                      uint64_t parent_uid, const uint8_t salt_digest[GPTOSS_SHA256_BYTES],
                      const int32_t *tokens, gptoss_kv_hit *hit);

/* Publishes a full, completely written block. If an identical entry exists (same parent,
 * salt, tokens) it is kept and its uid returned (adopting sliding_block if the entry had lost
 * its own); otherwise a new entry names full_block (and
 * sliding_block, may be -1). Returns 0 when the cache is disabled. The caller keeps its
 * references; the pages become idle-cached instead of free when they drop to zero. */
uint64_t gptoss_kv_register(gptoss_kv_manager *kv, const uint8_t digest[GPTOSS_SHA256_BYTES],
                            uint64_t parent_uid, const uint8_t salt_digest[GPTOSS_SHA256_BYTES],
                            const int32_t *tokens, int32_t full_block, int32_t sliding_block);

/* Number of live cache entries. */
int32_t gptoss_kv_n_entries(const gptoss_kv_manager *kv);

/* Drops every idle cached page and entry not in use (e.g. tests, or a cache reset). */
void gptoss_kv_clear_idle(gptoss_kv_manager *kv);

#endif
