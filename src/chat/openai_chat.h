/*
 * openai_chat.h - maps an OpenAI chat-completions request (JSON) to a harmony conversation.
 *
 * Owns: the mapping rules (written out in openai_chat.c) and the validation of the fields
 * it reads. Errors name the offending field ("messages[2].tool_call_id: no earlier tool call
 * has id 'abc'") so the server can answer 400 with them. Must not render or tokenize.
 */
#ifndef GPTOSS_CHAT_OPENAI_CHAT_H
#define GPTOSS_CHAT_OPENAI_CHAT_H

#include "chat/harmony.h"

typedef struct gptoss_openai_chat_options {
    const char *current_date;     /* "YYYY-MM-DD" for "Current date:", or NULL for none */
    const char *model_identity;   /* NULL: harmony's default identity */
    const char *knowledge_cutoff; /* NULL: "2024-06" */
    bool builtin_browser;         /* offer harmony's built-in browser tool */
    bool builtin_python;          /* offer harmony's built-in python tool */
} gptoss_openai_chat_options;

/* Whether a function name fits a harmony header (OpenAI's alphabet plus '.', 1..64 bytes). */
bool gptoss_chat_valid_function_name(const char *name);

/* Appends the harmony messages for `request` to *conversation (which the caller frees, also
 * on failure). Reads model-facing fields only: messages, tools, tool_choice,
 * reasoning_effort. GPTOSS_ERR_INVALID_ARGUMENT for a request that breaks the rules. */
gptoss_status gptoss_openai_chat_to_harmony(const json_t *request,
                                            const gptoss_openai_chat_options *options,
                                            gptoss_harmony_conversation *conversation,
                                            gptoss_error *error);

#endif
