/*
 * harmony.h - the harmony chat format of gpt-oss: a conversation model and its renderer.
 *
 * Owns: the C representation of a harmony conversation (messages with an author, optional
 * recipient, channel and content type, and content items that are text, system content or
 * developer content), building and freeing it, reading it from the reference JSON form, and
 * rendering it to text (special tokens written as their names, e.g. "<|start|>") or to token
 * ids (every text fragment encoded as ordinary text, special tokens inserted as single ids;
 * spec section 6.1). Knows nothing of HTTP or of the OpenAI request format (openai_chat.h).
 *
 * The rendering rules follow OpenAI's harmony library byte for byte (spec section 6,
 * ../shared/reference/harmony/README.md); tests/chat/test_harmony_render.c and
 * test_harmony_parse.c check every reference case.
 *
 * Ownership: a conversation owns every string and content item reachable from it (malloc'd);
 * tool parameter schemas are jansson references owned by the tool. Free with
 * gptoss_harmony_conversation_free.
 */
#ifndef GPTOSS_CHAT_HARMONY_H
#define GPTOSS_CHAT_HARMONY_H

#include "gptoss.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum gptoss_harmony_role {
    GPTOSS_ROLE_SYSTEM = 0,
    GPTOSS_ROLE_DEVELOPER = 1,
    GPTOSS_ROLE_USER = 2,
    GPTOSS_ROLE_ASSISTANT = 3,
    GPTOSS_ROLE_TOOL = 4,
} gptoss_harmony_role;

/* "system", "developer", "user", "assistant", "tool". */
const char *gptoss_harmony_role_name(gptoss_harmony_role role);
/* Role from its name; false if the word is not a role. */
bool gptoss_harmony_role_parse(const char *word, size_t len, gptoss_harmony_role *role);

typedef enum gptoss_reasoning_effort {
    GPTOSS_EFFORT_NONE = 0, /* no "Reasoning:" line */
    GPTOSS_EFFORT_LOW = 1,
    GPTOSS_EFFORT_MEDIUM = 2,
    GPTOSS_EFFORT_HIGH = 3,
} gptoss_reasoning_effort;

/* "low", "medium", "high" (NULL for NONE); parse returns false for anything else. */
const char *gptoss_reasoning_effort_name(gptoss_reasoning_effort effort);
bool gptoss_reasoning_effort_parse(const char *word, gptoss_reasoning_effort *effort);

typedef struct gptoss_harmony_tool {
    char *name;         /* as the model calls it, e.g. "get_weather" */
    char *description;  /* may be NULL: no comment lines */
    json_t *parameters; /* JSON Schema (owned reference), or NULL: "() => any" */
} gptoss_harmony_tool;

typedef struct gptoss_harmony_namespace {
    char *name;                 /* "functions", "browser", "python", ... */
    char *description;          /* may be NULL */
    gptoss_harmony_tool *tools; /* [n_tools]; none for e.g. "python" */
    size_t n_tools;
} gptoss_harmony_namespace;

/* A set of tool namespaces. Rendered sorted by name (harmony keeps them in a sorted map). */
typedef struct gptoss_harmony_tools {
    gptoss_harmony_namespace *namespaces; /* [n_namespaces] */
    size_t n_namespaces;
} gptoss_harmony_tools;

typedef struct gptoss_harmony_system_content {
    char *model_identity;          /* first line, or NULL */
    char *knowledge_cutoff;        /* "2024-06", or NULL */
    char *conversation_start_date; /* "YYYY-MM-DD", or NULL */
    gptoss_reasoning_effort reasoning_effort;
    gptoss_harmony_tools tools; /* built-in namespaces (browser, python) */
    bool has_channel_config;    /* render the "# Valid channels" section */
    char **valid_channels;      /* [n_valid_channels] */
    size_t n_valid_channels;
    bool channel_required; /* adds "Channel must be included for every message." */
} gptoss_harmony_system_content;

