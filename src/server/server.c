/*
 * server.c - HTTP plumbing of the OpenAI-compatible server: the libmicrohttpd daemon,
 * request bodies (with their size limit), routing, API keys, errors, the access log, /health
 * and /v1/models.
 *
 * Owns: connection state (the body being uploaded), the route table, the access log and the
 * server's counters. The generation endpoints live in api_chat.c, api_completions.c and
 * api_responses.c (over api_call.c and generation.c), /metrics in metrics.c. A connection thread
 * blocks only on its client and its request's events; every request, however malformed, gets an
 * OpenAI-style error.
 */
#include "server/server_internal.h"

#include "server/engines.h"
#include "server/response_store.h"

#include "util/utf8.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>

gptoss_server_options gptoss_server_options_default(void) {
    gptoss_server_options o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8000;
    o.served_model_name = "gpt-oss";
    o.max_body_bytes = 8u << 20;
    o.connection_timeout_s = 120;
    o.webui = true;
    o.max_connections = 2048;
    o.responses_store_bytes = (size_t)64 << 20;
    return o;
}

/* ---- replies ------------------------------------------------------------------------------ */

struct MHD_Response *server_buffer_response(const char *text, size_t len,
                                            const char *content_type) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (r) MHD_add_response_header(r, "Content-Type", content_type);
    return r;
}

server_reply server_json(unsigned status, json_t *body) {
    server_reply reply = {status, NULL};
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
            "\"param\":null,\"code\":null}}";
        reply.status = 500;
        reply.response = server_buffer_response(oom, sizeof oom - 1, "application/json");
        return reply;
    }
    reply.response = server_buffer_response(text, strlen(text), "application/json");
    free(text);
    return reply;
}

json_t *server_json_text(const char *bytes, size_t len) {
    size_t valid = gptoss_utf8_valid_prefix((const unsigned char *)bytes, len);
    if (valid == len) return json_stringn(bytes, len);
    /* Replace each invalid byte by U+FFFD. */
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = gptoss_utf8_valid_prefix((const unsigned char *)bytes + i, len - i);
        if (n > 0) {
            memcpy(out + o, bytes + i, n);
            o += n, i += n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3, i++;
        }
    }
    json_t *s = json_stringn(out, o);
    free(out);
    return s;
}

server_reply server_error(unsigned status, const char *type, const char *param, const char *code,
                          const char *fmt, ...) {
    char message[GPTOSS_ERROR_MESSAGE_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    json_t *error = json_object();
    json_object_set_new(error, "message", server_json_text(message, strlen(message)));
    json_object_set_new(error, "type", json_string(type));
    json_object_set_new(error, "param",
                        param ? server_json_text(param, strlen(param)) : json_null());
    json_object_set_new(error, "code", code ? json_string(code) : json_null());
    json_t *body = json_object();
    json_object_set_new(body, "error", error);
    return server_json(status, body);
}

bool server_client_gone(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return true;
    struct pollfd p = {.fd = info->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    char byte;
    ssize_t n = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void server_hold_connection(struct MHD_Connection *connection) {
    MHD_set_connection_option(connection, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)0);
}

/* ---- endpoints that need no engine work --------------------------------------------------- */

static server_reply health(gptoss_server *s) {
    if (atomic_load(&s->draining))
        return server_error(503, "server_error", NULL, "draining", "the server is shutting down");
    if (!atomic_load_explicit(&s->ready, memory_order_acquire))
        return server_error(503, "server_error", NULL, "not_ready", "the model is still loading");
    json_t *body = json_pack("{s:s}", "status", "ok");
    return server_json(200, body);
}

static json_t *model_object(gptoss_server *s) {
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->created_unix, "owned_by", "gptoss", "max_model_len",
                     (int)s->max_model_len);
}

static server_reply models(gptoss_server *s, const char *url) {
    const char *prefix = "/v1/models/";
    if (strncmp(url, prefix, strlen(prefix)) == 0) {
        const char *id = url + strlen(prefix);
        if (strcmp(id, s->model_name) != 0)
            return server_error(404, "invalid_request_error", "model", "model_not_found",
                                "The model '%s' does not exist; this server serves '%s'", id,
                                s->model_name);
        return server_json(200, model_object(s));
    }
    json_t *list = json_array();
    json_array_append_new(list, model_object(s));
    return server_json(200, json_pack("{s:s, s:o}", "object", "list", "data", list));
}

/* ---- access log ---------------------------------------------------------------------------- */

struct server_access {
    atomic_int refs;
    gptoss_server *server;
    char method[16];
    char path[128];  /* printable ASCII; other bytes became '?' */
    char client[64]; /* numeric address of the peer, or "-" */
    char request_id[SERVER_REQUEST_ID_MAX + 1];
    unsigned status;
    double start;                /* gptoss_now_seconds */
    atomic_llong first_token_us; /* since start; -1: no token yet */
    atomic_int prompt_tokens, completion_tokens;
    _Atomic(const char *) model; /* the served model once a request named it, else NULL */
    _Atomic(const char *) note;  /* static, or NULL */
};

/* A client's x-request-id is kept when it is 1..128 visible ASCII characters (it goes into
 * log lines and a response header); anything else is replaced by a fresh id. */
static bool request_id_valid(const char *id) {
    size_t n = 0;
    for (; id[n]; n++)
        if ((unsigned char)id[n] < 0x21 || (unsigned char)id[n] > 0x7e) return false;
    return n >= 1 && n <= SERVER_REQUEST_ID_MAX;
}

static void client_address(struct MHD_Connection *c, char *out, size_t size) {
    snprintf(out, size, "-");
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!info || !info->client_addr) return;
    socklen_t len = info->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                             : sizeof(struct sockaddr_in);
    char host[INET6_ADDRSTRLEN + 1];
    if (getnameinfo(info->client_addr, len, host, sizeof host, NULL, 0, NI_NUMERICHOST) == 0)
        snprintf(out, size, "%s", host);
}

