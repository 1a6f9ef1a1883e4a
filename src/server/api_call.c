/*
 * api_call.c - one generation HTTP request from submission to the last byte (api_call.h).
 *
 * Owns: the engine request, the wait for its events and the SSE bytes. A connection thread
 * sleeps in poll() on two descriptors: an eventfd the engine's notify callback writes to when
 * it queued events, and the client's socket, watched for a hang-up (which cancels the request
 * and so frees its KV blocks). Nothing is polled on a clock.
 */
#include "server/api_call.h"

#include "server/engines.h"
#include "server/output_constraint.h"

#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---- waking a connection thread ------------------------------------------------------------ */

/* The engine may call notify after the connection released its request (the engine holds its
 * own reference until the cancel is processed), so a waiter is never freed: it goes back to a
 * process-wide pool and is reused. A late notify then only wakes the next user once, which
 * finds no event and waits again. */
typedef struct server_waiter {
    int fd; /* eventfd, non-blocking */
    struct server_waiter *next;
} server_waiter;

static pthread_mutex_t waiter_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static server_waiter *waiter_pool;

static server_waiter *waiter_get(void) {
    pthread_mutex_lock(&waiter_pool_lock);
    server_waiter *w = waiter_pool;
    if (w) waiter_pool = w->next;
    pthread_mutex_unlock(&waiter_pool_lock);
    if (w) return w;
    w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->fd < 0) {
        free(w);
        return NULL;
    }
    return w;
}

static void waiter_put(server_waiter *w) {
    if (!w) return;
    pthread_mutex_lock(&waiter_pool_lock);
    w->next = waiter_pool;
    waiter_pool = w;
    pthread_mutex_unlock(&waiter_pool_lock);
}

static void waiter_notify(void *user, gptoss_request *request) {
    (void)request;
    server_waiter *w = user;
    uint64_t one = 1;
    ssize_t n = write(w->fd, &one, sizeof one); /* EAGAIN: the counter is already non-zero */
    (void)n;
}

/* Sleeps until the engine queued events (or a stale wake-up) -> 0, or the client hung up -> 1. */
static int wait_for_events(api_call *c) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return 1;
    for (;;) {
        struct pollfd p[2] = {{.fd = c->waiter->fd, .events = POLLIN},
                              {.fd = info->connect_fd, .events = POLLRDHUP}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return server_client_gone(c->connection) ? 1 : 0;
        if (p[1].revents && server_client_gone(c->connection)) return 1;
        if (p[0].revents & POLLIN) {
            uint64_t count;
            ssize_t n = read(c->waiter->fd, &count, sizeof count);
            (void)n;
            return 0;
        }
        if (p[1].revents) {
            /* A hang-up flag without EOF (should not happen): do not spin on it. */
            struct pollfd only = {.fd = c->waiter->fd, .events = POLLIN};
            if (poll(&only, 1, 1000) > 0) {
                uint64_t count;
                ssize_t n = read(c->waiter->fd, &count, sizeof count);
                (void)n;
                return 0;
            }
        }
    }
}

/* ---- the call ------------------------------------------------------------------------------ */

static void to_encoder(void *user, const gen_event *ev) {
    api_call *c = user;
    if (ev->kind == GEN_FINISH && !strcmp(ev->finish_reason, "abort") &&
        !c->encoder->reports_abort) {
        /* A cancel the client can see is the server's own (the drain timed out, or the engine
         * shut down): OpenAI has no "abort", and "length" says what happened, the answer
         * was cut before the model ended it. */
        gen_event cut = *ev;
        cut.finish_reason = "length";
        server_access_set_note(c->access, "ended by the server");
        c->encoder->event(c, c->state, &cut);
        return;
    }
    c->encoder->event(c, c->state, ev);
}

/* ---- the calls in flight (for the drain's cut) ----------------------------------------- */

static void register_call(api_call *c) {
    gptoss_server *s = c->server;
    pthread_mutex_lock(&s->calls_lock);
    c->next_live = s->calls;
    if (s->calls) s->calls->prev_live = c;
    s->calls = c;
    c->live = true;
    pthread_mutex_unlock(&s->calls_lock); /* (a call that comes after the cut sees the flag) */
}

