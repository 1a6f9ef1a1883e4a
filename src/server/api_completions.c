/*
 * api_completions.c - POST /v1/completions: the request's completions-only fields and prompt
 * (a string or token ids), and the encoder that turns the neutral generation events into
 * text_completion JSON or server-sent events.
 *
 * Owns: the legacy completions shape: choices[].text, logprobs as {tokens, token_logprobs,
 * top_logprobs: [{token: logprob}], text_offset}, usage without reasoning details.
 */
#include "server/api_call.h"

#include <stdlib.h>
#include <string.h>

typedef struct completion_choice {
    gptoss_chat_buf text;      /* not streaming: the whole text */
    json_t *logprobs;          /* not streaming: chat-style entries, converted at the end */
    const char *finish_reason; /* once finished */
} completion_choice;

typedef struct completion_state {
    completion_choice *choices; /* [n] */
    int32_t n;
    gptoss_chat_buf delta;     /* streaming: text of the current engine event */
    json_t *delta_logprobs;    /* streaming: its entries */
    const char *finish_reason; /* streaming: the current event finished its choice */
} completion_state;

static bool completion_init(api_call *call, void *state) {
    completion_state *st = state;
    st->n = call->params.sampling.n;
    st->choices = calloc((size_t)st->n, sizeof *st->choices);
    return st->choices != NULL;
}

static void completion_fini(api_call *call, void *state) {
    (void)call;
    completion_state *st = state;
    for (int32_t i = 0; st->choices && i < st->n; i++) {
        gptoss_chat_buf_free(&st->choices[i].text);
        json_decref(st->choices[i].logprobs);
    }
    free(st->choices);
    gptoss_chat_buf_free(&st->delta);
    json_decref(st->delta_logprobs);
}

/* Legacy layout from chat-style entries: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const json_t *entries) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offsets = json_array();
    size_t i, offset = 0;
    json_t *e;
    json_array_foreach(entries, i, e) {
        json_t *tok = json_object_get(e, "token");
        json_array_append(tokens, tok);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *top = json_object();
        size_t k;
        json_t *alt;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, alt) json_object_set(
            top, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
        json_array_append_new(tops, top);
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += json_string_length(tok);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offsets);
}

static json_t *chunk_base(api_call *call) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", call->id, "object", "text_completion", "created",
                     (json_int_t)call->created, "model", call->model_name);
}

static void send_chunk(api_call *call, int32_t index, json_t *text, const char *finish,
                       json_t *logprobs) {
    json_t *ch = json_pack("{s:i, s:o}", "index", index, "text", text);
    json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *chunk = chunk_base(call);
    json_t *choices = json_array();
    json_array_append_new(choices, ch);
    json_object_set_new(chunk, "choices", choices);
    if (call->params.include_usage) json_object_set_new(chunk, "usage", json_null());
    api_sse(call, chunk);
}

static void flush_delta(api_call *call, completion_state *st, int32_t index) {
    if (st->delta.len || st->delta_logprobs)
        send_chunk(call, index,
                   server_json_text(st->delta.data ? st->delta.data : "", st->delta.len), NULL,
                   st->delta_logprobs ? completion_logprobs(st->delta_logprobs) : NULL);
    st->delta.len = 0;
    json_decref(st->delta_logprobs);
    st->delta_logprobs = NULL;
    if (st->finish_reason) {
        if (!strcmp(st->finish_reason, "error")) {
            const char *m = generation_error(call->gen);
            api_sse(call, json_pack("{s:{s:o, s:s, s:n, s:n}}", "error", "message",
                                    server_json_text(m, strlen(m)), "type", "server_error", "param",
                                    "code"));
        }
        send_chunk(call, index, json_string(""), st->finish_reason, NULL);
        st->finish_reason = NULL;
    }
}

static void completion_event(api_call *call, void *state, const gen_event *ev) {
    completion_state *st = state;
    completion_choice *c = &st->choices[ev->choice];
    bool stream = call->params.stream;
    switch (ev->kind) {
    case GEN_LOGPROB: {
        json_t **list = stream ? &st->delta_logprobs : &c->logprobs;
        if (!*list) *list = json_array();
        json_array_append_new(*list, api_logprob_entry(call, ev->token));
        break;
    }
    case GEN_CONTENT:
        gptoss_chat_buf_append(stream ? &st->delta : &c->text, ev->text, ev->len);
        break;
    case GEN_REASONING:
    case GEN_TOOL_CALL:
    case GEN_TOOL_ARGUMENTS:
        break; /* plain text mode produces none */
    case GEN_FINISH:
        c->finish_reason = ev->finish_reason;
        if (stream) st->finish_reason = ev->finish_reason;
        break;
    case GEN_END_OF_EVENT:
        if (stream) flush_delta(call, st, ev->choice);
        break;
    }
}

