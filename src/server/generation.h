/*
 * generation.h - one engine request seen as endpoint-neutral events.
 *
 * Owns: per-choice decoding of the generated tokens (the harmony stream parser for chat-style
 * prompts, plain detokenization for raw completions), stop strings (matched on the answer
 * text, never on reasoning; text that could start a stop string is held back until it cannot,
 * and a match is reported to the engine), token counts for usage, and finish reasons. It knows
 * nothing of JSON or HTTP: an encoder (api_chat.c, api_completions.c, ...) turns the events
 * into its endpoint's shape.
 *
 * For every engine event, generation_push emits in order: GEN_LOGPROB (when logprobs were
 * asked), the text pieces the token produced (REASONING, CONTENT, TOOL_CALL, TOOL_ARGUMENTS),
 * GEN_FINISH when the choice ended, then GEN_END_OF_EVENT, the point where a streaming
 * encoder sends what it gathered.
 */
#ifndef GPTOSS_SERVER_GENERATION_H
#define GPTOSS_SERVER_GENERATION_H

#include "gptoss_engine.h"
#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gen_text_mode {
    GEN_TEXT_PLAIN = 0,   /* tokens -> UTF-8 text (all of it is answer text) */
    GEN_TEXT_HARMONY = 1, /* tokens -> harmony channels: reasoning, content, tool calls */
} gen_text_mode;

typedef enum gen_event_kind {
    GEN_LOGPROB = 0,        /* token: the engine event (token id, logprob, alternatives) */
    GEN_REASONING = 1,      /* text/len: analysis text */
    GEN_CONTENT = 2,        /* text/len: answer text, never beyond a stop string */
    GEN_TOOL_CALL = 3,      /* tool_index, call_id, name: a tool call starts */
    GEN_TOOL_ARGUMENTS = 4, /* tool_index, text/len: more of its arguments */
    GEN_FINISH = 5,         /* finish_reason: "stop", "length", "tool_calls", "abort", "error" */
    GEN_END_OF_EVENT = 6,   /* everything of one engine event was emitted */
} gen_event_kind;

typedef struct gen_event {
    gen_event_kind kind;
    int32_t choice;   /* 0..n-1 */
    const char *text; /* REASONING/CONTENT/TOOL_ARGUMENTS bytes (not NUL-ended) */
    size_t len;
    int32_t tool_index;               /* TOOL_CALL/TOOL_ARGUMENTS */
    const char *call_id, *name;       /* TOOL_CALL */
    const gptoss_engine_event *token; /* LOGPROB */
    const char *finish_reason;        /* FINISH */
} gen_event;

typedef void (*gen_sink_fn)(void *user, const gen_event *event);

typedef struct gen_options {
    gen_text_mode text_mode;
    int32_t n_choices;        /* 1.. */
    bool logprobs;            /* emit GEN_LOGPROB for every token */
    const char *const *stops; /* [n_stops] stop strings (borrowed) */
    const size_t *stop_lens;
    int n_stops;
    const char *call_id_prefix; /* tool call ids (harmony mode), unique per request */
} gen_options;

typedef struct generation generation;

/* tokenizer must outlive the generation; `request` may be NULL (tests): stop-string hits are
 * then not reported to an engine. */
gptoss_status generation_create(const gptoss_tokenizer *tokenizer, gptoss_request *request,
                                const gen_options *options, gen_sink_fn sink, void *sink_user,
                                generation **out, gptoss_error *error);
void generation_free(generation *g);

/* Takes one engine event (events of finished or unknown choices are ignored). */
void generation_push(generation *g, const gptoss_engine_event *event);

/* Whether every choice has finished. */
bool generation_done(const generation *g);

typedef struct gen_usage {
    int32_t completion_tokens; /* over all choices, tokens up to a stop-string match */
    int32_t reasoning_tokens;  /* of those, tokens that produced analysis text */
} gen_usage;

gen_usage generation_usage(const generation *g);

/* The backend's message when a choice finished with "error" ("" otherwise). */
const char *generation_error(const generation *g);

#endif
