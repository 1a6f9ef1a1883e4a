/*
 * metrics.c - GET /metrics: the engine's statistics, the server's request histograms and its
 * response counters in the Prometheus text format (vLLM's metric names with a gptoss_ prefix;
 * names, HELP/TYPE lines and suffixes follow promtool's lint rules).
 *
 * Owns: the rendering, and the request histograms (end-to-end latency, queue time, time per
 * output token, prompt and generation tokens), which connection threads update with relaxed
 * atomic adds when a generation ends: no lock on the request path.
 */
#include "server/server_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bucket bounds (vLLM's), +Inf implied. */
static const double latency_bounds[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15,  20,
                                        30,  40,  50,  60,  120, 240, 480, 960, 1920, 7680};
static const double tpot_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10,   20,  40,  80};
static const double token_bounds[] = {1,     2,      5,      10,     20,     50,    100,
                                      200,   500,    1000,   2000,   5000,   10000, 20000,
                                      50000, 100000, 200000, 500000, 1000000};

_Static_assert(sizeof latency_bounds / sizeof latency_bounds[0] < SERVER_HISTOGRAM_BUCKETS,
               "room for +Inf");
_Static_assert(sizeof tpot_bounds / sizeof tpot_bounds[0] < SERVER_HISTOGRAM_BUCKETS,
               "room for +Inf");
_Static_assert(sizeof token_bounds / sizeof token_bounds[0] < SERVER_HISTOGRAM_BUCKETS,
               "room for +Inf");

static void histogram_init(server_histogram *h, const double *bounds, int n) {
    h->bounds = bounds, h->n_bounds = n;
    for (int i = 0; i < SERVER_HISTOGRAM_BUCKETS; i++)
        atomic_init(&h->buckets[i], 0);
    atomic_init(&h->sum_micro, 0);
}

void server_metrics_init(gptoss_server *s) {
#define N(a) (int)(sizeof a / sizeof a[0])
    histogram_init(&s->hist.e2e, latency_bounds, N(latency_bounds));
    histogram_init(&s->hist.queue, latency_bounds, N(latency_bounds));
    histogram_init(&s->hist.tpot, tpot_bounds, N(tpot_bounds));
    histogram_init(&s->hist.prompt_tokens, token_bounds, N(token_bounds));
    histogram_init(&s->hist.generation_tokens, token_bounds, N(token_bounds));
#undef N
}

