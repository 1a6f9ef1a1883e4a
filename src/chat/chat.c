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
};

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

static gptoss_status start_tool_call(gptoss_chat_stream *s, const char *recipient, size_t len,
                                     gptoss_error *error) {
    tool_call *bigger = realloc(s->calls, (size_t)(s->n_calls + 1) * sizeof *bigger);
    if (!bigger) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    s->calls = bigger;
    const char *name = recipient;
    size_t name_len = len;
    if (len > 10 && memcmp(recipient, "functions.", 10) == 0) name += 10, name_len -= 10;
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
            gptoss_status st = start_tool_call(s, ev->text, ev->len, error);
            if (st) return st;
            break;
        }
        case GPTOSS_CHAT_EVENT_TOOL_CALL_ARGS_DELTA:
            if (ev->len == 0 || s->n_calls == 0) break;
            p = new_piece(s, GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS, error);
            if (!p) return GPTOSS_ERR_OUT_OF_MEMORY;
            p->text = ev->text;
            p->len = ev->len;
            p->tool_index = s->n_calls - 1;
            break;
        case GPTOSS_CHAT_EVENT_MESSAGE_END:
            break;
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
    if (!stream->turn_ended) {
        gptoss_status st = gptoss_harmony_parser_finish(stream->parser, error);
        if (!st) st = take_events(stream, error);
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
