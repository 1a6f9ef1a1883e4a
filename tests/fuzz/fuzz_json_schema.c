/*
 * fuzz_json_schema.c - libFuzzer target: arbitrary bytes as a JSON Schema (the bytes up to the
 * first 0 byte; those after it steer a walk), compiled against the real tokenizer's vocabulary.
 * A refusal must say why. For a compiled schema, a matcher walks up to 24 tokens under a budget,
 * each chosen by the steering bytes among those `allow` offers: every offered token must be
 * taken; a token not offered must be refused, leaving the state as it was (the next offer is the
 * same); once a token was taken under the budget, the walk must never end where the value is not
 * complete; and a complete walk's text must parse as JSON. The tokenizer is loaded once from
 * $GPTOSS_TOKENIZER_JSON.
 */
#include "structured/json_schema.h"
#define FUZZ_OWN_INIT
#include "fuzz_support.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gptoss_tokenizer *tokenizer;
static gptoss_json_vocab *vocab;
static int32_t n_vocab;
static uint32_t *mask, *mask2;
static int32_t *allowed;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tokenizer = fuzz_load_tokenizer();
    gptoss_error err = {0};
    if (gptoss_json_vocab_create(tokenizer, &vocab, &err) != GPTOSS_OK) {
        fprintf(stderr, "the JSON vocabulary: %s\n", err.message);
        exit(2);
    }
    n_vocab = gptoss_tokenizer_n_vocab(tokenizer);
    const size_t words = ((size_t)n_vocab + 31) / 32;
    mask = malloc(words * sizeof *mask);
    mask2 = malloc(words * sizeof *mask2);
    allowed = malloc((size_t)n_vocab * sizeof *allowed);
    if (!mask || !mask2 || !allowed) exit(2);
    return 0;
}

static int32_t offered(gptoss_token_constraint *m, uint32_t *into) {
    memset(into, 0, ((size_t)n_vocab + 31) / 32 * sizeof *into);
    gptoss_constraint_allow(m, into, n_vocab);
    int32_t n = 0;
    for (int32_t t = 0; t < n_vocab; t++)
        if (into[t / 32] >> (t % 32) & 1) allowed[n++] = t;
    return n;
}

static void walk(gptoss_json_schema *schema, const uint8_t *steer, size_t n_steer) {
    gptoss_token_constraint *m = NULL;
    gptoss_error err = {0};
    if (gptoss_json_matcher_create(schema, &m, &err) != GPTOSS_OK) {
        if (err.message[0] == '\0') abort();
        return;
    }
    size_t k = 0;
    gptoss_json_matcher_set_budget(m, 24);
    char text[24 * 1024];
    size_t len = 0;
    int steps = 0;
    for (; steps < 24; steps++) {
        const int32_t n = offered(m, mask);
        if (n == 0) {
            if (steps > 0 && !gptoss_constraint_complete(m)) abort(); /* a dead end */
            break;
        }
        const uint32_t r = k + 1 < n_steer ? (uint32_t)steer[k] << 8 | steer[k + 1] : 0;
        k += 2;
        const int32_t pick = allowed[r % (uint32_t)n];
        if (steps == 0 && n < n_vocab) {
            /* the first token not offered (from a steered start) is refused, state kept */
            int32_t t = (int32_t)(r % (uint32_t)n_vocab);
            while (mask[t / 32] >> (t % 32) & 1)
                t = (t + 1) % n_vocab;
            if (gptoss_constraint_advance(m, t)) abort();
            if (offered(m, mask2) != n ||
                memcmp(mask, mask2, ((size_t)n_vocab + 31) / 32 * sizeof *mask) != 0)
                abort();
        }
        if (!gptoss_constraint_advance(m, pick)) abort(); /* offered, so taken */
        size_t tl = 0;
        const char *b = gptoss_tokenizer_token_bytes(tokenizer, pick, &tl);
        if (!b || len + tl > sizeof text) abort();
        memcpy(text + len, b, tl);
        len += tl;
    }
    if (steps > 0 && gptoss_constraint_complete(m)) {
        json_error_t jerr;
        json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!v) abort(); /* a complete value is JSON */
        json_decref(v);
    }
    gptoss_constraint_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *zero = memchr(data, 0, size);
    const size_t n_schema = zero ? (size_t)(zero - data) : size;
    json_error_t jerr;
    json_t *doc = json_loadb((const char *)data, n_schema, JSON_DECODE_ANY, &jerr);
    if (!doc) return 0;
    gptoss_json_schema *schema = NULL;
    gptoss_error err = {0};
    if (gptoss_json_schema_compile(doc, vocab, &schema, &err) != GPTOSS_OK) {
        if (err.message[0] == '\0') abort(); /* every refusal says why */
    } else {
        walk(schema, zero ? zero + 1 : data + size, zero ? size - n_schema - 1 : 0);
        gptoss_json_schema_free(schema);
    }
    json_decref(doc);
    return 0;
}
