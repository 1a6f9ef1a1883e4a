/*
 * cmd_bench_serve.c - `gptoss bench-serve`: a load generator for any OpenAI-compatible server
 * (ours, vLLM's, llama-server's).
 *
 * Owns: the workload (synthetic prompts of fixed token lengths made of random words, or a
 * ShareGPT-like lognormal length mix), the client threads (a fixed concurrency, or Poisson
 * arrivals at a request rate), timing of every streamed chunk, the report (throughput,
 * TTFT, TPOT, ITL; mean, median, p99) on stdout and as JSON, and the sweep table (one row per
 * run, per GPU and per user) as text, CSV and a gnuplot Pareto plot beside published points.
 * Output lengths are fixed with ignore_eos + max_tokens; sampling parameters are sent only
 * when asked for, so the server's defaults apply as they do for real clients. Must not
 * depend on the server being ours.
 */
#include "cli.h"
#include "options.h"

#include "server/http_client.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_LEVELS 32

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out, "usage: gptoss bench-serve --url URL (--concurrency 1,8,64 | --request-rate R) "
                 "--num-requests N\n"
                 "                          (--input-len I --output-len O | --sharegpt-like) "
                 "[options]\n\n"
                 "Streams requests at an OpenAI-compatible server and reports request throughput, "
                 "output and\n"
                 "total tokens/s, TTFT, TPOT and ITL (mean, median, p99).\n\n"
                 "options:\n");
    cli_print_options(out, groups, n_groups, 23);
}

/* ---- workload ---------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) {
    return ((double)(splitmix(state) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(uint64_t *state) {
    return sqrt(-2.0 * log(uniform01(state))) * cos(6.283185307179586 * uniform01(state));
}

/* Common English words; each, after a space, is one o200k token. */
static const char *const words[] = {
    "time",     "year",    "people",      "way",      "day",        "man",    "thing",   "woman",
    "life",     "child",   "world",       "school",   "state",      "family", "student", "group",
    "country",  "problem", "hand",        "part",     "place",      "case",   "week",    "company",
    "system",   "program", "question",    "work",     "government", "number", "night",   "point",
    "home",     "water",   "room",        "mother",   "area",       "money",  "story",   "fact",
    "month",    "lot",     "right",       "study",    "book",       "eye",    "job",     "word",
    "business", "issue",   "side",        "kind",     "head",       "house",  "service", "friend",
    "father",   "power",   "hour",        "game",     "line",       "end",    "member",  "law",
    "car",      "city",    "community",   "name",     "president",  "team",   "minute",  "idea",
    "kid",      "body",    "information", "back",     "parent",     "face",   "others",  "level",
    "office",   "door",    "health",      "person",   "art",        "war",    "history", "party",
    "result",   "change",  "morning",     "reason",   "research",   "girl",   "guy",     "moment",
    "air",      "teacher", "force",       "education"};

typedef struct work_item {
    char *prompt;       /* request text */
    int32_t input_len;  /* intended prompt tokens */
    int32_t output_len; /* max_tokens */
} work_item;

static char *make_prompt(int32_t n_tokens, uint64_t *rng, const gptoss_tokenizer *tok) {
    size_t n_words = (size_t)n_tokens + 8, cap = n_words * 16 + 1, len = 0;
    char *text = malloc(cap);
    if (!text) return NULL;
    text[0] = '\0';
    for (size_t i = 0; i < n_words; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s%s", i ? " " : "",
                                words[splitmix(rng) % (sizeof words / sizeof *words)]);
    if (!tok) { /* one token per word */
        size_t cut = 0, seen = 0;
        while (cut < len && seen < (size_t)n_tokens) {
            cut++;
            while (cut < len && text[cut] != ' ')
                cut++;
            seen++;
        }
        text[cut] = '\0';
        return text;
    }
    gptoss_tokens ids = {0};
    gptoss_error err = {0};
    char *out = NULL;
    size_t out_len = 0;
    if (gptoss_tokenizer_encode(tok, text, len, false, &ids, &err) == GPTOSS_OK) {
        size_t keep = ids.n < (size_t)n_tokens ? ids.n : (size_t)n_tokens;
        if (gptoss_tokenizer_decode(tok, ids.ids, keep, &out, &out_len, &err) != GPTOSS_OK)
            out = NULL;
    }
    gptoss_tokens_free(&ids);
    free(text);
    return out;
}

