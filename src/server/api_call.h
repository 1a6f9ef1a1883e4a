/*
 * api_call.h - one generation HTTP request: the glue between an endpoint's encoder, the
 * endpoint-neutral generation (generation.h) and the engine.
 *
 * Owns: submitting to the engine, waiting for its events (woken by the engine's notify
 * callback, or by the client hanging up, which cancels the request), the SSE byte stream
 * handed to libmicrohttpd, the response id, and the helpers encoders share (SSE framing,
 * usage, logprob entries). An endpoint is an api_encoder: a few functions over the neutral
 * events; adding one (/v1/responses) means writing an encoder, not touching this file.
 */
#ifndef GPTOSS_SERVER_API_CALL_H
#define GPTOSS_SERVER_API_CALL_H

#include "chat/chat_buf.h"
#include "server/generation.h"
#include "server/request_params.h"
#include "server/server_internal.h"

typedef struct api_call api_call;

typedef struct api_encoder {
    const char *name;        /* for log lines: "chat.completions" */
    const char *id_prefix;   /* response ids: "chatcmpl" -> "chatcmpl-<hex>" */
    gen_text_mode text_mode; /* how tokens become text */
    /* The endpoint has a status of its own for a request the server cut (Responses:
     * "cancelled"/"incomplete"); others get finish_reason "length" for it (OpenAI has no
     * "abort"). */
    bool reports_abort;
    /* Per-call encoder state (calloc'd by the caller with state_size bytes, n_choices known);
     * init may allocate more (false: out of memory), fini frees what init allocated. */
    size_t state_size;
    bool (*init)(api_call *call, void *state);
    void (*fini)(api_call *call, void *state);
    /* A neutral event. Streaming: append SSE chunks with api_sse at GEN_END_OF_EVENT (or
     * earlier); not streaming: gather. */
    void (*event)(api_call *call, void *state, const gen_event *event);
    /* Streaming: the last events after every choice finished ([DONE] included). */
    void (*stream_end)(api_call *call, void *state);
    /* Not streaming: the whole response body. */
    json_t *(*response)(api_call *call, void *state);
} api_encoder;

/* The encoders (api_chat.c, api_completions.c). */
extern const api_encoder api_chat_encoder;
extern const api_encoder api_completions_encoder;

struct api_call {
    const api_encoder *encoder;
    void *state;                       /* the encoder's */
    const char *model_name;            /* borrowed */
    const gptoss_tokenizer *tokenizer; /* borrowed */
    request_params params;             /* owned */
    int32_t n_prompt;                  /* prompt tokens */
    int32_t cached_prompt_tokens;      /* known once generation ended */
    char id[64];                       /* "<id_prefix>-<hex>" */
    int64_t created;                   /* unix seconds */
    generation *gen;
    gptoss_chat_buf out; /* streaming: SSE bytes not yet handed over */
    size_t out_pos;
    bool done; /* streaming: the last bytes are queued */
    /* serving only (NULL in tests) */
    gptoss_server *server;
    struct MHD_Connection *connection;
    gptoss_request *request;
    int32_t engine_index; /* the engine serving it (server_engine_done) */
    struct server_waiter *waiter;
    server_access *access;
    api_call *prev_live, *next_live; /* server->calls, while registered */
    double t_submit, t_first_token;  /* gptoss_now_seconds; t_first_token 0 until one came */
    bool live;
};

/* A call with no engine behind it: the caller feeds engine events with generation_push
 * (call->gen). Takes ownership of *params (zeroed). id_number makes the id. */
gptoss_status api_call_create(const api_encoder *encoder, const char *model_name,
                              const gptoss_tokenizer *tokenizer, request_params *params,
                              int32_t n_prompt, uint64_t id_salt, uint64_t id_number,
                              gptoss_request *request, api_call **out, gptoss_error *error);
void api_call_free(api_call *call);

/* Appends "data: <chunk>\n\n" (takes ownership of chunk); api_sse_text appends raw bytes. */
void api_sse(api_call *call, json_t *chunk);
void api_sse_text(api_call *call, const char *text);

/* {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details{cached_tokens}}. */
json_t *api_usage(api_call *call);

/* One token's logprob entry: {token, logprob, bytes, top_logprobs: [{token, logprob,
 * bytes}]}; -9999 stands for -inf. */
json_t *api_logprob_entry(api_call *call, const gptoss_engine_event *token);

/* The whole request after the endpoint parsed it: submits, then streams or collects.
 * Takes ownership of *params. */
server_reply api_call_serve(gptoss_server *server, const server_request *http,
                            const api_encoder *encoder, const int32_t *prompt, int32_t n_prompt,
                            request_params *params);

/* Body and model checks every generation endpoint starts with; on success *out is the
 * request object (json_decref it) and the reply is empty. */
server_reply api_parse_body(gptoss_server *server, const server_request *http, json_t **out);

server_reply api_bad_request(const field_error *e);

#endif
