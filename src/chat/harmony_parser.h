/*
 * harmony_parser.h - incremental parser of generated harmony tokens (spec 6.7).
 *
 * Owns: the parse state of one generation: feed token ids one at a time, get back
 *   - the message-level view harmony's StreamableParser gives (messages with role, name,
 *     recipient, channel, content type and content; the content of the open message; the
 *     text the last token added), used to check the reference parse cases; and
 *   - events for a streaming server: reasoning/answer/commentary text deltas, tool call
 *     start and argument deltas, message end and turn end with the reason.
 * Must not render, sample or know about HTTP.
 *
 * Text comes out only at UTF-8 boundaries: bytes of an unfinished character are held until
 * it completes. Bytes that cannot become valid UTF-8 come out as U+FFFD (one per maximal
 * invalid subsequence, as harmony and Python do); an id the tokenizer does not know comes
 * out as U+FFFD. Held bytes are flushed (as U+FFFD) when the message ends.
 *
 * Strict mode (harmony's default) reports malformed input as an error, exactly where
 * harmony does: a token other than <|start|> between messages, a header with words left
 * over, an unknown role, the end of input inside a header. Stop tokens inside a header are
 * kept as header text there.
 *
 * Non-strict mode never fails and never drops text silently. Its recoveries:
 *   - stop token (<|end|>, <|return|>, <|call|>) inside a header: the header becomes a
 *     message; its channel (if it names one) is kept and the rest of the header text, split
 *     on whitespace and re-joined with single spaces, is the content (harmony's non-strict
 *     behaviour). The same happens at the end of input and when <|start|> arrives inside a
 *     header (a new header then begins);
 *   - text tokens where a <|start|> was expected: an implicit assistant message without a
 *     channel begins; its text is surfaced as answer text (event.recovered set);
 *   - a header that cannot be parsed (unknown single word role, words left over): the
 *     message keeps the role and channel it could find, and the unparsed header words
 *     (single-spaced) are put in front of the content, marked recovered;
 *   - a header longer than GPTOSS_HARMONY_MAX_HEADER_BYTES: the header text so far becomes
 *     the content of an implicit answer message (a model that forgot <|message|>);
 *   - <|start|> inside content: the open message ends (reason END) and a header begins;
 *   - <|endoftext|>: ends the open message and the turn (reason EOS);
 *   - stop tokens between messages: no message; <|return|>/<|call|> still end the turn.
 * Repair mode (non-strict, for a server facing real model output) adds what gpt-oss models are
 * seen to get wrong, so that a tool call survives and no markup leaks into text:
 *   - <|channel|> where <|start|> was expected, or inside content: a new assistant header
 *     begins (the model skipped <|end|><|start|>assistant); text "assistant" where <|start|>
 *     was expected, followed by a header token, is that role (held until it is known);
 *   - <|message|> where <|start|> was expected: an assistant message without a channel;
 *   - <|message|>, <|constrain|>, <|startoftext|> and reserved tokens inside content, and
 *     those other than <|channel|>/<|constrain|> inside a header, are dropped (never text);
 *   - headers: whitespace after <|channel|> is skipped, the last of several channel markers
 *     wins, a channel that is really a recipient ("to=functions.f", "functions.f",
 *     "commentary.to=functions.f") becomes the recipient; with a "to=" word present, words
 *     that do not fit are ignored (the content type is the <|constrain|> or "json" word);
 *   - a header cut short (stop token, end of input, a header too long) that names a
 *     recipient becomes that tool call, its arguments the text from the first '{' on;
 *     otherwise the text surfaces without <|channel|>/<|constrain|> markup.
 * Event classification: a recipient other than all/user/assistant makes a tool call (any
 * channel); otherwise analysis -> reasoning, commentary -> commentary (a preamble), final ->
 * answer; no channel, an unknown channel, or a non-assistant author -> answer text with
 * event.channel/event.role saying what it was.
 */
#ifndef GPTOSS_CHAT_HARMONY_PARSER_H
#define GPTOSS_CHAT_HARMONY_PARSER_H

#include "chat/harmony.h"

/* The longest real header is about 130 bytes ("assistant to=functions.<64-char name>
 * <|channel|>commentary <|constrain|>json"); a model that forgot <|message|> should have its
 * text surface after a few dozen tokens, not after a thousand. */
#define GPTOSS_HARMONY_MAX_HEADER_BYTES 256

typedef struct gptoss_harmony_parsed_message {
    gptoss_harmony_role role;
    char *name;         /* tool author ("functions.x") or NULL */
    char *recipient;    /* or NULL */
    char *channel;      /* or NULL */
    char *content_type; /* "<|constrain|>json", "code" or NULL */
    char *content;      /* [content_len] bytes of valid UTF-8, NUL-terminated */
    size_t content_len;
    int32_t stop_token; /* the id that closed it, or -1 (end of input / recovery) */
} gptoss_harmony_parsed_message;

