/*
 * request_params.h - the request fields every generation endpoint shares, read from the JSON
 * body into gptoss_sampling_params, stop strings and stream flags.
 *
 * Owns: the field checks (each bad value becomes a field_error naming the field, fit for an
 * HTTP 400) and the memory the parsed parameters point to (logit_bias arrays, stop strings),
 * which lives until request_params_free. Fields that only one endpoint knows (chat's
 * logprobs flag, completions' integer logprobs) are read by that endpoint with the helpers
 * below. No HTTP and no engine calls here.
 */
#ifndef GPTOSS_SERVER_REQUEST_PARAMS_H
#define GPTOSS_SERVER_REQUEST_PARAMS_H

#include "gptoss_engine.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERVER_MAX_STOP_STRINGS 4 /* OpenAI's limit */
#define SERVER_MAX_STOP_BYTES 1024

typedef struct field_error {
    char param[128];    /* the offending field, or "" */
    char message[1100]; /* what is wrong and what is expected */
} field_error;

/* Fills e and returns false (so a check can `return field_fail(...)`). */
bool field_fail(field_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The member, or NULL when absent or null (OpenAI clients send null for "not set"). */
json_t *json_member(const json_t *req, const char *key);

/* Optional fields: absent leaves *out alone; a present bad value fails naming `key`. */
bool param_number(const json_t *req, const char *key, double lo, double hi, float *out,
                  field_error *e);
bool param_int(const json_t *req, const char *key, int64_t lo, int64_t hi, int32_t *out,
               bool *present, field_error *e);
bool param_bool(const json_t *req, const char *key, bool *out, field_error *e);

typedef struct request_params {
    gptoss_sampling_params sampling;      /* for the engine; points into this struct */
    bool stream;                          /* server-sent events */
    bool include_usage;                   /* stream_options.include_usage */
    bool has_max_tokens;                  /* max_tokens was given */
    char *stops[SERVER_MAX_STOP_STRINGS]; /* stop strings (malloc'd), [n_stops] */
    size_t stop_lens[SERVER_MAX_STOP_STRINGS];
    int n_stops;
    int32_t *bias_tokens; /* logit_bias ids (malloc'd), [sampling.n_logit_bias] */
    float *bias_values;   /* their biases */
    /* Structured output (output_constraint.h), or NULL; handed to the engine request on submit,
     * freed by request_params_free until then. */
    struct output_constraint *constraint;
} request_params;

/* Reads the shared fields of `req`: stream, stream_options, temperature, top_p, top_k, min_p,
 * the penalties, seed, max_tokens, min_tokens, ignore_eos, n (1..max_n), stop_token_ids and
 * stop (refused beside a JSON response_format, whose answer it would cut), and logit_bias ({"token
 * id": bias in [-100, 100]}, ids in [0, vocab)); and checks the OpenAI fields that need no work
 * (user, metadata, store, service_tier, parallel_tool_calls, modalities, ...), refusing those the
 * server does not do (audio, prediction, ...). *out is initialized first, so request_params_free is
 * always safe. */
bool request_params_parse(const json_t *req, int32_t vocab, int32_t max_n, request_params *out,
                          field_error *e);

/* The checks that need every field read (call after the endpoint read its own fields). */
bool request_params_finish(request_params *p, int32_t vocab, field_error *e);

void request_params_free(request_params *p);

/* The field an error message names ("messages[2].content: ..." -> "messages[2].content"),
 * or "" when the message does not start with one. */
void param_of_message(const char *message, char *param, size_t size);

#endif
