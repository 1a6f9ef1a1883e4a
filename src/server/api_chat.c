/*
 * api_chat.c - POST /v1/chat/completions: the request's chat-only fields and prompt, and the
 * encoder that turns the neutral generation events into chat.completion JSON or
 * chat.completion.chunk server-sent events.
 *
 * Owns: the chat output shape (message / delta with reasoning_content, content, tool_calls;
 * logprobs as {content: [...]}; usage with reasoning_tokens). The prompt itself comes from
 * chat/ (messages -> harmony -> token ids).
 */
#include "server/api_call.h"
#include "server/output_constraint.h"

#include "chat/chat.h"

#include <stdlib.h>
#include <string.h>

typedef struct chat_choice {
    gptoss_chat_buf content, reasoning; /* not streaming: the whole text */
    json_t *tool_calls;                 /* not streaming: [{id,type,function{name,arguments}}] */
    gptoss_chat_buf tool_args;          /* arguments of the open tool call */
    json_t *logprobs;                   /* not streaming: entries */
    bool started;                       /* streaming: the role chunk was sent */
    const char *finish_reason;          /* once finished */
} chat_choice;

typedef struct chat_state {
    chat_choice *choices; /* [n] */
    int32_t n;
    /* streaming: the delta of the current engine event */
    gptoss_chat_buf delta_content, delta_reasoning;
    json_t *delta_tool_calls, *delta_logprobs;
    const char *finish_reason; /* of the current event's choice, or NULL */
} chat_state;

static bool chat_init(api_call *call, void *state) {
    chat_state *st = state;
    st->n = call->params.sampling.n;
    st->choices = calloc((size_t)st->n, sizeof *st->choices);
    return st->choices != NULL;
}

static void chat_fini(api_call *call, void *state) {
    (void)call;
    chat_state *st = state;
    for (int32_t i = 0; st->choices && i < st->n; i++) {
        chat_choice *c = &st->choices[i];
        gptoss_chat_buf_free(&c->content);
        gptoss_chat_buf_free(&c->reasoning);
        gptoss_chat_buf_free(&c->tool_args);
        json_decref(c->tool_calls);
        json_decref(c->logprobs);
    }
    free(st->choices);
    gptoss_chat_buf_free(&st->delta_content);
    gptoss_chat_buf_free(&st->delta_reasoning);
    json_decref(st->delta_tool_calls);
    json_decref(st->delta_logprobs);
}

static void close_tool_call(chat_choice *c) {
    if (!c->tool_calls || json_array_size(c->tool_calls) == 0) return;
    json_t *last = json_array_get(c->tool_calls, json_array_size(c->tool_calls) - 1);
    json_object_set_new(
        json_object_get(last, "function"), "arguments",
        server_json_text(c->tool_args.data ? c->tool_args.data : "", c->tool_args.len));
}

static void append_new(json_t **array, json_t *item) {
    if (!*array) *array = json_array();
    json_array_append_new(*array, item);
}

static void send_chunk(api_call *call, int32_t index, json_t *delta, const char *finish,
                       json_t *logprobs) {
    json_t *ch = json_pack("{s:i}", "index", index);
    json_object_set_new(ch, "delta", delta);
    json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *chunk =
        json_pack("{s:s, s:s, s:I, s:s}", "id", call->id, "object", "chat.completion.chunk",
                  "created", (json_int_t)call->created, "model", call->model_name);
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(chunk, "choices", choices);
    if (call->params.include_usage) json_object_set_new(chunk, "usage", json_null());
    api_sse(call, chunk);
}

