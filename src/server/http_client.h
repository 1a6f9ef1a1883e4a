/*
 * http_client.h - a minimal blocking HTTP/1.1 client for the load generator and tests.
 *
 * Owns: one TCP connection per call (Connection: close), the request bytes, the status line
 * and headers of the response, and de-chunking. The body is handed to a callback as it
 * arrives, so server-sent events can be timed token by token. Plain http:// only; must not
 * grow into a general client (no redirects, no TLS, no keep-alive).
 */
#ifndef GPTOSS_SERVER_HTTP_CLIENT_H
#define GPTOSS_SERVER_HTTP_CLIENT_H

#include "gptoss.h"

#include <stddef.h>

typedef struct gptoss_http_url {
    char host[256];        /* host name or address, without brackets */
    char port[8];          /* decimal port ("80" when the URL names none) */
    char path_prefix[512]; /* path of the URL without a trailing '/', e.g. "" or "/v1" */
} gptoss_http_url;

/* Parses "http://host[:port][/path]". */
gptoss_status gptoss_http_url_parse(const char *url, gptoss_http_url *out, gptoss_error *error);

/* Receives body bytes as they arrive (already de-chunked). Returns 0 to go on, non-zero to
 * stop reading (the call then returns GPTOSS_OK). */
typedef int (*gptoss_http_body_fn)(void *user, const char *data, size_t len);

/* Sends METHOD prefix+path with an optional JSON body (NULL for none) and an optional bearer
 * key, then reads the response: *status gets the HTTP status and on_body the body. Every
 * socket wait is bounded by timeout_ms. GPTOSS_ERR_IO for connection or protocol failures. */
gptoss_status gptoss_http_request(const gptoss_http_url *url, const char *method, const char *path,
                                  const char *api_key, const char *body, size_t body_len,
                                  int timeout_ms, int *status, gptoss_http_body_fn on_body,
                                  void *user, gptoss_error *error);

#endif
