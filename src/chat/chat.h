/*
 * chat.h - the chat API the CLI and the HTTP server use: an OpenAI chat-completions request
 * in, prompt token ids and stop ids out; generated ids in, OpenAI-style pieces out.
 *
 * Owns: gluing openai_chat (request -> harmony), the harmony renderer (-> token ids) and the
 * harmony parser (generated ids -> events) into the two things a front end needs, and the
 * OpenAI vocabulary of the output (reasoning_content, content, tool_calls with ids,
 * finish_reason). Must not sample, run a model or know about HTTP.
 */
#ifndef GPTOSS_CHAT_CHAT_H
#define GPTOSS_CHAT_CHAT_H

#include "chat/harmony_parser.h"
#include "chat/openai_chat.h"

#define GPTOSS_CHAT_MAX_STOP_IDS 4

/* The ids that end an assistant turn: <|return|>, <|call|> and <|endoftext|> (gpt-oss's
 * generation_config.json eos list). The one list of stop ids: every rendered prompt carries
 * it, and a front end gives it to the engine as its eos tokens. Writes them to ids and
 * returns how many (at most GPTOSS_CHAT_MAX_STOP_IDS). */
size_t gptoss_chat_stop_ids(int32_t ids[GPTOSS_CHAT_MAX_STOP_IDS]);

/* A rendered prompt. Zero-initialize or fill with gptoss_chat_prompt_from_request. */
typedef struct gptoss_chat_prompt {
    gptoss_tokens tokens;                       /* prompt ids, ending in <|start|>assistant */
    int32_t stop_ids[GPTOSS_CHAT_MAX_STOP_IDS]; /* <|return|>, <|call|>, <|endoftext|> */
    size_t n_stop_ids;
} gptoss_chat_prompt;

/* Maps `request` (messages, tools, tool_choice, reasoning_effort) to harmony and renders it
 * for completion by the assistant. GPTOSS_ERR_INVALID_ARGUMENT (with the field named) for a
 * request that breaks the rules. On failure *out is left empty. */
gptoss_status gptoss_chat_prompt_from_request(const gptoss_tokenizer *tokenizer,
                                              const json_t *request,
                                              const gptoss_openai_chat_options *options,
                                              gptoss_chat_prompt *out, gptoss_error *error);
void gptoss_chat_prompt_free(gptoss_chat_prompt *prompt);

/* Whether generation must stop after `id`. */
bool gptoss_chat_prompt_is_stop(const gptoss_chat_prompt *prompt, int32_t id);

/* ---- streaming output ------------------------------------------------------------------ */

typedef enum gptoss_chat_piece_kind {
    GPTOSS_CHAT_PIECE_REASONING = 0,      /* delta of choices[].delta.reasoning_content */
    GPTOSS_CHAT_PIECE_CONTENT = 1,        /* delta of choices[].delta.content */
    GPTOSS_CHAT_PIECE_TOOL_CALL = 2,      /* a new tool call: tool_index, call_id, name */
    GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS = 3, /* delta of tool_calls[tool_index].function.arguments */
    GPTOSS_CHAT_PIECE_FINISH = 4,         /* the end: finish_reason */
} gptoss_chat_piece_kind;

typedef struct gptoss_chat_piece {
    gptoss_chat_piece_kind kind;
    const char *text;    /* REASONING/CONTENT/TOOL_ARGUMENTS: delta bytes (valid UTF-8) */
    size_t len;          /* bytes of text */
    bool preamble;       /* CONTENT: a commentary preamble (text the model shows before a call) */
    int tool_index;      /* TOOL_CALL/TOOL_ARGUMENTS: 0, 1, ... within this completion */
    const char *call_id; /* TOOL_CALL: "call_..." */
    const char *name;    /* TOOL_CALL: function name ("get_weather" for functions.get_weather;
                            other recipients, e.g. "browser.search", whole) */
    const char *finish_reason; /* FINISH: "stop", "tool_calls" or "length" */
} gptoss_chat_piece;

typedef struct gptoss_chat_stream gptoss_chat_stream;

/* tokenizer must outlive the stream. call_id_prefix (copied; NULL: "call_") starts every tool
 * call id, followed by the call's index; a server passes something unique per request. */
gptoss_status gptoss_chat_stream_create(const gptoss_tokenizer *tokenizer,
                                        const char *call_id_prefix, gptoss_chat_stream **out,
                                        gptoss_error *error);
void gptoss_chat_stream_free(gptoss_chat_stream *stream);

/* Feeds one generated id. The pieces it produced are then in gptoss_chat_stream_pieces (valid
 * until the next push/finish). Never fails on odd model output (the parser recovers); fails
 * only on out-of-memory. After the turn ended (a stop id), further ids are ignored. */
gptoss_status gptoss_chat_stream_push(gptoss_chat_stream *stream, int32_t id, gptoss_error *error);

/* Ends the stream: flushes held text and emits FINISH, with "length" unless a stop id ended
 * the turn ("stop" for <|return|>/<|endoftext|>, "tool_calls" when a tool call was made).
 * Call it once, also after a stop id. */
gptoss_status gptoss_chat_stream_finish(gptoss_chat_stream *stream, gptoss_error *error);

const gptoss_chat_piece *gptoss_chat_stream_pieces(const gptoss_chat_stream *stream, size_t *n);

/* Whether a stop id ended the turn (generation should stop). */
bool gptoss_chat_stream_done(const gptoss_chat_stream *stream);

/* Number of tool calls so far. */
int gptoss_chat_stream_n_tool_calls(const gptoss_chat_stream *stream);

#endif
