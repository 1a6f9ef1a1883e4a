/*
 * responses_request.h - a Responses API request read into what the endpoint needs (private to
 * src/server): the fields every Response object repeats, the conversation items, the store and
 * stream flags, and the equivalent Chat Completions request that chat/ renders and
 * output_constraint.h reads. The readers are responses_request.c; api_responses.c serves.
 */
#ifndef GPTOSS_SERVER_RESPONSES_REQUEST_H
#define GPTOSS_SERVER_RESPONSES_REQUEST_H

#include "server/api_responses.h"
#include "server/request_params.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Built by the endpoint, owned by the encoder state once the call took it. */
typedef struct resp_request {
    json_t *echo;  /* request fields every Response object repeats (instructions, tools, ...) */
    json_t *items; /* normalized conversation items: the previous chain, then this input */
    response_store *store;
    bool store_it;   /* `store`: keep the response for GET and previous_response_id */
    bool background; /* a job thread drives the generation */
    bool stream;     /* the client asked for server-sent events */
    /* include: message.output_text.logprobs (with top_logprobs alternatives each), and
     * reasoning.encrypted_content */
    bool logprobs, encrypted_reasoning;
    int32_t top_logprobs;
} resp_request;

void responses_request_free(resp_request *r);

/* Reads every field; builds the Chat Completions request in *chat and the echo. On failure
 * *status is the HTTP status (400, or 404 for an unknown previous_response_id). */
bool responses_read_request(gptoss_server *s, const json_t *req, json_t *chat, resp_request *rr,
                            unsigned *status, field_error *e);

/* Errors of chat/, request_params and output_constraint name Chat Completions fields: says
 * them as a Responses request spelled them. */
void responses_rename_param(field_error *e);

#endif
