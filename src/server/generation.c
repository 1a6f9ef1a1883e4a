/*
 * generation.c - one engine request -> endpoint-neutral events (see generation.h).
 *
 * Owns: the per-choice decoders (harmony stream parser or stream decoder), the answer text
 * kept for stop-string matching, and the counts behind usage. Must not build JSON or touch
 * HTTP; encoders get everything through the sink.
 */
#include "server/generation.h"

#include "chat/chat.h"
#include "chat/chat_buf.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct choice_state {
    int32_t index;
    gptoss_chat_stream *chat;      /* harmony mode */
    gptoss_stream_decoder decoder; /* plain mode */
    gptoss_chat_buf content;       /* answer text so far (cut at a stop string) */
    size_t content_emitted;        /* bytes of content already emitted */
    int32_t n_tool_calls;
    bool stopped;              /* a stop string matched: later tokens are ignored */
    bool finished;             /* GEN_FINISH was emitted */
    const char *finish_reason; /* set by a stop string or the finish event */
    int32_t n_tokens;
    int32_t n_reasoning_tokens;
} choice_state;

struct generation {
    const gptoss_tokenizer *tokenizer;
    gptoss_request *request; /* borrowed, may be NULL */
    gen_options options;
    size_t max_stop_len;
    gen_sink_fn sink;
    void *sink_user;
    choice_state *choices; /* [options.n_choices] */
    int32_t n_finished;
    char *scratch; /* plain mode: decoder output */
    size_t scratch_cap;
    char error[GPTOSS_ERROR_MESSAGE_MAX];
};

static void emit(generation *g, gen_event ev) {
    g->sink(g->sink_user, &ev);
}

gptoss_status generation_create(const gptoss_tokenizer *tokenizer, gptoss_request *request,
                                const gen_options *options, gen_sink_fn sink, void *sink_user,
                                generation **out, gptoss_error *error) {
    *out = NULL;
    generation *g = calloc(1, sizeof *g);
    if (!g) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    g->tokenizer = tokenizer, g->request = request, g->options = *options;
    g->sink = sink, g->sink_user = sink_user;
    for (int i = 0; i < options->n_stops; i++)
        if (options->stop_lens[i] > g->max_stop_len) g->max_stop_len = options->stop_lens[i];
    g->choices = calloc((size_t)options->n_choices, sizeof *g->choices);
    g->scratch_cap = gptoss_stream_decoder_out_capacity(tokenizer);
    g->scratch = malloc(g->scratch_cap);
    if (!g->choices || !g->scratch) {
        generation_free(g);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int32_t i = 0; i < options->n_choices; i++) {
        choice_state *c = &g->choices[i];
        c->index = i;
        gptoss_stream_decoder_init(&c->decoder, tokenizer);
        if (options->text_mode == GEN_TEXT_HARMONY) {
            gptoss_status st =
                gptoss_chat_stream_create(tokenizer, options->call_id_prefix, &c->chat, error);
            if (st != GPTOSS_OK) {
                generation_free(g);
                return st;
            }
        }
    }
    *out = g;
    return GPTOSS_OK;
}

void generation_free(generation *g) {
    if (!g) return;
    for (int32_t i = 0; g->choices && i < g->options.n_choices; i++) {
        gptoss_chat_stream_free(g->choices[i].chat);
        gptoss_chat_buf_free(&g->choices[i].content);
    }
    free(g->choices);
    free(g->scratch);
    free(g);
}

/* Emits content up to byte `upto`. */
static void emit_content(generation *g, choice_state *c, size_t upto) {
    if (upto <= c->content_emitted) return;
    emit(g, (gen_event){.kind = GEN_CONTENT,
                        .choice = c->index,
                        .text = c->content.data + c->content_emitted,
                        .len = upto - c->content_emitted});
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
        if (g->request) gptoss_request_stop_choice(g->request, c->index);
        return;
    }
    size_t safe = c->content.len > g->max_stop_len - 1 ? c->content.len - (g->max_stop_len - 1) : 0;
    /* Never split a UTF-8 sequence: back up to the start of the one `safe` falls into. */
    while (safe > c->content_emitted && ((unsigned char)c->content.data[safe] & 0xC0) == 0x80)
        safe--;
    emit_content(g, c, safe);
}

