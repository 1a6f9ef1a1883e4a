/*
 * api_responses.c - the OpenAI Responses API: POST /v1/responses, GET and DELETE
 * /v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel.
 *
 * Owns: the endpoints (the request's fields are read by responses_request.c, its input items by
 * responses_input.c), the encoder that turns the neutral generation events into output items
 * (reasoning, message, function_call) and the typed response.* server-sent events, background
 * generations (a detached thread per response, bounded by the store's job limit, whose events go to
 * the store's log of the response) and the streams that follow such a log (the creating request's
 * own with stream: true, and GET /v1/responses/{id}?stream=true&starting_after=N). Records and
 * logs live in response_store.c.
 */
#include "server/api_responses.h"
#include "server/engines.h"
#include "server/output_constraint.h"
#include "server/responses_input.h"
#include "server/responses_request.h"

#include "chat/chat.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ---- what a response repeats of its request, and its conversation -------------------------- */

/* api_call_serve and api_call_create make the call (and run the encoder's init) in the thread
 * that calls them: the endpoint leaves its request here, init takes it. */
static _Thread_local resp_request *handoff;

/* ---- the encoder ------------------------------------------------------------------------------
 */

typedef enum item_kind { ITEM_REASONING, ITEM_MESSAGE, ITEM_FUNCTION_CALL } item_kind;

typedef struct out_item {
    item_kind kind;
    char id[96];
    gptoss_chat_buf text; /* reasoning text, message text, or function arguments */
    char *call_id, *name; /* function calls */
    const char *status;   /* once closed: "completed" or "incomplete" */
    json_t *logprobs;     /* messages, with include logprobs: an entry per token of the text */
} out_item;

typedef struct resp_state {
    resp_request *req;
    out_item *items; /* [n_items] output items in order; the last may be open */
    size_t n_items, cap;
    bool open;                 /* items[n_items - 1] still receives text */
    int64_t seq;               /* next sequence_number (streaming) */
    const char *finish_reason; /* once the generation finished */
    /* logprob entries of tokens whose text has not come yet (held back for a stop string, or
     * half a UTF-8 character): they go with the next text of a message */
    json_t *pending;
} resp_state;

static void emit(api_call *call, resp_state *st, const char *type, json_t *fields) {
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)st->seq++);
    json_object_update(ev, fields);
    json_decref(fields);
    char *text = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    if (!text) {
        call->out.failed = true;
        return;
    }
    api_sse_text(call, "event: ");
    api_sse_text(call, type);
    api_sse_text(call, "\ndata: ");
    api_sse_text(call, text);
    api_sse_text(call, "\n\n");
    free(text);
}

static json_t *buf_json(const gptoss_chat_buf *b) {
    return server_json_text(b->data ? b->data : "", b->len);
}

static json_t *item_logprobs(const out_item *it) {
    return it->logprobs ? json_incref(it->logprobs) : json_array();
}

/* An output item as the API shows it; `full`: with its text (else as when it was added). */
static json_t *item_json(const resp_state *st, const out_item *it, bool full) {
    const char *status = full && it->status ? it->status : "in_progress";
    switch (it->kind) {
    case ITEM_REASONING: {
        json_t *content = json_array();
        if (full)
            json_array_append_new(content, json_pack("{s:s, s:o}", "type", "reasoning_text", "text",
                                                     buf_json(&it->text)));
        json_t *item = json_pack("{s:s, s:s, s:[], s:o, s:s}", "id", it->id, "type", "reasoning",
                                 "summary", "content", content, "status", status);
        if (full && st->req->encrypted_reasoning) {
            /* nothing is encrypted: the text, marked, for a client to hand back */
            gptoss_chat_buf mark = {0};
            gptoss_chat_buf_puts(&mark, RESPONSES_REASONING_MARK);
            gptoss_chat_buf_append(&mark, it->text.data ? it->text.data : "", it->text.len);
            json_object_set_new(item, "encrypted_content", buf_json(&mark));
            gptoss_chat_buf_free(&mark);
        }
        return item;
    }
    case ITEM_MESSAGE: {
        json_t *content = json_array();
        if (full)
            json_array_append_new(content, json_pack("{s:s, s:o, s:[], s:o}", "type", "output_text",
                                                     "text", buf_json(&it->text), "annotations",
                                                     "logprobs", item_logprobs(it)));
        return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", it->id, "type", "message", "status",
                         status, "role", "assistant", "content", content);
    }
    case ITEM_FUNCTION_CALL:
        return json_pack("{s:s, s:s, s:s, s:o, s:o, s:o}", "id", it->id, "type", "function_call",
                         "status", status, "arguments",
                         full ? buf_json(&it->text) : json_string(""), "call_id",
                         server_json_text(it->call_id, strlen(it->call_id)), "name",
                         server_json_text(it->name, strlen(it->name)));
    }
    return json_null();
}

