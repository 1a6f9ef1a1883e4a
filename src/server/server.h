/*
 * server.h - the OpenAI-compatible HTTP server (libmicrohttpd + jansson).
 *
 * Owns: the listening socket, the HTTP routes (/v1/chat/completions, /v1/completions,
 * /v1/responses, /v1/models, /health, /metrics), API-key checks, request bodies and their limits,
 * and the per-connection streaming state. It turns HTTP requests into engine submissions and engine
 * events into OpenAI JSON / server-sent events. Must not load models or run forward passes:
 * the caller (cmd_serve.c) owns the model, backends, tokenizer and engines (one, or one per
 * GPU for data parallel serving) and hands them over once they are ready. GET / is the chat
 * page (webui.c, web/).
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
    const char *host;                /* listen address (IPv4 dotted quad or "localhost") */
    int port;                        /* 0 = any free port (see gptoss_server_port) */
    const char *api_key;             /* NULL or "": no authentication */
    const char *served_model_name;   /* the model id clients must name */
    size_t max_body_bytes;           /* larger request bodies get 413 */
    unsigned connection_timeout_s;   /* idle connections (slow clients) are closed after this */
    unsigned max_connections;        /* open connections (a thread each); more are refused */
    unsigned max_connections_per_ip; /* per client address; 0: no limit of its own */
    const char *allowed_origins;     /* CORS: "a,b", "*", or NULL/"" for none */
    bool webui;                      /* GET / serves the chat page; false: 404 */
    size_t responses_store_bytes;    /* /v1/responses records kept for GET and chaining */
} gptoss_server_options;

/* Defaults: 127.0.0.1:8000, no key, model "gpt-oss", 8 MiB bodies, 120 s idle timeout, 2048
 * connections, no CORS origins, the chat page on,
 * 64 MiB of stored responses. */
gptoss_server_options gptoss_server_options_default(void);

typedef struct gptoss_server gptoss_server;

/* Starts listening at once; until gptoss_server_set_ready, /health and the API answer 503.
 * Strings in options are copied. */
gptoss_status gptoss_server_start(const gptoss_server_options *options, gptoss_server **out,
                                  gptoss_error *error);

/* The port actually bound. */
int gptoss_server_port(const gptoss_server *server);

/* Hands over n_engines started engines (data parallel: one per device, all serving the same
 * model with the same KV block size) and the tokenizer, all of which must outlive the server,
 * and starts serving; /health answers 200 from here on. Each request goes to one engine,
 * chosen by src/server/router.h (prefix affinity, else the least loaded). max_model_len bounds
 * prompt + generated tokens (for validation messages). Fails only when out of memory. */
gptoss_status gptoss_server_set_ready(gptoss_server *server, gptoss_engine *const *engines,
                                      int32_t n_engines, const gptoss_tokenizer *tokenizer,
                                      int32_t max_model_len, int32_t max_num_seqs,
                                      int32_t kv_block_size, gptoss_error *error);

/* Draining (SIGTERM): /health answers 503, new API requests are refused with 503, requests
 * already running go on. */
void gptoss_server_set_draining(gptoss_server *server);

/* HTTP requests whose response has not been fully sent yet. */
int64_t gptoss_server_active_requests(const gptoss_server *server);

/* The drain timed out: ends every generation in flight. Each is cancelled in the engine and
 * its response ends as if max_tokens had been reached (finish_reason "length"; a stream
 * still sends its last chunk and `data: [DONE]`). Call gptoss_server_wait_idle next. */
void gptoss_server_cut(gptoss_server *server);

/* Waits until every HTTP request was answered in full (true) or the clock
 * (gptoss_now_seconds) passes `deadline` (false). */
bool gptoss_server_wait_idle(gptoss_server *server, double deadline);

/* Stops listening, closes every connection and frees the server. NULL ok. */
void gptoss_server_stop(gptoss_server *server);

#endif