static int32_t lognormal_len(uint64_t *rng, double mean, double sigma, int32_t lo, int32_t hi) {
    double mu = log(mean) - sigma * sigma / 2;
    double x = exp(mu + sigma * normal(rng));
    int32_t v = (int32_t)llround(x);
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- one request ------------------------------------------------------------------------- */

typedef struct result {
    bool ok;                  /* HTTP 200 and a [DONE] or usage seen */
    int status;               /* HTTP status */
    double start, first, end; /* seconds (monotonic) */
    int32_t output_tokens;    /* usage.completion_tokens, else content chunks */
    int32_t prompt_tokens;    /* usage.prompt_tokens, else the intended length */
    double *itl;              /* [n_itl] gaps between content chunks, seconds */
    size_t n_itl, cap_itl;
    char error[256]; /* first error */
} result;

typedef struct stream_parse {
    result *res;
    char line[1 << 16]; /* the SSE line being assembled */
    size_t len;
    bool overflow;
    double last;    /* time of the previous content chunk */
    int32_t chunks; /* content-bearing chunks */
    bool chat;
} stream_parse;

static void on_event(stream_parse *p, const char *data) {
    if (!strcmp(data, "[DONE]")) return;
    json_t *j = json_loads(data, 0, NULL);
    if (!j) return;
    double now = gptoss_now_seconds();
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        json_t *ct = json_object_get(usage, "completion_tokens"),
               *pt = json_object_get(usage, "prompt_tokens");
        if (json_is_integer(ct)) p->res->output_tokens = (int32_t)json_integer_value(ct);
        if (json_is_integer(pt)) p->res->prompt_tokens = (int32_t)json_integer_value(pt);
    }
    json_t *err = json_object_get(j, "error");
    if (err && !p->res->error[0])
        snprintf(p->res->error, sizeof p->res->error, "stream error: %.200s", data);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    bool content = false;
    if (c0) {
        if (p->chat) {
            json_t *d = json_object_get(c0, "delta");
            const char *keys[] = {"content", "reasoning_content", "reasoning"};
            for (int k = 0; k < 3; k++) {
                json_t *v = json_object_get(d, keys[k]);
                if (json_is_string(v) && json_string_length(v) > 0) content = true;
            }
            if (json_object_get(d, "tool_calls")) content = true;
        } else {
            json_t *t = json_object_get(c0, "text");
            content = json_is_string(t) && json_string_length(t) > 0;
        }
    }
    if (content) {
        if (p->chunks == 0)
            p->res->first = now;
        else {
            result *r = p->res;
            if (r->n_itl == r->cap_itl) {
                size_t cap = r->cap_itl ? r->cap_itl * 2 : 64;
                double *grown = realloc(r->itl, cap * sizeof *grown);
                if (grown) r->itl = grown, r->cap_itl = cap;
            }
            if (r->n_itl < r->cap_itl) r->itl[r->n_itl++] = now - p->last;
        }
        p->last = now;
        p->chunks++;
    }
    json_decref(j);
}

static int on_stream_bytes(void *user, const char *data, size_t len) {
    stream_parse *p = user;
    for (size_t i = 0; i < len; i++) {
        char ch = data[i];
        if (ch == '\n') {
            p->line[p->len] = '\0';
            if (p->len && p->line[p->len - 1] == '\r') p->line[--p->len] = '\0';
            if (!p->overflow && !strncmp(p->line, "data:", 5))
                on_event(p, p->line[5] == ' ' ? p->line + 6 : p->line + 5);
            p->len = 0, p->overflow = false;
        } else if (p->len + 1 < sizeof p->line) {
            p->line[p->len++] = ch;
        } else {
            p->overflow = true;
        }
    }
    return 0;
}

typedef struct bench {
    gptoss_http_url url;
    const char *api_key;
    const char *model;
    bool chat;
    bool has_temperature, has_top_p; /* send them only when given */
    double temperature, top_p;
    int32_t logprobs;        /* alternatives asked per token (-1: no logprobs asked) */
    json_t *response_format; /* sent as is on every chat request, or NULL */
    int timeout_ms;
    work_item *items; /* [n_items] */
    result *results;  /* [n_items] */
    int32_t n_items;
    atomic_int next; /* concurrency mode: next item to send */
} bench;

static void run_one(bench *b, int32_t i) {
    work_item *w = &b->items[i];
    result *r = &b->results[i];
    json_t *req =
        json_pack("{s:s, s:b, s:{s:b}, s:i, s:b}", "model", b->model, "stream", 1, "stream_options",
                  "include_usage", 1, "max_tokens", w->output_len, "ignore_eos", 1);
    if (b->has_temperature) json_object_set_new(req, "temperature", json_real(b->temperature));
    if (b->has_top_p) json_object_set_new(req, "top_p", json_real(b->top_p));
    if (b->logprobs >= 0 && b->chat) {
        json_object_set_new(req, "logprobs", json_true());
        json_object_set_new(req, "top_logprobs", json_integer(b->logprobs));
    } else if (b->logprobs >= 0) {
        json_object_set_new(req, "logprobs", json_integer(b->logprobs));
    }
    if (b->chat) {
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", w->prompt);
        json_object_set_new(req, "messages", msgs);
        if (b->response_format) {
            /* a constrained answer ends where its value is whole: no ignore_eos */
            json_object_set(req, "response_format", b->response_format);
            json_object_del(req, "ignore_eos");
        }
    } else {
        json_object_set_new(req, "prompt", json_string(w->prompt));
    }
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    stream_parse *p = calloc(1, sizeof *p);
    if (!body || !p) {
        snprintf(r->error, sizeof r->error, "out of memory");
        free(body), free(p);
        return;
    }
    p->res = r, p->chat = b->chat;
    r->prompt_tokens = w->input_len;
    gptoss_error err = {0};
    r->start = gptoss_now_seconds();
    gptoss_status st = gptoss_http_request(
        &b->url, "POST", b->chat ? "/v1/chat/completions" : "/v1/completions", b->api_key, body,
        strlen(body), b->timeout_ms, &r->status, on_stream_bytes, p, &err);
    r->end = gptoss_now_seconds();
    if (r->output_tokens == 0) r->output_tokens = p->chunks;
    if (st != GPTOSS_OK)
        snprintf(r->error, sizeof r->error, "%s", err.message);
    else if (r->status != 200 && !r->error[0])
        snprintf(r->error, sizeof r->error, "HTTP %d", r->status);
    r->ok = st == GPTOSS_OK && r->status == 200 && !r->error[0] && p->chunks > 0;
    if (!r->ok && !r->error[0]) snprintf(r->error, sizeof r->error, "no content streamed");
    free(body);
    free(p);
}