static void unregister_call(api_call *c) {
    if (!c->live) return;
    gptoss_server *s = c->server;
    pthread_mutex_lock(&s->calls_lock);
    if (c->prev_live)
        c->prev_live->next_live = c->next_live;
    else
        s->calls = c->next_live;
    if (c->next_live) c->next_live->prev_live = c->prev_live;
    c->live = false;
    pthread_mutex_unlock(&s->calls_lock);
}

/* Wakes every connection thread with a generation in flight; each sees the flag and ends its
 * own response (cut_generation), without waiting for an engine step. */
void gptoss_server_cut(gptoss_server *s) {
    pthread_mutex_lock(&s->calls_lock);
    atomic_store(&s->cut, true);
    for (api_call *c = s->calls; c; c = c->next_live)
        waiter_notify(c->waiter, NULL);
    pthread_mutex_unlock(&s->calls_lock);
}

/* Ends the response now, as if every unfinished choice had reached max_tokens: the engine
 * request is cancelled (freeing its KV blocks at the next step) and each choice gets its
 * finish event here, so the encoder writes the final chunk (finish_reason "length") and a
 * stream its [DONE]. */
static void cut_generation(api_call *c) {
    gptoss_request_cancel(c->request);
    server_access_set_note(c->access, "cut by the drain timeout");
    for (int32_t i = 0; i < c->params.sampling.n; i++) {
        gptoss_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.index = i;
        ev.token_id = -1;
        ev.finish = GPTOSS_FINISH_LENGTH;
        generation_push(c->gen, &ev); /* ignored for a choice that already finished */
    }
}

