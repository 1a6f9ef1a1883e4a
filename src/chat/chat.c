/*
 * chat.c - the chat API of chat.h: request -> prompt ids, generated ids -> OpenAI pieces.
 *
 * Owns: the prompt's stop ids, the tool call ids and names it hands out, and the mapping of
 * harmony parser events to OpenAI pieces:
 *   reasoning delta          -> REASONING
 *   answer delta             -> CONTENT
 *   commentary delta         -> CONTENT with preamble set (text meant for the user)
 *   tool call start          -> TOOL_CALL (new index, id prefix+index, name)
 *   tool call argument delta -> TOOL_ARGUMENTS
 *   turn end                 -> remembered; FINISH comes from gptoss_chat_stream_finish.
 * A call whose arguments hold several JSON objects one after another ({"city":"Paris"}
 * {"city":"Rome"}, perhaps with whitespace or commas between) is several calls of that
 * function, one per object: a model that wants two calls sometimes writes them into one
 * message. The separators between the objects are dropped. A call to multi_tool_use.parallel
 * (the parallel-call wrapper of OpenAI's hosted models, {"tool_uses": [{"recipient_name":
 * "functions.f", "parameters": {...}}, ...]}) is held until its message ends and becomes one
 * call per entry; arguments that do not read as that shape make the one call they name.
 * Text of messages from other authors (a model that goes on to write the user's next turn)
 * is not the assistant's and is left out. The parser runs in repair mode (harmony_parser.h).
 * Must not sample or run a model.
 */
#include "chat/chat.h"

#include "chat/chat_buf.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