static void *concurrency_worker(void *arg) {
    bench *b = arg;
    for (;;) {
        int32_t i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n_items) return NULL;
        run_one(b, i);
    }
}

typedef struct rate_arg {
    bench *b;
    int32_t i;
} rate_arg;

static void *rate_worker(void *arg) {
    rate_arg *a = arg;
    run_one(a->b, a->i);
    return NULL;
}

/* ---- statistics -------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct summary {
    double mean, median, p99;
} summary;

static summary summarize(double *v, size_t n) {
    summary s = {0, 0, 0};
    if (n == 0) return s;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.mean = sum / (double)n;
    s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    size_t k = (size_t)ceil(0.99 * (double)n);
    s.p99 = v[k > 0 ? k - 1 : 0];
    return s;
}

static void put_summary(json_t *o, const char *name, summary s) {
    char key[64];
    snprintf(key, sizeof key, "mean_%s_ms", name),
        json_object_set_new(o, key, json_real(s.mean * 1e3));
    snprintf(key, sizeof key, "median_%s_ms", name),
        json_object_set_new(o, key, json_real(s.median * 1e3));
    snprintf(key, sizeof key, "p99_%s_ms", name),
        json_object_set_new(o, key, json_real(s.p99 * 1e3));
}

static json_t *report(bench *b, double duration, const char *label, int32_t gpus) {
    int32_t ok = 0;
    int64_t in = 0, out = 0;
    size_t n_itl = 0;
    for (int32_t i = 0; i < b->n_items; i++) {
        result *r = &b->results[i];
        if (!r->ok) continue;
        ok++, in += r->prompt_tokens, out += r->output_tokens, n_itl += r->n_itl;
    }
    double *ttft = calloc((size_t)b->n_items + 1, sizeof *ttft),
           *tpot = calloc((size_t)b->n_items + 1, sizeof *tpot);
    double *itl = calloc(n_itl + 1, sizeof *itl);
    size_t n_ttft = 0, n_tpot = 0, k = 0;
    for (int32_t i = 0; i < b->n_items && ttft && tpot && itl; i++) {
        result *r = &b->results[i];
        if (!r->ok) continue;
        ttft[n_ttft++] = r->first - r->start;
        if (r->output_tokens > 1) tpot[n_tpot++] = (r->end - r->first) / (r->output_tokens - 1);
        for (size_t j = 0; j < r->n_itl; j++)
            itl[k++] = r->itl[j];
    }
    summary s_ttft = summarize(ttft, n_ttft), s_tpot = summarize(tpot, n_tpot),
            s_itl = summarize(itl, k);
    free(ttft), free(tpot), free(itl);
    double d = duration > 0 ? duration : 1e-9;
    printf("\n==== %s ====\n", label);
    printf("%-34s %d / %d\n", "successful requests", ok, b->n_items);
    for (int32_t i = 0, shown = 0; i < b->n_items && shown < 3; i++)
        if (!b->results[i].ok) printf("  failed request %d: %s\n", i, b->results[i].error), shown++;
    printf("%-34s %.2f\n", "benchmark duration (s)", duration);
    printf("%-34s %lld\n%-34s %lld\n", "total input tokens", (long long)in,
           "total generated tokens", (long long)out);
    printf("%-34s %.2f\n", "request throughput (req/s)", ok / d);
    printf("%-34s %.2f\n", "output token throughput (tok/s)", out / d);
    printf("%-34s %.2f\n", "total token throughput (tok/s)", (in + out) / d);
    printf("%-34s %10s %10s %10s\n", "latency (ms)", "mean", "median", "p99");
    printf("%-34s %10.2f %10.2f %10.2f\n", "time to first token", s_ttft.mean * 1e3,
           s_ttft.median * 1e3, s_ttft.p99 * 1e3);
    printf("%-34s %10.2f %10.2f %10.2f\n", "time per output token", s_tpot.mean * 1e3,
           s_tpot.median * 1e3, s_tpot.p99 * 1e3);
    printf("%-34s %10.2f %10.2f %10.2f\n", "inter-token latency", s_itl.mean * 1e3,
           s_itl.median * 1e3, s_itl.p99 * 1e3);
    fflush(stdout);
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:f, s:I, s:I, s:f, s:f, s:f}", "label", label,
                          "num_requests", b->n_items, "completed", ok, "failed", b->n_items - ok,
                          "duration_s", duration, "total_input_tokens", (json_int_t)in,
                          "total_output_tokens", (json_int_t)out, "request_throughput", ok / d,
                          "output_throughput", out / d, "total_token_throughput", (in + out) / d);
    put_summary(o, "ttft", s_ttft);
    put_summary(o, "tpot", s_tpot);
    put_summary(o, "itl", s_itl);
    json_object_set_new(o, "output_throughput_per_gpu", json_real(out / d / gpus));
    json_object_set_new(o, "total_token_throughput_per_gpu", json_real((in + out) / d / gpus));
    /* One user's decode speed: a request streams a token every median TPOT. */
    json_object_set_new(o, "tok_s_per_user",
                        json_real(s_tpot.median > 0 ? 1.0 / s_tpot.median : 0.0));
    return o;
}

/* ---- the sweep table, CSV and plot ------------------------------------------------------- */

