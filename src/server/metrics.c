/*
 * metrics.c - GET /metrics: the engine's statistics and the server's response counters in the
 * Prometheus text format (vLLM's metric names under the gptoss: prefix).
 *
 * Owns: the text rendering only; the numbers come from gptoss_engine_get_stats and the
 * server's atomic counters.
 */
#include "server/server_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Appends printf output to a growable text buffer (metrics). */
typedef struct text_buf {
    char *data;
    size_t len, cap;
    bool failed;
} text_buf;

static void tb_printf(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(text_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n =
            vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->data && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown, b->cap = cap;
    }
}

static void histogram(text_buf *b, const char *name, const char *help, const char *model,
                      const gptoss_latency_histogram *h) {
    tb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < GPTOSS_LATENCY_BUCKETS; i++) {
        if (i == GPTOSS_LATENCY_BUCKETS - 1)
            tb_printf(b, "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", name, model,
                      (unsigned long long)h->count);
        else
            tb_printf(b, "%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", name, model,
                      gptoss_latency_bucket_bounds[i], (unsigned long long)h->buckets[i]);
    }
    tb_printf(b, "%s_sum{model_name=\"%s\"} %.9g\n%s_count{model_name=\"%s\"} %llu\n", name, model,
              h->sum_seconds, name, model, (unsigned long long)h->count);
}

static void gauge(text_buf *b, const char *name, const char *type, const char *help,
                  const char *model, double value) {
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\"} %.17g\n", name, help, name,
              type, name, model, value);
}

server_reply server_metrics(gptoss_server *s, const server_request *request) {
    (void)request;
    text_buf b = {0};
    const char *m = s->model_name;
    bool ready = atomic_load_explicit(&s->ready, memory_order_acquire);
    gauge(&b, "gptoss:ready", "gauge", "1 when the model is loaded and requests are served", m,
          ready && !atomic_load(&s->draining));
    if (ready) {
        gptoss_engine_stats st;
        gptoss_engine_get_stats(s->engine, &st);
        gauge(&b, "gptoss:num_requests_running", "gauge", "Sequences holding KV and being stepped",
              m, st.n_running);
        gauge(&b, "gptoss:num_requests_waiting", "gauge", "Sequences waiting to start or resume", m,
              st.n_waiting);
        gauge(&b, "gptoss:kv_cache_usage_perc", "gauge",
              "Fraction of KV blocks in use (0-1; full-attention pool, or both where they share "
              "pages)",
              m, st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0.0);
        gauge(&b, "gptoss:kv_cache_blocks_used", "gauge",
              "KV blocks referenced by sequences (full-attention pool, or both where they share "
              "pages)",
              m, st.kv_blocks_used);
        gauge(&b, "gptoss:kv_cache_blocks_cached", "gauge",
              "Idle KV blocks kept for the prefix cache", m, st.kv_blocks_cached);
        gauge(&b, "gptoss:kv_cache_blocks_total", "gauge", "Full-attention KV blocks in the pool",
              m, st.kv_blocks_total);
        gauge(&b, "gptoss:prefix_cache_queries_total", "counter",
              "Prompt tokens looked up in the prefix cache", m, (double)st.prefix_cache_queries);
        gauge(&b, "gptoss:prefix_cache_hits_total", "counter",
              "Prompt tokens found in the prefix cache", m, (double)st.prefix_cache_hits);
        gauge(&b, "gptoss:prefix_cache_hit_rate", "gauge",
              "prefix_cache_hits / prefix_cache_queries", m,
              st.prefix_cache_queries
                  ? (double)st.prefix_cache_hits / (double)st.prefix_cache_queries
                  : 0.0);
        gauge(&b, "gptoss:prompt_tokens_total", "counter", "Prompt tokens of started requests", m,
              (double)st.prompt_tokens);
        gauge(&b, "gptoss:generation_tokens_total", "counter", "Generated tokens", m,
              (double)st.generation_tokens);
        gauge(&b, "gptoss:num_preemptions_total", "counter",
              "Sequences preempted for lack of KV blocks", m, (double)st.preemptions);
        /* Speculative decoding (vLLM's spec_decode names). */
        gauge(&b, "gptoss:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified",
              m, (double)st.draft_tokens);
        gauge(&b, "gptoss:spec_decode_num_accepted_tokens_total", "counter",
              "Draft tokens accepted", m, (double)st.draft_accepted_tokens);
        tb_printf(&b, "# HELP gptoss:request_success_total Finished choices by finish reason\n"
                      "# TYPE gptoss:request_success_total counter\n");
        for (int r = 1; r < 5; r++)
            tb_printf(
                &b, "gptoss:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n",
                m, gptoss_finish_reason_name((gptoss_finish_reason)r),
                (unsigned long long)st.requests_finished[r]);
        histogram(&b, "gptoss:time_to_first_token_seconds", "Submit to first token", m, &st.ttft);
        histogram(&b, "gptoss:inter_token_latency_seconds", "Time between consecutive tokens", m,
                  &st.itl);
    }
    tb_printf(&b, "# HELP gptoss:http_responses_total HTTP responses by status class\n"
                  "# TYPE gptoss:http_responses_total counter\n");
    for (int c = 2; c < 6; c++)
        tb_printf(&b, "gptoss:http_responses_total{code=\"%dxx\"} %llu\n", c,
                  (unsigned long long)atomic_load(&s->responses_by_class[c]));
    if (b.failed) {
        free(b.data);
        return server_error(500, "server_error", NULL, NULL, "out of memory");
    }
    server_reply reply = {
        200, server_buffer_response(b.data, b.len, "text/plain; version=0.0.4; charset=utf-8")};
    free(b.data);
    return reply;
}