gptoss_status gptoss_chat_prompt_from_request(const gptoss_tokenizer *tokenizer,
                                              const json_t *request,
                                              const gptoss_openai_chat_options *options,
                                              gptoss_chat_prompt *out, gptoss_error *error) {
    memset(out, 0, sizeof *out);
    gptoss_harmony_conversation conversation;
    gptoss_harmony_conversation_init(&conversation);
    gptoss_status st = gptoss_openai_chat_to_harmony(request, options, &conversation, error);
    if (!st) {
        gptoss_harmony_render_options render = gptoss_harmony_render_options_default();
        st = gptoss_harmony_render_tokens(&conversation, &render, tokenizer, &out->tokens, error);
    }
    gptoss_harmony_conversation_free(&conversation);
    if (st) {
        gptoss_tokens_free(&out->tokens);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->n_stop_ids = gptoss_chat_stop_ids(out->stop_ids);
    return GPTOSS_OK;
}

size_t gptoss_chat_stop_ids(int32_t ids[GPTOSS_CHAT_MAX_STOP_IDS]) {
    ids[0] = GPTOSS_TOKEN_RETURN;
    ids[1] = GPTOSS_TOKEN_CALL;
    ids[2] = GPTOSS_TOKEN_ENDOFTEXT;
    return 3;
}

void gptoss_chat_prompt_free(gptoss_chat_prompt *prompt) {
    if (!prompt) return;
    gptoss_tokens_free(&prompt->tokens);
    memset(prompt, 0, sizeof *prompt);
}

bool gptoss_chat_prompt_is_stop(const gptoss_chat_prompt *prompt, int32_t id) {
    for (size_t i = 0; i < prompt->n_stop_ids; i++)
        if (prompt->stop_ids[i] == id) return true;
    return false;
}

typedef struct tool_call {
    char *call_id; /* prefix + index */
    char *name;    /* function name */
} tool_call;

/* Where the open call's arguments are, for splitting concatenated JSON objects. */
typedef enum args_state {
    ARGS_START,  /* only whitespace so far */
    ARGS_OBJECT, /* inside the top-level object */
    ARGS_AFTER,  /* the object closed; separators held since */
    ARGS_OTHER,  /* not a sequence of objects: passed through as they come */
} args_state;

#define MAX_HELD_SEPARATORS 32

/* The wrapper some models write to make several calls at once (see above). */
static const char PARALLEL_RECIPIENT[] = "multi_tool_use.parallel";

struct gptoss_chat_stream {
    gptoss_harmony_parser *parser;
    char *call_id_prefix; /* "call_" or the caller's */
    tool_call *calls;     /* [n_calls] every tool call so far (owned strings) */
    int n_calls;
    gptoss_chat_piece *pieces; /* [n_pieces] produced by the last push/finish */
    size_t n_pieces;
    size_t pieces_capacity;
    bool turn_ended; /* a stop id ended the turn */
    bool finished;   /* finish was called */
    /* The open call's arguments (reset at each call start). */
    args_state args;
    int depth;                         /* open braces and brackets in ARGS_OBJECT */
    bool in_string, escaped;           /* inside a JSON string; after its backslash */
    char held[MAX_HELD_SEPARATORS];    /* ARGS_AFTER: separators not passed on yet */
    size_t n_held;                     /* bytes in held */
    char flushed[MAX_HELD_SEPARATORS]; /* held bytes handed out as a piece (until next push) */
    /* An open multi_tool_use.parallel call: its arguments so far (not passed on yet). */
    bool in_parallel;
    gptoss_chat_buf parallel_args;
    /* Strings pieces of the last push point into (owned; freed at the next push). */
    char **owned;
    size_t n_owned, cap_owned;
};

static void free_owned(gptoss_chat_stream *s);

gptoss_status gptoss_chat_stream_create(const gptoss_tokenizer *tokenizer,
                                        const char *call_id_prefix, gptoss_chat_stream **out,
                                        gptoss_error *error) {
    *out = NULL;
    gptoss_chat_stream *s = calloc(1, sizeof *s);
    if (!s) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    s->call_id_prefix = strdup(call_id_prefix ? call_id_prefix : "call_");
    if (!s->call_id_prefix) {
        free(s);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    /* The prompt ends in "<|start|>assistant": generation starts inside a header. Non-strict:
     * a model's slip must not lose text or fail the request. */
    gptoss_harmony_parser_options options = {.strict = false,
                                             .repair = true,
                                             .has_initial_role = true,
                                             .initial_role = GPTOSS_ROLE_ASSISTANT};
    gptoss_status st = gptoss_harmony_parser_create(tokenizer, &options, &s->parser, error);
    if (st) {
        free(s->call_id_prefix);
        free(s);
        return st;
    }
    *out = s;
    return GPTOSS_OK;
}

void gptoss_chat_stream_free(gptoss_chat_stream *stream) {
    if (!stream) return;
    gptoss_harmony_parser_free(stream->parser);
    for (int i = 0; i < stream->n_calls; i++) {
        free(stream->calls[i].call_id);
        free(stream->calls[i].name);
    }
    free(stream->calls);
    free_owned(stream);
    free(stream->owned);
    gptoss_chat_buf_free(&stream->parallel_args);
    free(stream->pieces);
    free(stream->call_id_prefix);
    free(stream);
}

static gptoss_chat_piece *new_piece(gptoss_chat_stream *s, gptoss_chat_piece_kind kind,
                                    gptoss_error *error) {
    if (s->n_pieces == s->pieces_capacity) {
        size_t capacity = s->pieces_capacity ? 2 * s->pieces_capacity : 8;
        gptoss_chat_piece *bigger = realloc(s->pieces, capacity * sizeof *bigger);
        if (!bigger) {
            gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            return NULL;
        }
        s->pieces = bigger;
        s->pieces_capacity = capacity;
    }
    gptoss_chat_piece *p = &s->pieces[s->n_pieces++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->tool_index = -1;
    return p;
}

/* A new call of function name[0..name_len). */
static gptoss_status start_tool_call(gptoss_chat_stream *s, const char *name, size_t name_len,
                                     gptoss_error *error) {
    tool_call *bigger = realloc(s->calls, (size_t)(s->n_calls + 1) * sizeof *bigger);
    if (!bigger) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    s->calls = bigger;
    s->args = ARGS_START;
    s->depth = 0;
    s->in_string = s->escaped = false;
    s->n_held = 0;
    tool_call *call = &s->calls[s->n_calls];
    call->name = gptoss_chat_strndup(name, name_len);
    size_t id_size = strlen(s->call_id_prefix) + 16;
    call->call_id = malloc(id_size);
    if (!call->name || !call->call_id) {
        free(call->name), free(call->call_id);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    snprintf(call->call_id, id_size, "%s%d", s->call_id_prefix, s->n_calls);
    s->n_calls++;
    gptoss_chat_piece *p = new_piece(s, GPTOSS_CHAT_PIECE_TOOL_CALL, error);
    if (!p) return GPTOSS_ERR_OUT_OF_MEMORY;
    p->tool_index = s->n_calls - 1;
    p->call_id = call->call_id;
    p->name = call->name;
    return GPTOSS_OK;
}

/* An arguments piece of the open call: text[0..len), which must live until the next push. */
static gptoss_status add_arguments(gptoss_chat_stream *s, const char *text, size_t len,
                                   gptoss_error *error) {
    if (len == 0) return GPTOSS_OK;
    gptoss_chat_piece *p = new_piece(s, GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS, error);
    if (!p) return GPTOSS_ERR_OUT_OF_MEMORY;
    p->text = text;
    p->len = len;
    p->tool_index = s->n_calls - 1;
    return GPTOSS_OK;
}

/* Hands the held separators to the open call after all (they were not between objects). */
static gptoss_status flush_held(gptoss_chat_stream *s, gptoss_error *error) {
    const size_t n = s->n_held;
    s->n_held = 0;
    memcpy(s->flushed, s->held, n);
    return add_arguments(s, s->flushed, n, error);
}

static bool is_separator(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',';
}

/* An arguments delta of the open call: passed on, except that a JSON object starting after
 * the first one closed starts a new call of the same function (the separators before it
 * dropped). */
static gptoss_status take_arguments(gptoss_chat_stream *s, const char *text, size_t len,
                                    gptoss_error *error) {
    size_t from = 0; /* start of the bytes not passed on yet */
    gptoss_status st = GPTOSS_OK;
    for (size_t i = 0; i < len && !st; i++) {
        const char c = text[i];
        switch (s->args) {
        case ARGS_START:
            if (c == '{')
                s->args = ARGS_OBJECT, s->depth = 1;
            else if (!is_separator(c) || c == ',')
                s->args = ARGS_OTHER;
            break;
        case ARGS_OBJECT:
            if (s->in_string) {
                if (s->escaped)
                    s->escaped = false;
                else if (c == '\\')
                    s->escaped = true;
                else if (c == '"')
                    s->in_string = false;
            } else if (c == '"') {
                s->in_string = true;
            } else if (c == '{' || c == '[') {
                s->depth++;
            } else if ((c == '}' || c == ']') && --s->depth == 0) {
                st = add_arguments(s, text + from, i + 1 - from, error);
                from = i + 1;
                s->args = ARGS_AFTER;
            }
            break;
        case ARGS_AFTER:
            if (c == '{') {
                const tool_call *last = &s->calls[s->n_calls - 1];
                st = start_tool_call(s, last->name, strlen(last->name), error);
                s->args = ARGS_OBJECT, s->depth = 1;
                from = i;
            } else if (is_separator(c) && s->n_held < MAX_HELD_SEPARATORS) {
                s->held[s->n_held++] = c;
                from = i + 1;
            } else {
                st = flush_held(s, error);
                from = i;
                s->args = ARGS_OTHER;
            }
            break;
        case ARGS_OTHER:
            break;
        }
    }
    if (!st && s->args != ARGS_AFTER) st = add_arguments(s, text + from, len - from, error);
    return st;
}

/* Keeps text a piece points into until the next push; frees it (and returns false) when
 * the list cannot grow. */
static bool own(gptoss_chat_stream *s, char *text) {
    if (s->n_owned == s->cap_owned) {
        size_t cap = s->cap_owned ? 2 * s->cap_owned : 4;
        char **bigger = realloc(s->owned, cap * sizeof *bigger);
        if (!bigger) {
            free(text);
            return false;
        }
        s->owned = bigger;
        s->cap_owned = cap;
    }
    s->owned[s->n_owned++] = text;
    return true;
}

static void free_owned(gptoss_chat_stream *s) {
    for (size_t i = 0; i < s->n_owned; i++)
        free(s->owned[i]);
    s->n_owned = 0;
}

/* Whether a multi_tool_use.parallel argument object has the wrapper's shape: a non-empty
 * tool_uses array of {recipient_name: non-empty string, parameters: object}. */
static bool parallel_shape(const json_t *root) {
    const json_t *uses = json_object_get(root, "tool_uses");
    if (!json_is_array(uses) || json_array_size(uses) == 0) return false;
    size_t i;
    const json_t *use;
    json_array_foreach(uses, i, use) {
        const json_t *name = json_object_get(use, "recipient_name");
        if (!json_is_string(name) || json_string_length(name) == 0 ||
            !json_is_object(json_object_get(use, "parameters")))
            return false;
    }
    return true;
}

/* The held multi_tool_use.parallel call, now that its message ended: one call per entry, or
 * the one call it names with its arguments as written. */
static gptoss_status end_parallel(gptoss_chat_stream *s, gptoss_error *error) {
    s->in_parallel = false;
    gptoss_chat_buf *b = &s->parallel_args;
    if (b->failed) {
        gptoss_chat_buf_free(b);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    json_t *root = b->len ? json_loadb(b->data, b->len, 0, NULL) : NULL;
    gptoss_status st = GPTOSS_OK;
    if (parallel_shape(root)) {
        size_t i;
        json_t *use;
        json_array_foreach(json_object_get(root, "tool_uses"), i, use) {
            const char *name = json_string_value(json_object_get(use, "recipient_name"));
            size_t name_len = strlen(name);
            if (name_len > 10 && memcmp(name, "functions.", 10) == 0) name += 10, name_len -= 10;
            /* 15 digits: the decimals a model writes come back as written */
            char *args = json_dumps(json_object_get(use, "parameters"),
                                    JSON_COMPACT | JSON_REAL_PRECISION(15));
            if (!args || !own(s, args)) {
                st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
                break;
            }
            st = start_tool_call(s, name, name_len, error);
            if (!st) st = add_arguments(s, args, strlen(args), error);
            if (st) break;
        }
    } else {
        size_t len = 0;
        char *raw = gptoss_chat_buf_take(b, &len);
        st = start_tool_call(s, PARALLEL_RECIPIENT, strlen(PARALLEL_RECIPIENT), error);
        if (!raw) {
            /* no arguments came */
        } else if (!own(s, raw)) {
            if (!st) st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        } else if (!st) {
            st = add_arguments(s, raw, len, error);
        }
    }
    json_decref(root);
    b->len = 0;
    s->args = ARGS_OTHER; /* the calls are whole */
    return st;
}

/* Turns the parser's latest events into pieces. */
static gptoss_status take_events(gptoss_chat_stream *s, gptoss_error *error) {
    size_t n = 0;
    const gptoss_chat_event *events = gptoss_harmony_parser_events(s->parser, &n);
    for (size_t i = 0; i < n; i++) {
        const gptoss_chat_event *ev = &events[i];
        gptoss_chat_piece *p = NULL;
        switch (ev->kind) {
        case GPTOSS_CHAT_EVENT_REASONING_DELTA:
        case GPTOSS_CHAT_EVENT_ANSWER_DELTA:
        case GPTOSS_CHAT_EVENT_COMMENTARY_DELTA:
            /* A message by another author (user, tool, ...) is the model imagining the
             * conversation going on: not part of the assistant's answer. */
            if (ev->len == 0 || ev->role != GPTOSS_ROLE_ASSISTANT) break;
            p = new_piece(s,
                          ev->kind == GPTOSS_CHAT_EVENT_REASONING_DELTA
                              ? GPTOSS_CHAT_PIECE_REASONING
                              : GPTOSS_CHAT_PIECE_CONTENT,
                          error);
            if (!p) return GPTOSS_ERR_OUT_OF_MEMORY;
            p->text = ev->text;
            p->len = ev->len;
            p->preamble = ev->kind == GPTOSS_CHAT_EVENT_COMMENTARY_DELTA;
            break;
        case GPTOSS_CHAT_EVENT_TOOL_CALL_START: {
            const char *name = ev->text;
            size_t name_len = ev->len;
            gptoss_status st = s->in_parallel ? end_parallel(s, error) : GPTOSS_OK;
            if (st) return st;
            if (name_len == strlen(PARALLEL_RECIPIENT) &&
                memcmp(name, PARALLEL_RECIPIENT, name_len) == 0) {
                s->in_parallel = true;
                s->parallel_args.len = 0;
                break;
            }
            if (name_len > 10 && memcmp(name, "functions.", 10) == 0) name += 10, name_len -= 10;
            st = start_tool_call(s, name, name_len, error);
            if (st) return st;
            break;
        }
        case GPTOSS_CHAT_EVENT_TOOL_CALL_ARGS_DELTA: {
            if (ev->len == 0) break;
            if (s->in_parallel) {
                gptoss_chat_buf_append(&s->parallel_args, ev->text, ev->len);
                break;
            }
            if (s->n_calls == 0) break;
            gptoss_status st = take_arguments(s, ev->text, ev->len, error);
            if (st) return st;
            break;
        }
        case GPTOSS_CHAT_EVENT_MESSAGE_END: {
            gptoss_status st = GPTOSS_OK;
            if (s->in_parallel) {
                st = end_parallel(s, error);
            } else if (s->n_calls > 0 && s->n_held > 0) {
                /* separators after the last object stay the call's, as they came */
                st = flush_held(s, error);
            }
            if (st) return st;
            s->args = ARGS_OTHER;
            break;
        }
        case GPTOSS_CHAT_EVENT_TURN_END:
            if (ev->reason == GPTOSS_CHAT_END_RETURN || ev->reason == GPTOSS_CHAT_END_CALL ||
                ev->reason == GPTOSS_CHAT_END_EOS)
                s->turn_ended = true;
            break;
        }
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_chat_stream_push(gptoss_chat_stream *stream, int32_t id, gptoss_error *error) {
    stream->n_pieces = 0;
    free_owned(stream);
    if (stream->turn_ended || stream->finished) return GPTOSS_OK;
    gptoss_status st = gptoss_harmony_parser_push(stream->parser, id, error);
    if (st) return st;
    return take_events(stream, error);
}

gptoss_status gptoss_chat_stream_finish(gptoss_chat_stream *stream, gptoss_error *error) {
    stream->n_pieces = 0;
    if (stream->finished)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "chat stream finished twice");
    stream->finished = true;
    free_owned(stream);
    if (!stream->turn_ended) {
        gptoss_status st = gptoss_harmony_parser_finish(stream->parser, error);
        if (!st) st = take_events(stream, error);
        if (st) return st;
    }
    if (stream->in_parallel) { /* (the parser ends every message; this is a safety net) */
        gptoss_status st = end_parallel(stream, error);
        if (st) return st;
    }
    gptoss_chat_piece *p = new_piece(stream, GPTOSS_CHAT_PIECE_FINISH, error);
    if (!p) return GPTOSS_ERR_OUT_OF_MEMORY;
    p->finish_reason = !stream->turn_ended ? "length" : stream->n_calls > 0 ? "tool_calls" : "stop";
    return GPTOSS_OK;
}

const gptoss_chat_piece *gptoss_chat_stream_pieces(const gptoss_chat_stream *stream, size_t *n) {
    *n = stream->n_pieces;
    return stream->pieces;
}

bool gptoss_chat_stream_done(const gptoss_chat_stream *stream) {
    return stream->turn_ended;
}

int gptoss_chat_stream_n_tool_calls(const gptoss_chat_stream *stream) {
    return stream->n_calls;
}