static void chat_pieces(generation *g, choice_state *c, bool *reasoning_token) {
    size_t n = 0;
    const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(c->chat, &n);
    for (size_t i = 0; i < n; i++) {
        const gptoss_chat_piece *p = &pieces[i];
        switch (p->kind) {
        case GPTOSS_CHAT_PIECE_REASONING:
            *reasoning_token = true;
            emit(g, (gen_event){
                        .kind = GEN_REASONING, .choice = c->index, .text = p->text, .len = p->len});
            break;
        case GPTOSS_CHAT_PIECE_CONTENT:
            add_content(g, c, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_TOOL_CALL:
            c->n_tool_calls++;
            emit(g, (gen_event){.kind = GEN_TOOL_CALL,
                                .choice = c->index,
                                .tool_index = p->tool_index,
                                .call_id = p->call_id,
                                .name = p->name});
            break;
        case GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS:
            emit(g, (gen_event){.kind = GEN_TOOL_ARGUMENTS,
                                .choice = c->index,
                                .tool_index = p->tool_index,
                                .text = p->text,
                                .len = p->len});
            break;
        case GPTOSS_CHAT_PIECE_FINISH:
            break; /* the engine's finish event decides */
        }
    }
}

static void on_token(generation *g, choice_state *c, const gptoss_engine_event *ev) {
    if (c->stopped) return;
    c->n_tokens++;
    if (g->options.logprobs)
        emit(g, (gen_event){.kind = GEN_LOGPROB, .choice = c->index, .token = ev});
    gptoss_error err = {0};
    if (g->options.text_mode == GEN_TEXT_HARMONY) {
        bool reasoning = false;
        if (gptoss_chat_stream_push(c->chat, ev->token_id, &err) == GPTOSS_OK)
            chat_pieces(g, c, &reasoning);
        if (reasoning) c->n_reasoning_tokens++;
        return;
    }
    /* The token that ended generation is not part of the text. */
    if (ev->finish == GPTOSS_FINISH_STOP && ev->stop_token_id == ev->token_id) return;
    size_t len = 0;
    if (gptoss_stream_decoder_push(&c->decoder, ev->token_id, g->scratch, g->scratch_cap, &len,
                                   &err) == GPTOSS_OK)
        add_content(g, c, g->scratch, len);
}

static void on_finish(generation *g, choice_state *c, const gptoss_engine_event *ev) {
    if (!c->stopped) {
        gptoss_error err = {0};
        if (g->options.text_mode == GEN_TEXT_HARMONY) {
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
    if (!c->finish_reason) {
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
            snprintf(g->error, sizeof g->error, "%s",
                     g->request ? gptoss_request_error(g->request) : "");
            if (!g->error[0]) snprintf(g->error, sizeof g->error, "generation failed");
            break;
        }
    }
    c->finished = true;
    g->n_finished++;
    emit(g, (gen_event){.kind = GEN_FINISH, .choice = c->index, .finish_reason = c->finish_reason});
}

void generation_push(generation *g, const gptoss_engine_event *ev) {
    if (ev->index < 0 || ev->index >= g->options.n_choices) return;
    choice_state *c = &g->choices[ev->index];
    if (c->finished) return;
    if (ev->token_id >= 0) on_token(g, c, ev);
    if (ev->finish != GPTOSS_FINISH_NONE) on_finish(g, c, ev);
    emit(g, (gen_event){.kind = GEN_END_OF_EVENT, .choice = c->index});
}

bool generation_done(const generation *g) {
    return g->n_finished == g->options.n_choices;
}

gen_usage generation_usage(const generation *g) {
    gen_usage u = {0, 0};
    for (int32_t i = 0; i < g->options.n_choices; i++) {
        u.completion_tokens += g->choices[i].n_tokens;
        u.reasoning_tokens += g->choices[i].n_reasoning_tokens;
    }
    return u;
}

const char *generation_error(const generation *g) {
    return g->error;
}