/* The item in the normalized form the store keeps for previous_response_id. */
static json_t *item_normalized(const out_item *it) {
    switch (it->kind) {
    case ITEM_REASONING:
        return json_pack("{s:s, s:s, s:o}", "type", "reasoning", "id", it->id, "text",
                         buf_json(&it->text));
    case ITEM_MESSAGE:
        return json_pack("{s:s, s:s, s:s, s:o}", "type", "message", "id", it->id, "role",
                         "assistant", "content", buf_json(&it->text));
    case ITEM_FUNCTION_CALL:
        return json_pack("{s:s, s:s, s:o, s:o, s:o}", "type", "function_call", "id", it->id,
                         "call_id", server_json_text(it->call_id, strlen(it->call_id)), "name",
                         server_json_text(it->name, strlen(it->name)), "arguments",
                         buf_json(&it->text));
    }
    return json_null();
}

static void close_item(api_call *call, resp_state *st) {
    if (!st->open) return;
    st->open = false;
    size_t index = st->n_items - 1;
    out_item *it = &st->items[index];
    bool cut = st->finish_reason &&
               (!strcmp(st->finish_reason, "length") || !strcmp(st->finish_reason, "abort") ||
                !strcmp(st->finish_reason, "error"));
    it->status = cut ? "incomplete" : "completed";
    if (!call->params.stream) return;
    json_int_t oi = (json_int_t)index;
    if (it->kind == ITEM_REASONING) {
        emit(call, st, "response.reasoning_text.done",
             json_pack("{s:s, s:I, s:i, s:o}", "item_id", it->id, "output_index", oi,
                       "content_index", 0, "text", buf_json(&it->text)));
        emit(call, st, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:o}}", "item_id", it->id, "output_index", oi,
                       "content_index", 0, "part", "type", "reasoning_text", "text",
                       buf_json(&it->text)));
    } else if (it->kind == ITEM_MESSAGE) {
        emit(call, st, "response.output_text.done",
             json_pack("{s:s, s:I, s:i, s:o, s:o}", "item_id", it->id, "output_index", oi,
                       "content_index", 0, "text", buf_json(&it->text), "logprobs",
                       item_logprobs(it)));
        emit(call, st, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:o, s:[], s:o}}", "item_id", it->id,
                       "output_index", oi, "content_index", 0, "part", "type", "output_text",
                       "text", buf_json(&it->text), "annotations", "logprobs", item_logprobs(it)));
    } else {
        emit(call, st, "response.function_call_arguments.done",
             json_pack("{s:s, s:I, s:o}", "item_id", it->id, "output_index", oi, "arguments",
                       buf_json(&it->text)));
    }
    emit(call, st, "response.output_item.done",
         json_pack("{s:I, s:o}", "output_index", oi, "item", item_json(st, it, true)));
}

static out_item *open_item(api_call *call, resp_state *st, item_kind kind, const char *call_id,
                           const char *name) {
    close_item(call, st);
    if (st->n_items == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 4;
        out_item *grown = realloc(st->items, cap * sizeof *grown);
        if (!grown) {
            call->out.failed = true;
            return NULL;
        }
        st->items = grown, st->cap = cap;
    }
    size_t index = st->n_items++;
    out_item *it = &st->items[index];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    static const char *const prefix[] = {"rs", "msg", "fc"};
    /* call->id is "resp_<hex>": items share its hex, then their index */
    snprintf(it->id, sizeof it->id, "%s_%s_%zu", prefix[kind], call->id + 5, index);
    if (kind == ITEM_FUNCTION_CALL) {
        it->call_id = strdup(call_id);
        it->name = strdup(name);
        if (!it->call_id || !it->name) call->out.failed = true;
    }
    st->open = true;
    if (!call->params.stream) return it;
    json_int_t oi = (json_int_t)index;
    emit(call, st, "response.output_item.added",
         json_pack("{s:I, s:o}", "output_index", oi, "item", item_json(st, it, false)));
    if (kind == ITEM_REASONING)
        emit(call, st, "response.content_part.added",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:s}}", "item_id", it->id, "output_index", oi,
                       "content_index", 0, "part", "type", "reasoning_text", "text", ""));
    else if (kind == ITEM_MESSAGE)
        emit(call, st, "response.content_part.added",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", it->id,
                       "output_index", oi, "content_index", 0, "part", "type", "output_text",
                       "text", "", "annotations", "logprobs"));
    return it;
}

static out_item *current(resp_state *st, item_kind kind) {
    return st->open && st->items[st->n_items - 1].kind == kind ? &st->items[st->n_items - 1] : NULL;
}

/* "completed", "incomplete", "cancelled" or "failed", from how the generation finished. */
static const char *final_status(const resp_state *st) {
    const char *f = st->finish_reason ? st->finish_reason : "stop";
    if (!strcmp(f, "length")) return "incomplete";
    if (!strcmp(f, "abort")) return "cancelled";
    if (!strcmp(f, "error")) return "failed";
    return "completed";
}

