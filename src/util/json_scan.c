/*
 * json_scan.c - the strict JSON pull scanner (see json_scan.h).
 *
 * Grammar is RFC 8259: no comments, no trailing commas, no NaN, strings must be valid UTF-8
 * with no raw control characters, \u escapes must pair surrogates. Nesting is limited so a
 * hostile file cannot exhaust the stack.
 */
#include "util/json_scan.h"
#include "util/error.h"
#include "util/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JSCAN_MAX_DEPTH = 128 };

void gptoss_jscan_init(gptoss_jscan *scan, const char *data, size_t len, const char *what) {
    memset(scan, 0, sizeof *scan);
    scan->begin = data;
    scan->p = data;
    scan->end = data + len;
    scan->what = what;
}

void gptoss_jscan_free(gptoss_jscan *scan) {
    free(scan->scratch);
    scan->scratch = NULL;
    scan->scratch_cap = scan->scratch_len = 0;
}

gptoss_status gptoss_jscan_fail(gptoss_jscan *scan, gptoss_error *error, const char *fmt, ...) {
    /* Line and column are computed only on failure, so the happy path pays nothing. */
    size_t line = 1, col = 1;
    for (const char *q = scan->begin; q < scan->p && q < scan->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char message[GPTOSS_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s:%zu:%zu: %s", scan->what, line, col,
                            message);
}

static void skip_space(gptoss_jscan *scan) {
    const char *p = scan->p;
    while (p < scan->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    scan->p = p;
}

char gptoss_jscan_peek(gptoss_jscan *scan) {
    skip_space(scan);
    return scan->p < scan->end ? *scan->p : 0;
}

static const char *describe(gptoss_jscan *scan) {
    if (scan->p >= scan->end) return "end of file";
    return "another character";
}

gptoss_status gptoss_jscan_expect(gptoss_jscan *scan, char c, gptoss_error *error) {
    skip_space(scan);
    if (scan->p >= scan->end || *scan->p != c)
        return gptoss_jscan_fail(scan, error, "expected '%c' but found %s", c, describe(scan));
    scan->p++;
    return GPTOSS_OK;
}

static gptoss_status scratch_reserve(gptoss_jscan *scan, size_t extra, gptoss_error *error) {
    if (scan->scratch_len + extra + 1 <= scan->scratch_cap) return GPTOSS_OK;
    size_t cap = scan->scratch_cap ? scan->scratch_cap : 256;
    while (cap < scan->scratch_len + extra + 1)
        cap *= 2;
    char *grown = realloc(scan->scratch, cap);
    if (!grown)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory reading %s",
                                scan->what);
    scan->scratch = grown;
    scan->scratch_cap = cap;
    return GPTOSS_OK;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(gptoss_jscan *scan, uint32_t *out) {
    if (scan->end - scan->p < 4) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(scan->p[i]);
        if (h < 0) return false;
        v = v * 16 + (uint32_t)h;
    }
    scan->p += 4;
    *out = v;
    return true;
}

gptoss_status gptoss_jscan_string(gptoss_jscan *scan, gptoss_error *error) {
    gptoss_status st = gptoss_jscan_expect(scan, '"', error);
    if (st) return st;
    scan->scratch_len = 0;
    for (;;) {
        /* Copy the longest run of plain bytes at once. */
        const char *run = scan->p;
        while (scan->p < scan->end) {
            unsigned char c = (unsigned char)*scan->p;
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            scan->p++;
        }
        size_t n = (size_t)(scan->p - run);
        if (n) {
            if ((st = scratch_reserve(scan, n, error))) return st;
            memcpy(scan->scratch + scan->scratch_len, run, n);
            scan->scratch_len += n;
        }
        if (scan->p >= scan->end) return gptoss_jscan_fail(scan, error, "unterminated string");
        unsigned char c = (unsigned char)*scan->p;
        if (c == '"') {
            scan->p++;
            break;
        }
        if (c < 0x20)
            return gptoss_jscan_fail(scan, error, "raw control character 0x%02x in a string", c);
        if (c >= 0x80) {
            size_t len = gptoss_utf8_sequence_length((const unsigned char *)scan->p,
                                                     (size_t)(scan->end - scan->p));
            if (len == 0)
                return gptoss_jscan_fail(scan, error, "invalid UTF-8 byte 0x%02x in a string", c);
            if ((st = scratch_reserve(scan, len, error))) return st;
            memcpy(scan->scratch + scan->scratch_len, scan->p, len);
            scan->scratch_len += len;
            scan->p += len;
            continue;
        }
        /* An escape. */
        scan->p++;
        if (scan->p >= scan->end)
            return gptoss_jscan_fail(scan, error, "unterminated escape in a string");
        char e = *scan->p++;
        unsigned char out[4];
        size_t out_len = 1;
        switch (e) {
        case '"':
            out[0] = '"';
            break;
        case '\\':
            out[0] = '\\';
            break;
        case '/':
            out[0] = '/';
            break;
        case 'b':
            out[0] = '\b';
            break;
        case 'f':
            out[0] = '\f';
            break;
        case 'n':
            out[0] = '\n';
            break;
        case 'r':
            out[0] = '\r';
            break;
        case 't':
            out[0] = '\t';
            break;
        case 'u': {
            uint32_t cp;
            if (!read_hex4(scan, &cp))
                return gptoss_jscan_fail(scan, error, "bad \\u escape (need 4 hex digits)");
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return gptoss_jscan_fail(scan, error, "lone low surrogate \\u%04X in a string",
                                         (unsigned)cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t low;
                if (scan->end - scan->p < 2 || scan->p[0] != '\\' || scan->p[1] != 'u')
                    return gptoss_jscan_fail(
                        scan, error, "high surrogate \\u%04X not followed by a low surrogate",
                        (unsigned)cp);
                scan->p += 2;
                if (!read_hex4(scan, &low) || low < 0xDC00 || low > 0xDFFF)
                    return gptoss_jscan_fail(
                        scan, error, "high surrogate \\u%04X not followed by a low surrogate",
                        (unsigned)cp);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            out_len = gptoss_utf8_encode(cp, out);
            break;
        }
        default:
            return gptoss_jscan_fail(scan, error, "unknown escape '\\%c' in a string", e);
        }
        if ((st = scratch_reserve(scan, out_len, error))) return st;
        memcpy(scan->scratch + scan->scratch_len, out, out_len);
        scan->scratch_len += out_len;
    }
    if ((st = scratch_reserve(scan, 0, error))) return st;
    scan->scratch[scan->scratch_len] = '\0';
    return GPTOSS_OK;
}

/* Scans a number per the JSON grammar; reports whether it had a fraction or exponent. */
static gptoss_status scan_number(gptoss_jscan *scan, bool *is_integer, gptoss_error *error) {
    const char *p = scan->p;
    *is_integer = true;
    if (p < scan->end && *p == '-') p++;
    if (p >= scan->end || *p < '0' || *p > '9')
        return gptoss_jscan_fail(scan, error, "malformed number");
    if (*p == '0') {
        p++;
    } else {
        while (p < scan->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < scan->end && *p == '.') {
        *is_integer = false;
        p++;
        if (p >= scan->end || *p < '0' || *p > '9')
            return gptoss_jscan_fail(scan, error, "malformed number");
        while (p < scan->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < scan->end && (*p == 'e' || *p == 'E')) {
        *is_integer = false;
        p++;
        if (p < scan->end && (*p == '+' || *p == '-')) p++;
        if (p >= scan->end || *p < '0' || *p > '9')
            return gptoss_jscan_fail(scan, error, "malformed number");
        while (p < scan->end && *p >= '0' && *p <= '9')
            p++;
    }
    scan->p = p;
    return GPTOSS_OK;
}

gptoss_status gptoss_jscan_int(gptoss_jscan *scan, int64_t lo, int64_t hi, int64_t *out,
                               gptoss_error *error) {
    skip_space(scan);
    const char *start = scan->p;
    if (start >= scan->end || (*start != '-' && (*start < '0' || *start > '9')))
        return gptoss_jscan_fail(scan, error, "expected an integer");
    bool is_integer;
    gptoss_status st = scan_number(scan, &is_integer, error);
    if (st) return st;
    if (!is_integer) {
        scan->p = start;
        return gptoss_jscan_fail(scan, error, "expected an integer, found a fraction or exponent");
    }
    const char *p = start;
    bool negative = *p == '-';
    if (negative) p++;
    int64_t v = 0;
    for (; p < scan->p; p++) {
        if (v > (INT64_MAX - 9) / 10) {
            scan->p = start;
            return gptoss_jscan_fail(scan, error, "integer out of range [%lld, %lld]",
                                     (long long)lo, (long long)hi);
        }
        v = v * 10 + (*p - '0');
    }
    if (negative) v = -v;
    if (v < lo || v > hi) {
        scan->p = start;
        return gptoss_jscan_fail(scan, error, "integer %lld out of range [%lld, %lld]",
                                 (long long)v, (long long)lo, (long long)hi);
    }
    *out = v;
    return GPTOSS_OK;
}

static bool take_literal(gptoss_jscan *scan, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(scan->end - scan->p) < n || memcmp(scan->p, word, n) != 0) return false;
    scan->p += n;
    return true;
}

gptoss_status gptoss_jscan_bool(gptoss_jscan *scan, bool *out, gptoss_error *error) {
    skip_space(scan);
    if (take_literal(scan, "true")) {
        *out = true;
        return GPTOSS_OK;
    }
    if (take_literal(scan, "false")) {
        *out = false;
        return GPTOSS_OK;
    }
    return gptoss_jscan_fail(scan, error, "expected true or false");
}

gptoss_status gptoss_jscan_object_begin(gptoss_jscan *scan, bool *more, gptoss_error *error) {
    skip_space(scan);
    if (scan->p >= scan->end || *scan->p != '{')
        return gptoss_jscan_fail(scan, error, "expected an object");
    scan->p++;
    *more = gptoss_jscan_peek(scan) != '}';
    if (!*more) scan->p++;
    return GPTOSS_OK;
}

gptoss_status gptoss_jscan_key(gptoss_jscan *scan, gptoss_error *error) {
    if (gptoss_jscan_peek(scan) != '"')
        return gptoss_jscan_fail(scan, error, "expected an object key (a string)");
    gptoss_status st = gptoss_jscan_string(scan, error);
    if (st) return st;
    return gptoss_jscan_expect(scan, ':', error);
}

static gptoss_status container_next(gptoss_jscan *scan, char close, bool *more,
                                    gptoss_error *error) {
    char c = gptoss_jscan_peek(scan);
    if (c == ',') {
        scan->p++;
        char after = gptoss_jscan_peek(scan);
        if (after == close) return gptoss_jscan_fail(scan, error, "trailing comma");
        *more = true;
        return GPTOSS_OK;
    }
    if (c == close) {
        scan->p++;
        *more = false;
        return GPTOSS_OK;
    }
    return gptoss_jscan_fail(scan, error, "expected ',' or '%c' but found %s", close,
                             scan->p >= scan->end ? "end of file" : "another character");
}

gptoss_status gptoss_jscan_object_next(gptoss_jscan *scan, bool *more, gptoss_error *error) {
    return container_next(scan, '}', more, error);
}

gptoss_status gptoss_jscan_array_begin(gptoss_jscan *scan, bool *more, gptoss_error *error) {
    skip_space(scan);
    if (scan->p >= scan->end || *scan->p != '[')
        return gptoss_jscan_fail(scan, error, "expected an array");
    scan->p++;
    *more = gptoss_jscan_peek(scan) != ']';
    if (!*more) scan->p++;
    return GPTOSS_OK;
}

gptoss_status gptoss_jscan_array_next(gptoss_jscan *scan, bool *more, gptoss_error *error) {
    return container_next(scan, ']', more, error);
}

static gptoss_status skip_value(gptoss_jscan *scan, int depth, gptoss_error *error) {
    if (depth > JSCAN_MAX_DEPTH)
        return gptoss_jscan_fail(scan, error, "nesting deeper than %d levels", JSCAN_MAX_DEPTH);
    char c = gptoss_jscan_peek(scan);
    gptoss_status st;
    bool more;
    switch (c) {
    case '{':
        if ((st = gptoss_jscan_object_begin(scan, &more, error))) return st;
        while (more) {
            if ((st = gptoss_jscan_key(scan, error))) return st;
            if ((st = skip_value(scan, depth + 1, error))) return st;
            if ((st = gptoss_jscan_object_next(scan, &more, error))) return st;
        }
        return GPTOSS_OK;
    case '[':
        if ((st = gptoss_jscan_array_begin(scan, &more, error))) return st;
        while (more) {
            if ((st = skip_value(scan, depth + 1, error))) return st;
            if ((st = gptoss_jscan_array_next(scan, &more, error))) return st;
        }
        return GPTOSS_OK;
    case '"':
        return gptoss_jscan_string(scan, error);
    case 't':
    case 'f': {
        bool ignored;
        return gptoss_jscan_bool(scan, &ignored, error);
    }
    case 'n':
        if (take_literal(scan, "null")) return GPTOSS_OK;
        return gptoss_jscan_fail(scan, error, "expected a value");
    case 0:
        return gptoss_jscan_fail(scan, error, "expected a value but found end of file");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            bool is_integer;
            return scan_number(scan, &is_integer, error);
        }
        return gptoss_jscan_fail(
            scan, error, "expected a value (object, array, string, number, true, false or null)");
    }
}

gptoss_status gptoss_jscan_skip(gptoss_jscan *scan, gptoss_error *error) {
    return skip_value(scan, 0, error);
}

bool gptoss_jscan_scratch_is(const gptoss_jscan *scan, const char *text) {
    size_t n = strlen(text);
    return scan->scratch_len == n && memcmp(scan->scratch, text, n) == 0;
}
