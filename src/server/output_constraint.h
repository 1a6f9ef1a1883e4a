/*
 * output_constraint.h - a request's structured-output fields turned into the engine's
 * allowed-token callback: response_format (json_object, json_schema), strict function tools,
 * and tool_choice (none, auto, required, a named function). Harmony decides where a
 * constraint applies: the final channel's body, or a tool call's header and arguments; the
 * reasoning is never constrained.
 *
 * Owns: the per-request constraint state (one per choice) and the compiled schemas it uses.
 * Both endpoints use it: Chat Completions hands its fields over as they are; /v1/responses
 * translates text.format and its tool shapes to the Chat Completions shape first.
 */
#ifndef GPTOSS_SERVER_OUTPUT_CONSTRAINT_H
#define GPTOSS_SERVER_OUTPUT_CONSTRAINT_H

#include "gptoss_engine.h"
#include "server/request_params.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct output_constraint output_constraint;

/* Reads response_format, tools, tool_choice and parallel_tool_calls of `request` (Chat
 * Completions shape). *out is NULL when nothing constrains the output. A bad or unsupported
 * schema fails naming the field (and, for a schema, the keyword and its JSON pointer).
 * max_tokens bounds each choice's output, so that a constrained body is always closed in
 * time. */
bool output_constraint_create(const json_t *request, const gptoss_tokenizer *tokenizer,
                              int32_t n_choices, int32_t max_tokens, output_constraint **out,
                              field_error *e);

/* When the request gave no max_tokens (0 at create), the engine's default for it
 * (max_model_len - prompt): the budget that keeps a constrained body whole. */
void output_constraint_set_default_max_tokens(output_constraint *c, int32_t max_tokens);

/* Points options->allowed_tokens at the constraint (which must outlive the engine request). */
void output_constraint_bind(output_constraint *c, gptoss_request_options *options);

void output_constraint_free(output_constraint *c);

#endif