static json_t *usage_json(api_call *call) {
    gen_usage u = generation_usage(call->gen);
    int32_t cached = call->request ? gptoss_request_cached_prompt_tokens(call->request) : 0;
    call->cached_prompt_tokens = cached;
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", call->n_prompt,
                     "input_tokens_details", "cached_tokens", cached, "output_tokens",
                     u.completion_tokens, "output_tokens_details", "reasoning_tokens",
                     u.reasoning_tokens, "total_tokens", call->n_prompt + u.completion_tokens);
}

/* The Response object; `final`: with every output item and the usage. */
static json_t *response_json(api_call *call, resp_state *st, const char *status, bool final) {
    json_t *r =
        json_pack("{s:s, s:s, s:I, s:s, s:b}", "id", call->id, "object", "response", "created_at",
                  (json_int_t)call->created, "status", status, "background", st->req->background);
    json_t *error = json_null();
    if (!strcmp(status, "failed")) {
        const char *m = generation_error(call->gen);
        error = json_pack("{s:s, s:o}", "code", "server_error", "message",
                          server_json_text(m, strlen(m)));
    }
    json_object_set_new(r, "error", error);
    json_object_set_new(r, "incomplete_details",
                        !strcmp(status, "incomplete")
                            ? json_pack("{s:s}", "reason", "max_output_tokens")
                            : json_null());
    json_object_update(r, st->req->echo);
    json_t *output = json_array();
    for (size_t i = 0; final && i < st->n_items; i++)
        json_array_append_new(output, item_json(st, &st->items[i], true));
    json_object_set_new(r, "output", output);
    json_object_set_new(r, "usage", final ? usage_json(call) : json_null());
    return r;
}

/* The last event of a stream, named after the response's final status. */
static void emit_final(api_call *call, resp_state *st, json_t *r) {
    const char *status = json_string_value(json_object_get(r, "status"));
    const char *type = !strcmp(status, "completed")    ? "response.completed"
                       : !strcmp(status, "incomplete") ? "response.incomplete"
                                                       : "response.failed";
    emit(call, st, type, json_pack("{s:O}", "response", r));
}

/* A background job's events so far go to its log in the store (call->out is only a buffer). */
static void flush_events(api_call *call, resp_state *st) {
    if (call->out.len && !call->out.failed)
        response_store_job_events(st->req->store, call->id, call->out.data, call->out.len);
    call->out.len = 0;
}

/* Ends the response: closes the open item, builds the final object and keeps it in the store
 * (with the conversation, for previous_response_id) when the request asked for that. A
 * background response's log gets its last event before the job ends. */
static json_t *finish(api_call *call, resp_state *st) {
    close_item(call, st);
    json_t *r = response_json(call, st, final_status(st), true);
    resp_request *req = st->req;
    if (req->background) {
        emit_final(call, st, r);
        flush_events(call, st);
    }
    if (!req->store_it || !req->store) return r;
    json_t *items = json_deep_copy(req->items);
    /* every item gets an id once, here, so that input_items can name it and page by it */
    size_t k;
    json_t *it;
    json_array_foreach(items, k, it) {
        if (json_object_get(it, "id")) continue;
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *prefix = !strcmp(type, "message")         ? "msg"
                             : !strcmp(type, "reasoning")     ? "rs"
                             : !strcmp(type, "function_call") ? "fc"
                                                              : "fco";
        char id[128];
        snprintf(id, sizeof id, "%s_%s_in%zu", prefix, call->id + 5, k);
        json_object_set_new(it, "id", json_string(id));
    }
    for (size_t i = 0; i < st->n_items; i++)
        json_array_append_new(items, item_normalized(&st->items[i]));
    char *response_text = json_dumps(r, JSON_COMPACT);
    char *items_text = json_dumps(items, JSON_COMPACT);
    json_decref(items);
    if (response_text && items_text) {
        if (req->background)
            response_store_job_end(req->store, call->id, response_text, items_text);
        else
            response_store_put(req->store, call->id, response_text, items_text);
    } else if (req->background) {
        response_store_job_end(req->store, call->id, "{}", NULL);
    }
    free(response_text);
    free(items_text);
    return r;
}

static bool resp_init(api_call *call, void *state) {
    resp_state *st = state;
    st->req = handoff;
    handoff = NULL;
    if (!st->req) return false;
    char *dash = strchr(call->id, '-'); /* OpenAI's ids read "resp_<hex>" */
    if (dash) *dash = '_';
    if (call->params.stream) {
        emit(call, st, "response.created",
             json_pack("{s:o}", "response", response_json(call, st, "in_progress", false)));
        emit(call, st, "response.in_progress",
             json_pack("{s:o}", "response", response_json(call, st, "in_progress", false)));
    }
    return true;
}

static void resp_fini(api_call *call, void *state) {
    (void)call;
    resp_state *st = state;
    for (size_t i = 0; i < st->n_items; i++) {
        gptoss_chat_buf_free(&st->items[i].text);
        free(st->items[i].call_id);
        free(st->items[i].name);
        json_decref(st->items[i].logprobs);
    }
    json_decref(st->pending);
    free(st->items);
    responses_request_free(st->req);
}

