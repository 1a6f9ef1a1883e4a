/*
 * json_scan.h - a small, strict, allocation-light JSON pull scanner (tokenizer.json and other large
 * JSON files).
 *
 * Why not jansson: building a DOM of the 27 MB tokenizer.json (200k vocab keys, 446k merge
 * pairs) costs far more than the tokenizer needs; this scanner walks the text once, decodes
 * only the strings the caller asks for, and validates everything it skips (RFC 8259 syntax,
 * UTF-8, nesting depth), so a corrupt file is still reported with line and column.
 *
 * Owns: the cursor over a caller-owned buffer and one scratch buffer for decoded strings.
 * Must not: know anything about tokenizers; read past `end`; recurse without a depth limit.
 */
#ifndef GPTOSS_UTIL_JSON_SCAN_H
#define GPTOSS_UTIL_JSON_SCAN_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gptoss_jscan {
    const char *begin;  /* start of the document (for line/column in errors) */
    const char *p;      /* next unread byte */
    const char *end;    /* one past the last byte */
    const char *what;   /* file name used in error messages */
    char *scratch;      /* decoded string of the last gptoss_jscan_string call */
    size_t scratch_len; /* bytes in scratch (not counting the NUL kept after them) */
    size_t scratch_cap; /* bytes allocated for scratch */
} gptoss_jscan;

void gptoss_jscan_init(gptoss_jscan *scan, const char *data, size_t len, const char *what);
void gptoss_jscan_free(gptoss_jscan *scan);

/* Formats "FILE:LINE:COL: message" at the current position and returns GPTOSS_ERR_FORMAT. */
gptoss_status gptoss_jscan_fail(gptoss_jscan *scan, gptoss_error *error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The next non-space byte without consuming it, or 0 at end of input. */
char gptoss_jscan_peek(gptoss_jscan *scan);

/* Consumes the byte `c` (after spaces) or fails naming what was expected. */
gptoss_status gptoss_jscan_expect(gptoss_jscan *scan, char c, gptoss_error *error);

/* Decodes a string value into scan->scratch / scan->scratch_len (escapes resolved, UTF-8
 * validated, NUL-terminated; embedded NULs are possible so use the length). */
gptoss_status gptoss_jscan_string(gptoss_jscan *scan, gptoss_error *error);

/* Reads an integer value (no fraction or exponent) within [lo, hi]. */
gptoss_status gptoss_jscan_int(gptoss_jscan *scan, int64_t lo, int64_t hi, int64_t *out,
                               gptoss_error *error);

/* Reads true or false. */
gptoss_status gptoss_jscan_bool(gptoss_jscan *scan, bool *out, gptoss_error *error);

/* Validates and skips any value. */
gptoss_status gptoss_jscan_skip(gptoss_jscan *scan, gptoss_error *error);

/*
 * Object and array iteration. Usage:
 *   bool more; gptoss_jscan_object_begin(s, &more, err);
 *   while (more) { gptoss_jscan_string(s, err) (the key); ...value...;
 *                  gptoss_jscan_object_next(s, &more, err); }
 * object_begin consumes '{' and tells whether a key follows; object_next consumes ',' or '}'
 * and, for objects, the ':' after the next key is consumed by gptoss_jscan_key.
 */
gptoss_status gptoss_jscan_object_begin(gptoss_jscan *scan, bool *more, gptoss_error *error);
gptoss_status gptoss_jscan_key(gptoss_jscan *scan, gptoss_error *error); /* key and ':' */
gptoss_status gptoss_jscan_object_next(gptoss_jscan *scan, bool *more, gptoss_error *error);
gptoss_status gptoss_jscan_array_begin(gptoss_jscan *scan, bool *more, gptoss_error *error);
gptoss_status gptoss_jscan_array_next(gptoss_jscan *scan, bool *more, gptoss_error *error);

/* Whether the decoded scratch string equals the NUL-terminated `text`. */
bool gptoss_jscan_scratch_is(const gptoss_jscan *scan, const char *text);

#endif
