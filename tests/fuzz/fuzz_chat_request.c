/*
 * fuzz_chat_request.c - libFuzzer target: arbitrary bytes as a Chat Completions request body,
 * through what the endpoint does before it calls the engine, in its order: the shared sampling
 * fields, logprobs, the structured-output fields (response_format, strict tools, tool_choice:
 * schemas compiled against the real tokenizer's vocabulary) and the prompt (messages, tools and
 * reasoning effort rendered to harmony tokens). Every refusal must say why; an accepted prompt
 * must hold only ids of the vocabulary and end in "<|start|>assistant". The tokenizer is loaded
 * once from $GPTOSS_TOKENIZER_JSON.
 */
#include "chat/chat.h"
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
    } else if (err.message[0] == '\0') {
        abort();
    }
    gptoss_chat_prompt_free(&prompt);
    json_decref(req);
    return 0;
}