/* One row of the table, read back from a run's JSON so every output agrees. */
typedef struct sweep_row {
    double point; /* concurrency, or request rate (INFINITY for inf) */
    int64_t requests;
    double output_tps, total_tps, output_per_gpu, total_per_gpu;
    double median_tpot_ms, per_user, median_ttft_ms, p99_tpot_ms;
} sweep_row;

static double num(json_t *run, const char *key) {
    return json_number_value(json_object_get(run, key));
}

static sweep_row sweep_row_of(json_t *run) {
    sweep_row r;
    json_t *c = json_object_get(run, "concurrency"), *rate = json_object_get(run, "request_rate");
    r.point = c ? json_number_value(c) : json_is_string(rate) ? INFINITY : json_number_value(rate);
    r.requests = json_integer_value(json_object_get(run, "completed"));
    r.output_tps = num(run, "output_throughput");
    r.total_tps = num(run, "total_token_throughput");
    r.output_per_gpu = num(run, "output_throughput_per_gpu");
    r.total_per_gpu = num(run, "total_token_throughput_per_gpu");
    r.median_tpot_ms = num(run, "median_tpot_ms");
    r.per_user = num(run, "tok_s_per_user");
    r.median_ttft_ms = num(run, "median_ttft_ms");
    r.p99_tpot_ms = num(run, "p99_tpot_ms");
    return r;
}

static void print_table(json_t *runs, bool by_concurrency, int32_t gpus) {
    printf("\n==== sweep (%d GPU%s; per user = 1000 / median TPOT) ====\n", gpus,
           gpus == 1 ? "" : "s");
    printf("%11s %8s %10s %10s %10s %10s %9s %9s %9s %9s\n",
           by_concurrency ? "concurrency" : "rate/s", "requests", "output", "total", "output",
           "total", "median", "tok/s", "median", "p99");
    printf("%11s %8s %10s %10s %10s %10s %9s %9s %9s %9s\n", "", "", "tok/s", "tok/s", "tok/s/GPU",
           "tok/s/GPU", "TPOT ms", "per user", "TTFT ms", "TPOT ms");
    for (size_t i = 0; i < json_array_size(runs); i++) {
        sweep_row r = sweep_row_of(json_array_get(runs, i));
        printf("%11g %8lld %10.1f %10.1f %10.1f %10.1f %9.2f %9.2f %9.2f %9.2f\n", r.point,
               (long long)r.requests, r.output_tps, r.total_tps, r.output_per_gpu, r.total_per_gpu,
               r.median_tpot_ms, r.per_user, r.median_ttft_ms, r.p99_tpot_ms);
    }
    fflush(stdout);
}

static gptoss_status write_csv(const char *path, json_t *runs, bool by_concurrency,
                               gptoss_error *error) {
    FILE *f = fopen(path, "w");
    if (!f)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot write: %s", path,
                                strerror(errno));
    fprintf(f,
            "%s,requests,output_tok_s,total_tok_s,output_tok_s_per_gpu,total_tok_s_per_gpu,median_"
            "tpot_ms,"
            "tok_s_per_user,median_ttft_ms,p99_tpot_ms\n",
            by_concurrency ? "concurrency" : "request_rate");
    for (size_t i = 0; i < json_array_size(runs); i++) {
        sweep_row r = sweep_row_of(json_array_get(runs, i));
        fprintf(f, "%g,%lld,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.4f,%.4f\n", r.point,
                (long long)r.requests, r.output_tps, r.total_tps, r.output_per_gpu, r.total_per_gpu,
                r.median_tpot_ms, r.per_user, r.median_ttft_ms, r.p99_tpot_ms);
    }
    if (fclose(f) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot write: %s", path,
                                strerror(errno));
    return GPTOSS_OK;
}

/* Published InferenceX points for gpt-oss-120b, 1k input / 1k output: total tok/s per GPU at
 * a given tok/s per user. */
static const struct {
    const char *label;
    double per_user, total_per_gpu;
} peer_points[] = {
    {"H100 vLLM (InferenceX 1k/1k, total tok/s)", 67, 4171},
    {"H200 TensorRT-LLM (InferenceX 1k/1k, total tok/s)", 49, 6064},
};

/* Writes s as a gnuplot single-quoted string (a quote doubles). */
static void gnuplot_string(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static bool gnuplot_found(void) {
    const char *path = getenv("PATH");
    if (!path) return false;
    char dir[4096], file[4200];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s", (int)(n < sizeof dir ? n : sizeof dir - 1), p);
        snprintf(file, sizeof file, "%s/gnuplot", n ? dir : ".");
        if (access(file, X_OK) == 0) return true;
        p += n;
        if (*p == ':') p++;
    }
    return false;
}

/* The Pareto curve: the runs no other run beats on both tok/s per user and tok/s per GPU,
 * plus every run as a labelled point, plus the published points. */