typedef struct gptoss_harmony_developer_content {
    char *instructions;         /* or NULL: no "# Instructions" section */
    gptoss_harmony_tools tools; /* usually one namespace, "functions" */
} gptoss_harmony_developer_content;

typedef enum gptoss_harmony_content_kind {
    GPTOSS_CONTENT_TEXT = 0,
    GPTOSS_CONTENT_SYSTEM = 1,    /* only in system messages */
    GPTOSS_CONTENT_DEVELOPER = 2, /* only in developer messages */
} gptoss_harmony_content_kind;

typedef struct gptoss_harmony_content {
    gptoss_harmony_content_kind kind;
    char *text;                                 /* TEXT: bytes [text_len], NUL-terminated */
    size_t text_len;                            /* TEXT: bytes (text may hold NULs) */
    gptoss_harmony_system_content system;       /* SYSTEM */
    gptoss_harmony_developer_content developer; /* DEVELOPER */
} gptoss_harmony_content;

typedef struct gptoss_harmony_message {
    gptoss_harmony_role role;
    char *name;         /* author name; required for tool messages ("functions.x") */
    char *recipient;    /* "functions.x", "assistant", or NULL; "all" is not rendered */
    char *channel;      /* "analysis", "commentary", "final", or NULL */
    char *content_type; /* "<|constrain|>json", "code", or NULL */
    gptoss_harmony_content *content; /* [n_content], rendered back to back */
    size_t n_content;
} gptoss_harmony_message;

typedef struct gptoss_harmony_conversation {
    gptoss_harmony_message *messages; /* [n_messages] */
    size_t n_messages;
    size_t capacity;
} gptoss_harmony_conversation;

/* ---- building ------------------------------------------------------------------------ */

/* Zero-initialize a conversation or call this; both are valid empty conversations. */
void gptoss_harmony_conversation_init(gptoss_harmony_conversation *conversation);
void gptoss_harmony_conversation_free(gptoss_harmony_conversation *conversation);

/* Appends an empty message of `role`; *out points at it until the next append. */
gptoss_status gptoss_harmony_conversation_push(gptoss_harmony_conversation *conversation,
                                               gptoss_harmony_role role,
                                               gptoss_harmony_message **out, gptoss_error *error);

/* Sets one of a message's string fields (a copy; NULL clears it). */
gptoss_status gptoss_harmony_set_string(char **field, const char *value, gptoss_error *error);

/* Appends a text content item (a copy of text[0..len)). */
gptoss_status gptoss_harmony_message_add_text(gptoss_harmony_message *message, const char *text,
                                              size_t len, gptoss_error *error);
/* Appends an empty system/developer content item; *out points at it until the next append. */
gptoss_status gptoss_harmony_message_add_system(gptoss_harmony_message *message,
                                                gptoss_harmony_system_content **out,
                                                gptoss_error *error);
gptoss_status gptoss_harmony_message_add_developer(gptoss_harmony_message *message,
                                                   gptoss_harmony_developer_content **out,
                                                   gptoss_error *error);

/* Fills harmony's default system content: the ChatGPT identity, cutoff 2024-06, effort
 * medium, channels analysis/commentary/final required, no date, no tools. */
gptoss_status gptoss_harmony_system_defaults(gptoss_harmony_system_content *system,
                                             gptoss_error *error);

/* Appends a namespace (copies of name and description; description may be NULL). */
gptoss_status gptoss_harmony_tools_add_namespace(gptoss_harmony_tools *tools, const char *name,
                                                 const char *description,
                                                 gptoss_harmony_namespace **out,
                                                 gptoss_error *error);
/* Appends a tool; parameters (may be NULL) gets a new reference. */
gptoss_status gptoss_harmony_namespace_add_tool(gptoss_harmony_namespace *ns, const char *name,
                                                const char *description, json_t *parameters,
                                                gptoss_error *error);