static server_access *access_new(gptoss_server *s, struct MHD_Connection *c, const char *method,
                                 const char *url) {
    server_access *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    atomic_init(&a->refs, 1);
    a->server = s;
    snprintf(a->method, sizeof a->method, "%s", method);
    snprintf(a->path, sizeof a->path, "%s", url);
    for (char *p = a->method; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) *p = '?';
    for (char *p = a->path; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) *p = '?';
    client_address(c, a->client, sizeof a->client);
    const char *id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-request-id");
    if (id && request_id_valid(id))
        snprintf(a->request_id, sizeof a->request_id, "%s", id);
    else
        snprintf(a->request_id, sizeof a->request_id, "%016llx%016llx",
                 (unsigned long long)s->id_salt,
                 (unsigned long long)atomic_fetch_add(&s->next_request_id, 1));
    a->start = gptoss_now_seconds();
    atomic_init(&a->first_token_us, -1);
    atomic_init(&a->prompt_tokens, 0);
    atomic_init(&a->completion_tokens, 0);
    atomic_init(&a->model, NULL);
    atomic_init(&a->note, NULL);
    return a;
}

server_access *server_access_hold(server_access *a) {
    if (a) atomic_fetch_add(&a->refs, 1);
    return a;
}

void server_access_set_tokens(server_access *a, int32_t prompt, int32_t completion) {
    if (!a) return;
    atomic_store(&a->prompt_tokens, prompt);
    atomic_store(&a->completion_tokens, completion);
}

void server_access_set_note(server_access *a, const char *note) {
    const char *none = NULL;
    if (a) atomic_compare_exchange_strong(&a->note, &none, note); /* the first reason stays */
}

void server_access_set_model(server_access *a) {
    if (a) atomic_store(&a->model, a->server->model_name);
}

void server_access_first_token(server_access *a) {
    if (!a || atomic_load_explicit(&a->first_token_us, memory_order_relaxed) >= 0) return;
    long long none = -1, us = (long long)((gptoss_now_seconds() - a->start) * 1e6);
    atomic_compare_exchange_strong(&a->first_token_us, &none, us);
}