static gptoss_status write_plot(const char *path, json_t *runs, bool by_concurrency, bool total,
                                int32_t gpus, gptoss_error *error) {
    size_t n = json_array_size(runs);
    sweep_row *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++)
        rows[i] = sweep_row_of(json_array_get(runs, i));
    /* Sort by tok/s per user so the frontier is drawn left to right. */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && rows[j - 1].per_user > rows[j].per_user; j--) {
            sweep_row tmp = rows[j];
            rows[j] = rows[j - 1];
            rows[j - 1] = tmp;
        }
    /* A gnuplot that exits early must not kill us with SIGPIPE; its status says what failed. */
    void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        signal(SIGPIPE, old_pipe);
        free(rows);
        return gptoss_set_error(error, GPTOSS_ERR_IO, "cannot start gnuplot: %s", strerror(errno));
    }
    fprintf(g,
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,650 } "
            "else { set terminal png size 1000,650 }\n");
    fprintf(g, "set output ");
    gnuplot_string(g, path);
    fprintf(
        g,
        "\nset title 'gptoss bench-serve: throughput per GPU against speed per user (%d GPU%s)'\n",
        gpus, gpus == 1 ? "" : "s");
    fprintf(g, "set xlabel 'tok/s per user (1000 / median TPOT ms)'\n");
    fprintf(g, "set ylabel '%s tok/s per GPU'\n", total ? "total (input + output)" : "output");
    fprintf(g, "set grid\nset key below\nset xrange [0:*]\nset yrange [0:*]\n"
               "set offsets 0, graph 0.05, graph 0.08, 0\n");
    fprintf(g, "$runs << EOD\n");
    for (size_t i = 0; i < n; i++)
        fprintf(g, "%.6g %.6g \"%s%g\"\n", rows[i].per_user,
                total ? rows[i].total_per_gpu : rows[i].output_per_gpu,
                by_concurrency ? "c=" : "rate ", rows[i].point);
    fprintf(g, "EOD\n$frontier << EOD\n");
    for (size_t i = 0; i < n; i++) {
        double yi = total ? rows[i].total_per_gpu : rows[i].output_per_gpu;
        bool beaten = false;
        for (size_t j = 0; j < n && !beaten; j++) {
            double yj = total ? rows[j].total_per_gpu : rows[j].output_per_gpu;
            beaten = j != i && rows[j].per_user >= rows[i].per_user && yj >= yi &&
                     (rows[j].per_user > rows[i].per_user || yj > yi);
        }
        if (!beaten) fprintf(g, "%.6g %.6g\n", rows[i].per_user, yi);
    }
    fprintf(g, "EOD\n$peers << EOD\n");
    for (size_t i = 0; i < sizeof peer_points / sizeof *peer_points; i++)
        fprintf(g, "%g %g \"%s\"\n", peer_points[i].per_user, peer_points[i].total_per_gpu,
                peer_points[i].label);
    fprintf(g, "EOD\n");
    fprintf(g,
            "plot $frontier using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'gptoss (Pareto "
            "frontier)', \\\n"
            "     $runs using 1:2 with points pt 7 ps 1.2 lc rgb '#1f77b4' notitle, \\\n"
            "     $runs using 1:2:3 with labels offset 0.8,0.8 left notitle, \\\n"
            "     $peers using 1:2 with points pt 9 ps 2 lc rgb '#d62728' title 'published (total "
            "tok/s per GPU)', \\\n"
            "     $peers using 1:2:3 with labels offset -1.5,0 right tc rgb '#d62728' notitle\n");
    free(rows);
    int rc = pclose(g);
    signal(SIGPIPE, old_pipe);
    if (rc != 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: gnuplot failed (status %d)", path, rc);
    if (access(path, F_OK) != 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: gnuplot wrote no file", path);
    return GPTOSS_OK;
}

/* ---- driver ------------------------------------------------------------------------------ */

static int body_to_buf(void *user, const char *data, size_t len) {
    char **buf = user;
    size_t old = *buf ? strlen(*buf) : 0;
    if (old + len > (1 << 20)) return 1;
    char *grown = realloc(*buf, old + len + 1);
    if (!grown) return 1;
    memcpy(grown + old, data, len);
    grown[old + len] = '\0';
    *buf = grown;
    return 0;
}

static bool parse_levels(const char *text, int32_t *levels, int *n) {
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 100000 || *n == MAX_LEVELS) return false;
        levels[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return false;
    }
    return *n > 0;
}

static void reset_results(bench *b) {
    for (int32_t i = 0; i < b->n_items; i++) {
        free(b->results[i].itl);
        memset(&b->results[i], 0, sizeof b->results[i]);
    }
    atomic_store(&b->next, 0);
}

