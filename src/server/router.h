/*
 * router.h - picks the engine of a data-parallel server (N engines, one per device, behind
 * one HTTP server) for each request.
 *
 * Owns: a bounded table of the prompts recently routed to each engine, kept as block-granular
 * prefix hashes, and a count of the requests each engine has in flight. It knows nothing of
 * HTTP or of the engines themselves: the caller passes token ids, says which engines may take
 * a request (their queue is not full), and reports when a routed request is done.
 *
 * Why a table of its own: each engine's prefix cache is private to the engine's thread. The
 * table mirrors what the engines probably hold (it hears of every prompt routed, never of an
 * eviction), which is enough to keep a multi-turn conversation, whose every turn extends the
 * previous prompt, on the engine that has its KV pages.
 *
 * The rule (server_router_route):
 *   1. For each allowed engine, the match is the number of leading full blocks of the prompt
 *      (kv_block_size tokens each, hashed as a chain seeded by the cache salt, so prompts of
 *      different salts never match) that the table says were routed to that engine.
 *   2. The least loaded allowed engine is the one with the fewest requests in flight (ties:
 *      the next one after the last engine picked, so equal engines take turns).
 *   3. The engine with the longest match (ties: the less loaded) is chosen when its match is
 *      at least min_match_blocks longer than the least loaded engine's and it is not
 *      overloaded: load <= least + balance_abs or load <= least * balance_rel. Otherwise the
 *      least loaded engine is chosen.
 *   4. The prompt's full blocks are then recorded for the chosen engine, most recent first;
 *      beyond max_blocks the least recently routed blocks are forgotten.
 *
 * Threads: every function may be called from any thread (one mutex; a route costs one hash
 * lookup per prompt block).
 */
#ifndef GPTOSS_SERVER_ROUTER_H
#define GPTOSS_SERVER_ROUTER_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* At most this many engines (the table keeps one bit per engine). */
#define SERVER_ROUTER_MAX_ENGINES 64

typedef struct server_router_options {
    int32_t n_engines;        /* 1..SERVER_ROUTER_MAX_ENGINES */
    int32_t kv_block_size;    /* tokens per block: the engines' KV page size */
    int32_t max_blocks;       /* prefix blocks remembered over all engines (LRU) */
    int32_t min_match_blocks; /* a prefix advantage below this is ignored */
    int32_t balance_abs;      /* a prefix engine may have this many more requests in flight */
    double balance_rel;       /* ... or this many times the least loaded engine's */
} server_router_options;

/* n_engines 1, 16-token blocks, 65536 blocks (one 1 MiB-ish table, a million prompt tokens),
 * min match 1 block, balance 8 requests or 1.5x. */
server_router_options server_router_options_default(void);

typedef struct server_router server_router;

gptoss_status server_router_create(const server_router_options *options, server_router **out,
                                   gptoss_error *error);
void server_router_free(server_router *router); /* NULL ok */

/* What a route decided (for log lines and tests). */
typedef struct server_route {
    int32_t engine;       /* the chosen engine, or -1 when no engine was allowed */
    int32_t match_blocks; /* blocks of the prompt the table had for the chosen engine */
    int32_t load;         /* requests in flight on it before this one */
    bool by_prefix;       /* chosen for its prefix rather than for its load */
} server_route;

/* Chooses an engine for prompt[0..n_prompt) by the rule above among the engines whose bit is
 * set in allowed_mask, counts the request in flight on it and records its blocks. salt may be
 * NULL (salt_len 0). When no allowed engine exists, route.engine is -1 and nothing changes. */
server_route server_router_route(server_router *router, const int32_t *prompt, int32_t n_prompt,
                                 const uint8_t *salt, size_t salt_len, uint64_t allowed_mask);

/* A request routed to `engine` is done (finished, refused or abandoned). */
void server_router_done(server_router *router, int32_t engine);

/* Requests routed to `engine` and not yet done, and requests ever routed to it. */
int64_t server_router_in_flight(server_router *router, int32_t engine);
uint64_t server_router_routed_total(server_router *router, int32_t engine);

/* Blocks the table holds now (<= max_blocks). */
int32_t server_router_table_size(server_router *router);

#endif