void server_access_release(server_access *a) {
    if (!a || atomic_fetch_sub(&a->refs, 1) != 1) return;
    /* 503 (loading, draining) and 4xx are the client's to handle: warn; other 5xx: error. */
    gptoss_log_level level = (a->status >= 500 && a->status != 503) || a->status == 0
                                 ? GPTOSS_LOG_ERROR
                             : a->status >= 400 ? GPTOSS_LOG_WARN
                                                : GPTOSS_LOG_INFO;
    /* Health checks and scrapes come every few seconds from machines: debug, when answered. */
    if (level == GPTOSS_LOG_INFO && (!strcmp(a->path, "/health") || !strcmp(a->path, "/metrics")))
        level = GPTOSS_LOG_DEBUG;
    double duration = gptoss_now_seconds() - a->start;
    long long ttft_us = atomic_load(&a->first_token_us);
    int prompt = atomic_load(&a->prompt_tokens), completion = atomic_load(&a->completion_tokens);
    const char *model = atomic_load(&a->model);
    const char *note = atomic_load(&a->note);
    if (gptoss_log_enabled(level)) {
        char ttft[32] = "-";
        if (ttft_us >= 0) snprintf(ttft, sizeof ttft, "%.1f", (double)ttft_us / 1000.0);
        if (gptoss_log_get_format() == GPTOSS_LOG_FORMAT_JSON) {
            json_t *f =
                json_pack("{s:s, s:s, s:i, s:o, s:i, s:i, s:o, s:f, s:s, s:s, s:o}", "method",
                          a->method, "path", a->path, "status", (int)a->status, "model",
                          model ? json_string(model) : json_null(), "prompt_tokens", prompt,
                          "completion_tokens", completion, "ttft_ms",
                          ttft_us >= 0 ? json_real((double)ttft_us / 1000.0) : json_null(),
                          "duration_ms", duration * 1000.0, "client", a->client, "request_id",
                          a->request_id, "note", note ? json_string(note) : json_null());
            char *text = f ? json_dumps(f, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
            json_decref(f);
            size_t n = text ? strlen(text) : 0;
            if (n >= 2) text[n - 1] = '\0'; /* the members without the braces */
            gptoss_log_fields(level, "serve", n >= 2 ? text + 1 : NULL, "%s %s %u", a->method,
                              a->path, a->status);
            free(text);
        } else {
            gptoss_log(level, "serve",
                       "%s %s %u model=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%s "
                       "duration_ms=%.1f client=%s request_id=%s%s%s",
                       a->method, a->path, a->status, model ? model : "-", prompt, completion, ttft,
                       duration * 1000.0, a->client, a->request_id, note ? ": " : "",
                       note ? note : "");
        }
    }
    free(a);
}

/* ---- connections ------------------------------------------------------------------------- */

typedef struct connection_state {
    char *body;            /* [len] uploaded bytes (NUL-terminated), NULL when empty or dropped */
    size_t len, cap;       /* bytes held / allocated */
    bool too_large;        /* the body passed max_body_bytes: answer 413, drop the rest */
    server_access *access; /* this request's log line (one reference) */
} connection_state;

/* Compares without an early exit so the time taken says nothing about where keys differ. */
static bool constant_time_equal(const char *a, size_t a_len, const char *b, size_t b_len) {
    size_t n = a_len > b_len ? a_len : b_len;
    unsigned char diff = (unsigned char)(a_len != b_len);
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < a_len ? (unsigned char)a[i] : 0,
                      y = i < b_len ? (unsigned char)b[i] : 0;
        diff |= (unsigned char)(x ^ y);
    }
    return diff == 0;
}

static bool authorized(gptoss_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    const char *token = h + 7;
    while (*token == ' ')
        token++;
    return constant_time_equal(token, strlen(token), s->api_key, s->api_key_len);
}

static server_reply method_not_allowed(const char *allow, const char *method, const char *url) {
    server_reply r = server_error(405, "invalid_request_error", NULL, "method_not_allowed",
                                  "Method %s is not allowed on %s; use %s", method, url, allow);
    if (r.response) MHD_add_response_header(r.response, "Allow", allow);
    return r;
}

/* ---- routes ------------------------------------------------------------------------------ */

typedef server_reply (*route_fn)(gptoss_server *s, const server_request *request);

static server_reply health_route(gptoss_server *s, const server_request *r) {
    (void)r;
    return health(s);
}

static server_reply models_route(gptoss_server *s, const server_request *r) {
    return models(s, r->url);
}

typedef struct route_entry {
    const char *path;   /* exact, or a prefix when it ends in '/' (but "/" itself is exact) */
    const char *method; /* NULL: the handler tells the methods apart */
    bool api;           /* API key, body limit, draining and readiness apply */
    route_fn handler;
} route_entry;

static const route_entry routes[] = {
    {"/", "GET", false, server_webui},
    {"/health", "GET", false, health_route},
    {"/metrics", "GET", false, server_metrics},
    {"/v1/models", "GET", true, models_route},
    {"/v1/models/", "GET", true, models_route},
    {"/v1/chat/completions", "POST", true, server_chat_completions},
    {"/v1/completions", "POST", true, server_completions},
    {"/v1/responses", "POST", true, server_responses_create},
    {"/v1/responses/", NULL, true, server_responses_item},
};