/* Appends harmony's built-in "browser" or "python" namespace, as the model was trained on. */
gptoss_status gptoss_harmony_tools_add_builtin(gptoss_harmony_tools *tools, const char *name,
                                               gptoss_error *error);

/* Reads a conversation in the reference JSON form (a list of MESSAGE objects with role, name,
 * recipient, channel, content_type and content items of type text/system/developer; see
 * ../shared/reference/harmony/README.md) and appends it to *conversation. Errors name the
 * offending element ("[1].content[0].tool_namespaces[0].name: expected a string"). */
gptoss_status gptoss_harmony_conversation_from_json(const json_t *messages,
                                                    gptoss_harmony_conversation *conversation,
                                                    gptoss_error *error);

/* ---- rendering ----------------------------------------------------------------------- */

typedef enum gptoss_harmony_render_mode {
    GPTOSS_RENDER_PLAIN = 0,      /* messages only */
    GPTOSS_RENDER_COMPLETION = 1, /* messages + "<|start|>" + next_turn_role: a prompt */
    GPTOSS_RENDER_TRAINING = 2,   /* messages; a trailing assistant final message ends in
                                     <|return|> instead of <|end|> */
} gptoss_harmony_render_mode;

typedef struct gptoss_harmony_render_options {
    gptoss_harmony_render_mode mode;
    gptoss_harmony_role next_turn_role; /* COMPLETION: usually GPTOSS_ROLE_ASSISTANT */
    bool auto_drop_analysis; /* drop analysis before the first final message when the last
                                assistant message is final (spec 6.6) */
} gptoss_harmony_render_options;

/* Prompt rendering: completion mode, next turn assistant, auto drop on. */
gptoss_harmony_render_options gptoss_harmony_render_options_default(void);

/* Renders to text with special tokens written as their names. *text is malloc'd and
 * NUL-terminated; *len excludes the NUL. Fails on a conversation harmony cannot render (a
 * tool message without a name, system content outside a system message). */
gptoss_status gptoss_harmony_render_text(const gptoss_harmony_conversation *conversation,
                                         const gptoss_harmony_render_options *options, char **text,
                                         size_t *len, gptoss_error *error);

/* Renders to token ids, appended to *out: text fragments are encoded with special tokens
 * NOT recognised (user text "<|start|>" stays text), special tokens are single ids. */
gptoss_status gptoss_harmony_render_tokens(const gptoss_harmony_conversation *conversation,
                                           const gptoss_harmony_render_options *options,
                                           const gptoss_tokenizer *tokenizer, gptoss_tokens *out,
                                           gptoss_error *error);

/* ---- internal seams (used by harmony_render_tokens.c and tests) ------------------------ */

/* A renderer emits a sequence of text fragments and special tokens into a sink. */
typedef struct gptoss_harmony_sink {
    /* text fragment; returns a status, filling error */
    gptoss_status (*text)(void *user, const char *bytes, size_t len, gptoss_error *error);
    /* one special token by id (GPTOSS_TOKEN_START, ...) */
    gptoss_status (*special)(void *user, int32_t id, gptoss_error *error);
    void *user;
} gptoss_harmony_sink;

gptoss_status gptoss_harmony_render_to_sink(const gptoss_harmony_conversation *conversation,
                                            const gptoss_harmony_render_options *options,
                                            const gptoss_harmony_sink *sink, gptoss_error *error);

/* The literal name of a harmony special token id ("<|start|>"), or NULL. */
const char *gptoss_harmony_special_name(int32_t id);

/* JSON Schema -> harmony's TypeScript-like type text (spec 6.3). Appends to *out; indent is
 * the prefix of each property line ("" at the top level). Returns false on out-of-memory. */
struct gptoss_chat_buf;
bool gptoss_harmony_schema_to_typescript(const json_t *schema, const char *indent,
                                         struct gptoss_chat_buf *out);

#endif