gptoss_status api_call_create(const api_encoder *encoder, const char *model_name,
                              const gptoss_tokenizer *tokenizer, request_params *params,
                              int32_t n_prompt, uint64_t id_salt, uint64_t id_number,
                              gptoss_request *request, api_call **out, gptoss_error *error) {
    *out = NULL;
    api_call *c = calloc(1, sizeof *c);
    if (!c) {
        request_params_free(params);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    c->encoder = encoder, c->model_name = model_name, c->tokenizer = tokenizer;
    c->params = *params;
    memset(params, 0, sizeof *params);
    c->n_prompt = n_prompt, c->request = request;
    c->created = (int64_t)time(NULL);
    snprintf(c->id, sizeof c->id, "%s-%016llx%08llx", encoder->id_prefix,
             (unsigned long long)id_salt, (unsigned long long)id_number);
    /* Tool call ids: unique per server run and request, then the call's index. */
    char call_prefix[64];
    snprintf(call_prefix, sizeof call_prefix, "call_%016llx%08llx_", (unsigned long long)id_salt,
             (unsigned long long)id_number);
    gen_options go = {.text_mode = encoder->text_mode,
                      .n_choices = c->params.sampling.n,
                      .logprobs = c->params.sampling.logprobs,
                      .stops = (const char *const *)c->params.stops,
                      .stop_lens = c->params.stop_lens,
                      .n_stops = c->params.n_stops,
                      .call_id_prefix = call_prefix};
    c->state = calloc(1, encoder->state_size ? encoder->state_size : 1);
    if (!c->state) {
        api_call_free(c);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    gptoss_status st = generation_create(tokenizer, request, &go, to_encoder, c, &c->gen, error);
    if (st == GPTOSS_OK && encoder->init && !encoder->init(c, c->state))
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    if (st != GPTOSS_OK) {
        api_call_free(c);
        return st;
    }
    *out = c;
    return GPTOSS_OK;
}

/* A generation that ended (every choice finished, cut ones included) feeds the histograms;
 * one whose client left does not. */
static void observe_call(api_call *c) {
    if (!c->server || !c->gen || !generation_done(c->gen)) return;
    double now = gptoss_now_seconds();
    int32_t generated = generation_usage(c->gen).completion_tokens;
    int32_t n = c->params.sampling.n > 0 ? c->params.sampling.n : 1;
    double per_choice = (double)generated / n, tpot = -1;
    if (c->t_first_token > 0 && per_choice > 1) tpot = (now - c->t_first_token) / (per_choice - 1);
    server_metrics_observe(c->server, now - c->t_submit, gptoss_request_queue_seconds(c->request),
                           tpot, c->n_prompt, generated);
}

void api_call_free(api_call *c) {
    if (!c) return;
    unregister_call(c);
    observe_call(c);
    if (c->access) {
        gen_usage u = c->gen ? generation_usage(c->gen) : (gen_usage){0, 0};
        server_access_set_tokens(c->access, c->n_prompt, u.completion_tokens);
        server_access_release(c->access);
    }
    gptoss_request_release(c->request);
    if (c->server && c->request) server_engine_done(c->server, c->engine_index);
    waiter_put(c->waiter);
    if (c->state && c->encoder->fini && c->gen) c->encoder->fini(c, c->state);
    free(c->state);
    generation_free(c->gen);
    request_params_free(&c->params);
    gptoss_chat_buf_free(&c->out);
    free(c);
}

void api_sse_text(api_call *c, const char *text) {
    gptoss_chat_buf_puts(&c->out, text);
}

void api_sse(api_call *c, json_t *chunk) {
    char *text = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    if (!text) {
        c->out.failed = true;
        return;
    }
    gptoss_chat_buf_puts(&c->out, "data: ");
    gptoss_chat_buf_puts(&c->out, text);
    gptoss_chat_buf_puts(&c->out, "\n\n");
    free(text);
}

json_t *api_usage(api_call *c) {
    gen_usage u = generation_usage(c->gen);
    if (c->request) c->cached_prompt_tokens = gptoss_request_cached_prompt_tokens(c->request);
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", c->n_prompt, "completion_tokens",
                     u.completion_tokens, "total_tokens", c->n_prompt + u.completion_tokens,
                     "prompt_tokens_details", "cached_tokens", c->cached_prompt_tokens);
}

static json_t *token_text_json(const gptoss_tokenizer *t, int32_t id, json_t **bytes_out) {
    size_t len = 0;
    const char *b = gptoss_tokenizer_token_bytes(t, id, &len);
    if (!b) b = "", len = 0;
    *bytes_out = json_array();
    for (size_t i = 0; i < len; i++)
        json_array_append_new(*bytes_out, json_integer((unsigned char)b[i]));
    return server_json_text(b, len);
}

json_t *api_logprob_entry(api_call *c, const gptoss_engine_event *ev) {
    json_t *bytes = NULL;
    json_t *entry = json_object();
    json_object_set_new(entry, "token", token_text_json(c->tokenizer, ev->token_id, &bytes));
    json_object_set_new(entry, "logprob", json_real(isfinite(ev->logprob) ? ev->logprob : -9999.0));
    json_object_set_new(entry, "bytes", bytes);
    json_t *top = json_array();
    for (int32_t k = 0; k < ev->n_top_logprobs; k++) {
        json_t *tb = NULL;
        float lp = ev->top_logprobs[k].logprob;
        json_t *alt = json_object();
        json_object_set_new(alt, "token",
                            token_text_json(c->tokenizer, ev->top_logprobs[k].token_id, &tb));
        json_object_set_new(alt, "logprob", json_real(isfinite(lp) ? lp : -9999.0));
        json_object_set_new(alt, "bytes", tb);
        json_array_append_new(top, alt);
    }
    json_object_set_new(entry, "top_logprobs", top);
    return entry;
}

/* ---- serving ------------------------------------------------------------------------------- */

/* Takes every queued event; -1 once all were taken and every choice finished. */
static int drain_events(api_call *c) {
    gptoss_engine_event ev;
    for (;;) {
        int r = gptoss_request_next_event(c->request, &ev, 0);
        if (r != 1) return r;
        if (ev.token_id >= 0 && c->t_first_token == 0) {
            c->t_first_token = gptoss_now_seconds();
            server_access_first_token(c->access);
        }
        generation_push(c->gen, &ev);
        if (c->out.len > c->out_pos + 64 * 1024) return 1; /* hand over what we have */
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    api_call *c = cls;
    for (;;) {
        if (c->out_pos < c->out.len) {
            size_t n = c->out.len - c->out_pos;
            if (n > max) n = max;
            memcpy(buf, c->out.data + c->out_pos, n);
            c->out_pos += n;
            if (c->out_pos == c->out.len) c->out_pos = c->out.len = 0;
            return (ssize_t)n;
        }
        if (c->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (c->out.failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        int r = drain_events(c);
        if (r >= 0 && atomic_load(&c->server->cut)) {
            cut_generation(c);
            r = -1;
        }
        if (r < 0) {
            c->encoder->stream_end(c, c->state);
            c->done = true;
        } else if (r == 0 && c->out.len == 0 && wait_for_events(c)) {
            gptoss_request_cancel(c->request);
            if (c->access) server_access_set_note(c->access, "client closed the stream");
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    api_call_free(cls);
}

static server_reply submit_error(gptoss_server *s, gptoss_status st, const gptoss_error *err,
                                 int32_t n_prompt, int32_t engine_index) {
    if (st == GPTOSS_ERR_CAPACITY) {
        if (atomic_load(&s->draining))
            return server_error(503, "server_error", NULL, "draining",
                                "The server is shutting down and takes no new requests");
        if (server_queue_full(s, engine_index)) {
            /* The engine's message says how many wait; "retry later" is in it already. */
            server_reply r = server_error(429, "rate_limit_error", NULL, "queue_full",
                                          "The server is at capacity: %s", err->message);
            if (r.response)
                MHD_add_response_header(r.response, "Retry-After", SERVER_RETRY_AFTER_SECONDS);
            return r;
        }
        return server_error(400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                            "%s (the prompt has %d tokens)", err->message, n_prompt);
    }
    if (st == GPTOSS_ERR_INVALID_ARGUMENT)
        return server_error(400, "invalid_request_error", NULL, NULL, "%s", err->message);
    return server_error(500, "server_error", NULL, NULL, "%s", err->message);
}

server_reply api_call_serve(gptoss_server *s, const server_request *http,
                            const api_encoder *encoder, const int32_t *prompt, int32_t n_prompt,
                            request_params *params) {
    server_access_set_tokens(http->access, n_prompt, 0);
    server_waiter *w = waiter_get();
    if (!w) {
        request_params_free(params);
        return server_error(500, "server_error", NULL, NULL, "out of event descriptors");
    }
    double t_submit = gptoss_now_seconds();
    gptoss_request_options ro = {.notify = waiter_notify, .notify_user = w};
    if (params->constraint) {
        if (params->sampling.max_tokens == 0)
            output_constraint_set_default_max_tokens(params->constraint,
                                                     s->max_model_len - n_prompt);
        output_constraint_bind(params->constraint, &ro);
    }
    gptoss_request *request = NULL;
    gptoss_error err = {0};
    int32_t engine_index = -1;
    gptoss_status st =
        server_submit(s, prompt, n_prompt, &params->sampling, &ro, &request, &engine_index, &err);
    if (st == GPTOSS_OK) params->constraint = NULL; /* the engine request owns it now */
    /* The engine copied the sampling arrays (logit_bias): params may go from here on. */
    if (st != GPTOSS_OK) {
        waiter_put(w);
        request_params_free(params);
        return submit_error(s, st, &err, n_prompt, engine_index);
    }
    api_call *c = NULL;
    st = api_call_create(encoder, s->model_name, s->tokenizer, params, n_prompt, s->id_salt,
                         server_response_number(s, request, engine_index), request, &c, &err);
    if (st != GPTOSS_OK) {
        gptoss_request_release(request);
        server_engine_done(s, engine_index);
        waiter_put(w);
        return server_error(500, "server_error", NULL, NULL, "%s", err.message);
    }
    c->server = s, c->connection = http->connection, c->waiter = w;
    c->engine_index = engine_index;
    c->access = server_access_hold(http->access);
    c->t_submit = t_submit;
    register_call(c);
    /* Queued behind a full batch or generating a long answer, the connection may carry no
     * bytes for longer than the idle timeout, which would close it under the client. */
    server_hold_connection(http->connection);

    if (c->params.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                   stream_read, c, stream_free);
        if (!r) {
            api_call_free(c);
            return server_error(500, "server_error", NULL, NULL, "out of memory");
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        return (server_reply){200, r};
    }

    /* Not streaming: collect every event, watching for a client that gave up. */
    while (drain_events(c) >= 0) {
        if (atomic_load(&s->cut)) {
            cut_generation(c);
            break;
        }
        if (wait_for_events(c)) {
            gptoss_request_cancel(c->request);
            server_access_set_tokens(http->access, n_prompt,
                                     generation_usage(c->gen).completion_tokens);
            api_call_free(c);
            return server_error(499, "invalid_request_error", NULL, "client_closed",
                                "the client closed the connection");
        }
    }
    server_access_set_tokens(http->access, n_prompt, generation_usage(c->gen).completion_tokens);
    const char *failure = generation_error(c->gen);
    if (failure[0]) {
        server_reply e =
            server_error(500, "server_error", NULL, NULL, "generation failed: %s", failure);
        api_call_free(c);
        return e;
    }
    json_t *body = encoder->response(c, c->state);
    api_call_free(c);
    return server_json(200, body);
}

server_reply api_bad_request(const field_error *e) {
    return server_error(400, "invalid_request_error", e->param[0] ? e->param : NULL, NULL, "%s",
                        e->message);
}

/* Where a NUL character (U+0000, which JSON strings may hold) is harmless: text that is only
 * tokenized (message content, reasoning, tool-call arguments, prompts). Everywhere else (model,
 * stop, names, ids, roles, schemas, ...) it would cut a C string short or make a name that is not
 * one, so it is refused naming the field. Keyed by the name of the member holding the string
 * (through arrays: content[2].text, prompt[0]). */
static bool nul_allowed(const char *key) {
    static const char *const keys[] = {"content",   "text",   "arguments", "reasoning_content",
                                       "reasoning", "prompt", "input",     "instructions"};
    for (size_t i = 0; key && i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(key, keys[i])) return true;
    return false;
}

/* Finds a string holding a NUL where it is not allowed; writes its path ("messages[0].name"). */
static bool find_bad_nul(const json_t *v, const char *key, char *path, size_t len, size_t cap) {
    if (len >= cap - 1) return false; /* deeper than any path we can name: not checked */
    if (json_is_string(v))
        return !nul_allowed(key) && strlen(json_string_value(v)) != json_string_length(v);
    if (json_is_array(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
            int n = snprintf(path + len, cap - len, "[%zu]", i);
            if (n > 0 && find_bad_nul(item, key, path, len + (size_t)n, cap)) return true;
        }
    } else if (json_is_object(v)) {
        const char *k;
        json_t *item;
        json_object_foreach((json_t *)v, k, item) {
            int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", k);
            if (n > 0 && find_bad_nul(item, k, path, len + (size_t)n, cap)) return true;
        }
    }
    path[len] = '\0';
    return false;
}

server_reply api_parse_body(gptoss_server *s, const server_request *http, json_t **out) {
    json_error_t jerr;
    *out = NULL;
    if (http->len == 0)
        return server_error(
            400, "invalid_request_error", NULL, "invalid_json",
            "The request body is empty; send a JSON object (Content-Type: application/json)");
    json_t *req = json_loadb(http->body, http->len, JSON_ALLOW_NUL, &jerr);
    if (!req)
        return server_error(400, "invalid_request_error", NULL, "invalid_json",
                            "The request body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    if (!json_is_object(req)) {
        json_decref(req);
        return server_error(400, "invalid_request_error", NULL, "invalid_json",
                            "The request body must be a JSON object");
    }
    json_t *m = json_object_get(req, "model");
    server_reply bad = {0, NULL};
    char path[256] = "";
    if (find_bad_nul(req, NULL, path, 0, sizeof path))
        bad = server_error(400, "invalid_request_error", path, NULL,
                           "%s: must not contain a NUL character (\\u0000)", path);
    else if (!m)
        bad = server_error(400, "invalid_request_error", "model", NULL,
                           "model: required; this server serves '%s'", s->model_name);
    else if (!json_is_string(m))
        bad = server_error(400, "invalid_request_error", "model", NULL, "model: expected a string");
    else if (strcmp(json_string_value(m), s->model_name) != 0)
        bad = server_error(404, "invalid_request_error", "model", "model_not_found",
                           "The model '%s' does not exist; this server serves '%s'",
                           json_string_value(m), s->model_name);
    if (bad.status) {
        json_decref(req);
        return bad;
    }
    server_access_set_model(http->access);
    *out = req;
    return bad;
}