static const route_entry *find_route(const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        size_t n = strlen(routes[i].path);
        bool prefix = n > 1 && routes[i].path[n - 1] == '/';
        if (prefix ? !strncmp(url, routes[i].path, n) : !strcmp(url, routes[i].path))
            return &routes[i];
    }
    return NULL;
}

/* ---- CORS -------------------------------------------------------------------------------- */

/* Whether the request's Origin is one of --allowed-origins ("*": any); NULL when the request
 * has no Origin or it is not allowed, else the value to send in Access-Control-Allow-Origin. */
static const char *allowed_origin(const gptoss_server *s, struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin || !*origin || !s->allowed_origins) return NULL;
    size_t n = strlen(origin);
    for (const char *p = s->allowed_origins; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ",");
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (len == 1 && *p == '*') return "*";
        if (len == n && !memcmp(p, origin, n)) return origin;
        p += len;
        while (*p && *p != ',')
            p++;
    }
    return NULL;
}

static bool header_value_ok(const char *v) {
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 || (unsigned char)*v > 0x7e) return false;
    return true;
}

/* OPTIONS: a browser's preflight (Origin + Access-Control-Request-Method) is answered 204 with
 * what the route allows when the origin is allowed, 403 when it is not; a plain OPTIONS gets
 * the route's methods in Allow. No API key: browsers send none with a preflight. */
static server_reply options_reply(gptoss_server *s, struct MHD_Connection *c, const route_entry *r,
                                  const char *url) {
    char methods[64];
    if (!r->method) /* /v1/responses/{id}[/cancel|/input_items]: the handler's methods */
        snprintf(methods, sizeof methods, "GET, HEAD, POST, DELETE, OPTIONS");
    else
        snprintf(methods, sizeof methods, "%s%s, OPTIONS", r->method,
                 strcmp(r->method, "GET") ? "" : ", HEAD");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && !allowed_origin(s, c))
        return server_error(403, "invalid_request_error", NULL, "origin_not_allowed",
                            "Origin '%.200s' may not call %s; allow it with --allowed-origins",
                            origin, url);
    server_reply reply = {204, server_buffer_response("", 0, "text/plain")};
    if (!reply.response) return reply;
    MHD_add_response_header(reply.response, "Allow", methods);
    if (origin) {
        MHD_add_response_header(reply.response, "Access-Control-Allow-Methods", methods);
        const char *asked =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        /* The official clients send many headers of their own (x-stainless-*): allow what the
         * browser asks for; the API key is still checked on the request itself. */
        MHD_add_response_header(reply.response, "Access-Control-Allow-Headers",
                                asked && header_value_ok(asked) && strlen(asked) < 4096
                                    ? asked
                                    : "Authorization, Content-Type, x-request-id");
        MHD_add_response_header(reply.response, "Access-Control-Max-Age", "600");
    }
    return reply;
}

static server_reply route(gptoss_server *s, struct MHD_Connection *c, const char *url,
                          const char *method, connection_state *st) {
    const route_entry *r = find_route(url);
    if (!r)
        return server_error(404, "invalid_request_error", NULL, "not_found",
                            "No route %s %s; try POST /v1/chat/completions, POST /v1/responses, "
                            "POST /v1/completions, "
                            "GET /v1/models, GET /health or GET /metrics",
                            method, url);
    if (!strcmp(method, "OPTIONS")) return options_reply(s, c, r, url);
    /* HEAD is GET without the body (libmicrohttpd leaves the body out). A route without a
     * method tells the methods apart itself. */
    bool head_of_get = r->method && !strcmp(method, "HEAD") && !strcmp(r->method, "GET");
    if (r->method && strcmp(method, r->method) != 0 && !head_of_get)
        return method_not_allowed(strcmp(r->method, "GET") ? r->method : "GET, HEAD", method, url);
    if (r->api) {
        if (!authorized(s, c)) {
            server_reply reply = server_error(
                401, "invalid_request_error", NULL, "invalid_api_key",
                "Missing or incorrect API key: send the header 'Authorization: Bearer KEY' "
                "with the key given to --api-key");
            if (reply.response)
                MHD_add_response_header(reply.response, "WWW-Authenticate", "Bearer");
            return reply;
        }
        if (st->too_large)
            return server_error(413, "invalid_request_error", NULL, "request_too_large",
                                "Request body is larger than the limit of %zu bytes "
                                "(--max-body-bytes)",
                                s->max_body_bytes);
        if (atomic_load(&s->draining))
            return server_error(503, "server_error", NULL, "draining",
                                "the server is shutting down");
        if (!atomic_load_explicit(&s->ready, memory_order_acquire)) {
            server_reply reply =
                server_error(503, "server_error", NULL, "not_ready",
                             "the model is still loading; retry when GET /health answers 200");
            if (reply.response)
                MHD_add_response_header(reply.response, "Retry-After", SERVER_RETRY_AFTER_SECONDS);
            return reply;
        }
    }
    server_request request = {.connection = c,
                              .url = url,
                              .method = method,
                              .body = st->body ? st->body : "",
                              .len = st->len,
                              .access = st->access};
    return r->handler(s, &request);
}