/* The chunk(s) of one engine event: role first, then the delta, then the finish. */
static void flush_delta(api_call *call, chat_state *st, int32_t index) {
    chat_choice *c = &st->choices[index];
    if (!c->started) {
        c->started = true;
        send_chunk(call, index, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL,
                   NULL);
    }
    if (st->delta_content.len || st->delta_reasoning.len || st->delta_tool_calls ||
        st->delta_logprobs) {
        json_t *d = json_object();
        if (st->delta_reasoning.len)
            json_object_set_new(
                d, "reasoning_content",
                server_json_text(st->delta_reasoning.data, st->delta_reasoning.len));
        if (st->delta_content.len)
            json_object_set_new(d, "content",
                                server_json_text(st->delta_content.data, st->delta_content.len));
        if (st->delta_tool_calls) json_object_set(d, "tool_calls", st->delta_tool_calls);
        send_chunk(call, index, d, NULL,
                   st->delta_logprobs ? json_pack("{s:O}", "content", st->delta_logprobs) : NULL);
    }
    st->delta_content.len = st->delta_reasoning.len = 0;
    json_decref(st->delta_tool_calls);
    json_decref(st->delta_logprobs);
    st->delta_tool_calls = st->delta_logprobs = NULL;
    if (st->finish_reason) {
        if (!strcmp(st->finish_reason, "error")) {
            const char *m = generation_error(call->gen);
            api_sse(call, json_pack("{s:{s:o, s:s, s:n, s:n}}", "error", "message",
                                    server_json_text(m, strlen(m)), "type", "server_error", "param",
                                    "code"));
        }
        send_chunk(call, index, json_object(), st->finish_reason, NULL);
        st->finish_reason = NULL;
    }
}

static void chat_event(api_call *call, void *state, const gen_event *ev) {
    chat_state *st = state;
    chat_choice *c = &st->choices[ev->choice];
    bool stream = call->params.stream;
    switch (ev->kind) {
    case GEN_LOGPROB:
        append_new(stream ? &st->delta_logprobs : &c->logprobs, api_logprob_entry(call, ev->token));
        break;
    case GEN_REASONING:
        gptoss_chat_buf_append(stream ? &st->delta_reasoning : &c->reasoning, ev->text, ev->len);
        break;
    case GEN_CONTENT:
        gptoss_chat_buf_append(stream ? &st->delta_content : &c->content, ev->text, ev->len);
        break;
    case GEN_TOOL_CALL: {
        json_t *name = server_json_text(ev->name, strlen(ev->name));
        if (stream) {
            append_new(&st->delta_tool_calls,
                       json_pack("{s:i, s:s, s:s, s:{s:o, s:s}}", "index", ev->tool_index, "id",
                                 ev->call_id, "type", "function", "function", "name", name,
                                 "arguments", ""));
        } else {
            close_tool_call(c);
            c->tool_args.len = 0;
            append_new(&c->tool_calls,
                       json_pack("{s:s, s:s, s:{s:o, s:s}}", "id", ev->call_id, "type", "function",
                                 "function", "name", name, "arguments", ""));
        }
        break;
    }
    case GEN_TOOL_ARGUMENTS:
        if (stream)
            append_new(&st->delta_tool_calls,
                       json_pack("{s:i, s:{s:o}}", "index", ev->tool_index, "function", "arguments",
                                 server_json_text(ev->text, ev->len)));
        else
            gptoss_chat_buf_append(&c->tool_args, ev->text, ev->len);
        break;
    case GEN_FINISH:
        c->finish_reason = ev->finish_reason;
        if (stream)
            st->finish_reason = ev->finish_reason;
        else
            close_tool_call(c);
        break;
    case GEN_END_OF_EVENT:
        if (stream) flush_delta(call, st, ev->choice);
        break;
    }
}

static json_t *chat_usage(api_call *call) {
    json_t *u = api_usage(call);
    json_object_set_new(
        u, "completion_tokens_details",
        json_pack("{s:i}", "reasoning_tokens", generation_usage(call->gen).reasoning_tokens));
    return u;
}

static void chat_stream_end(api_call *call, void *state) {
    (void)state;
    if (call->params.include_usage) {
        json_t *chunk = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", call->id, "object",
                                  "chat.completion.chunk", "created", (json_int_t)call->created,
                                  "model", call->model_name, "choices", "usage", chat_usage(call));
        api_sse(call, chunk);
    }
    api_sse_text(call, "data: [DONE]\n\n");
}