int gptoss_cmd_bench_serve(int argc, char **argv) {
    const char *url_text = NULL, *model = NULL, *api_key = NULL, *json_path = NULL,
               *levels_text = NULL, *rate_text = NULL, *csv_path = NULL, *plot_path = NULL;
    int endpoint = 0, plot_metric = 0; /* completions, total */
    int64_t n_requests = 0, input_len = 0, output_len = 0, seed = 0, timeout_s = 600, gpus = 1;
    bool sharegpt = false;
    int64_t logprobs = -1, per_client = 0;
    double temperature = -1, top_p = 0; /* out of their ranges: not sent */
    const char *response_format_path = NULL;
    static const char *const endpoints[] = {"completions", "chat", NULL};
    static const char *const plot_metrics[] = {"total", "output", NULL};
    const cli_option run_options[] = {
        {.name = "url",
         .kind = CLI_STRING,
         .target = &url_text,
         .value = "URL",
         .help = "server base, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)"},
        {.name = "model",
         .kind = CLI_STRING,
         .target = &model,
         .value = "NAME",
         .help = "model id (default: the first of GET /v1/models)"},
        {.name = "api-key",
         .kind = CLI_STRING,
         .target = &api_key,
         .value = "KEY",
         .help = "sent as 'Authorization: Bearer KEY'"},
        {.name = "endpoint",
         .kind = CLI_ENUM,
         .target = &endpoint,
         .choices = endpoints,
         .help = "completions (default) or chat",
         .error = "--endpoint must be completions or chat"},
        {.name = "concurrency",
         .kind = CLI_STRING,
         .target = &levels_text,
         .value = "LIST",
         .help = "clients in flight, one run per value (e.g. 1,8,64)"},
        {.name = "request-rate",
         .kind = CLI_STRING,
         .target = &rate_text,
         .value = "R",
         .help = "Poisson arrivals at R requests/s instead (inf = all at once)"},
        {.name = "num-requests",
         .kind = CLI_INT,
         .target = &n_requests,
         .value = "N",
         .lo = 1,
         .hi = 1 << 24,
         .help = "requests per run",
         .error = "--num-requests needs a positive integer"},
        {.name = "input-len",
         .kind = CLI_INT,
         .target = &input_len,
         .value = "I",
         .lo = 1,
         .hi = 1 << 20,
         .help = "prompt tokens (random words; exact when the gpt-oss tokenizer is found)",
         .error = "--input-len needs a positive integer"},
        {.name = "output-len",
         .kind = CLI_INT,
         .target = &output_len,
         .value = "O",
         .lo = 1,
         .hi = 1 << 20,
         .help = "generated tokens (ignore_eos + max_tokens)",
         .error = "--output-len needs a positive integer"},
        {.name = "sharegpt-like",
         .kind = CLI_FLAG,
         .target = &sharegpt,
         .help = "lognormal lengths: mean ~215 prompt and ~200 output tokens, long tail"},
        {.name = "temperature",
         .kind = CLI_DOUBLE,
         .target = &temperature,
         .value = "T",
         .dlo = 0,
         .dhi = 2,
         .help = "send temperature T (0 = greedy); default: not sent, the server's\n"
                 "default applies, as for a client that does not set it",
         .error = "--temperature needs a number in [0, 2] (0 = greedy)"},
        {.name = "top-p",
         .kind = CLI_DOUBLE,
         .target = &top_p,
         .value = "P",
         .dlo = 0,
         .dhi = 1,
         .lo_open = true,
         .help = "send top_p P in (0, 1]; default: not sent",
         .error = "--top-p needs a number in (0, 1]"},
        {.name = "logprobs",
         .kind = CLI_INT,
         .target = &logprobs,
         .value = "N",
         .lo = 0,
         .hi = 20,
         .help = "ask for logprobs with N alternatives per token (0..20) on every\n"
                 "request; default: not asked",
         .error = "--logprobs needs an integer in [0, 20]"},
        {.name = "response-format",
         .kind = CLI_STRING,
         .target = &response_format_path,
         .value = "FILE",
         .help = "send FILE's JSON object as response_format on every request\n"
                 "(chat endpoint; e.g. a json_schema: structured output's cost);\n"
                 "such requests end where the answer is whole (no ignore_eos)"},
        {.name = "requests-per-client",
         .kind = CLI_INT,
         .target = &per_client,
         .value = "K",
         .lo = 1,
         .hi = 1 << 20,
         .help = "with --concurrency: each run sends min(N, K x concurrency)\n"
                 "requests (K per client), not N at every level",
         .error = "--requests-per-client needs a positive integer"},
        {.name = "seed",
         .kind = CLI_INT,
         .target = &seed,
         .value = "S",
         .lo = 0,
         .hi = INT64_MAX,
         .help = "workload seed (default 0)",
         .error = "--seed needs a non-negative integer"},
        {.name = "timeout",
         .kind = CLI_INT,
         .target = &timeout_s,
         .value = "S",
         .lo = 1,
         .hi = 86400,
         .help = "per-request socket timeout in seconds (default 600)",
         .error = "--timeout needs seconds in [1, 86400]"},
    };
    const cli_option report_options[] = {
        {.name = "gpus",
         .kind = CLI_INT,
         .target = &gpus,
         .value = "N",
         .lo = 1,
         .hi = 4096,
         .help = "GPUs behind the URL; the per-GPU columns divide by N (default 1)",
         .error = "--gpus needs a positive integer"},
        {.name = "json",
         .kind = CLI_STRING,
         .target = &json_path,
         .value = "FILE",
         .help = "also write the results (every run, with the table's fields) as JSON"},
        {.name = "csv",
         .kind = CLI_STRING,
         .target = &csv_path,
         .value = "FILE",
         .help = "also write the table as CSV"},
        {.name = "plot",
         .kind = CLI_STRING,
         .target = &plot_path,
         .value = "FILE.png",
         .help = "draw the Pareto curve with gnuplot: x tok/s per user, y tok/s per GPU,\n"
                 "with published InferenceX 1k/1k points (H100 vLLM, H200 TensorRT-LLM)"},
        {.name = "plot-metric",
         .kind = CLI_ENUM,
         .target = &plot_metric,
         .choices = plot_metrics,
         .help = "y axis: total (default; the published points are total tok/s) or\n"
                 "output",
         .error = "--plot-metric must be total or output"},
    };
    const cli_option_group groups[] = {
        {run_options, sizeof run_options / sizeof run_options[0], NULL},
        {report_options, sizeof report_options / sizeof report_options[0],
         "\nAfter the runs a table has one row per run: concurrency, completed requests, output "
         "and\n"
         "total tok/s, both per GPU, median TPOT, tok/s per user (1000 / median TPOT), median "
         "TTFT\n"
         "and p99 TPOT.\n"},
    };
    bool want_help;
    int usage = cli_parse_options("bench-serve", argc, argv, groups, 2, &want_help);
    if (usage) return usage;
    if (want_help) {
        help(stdout, groups, 2);
        return 0;
    }
    bool has_temperature = temperature >= 0, has_top_p = top_p > 0;
    if (!url_text)
        return cli_usage_error("bench-serve", "missing --url (e.g. http://127.0.0.1:8000)");
    if (!n_requests) return cli_usage_error("bench-serve", "missing --num-requests N");
    if (!!levels_text == !!rate_text)
        return cli_usage_error("bench-serve",
                               "give exactly one of --concurrency LIST or --request-rate R");
    if (sharegpt == (input_len && output_len) || (!sharegpt && (!input_len || !output_len)))
        return cli_usage_error("bench-serve",
                               "give --input-len I and --output-len O, or --sharegpt-like");
    int32_t levels[MAX_LEVELS];
    int n_levels = 0;
    double rate = 0;
    if (levels_text && !parse_levels(levels_text, levels, &n_levels))
        return cli_usage_error(
            "bench-serve",
            "--concurrency needs positive integers separated by commas (e.g. 1,8,64)");
    if (rate_text) {
        char *end = NULL;
        rate = !strcmp(rate_text, "inf") ? INFINITY : strtod(rate_text, &end);
        if ((end && *end) || !(rate > 0))
            return cli_usage_error("bench-serve", "--request-rate needs a positive number or inf");
    }

    bench b;
    memset(&b, 0, sizeof b);
    gptoss_error err = {0};
    if (gptoss_http_url_parse(url_text, &b.url, &err) != GPTOSS_OK) return cli_fail(&err);
    size_t plen = strlen(b.url.path_prefix);
    if (plen >= 3 && !strcmp(b.url.path_prefix + plen - 3, "/v1"))
        b.url.path_prefix[plen - 3] = '\0';
    b.api_key = api_key, b.chat = endpoint == 1, b.timeout_ms = (int)(timeout_s * 1000);
    b.has_temperature = has_temperature, b.temperature = temperature;
    b.logprobs = (int32_t)logprobs;
    b.has_top_p = has_top_p, b.top_p = top_p;
    if (response_format_path) {
        if (!b.chat)
            return cli_usage_error("bench-serve", "--response-format needs --endpoint chat");
        json_error_t jerr;
        b.response_format = json_load_file(response_format_path, 0, &jerr);
        if (!json_is_object(b.response_format)) {
            json_decref(b.response_format);
            fprintf(stderr, "gptoss bench-serve: %s: %s\n", response_format_path,
                    b.response_format ? "expected a JSON object" : jerr.text);
            return 1;
        }
    }

    char *models_body = NULL;
    json_t *models_json = NULL;
    if (!model) {
        int status = 0;
        if (gptoss_http_request(&b.url, "GET", "/v1/models", api_key, NULL, 0, 30000, &status,
                                body_to_buf, &models_body, &err) != GPTOSS_OK) {
            free(models_body);
            return cli_fail(&err);
        }
        models_json = models_body ? json_loads(models_body, 0, NULL) : NULL;
        free(models_body);
        json_t *id = json_object_get(json_array_get(json_object_get(models_json, "data"), 0), "id");
        if (status != 200 || !json_is_string(id)) {
            json_decref(models_json);
            gptoss_set_error(&err, GPTOSS_ERR_IO,
                             "GET /v1/models answered %d without a model id; pass --model NAME",
                             status);
            return cli_fail(&err);
        }
        model = json_string_value(id);
    }
    b.model = model;

    /* The workload is the same for every run of this command. */
    gptoss_tokenizer *tok = NULL;
    char tok_dir[4096];
    if (cli_find_tokenizer_dir(tok_dir, sizeof tok_dir)) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer.json", tok_dir);
        if (gptoss_tokenizer_load(path, &tok, &err) != GPTOSS_OK) tok = NULL;
    }
    if (!tok)
        GPTOSS_LOG_W("bench-serve",
                     "gpt-oss tokenizer not found; prompts assume one token per word");
    b.n_items = (int32_t)n_requests;
    b.items = calloc((size_t)b.n_items, sizeof *b.items);
    b.results = calloc((size_t)b.n_items, sizeof *b.results);
    uint64_t rng = (uint64_t)seed * 0x2545F4914F6CDD1Dull + 1;
    int rc = 1;
    json_t *runs = json_array();
    if (!b.items || !b.results) {
        gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        rc = cli_fail(&err);
        goto done;
    }
    for (int32_t i = 0; i < b.n_items; i++) {
        work_item *w = &b.items[i];
        w->input_len = sharegpt ? lognormal_len(&rng, 215, 0.9, 4, 4096) : (int32_t)input_len;
        w->output_len = sharegpt ? lognormal_len(&rng, 200, 0.8, 1, 2048) : (int32_t)output_len;
        w->prompt = make_prompt(w->input_len, &rng, tok);
        if (!w->prompt) {
            gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory building prompts");
            rc = cli_fail(&err);
            goto done;
        }
    }
    char sampling[96] = "server's default sampling";
    if (has_temperature && has_top_p)
        snprintf(sampling, sizeof sampling, "temperature %g, top_p %g", temperature, top_p);
    else if (has_temperature)
        snprintf(sampling, sizeof sampling, "temperature %g", temperature);
    else if (has_top_p)
        snprintf(sampling, sizeof sampling, "top_p %g", top_p);
    GPTOSS_LOG_I("bench-serve", "%s/v1/%s model '%s', %d requests per run, %s", url_text,
                 b.chat ? "chat/completions" : "completions", model, b.n_items, sampling);
    int n_runs = levels_text ? n_levels : 1;
    const int32_t n_items_all = b.n_items;
    for (int run = 0; run < n_runs; run++) {
        b.n_items = n_items_all;
        reset_results(&b);
        if (levels_text && per_client > 0 && per_client * levels[run] < n_items_all)
            b.n_items = (int32_t)(per_client * levels[run]);
        char label[64];
        double t0 = gptoss_now_seconds();
        if (levels_text) {
            int32_t c = levels[run] < b.n_items ? levels[run] : b.n_items;
            if (levels[run] > b.n_items)
                GPTOSS_LOG_W("bench-serve",
                             "concurrency %d is more than --num-requests %d: at most %d in flight",
                             levels[run], b.n_items, b.n_items);
            snprintf(label, sizeof label, "concurrency %d", levels[run]);
            pthread_t *th = calloc((size_t)c, sizeof *th);
            int32_t started = 0;
            for (int32_t t = 0; th && t < c; t++)
                if (pthread_create(&th[t], NULL, concurrency_worker, &b) == 0) started++;
            if (started == 0) concurrency_worker(&b);
            for (int32_t t = 0; t < started; t++)
                pthread_join(th[t], NULL);
            free(th);
        } else {
            snprintf(label, sizeof label, "request rate %g/s", rate);
            pthread_t *th = calloc((size_t)b.n_items, sizeof *th);
            rate_arg *args = calloc((size_t)b.n_items, sizeof *args);
            bool *live = calloc((size_t)b.n_items, sizeof *live);
            uint64_t arrivals = (uint64_t)seed + 77;
            for (int32_t i = 0; th && args && live && i < b.n_items; i++) {
                if (isfinite(rate) && i > 0) {
                    double gap = -log(uniform01(&arrivals)) / rate;
                    struct timespec ts = {(time_t)gap, (long)((gap - floor(gap)) * 1e9)};
                    nanosleep(&ts, NULL);
                }
                args[i] = (rate_arg){&b, i};
                live[i] = pthread_create(&th[i], NULL, rate_worker, &args[i]) == 0;
                if (!live[i]) run_one(&b, i);
            }
            for (int32_t i = 0; th && live && i < b.n_items; i++)
                if (live[i]) pthread_join(th[i], NULL);
            free(th), free(args), free(live);
        }
        double duration = gptoss_now_seconds() - t0;
        json_t *o = report(&b, duration, label, (int32_t)gpus);
        if (levels_text)
            json_object_set_new(o, "concurrency", json_integer(levels[run]));
        else
            json_object_set_new(o, "request_rate",
                                isfinite(rate) ? json_real(rate) : json_string("inf"));
        json_array_append_new(runs, o);
    }
    b.n_items = n_items_all;
    rc = 0;
    for (size_t i = 0; i < json_array_size(runs); i++)
        if (json_integer_value(json_object_get(json_array_get(runs, i), "completed")) == 0) rc = 1;
    print_table(runs, levels_text != NULL, (int32_t)gpus);
    if (csv_path && write_csv(csv_path, runs, levels_text != NULL, &err) != GPTOSS_OK)
        rc = cli_fail(&err);
    if (json_path) {
        json_t *doc = json_pack("{s:s, s:s, s:s, s:I, s:b, s:O}", "url", url_text, "model", model,
                                "endpoint", endpoints[endpoint], "seed", (json_int_t)seed,
                                "sharegpt_like", sharegpt, "runs", runs);
        if (!sharegpt) {
            json_object_set_new(doc, "input_len", json_integer(input_len));
            json_object_set_new(doc, "output_len", json_integer(output_len));
        }
        json_object_set_new(doc, "gpus", json_integer(gpus));
        if (has_temperature) json_object_set_new(doc, "temperature", json_real(temperature));
        if (has_top_p) json_object_set_new(doc, "top_p", json_real(top_p));
        if (json_dump_file(doc, json_path, JSON_INDENT(2)) != 0) {
            gptoss_set_error(&err, GPTOSS_ERR_IO, "%s: cannot write", json_path);
            rc = cli_fail(&err);
        }
        json_decref(doc);
    }
    if (plot_path) {
        if (!gnuplot_found()) {
            GPTOSS_LOG_W("bench-serve",
                         "gnuplot is not installed (Debian: apt-get install gnuplot-nox), so %s "
                         "was not drawn; "
                         "the table%s above is complete",
                         plot_path,
                         csv_path && json_path ? ", CSV and JSON"
                         : csv_path            ? " and CSV"
                         : json_path           ? " and JSON"
                                               : "");
        } else if (write_plot(plot_path, runs, levels_text != NULL, plot_metric == 0, (int32_t)gpus,
                              &err) != GPTOSS_OK) {
            rc = cli_fail(&err);
        }
    }
done:
    reset_results(&b);
    for (int32_t i = 0; b.items && i < b.n_items; i++)
        free(b.items[i].prompt);
    free(b.items);
    free(b.results);
    json_decref(runs);
    json_decref(models_json);
    json_decref(b.response_format);
    gptoss_tokenizer_free(tok);
    return rc;
}