static enum MHD_Result queue(gptoss_server *s, struct MHD_Connection *c, connection_state *st,
                             server_reply reply) {
    if (st->access) st->access->status = reply.response ? reply.status : 0;
    if (!reply.response) return MHD_NO; /* out of memory: drop the connection */
    unsigned cls = reply.status / 100;
    if (cls < 6) atomic_fetch_add(&s->responses_by_class[cls], 1);
    if (st->access) MHD_add_response_header(reply.response, "x-request-id", st->access->request_id);
    const char *origin = allowed_origin(s, c);
    if (origin) {
        MHD_add_response_header(reply.response, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(reply.response, "Access-Control-Expose-Headers",
                                "x-request-id, Retry-After");
        if (strcmp(origin, "*")) MHD_add_response_header(reply.response, "Vary", "Origin");
    }
    enum MHD_Result ok = MHD_queue_response(c, reply.status, reply.response);
    MHD_destroy_response(reply.response);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    gptoss_server *s = cls;
    connection_state *st = *con_cls;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st) return MHD_NO;
        *con_cls = st;
        st->access = access_new(s, c, method, url);
        atomic_fetch_add(&s->active_requests, 1);
        /* A declared length over the limit is refused before reading a byte of it. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end = NULL;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno == 0 && end != cl && *end == '\0' && n > s->max_body_bytes) {
                st->too_large = true;
                return queue(
                    s, c, st,
                    server_error(413, "invalid_request_error", NULL, "request_too_large",
                                 "Request body of %llu bytes is larger than the limit of %zu bytes "
                                 "(--max-body-bytes)",
                                 n, s->max_body_bytes));
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (st->too_large) return MHD_YES;
        if (st->len + n > s->max_body_bytes) {
            st->too_large = true;
            free(st->body);
            st->body = NULL, st->len = st->cap = 0;
            return MHD_YES;
        }
        if (st->len + n + 1 > st->cap) {
            size_t cap = st->cap ? st->cap : 4096;
            while (cap < st->len + n + 1)
                cap *= 2;
            if (cap > s->max_body_bytes + 1) cap = s->max_body_bytes + 1;
            char *grown = realloc(st->body, cap);
            if (!grown) return MHD_NO;
            st->body = grown, st->cap = cap;
        }
        memcpy(st->body + st->len, upload_data, n);
        st->len += n;
        st->body[st->len] = '\0';
        return MHD_YES;
    }
    return queue(s, c, st, route(s, c, url, method, st));
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    gptoss_server *s = cls;
    connection_state *st = *con_cls;
    if (!st) return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        server_access_set_note(st->access, "connection closed early");
    server_access_release(st->access);
    free(st->body);
    free(st);
    *con_cls = NULL;
    atomic_fetch_sub(&s->active_requests, 1);
}

/* libmicrohttpd's own messages go to the log (so that they follow --log-format). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char message[512];
    vsnprintf(message, sizeof message, fmt, ap);
    size_t n = strlen(message);
    while (n > 0 && (message[n - 1] == '\n' || message[n - 1] == '\r'))
        message[--n] = '\0';
    /* Ending a stream whose client left is routine (the access log says so). */
    bool routine = strstr(message, "application error generating response") != NULL;
    gptoss_log(routine ? GPTOSS_LOG_DEBUG : GPTOSS_LOG_WARN, "http", "%s", message);
}