static void resp_event(api_call *call, void *state, const gen_event *ev) {
    resp_state *st = state;
    bool stream = call->params.stream;
    out_item *it;
    switch (ev->kind) {
    case GEN_REASONING:
    case GEN_CONTENT: {
        item_kind kind = ev->kind == GEN_REASONING ? ITEM_REASONING : ITEM_MESSAGE;
        if (!(it = current(st, kind)) && !(it = open_item(call, st, kind, NULL, NULL))) return;
        gptoss_chat_buf_append(&it->text, ev->text, ev->len);
        /* the tokens since the last text made this text (reasoning keeps no logprobs) */
        json_t *logprobs = st->pending ? st->pending : json_array();
        st->pending = NULL;
        if (kind == ITEM_MESSAGE && st->req->logprobs) {
            if (!it->logprobs) it->logprobs = json_array();
            json_array_extend(it->logprobs, logprobs);
        }
        if (stream)
            emit(call, st,
                 kind == ITEM_REASONING ? "response.reasoning_text.delta"
                                        : "response.output_text.delta",
                 kind == ITEM_REASONING
                     ? json_pack("{s:s, s:I, s:i, s:o}", "item_id", it->id, "output_index",
                                 (json_int_t)(st->n_items - 1), "content_index", 0, "delta",
                                 server_json_text(ev->text, ev->len))
                     : json_pack("{s:s, s:I, s:i, s:o, s:O}", "item_id", it->id, "output_index",
                                 (json_int_t)(st->n_items - 1), "content_index", 0, "delta",
                                 server_json_text(ev->text, ev->len), "logprobs", logprobs));
        json_decref(logprobs);
        break;
    }
    case GEN_TOOL_CALL:
        json_decref(st->pending);
        st->pending = NULL;
        open_item(call, st, ITEM_FUNCTION_CALL, ev->call_id, ev->name);
        break;
    case GEN_TOOL_ARGUMENTS:
        json_decref(st->pending);
        st->pending = NULL;
        if (!(it = current(st, ITEM_FUNCTION_CALL))) return;
        gptoss_chat_buf_append(&it->text, ev->text, ev->len);
        if (stream)
            emit(call, st, "response.function_call_arguments.delta",
                 json_pack("{s:s, s:I, s:o}", "item_id", it->id, "output_index",
                           (json_int_t)(st->n_items - 1), "delta",
                           server_json_text(ev->text, ev->len)));
        break;
    case GEN_FINISH:
        st->finish_reason = ev->finish_reason;
        close_item(call, st);
        break;
    case GEN_LOGPROB:
        /* A special token (a harmony header or end) is no text of any item: the ordinary
         * tokens of a header ("final") are dropped with it, as the header's <|message|>
         * comes after them. */
        if (gptoss_tokenizer_is_special(call->tokenizer, ev->token->token_id)) {
            json_decref(st->pending);
            st->pending = NULL;
        } else if (st->req->logprobs) {
            if (!st->pending) st->pending = json_array();
            json_array_append_new(st->pending, api_logprob_entry(call, ev->token));
        }
        break;
    case GEN_END_OF_EVENT:
        break;
    }
}

static void resp_stream_end(api_call *call, void *state) {
    resp_state *st = state;
    json_t *r = finish(call, st);
    emit_final(call, st, r);
    json_decref(r);
}

static json_t *resp_response(api_call *call, void *state) {
    return finish(call, state);
}

const api_encoder api_responses_encoder = {
    .name = "responses",
    .id_prefix = "resp",
    .text_mode = GEN_TEXT_HARMONY,
    .reports_abort = true,
    .state_size = sizeof(resp_state),
    .init = resp_init,
    .fini = resp_fini,
    .event = resp_event,
    .stream_end = resp_stream_end,
    .response = resp_response,
};

bool api_responses_prepare(const json_t *echo, const json_t *items, response_store *store,
                           bool store_it, bool background, bool logprobs,
                           bool encrypted_reasoning) {
    resp_request *rr = calloc(1, sizeof *rr);
    if (!rr) return false;
    rr->echo = json_deep_copy(echo);
    rr->items = json_deep_copy(items);
    rr->store = store, rr->store_it = store_it, rr->background = background;
    rr->logprobs = logprobs, rr->encrypted_reasoning = encrypted_reasoning;
    if (!rr->echo || !rr->items) {
        responses_request_free(rr);
        return false;
    }
    responses_request_free(handoff);
    handoff = rr;
    return true;
}

/* ---- background responses -------------------------------------------------------------------- */

/* The job: feeds the engine's events to the encoder, whose server-sent events go to the
 * response's log in the store after each one (readers follow the log, never the job). Nobody
 * waits on it: it ends with the generation, a cancel, or the server's cut at shutdown. */
