/*
 * server_internal.h - what server.c (HTTP plumbing, routes), metrics.c and the endpoints
 * (api_call.c and its encoders) share. Not a public interface: nothing outside src/server
 * includes it.
 */
#ifndef GPTOSS_SERVER_INTERNAL_H
#define GPTOSS_SERVER_INTERNAL_H

#include "server/server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

/* A histogram updated by connection threads without a lock (metrics.c): one relaxed atomic
 * add per bucket hit and one for the sum. */
#define SERVER_HISTOGRAM_BUCKETS 24
typedef struct server_histogram {
    const double *bounds; /* [n_bounds] upper bounds; bucket n_bounds is +Inf */
    int n_bounds;
    atomic_ullong buckets[SERVER_HISTOGRAM_BUCKETS]; /* per bucket, not cumulative */
    atomic_ullong sum_micro;                         /* sum of observations x 1e6 */
} server_histogram;

struct gptoss_server {
    struct MHD_Daemon *daemon;           /* the listening daemon, thread per connection */
    char *host;                          /* copy of options.host */
    char *api_key;                       /* copy, or NULL: no authentication */
    size_t api_key_len;                  /* bytes of api_key */
    char *model_name;                    /* served model id */
    char *allowed_origins;               /* CORS: copy of "a,b" or "*", NULL: none */
    size_t max_body_bytes;               /* request bodies beyond this: 413 */
    int port;                            /* bound port */
    uint64_t id_salt;                    /* makes response ids unique across restarts */
    int64_t created_unix;                /* start time, for /v1/models "created" */
    gptoss_engine **engines;             /* [n_engines], set before `ready` is published */
    int32_t n_engines;                   /* 1, or --data-parallel-size */
    struct server_router *router;        /* picks each request's engine (router.h) */
    const gptoss_tokenizer *tokenizer;   /* idem */
    int32_t max_model_len;               /* prompt + generated tokens per sequence */
    int32_t max_num_seqs;                /* bound for `n` */
    bool webui;                          /* GET / serves the chat page (webui.c) */
    atomic_bool ready;                   /* engine handed over (release/acquire) */
    atomic_bool draining;                /* SIGTERM seen */
    atomic_bool cut;                     /* the drain timed out: generations are being ended */
    pthread_mutex_t calls_lock;          /* guards calls */
    struct api_call *calls;              /* generations in flight (api_call.c), for the cut */
    atomic_llong active_requests;        /* HTTP requests not yet completed */
    atomic_ullong responses_by_class[6]; /* [1xx..5xx] counts, index status/100 */
    atomic_ullong next_request_id;       /* generated x-request-id values */
    struct {
        server_histogram e2e, queue, tpot, prompt_tokens, generation_tokens;
    } hist;                           /* finished generation requests (metrics.c) */
    struct response_store *responses; /* /v1/responses records (response_store.h) */
};

/* The statistics of every engine summed (counters, gauges and histograms; `draining` when any
 * engine drains). Only while `ready`. */
void server_engine_stats(gptoss_server *server, gptoss_engine_stats *stats);

/* Retry-After of a 429 (queue full) and of a 503 while the model loads: a client that honours
 * it comes back soon enough to find room, without hammering a full queue. */
#define SERVER_RETRY_AFTER_SECONDS "1"

/* An HTTP answer built by an endpoint: status + response (owned by the caller). */
typedef struct server_reply {
    unsigned status;
    struct MHD_Response *response;
} server_reply;

/* {"error":{"message","type","param","code"}} with the given status. param/code may be NULL. */
server_reply server_error(unsigned status, const char *type, const char *param, const char *code,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A JSON body (takes ownership of `body`). */
server_reply server_json(unsigned status, json_t *body);

/* A JSON string from arbitrary bytes: invalid UTF-8 becomes U+FFFD. NULL on out-of-memory. */
json_t *server_json_text(const char *bytes, size_t len);

/* Whether the client of `connection` hung up (a read of the socket sees EOF or an error). */
bool server_client_gone(struct MHD_Connection *connection);

/* Exempts a connection from the idle timeout (connection_timeout_s), which is meant for
 * clients that stall while sending a request: a queued or generating request may send nothing
 * for minutes, and its connection thread watches for a client that left (server_client_gone). */
void server_hold_connection(struct MHD_Connection *connection);

/* One request's access-log line, written when the last holder lets go: the connection
 * (when libmicrohttpd completes the request) and a generation call (when its last byte
 * was produced). Level: info, warn for 4xx, error for 5xx. It also carries the request id
 * (the client's x-request-id when valid, else a generated one), echoed on every response. */
#define SERVER_REQUEST_ID_MAX 128
typedef struct server_access server_access;
server_access *server_access_hold(server_access *access);
void server_access_release(server_access *access);
void server_access_set_tokens(server_access *access, int32_t prompt, int32_t completion);
void server_access_set_note(server_access *access, const char *note); /* static string */
void server_access_set_model(server_access *access);   /* the request named the served model */
void server_access_first_token(server_access *access); /* a token arrived (the first counts) */

/* What a route handler gets besides the server. */
typedef struct server_request {
    struct MHD_Connection *connection;
    const char *url;
    const char *method; /* "GET", "POST", ... */
    const char *body;   /* NUL-terminated, [len] bytes */
    size_t len;
    server_access *access;
} server_request;

/* Route handlers (method, auth, body size and readiness were checked by server.c). */
server_reply server_chat_completions(gptoss_server *server, const server_request *request);
server_reply server_completions(gptoss_server *server, const server_request *request);
server_reply server_metrics(gptoss_server *server, const server_request *request);
server_reply server_webui(gptoss_server *server, const server_request *request);

/* Sets the histograms' bounds (server start). */
void server_metrics_init(gptoss_server *server);

/* A generation request ended: its latencies (a negative one is left out) and token counts. */
void server_metrics_observe(gptoss_server *server, double e2e_seconds, double queue_seconds,
                            double tpot_seconds, int32_t prompt_tokens, int32_t generation_tokens);
server_reply server_responses_create(gptoss_server *server, const server_request *request);
server_reply server_responses_item(gptoss_server *server, const server_request *request);

/* A response over a copy of `text`. */
struct MHD_Response *server_buffer_response(const char *text, size_t len, const char *content_type);

#endif