/* --allowed-origins: "*" or comma-separated origins as browsers send them, scheme://host[:port]
 * with no path (a trailing slash would never match). */
static bool origins_valid(const char *list, gptoss_error *error) {
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ",");
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (len == 0) break;
        const char *sep = memmem(p, len, "://", 3);
        bool ok = len == 1 && *p == '*';
        if (!ok && sep && sep > p && (size_t)(sep - p) + 3 < len) {
            ok = true;
            for (const char *q = sep + 3; q < p + len; q++)
                if (*q == '/' || *q == '*' || (unsigned char)*q <= 0x20 || (unsigned char)*q > 0x7e)
                    ok = false;
        }
        if (!ok) {
            gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                             "--allowed-origins: '%.*s' is not an origin (scheme://host[:port], "
                             "no path) or *",
                             (int)len, p);
            return false;
        }
        p += len;
        while (*p && *p != ',')
            p++;
    }
    return true;
}

/* ---- life cycle -------------------------------------------------------------------------- */

gptoss_status gptoss_server_start(const gptoss_server_options *o, gptoss_server **out,
                                  gptoss_error *error) {
    *out = NULL;
    if (o->port < 0 || o->port > 65535)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "port %d is out of range [0, 65535]", o->port);
    if (!o->served_model_name || !*o->served_model_name)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "the served model name must not be empty");
    if (o->allowed_origins && !origins_valid(o->allowed_origins, error)) return error->status;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *addr = NULL;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", o->port);
    int rc = getaddrinfo(o->host, port_text, &hints, &addr);
    if (rc != 0 || !addr)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "--host %s: %s",
                                o->host ? o->host : "(null)", gai_strerror(rc));
    gptoss_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(addr);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    s->host = strdup(o->host);
    s->model_name = strdup(o->served_model_name);
    if (o->api_key && *o->api_key) {
        s->api_key = strdup(o->api_key);
        s->api_key_len = strlen(o->api_key);
    }
    s->max_body_bytes = o->max_body_bytes;
    s->webui = o->webui;
    s->allowed_origins =
        o->allowed_origins && *o->allowed_origins ? strdup(o->allowed_origins) : NULL;
    s->created_unix = (int64_t)time(NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->id_salt =
        ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    atomic_init(&s->ready, false);
    atomic_init(&s->draining, false);
    atomic_init(&s->cut, false);
    pthread_mutex_init(&s->calls_lock, NULL);
    atomic_init(&s->active_requests, 0);
    for (int i = 0; i < 6; i++)
        atomic_init(&s->responses_by_class[i], 0);
    atomic_init(&s->next_request_id, 1);
    server_metrics_init(s);
    s->responses = response_store_create(o->responses_store_bytes, 256);
    if (!s->host || !s->model_name || (o->api_key && *o->api_key && !s->api_key) || !s->responses) {
        freeaddrinfo(addr);
        gptoss_server_stop(s);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (addr->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_SOCK_ADDR, addr->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
        o->connection_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_CONNECTION_LIMIT,
        o->max_connections ? o->max_connections : 2048u, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        o->max_connections_per_ip, MHD_OPTION_END);
    freeaddrinfo(addr);
    if (!s->daemon) {
        gptoss_server_stop(s);
        return gptoss_set_error(
            error, GPTOSS_ERR_IO,
            "cannot listen on %s:%d (port in use, or not allowed?); pick another with --port",
            o->host, o->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    *out = s;
    return GPTOSS_OK;
}

int gptoss_server_port(const gptoss_server *s) {
    return s->port;
}

void gptoss_server_set_draining(gptoss_server *s) {
    atomic_store(&s->draining, true);
}

int64_t gptoss_server_active_requests(const gptoss_server *s) {
    return atomic_load(&((gptoss_server *)s)->active_requests);
}

bool gptoss_server_wait_idle(gptoss_server *s, double deadline) {
    while (atomic_load(&s->active_requests) > 0) {
        if (gptoss_now_seconds() >= deadline) return false;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return true;
}

void gptoss_server_stop(gptoss_server *s) {
    if (!s) return;
    if (s->daemon) MHD_stop_daemon(s->daemon);
    server_engines_free(s);
    pthread_mutex_destroy(&s->calls_lock);
    response_store_free(s->responses); /* after the daemon: no handler can reach it */
    free(s->host);
    free(s->model_name);
    free(s->api_key);
    free(s->allowed_origins);
    free(s);
}