static void *background_main(void *arg) {
    api_call *call = arg;
    resp_state *st = call->state;
    double start = gptoss_now_seconds();
    gptoss_engine_event ev;
    for (;;) {
        if (atomic_load(&call->server->cut)) {
            /* The drain ran out: end it now, as a foreground stream is cut (the answer stops
             * where it is, "incomplete"), so that its readers get their last event. */
            gptoss_request_cancel(call->request);
            memset(&ev, 0, sizeof ev);
            ev.token_id = -1;
            ev.finish = GPTOSS_FINISH_LENGTH;
            generation_push(call->gen, &ev);
            break;
        }
        int r = gptoss_request_next_event(call->request, &ev, 1000);
        if (r < 0) break;
        if (r == 1) {
            generation_push(call->gen, &ev);
            flush_events(call, st);
        }
    }
    json_t *r = finish(call, st);
    /* its HTTP request was logged when it was accepted: the outcome gets a line of its own */
    GPTOSS_LOG_I("responses", "background %s %s prompt_tokens=%d completion_tokens=%d %.1f ms",
                 call->id, json_string_value(json_object_get(r, "status")), call->n_prompt,
                 generation_usage(call->gen).completion_tokens,
                 (gptoss_now_seconds() - start) * 1000.0);
    json_decref(r);
    api_call_free(call);
    return NULL;
}

static server_reply not_found(const char *id);

/* ---- streams that follow a log: a background response's own, and GET ?stream=true ---------- */

typedef struct log_stream {
    response_store *store;
    response_reader *reader;
    int wake_fd; /* eventfd the store writes to when the log changes */
    struct MHD_Connection *connection;
} log_stream;

