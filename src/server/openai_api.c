/*
 * openai_api.c - the OpenAI generation endpoints: POST /v1/chat/completions and
 * POST /v1/completions, streaming (server-sent events) and not.
 *
 * Owns: reading the request's sampling fields (every bad value answered 400 naming the
 * field), the prompt (harmony rendering for chat, the tokenizer for completions), one engine
 * request per HTTP request, and the translation of engine events into OpenAI JSON: reasoning
 * and content separated by chat.h (the harmony parser), tool calls, stop strings (matched on the
 * detokenized text, then reported to the engine), logprobs and usage. Must not touch the
 * HTTP plumbing (server.c) or the engine's internals.
 *
 * Stop strings are matched on the answer text (content, or a completion's text), never on
 * reasoning; text that could be the start of a stop string is held back until it is not.
 *
 * A connection thread waits for events in slices of WAIT_SLICE_MS and checks between slices
 * whether its client hung up; if so the request is cancelled, which frees its KV blocks.
 */
#include "server/server_internal.h"

#include "chat/chat.h"
#include "chat/chat_buf.h"
#include "util/error.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_SLICE_MS 50
#define MAX_STOP_STRINGS 16
#define MAX_STOP_BYTES 1024

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- request fields ---------------------------------------------------------------------- */

typedef struct field_error {
    char param[128];    /* the offending field, or "" */
    char message[1100]; /* what is wrong and what is expected */
} field_error;

