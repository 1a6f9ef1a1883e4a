/*
 * engines.c - the engines behind the server: the hand-over (gptoss_server_set_ready), the
 * choice of an engine per request (the router, over the engines whose queue has room), the
 * submission, and the statistics summed over engines for /metrics.
 *
 * Owns: server->engines (the array, not the engines: cmd_serve.c owns those) and
 * server->router. With one engine this is a straight pass-through.
 */
#include "server/engines.h"

#include "server/router.h"

#include "util/error.h"
#include "util/log.h"

#include <stdlib.h>
#include <string.h>

gptoss_status gptoss_server_set_ready(gptoss_server *s, gptoss_engine *const *engines,
                                      int32_t n_engines, const gptoss_tokenizer *tokenizer,
                                      int32_t max_model_len, int32_t max_num_seqs,
                                      int32_t kv_block_size, gptoss_error *error) {
    if (n_engines < 1 || n_engines > SERVER_ROUTER_MAX_ENGINES)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "server: %d engines (1..%d supported)", n_engines,
                                SERVER_ROUTER_MAX_ENGINES);
    server_router_options ro = server_router_options_default();
    ro.n_engines = n_engines;
    ro.kv_block_size = kv_block_size;
    gptoss_status st = server_router_create(&ro, &s->router, error);
    if (st != GPTOSS_OK) return st;
    s->engines = malloc((size_t)n_engines * sizeof *s->engines);
    if (!s->engines) {
        server_router_free(s->router);
        s->router = NULL;
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(s->engines, engines, (size_t)n_engines * sizeof *s->engines);
    s->n_engines = n_engines;
    s->tokenizer = tokenizer;
    s->max_model_len = max_model_len;
    s->max_num_seqs = max_num_seqs;
    atomic_store_explicit(&s->ready, true, memory_order_release);
    return GPTOSS_OK;
}

void server_engines_free(gptoss_server *s) {
    server_router_free(s->router);
    free(s->engines);
    s->router = NULL;
    s->engines = NULL;
    s->n_engines = 0;
}

gptoss_status server_submit(gptoss_server *s, const int32_t *prompt, int32_t n_prompt,
                            const gptoss_sampling_params *params,
                            const gptoss_request_options *options, gptoss_request **out,
                            int32_t *engine_index, gptoss_error *error) {
    *out = NULL;
    *engine_index = -1;
    /* Engines whose queue is full (or that drain) take nothing; the others are the router's
     * to choose from. A queue may fill between the check and the submit: then the next best
     * of the remaining engines gets the request. When every queue is full, every engine is
     * asked anyway, so that the refusal is in an engine's own words (full, or draining). */
    uint64_t allowed = 0;
    for (int32_t e = 0; e < s->n_engines; e++)
        if (!gptoss_engine_queue_full(s->engines[e])) allowed |= 1ull << e;
    if (!allowed) allowed = s->n_engines == 64 ? ~0ull : (1ull << s->n_engines) - 1;
    for (;;) {
        server_route route = server_router_route(s->router, prompt, n_prompt, options->cache_salt,
                                                 options->cache_salt_len, allowed);
        if (route.engine < 0) /* every engine refused for a full queue; *error says so */
            return GPTOSS_ERR_CAPACITY;
        gptoss_engine *engine = s->engines[route.engine];
        gptoss_status st =
            gptoss_engine_submit(engine, prompt, n_prompt, params, options, out, error);
        if (st == GPTOSS_OK) {
            *engine_index = route.engine;
            if (s->n_engines > 1)
                GPTOSS_LOG_D(
                    "router", "request %llu -> engine %d (%s, prefix %d blocks, %d in flight)",
                    (unsigned long long)gptoss_request_id(*out), route.engine,
                    route.by_prefix ? "prefix" : "least loaded", route.match_blocks, route.load);
            return GPTOSS_OK;
        }
        server_router_done(s->router, route.engine);
        if (st != GPTOSS_ERR_CAPACITY || !gptoss_engine_queue_full(engine)) {
            *engine_index = route.engine; /* a refusal of the request itself */
            return st;
        }
        allowed &= ~(1ull << route.engine);
    }
}

void server_engine_done(gptoss_server *s, int32_t engine_index) {
    server_router_done(s->router, engine_index);
}

bool server_queue_full(gptoss_server *s, int32_t engine_index) {
    if (engine_index < 0 || engine_index >= s->n_engines) return true;
    return gptoss_engine_queue_full(s->engines[engine_index]);
}

uint64_t server_response_number(gptoss_server *s, const gptoss_request *request,
                                int32_t engine_index) {
    return gptoss_request_id(request) * (uint64_t)s->n_engines + (uint64_t)engine_index;
}

static void add_histogram(gptoss_latency_histogram *sum, const gptoss_latency_histogram *h) {
    for (int i = 0; i < GPTOSS_LATENCY_BUCKETS; i++)
        sum->buckets[i] += h->buckets[i];
    sum->count += h->count;
    sum->sum_seconds += h->sum_seconds;
}

void server_engine_stats(gptoss_server *s, gptoss_engine_stats *sum) {
    memset(sum, 0, sizeof *sum);
    for (int32_t e = 0; e < s->n_engines; e++) {
        gptoss_engine_stats st;
        gptoss_engine_get_stats(s->engines[e], &st);
        sum->n_running += st.n_running;
        sum->n_waiting += st.n_waiting;
        sum->n_waiting_requests += st.n_waiting_requests;
        sum->kv_blocks_total += st.kv_blocks_total;
        sum->kv_blocks_used += st.kv_blocks_used;
        sum->kv_blocks_cached += st.kv_blocks_cached;
        sum->sliding_blocks_total += st.sliding_blocks_total;
        sum->sliding_blocks_used += st.sliding_blocks_used;
        sum->prefix_cache_queries += st.prefix_cache_queries;
        sum->prefix_cache_hits += st.prefix_cache_hits;
        sum->prompt_tokens += st.prompt_tokens;
        sum->generation_tokens += st.generation_tokens;
        for (int r = 0; r < 5; r++)
            sum->requests_finished[r] += st.requests_finished[r];
        sum->preemptions += st.preemptions;
        sum->steps += st.steps;
        sum->draft_tokens += st.draft_tokens;
        sum->draft_accepted_tokens += st.draft_accepted_tokens;
        sum->draft_seq_steps += st.draft_seq_steps;
        sum->draft_seconds += st.draft_seconds;
        sum->draft_proposed_tokens += st.draft_proposed_tokens;
        add_histogram(&sum->ttft, &st.ttft);
        add_histogram(&sum->itl, &st.itl);
        sum->draining = sum->draining || st.draining;
    }
}
