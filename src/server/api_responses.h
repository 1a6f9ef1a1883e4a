/*
 * api_responses.h - the /v1/responses encoder, for the route handlers (server_internal.h)
 * and for tests that drive it with hand-made engine events.
 */
#ifndef GPTOSS_SERVER_API_RESPONSES_H
#define GPTOSS_SERVER_API_RESPONSES_H

#include "server/api_call.h"
#include "server/response_store.h"

extern const api_encoder api_responses_encoder;

/* The request context the next api_call_create in this thread hands the encoder: the fields a
 * Response object repeats (`echo`, an object), the conversation so far (`items`, normalized
 * as in responses_input.h), and where the finished response is kept (`store` may be NULL;
 * `store_it` is the request's `store`; `logprobs` and `encrypted_reasoning` its include values
 * message.output_text.logprobs and reasoning.encrypted_content). Both JSON values are copied.
 * false: out of memory. */
bool api_responses_prepare(const json_t *echo, const json_t *items, response_store *store,
                           bool store_it, bool background, bool logprobs, bool encrypted_reasoning);

#endif
