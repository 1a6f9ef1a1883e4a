/*
 * responses_input.h - the `input` of a /v1/responses request, checked and turned into the
 * conversation the chat layer renders.
 *
 * Owns: the item rules (which item types and content parts are accepted, call ids that must
 * match an earlier function_call) and the normalized item form the response store keeps for
 * previous_response_id chains:
 *   {"type":"message", "role":"user"|"system"|"developer"|"assistant", "content":"text"}
 *   {"type":"reasoning", "text":"..."}
 *   {"type":"function_call", "call_id", "name", "arguments"}
 *   {"type":"function_call_output", "call_id", "output":"text"}
 * each with an optional "id" (output items keep theirs, so an item_reference can name them).
 * The conversation goes to chat/ as Chat Completions messages, so both endpoints render a
 * conversation by the same harmony rules (past reasoning kept only while the last assistant
 * turn ended in a tool call). No HTTP, no engine, no rendering here.
 */
#ifndef GPTOSS_SERVER_RESPONSES_INPUT_H
#define GPTOSS_SERVER_RESPONSES_INPUT_H

#include "server/request_params.h"

#include <jansson.h>
#include <stdbool.h>

/* How a reasoning item's encrypted_content (include: ["reasoning.encrypted_content"]) starts:
 * the server encrypts nothing, the reasoning text follows as it is. An input reasoning item
 * without content whose encrypted_content starts so is read back as that text. */
#define RESPONSES_REASONING_MARK "gptoss-reasoning-v1:"

/* Reads `input` (a string: one user message; or an array of items) and appends its normalized
 * items to `items`. `prior` (normalized items of the previous response chain, or NULL) answers
 * call ids and item references. A bad item fails naming it ("input[3].type: ..."). */
bool responses_input_read(const json_t *input, const json_t *prior, json_t *items, field_error *e);

/* The Chat Completions `messages` for instructions (NULL: none) and normalized items: a
 * developer message with the instructions, then one message per turn (an assistant turn's
 * reasoning, text and function calls gathered into one assistant message). New reference. */
json_t *responses_items_to_messages(const char *instructions, const json_t *items);

#endif