static json_t *chat_response(api_call *call, void *state) {
    chat_state *st = state;
    json_t *choices = json_array();
    for (int32_t i = 0; i < st->n; i++) {
        chat_choice *c = &st->choices[i];
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(
            msg, "content",
            c->content.len || !c->tool_calls
                ? server_json_text(c->content.data ? c->content.data : "", c->content.len)
                : json_null());
        json_object_set_new(msg, "reasoning_content",
                            c->reasoning.len ? server_json_text(c->reasoning.data, c->reasoning.len)
                                             : json_null());
        if (c->tool_calls) json_object_set(msg, "tool_calls", c->tool_calls);
        json_t *ch = json_pack("{s:i, s:o}", "index", i, "message", msg);
        json_object_set_new(ch, "logprobs",
                            c->logprobs ? json_pack("{s:O}", "content", c->logprobs) : json_null());
        json_object_set_new(ch, "finish_reason",
                            json_string(c->finish_reason ? c->finish_reason : "stop"));
        json_array_append_new(choices, ch);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", call->id, "object", "chat.completion",
                     "created", (json_int_t)call->created, "model", call->model_name, "choices",
                     choices, "usage", chat_usage(call));
}

const api_encoder api_chat_encoder = {
    .name = "chat.completions",
    .id_prefix = "chatcmpl",
    .text_mode = GEN_TEXT_HARMONY,
    .state_size = sizeof(chat_state),
    .init = chat_init,
    .fini = chat_fini,
    .event = chat_event,
    .stream_end = chat_stream_end,
    .response = chat_response,
};

/* prompt: messages, tools, tool_choice and reasoning_effort, rendered by chat/. */
server_reply server_chat_completions(gptoss_server *s, const server_request *http) {
    json_t *req = NULL;
    server_reply reply = api_parse_body(s, http, &req);
    if (!req) return reply;
    int32_t vocab = gptoss_tokenizer_n_vocab(s->tokenizer);
    field_error fe = {0};
    request_params params;
    bool ok = request_params_parse(req, vocab, s->max_num_seqs, &params, &fe);
    gptoss_sampling_params *p = &params.sampling;
    bool present = false;
    int32_t max_completion_tokens = 0;
    ok =
        ok && param_bool(req, "logprobs", &p->logprobs, &fe) &&
        param_int(req, "top_logprobs", 0, GPTOSS_MAX_TOP_LOGPROBS, &p->top_logprobs, &present, &fe);
    if (ok && present && p->top_logprobs > 0 && !p->logprobs)
        ok = field_fail(&fe, "top_logprobs", "top_logprobs: needs \"logprobs\": true");
    ok = ok && param_int(req, "max_completion_tokens", 1, INT32_MAX, &max_completion_tokens,
                         &present, &fe);
    if (ok && present) p->max_tokens = max_completion_tokens;
    ok = ok && request_params_finish(&params, vocab, &fe);
    ok = ok &&
         output_constraint_create(req, s->tokenizer, p->n, p->max_tokens, &params.constraint, &fe);
    if (!ok) {
        request_params_free(&params);
        json_decref(req);
        return api_bad_request(&fe);
    }
    gptoss_openai_chat_options chat_options = {0};
    gptoss_error err = {0};
    gptoss_chat_prompt prompt = {0};
    gptoss_status st =
        gptoss_chat_prompt_from_request(s->tokenizer, req, &chat_options, &prompt, &err);
    json_decref(req);
    if (st != GPTOSS_OK) {
        request_params_free(&params);
        gptoss_chat_prompt_free(&prompt);
        char param[128];
        param_of_message(err.message, param, sizeof param);
        bool oom = st == GPTOSS_ERR_OUT_OF_MEMORY;
        return server_error(oom ? 500 : 400, oom ? "server_error" : "invalid_request_error",
                            param[0] ? param : NULL, NULL, "%s", err.message);
    }
    reply = api_call_serve(s, http, &api_chat_encoder, prompt.tokens.ids, (int32_t)prompt.tokens.n,
                           &params);
    gptoss_chat_prompt_free(&prompt);
    return reply;
}
