/*
 * fuzz_responses_input.c - libFuzzer target: arbitrary bytes as the `input` of a /v1/responses
 * request (a string or an array of items), read against no earlier response and then against
 * itself as the earlier response's items (the previous_response_id chain), and the items turned
 * into Chat Completions messages and rendered to harmony tokens as the endpoint does. Every
 * refusal must say why; the messages of accepted items must be an array; a rendered prompt must
 * end in "<|start|>assistant". The tokenizer is loaded once from $GPTOSS_TOKENIZER_JSON.
 */
#include "chat/chat.h"
#include "server/responses_input.h"
#include "fuzz_support.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The items as the endpoint renders them: instructions first when given. */
static void render(const json_t *items, const char *instructions) {
    json_t *messages = responses_items_to_messages(instructions, items);
    if (!json_is_array(messages)) abort();
    json_t *req = json_pack("{s:o}", "messages", messages);
    if (!req) abort();
    gptoss_openai_chat_options options = {0};
    gptoss_chat_prompt prompt = {0};
    gptoss_error err = {0};
    if (gptoss_chat_prompt_from_request(tokenizer, req, &options, &prompt, &err) == GPTOSS_OK)
        fuzz_check_prompt(tokenizer, prompt.tokens.ids, prompt.tokens.n);
    else if (err.message[0] == '\0')
        abort();
    gptoss_chat_prompt_free(&prompt);
    json_decref(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *input = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!input) return 0;
    json_t *items = json_array();
    field_error fe = {0};
    if (responses_input_read(input, NULL, items, &fe)) {
        render(items, size % 2 ? "Answer briefly." : NULL);
        /* the same input again, after a response whose items were these */
        json_t *more = json_array();
        field_error fe2 = {0};
        if (responses_input_read(input, items, more, &fe2)) {
            json_t *chain = json_deep_copy(items);
            json_array_extend(chain, more);
            render(chain, NULL);
            json_decref(chain);
        } else if (fe2.message[0] == '\0') {
            abort();
        }
        json_decref(more);
    } else if (fe.message[0] == '\0') {
        abort();
    }
    json_decref(items);
    json_decref(input);
    return 0;
}
