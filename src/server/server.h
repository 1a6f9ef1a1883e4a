/*
 * server.h - the OpenAI-compatible HTTP server (libmicrohttpd + jansson).
 *
 * Owns: the listening socket, the HTTP routes (/v1/chat/completions, /v1/completions,
 * /v1/responses, /v1/models, /health, /metrics), API-key checks, request bodies and their limits,
 * and the per-connection streaming state. It turns HTTP requests into engine submissions and engine
 * events into OpenAI JSON / server-sent events. Must not load models or run forward passes:
 * the caller (cmd_serve.c) owns the model, backend, tokenizer and engine and hands them over
 * once they are ready.
 *
 * Threads: libmicrohttpd runs one thread per connection; a connection thread sleeps until the
 * engine signals new events for its request or its client hangs up (which cancels the
 * generation). Each request leaves one access-log line (util/log.h).
 */
#ifndef GPTOSS_SERVER_H
#define GPTOSS_SERVER_H

#include "gptoss_engine.h"
#include "gptoss.h"
#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gptoss_server_options {
    const char *host;              /* listen address (IPv4 dotted quad or "localhost") */
    int port;                      /* 0 = any free port (see gptoss_server_port) */
    const char *api_key;           /* NULL or "": no authentication */
    const char *served_model_name; /* the model id clients must name */
    size_t max_body_bytes;         /* larger request bodies get 413 */
    unsigned connection_timeout_s; /* idle connections (slow clients) are closed after this */
    size_t responses_store_bytes;  /* /v1/responses records kept for GET and chaining */
} gptoss_server_options;

/* Defaults: 127.0.0.1:8000, no key, model "gpt-oss", 8 MiB bodies, 120 s idle timeout, 64 MiB
 * of stored responses. */
gptoss_server_options gptoss_server_options_default(void);

typedef struct gptoss_server gptoss_server;

/* Starts listening at once; until gptoss_server_set_ready, /health and the API answer 503.
 * Strings in options are copied. */
gptoss_status gptoss_server_start(const gptoss_server_options *options, gptoss_server **out,
                                  gptoss_error *error);

/* The port actually bound. */
int gptoss_server_port(const gptoss_server *server);

/* Hands over a started engine and the tokenizer (both must outlive the server) and starts
 * serving. max_model_len bounds prompt + generated tokens (for validation messages). */
void gptoss_server_set_ready(gptoss_server *server, gptoss_engine *engine,
                             const gptoss_tokenizer *tokenizer, int32_t max_model_len,
                             int32_t max_num_seqs);

/* Draining (SIGTERM): /health answers 503, new API requests are refused with 503, requests
 * already running go on. */
void gptoss_server_set_draining(gptoss_server *server);

/* HTTP requests whose response has not been fully sent yet. */
int64_t gptoss_server_active_requests(const gptoss_server *server);

/* Stops listening, closes every connection and frees the server. NULL ok. */
void gptoss_server_stop(gptoss_server *server);

#endif
