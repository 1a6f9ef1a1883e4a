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
#include <stdatomic.h>

struct gptoss_server {
    struct MHD_Daemon *daemon;           /* the listening daemon, thread per connection */
    char *host;                          /* copy of options.host */
    char *api_key;                       /* copy, or NULL: no authentication */
    size_t api_key_len;                  /* bytes of api_key */
    char *model_name;                    /* served model id */
    size_t max_body_bytes;               /* request bodies beyond this: 413 */
    int port;                            /* bound port */
    uint64_t id_salt;                    /* makes response ids unique across restarts */
    int64_t created_unix;                /* start time, for /v1/models "created" */
    gptoss_engine *engine;               /* set once before `ready` is published */
    const gptoss_tokenizer *tokenizer;   /* idem */
    int32_t max_model_len;               /* prompt + generated tokens per sequence */
    int32_t max_num_seqs;                /* bound for `n` */
    atomic_bool ready;                   /* engine handed over (release/acquire) */
    atomic_bool draining;                /* SIGTERM seen */
    atomic_llong active_requests;        /* HTTP requests not yet completed */
    atomic_ullong responses_by_class[6]; /* [1xx..5xx] counts, index status/100 */
    struct response_store *responses;    /* /v1/responses records (response_store.h) */
};

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
 * (when libmicrohttpd completes the request) and a streaming response (when its last byte
 * was produced). Level: info, warn for 4xx, error for 5xx. */
typedef struct server_access server_access;
server_access *server_access_hold(server_access *access);
void server_access_release(server_access *access);
void server_access_set_tokens(server_access *access, int32_t prompt, int32_t completion);
void server_access_set_note(server_access *access, const char *note); /* static string */

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
server_reply server_responses_create(gptoss_server *server, const server_request *request);
server_reply server_responses_item(gptoss_server *server, const server_request *request);

/* A response over a copy of `text`. */
struct MHD_Response *server_buffer_response(const char *text, size_t len, const char *content_type);

#endif