static void completion_stream_end(api_call *call, void *state) {
    (void)state;
    if (call->params.include_usage) {
        json_t *chunk = chunk_base(call);
        json_object_set_new(chunk, "choices", json_array());
        json_object_set_new(chunk, "usage", api_usage(call));
        api_sse(call, chunk);
    }
    api_sse_text(call, "data: [DONE]\n\n");
}

static json_t *completion_response(api_call *call, void *state) {
    completion_state *st = state;
    json_t *choices = json_array();
    for (int32_t i = 0; i < st->n; i++) {
        completion_choice *c = &st->choices[i];
        json_t *ch = json_pack("{s:i, s:o}", "index", i, "text",
                               server_json_text(c->text.data ? c->text.data : "", c->text.len));
        json_object_set_new(ch, "logprobs",
                            c->logprobs ? completion_logprobs(c->logprobs) : json_null());
        json_object_set_new(ch, "finish_reason",
                            json_string(c->finish_reason ? c->finish_reason : "stop"));
        json_array_append_new(choices, ch);
    }
    json_t *resp = chunk_base(call);
    json_object_set_new(resp, "choices", choices);
    json_object_set_new(resp, "usage", api_usage(call));
    return resp;
}

const api_encoder api_completions_encoder = {
    .name = "completions",
    .id_prefix = "cmpl",
    .text_mode = GEN_TEXT_PLAIN,
    .state_size = sizeof(completion_state),
    .init = completion_init,
    .fini = completion_fini,
    .event = completion_event,
    .stream_end = completion_stream_end,
    .response = completion_response,
};

/* prompt: a string, an array of token ids, or a one-element array of either. */
static bool completion_prompt(gptoss_server *s, const json_t *req, gptoss_tokens *out,
                              field_error *e) {
    json_t *p = json_member(req, "prompt");
    if (!p) return field_fail(e, "prompt", "prompt: required (a string or an array of token ids)");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    gptoss_error err = {0};
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return field_fail(e, "prompt", "prompt: must not be empty");
        if (gptoss_tokenizer_encode(s->tokenizer, json_string_value(p), json_string_length(p), true,
                                    out, &err) != GPTOSS_OK)
            return field_fail(e, "prompt", "prompt: %s", err.message);
        return true;
    }
    if (!json_is_array(p))
        return field_fail(e, "prompt", "prompt: expected a string or an array of token ids");
    if (json_array_size(p) == 0) return field_fail(e, "prompt", "prompt: must not be empty");
    int32_t vocab = gptoss_tokenizer_n_vocab(s->tokenizer);
    size_t i;
    json_t *id;
    json_array_foreach(p, i, id) {
        if (json_is_string(id) || json_is_array(id))
            return field_fail(
                e, "prompt",
                "prompt: several prompts in one request are not supported; send one per request");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= vocab)
            return field_fail(e, "prompt", "prompt[%zu]: expected a token id in [0, %d)", i, vocab);
        if (gptoss_tokens_push(out, (int32_t)json_integer_value(id), &err) != GPTOSS_OK)
            return field_fail(e, "prompt", "out of memory");
    }
    return true;
}

/* logprobs (an integer: alternatives per token), echo, suffix and best_of. */
static bool completion_fields(const json_t *req, request_params *params, field_error *e) {
    gptoss_sampling_params *p = &params->sampling;
    int32_t k = 0;
    bool present = false;
    if (!param_int(req, "logprobs", 0, GPTOSS_MAX_TOP_LOGPROBS, &k, &present, e)) return false;
    if (present) p->logprobs = true, p->top_logprobs = k;
    bool echo = false;
    if (!param_bool(req, "echo", &echo, e)) return false;
    if (echo)
        return field_fail(e, "echo", "echo: echoing the prompt is not supported; leave it false");
    if (json_member(req, "suffix"))
        return field_fail(e, "suffix", "suffix: insertion is not supported by gpt-oss");
    json_t *best_of = json_member(req, "best_of");
    if (best_of && !(json_is_integer(best_of) && json_integer_value(best_of) == 1))
        return field_fail(e, "best_of", "best_of: only 1 is supported");
    if (!params->has_max_tokens) p->max_tokens = 16; /* the completions API's documented default */
    return true;
}

server_reply server_completions(gptoss_server *s, const server_request *http) {
    json_t *req = NULL;
    server_reply reply = api_parse_body(s, http, &req);
    if (!req) return reply;
    int32_t vocab = gptoss_tokenizer_n_vocab(s->tokenizer);
    field_error fe = {0};
    request_params params;
    gptoss_tokens prompt = {0};
    bool ok = request_params_parse(req, vocab, s->max_num_seqs, &params, &fe) &&
              completion_fields(req, &params, &fe) && request_params_finish(&params, vocab, &fe) &&
              completion_prompt(s, req, &prompt, &fe);
    json_decref(req);
    if (!ok) {
        request_params_free(&params);
        gptoss_tokens_free(&prompt);
        return api_bad_request(&fe);
    }
    reply =
        api_call_serve(s, http, &api_completions_encoder, prompt.ids, (int32_t)prompt.n, &params);
    gptoss_tokens_free(&prompt);
    return reply;
}
