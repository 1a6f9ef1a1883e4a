/*
 * fuzz_chat_request.c - libFuzzer target: arbitrary bytes as a Chat Completions request body,
 * through what the endpoint does before it calls the engine, in its order: the shared sampling
 * fields, logprobs, the structured-output fields (response_format, strict tools, tool_choice:
 * schemas compiled against the real tokenizer's vocabulary) and the prompt (messages, tools and
 * reasoning effort rendered to harmony tokens). Every refusal must say why; an accepted prompt
 * must hold only ids of the vocabulary and end in "<|start|>assistant", and its conversation,
 * rendered as plain messages, must read back through the strict harmony parser unchanged. The
 * tokenizer is loaded once from $GPTOSS_TOKENIZER_JSON.
 */
#include "chat/chat.h"
#include "chat/harmony_parser.h"
#include "chat/openai_chat.h"
#include "server/output_constraint.h"
#include "server/request_params.h"
#include "fuzz_support.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The parameter checks of the endpoint; false with fe filled on a refusal. */
static bool read_params(const json_t *req, int32_t vocab, request_params *params, field_error *fe) {
    bool ok = request_params_parse(req, vocab, 8, params, fe);
    gptoss_sampling_params *p = &params->sampling;
    bool present = false;
    int32_t max_completion_tokens = 0;
    ok = ok && param_bool(req, "logprobs", &p->logprobs, fe) &&
         param_int(req, "top_logprobs", 0, GPTOSS_MAX_TOP_LOGPROBS, &p->top_logprobs, &present, fe);
    ok = ok && param_int(req, "max_completion_tokens", 1, INT32_MAX, &max_completion_tokens,
                         &present, fe);
    if (ok && present) p->max_tokens = max_completion_tokens;
    ok = ok && request_params_finish(params, vocab, fe);
    return ok &&
           output_constraint_create(req, tokenizer, p->n, p->max_tokens, &params->constraint, fe);
}

static bool same_string(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* The request's conversation, rendered as plain messages and read back by the strict harmony
 * parser, gives back every message: its author, recipient, channel and content type, and for
 * text messages the text itself. */
static void check_round_trip(const json_t *req, const gptoss_openai_chat_options *options) {
    gptoss_harmony_conversation conv;
    gptoss_harmony_conversation_init(&conv);
    gptoss_error err = {0};
    gptoss_tokens ids = {0};
    gptoss_harmony_render_options ro = {.mode = GPTOSS_RENDER_PLAIN};
    if (gptoss_openai_chat_to_harmony(req, options, &conv, &err) != GPTOSS_OK ||
        gptoss_harmony_render_tokens(&conv, &ro, tokenizer, &ids, &err) != GPTOSS_OK)
        abort(); /* the prompt was rendered from the same request */
    gptoss_harmony_parser_options po = {.strict = true};
    gptoss_harmony_parser *parser = NULL;
    if (gptoss_harmony_parser_create(tokenizer, &po, &parser, &err) != GPTOSS_OK) abort();
    for (size_t i = 0; i < ids.n; i++)
        if (gptoss_harmony_parser_push(parser, ids.ids[i], &err) != GPTOSS_OK) abort();
    if (gptoss_harmony_parser_finish(parser, &err) != GPTOSS_OK) abort();
    if (gptoss_harmony_parser_n_messages(parser) != conv.n_messages) abort();
    for (size_t m = 0; m < conv.n_messages; m++) {
        const gptoss_harmony_message *want = &conv.messages[m];
        const gptoss_harmony_parsed_message *got = gptoss_harmony_parser_message(parser, m);
        if (got->role != want->role || !same_string(got->name, want->name) ||
            !same_string(got->channel, want->channel) ||
            !same_string(got->content_type, want->content_type))
            abort();
        const bool to_all = want->recipient && strcmp(want->recipient, "all") == 0;
        if (!same_string(got->recipient, to_all ? NULL : want->recipient)) abort();
        size_t at = 0;
        bool text = true;
        for (size_t c = 0; c < want->n_content && text; c++) {
            const gptoss_harmony_content *part = &want->content[c];
            text = part->kind == GPTOSS_CONTENT_TEXT;
            if (!text) break;
            if (at + part->text_len > got->content_len ||
                memcmp(got->content + at, part->text, part->text_len) != 0)
                abort();
            at += part->text_len;
        }
        if (text && at != got->content_len) abort();
    }
    gptoss_harmony_parser_free(parser);
    gptoss_tokens_free(&ids);
    gptoss_harmony_conversation_free(&conv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *req = json_loadb((const char *)data, size, JSON_ALLOW_NUL, &jerr);
    if (!req) return 0;
    if (!json_is_object(req)) {
        json_decref(req);
        return 0;
    }
    const int32_t vocab = gptoss_tokenizer_n_vocab(tokenizer);
    field_error fe = {0};
    request_params params;
    const bool ok = read_params(req, vocab, &params, &fe);
    if (!ok && fe.message[0] == '\0') abort(); /* every refusal says why */
    request_params_free(&params);

    /* the prompt, also for requests whose parameters were refused (the renderer must not
     * rely on them having been checked) */
    gptoss_openai_chat_options options = {0};
    gptoss_chat_prompt prompt = {0};
    gptoss_error err = {0};
    if (gptoss_chat_prompt_from_request(tokenizer, req, &options, &prompt, &err) == GPTOSS_OK) {
        fuzz_check_prompt(tokenizer, prompt.tokens.ids, prompt.tokens.n);
        check_round_trip(req, &options);
    } else if (err.message[0] == '\0') {
        abort();
    }
    gptoss_chat_prompt_free(&prompt);
    json_decref(req);
    return 0;
}