/* Sleeps until the log changed -> 0, or the client hung up -> 1. */
static int log_stream_wait(log_stream *ls) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(ls->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return 1;
    for (;;) {
        struct pollfd p[2] = {{.fd = ls->wake_fd, .events = POLLIN},
                              {.fd = info->connect_fd, .events = POLLRDHUP}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return 1;
        if (p[1].revents && server_client_gone(ls->connection)) return 1;
        if (p[0].revents & POLLIN) {
            uint64_t count;
            ssize_t n = read(ls->wake_fd, &count, sizeof count);
            (void)n;
            return 0;
        }
        if (p[1].revents) { /* a hang-up flag without EOF: do not spin on it */
            struct pollfd only = {.fd = ls->wake_fd, .events = POLLIN};
            if (poll(&only, 1, 1000) > 0) {
                uint64_t count;
                ssize_t n = read(ls->wake_fd, &count, sizeof count);
                (void)n;
                return 0;
            }
        }
    }
}

static ssize_t log_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    log_stream *ls = cls;
    for (;;) {
        long n = response_store_reader_read(ls->store, ls->reader, buf, max);
        if (n > 0) return (ssize_t)n;
        if (n == RESPONSE_READ_END) return MHD_CONTENT_READER_END_OF_STREAM;
        /* lost events: ending the stream early tells the client to reconnect (and learn why) */
        if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* the client leaving ends its stream only: the job goes on */
        if (log_stream_wait(ls)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void log_stream_free(void *cls) {
    log_stream *ls = cls;
    response_store_reader_close(ls->store, ls->reader);
    close(ls->wake_fd);
    free(ls);
}

/* A stream of the events of response `id` after sequence number `after` (-1: all). */
static server_reply open_log_stream(gptoss_server *s, const server_request *http, const char *id,
                                    int64_t after) {
    log_stream *ls = calloc(1, sizeof *ls);
    if (!ls) return server_error(500, "server_error", NULL, NULL, "out of memory");
    ls->store = s->responses, ls->connection = http->connection;
    ls->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ls->wake_fd < 0) {
        free(ls);
        return server_error(500, "server_error", NULL, NULL, "out of event descriptors");
    }
    int64_t n_events = 0;
    response_open_result r =
        response_store_reader_open(s->responses, id, after, ls->wake_fd, &ls->reader, &n_events);
    if (r != RESPONSE_OPEN_OK) {
        close(ls->wake_fd);
        free(ls);
    }
    switch (r) {
    case RESPONSE_OPEN_OK:
        break;
    case RESPONSE_OPEN_NOT_FOUND:
        return not_found(id);
    case RESPONSE_OPEN_NO_LOG:
        return server_error(400, "invalid_request_error", "stream", NULL,
                            "stream: response '%.100s' was not made with background: true; only "
                            "background responses can be streamed again",
                            id);
    case RESPONSE_OPEN_TRIMMED:
        return server_error(400, "invalid_request_error", "starting_after", NULL,
                            "starting_after: the events after %lld of response '%.100s' are no "
                            "longer all kept (the store keeps the newest within "
                            "--responses-store-bytes); retrieve it without stream",
                            (long long)after, id);
    case RESPONSE_OPEN_PAST_END:
        return server_error(400, "invalid_request_error", "starting_after", NULL,
                            "starting_after: response '%.100s' has no event %lld (its events so "
                            "far are numbered 0 to %lld)",
                            id, (long long)after, (long long)n_events - 1);
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16 * 1024, log_stream_read, ls, log_stream_free);
    if (!resp) {
        log_stream_free(ls);
        return server_error(500, "server_error", NULL, NULL, "out of memory");
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    /* a long generation may send nothing for longer than the idle timeout */
    server_hold_connection(http->connection);
    return (server_reply){200, resp};
}

static server_reply serve_background(gptoss_server *s, const server_request *http,
                                     const int32_t *prompt, int32_t n_prompt,
                                     request_params *params, resp_request *rr) {
    server_access_set_tokens(http->access, n_prompt, 0);
    /* every background response logs its events, so that any of them can be streamed */
    params->stream = true;
    gptoss_request_options ro = {0};
    if (params->constraint) {
        if (params->sampling.max_tokens == 0) /* as api_call_serve does */
            output_constraint_set_default_max_tokens(params->constraint,
                                                     s->max_model_len - n_prompt);
        output_constraint_bind(params->constraint, &ro);
    }
    gptoss_request *request = NULL;
    gptoss_error err = {0};
    int32_t engine_index = -1;
    gptoss_status st =
        server_submit(s, prompt, n_prompt, &params->sampling, &ro, &request, &engine_index, &err);
    if (st != GPTOSS_OK) {
        request_params_free(params);
        responses_request_free(rr);
        if (st == GPTOSS_ERR_CAPACITY && server_queue_full(s, engine_index)) {
            server_reply r = server_error(429, "rate_limit_error", NULL, "queue_full",
                                          "The server is at capacity: %s", err.message);
            if (r.response)
                MHD_add_response_header(r.response, "Retry-After", SERVER_RETRY_AFTER_SECONDS);
            return r;
        }
        if (st == GPTOSS_ERR_CAPACITY || st == GPTOSS_ERR_INVALID_ARGUMENT)
            return server_error(400, "invalid_request_error", NULL, NULL,
                                "%s (the prompt has %d tokens)", err.message, n_prompt);
        return server_error(500, "server_error", NULL, NULL, "%s", err.message);
    }
    params->constraint = NULL; /* the engine request owns it now */
    handoff = rr;
    api_call *call = NULL;
    st = api_call_create(&api_responses_encoder, s->model_name, s->tokenizer, params, n_prompt,
                         s->id_salt, server_response_number(s, request, engine_index), request,
                         &call, &err);
    if (handoff) { /* init did not run */
        responses_request_free(handoff);
        handoff = NULL;
    }
    if (st != GPTOSS_OK) {
        gptoss_request_release(request);
        server_engine_done(s, engine_index);
        return server_error(500, "server_error", NULL, NULL, "%s", err.message);
    }
    call->server = s;
    call->engine_index = engine_index;
    json_t *first = response_json(call, call->state, "in_progress", false);
    char *first_text = json_dumps(first, JSON_COMPACT);
    char *items_text = json_dumps(rr->items, JSON_COMPACT);
    bool begun = first_text && items_text &&
                 response_store_job_begin(s->responses, call->id, first_text, items_text, request);
    free(first_text);
    free(items_text);
    if (!begun) {
        json_decref(first);
        api_call_free(call); /* releases the request, which cancels it */
        return server_error(429, "rate_limit_error", "background", "too_many_background",
                            "Too many background responses are running; retry later");
    }
    flush_events(call, call->state); /* response.created, response.in_progress */
    /* A stream follows the log from its first event, attached before the job can end. */
    server_reply reply = {0, NULL};
    if (rr->stream) {
        reply = open_log_stream(s, http, call->id, -1);
        if (!reply.response || reply.status != 200) {
            gptoss_request_cancel(request);
            json_decref(finish(call, call->state));
            api_call_free(call);
            json_decref(first);
            return reply;
        }
    }
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &attr, background_main, call);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        gptoss_request_cancel(request);
        json_decref(finish(call, call->state));
        api_call_free(call);
        json_decref(first);
        if (reply.response) MHD_destroy_response(reply.response);
        return server_error(500, "server_error", NULL, NULL, "cannot start a background thread");
    }
    if (reply.response) {
        json_decref(first);
        return reply;
    }
    return server_json(200, first);
}

/* ---- endpoints ---------------------------------------------------------------------------------
 */

server_reply server_responses_create(gptoss_server *s, const server_request *http) {
    json_t *req = NULL;
    server_reply reply = api_parse_body(s, http, &req);
    if (!req) return reply;
    resp_request *rr = calloc(1, sizeof *rr);
    json_t *chat = json_object();
    if (!rr || !chat || !(rr->echo = json_object()) || !(rr->items = json_array())) {
        responses_request_free(rr);
        json_decref(chat);
        json_decref(req);
        return server_error(500, "server_error", NULL, NULL, "out of memory");
    }
    rr->store = s->responses;
    field_error fe = {0};
    unsigned status = 400;
    request_params params;
    memset(&params, 0, sizeof params);
    bool ok = responses_read_request(s, req, chat, rr, &status, &fe);
    json_decref(req);
    int32_t vocab = gptoss_tokenizer_n_vocab(s->tokenizer);
    ok = ok && request_params_parse(chat, vocab, 1, &params, &fe);
    if (ok && rr->logprobs) {
        params.sampling.logprobs = true;
        params.sampling.top_logprobs = rr->top_logprobs;
    }
    ok = ok && request_params_finish(&params, vocab, &fe) &&
         output_constraint_create(chat, s->tokenizer, 1, params.sampling.max_tokens,
                                  &params.constraint, &fe);
    gptoss_chat_prompt prompt = {0};
    if (ok) {
        gptoss_openai_chat_options chat_options = {0};
        gptoss_error err = {0};
        gptoss_status st =
            gptoss_chat_prompt_from_request(s->tokenizer, chat, &chat_options, &prompt, &err);
        if (st == GPTOSS_ERR_OUT_OF_MEMORY) {
            ok = false, status = 500;
            field_fail(&fe, "", "out of memory");
        } else if (st != GPTOSS_OK) {
            ok = false;
            snprintf(fe.message, sizeof fe.message, "%s", err.message);
            param_of_message(err.message, fe.param, sizeof fe.param);
        }
    }
    json_decref(chat);
    if (!ok) {
        request_params_free(&params); /* safe on the zeroed struct, and after a failed parse */
        responses_request_free(rr);
        gptoss_chat_prompt_free(&prompt);
        responses_rename_param(&fe);
        if (status == 404)
            return server_error(404, "invalid_request_error", fe.param,
                                "previous_response_not_found", "%s", fe.message);
        return server_error(status, status == 500 ? "server_error" : "invalid_request_error",
                            fe.param[0] ? fe.param : NULL, NULL, "%s", fe.message);
    }
    /* The engine would name max_tokens: say it in this request's words. */
    int64_t n_prompt = (int64_t)prompt.tokens.n, max_new = params.sampling.max_tokens;
    if (n_prompt >= s->max_model_len ||
        (params.has_max_tokens && n_prompt + max_new > s->max_model_len)) {
        request_params_free(&params);
        responses_request_free(rr);
        gptoss_chat_prompt_free(&prompt);
        bool prompt_alone = n_prompt >= s->max_model_len;
        return server_error(
            400, "invalid_request_error", prompt_alone ? "input" : "max_output_tokens",
            "context_length_exceeded",
            "%s: the input has %lld tokens%s; the context holds %d (--max-model-len)",
            prompt_alone ? "input" : "max_output_tokens", (long long)n_prompt,
            prompt_alone ? "" : " and max_output_tokens asks for more than fits",
            (int)s->max_model_len);
    }
    if (rr->background) {
        reply = serve_background(s, http, prompt.tokens.ids, (int32_t)prompt.tokens.n, &params, rr);
    } else {
        handoff = rr;
        reply = api_call_serve(s, http, &api_responses_encoder, prompt.tokens.ids,
                               (int32_t)prompt.tokens.n, &params);
        responses_request_free(handoff); /* still here when the call was never made */
        handoff = NULL;
    }
    gptoss_chat_prompt_free(&prompt);
    return reply;
}

static server_reply not_found(const char *id) {
    return server_error(404, "invalid_request_error", NULL, "not_found",
                        "Response with id '%.100s' not found: it was stored with store: false, "
                        "deleted, evicted from the response store (--responses-store-bytes), or "
                        "never existed",
                        id);
}

/* A normalized item (responses_input.h) as the API lists it. */
static json_t *item_listed(const json_t *it) {
    const char *type = json_string_value(json_object_get(it, "type"));
    json_t *id = json_object_get(it, "id");
    if (!strcmp(type, "message")) {
        const char *role = json_string_value(json_object_get(it, "role"));
        bool assistant = !strcmp(role, "assistant");
        json_t *part = json_pack("{s:s, s:O}", "type", assistant ? "output_text" : "input_text",
                                 "text", json_object_get(it, "content"));
        if (assistant) json_object_set_new(part, "annotations", json_array());
        return json_pack("{s:O, s:s, s:s, s:s, s:[o]}", "id", id, "type", "message", "role", role,
                         "status", "completed", "content", part);
    }
    if (!strcmp(type, "reasoning"))
        return json_pack("{s:O, s:s, s:[], s:[{s:s, s:O}]}", "id", id, "type", "reasoning",
                         "summary", "content", "type", "reasoning_text", "text",
                         json_object_get(it, "text"));
    json_t *listed = json_deep_copy(it);
    json_object_set_new(listed, "status", json_string("completed"));
    return listed;
}

/* GET /v1/responses/{id}/input_items: the conversation the response answered (the previous
 * chain's items included), paged by item id: after, limit (1..100, default 20), order
 * (asc, or desc: the default). */
static server_reply list_input_items(gptoss_server *s, const server_request *http, const char *id) {
    struct MHD_Connection *c = http->connection;
    const char *limit_text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    long limit = 20;
    if (limit_text) {
        char *end = NULL;
        limit = strtol(limit_text, &end, 10);
        if (!*limit_text || *end || limit < 1 || limit > 100)
            return server_error(400, "invalid_request_error", "limit", NULL,
                                "limit: expected an integer in [1, 100]");
    }
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        return server_error(400, "invalid_request_error", "order", NULL,
                            "order: expected \"asc\" or \"desc\"");
    bool ascending = order && !strcmp(order, "asc");
    char *response_text = NULL, *items_text = NULL;
    if (!response_store_get(s->responses, id, &response_text, &items_text, NULL))
        return not_found(id);
    json_t *response = json_loads(response_text, 0, NULL);
    json_t *items = items_text ? json_loads(items_text, 0, NULL) : NULL;
    free(response_text);
    free(items_text);
    size_t n_output = json_array_size(json_object_get(response, "output"));
    size_t n = json_array_size(items) >= n_output ? json_array_size(items) - n_output : 0;
    json_decref(response);
    /* positions in listing order; `after` starts past the item it names */
    size_t start = 0;
    if (after) {
        size_t i;
        for (i = 0; i < n; i++) {
            size_t at = ascending ? i : n - 1 - i;
            const char *item_id =
                json_string_value(json_object_get(json_array_get(items, at), "id"));
            if (item_id && !strcmp(item_id, after)) break;
        }
        if (i == n) {
            json_decref(items);
            return server_error(400, "invalid_request_error", "after", NULL,
                                "after: no input item '%.100s' in response '%.100s'", after, id);
        }
        start = i + 1;
    }
    json_t *data = json_array();
    for (size_t i = start; i < n && json_array_size(data) < (size_t)limit; i++)
        json_array_append_new(data, item_listed(json_array_get(items, ascending ? i : n - 1 - i)));
    size_t got = json_array_size(data);
    json_t *body =
        json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", start + got < n);
    json_object_set(body, "first_id",
                    got ? json_object_get(json_array_get(data, 0), "id") : json_null());
    json_object_set(body, "last_id",
                    got ? json_object_get(json_array_get(data, got - 1), "id") : json_null());
    json_decref(items);
    return server_json(200, body);
}

static server_reply stored_json(char *text) {
    server_reply r = {200, server_buffer_response(text, strlen(text), "application/json")};
    free(text);
    return r;
}

/* GET|DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel. */
server_reply server_responses_item(gptoss_server *s, const server_request *http) {
    const char *rest = http->url + strlen("/v1/responses/");
    char id[128];
    size_t n = strcspn(rest, "/");
    if (n == 0 || n >= sizeof id)
        return server_error(404, "invalid_request_error", NULL, "not_found",
                            "No route %s %s: expected /v1/responses/{id}", http->method, http->url);
    memcpy(id, rest, n);
    id[n] = '\0';
    const char *tail = rest + n;
    const char *m = http->method;
    if (!strcmp(tail, "/cancel")) {
        if (strcmp(m, "POST") != 0)
            return server_error(405, "invalid_request_error", NULL, "method_not_allowed",
                                "Method %s is not allowed on %s; use POST", m, http->url);
        char *text = NULL;
        response_cancel_result r = response_store_cancel(s->responses, id, 10.0, &text);
        if (r == RESPONSE_CANCEL_NOT_FOUND) return not_found(id);
        if (r == RESPONSE_CANCEL_NOT_BACKGROUND)
            return server_error(400, "invalid_request_error", NULL, NULL,
                                "Only background responses can be cancelled; '%.100s' was not "
                                "made with background: true",
                                id);
        if (!text) return not_found(id); /* deleted while cancelling */
        return stored_json(text);
    }
    if (!strcmp(tail, "/input_items")) {
        if (strcmp(m, "GET") != 0)
            return server_error(405, "invalid_request_error", NULL, "method_not_allowed",
                                "Method %s is not allowed on %s; use GET", m, http->url);
        return list_input_items(s, http, id);
    }
    if (tail[0])
        return server_error(404, "invalid_request_error", NULL, "not_found",
                            "No route %s %s: expected /v1/responses/{id}, "
                            "/v1/responses/{id}/input_items or /v1/responses/{id}/cancel",
                            m, http->url);
    if (!strcmp(m, "GET")) {
        struct MHD_Connection *c = http->connection;
        const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
        const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "starting_after");
        if (stream && strcmp(stream, "true") && strcmp(stream, "false"))
            return server_error(400, "invalid_request_error", "stream", NULL,
                                "stream: expected true or false");
        if (stream && !strcmp(stream, "true")) {
            long long n = -1;
            if (after) {
                char *end = NULL;
                errno = 0;
                n = strtoll(after, &end, 10);
                if (!*after || *end || errno || n < 0)
                    return server_error(400, "invalid_request_error", "starting_after", NULL,
                                        "starting_after: expected a sequence number (an integer "
                                        ">= 0)");
            }
            return open_log_stream(s, http, id, (int64_t)n);
        }
        char *text = NULL;
        if (!response_store_get(s->responses, id, &text, NULL, NULL)) return not_found(id);
        return stored_json(text);
    }
    if (!strcmp(m, "DELETE")) {
        if (!response_store_delete(s->responses, id)) return not_found(id);
        return server_json(
            200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
    }
    return server_error(405, "invalid_request_error", NULL, "method_not_allowed",
                        "Method %s is not allowed on %s; use GET or DELETE", m, http->url);
}
