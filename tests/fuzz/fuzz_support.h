/*
 * fuzz_support.h - what the libFuzzer targets of tests/fuzz/ share: the tokenizer they load once
 * from $GPTOSS_TOKENIZER_JSON (run-fuzzers.sh sets it), and the check every rendered chat prompt
 * must pass. Header-only (each target is one translation unit). Unless a target defines
 * FUZZ_OWN_INIT before including it, this header also defines the target's LLVMFuzzerInitialize,
 * which loads `tokenizer`.
 */
#ifndef GPTOSS_TESTS_FUZZ_SUPPORT_H
#define GPTOSS_TESTS_FUZZ_SUPPORT_H

#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The tokenizer of $GPTOSS_TOKENIZER_JSON; exits with a message when it cannot be loaded. */
static inline gptoss_tokenizer *fuzz_load_tokenizer(void) {
    const char *path = getenv("GPTOSS_TOKENIZER_JSON");
    if (!path) {
        fprintf(stderr, "set GPTOSS_TOKENIZER_JSON to a tokenizer.json\n");
        exit(2);
    }
    gptoss_tokenizer *tokenizer = NULL;
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tokenizer, &err) != GPTOSS_OK) {
        fprintf(stderr, "loading %s: %s\n", path, err.message);
        exit(2);
    }
    return tokenizer;
}

/* Aborts unless ids[0..n) are ids of the vocabulary ending in "<|start|>assistant", as every
 * prompt rendered for a completion must. */
static inline void fuzz_check_prompt(const gptoss_tokenizer *tokenizer, const int32_t *ids,
                                     size_t n) {
    const int32_t vocab = gptoss_tokenizer_n_vocab(tokenizer);
    if (n < 2) abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) abort();
    if (ids[n - 2] != gptoss_tokenizer_special_id(tokenizer, "<|start|>")) abort();
    size_t len = 0;
    const char *last = gptoss_tokenizer_token_bytes(tokenizer, ids[n - 1], &len);
    if (!last || len != 9 || memcmp(last, "assistant", 9) != 0) abort();
}

#ifndef FUZZ_OWN_INIT
static gptoss_tokenizer *tokenizer;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    tokenizer = fuzz_load_tokenizer();
    return 0;
}
#endif

#endif