typedef enum gptoss_chat_event_kind {
    GPTOSS_CHAT_EVENT_REASONING_DELTA = 0,      /* analysis channel text */
    GPTOSS_CHAT_EVENT_ANSWER_DELTA = 1,         /* final channel text (and recovered text) */
    GPTOSS_CHAT_EVENT_COMMENTARY_DELTA = 2,     /* commentary without recipient: a preamble */
    GPTOSS_CHAT_EVENT_TOOL_CALL_START = 3,      /* text = the recipient ("functions.get_time") */
    GPTOSS_CHAT_EVENT_TOOL_CALL_ARGS_DELTA = 4, /* tool call content (JSON arguments) */
    GPTOSS_CHAT_EVENT_MESSAGE_END = 5,          /* a message closed; reason says how */
    GPTOSS_CHAT_EVENT_TURN_END = 6,             /* generation should stop / has stopped */
} gptoss_chat_event_kind;

typedef enum gptoss_chat_end_reason {
    GPTOSS_CHAT_END_NONE = 0,   /* (delta events) */
    GPTOSS_CHAT_END_RETURN = 1, /* <|return|>: the final answer is complete */
    GPTOSS_CHAT_END_CALL = 2,   /* <|call|>: a tool call awaits its result */
    GPTOSS_CHAT_END_END = 3,    /* <|end|> (or an implicit end before <|start|>) */
    GPTOSS_CHAT_END_EOS = 4,    /* <|endoftext|> */
    GPTOSS_CHAT_END_LENGTH = 5, /* input ended (token limit, cancellation) without a stop */
} gptoss_chat_end_reason;

typedef struct gptoss_chat_event {
    gptoss_chat_event_kind kind;
    const char *text;              /* delta text or the tool name; valid until the next push */
    size_t len;                    /* bytes of text */
    gptoss_harmony_role role;      /* author of the message the event belongs to */
    const char *channel;           /* its channel, or NULL */
    const char *recipient;         /* its recipient, or NULL */
    const char *content_type;      /* its content type, or NULL */
    size_t message_index;          /* index of the message (in parse order) */
    gptoss_chat_end_reason reason; /* MESSAGE_END, TURN_END */
    bool recovered;                /* text surfaced by a non-strict recovery */
} gptoss_chat_event;

typedef struct gptoss_harmony_parser_options {
    bool strict;           /* harmony's strict mode (errors) vs recovery */
    bool repair;           /* non-strict only: the repairs below, beyond harmony's recoveries */
    bool has_initial_role; /* the prompt ended in "<|start|>ROLE": input starts in a header */
    gptoss_harmony_role initial_role;
} gptoss_harmony_parser_options;

typedef struct gptoss_harmony_parser gptoss_harmony_parser;

/* tokenizer must outlive the parser. */
gptoss_status gptoss_harmony_parser_create(const gptoss_tokenizer *tokenizer,
                                           const gptoss_harmony_parser_options *options,
                                           gptoss_harmony_parser **out, gptoss_error *error);
void gptoss_harmony_parser_free(gptoss_harmony_parser *parser);

/* Feeds one generated token. Clears the previous events. Strict mode may fail; after a
 * failure every later call fails with the same message. */
gptoss_status gptoss_harmony_parser_push(gptoss_harmony_parser *parser, int32_t id,
                                         gptoss_error *error);

/* Signals the end of input: closes the open message and, unless a turn end was the last
 * thing seen, emits TURN_END (END after a trailing <|end|>, else LENGTH). */
gptoss_status gptoss_harmony_parser_finish(gptoss_harmony_parser *parser, gptoss_error *error);

/* Events produced by the last push/finish: [*n]. Valid until the next push/finish. */
const gptoss_chat_event *gptoss_harmony_parser_events(const gptoss_harmony_parser *parser,
                                                      size_t *n);

/* Completed messages, in order; valid while the parser lives. */
size_t gptoss_harmony_parser_n_messages(const gptoss_harmony_parser *parser);
const gptoss_harmony_parsed_message *
gptoss_harmony_parser_message(const gptoss_harmony_parser *parser, size_t index);

/* Text of the open message so far ("" when none is open). */
const char *gptoss_harmony_parser_current_content(const gptoss_harmony_parser *parser, size_t *len);
/* Content text the last pushed token completed, or NULL when it completed none. */
const char *gptoss_harmony_parser_last_delta(const gptoss_harmony_parser *parser, size_t *len);

/* "reasoning_delta", "answer_delta", ... for logs and tests. */
const char *gptoss_chat_event_kind_name(gptoss_chat_event_kind kind);
const char *gptoss_chat_end_reason_name(gptoss_chat_end_reason reason);

#endif