static bool field_fail(field_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool field_fail(field_error *e, const char *param, const char *fmt, ...) {
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

/* The member, or NULL when absent or null (OpenAI clients send null for "not set"). */
static json_t *member(const json_t *req, const char *key) {
    json_t *v = json_object_get(req, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool get_number(const json_t *req, const char *key, double lo, double hi, float *out,
                       field_error *e) {
    json_t *v = member(req, key);
    if (!v) return true;
    if (!json_is_number(v)) return field_fail(e, key, "%s: expected a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return field_fail(e, key, "%s: %g is out of range [%g, %g]", key, x, lo, hi);
    *out = (float)x;
    return true;
}

static bool get_int(const json_t *req, const char *key, int64_t lo, int64_t hi, int32_t *out,
                    bool *present, field_error *e) {
    json_t *v = member(req, key);
    if (present) *present = v != NULL;
    if (!v) return true;
    if (!json_is_integer(v)) return field_fail(e, key, "%s: expected an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return field_fail(e, key, "%s: %lld is out of range [%lld, %lld]", key, (long long)x,
                          (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return true;
}

static bool get_bool(const json_t *req, const char *key, bool *out, field_error *e) {
    json_t *v = member(req, key);
    if (!v) return true;
    if (!json_is_boolean(v)) return field_fail(e, key, "%s: expected true or false", key);
    *out = json_is_true(v);
    return true;
}

/* Everything a generation needs besides the prompt. */
typedef struct request_options {
    gptoss_sampling_params params; /* for the engine */
    bool stream;                   /* SSE */
    bool include_usage;            /* stream_options.include_usage */
    char *stops[MAX_STOP_STRINGS]; /* stop strings (malloc'd), [n_stops] */
    size_t stop_lens[MAX_STOP_STRINGS];
    int n_stops;
    bool echo_unsupported; /* completions: echo=true was asked */
} request_options;

static void request_options_free(request_options *o) {
    for (int i = 0; i < o->n_stops; i++)
        free(o->stops[i]);
    o->n_stops = 0;
}

static bool parse_stop(const json_t *req, request_options *o, field_error *e) {
    json_t *v = member(req, "stop");
    if (!v) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return true;
        if (json_string_length(v) > MAX_STOP_BYTES)
            return field_fail(e, "stop", "stop: a stop string is limited to %d bytes",
                              MAX_STOP_BYTES);
        o->stops[0] = gptoss_chat_strndup(json_string_value(v), json_string_length(v));
        o->stop_lens[0] = json_string_length(v);
        o->n_stops = o->stops[0] ? 1 : 0;
        return true;
    }
    if (!json_is_array(v))
        return field_fail(e, "stop", "stop: expected a string or an array of strings");
    if (json_array_size(v) > MAX_STOP_STRINGS)
        return field_fail(e, "stop", "stop: at most %d stop strings", MAX_STOP_STRINGS);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return field_fail(e, "stop", "stop[%zu]: expected a string", i);
        if (json_string_length(s) == 0)
            return field_fail(e, "stop", "stop[%zu]: must not be empty", i);
        if (json_string_length(s) > MAX_STOP_BYTES)
            return field_fail(e, "stop", "stop[%zu]: a stop string is limited to %d bytes", i,
                              MAX_STOP_BYTES);
        char *copy = gptoss_chat_strndup(json_string_value(s), json_string_length(s));
        if (!copy) return field_fail(e, "stop", "out of memory");
        o->stops[o->n_stops] = copy;
        o->stop_lens[o->n_stops++] = json_string_length(s);
    }
    return true;
}

static bool parse_options(gptoss_server *s, const json_t *req, bool chat, request_options *o,
                          field_error *e) {
    memset(o, 0, sizeof *o);
    gptoss_sampling_params *p = &o->params;
    *p = gptoss_sampling_params_default();
    bool present = false;
    if (!get_bool(req, "stream", &o->stream, e)) return false;
    json_t *so = member(req, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return field_fail(e, "stream_options", "stream_options: expected an object");
        json_t *iu = member(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return field_fail(e, "stream_options.include_usage",
                              "stream_options.include_usage: expected true or false");
        o->include_usage = iu && json_is_true(iu);
    }
    if (!get_number(req, "temperature", 0, 2, &p->temperature, e)) return false;
    if (!get_number(req, "top_p", 0, 1, &p->top_p, e)) return false;
    if (member(req, "top_p") && p->top_p <= 0)
        return field_fail(e, "top_p", "top_p: must be in (0, 1]");
    if (!get_int(req, "top_k", -1, 1 << 30, &p->top_k, NULL, e)) return false;
    if (!get_number(req, "min_p", 0, 1, &p->min_p, e)) return false;
    if (!get_number(req, "presence_penalty", -2, 2, &p->presence_penalty, e)) return false;
    if (!get_number(req, "frequency_penalty", -2, 2, &p->frequency_penalty, e)) return false;
    if (!get_number(req, "repetition_penalty", 1e-6, 1e6, &p->repetition_penalty, e)) return false;
    json_t *seed = member(req, "seed");
    if (seed) {
        if (!json_is_integer(seed)) return field_fail(e, "seed", "seed: expected an integer");
        p->has_seed = true;
        p->seed = (uint64_t)json_integer_value(seed);
    }
    if (chat) {
        if (!get_bool(req, "logprobs", &p->logprobs, e)) return false;
        if (!get_int(req, "top_logprobs", 0, GPTOSS_MAX_TOP_LOGPROBS, &p->top_logprobs, &present,
                     e))
            return false;
        if (present && p->top_logprobs > 0 && !p->logprobs)
            return field_fail(e, "top_logprobs", "top_logprobs: needs \"logprobs\": true");
    } else {
        int32_t k = 0;
        if (!get_int(req, "logprobs", 0, GPTOSS_MAX_TOP_LOGPROBS, &k, &present, e)) return false;
        if (present) p->logprobs = true, p->top_logprobs = k;
        bool echo = false;
        if (!get_bool(req, "echo", &echo, e)) return false;
        if (echo)
            return field_fail(e, "echo",
                              "echo: echoing the prompt is not supported; leave it false");
        json_t *suffix = member(req, "suffix");
        if (suffix) return field_fail(e, "suffix", "suffix: insertion is not supported by gpt-oss");
        json_t *best_of = member(req, "best_of");
        if (best_of && !(json_is_integer(best_of) && json_integer_value(best_of) == 1))
            return field_fail(e, "best_of", "best_of: only 1 is supported");
    }
    int32_t max_tokens = 0;
    bool has_max = false, has_mct = false;
    if (!get_int(req, "max_tokens", 1, INT32_MAX, &max_tokens, &has_max, e)) return false;
    if (chat && !get_int(req, "max_completion_tokens", 1, INT32_MAX, &max_tokens, &has_mct, e))
        return false;
    if (has_max || has_mct)
        p->max_tokens = max_tokens;
    else if (!chat)
        p->max_tokens = 16; /* the completions API's documented default */
    if (!get_int(req, "min_tokens", 0, INT32_MAX, &p->min_tokens, NULL, e)) return false;
    if (!get_bool(req, "ignore_eos", &p->ignore_eos, e)) return false;
    if (!get_int(req, "n", 1, s->max_num_seqs, &p->n, &present, e)) return false;
    json_t *ids = member(req, "stop_token_ids");
    if (ids) {
        if (!json_is_array(ids))
            return field_fail(e, "stop_token_ids", "stop_token_ids: expected an array of integers");
        if (json_array_size(ids) > GPTOSS_MAX_STOP_TOKENS)
            return field_fail(e, "stop_token_ids", "stop_token_ids: at most %d ids",
                              GPTOSS_MAX_STOP_TOKENS);
        size_t i;
        json_t *id;
        int32_t vocab = gptoss_tokenizer_n_vocab(s->tokenizer);
        json_array_foreach(ids, i, id) {
            if (!json_is_integer(id) || json_integer_value(id) < 0 ||
                json_integer_value(id) >= vocab)
                return field_fail(e, "stop_token_ids",
                                  "stop_token_ids[%zu]: expected a token id in [0, %d)", i, vocab);
            p->stop_token_ids[p->n_stop_token_ids++] = (int32_t)json_integer_value(id);
        }
    }
    if (!parse_stop(req, o, e)) return false;
    if (o->include_usage && !o->stream)
        return field_fail(e, "stream_options",
                          "stream_options: only allowed when \"stream\" is true");
    gptoss_error err = {0};
    if (gptoss_sampling_params_validate(p, gptoss_tokenizer_n_vocab(s->tokenizer), &err) !=
        GPTOSS_OK) {
        char param[128] = "";
        const char *colon = strchr(err.message, ':');
        if (colon && (size_t)(colon - err.message) < sizeof param &&
            !memchr(err.message, ' ', (size_t)(colon - err.message)))
            memcpy(param, err.message, (size_t)(colon - err.message)),
                param[colon - err.message] = '\0';
        return field_fail(e, param, "%s", err.message);
    }
    return true;
}

/* ---- generation state -------------------------------------------------------------------- */

typedef struct choice_state {
    int32_t index;                 /* choice number 0..n-1 */
    gptoss_chat_stream *chat;      /* chat: generated ids -> reasoning/content/tool calls */
    gptoss_stream_decoder decoder; /* completions: tokens -> UTF-8 text */
    gptoss_chat_buf content;       /* answer text so far (cut at a stop string) */
    size_t content_emitted;        /* bytes of content already handed out */
    gptoss_chat_buf reasoning;     /* chat, non-streaming: analysis text */
    json_t *tool_calls;            /* chat, non-streaming: [{id,type,function{name,arguments}}] */
    gptoss_chat_buf tool_args;     /* arguments of the open tool call (non-streaming) */
    int32_t n_tool_calls;          /* tool calls started */
    bool stopped;                  /* a stop string matched: later tokens are ignored */
    bool finished;                 /* the finish event was handled */
    bool started;                  /* streaming: the role chunk was sent */
    const char *finish_reason;     /* "stop", "length", "tool_calls", "abort", "error" */
    int32_t n_tokens;              /* generated tokens (usage) */
    int32_t n_reasoning_tokens;    /* tokens that produced analysis text */
    json_t *logprobs;              /* non-streaming logprob entries, or NULL */
} choice_state;

typedef struct generation {
    gptoss_server *server;
    struct MHD_Connection *connection;
    gptoss_request *request; /* our reference; released in generation_free */
    bool chat;               /* chat.completion vs text_completion */
    request_options options;
    int32_t n_prompt; /* prompt tokens */
    int32_t n_choices;
    choice_state *choices; /* [n_choices] */
    size_t max_stop_len;   /* longest stop string, bytes */
    char id[64];           /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;       /* unix seconds */
    char *text_scratch;    /* completions: decoder output, [text_scratch_cap] */
    size_t text_scratch_cap;
    gptoss_chat_buf out;                  /* streaming: SSE bytes not yet handed to MHD */
    size_t out_pos;                       /* bytes of out already handed over */
    bool done;                            /* streaming: [DONE] queued */
    double last_gone_check;               /* when the client was last checked for a hang-up, s */
    char error[GPTOSS_ERROR_MESSAGE_MAX]; /* a backend failure, or "" */
    /* delta being built for the current streaming event */
    gptoss_chat_buf delta_content, delta_reasoning;
    json_t *delta_tool_calls; /* [] of tool call deltas, or NULL */
    json_t *delta_logprobs;   /* [] of logprob entries, or NULL */
} generation;

static void generation_free(generation *g) {
    if (!g) return;
    gptoss_request_release(g->request);
    for (int32_t i = 0; i < g->n_choices && g->choices; i++) {
        choice_state *c = &g->choices[i];
        gptoss_chat_stream_free(c->chat);
        gptoss_chat_buf_free(&c->content);
        gptoss_chat_buf_free(&c->reasoning);
        gptoss_chat_buf_free(&c->tool_args);
        json_decref(c->tool_calls);
        json_decref(c->logprobs);
    }
    free(g->choices);
    free(g->text_scratch);
    request_options_free(&g->options);
    gptoss_chat_buf_free(&g->out);
    gptoss_chat_buf_free(&g->delta_content);
    gptoss_chat_buf_free(&g->delta_reasoning);
    json_decref(g->delta_tool_calls);
    json_decref(g->delta_logprobs);
    free(g);
}

static json_t *token_text_json(const gptoss_tokenizer *t, int32_t id, json_t **bytes_out) {
    size_t len = 0;
    const char *b = gptoss_tokenizer_token_bytes(t, id, &len);
    if (!b) b = "", len = 0;
    if (bytes_out) {
        *bytes_out = json_array();
        for (size_t i = 0; i < len; i++)
            json_array_append_new(*bytes_out, json_integer((unsigned char)b[i]));
    }
    return server_json_text(b, len);
}

/* Logprob entries of one token: chat {token, logprob, bytes, top_logprobs}; completions
 * {token, logprob, top: {token: logprob}} (assembled into the legacy layout at the end). */
static json_t *logprob_entry(generation *g, const gptoss_engine_event *ev) {
    const gptoss_tokenizer *t = g->server->tokenizer;
    json_t *bytes = NULL;
    json_t *entry = json_object();
    json_object_set_new(entry, "token", token_text_json(t, ev->token_id, &bytes));
    json_object_set_new(entry, "logprob", json_real(isfinite(ev->logprob) ? ev->logprob : -9999.0));
    json_object_set_new(entry, "bytes", bytes);
    json_t *top = json_array();
    for (int32_t k = 0; k < ev->n_top_logprobs; k++) {
        json_t *tb = NULL;
        float lp = ev->top_logprobs[k].logprob;
        json_t *alt = json_object();
        json_object_set_new(alt, "token", token_text_json(t, ev->top_logprobs[k].token_id, &tb));
        json_object_set_new(alt, "logprob", json_real(isfinite(lp) ? lp : -9999.0));
        json_object_set_new(alt, "bytes", tb);
        json_array_append_new(top, alt);
    }
    json_object_set_new(entry, "top_logprobs", top);
    return entry;
}

/* Hands out `n` bytes of content (streaming: into the delta). */
static void emit_content(generation *g, choice_state *c, size_t upto) {
    if (upto <= c->content_emitted) return;
    if (g->options.stream)
        gptoss_chat_buf_append(&g->delta_content, c->content.data + c->content_emitted,
                               upto - c->content_emitted);
    c->content_emitted = upto;
}

/* Adds answer text, cutting it at the first stop string. Text that might be the start of a
 * stop string is held back until it is known not to be. */
static void add_content(generation *g, choice_state *c, const char *text, size_t len) {
    if (c->stopped || len == 0) return;
    size_t old_len = c->content.len;
    gptoss_chat_buf_append(&c->content, text, len);
    if (g->options.n_stops == 0) {
        emit_content(g, c, c->content.len);
        return;
    }
    size_t from = old_len >= g->max_stop_len ? old_len - g->max_stop_len + 1 : 0;
    size_t best = SIZE_MAX;
    for (int i = 0; i < g->options.n_stops; i++) {
        const char *hit = memmem(c->content.data + from, c->content.len - from, g->options.stops[i],
                                 g->options.stop_lens[i]);
        if (hit && (size_t)(hit - c->content.data) < best) best = (size_t)(hit - c->content.data);
    }
    if (best != SIZE_MAX) {
        c->content.len = best;
        c->content.data[best] = '\0';
        emit_content(g, c, best);
        c->stopped = true;
        c->finish_reason = "stop";
        gptoss_request_stop_choice(g->request, c->index);
        return;
    }
    size_t safe = c->content.len > g->max_stop_len - 1 ? c->content.len - (g->max_stop_len - 1) : 0;
    while (safe > c->content_emitted && ((unsigned char)c->content.data[safe] & 0xC0) == 0x80)
        safe--;
    emit_content(g, c, safe);
}

static void tool_call_delta(generation *g, choice_state *c, json_t *delta) {
    if (!g->delta_tool_calls) g->delta_tool_calls = json_array();
    json_array_append_new(g->delta_tool_calls, delta);
}

static void close_tool_call(choice_state *c) {
    if (!c->tool_calls || json_array_size(c->tool_calls) == 0) return;
    json_t *last = json_array_get(c->tool_calls, json_array_size(c->tool_calls) - 1);
    json_t *fn = json_object_get(last, "function");
    json_object_set_new(
        fn, "arguments",
        server_json_text(c->tool_args.data ? c->tool_args.data : "", c->tool_args.len));
}

static void chat_pieces(generation *g, choice_state *c, bool *reasoning_token) {
    size_t n = 0;
    const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(c->chat, &n);
    for (size_t i = 0; i < n; i++) {
        const gptoss_chat_piece *p = &pieces[i];
        switch (p->kind) {
        case GPTOSS_CHAT_PIECE_REASONING:
            *reasoning_token = true;
            if (g->options.stream)
                gptoss_chat_buf_append(&g->delta_reasoning, p->text, p->len);
            else
                gptoss_chat_buf_append(&c->reasoning, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_CONTENT:
            add_content(g, c, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_TOOL_CALL: {
            json_t *name = server_json_text(p->name, strlen(p->name));
            c->n_tool_calls++;
            if (g->options.stream) {
                tool_call_delta(g, c,
                                json_pack("{s:i, s:s, s:s, s:{s:o, s:s}}", "index", p->tool_index,
                                          "id", p->call_id, "type", "function", "function", "name",
                                          name, "arguments", ""));
            } else {
                close_tool_call(c);
                c->tool_args.len = 0;
                if (!c->tool_calls) c->tool_calls = json_array();
                json_array_append_new(c->tool_calls,
                                      json_pack("{s:s, s:s, s:{s:o, s:s}}", "id", p->call_id,
                                                "type", "function", "function", "name", name,
                                                "arguments", ""));
            }
            break;
        }
        case GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS:
            if (g->options.stream)
                tool_call_delta(g, c,
                                json_pack("{s:i, s:{s:o}}", "index", p->tool_index, "function",
                                          "arguments", server_json_text(p->text, p->len)));
            else
                gptoss_chat_buf_append(&c->tool_args, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_FINISH:
            break; /* the engine's finish event decides */
        }
    }
}
static void on_token(generation *g, choice_state *c, const gptoss_engine_event *ev) {
    if (c->stopped) return;
    c->n_tokens++;
    if (g->options.params.logprobs) {
        json_t *entry = logprob_entry(g, ev);
        if (g->options.stream) {
            if (!g->delta_logprobs) g->delta_logprobs = json_array();
            json_array_append_new(g->delta_logprobs, entry);
        } else {
            if (!c->logprobs) c->logprobs = json_array();
            json_array_append_new(c->logprobs, entry);
        }
    }
    if (g->chat) {
        gptoss_error err = {0};
        bool reasoning = false;
        if (gptoss_chat_stream_push(c->chat, ev->token_id, &err) == GPTOSS_OK)
            chat_pieces(g, c, &reasoning);
        if (reasoning) c->n_reasoning_tokens++;
    } else {
        /* The token that ended generation is not part of the text. */
        if (ev->finish == GPTOSS_FINISH_STOP && ev->stop_token_id == ev->token_id) return;
        size_t len = 0;
        gptoss_error err = {0};
        if (gptoss_stream_decoder_push(&c->decoder, ev->token_id, g->text_scratch,
                                       g->text_scratch_cap, &len, &err) == GPTOSS_OK)
            add_content(g, c, g->text_scratch, len);
    }
}

static void on_finish(generation *g, choice_state *c, const gptoss_engine_event *ev) {
    if (c->finished) return;
    c->finished = true;
    if (!c->stopped) {
        if (g->chat) {
            gptoss_error err = {0};
            bool reasoning = false;
            if (gptoss_chat_stream_finish(c->chat, &err) == GPTOSS_OK)
                chat_pieces(g, c, &reasoning);
        } else {
            char tail[8];
            size_t len = 0;
            gptoss_stream_decoder_flush(&c->decoder, tail, sizeof tail, &len);
            add_content(g, c, tail, len);
        }
    }
    if (!c->stopped) emit_content(g, c, c->content.len); /* held-back text was no stop string */
    if (!g->options.stream) close_tool_call(c);
    if (c->finish_reason) return; /* a stop string */
    switch (ev->finish) {
    case GPTOSS_FINISH_STOP:
        c->finish_reason = c->n_tool_calls > 0 ? "tool_calls" : "stop";
        break;
    case GPTOSS_FINISH_LENGTH:
        c->finish_reason = c->n_tool_calls > 0 ? "tool_calls" : "length";
        break;
    case GPTOSS_FINISH_CANCELLED:
        c->finish_reason = "abort";
        break;
    default:
        c->finish_reason = "error";
        snprintf(g->error, sizeof g->error, "%s", gptoss_request_error(g->request));
        if (!g->error[0]) snprintf(g->error, sizeof g->error, "generation failed");
        break;
    }
}

static choice_state *choice_of(generation *g, int32_t index) {
    return index >= 0 && index < g->n_choices ? &g->choices[index] : NULL;
}

static json_t *usage_json(generation *g) {
    int32_t completion = 0, reasoning = 0;
    for (int32_t i = 0; i < g->n_choices; i++)
        completion += g->choices[i].n_tokens, reasoning += g->choices[i].n_reasoning_tokens;
    json_t *u =
        json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", g->n_prompt, "completion_tokens",
                  completion, "total_tokens", g->n_prompt + completion, "prompt_tokens_details",
                  "cached_tokens", gptoss_request_cached_prompt_tokens(g->request));
    if (g->chat)
        json_object_set_new(u, "completion_tokens_details",
                            json_pack("{s:i}", "reasoning_tokens", reasoning));
    return u;
}

/* Legacy completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const json_t *entries) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offsets = json_array();
    size_t i, offset = 0;
    json_t *e;
    json_array_foreach(entries, i, e) {
        json_t *tok = json_object_get(e, "token");
        json_array_append(tokens, tok);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *top = json_object();
        size_t k;
        json_t *alt;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, alt) json_object_set(
            top, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
        json_array_append_new(tops, top);
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += json_string_length(tok);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offsets);
}

/* ---- streaming --------------------------------------------------------------------------- */

static void sse(generation *g, json_t *chunk) {
    char *text = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    if (!text) return;
    gptoss_chat_buf_puts(&g->out, "data: ");
    gptoss_chat_buf_puts(&g->out, text);
    gptoss_chat_buf_puts(&g->out, "\n\n");
    free(text);
}

static json_t *chunk_base(generation *g) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", g->id, "object",
                     g->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)g->created, "model", g->server->model_name);
}

static void send_chunk(generation *g, choice_state *c, json_t *delta_or_text, const char *finish,
                       json_t *logprobs) {
    json_t *ch = json_pack("{s:i}", "index", c->index);
    json_object_set_new(ch, g->chat ? "delta" : "text", delta_or_text);
    json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *chunk = chunk_base(g);
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(chunk, "choices", choices);
    if (g->options.include_usage) json_object_set_new(chunk, "usage", json_null());
    sse(g, chunk);
}

/* Turns the delta built by the last event into a chunk (when it holds anything). */
static void flush_delta(generation *g, choice_state *c) {
    if (g->chat && !c->started) {
        c->started = true;
        send_chunk(g, c, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, NULL);
    }
    bool any =
        g->delta_content.len || g->delta_reasoning.len || g->delta_tool_calls || g->delta_logprobs;
    if (any) {
        json_t *lp = NULL;
        if (g->delta_logprobs)
            lp = g->chat ? json_pack("{s:O}", "content", g->delta_logprobs)
                         : completion_logprobs(g->delta_logprobs);
        if (g->chat) {
            json_t *d = json_object();
            if (g->delta_reasoning.len)
                json_object_set_new(
                    d, "reasoning_content",
                    server_json_text(g->delta_reasoning.data, g->delta_reasoning.len));
            if (g->delta_content.len)
                json_object_set_new(d, "content",
                                    server_json_text(g->delta_content.data, g->delta_content.len));
            if (g->delta_tool_calls) json_object_set(d, "tool_calls", g->delta_tool_calls);
            send_chunk(g, c, d, NULL, lp);
        } else {
            send_chunk(g, c,
                       server_json_text(g->delta_content.data ? g->delta_content.data : "",
                                        g->delta_content.len),
                       NULL, lp);
        }
    }
    g->delta_content.len = g->delta_reasoning.len = 0;
    json_decref(g->delta_tool_calls);
    json_decref(g->delta_logprobs);
    g->delta_tool_calls = g->delta_logprobs = NULL;
}

static void handle_event(generation *g, const gptoss_engine_event *ev) {
    choice_state *c = choice_of(g, ev->index);
    if (!c || c->finished) return;
    if (ev->token_id >= 0) on_token(g, c, ev);
    if (ev->finish != GPTOSS_FINISH_NONE) on_finish(g, c, ev);
    if (g->options.stream) {
        flush_delta(g, c);
        if (c->finished) {
            if (c->finish_reason && !strcmp(c->finish_reason, "error")) {
                json_t *err = json_pack("{s:{s:o, s:s, s:n, s:n}}", "error", "message",
                                        server_json_text(g->error, strlen(g->error)), "type",
                                        "server_error", "param", "code");
                sse(g, err);
            }
            send_chunk(g, c, g->chat ? json_object() : json_string(""), c->finish_reason, NULL);
        }
    }
}

static void finish_stream(generation *g) {
    if (g->options.include_usage) {
        json_t *chunk = chunk_base(g);
        json_object_set_new(chunk, "choices", json_array());
        json_object_set_new(chunk, "usage", usage_json(g));
        sse(g, chunk);
    }
    gptoss_chat_buf_puts(&g->out, "data: [DONE]\n\n");
    g->done = true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    generation *g = cls;
    for (;;) {
        if (g->out_pos < g->out.len) {
            size_t n = g->out.len - g->out_pos;
            if (n > max) n = max;
            memcpy(buf, g->out.data + g->out_pos, n);
            g->out_pos += n;
            if (g->out_pos == g->out.len) g->out_pos = g->out.len = 0;
            return (ssize_t)n;
        }
        if (g->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (g->out.failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        /* Tokens may flow without producing output (text held back for a stop string or a
         * harmony header), so the hang-up check runs on a clock, not only on timeouts. */
        double now = now_seconds();
        if (now - g->last_gone_check >= WAIT_SLICE_MS / 1000.0) {
            g->last_gone_check = now;
            if (server_client_gone(g->connection)) {
                gptoss_request_cancel(g->request);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        gptoss_engine_event ev;
        int r = gptoss_request_next_event(g->request, &ev, WAIT_SLICE_MS);
        if (r == 1) {
            handle_event(g, &ev);
            for (int more = 0; more < 64 && gptoss_request_next_event(g->request, &ev, 0) == 1;
                 more++)
                handle_event(g, &ev);
        } else if (r < 0) {
            finish_stream(g);
        }
    }
}

static void stream_free(void *cls) {
    generation_free(cls);
}

/* ---- shared request path ----------------------------------------------------------------- */

static server_reply bad_request(const field_error *e) {
    return server_error(400, "invalid_request_error", e->param[0] ? e->param : NULL, NULL, "%s",
                        e->message);
}

static server_reply parse_body(const char *body, size_t len, json_t **out) {
    json_error_t jerr;
    *out = NULL;
    if (len == 0)
        return server_error(
            400, "invalid_request_error", NULL, "invalid_json",
            "The request body is empty; send a JSON object (Content-Type: application/json)");
    json_t *req = json_loadb(body, len, 0, &jerr);
    if (!req)
        return server_error(400, "invalid_request_error", NULL, "invalid_json",
                            "The request body is not valid JSON: %s (line %d, column %d)",
                            jerr.text, jerr.line, jerr.column);
    if (!json_is_object(req)) {
        json_decref(req);
        return server_error(400, "invalid_request_error", NULL, "invalid_json",
                            "The request body must be a JSON object");
    }
    *out = req;
    return (server_reply){0, NULL};
}

static server_reply check_model(gptoss_server *s, const json_t *req) {
    json_t *m = json_object_get(req, "model");
    if (!m)
        return server_error(400, "invalid_request_error", "model", NULL,
                            "model: required; this server serves '%s'", s->model_name);
    if (!json_is_string(m))
        return server_error(400, "invalid_request_error", "model", NULL,
                            "model: expected a string");
    if (strcmp(json_string_value(m), s->model_name) != 0)
        return server_error(404, "invalid_request_error", "model", "model_not_found",
                            "The model '%s' does not exist; this server serves '%s'",
                            json_string_value(m), s->model_name);
    return (server_reply){0, NULL};
}

/* Submits the prompt and either streams or collects the answer. Takes ownership of opts. */
static server_reply generate(gptoss_server *s, struct MHD_Connection *conn, bool chat,
                             const int32_t *prompt, int32_t n_prompt, request_options *opts) {
    generation *g = calloc(1, sizeof *g);
    if (!g) {
        request_options_free(opts);
        return server_error(500, "server_error", NULL, NULL, "out of memory");
    }
    g->server = s, g->connection = conn, g->chat = chat, g->options = *opts, g->n_prompt = n_prompt;
    memset(opts, 0, sizeof *opts);
    for (int i = 0; i < g->options.n_stops; i++)
        if (g->options.stop_lens[i] > g->max_stop_len) g->max_stop_len = g->options.stop_lens[i];
    g->created = (int64_t)time(NULL);
    g->n_choices = g->options.params.n;
    g->choices = calloc((size_t)g->n_choices, sizeof *g->choices);
    g->text_scratch_cap = gptoss_stream_decoder_out_capacity(s->tokenizer);
    g->text_scratch = malloc(g->text_scratch_cap);
    gptoss_error err = {0};
    if (!g->choices || !g->text_scratch) {
        generation_free(g);
        return server_error(500, "server_error", NULL, NULL, "out of memory");
    }
    for (int32_t i = 0; i < g->n_choices; i++) {
        choice_state *c = &g->choices[i];
        c->index = i;
        gptoss_stream_decoder_init(&c->decoder, s->tokenizer);
    }
    gptoss_request_options ro = {0};
    gptoss_status st = gptoss_engine_submit(s->engine, prompt, n_prompt, &g->options.params, &ro,
                                            &g->request, &err);
    if (st != GPTOSS_OK) {
        generation_free(g);
        if (st == GPTOSS_ERR_CAPACITY) {
            if (atomic_load(&s->draining))
                return server_error(503, "server_error", NULL, "draining",
                                    "the server is shutting down: %s", err.message);
            if (gptoss_engine_queue_full(s->engine))
                return server_error(429, "rate_limit_error", NULL, "queue_full",
                                    "The server is at capacity (%s); retry later", err.message);
            return server_error(400, "invalid_request_error", "max_tokens",
                                "context_length_exceeded", "%s (the prompt has %d tokens)",
                                err.message, n_prompt);
        }
        if (st == GPTOSS_ERR_INVALID_ARGUMENT)
            return server_error(400, "invalid_request_error", NULL, NULL, "%s", err.message);
        return server_error(500, "server_error", NULL, NULL, "%s", err.message);
    }
    /* Queued behind a full batch or generating a long answer, the connection may carry no
     * bytes for longer than the idle timeout, which would close it under the client. */
    server_hold_connection(conn);
    snprintf(g->id, sizeof g->id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)s->id_salt, (unsigned long long)gptoss_request_id(g->request));
    /* Tool call ids: unique per server run and request, then the call's index. */
    char call_prefix[64];
    snprintf(call_prefix, sizeof call_prefix, "call_%016llx%08llx_", (unsigned long long)s->id_salt,
             (unsigned long long)gptoss_request_id(g->request));
    for (int32_t i = 0; chat && i < g->n_choices; i++) {
        if (gptoss_chat_stream_create(s->tokenizer, call_prefix, &g->choices[i].chat, &err) !=
            GPTOSS_OK) {
            generation_free(g);
            return server_error(500, "server_error", NULL, NULL, "%s", err.message);
        }
    }

    if (g->options.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                   stream_read, g, stream_free);
        if (!r) {
            generation_free(g);
            return server_error(500, "server_error", NULL, NULL, "out of memory");
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        return (server_reply){200, r};
    }

    /* Not streaming: collect every event, watching for a client that gave up. */
    for (;;) {
        gptoss_engine_event ev;
        int r = gptoss_request_next_event(g->request, &ev, WAIT_SLICE_MS);
        if (r == 1)
            handle_event(g, &ev);
        else if (r < 0)
            break;
        double now = now_seconds();
        if (now - g->last_gone_check < WAIT_SLICE_MS / 1000.0) continue;
        g->last_gone_check = now;
        if (server_client_gone(conn)) {
            gptoss_request_cancel(g->request);
            generation_free(g);
            return server_error(499, "invalid_request_error", NULL, "client_closed",
                                "the client closed the connection");
        }
    }
    if (g->error[0]) {
        server_reply e =
            server_error(500, "server_error", NULL, NULL, "generation failed: %s", g->error);
        generation_free(g);
        return e;
    }
    json_t *choices = json_array();
    for (int32_t i = 0; i < g->n_choices; i++) {
        choice_state *c = &g->choices[i];
        json_t *ch = json_pack("{s:i}", "index", i);
        const char *content = c->content.data ? c->content.data : "";
        if (chat) {
            json_t *msg = json_pack("{s:s}", "role", "assistant");
            json_object_set_new(msg, "content",
                                c->content.len || !c->tool_calls
                                    ? server_json_text(content, c->content.len)
                                    : json_null());
            json_object_set_new(msg, "reasoning_content",
                                c->reasoning.len
                                    ? server_json_text(c->reasoning.data, c->reasoning.len)
                                    : json_null());
            if (c->tool_calls) json_object_set(msg, "tool_calls", c->tool_calls);
            json_object_set_new(ch, "message", msg);
            json_object_set_new(ch, "logprobs",
                                c->logprobs ? json_pack("{s:O}", "content", c->logprobs)
                                            : json_null());
        } else {
            json_object_set_new(ch, "text", server_json_text(content, c->content.len));
            json_object_set_new(ch, "logprobs",
                                c->logprobs ? completion_logprobs(c->logprobs) : json_null());
        }
        json_object_set_new(ch, "finish_reason",
                            json_string(c->finish_reason ? c->finish_reason : "stop"));
        json_array_append_new(choices, ch);
    }
    json_t *resp =
        json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", g->id, "object",
                  chat ? "chat.completion" : "text_completion", "created", (json_int_t)g->created,
                  "model", s->model_name, "choices", choices, "usage", usage_json(g));
    generation_free(g);
    return server_json(200, resp);
}

/* The field an error message names ("messages[2].content: ..." -> "messages[2].content"). */
static void param_of(const char *message, char *param, size_t size) {
    param[0] = '\0';
    const char *colon = strchr(message, ':');
    if (!colon || (size_t)(colon - message) >= size ||
        memchr(message, ' ', (size_t)(colon - message)))
        return;
    memcpy(param, message, (size_t)(colon - message));
    param[colon - message] = '\0';
}

server_reply server_chat_completions(gptoss_server *s, struct MHD_Connection *conn,
                                     const char *body, size_t len) {
    json_t *req = NULL;
    server_reply reply = parse_body(body, len, &req);
    if (!req) return reply;
    reply = check_model(s, req);
    if (reply.response) {
        json_decref(req);
        return reply;
    }
    field_error fe = {0};
    request_options opts;
    if (!parse_options(s, req, true, &opts, &fe)) {
        request_options_free(&opts);
        json_decref(req);
        return bad_request(&fe);
    }
    gptoss_openai_chat_options chat_options = {0};
    gptoss_error err = {0};
    gptoss_chat_prompt prompt = {0};
    gptoss_status st =
        gptoss_chat_prompt_from_request(s->tokenizer, req, &chat_options, &prompt, &err);
    json_decref(req);
    if (st != GPTOSS_OK) {
        request_options_free(&opts);
        gptoss_chat_prompt_free(&prompt);
        char param[128];
        param_of(err.message, param, sizeof param);
        return server_error(st == GPTOSS_ERR_OUT_OF_MEMORY ? 500 : 400,
                            st == GPTOSS_ERR_OUT_OF_MEMORY ? "server_error"
                                                           : "invalid_request_error",
                            param[0] ? param : NULL, NULL, "%s", err.message);
    }
    reply = generate(s, conn, true, prompt.tokens.ids, (int32_t)prompt.tokens.n, &opts);
    gptoss_chat_prompt_free(&prompt);
    return reply;
}

/* prompt: a string, an array of token ids, or a one-element array of either. */
static bool completion_prompt(gptoss_server *s, const json_t *req, gptoss_tokens *out,
                              field_error *e) {
    json_t *p = member(req, "prompt");
    if (!p) return field_fail(e, "prompt", "prompt: required (a string or an array of token ids)");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    gptoss_error err = {0};
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return field_fail(e, "prompt", "prompt: must not be empty");
        if (gptoss_tokenizer_encode(s->tokenizer, json_string_value(p), json_string_length(p), true,
                                    out, &err) != GPTOSS_OK)
            return field_fail(e, "prompt", "prompt: %s", err.message);
        return true;
    }
    if (!json_is_array(p))
        return field_fail(e, "prompt", "prompt: expected a string or an array of token ids");
    if (json_array_size(p) == 0) return field_fail(e, "prompt", "prompt: must not be empty");
    int32_t vocab = gptoss_tokenizer_n_vocab(s->tokenizer);
    size_t i;
    json_t *id;
    json_array_foreach(p, i, id) {
        if (json_is_string(id) || json_is_array(id))
            return field_fail(
                e, "prompt",
                "prompt: several prompts in one request are not supported; send one per request");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= vocab)
            return field_fail(e, "prompt", "prompt[%zu]: expected a token id in [0, %d)", i, vocab);
        if (gptoss_tokens_push(out, (int32_t)json_integer_value(id), &err) != GPTOSS_OK)
            return field_fail(e, "prompt", "out of memory");
    }
    return true;
}

server_reply server_completions(gptoss_server *s, struct MHD_Connection *conn, const char *body,
                                size_t len) {
    json_t *req = NULL;
    server_reply reply = parse_body(body, len, &req);
    if (!req) return reply;
    reply = check_model(s, req);
    if (reply.response) {
        json_decref(req);
        return reply;
    }
    field_error fe = {0};
    request_options opts;
    gptoss_tokens prompt = {0};
    bool ok = parse_options(s, req, false, &opts, &fe) && completion_prompt(s, req, &prompt, &fe);
    json_decref(req);
    if (!ok) {
        request_options_free(&opts);
        gptoss_tokens_free(&prompt);
        return bad_request(&fe);
    }
    reply = generate(s, conn, false, prompt.ids, (int32_t)prompt.n, &opts);
    gptoss_tokens_free(&prompt);
    return reply;
}