/* One observation: its own bucket (not cumulative: one add) and the sum in millionths. */
static void observe(server_histogram *h, double x) {
    if (!(x >= 0)) return; /* NaN or negative: not a measurement */
    int b = 0;
    while (b < h->n_bounds && x > h->bounds[b])
        b++;
    atomic_fetch_add_explicit(&h->buckets[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_micro, (unsigned long long)llround(x * 1e6),
                              memory_order_relaxed);
}

void server_metrics_observe(gptoss_server *s, double e2e_seconds, double queue_seconds,
                            double tpot_seconds, int32_t prompt_tokens, int32_t generation_tokens) {
    observe(&s->hist.e2e, e2e_seconds);
    observe(&s->hist.queue, queue_seconds);
    observe(&s->hist.tpot, tpot_seconds);
    observe(&s->hist.prompt_tokens, prompt_tokens);
    observe(&s->hist.generation_tokens, generation_tokens);
}

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

/* A label value: backslash, double quote and newline escaped (the model name is the
 * operator's, and may hold any of them). */
static void label_value(char *out, size_t size, const char *v) {
    size_t o = 0;
    for (; *v && o + 3 < size; v++) {
        if (*v == '\\' || *v == '"')
            out[o++] = '\\', out[o++] = *v;
        else if (*v == '\n')
            out[o++] = '\\', out[o++] = 'n';
        else
            out[o++] = *v;
    }
    out[o] = '\0';
}

static void family(text_buf *b, const char *name, const char *type, const char *help) {
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The engine's histograms: cumulative buckets, the last one +Inf. */
static void engine_histogram(text_buf *b, const char *name, const char *help, const char *model,
                             const gptoss_latency_histogram *h) {
    family(b, name, "histogram", help);
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

/* The server's histograms: buckets cumulated here; the count is their total, so +Inf and
 * _count always agree within a scrape. */
static void server_histogram_text(text_buf *b, const char *name, const char *help,
                                  const char *model, const server_histogram *h) {
    family(b, name, "histogram", help);
    unsigned long long total = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        total += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        if (i == h->n_bounds)
            tb_printf(b, "%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", name, model, total);
        else
            tb_printf(b, "%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", name, model, h->bounds[i],
                      total);
    }
    double sum = (double)atomic_load_explicit(&h->sum_micro, memory_order_relaxed) / 1e6;
    tb_printf(b, "%s_sum{model_name=\"%s\"} %.9g\n%s_count{model_name=\"%s\"} %llu\n", name, model,
              sum, name, model, total);
}

static void one_value(text_buf *b, const char *name, const char *type, const char *help,
                      const char *model, double value) {
    family(b, name, type, help);
    tb_printf(b, "%s{model_name=\"%s\"} %.17g\n", name, model, value);
}

server_reply server_metrics(gptoss_server *s, const server_request *request) {
    (void)request;
    text_buf b = {0};
    char m[512];
    label_value(m, sizeof m, s->model_name);
    bool ready = atomic_load_explicit(&s->ready, memory_order_acquire);
    one_value(&b, "gptoss_ready", "gauge", "1 when the model is loaded and requests are served", m,
              ready && !atomic_load(&s->draining));
    if (ready) {
        gptoss_engine_stats st;
        server_engine_stats(s, &st);
        one_value(&b, "gptoss_num_requests_running", "gauge",
                  "Sequences holding KV and being stepped", m, st.n_running);
        one_value(&b, "gptoss_num_requests_waiting", "gauge",
                  "Sequences waiting to start or resume", m, st.n_waiting);
        one_value(&b, "gptoss_kv_cache_usage_perc", "gauge",
                  "Fraction of KV blocks in use (0-1; full-attention pool, or both where they "
                  "share pages)",
                  m, st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0.0);
        one_value(&b, "gptoss_kv_cache_blocks_used", "gauge",
                  "KV blocks referenced by sequences (full-attention pool, or both where they "
                  "share pages)",
                  m, st.kv_blocks_used);
        one_value(&b, "gptoss_kv_cache_blocks_cached", "gauge",
                  "Idle KV blocks kept for the prefix cache", m, st.kv_blocks_cached);
        one_value(&b, "gptoss_kv_cache_blocks_capacity", "gauge",
                  "Full-attention KV blocks in the pool", m, st.kv_blocks_total);
        one_value(&b, "gptoss_prefix_cache_queries_total", "counter",
                  "Prompt tokens looked up in the prefix cache", m,
                  (double)st.prefix_cache_queries);
        one_value(&b, "gptoss_prefix_cache_hits_total", "counter",
                  "Prompt tokens found in the prefix cache", m, (double)st.prefix_cache_hits);
        one_value(&b, "gptoss_prefix_cache_hit_rate", "gauge",
                  "prefix_cache_hits / prefix_cache_queries", m,
                  st.prefix_cache_queries
                      ? (double)st.prefix_cache_hits / (double)st.prefix_cache_queries
                      : 0.0);
        one_value(&b, "gptoss_prompt_tokens_total", "counter", "Prompt tokens of started requests",
                  m, (double)st.prompt_tokens);
        one_value(&b, "gptoss_generation_tokens_total", "counter", "Generated tokens", m,
                  (double)st.generation_tokens);
        one_value(&b, "gptoss_num_preemptions_total", "counter",
                  "Sequences preempted for lack of KV blocks", m, (double)st.preemptions);
        /* Speculative decoding (vLLM's spec_decode names). */
        one_value(&b, "gptoss_spec_decode_num_draft_tokens_total", "counter",
                  "Draft tokens verified", m, (double)st.draft_tokens);
        one_value(&b, "gptoss_spec_decode_num_accepted_tokens_total", "counter",
                  "Draft tokens accepted", m, (double)st.draft_accepted_tokens);
        family(&b, "gptoss_request_success_total", "counter", "Finished choices by finish reason");
        for (int r = 1; r < 5; r++)
            tb_printf(
                &b, "gptoss_request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n",
                m, gptoss_finish_reason_name((gptoss_finish_reason)r),
                (unsigned long long)st.requests_finished[r]);
        engine_histogram(&b, "gptoss_time_to_first_token_seconds",
                         "Submit to first token (choice 0)", m, &st.ttft);
        engine_histogram(&b, "gptoss_inter_token_latency_seconds",
                         "Time between consecutive tokens of a choice", m, &st.itl);
    }
    server_histogram_text(&b, "gptoss_e2e_request_latency_seconds",
                          "Generation requests: submit to the last token", m, &s->hist.e2e);
    server_histogram_text(&b, "gptoss_request_queue_time_seconds",
                          "Generation requests: submit to the engine step that admitted them", m,
                          &s->hist.queue);
    server_histogram_text(&b, "gptoss_time_per_output_token_seconds",
                          "Generation requests: first to last token over the tokens after the "
                          "first (per choice)",
                          m, &s->hist.tpot);
    server_histogram_text(&b, "gptoss_request_prompt_tokens", "Generation requests: prompt tokens",
                          m, &s->hist.prompt_tokens);
    server_histogram_text(&b, "gptoss_request_generation_tokens",
                          "Generation requests: generated tokens (all choices)", m,
                          &s->hist.generation_tokens);
    family(&b, "gptoss_http_responses_total", "counter", "HTTP responses by status class");
    for (int c = 2; c < 6; c++)
        tb_printf(&b, "gptoss_http_responses_total{code=\"%dxx\"} %llu\n", c,
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
