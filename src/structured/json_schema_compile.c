/*
 * json_schema_compile.c - JSON Schema keywords to the pushdown automaton of json_automaton.h:
 * the compiler (objects, arrays, strings through their character automata, numbers through
 * digit ranges, any-values, $ref machines), the check for $ref cycles that consume nothing,
 * and the distances to completion.
 *
 * Owns: the compiler's scratch (freed when compilation ends); the graph it hands to the schema.
 */
#include "structured/json_automaton.h"

#include "structured/json_regex.h"
#include "util/error.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DIGITS 16  /* digits of an integer part and of a fraction */
#define STRING_MACHINE (-3) /* machine.any_level of the shared string machine */
#define CHAR_MACHINE (-4)   /* machine.any_level of the shared character machine */

/* ---- the compiler ------------------------------------------------------------------------ */

typedef struct compiler {
    const json_t *root;
    gptoss_error *error;
    bool failed;
    nfa_edge *edges;
    int32_t n_edges, cap_edges;
    int32_t n_states;
    machine *machines;
    int32_t n_machines, cap_machines;
    int32_t next_to_compile;
    int32_t any_machine[JSON_ANY_NESTING + 1];
    int32_t string_machine; /* the unconstrained string, shared by every use */
    int32_t char_machine;   /* one unconstrained string character, for long length limits */
    char pointer[1024];
    size_t pointer_len;
    int inline_depth;
    json_t *merged; /* array holding schemas made by merging allOf, alive until compiled */
} compiler;

static int32_t fail(compiler *c, const char *fmt, ...) GPTOSS_PRINTF(2, 3);
static int32_t fail(compiler *c, const char *fmt, ...) {
    if (!c->failed && c->error) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->error->message, sizeof c->error->message, fmt, ap);
        va_end(ap);
        c->error->status = GPTOSS_ERR_INVALID_ARGUMENT;
    }
    c->failed = true;
    return 0;
}

static const char *where(const compiler *c) {
    return c->pointer_len ? c->pointer : "/";
}

static size_t pointer_push(compiler *c, const char *segment) {
    size_t saved = c->pointer_len;
    size_t cap = sizeof c->pointer;
    if (c->pointer_len + 2 >= cap) return saved;
    c->pointer[c->pointer_len++] = '/';
    for (const char *p = segment; *p && c->pointer_len + 3 < cap; p++) {
        if (*p == '~' || *p == '/') {
            c->pointer[c->pointer_len++] = '~';
            c->pointer[c->pointer_len++] = *p == '~' ? '0' : '1';
        } else {
            c->pointer[c->pointer_len++] = *p;
        }
    }
    c->pointer[c->pointer_len] = 0;
    return saved;
}

static size_t pointer_push_index(compiler *c, size_t index) {
    char buf[32];
    snprintf(buf, sizeof buf, "%zu", index);
    return pointer_push(c, buf);
}

static void pointer_pop(compiler *c, size_t saved) {
    c->pointer_len = saved;
    c->pointer[saved] = 0;
}

static int32_t new_state(compiler *c) {
    if (c->n_states >= JSON_MAX_NFA_STATES) {
        fail(c, "schema too large: its automaton exceeds %d states (at %s)", JSON_MAX_NFA_STATES,
             where(c));
        return 0;
    }
    return c->n_states++;
}

static void add_edge(compiler *c, nfa_edge e) {
    if (c->failed) return;
    if (c->n_edges == c->cap_edges) {
        int32_t cap = c->cap_edges ? c->cap_edges * 2 : 1024;
        nfa_edge *n = realloc(c->edges, (size_t)cap * sizeof *n);
        if (!n) {
            fail(c, "out of memory compiling the schema");
            return;
        }
        c->edges = n;
        c->cap_edges = cap;
    }
    c->edges[c->n_edges++] = e;
}

static void eps(compiler *c, int32_t from, int32_t to) {
    add_edge(c, (nfa_edge){.from = from, .to = to, .kind = EDGE_EPS});
}

static void byte_range(compiler *c, int32_t from, int32_t to, uint8_t lo, uint8_t hi) {
    add_edge(c, (nfa_edge){.from = from, .to = to, .kind = EDGE_BYTE, .lo = lo, .hi = hi});
}

/* A byte string from `from`; returns its end. */
static int32_t literal(compiler *c, int32_t from, const char *bytes, size_t len) {
    for (size_t i = 0; i < len && !c->failed; i++) {
        int32_t to = new_state(c);
        byte_range(c, from, to, (uint8_t)bytes[i], (uint8_t)bytes[i]);
        from = to;
    }
    return from;
}

static int32_t lit(compiler *c, int32_t from, const char *text) {
    return literal(c, from, text, strlen(text));
}

/* The whitespace rule: at most one space, and only after ':' and ','. */
static int32_t optional_space(compiler *c, int32_t from) {
    int32_t to = new_state(c);
    eps(c, from, to);
    byte_range(c, from, to, ' ', ' ');
    return to;
}

static int32_t call(compiler *c, int32_t from, int32_t callee) {
    int32_t ret = new_state(c);
    add_edge(c, (nfa_edge){.from = from, .to = ret, .callee = callee, .kind = EDGE_CALL});
    return ret;
}

static int32_t new_machine(compiler *c, const json_t *schema, int32_t any_level) {
    if (c->n_machines == c->cap_machines) {
        int32_t cap = c->cap_machines ? c->cap_machines * 2 : 16;
        machine *m = realloc(c->machines, (size_t)cap * sizeof *m);
        if (!m) return fail(c, "out of memory compiling the schema"), -1;
        c->machines = m;
        c->cap_machines = cap;
    }
    machine *m = &c->machines[c->n_machines];
    m->start = new_state(c);
    m->exit = new_state(c);
    m->schema = schema;
    m->any_level = any_level;
    m->pointer = strdup(c->pointer_len ? c->pointer : "");
    if (!m->pointer) return fail(c, "out of memory compiling the schema"), -1;
    return c->n_machines++;
}

/* The machine of a schema node, created (and queued for compilation) on first use. */
static int32_t schema_machine(compiler *c, const json_t *schema) {
    for (int32_t i = 0; i < c->n_machines; i++)
        if (c->machines[i].schema == schema) return i;
    return new_machine(c, schema, 0);
}

static int32_t any_machine(compiler *c, int32_t level) {
    if (c->any_machine[level] < 0) c->any_machine[level] = new_machine(c, NULL, level);
    return c->any_machine[level];
}

/* ---- strings ----------------------------------------------------------------------------- */

typedef struct seq_ctx {
    compiler *c;
    int32_t from, to;
} seq_ctx;

static void emit_sequence(void *user, int n, const uint8_t *first, const uint8_t *last) {
    seq_ctx *x = user;
    int32_t at = x->from;
    for (int i = 0; i < n; i++) {
        int32_t to = i == n - 1 ? x->to : new_state(x->c);
        byte_range(x->c, at, to, first[i], last[i]);
        at = to;
    }
}

static void hex_digit(compiler *c, int32_t from, int32_t to) {
    byte_range(c, from, to, '0', '9');
    byte_range(c, from, to, 'a', 'f');
    byte_range(c, from, to, 'A', 'F');
}

/* Any JSON string character from `from` to `to`: raw UTF-8 (no control characters, no '"' or
 * '\'), a short escape, or \uXXXX of a non-surrogate code point. */
static void any_string_char(compiler *c, int32_t from, int32_t to) {
    seq_ctx x = {c, from, to};
    utf8_sequences(0x20, 0x21, emit_sequence, &x);
    utf8_sequences(0x23, 0x5B, emit_sequence, &x);
    utf8_sequences(0x5D, CP_MAX, emit_sequence, &x);
    int32_t esc = new_state(c);
    byte_range(c, from, esc, '\\', '\\');
    static const char shorts[] = "\"\\/bfnrt";
    for (const char *p = shorts; *p; p++)
        byte_range(c, esc, to, (uint8_t)*p, (uint8_t)*p);
    int32_t u = new_state(c), h1 = new_state(c), h2 = new_state(c), h3 = new_state(c);
    byte_range(c, esc, u, 'u', 'u');
    int32_t d = new_state(c);
    byte_range(c, u, h1, '0', '9');
    byte_range(c, u, h1, 'a', 'c');
    byte_range(c, u, h1, 'A', 'C');
    byte_range(c, u, h1, 'e', 'f');
    byte_range(c, u, h1, 'E', 'F');
    byte_range(c, u, d, 'd', 'd');
    byte_range(c, u, d, 'D', 'D');
    byte_range(c, d, h2, '0', '7');
    hex_digit(c, h1, h2);
    hex_digit(c, h2, h3);
    hex_digit(c, h3, to);
}

/* One character of a set, each in one canonical JSON encoding: raw UTF-8, except '"' and
 * '\' (escaped) and control characters (short escapes, else \u00xx). */
static void set_char(compiler *c, int32_t from, int32_t to, const cp_set *set) {
    if (cp_set_is_all(set)) {
        any_string_char(c, from, to);
        return;
    }
    seq_ctx x = {c, from, to};
    for (int32_t i = 0; i < set->n && !c->failed; i++) {
        uint32_t lo = set->ranges[i].lo, hi = set->ranges[i].hi;
        for (uint32_t cp = lo; cp <= hi && cp < 0x20; cp++) {
            char buf[8];
            const char *e = cp == '\b'   ? "\\b"
                            : cp == '\t' ? "\\t"
                            : cp == '\n' ? "\\n"
                            : cp == '\f' ? "\\f"
                            : cp == '\r' ? "\\r"
                                         : NULL;
            if (!e) snprintf(buf, sizeof buf, "\\u%04x", cp), e = buf;
            int32_t end = literal(c, from, e, strlen(e) - 1);
            byte_range(c, end, to, (uint8_t)e[strlen(e) - 1], (uint8_t)e[strlen(e) - 1]);
        }
        if (lo < 0x20) lo = 0x20;
        if (lo > hi) continue;
        static const uint32_t specials[] = {'"', '\\'};
        for (int k = 0; k < 2; k++) {
            uint32_t sp = specials[k];
            if (lo <= sp && sp <= hi) {
                int32_t esc = new_state(c);
                byte_range(c, from, esc, '\\', '\\');
                byte_range(c, esc, to, (uint8_t)sp, (uint8_t)sp);
            }
        }
        /* the rest, skipping '"' and '\' */
        uint32_t cuts[] = {'"', '\\'};
        uint32_t at = lo;
        for (int k = 0; k < 2; k++) {
            if (cuts[k] >= at && cuts[k] <= hi) {
                if (cuts[k] > at) utf8_sequences(at, cuts[k] - 1, emit_sequence, &x);
                at = cuts[k] + 1;
            }
        }
        if (at <= hi) utf8_sequences(at, hi, emit_sequence, &x);
    }
}

/* A character NFA as JSON string content from `from`; returns the end. */
static int32_t char_nfa_bytes(compiler *c, const char_nfa *cn, int32_t from) {
    int32_t *map = malloc((size_t)cn->n_states * sizeof *map);
    if (!map) return fail(c, "out of memory compiling the schema"), from;
    for (int32_t i = 0; i < cn->n_states && !c->failed; i++)
        map[i] = new_state(c);
    if (c->failed) {
        free(map);
        return from;
    }
    eps(c, from, map[cn->start]);
    for (int32_t i = 0; i < cn->n_edges && !c->failed; i++) {
        char_edge e = cn->edges[i];
        if (e.set < 0) {
            eps(c, map[e.from], map[e.to]);
        } else if (cn->n_edges > 64 && cp_set_is_all(&cn->sets[e.set])) {
            /* long length limits: one call per counted character instead of ~25 states */
            if (c->char_machine < 0) c->char_machine = new_machine(c, NULL, CHAR_MACHINE);
            if (c->char_machine >= 0) eps(c, call(c, map[e.from], c->char_machine), map[e.to]);
        } else {
            set_char(c, map[e.from], map[e.to], &cn->sets[e.set]);
        }
    }
    int32_t end = map[cn->accept];
    free(map);
    return end;
}

static bool get_length(compiler *c, const json_t *schema, const char *key, int32_t *out) {
    const json_t *v = json_object_get(schema, key);
    if (!v) return false;
    size_t saved = pointer_push(c, key);
    double d = json_is_number(v) ? json_number_value(v) : -1;
    if (!json_is_number(v) || d < 0 || d != floor(d))
        fail(c, "'%s' must be a non-negative integer at %s", key, where(c));
    else if (d > 100000)
        fail(c, "'%s' of %.0f is above the supported 100000 at %s", key, d, where(c));
    else
        *out = (int32_t)d;
    pointer_pop(c, saved);
    return !c->failed;
}

static int32_t any_string(compiler *c, int32_t from);

static int32_t build_string(compiler *c, const json_t *schema, int32_t from) {
    const json_t *format = json_object_get(schema, "format");
    const json_t *pattern = json_object_get(schema, "pattern");
    int32_t min_len = 0, max_len = -1;
    get_length(c, schema, "minLength", &min_len);
    get_length(c, schema, "maxLength", &max_len);
    if (c->failed) return from;
    if (max_len >= 0 && max_len < min_len) return new_state(c); /* no string: no path */
    const char *regex = NULL, *pattern_regex = NULL; /* the latter: a pattern beside a format */
    const char *key = NULL;
    if (format) {
        key = "format";
        if (!json_is_string(format))
            return fail(c, "'format' must be a string at %s/format", c->pointer), from;
        regex = json_format_regex(json_string_value(format));
        if (!regex)
            return fail(c,
                        "unsupported format '%s' at %s/format (supported: date, time, "
                        "date-time, uuid, email, ipv4, hostname, uri, duration)",
                        json_string_value(format), c->pointer),
                   from;
    }
    if (pattern) {
        key = "pattern";
        if (!json_is_string(pattern))
            return fail(c, "'pattern' must be a string at %s/pattern", c->pointer), from;
        pattern_regex = json_string_value(pattern);
        if (!regex)
            regex = pattern_regex, pattern_regex = NULL;
        else
            key = "format";
    }
    if (!regex && min_len == 0 && max_len < 0) return any_string(c, from);
    int32_t at = lit(c, from, "\"");
    char_nfa cn;
    char_nfa_init(&cn, JSON_MAX_CHAR_STATES);
    char message[256];
    bool ok = regex ? json_regex_compile(regex, &cn, message, sizeof message)
                    : char_nfa_any(&cn, min_len, max_len, message, sizeof message);
    if (ok && pattern_regex) {
        char_nfa other;
        char_nfa_init(&other, JSON_MAX_CHAR_STATES);
        ok = json_regex_compile(pattern_regex, &other, message, sizeof message);
        if (!ok)
            key = "pattern";
        else
            ok = char_nfa_intersect(&cn, &other, message, sizeof message);
        char_nfa_free(&other);
    }
    if (ok && regex) ok = char_nfa_limit_length(&cn, min_len, max_len, message, sizeof message);
    if (!ok) {
        if (key)
            fail(c, "%s at %s/%s", message, c->pointer, key);
        else
            fail(c, "%s at %s", message, where(c));
    } else {
        at = char_nfa_bytes(c, &cn, at);
    }
    char_nfa_free(&cn);
    return lit(c, at, "\"");
}

/* The generic string (an object key of an unconstrained object). */
static int32_t any_string_body(compiler *c, int32_t from) {
    int32_t at = lit(c, from, "\"");
    any_string_char(c, at, at);
    return lit(c, at, "\"");
}

/* A call of the shared string machine: about 30 states saved at every use. */
static int32_t any_string(compiler *c, int32_t from) {
    if (c->string_machine < 0) c->string_machine = new_machine(c, NULL, STRING_MACHINE);
    return c->string_machine < 0 ? from : call(c, from, c->string_machine);
}

/* ---- numbers ----------------------------------------------------------------------------- */

#define NUM_LIMIT 9999999999999999LL /* JSON_MAX_DIGITS nines: exact in a double's range */

static void digits(compiler *c, int32_t from, int32_t to, int32_t n) {
    int32_t at = from;
    for (int32_t i = 0; i < n && !c->failed; i++) {
        int32_t next = i == n - 1 ? to : new_state(c);
        byte_range(c, at, next, '0', '9');
        at = next;
    }
    if (n == 0) eps(c, from, to);
}

/* 1 to max digits */
static int32_t some_digits(compiler *c, int32_t from, int32_t max) {
    int32_t end = new_state(c), at = from;
    for (int32_t i = 0; i < max && !c->failed; i++) {
        int32_t next = new_state(c);
        byte_range(c, at, next, '0', '9');
        eps(c, next, end);
        at = next;
    }
    return end;
}

/* Decimal strings lo..hi of n digits each (leading zeros allowed: these are suffixes). */
static void digit_range(compiler *c, int32_t from, int32_t to, const char *lo, const char *hi,
                        int n) {
    if (c->failed) return;
    if (n == 1) {
        byte_range(c, from, to, (uint8_t)lo[0], (uint8_t)hi[0]);
        return;
    }
    bool lo_rest_zero = strspn(lo + 1, "0") == (size_t)(n - 1);
    bool hi_rest_nine = strspn(hi + 1, "9") == (size_t)(n - 1);
    if (lo_rest_zero && hi_rest_nine) {
        int32_t s = new_state(c);
        byte_range(c, from, s, (uint8_t)lo[0], (uint8_t)hi[0]);
        digits(c, s, to, n - 1);
        return;
    }
    if (lo[0] == hi[0]) {
        int32_t s = new_state(c);
        byte_range(c, from, s, (uint8_t)lo[0], (uint8_t)lo[0]);
        digit_range(c, s, to, lo + 1, hi + 1, n - 1);
        return;
    }
    char nines[JSON_MAX_DIGITS + 1], zeros[JSON_MAX_DIGITS + 1];
    memset(nines, '9', (size_t)n - 1), nines[n - 1] = 0;
    memset(zeros, '0', (size_t)n - 1), zeros[n - 1] = 0;
    int32_t s1 = new_state(c);
    byte_range(c, from, s1, (uint8_t)lo[0], (uint8_t)lo[0]);
    digit_range(c, s1, to, lo + 1, nines, n - 1);
    if (lo[0] + 1 <= hi[0] - 1) {
        int32_t s2 = new_state(c);
        byte_range(c, from, s2, (uint8_t)(lo[0] + 1), (uint8_t)(hi[0] - 1));
        digits(c, s2, to, n - 1);
    }
    int32_t s3 = new_state(c);
    byte_range(c, from, s3, (uint8_t)hi[0], (uint8_t)hi[0]);
    digit_range(c, s3, to, zeros, hi + 1, n - 1);
}

/* Non-negative integers lo..hi without leading zeros, from `from` to `to`. */
static void natural_range(compiler *c, int32_t from, int32_t to, int64_t lo, int64_t hi) {
    int64_t pow = 1;
    for (int n = 1; n <= JSON_MAX_DIGITS && !c->failed; n++, pow *= 10) {
        int64_t first = n == 1 ? 0 : pow, last = pow * 10 - 1;
        int64_t a = lo > first ? lo : first, b = hi < last ? hi : last;
        if (a > b) continue;
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%lld", (long long)a);
        snprintf(sb, sizeof sb, "%lld", (long long)b);
        digit_range(c, from, to, sa, sb, n);
    }
}

/* Integers lo..hi (never "-0"), from `from`; returns the end. */
static int32_t integer_range(compiler *c, int32_t from, int64_t lo, int64_t hi) {
    int32_t end = new_state(c);
    if (lo > hi) return end; /* no path: the caller's alternatives decide */
    if (hi >= 0) natural_range(c, from, end, lo > 0 ? lo : 0, hi);
    if (lo < 0) {
        int32_t minus = new_state(c);
        byte_range(c, from, minus, '-', '-');
        natural_range(c, minus, end, hi < 0 ? -hi : 1, -lo);
    }
    return end;
}

typedef struct bound {
    bool present, exclusive;
    double value;
} bound;

static bool read_bound(compiler *c, const json_t *schema, const char *key, const char *excl_key,
                       bool upper, bound *out) {
    const json_t *v = json_object_get(schema, key);
    const json_t *ex = json_object_get(schema, excl_key);
    memset(out, 0, sizeof *out);
    if (v) {
        if (!json_is_number(v)) {
            size_t saved = pointer_push(c, key);
            fail(c, "'%s' must be a number at %s", key, where(c));
            pointer_pop(c, saved);
            return false;
        }
        out->present = true;
        out->value = json_number_value(v);
    }
    if (ex) {
        size_t saved = pointer_push(c, excl_key);
        if (json_is_boolean(ex)) { /* draft 4: modifies minimum/maximum */
            out->exclusive = out->present && json_is_true(ex);
        } else if (json_is_number(ex)) {
            double e = json_number_value(ex);
            /* both given: the stricter one wins */
            if (!out->present || (upper ? e <= out->value : e >= out->value)) {
                out->present = true;
                out->exclusive = true;
                out->value = e;
            }
        } else {
            fail(c, "'%s' must be a number at %s", excl_key, where(c));
        }
        pointer_pop(c, saved);
    }
    return !c->failed;
}

static int64_t clamp_int(double v) {
    if (v > (double)NUM_LIMIT) return NUM_LIMIT + 1;
    if (v < -(double)NUM_LIMIT) return -NUM_LIMIT - 1;
    return (int64_t)v;
}

/* The integers a pair of bounds allows. */
static void integer_bounds(const bound *lo, const bound *hi, int64_t *ilo, int64_t *ihi) {
    *ilo = -NUM_LIMIT, *ihi = NUM_LIMIT;
    if (lo->present) {
        int64_t v = lo->exclusive ? clamp_int(floor(lo->value)) + 1 : clamp_int(ceil(lo->value));
        if (v > *ilo) *ilo = v;
    }
    if (hi->present) {
        int64_t v = hi->exclusive ? clamp_int(ceil(hi->value)) - 1 : clamp_int(floor(hi->value));
        if (v < *ihi) *ihi = v;
    }
}

static int32_t build_integer(compiler *c, const json_t *schema, int32_t from) {
    bound lo, hi;
    if (!read_bound(c, schema, "minimum", "exclusiveMinimum", false, &lo) ||
        !read_bound(c, schema, "maximum", "exclusiveMaximum", true, &hi))
        return from;
    int64_t ilo, ihi;
    integer_bounds(&lo, &hi, &ilo, &ihi);
    return integer_range(c, from, ilo, ihi);
}

/* Numbers: -?(0|[1-9]d*)(.d+)?([eE][+-]?d{1,2})? with at most 16 digits in the integer part
 * and in the fraction. With bounds: integers exactly, and fractions I.F only where the whole
 * unit interval of I lies within the bounds; no exponent. */
static int32_t build_number(compiler *c, const json_t *schema, int32_t from) {
    bound lo, hi;
    if (!read_bound(c, schema, "minimum", "exclusiveMinimum", false, &lo) ||
        !read_bound(c, schema, "maximum", "exclusiveMaximum", true, &hi))
        return from;
    if (!lo.present && !hi.present) {
        int32_t sign = new_state(c);
        eps(c, from, sign);
        byte_range(c, from, sign, '-', '-');
        int32_t whole = new_state(c);
        byte_range(c, sign, whole, '0', '0');
        int32_t lead = new_state(c);
        byte_range(c, sign, lead, '1', '9');
        eps(c, some_digits(c, lead, JSON_MAX_DIGITS - 1), whole);
        eps(c, lead, whole);
        int32_t fraction = new_state(c);
        eps(c, whole, fraction);
        int32_t dot = new_state(c);
        byte_range(c, whole, dot, '.', '.');
        eps(c, some_digits(c, dot, JSON_MAX_DIGITS), fraction);
        int32_t end = new_state(c);
        eps(c, fraction, end);
        int32_t e = new_state(c), esign = new_state(c);
        byte_range(c, fraction, e, 'e', 'e');
        byte_range(c, fraction, e, 'E', 'E');
        eps(c, e, esign);
        byte_range(c, e, esign, '+', '+');
        byte_range(c, e, esign, '-', '-');
        eps(c, some_digits(c, esign, 2), end);
        return end;
    }
    int64_t ilo, ihi;
    integer_bounds(&lo, &hi, &ilo, &ihi);
    int32_t end = integer_range(c, from, ilo, ihi);
    /* I.F for I >= 0 lies in [I, I+1): needs I >= ilo and I + 1 <= hi */
    int64_t flo = ilo > 0 ? ilo : 0;
    int64_t fhi = hi.present ? clamp_int(floor(hi.value)) - 1 : NUM_LIMIT;
    if (fhi > NUM_LIMIT) fhi = NUM_LIMIT;
    if (flo <= fhi) {
        int32_t whole = new_state(c), dot = new_state(c);
        natural_range(c, from, whole, flo, fhi);
        byte_range(c, whole, dot, '.', '.');
        eps(c, some_digits(c, dot, JSON_MAX_DIGITS), end);
    }
    /* -I.F lies in (-(I+1), -I]: needs -I <= ihi and -(I+1) >= lo */
    int64_t nlo = -ihi > 0 ? -ihi : 0;
    int64_t nhi = lo.present ? clamp_int(floor(-lo.value)) - 1 : NUM_LIMIT;
    if (nhi > NUM_LIMIT) nhi = NUM_LIMIT;
    if (nlo <= nhi) {
        int32_t minus = new_state(c), whole = new_state(c), dot = new_state(c);
        byte_range(c, from, minus, '-', '-');
        natural_range(c, minus, whole, nlo, nhi);
        byte_range(c, whole, dot, '.', '.');
        eps(c, some_digits(c, dot, JSON_MAX_DIGITS), end);
    }
    return end;
}

/* ---- unconstrained values ---------------------------------------------------------------- */

static int32_t any_value_body(compiler *c, int32_t from, int32_t level);

/* An object whose member values are any value with `level` nesting left (each call one). */
static int32_t any_object(compiler *c, int32_t from, int32_t level) {
    int32_t open = lit(c, from, "{");
    int32_t end = new_state(c);
    byte_range(c, open, end, '}', '}');
    if (level <= 0) return end;
    int32_t key = new_state(c);
    eps(c, open, key);
    int32_t colon = optional_space(c, lit(c, any_string(c, key), ":"));
    int32_t after = call(c, colon, any_machine(c, level - 1));
    byte_range(c, after, end, '}', '}');
    eps(c, optional_space(c, lit(c, after, ",")), key);
    return end;
}

static int32_t any_array(compiler *c, int32_t from, int32_t level) {
    int32_t open = lit(c, from, "[");
    int32_t end = new_state(c);
    byte_range(c, open, end, ']', ']');
    if (level <= 0) return end;
    int32_t item = new_state(c);
    eps(c, open, item);
    int32_t after = call(c, item, any_machine(c, level - 1));
    byte_range(c, after, end, ']', ']');
    eps(c, optional_space(c, lit(c, after, ",")), item);
    return end;
}

static int32_t any_value_body(compiler *c, int32_t from, int32_t level) {
    int32_t end = new_state(c);
    eps(c, any_string(c, from), end);
    eps(c, build_number(c, NULL, from), end);
    eps(c, lit(c, from, "true"), end);
    eps(c, lit(c, from, "false"), end);
    eps(c, lit(c, from, "null"), end);
    eps(c, any_object(c, from, level), end);
    eps(c, any_array(c, from, level), end);
    return end;
}

/* ---- schema nodes ------------------------------------------------------------------------ */

enum {
    T_NULL = 1,
    T_BOOLEAN = 2,
    T_OBJECT = 4,
    T_ARRAY = 8,
    T_NUMBER = 16,
    T_INTEGER = 32,
    T_STRING = 64,
    T_ALL = 127
};

static int type_bit(const char *name) {
    static const char *names[] = {"null",   "boolean", "object", "array",
                                  "number", "integer", "string"};
    for (int i = 0; i < 7; i++)
        if (strcmp(name, names[i]) == 0) return 1 << i;
    return 0;
}

static int32_t compile_schema(compiler *c, const json_t *schema, int32_t from);

/* Compiles schema[key] (a sub-schema) with the pointer extended by key. */
static int32_t compile_child(compiler *c, const json_t *schema, const char *key, int32_t from) {
    size_t saved = pointer_push(c, key);
    int32_t end = compile_schema(c, schema, from);
    pointer_pop(c, saved);
    return end;
}

/* A declared object property name, JSON-encoded without its quotes, in a trie for the "any
 * other key" automaton. */
typedef struct key_trie_node {
    int32_t first_child, next_sibling; /* -1: none */
    uint8_t byte;                      /* on the edge from the parent */
    bool terminal;                     /* a declared name ends here */
    int8_t pending; /* bytes of a character or escape still due: no other key leaves here */
} key_trie_node;

typedef struct key_trie {
    key_trie_node *nodes; /* [n]; node 0 is the root */
    int32_t n, cap;
} key_trie;

static int32_t key_trie_node_new(key_trie *t, uint8_t byte) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 16;
        key_trie_node *nodes = realloc(t->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) return -1;
        t->nodes = nodes;
        t->cap = cap;
    }
    t->nodes[t->n] = (key_trie_node){.first_child = -1, .next_sibling = -1, .byte = byte};
    return t->n++;
}

static int32_t key_trie_child(const key_trie *t, int32_t at, uint8_t byte) {
    for (int32_t c = t->nodes[at].first_child; c >= 0; c = t->nodes[c].next_sibling)
        if (t->nodes[c].byte == byte) return c;
    return -1;
}

static bool key_trie_add(key_trie *t, const char *bytes, size_t len) {
    int32_t at = 0;
    int pending = 0; /* UTF-8 continuation bytes still due */
    int escape = 0;  /* bytes of an escape sequence still due */
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)bytes[i];
        if (escape > 0) {
            /* the letter after '\', or a hex digit of \uXXXX */
            escape = escape == 5 ? (b == 'u' ? 4 : 0) : escape - 1;
        } else if (b == '\\') {
            escape = 5; /* the letter comes next */
        }
        pending = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : pending > 0 ? pending - 1 : 0;
        int32_t next = key_trie_child(t, at, b);
        if (next < 0) {
            next = key_trie_node_new(t, b);
            if (next < 0) return false;
            t->nodes[next].next_sibling = t->nodes[at].first_child;
            t->nodes[at].first_child = next;
            t->nodes[next].pending = (int8_t)(pending > escape ? pending : escape);
        }
        at = next;
    }
    t->nodes[at].terminal = true;
    return true;
}

typedef struct diverge_ctx {
    compiler *c;
    int32_t from, to;
    const int32_t *children; /* [256] */
} diverge_ctx;

/* A character sequence whose first byte is not a trie child: leaves the trie. */
static void emit_diverging(void *user, int n, const uint8_t *first, const uint8_t *last) {
    diverge_ctx *x = user;
    for (unsigned b = first[0]; b <= last[0];) {
        if (x->children[b] >= 0) {
            b++;
            continue;
        }
        unsigned e = b;
        while (e + 1 <= last[0] && x->children[e + 1] < 0)
            e++;
        uint8_t f[4], l[4];
        memcpy(f, first, (size_t)n);
        memcpy(l, last, (size_t)n);
        f[0] = (uint8_t)b, l[0] = (uint8_t)e;
        seq_ctx s = {x->c, x->from, x->to};
        emit_sequence(&s, n, f, l);
        b = e + 1;
    }
}

/* A quoted key that is none of the declared names (and has no escapes), from `from`. */
static int32_t other_key(compiler *c, int32_t from, const key_trie *t) {
    int32_t open = lit(c, from, "\"");
    int32_t end = new_state(c);
    int32_t free_state = new_state(c); /* left the trie: any further characters */
    seq_ctx loop = {c, free_state, free_state};
    utf8_sequences(0x20, 0x21, emit_sequence, &loop);
    utf8_sequences(0x23, 0x5B, emit_sequence, &loop);
    utf8_sequences(0x5D, CP_MAX, emit_sequence, &loop);
    byte_range(c, free_state, end, '"', '"');
    int32_t *states = malloc((size_t)t->n * sizeof *states);
    if (!states) return fail(c, "out of memory compiling the schema"), end;
    states[0] = open;
    for (int32_t i = 1; i < t->n && !c->failed; i++)
        states[i] = new_state(c);
    int32_t children[256];
    for (int32_t i = 0; i < t->n && !c->failed; i++) {
        for (int b = 0; b < 256; b++)
            children[b] = -1;
        for (int32_t k = t->nodes[i].first_child; k >= 0; k = t->nodes[k].next_sibling) {
            children[t->nodes[k].byte] = k;
            byte_range(c, states[i], states[k], t->nodes[k].byte, t->nodes[k].byte);
        }
        if (t->nodes[i].pending != 0) continue; /* inside a character: must follow the name */
        if (!t->nodes[i].terminal) byte_range(c, states[i], end, '"', '"');
        diverge_ctx x = {c, states[i], free_state, children};
        utf8_sequences(0x20, 0x21, emit_diverging, &x);
        utf8_sequences(0x23, 0x5B, emit_diverging, &x);
        utf8_sequences(0x5D, CP_MAX, emit_diverging, &x);
    }
    free(states);
    return end;
}

static int32_t build_object(compiler *c, const json_t *schema, int32_t from) {
    const json_t *props = json_object_get(schema, "properties");
    const json_t *required = json_object_get(schema, "required");
    const json_t *additional = json_object_get(schema, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, "'properties' must be an object at %s/properties", c->pointer), from;
    if (required && !json_is_array(required))
        return fail(c, "'required' must be an array at %s/required", c->pointer), from;
    size_t n_required = required ? json_array_size(required) : 0;
    for (size_t i = 0; i < n_required; i++)
        if (!json_is_string(json_array_get(required, i)))
            return fail(c, "'required' must hold strings at %s/required/%zu", c->pointer, i), from;
    /* declared names: properties in order, then required names without a property schema */
    size_t n_props = props ? json_object_size(props) : 0;
    size_t n_names = n_props + n_required;
    const char **names = calloc(n_names ? n_names : 1, sizeof *names);
    const json_t **schemas = calloc(n_names ? n_names : 1, sizeof *schemas);
    bool *is_required = calloc(n_names ? n_names : 1, sizeof *is_required);
    key_trie trie = {0};
    int32_t end = from;
    if (!names || !schemas || !is_required || key_trie_node_new(&trie, 0) < 0) {
        fail(c, "out of memory compiling the schema");
        goto done;
    }
    size_t n = 0;
    const char *name;
    const json_t *value;
    json_object_foreach((json_t *)props, name, value) {
        names[n] = name;
        schemas[n++] = value;
    }
    for (size_t i = 0; i < n_required; i++) {
        const char *r = json_string_value(json_array_get(required, i));
        size_t k = 0;
        while (k < n && strcmp(names[k], r) != 0)
            k++;
        if (k == n) {
            /* required but not a property: its value is an additional property's */
            if (json_is_false(additional)) { /* no object can have it: no path */
                end = new_state(c);
                goto done;
            }
            names[n++] = r;
            if (additional && !json_is_true(additional)) schemas[k] = additional;
        }
        is_required[k] = true;
    }
    int32_t open = lit(c, from, "{");
    int32_t first = open;        /* nothing emitted yet */
    int32_t more = new_state(c); /* at least one member emitted */
    for (size_t i = 0; i < n && !c->failed; i++) {
        json_t *key = json_string(names[i]);
        char *encoded = key ? json_dumps(key, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(key);
        if (!encoded || !key_trie_add(&trie, encoded + 1, strlen(encoded) - 2)) {
            free(encoded);
            fail(c, "out of memory compiling the schema");
            break;
        }
        int32_t member = new_state(c);
        eps(c, first, member);
        eps(c, optional_space(c, lit(c, more, ",")), member);
        int32_t at = optional_space(c, lit(c, lit(c, member, encoded), ":"));
        free(encoded);
        if (schemas[i] && schemas[i] == additional) {
            at = compile_child(c, additional, "additionalProperties", at);
        } else if (schemas[i]) {
            size_t saved = pointer_push(c, "properties");
            at = compile_child(c, schemas[i], names[i], at);
            pointer_pop(c, saved);
        } else {
            at = call(c, at, any_machine(c, JSON_ANY_NESTING));
        }
        int32_t next_first = new_state(c), next_more = new_state(c);
        eps(c, at, next_more);
        if (!is_required[i]) {
            eps(c, first, next_first);
            eps(c, more, next_more);
        }
        first = next_first;
        more = next_more;
    }
    end = new_state(c);
    byte_range(c, first, end, '}', '}');
    byte_range(c, more, end, '}', '}');
    if (!json_is_false(additional) && !c->failed) {
        int32_t member = new_state(c), after = new_state(c);
        eps(c, first, member);
        eps(c, optional_space(c, lit(c, more, ",")), member);
        int32_t at = optional_space(c, lit(c, other_key(c, member, &trie), ":"));
        if (additional && !json_is_true(additional))
            at = compile_child(c, additional, "additionalProperties", at);
        else
            at = call(c, at, any_machine(c, JSON_ANY_NESTING));
        eps(c, at, after);
        eps(c, optional_space(c, lit(c, after, ",")), member);
        byte_range(c, after, end, '}', '}');
    }
done:
    free(names);
    free(schemas);
    free(is_required);
    free(trie.nodes);
    return c->failed ? from : end;
}

static int32_t build_array(compiler *c, const json_t *schema, int32_t from) {
    const json_t *prefix = json_object_get(schema, "prefixItems");
    const json_t *items = json_object_get(schema, "items");
    if (prefix && !json_is_array(prefix))
        return fail(c, "'prefixItems' must be an array at %s/prefixItems", c->pointer), from;
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return fail(c,
                    "'items' must be a schema (an array of schemas is not supported: use "
                    "prefixItems) at %s/items",
                    c->pointer),
               from;
    int32_t min_items = 0, max_items = -1;
    get_length(c, schema, "minItems", &min_items);
    get_length(c, schema, "maxItems", &max_items);
    if (c->failed) return from;
    int32_t n_prefix = prefix ? (int32_t)json_array_size(prefix) : 0;
    if (json_is_false(items) && (max_items < 0 || max_items > n_prefix)) max_items = n_prefix;
    if (max_items >= 0 && max_items < min_items) return new_state(c); /* no array: no path */
    if (max_items > 4096)
        return fail(c, "maxItems above the supported 4096 at %s/maxItems", c->pointer), from;
    /* elements past prefixItems are calls to the item schema's machine, so unrolling
     * minItems/maxItems copies no schema */
    int32_t item_machine = -1;
    if (items && !json_is_true(items) && !json_is_false(items)) {
        size_t saved = pointer_push(c, "items");
        item_machine = schema_machine(c, items);
        pointer_pop(c, saved);
    } else if (!json_is_false(items)) {
        item_machine = any_machine(c, JSON_ANY_NESTING);
    }
    if (min_items > 1000)
        return fail(c, "minItems above the supported 1000 at %s/minItems", c->pointer), from;
    int32_t open = lit(c, from, "[");
    int32_t end = new_state(c);
    /* explicit positions 0..t; past t a loop (unbounded) */
    int32_t t = max_items >= 0 ? max_items : (min_items > n_prefix ? min_items : n_prefix);
    int32_t at = open;
    for (int32_t j = 0; j < t && !c->failed; j++) {
        if (j >= min_items) byte_range(c, at, end, ']', ']');
        int32_t start = j == 0 ? at : optional_space(c, lit(c, at, ","));
        if (j < n_prefix) {
            size_t saved = pointer_push(c, "prefixItems");
            size_t saved2 = pointer_push_index(c, (size_t)j);
            at = compile_schema(c, json_array_get(prefix, (size_t)j), start);
            pointer_pop(c, saved2);
            pointer_pop(c, saved);
        } else if (item_machine >= 0) {
            at = call(c, start, item_machine);
        } else {
            at = new_state(c); /* no schema for this position: nothing further */
        }
    }
    byte_range(c, at, end, ']', ']');
    if (max_items < 0 && item_machine >= 0 && !c->failed) {
        if (t == 0) {
            int32_t after = call(c, at, item_machine);
            byte_range(c, after, end, ']', ']');
            eps(c, call(c, optional_space(c, lit(c, after, ",")), item_machine), after);
        } else {
            int32_t after = call(c, optional_space(c, lit(c, at, ",")), item_machine);
            eps(c, after, at);
        }
    }
    return end;
}

static bool is_ignored_keyword(const char *key) {
    static const char *ignored[] = {"description", "title",    "default", "$schema",
                                    "examples",    "$comment", "$id"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        if (strcmp(key, ignored[i]) == 0) return true;
    return false;
}

static bool is_supported_keyword(const char *key) {
    static const char *supported[] = {"type",
                                      "properties",
                                      "required",
                                      "additionalProperties",
                                      "enum",
                                      "const",
                                      "items",
                                      "prefixItems",
                                      "minItems",
                                      "maxItems",
                                      "anyOf",
                                      "oneOf",
                                      "allOf",
                                      "$ref",
                                      "$defs",
                                      "definitions",
                                      "format",
                                      "pattern",
                                      "minLength",
                                      "maxLength",
                                      "minimum",
                                      "maximum",
                                      "exclusiveMinimum",
                                      "exclusiveMaximum",
                                      "propertyNames"};
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
        if (strcmp(key, supported[i]) == 0) return true;
    return is_ignored_keyword(key);
}

/* Refuses a keyword beside `main` that would have to constrain the same value. */
static bool only_beside(compiler *c, const json_t *schema, const char *main_key,
                        const char *allowed) {
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)schema, key, value) {
        if (strcmp(key, main_key) == 0 || is_ignored_keyword(key) || strcmp(key, "$defs") == 0 ||
            strcmp(key, "definitions") == 0 || (allowed && strcmp(key, allowed) == 0))
            continue;
        fail(c, "keyword '%s' beside '%s' is not supported at %s", key, main_key, where(c));
        return false;
    }
    return true;
}

static const json_t *resolve_ref(compiler *c, const char *ref) {
    if (ref[0] != '#' || (ref[1] != 0 && ref[1] != '/')) return NULL;
    const json_t *at = c->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char segment[512];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof segment) {
            if (p[0] == '~' && p[1] == '1')
                segment[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0')
                segment[n++] = '~', p += 2;
            else
                segment[n++] = *p++;
        }
        segment[n] = 0;
        if (json_is_object(at)) {
            at = json_object_get(at, segment);
        } else if (json_is_array(at)) {
            char *end;
            unsigned long i = strtoul(segment, &end, 10);
            at = *end || n == 0 ? NULL : json_array_get(at, i);
        } else {
            at = NULL;
        }
    }
    return at;
}

static int32_t build_ref(compiler *c, const json_t *schema, int32_t from) {
    const json_t *ref = json_object_get(schema, "$ref");
    if (!only_beside(c, schema, "$ref", NULL)) return from;
    if (!json_is_string(ref))
        return fail(c, "'$ref' must be a string at %s/$ref", c->pointer), from;
    const char *text = json_string_value(ref);
    const json_t *target = resolve_ref(c, text);
    if (!target) {
        if (text[0] != '#')
            return fail(c, "only local '#/...' references are supported: '%s' at %s/$ref", text,
                        c->pointer),
                   from;
        return fail(c, "unresolvable $ref '%s' at %s/$ref", text, c->pointer), from;
    }
    if (!json_is_object(target) && !json_is_boolean(target))
        return fail(c, "$ref '%s' is not a schema at %s/$ref", text, c->pointer), from;
    /* the target's machine carries the target's own pointer */
    char saved[sizeof c->pointer];
    size_t saved_len = c->pointer_len;
    memcpy(saved, c->pointer, saved_len + 1);
    snprintf(c->pointer, sizeof c->pointer, "%s", text + 1);
    c->pointer_len = strlen(c->pointer);
    int32_t m = schema_machine(c, target);
    memcpy(c->pointer, saved, saved_len + 1);
    c->pointer_len = saved_len;
    return m < 0 ? from : call(c, from, m);
}

static int value_types(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL:
        return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE:
        return T_BOOLEAN;
    case JSON_OBJECT:
        return T_OBJECT;
    case JSON_ARRAY:
        return T_ARRAY;
    case JSON_STRING:
        return T_STRING;
    case JSON_INTEGER:
        return T_INTEGER | T_NUMBER;
    default: {
        double d = json_real_value(v);
        return d == floor(d) ? (T_INTEGER | T_NUMBER) : T_NUMBER;
    }
    }
}

static int schema_types(compiler *c, const json_t *schema) {
    const json_t *type = json_object_get(schema, "type");
    if (!type) return 0;
    int types = 0;
    size_t saved = pointer_push(c, "type");
    if (json_is_string(type)) {
        types = type_bit(json_string_value(type));
        if (!types) fail(c, "unknown type '%s' at %s", json_string_value(type), where(c));
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            const json_t *t = json_array_get(type, i);
            int bit = json_is_string(t) ? type_bit(json_string_value(t)) : 0;
            if (!bit) fail(c, "unknown type at %s/%zu", where(c), i);
            types |= bit;
        }
    } else {
        fail(c, "'type' must be a type name or a non-empty array of them at %s", where(c));
    }
    pointer_pop(c, saved);
    return types;
}

static int32_t build_literals(compiler *c, const json_t *schema, int32_t from) {
    int types = schema_types(c, schema);
    const json_t *values = json_object_get(schema, "enum");
    const json_t *constant = json_object_get(schema, "const");
    if (values && !json_is_array(values))
        return fail(c, "'enum' must be an array at %s/enum", c->pointer), from;
    int32_t end = new_state(c);
    size_t n = values ? json_array_size(values) : 1;
    for (size_t i = 0; i < n && !c->failed; i++) {
        const json_t *v = values ? json_array_get(values, i) : constant;
        if (types && !(value_types(v) & types)) continue;
        if (values && constant && !json_equal((json_t *)v, (json_t *)constant)) continue;
        char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!text) return fail(c, "out of memory compiling the schema"), from;
        eps(c, lit(c, from, text), end);
        free(text);
    }
    return end;
}

static bool has_any(const json_t *schema, const char *const *keys) {
    for (; *keys; keys++)
        if (json_object_get(schema, *keys)) return true;
    return false;
}

static int32_t build_typed(compiler *c, const json_t *schema, int32_t from) {
    static const char *const object_keys[] = {"properties", "required", "additionalProperties",
                                              NULL};
    static const char *const array_keys[] = {"items", "prefixItems", "minItems", "maxItems", NULL};
    static const char *const string_keys[] = {"minLength", "maxLength", "pattern", "format", NULL};
    static const char *const number_keys[] = {"minimum", "maximum", "exclusiveMinimum",
                                              "exclusiveMaximum", NULL};
    int types = schema_types(c, schema);
    if (c->failed) return from;
    if (!types) {
        if (has_any(schema, object_keys)) types |= T_OBJECT;
        if (has_any(schema, array_keys)) types |= T_ARRAY;
        if (has_any(schema, string_keys)) types |= T_STRING;
        if (has_any(schema, number_keys)) types |= T_NUMBER;
        if (!types) return call(c, from, any_machine(c, JSON_ANY_NESTING));
    }
    if (types & T_NUMBER) types &= ~T_INTEGER;
    int32_t end = new_state(c);
    if (types & T_NULL) eps(c, lit(c, from, "null"), end);
    if (types & T_BOOLEAN) {
        eps(c, lit(c, from, "true"), end);
        eps(c, lit(c, from, "false"), end);
    }
    if (types & T_STRING) eps(c, build_string(c, schema, from), end);
    if (types & T_INTEGER) eps(c, build_integer(c, schema, from), end);
    if (types & T_NUMBER) eps(c, build_number(c, schema, from), end);
    if (types & T_OBJECT) eps(c, build_object(c, schema, from), end);
    if (types & T_ARRAY) eps(c, build_array(c, schema, from), end);
    return end;
}

/* Whether a keyword other than annotations and definitions sits beside main_key. */
static bool constrains_beside(const json_t *schema, const char *main_key) {
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)schema, key, value) {
        if (strcmp(key, main_key) != 0 && !is_ignored_keyword(key) && strcmp(key, "$defs") != 0 &&
            strcmp(key, "definitions") != 0)
            return true;
    }
    return false;
}

/* allOf of object schemas merges when trivially possible: each part (and the keywords beside
 * allOf) has only type "object", properties (names not repeated across parts), required and
 * annotations. The merged schema allows other keys, as each part does. */
static const json_t *merge_all_of(compiler *c, const json_t *schema, const json_t *all_of) {
    json_t *props = json_object(), *required = json_array();
    json_t *merged =
        json_pack("{s:s, s:o, s:o}", "type", "object", "properties", props, "required", required);
    if (!merged || json_array_append_new(c->merged, merged) != 0)
        return fail(c, "out of memory compiling the schema"), NULL;
    size_t n = json_array_size(all_of);
    for (size_t i = 0; i <= n && !c->failed; i++) {
        const json_t *part = i < n ? json_array_get(all_of, i) : schema;
        const char *key;
        const json_t *value;
        json_object_foreach((json_t *)part, key, value) {
            bool object_type = strcmp(key, "type") == 0 && json_is_string(value) &&
                               strcmp(json_string_value(value), "object") == 0;
            if (is_ignored_keyword(key) || object_type || (i == n && strcmp(key, "allOf") == 0) ||
                strcmp(key, "$defs") == 0 || strcmp(key, "definitions") == 0)
                continue;
            if (strcmp(key, "properties") == 0 && json_is_object(value)) {
                const char *name;
                json_t *sub;
                json_object_foreach((json_t *)value, name, sub) {
                    if (json_object_get(props, name))
                        return fail(c, "'allOf' parts both declare property '%s' at %s/allOf", name,
                                    c->pointer),
                               NULL;
                    json_object_set(props, name, sub);
                }
            } else if (strcmp(key, "propertyNames") == 0) {
                /* checked when the merged schema compiles */
                const json_t *had = json_object_get(merged, key);
                if (had && !json_equal((json_t *)had, (json_t *)value))
                    return fail(c, "'allOf' parts with different propertyNames at %s/allOf",
                                c->pointer),
                           NULL;
                json_object_set(merged, key, (json_t *)value);
            } else if (strcmp(key, "required") == 0 && json_is_array(value)) {
                size_t k;
                json_t *r;
                json_array_foreach((json_t *)value, k, r) json_array_append(required, r);
            } else {
                return fail(c,
                            "'allOf' with more than one schema merges only object schemas "
                            "(type, properties, required): '%s' at %s/allOf",
                            key, c->pointer),
                       NULL;
            }
        }
        if (!json_is_object(part))
            return fail(c, "'allOf' parts must be objects at %s/allOf", c->pointer), NULL;
    }
    return c->failed ? NULL : merged;
}

static int32_t compile_schema(compiler *c, const json_t *schema, int32_t from) {
    if (c->failed) return from;
    if (json_is_true(schema)) return call(c, from, any_machine(c, JSON_ANY_NESTING));
    if (json_is_false(schema)) return new_state(c); /* no path */
    if (!json_is_object(schema))
        return fail(c, "a schema must be an object or a boolean at %s", where(c)), from;
    if (c->inline_depth >= JSON_MAX_INLINE)
        return fail(c, "schema nested deeper than %d levels at %s", JSON_MAX_INLINE, where(c)),
               from;
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)schema, key, value) {
        if (!is_supported_keyword(key))
            return fail(c, "unsupported keyword '%s' at %s", key, where(c)), from;
    }
    /* keys are strings anyway: only that trivial propertyNames is accepted (zod emits it) */
    const json_t *names = json_object_get(schema, "propertyNames");
    if (names && !json_is_true(names)) {
        const json_t *type = json_is_object(names) ? json_object_get(names, "type") : NULL;
        size_t n_constraints = 0;
        json_object_foreach((json_t *)names, key, value) {
            if (!is_ignored_keyword(key)) n_constraints++;
        }
        if (!json_is_object(names) || n_constraints > (type != NULL) ||
            (type && (!json_is_string(type) || strcmp(json_string_value(type), "string") != 0)))
            return fail(c, "unsupported keyword 'propertyNames' at %s (only {\"type\":\"string\"})",
                        where(c)),
                   from;
    }
    c->inline_depth++;
    int32_t end = from;
    const json_t *any_of = json_object_get(schema, "anyOf");
    const char *any_key = "anyOf";
    if (!any_of) any_of = json_object_get(schema, "oneOf"), any_key = "oneOf";
    const json_t *all_of = json_object_get(schema, "allOf");
    if (json_object_get(schema, "$ref")) {
        end = build_ref(c, schema, from);
    } else if (json_object_get(schema, "anyOf") && json_object_get(schema, "oneOf")) {
        fail(c, "'anyOf' together with 'oneOf' is not supported at %s", where(c));
    } else if (any_of) {
        /* oneOf is compiled as anyOf: a value matching two branches is not excluded */
        if (only_beside(c, schema, any_key, NULL)) {
            if (!json_is_array(any_of) || json_array_size(any_of) == 0) {
                fail(c, "'%s' must be a non-empty array at %s/%s", any_key, c->pointer, any_key);
            } else {
                end = new_state(c);
                size_t saved = pointer_push(c, any_key);
                for (size_t i = 0; i < json_array_size(any_of) && !c->failed; i++) {
                    size_t saved2 = pointer_push_index(c, i);
                    int32_t branch = new_state(c);
                    eps(c, from, branch);
                    eps(c, compile_schema(c, json_array_get(any_of, i), branch), end);
                    pointer_pop(c, saved2);
                }
                pointer_pop(c, saved);
            }
        }
    } else if (all_of) {
        if (!json_is_array(all_of) || json_array_size(all_of) == 0) {
            fail(c, "'allOf' must be a non-empty array at %s/allOf", c->pointer);
        } else if (json_array_size(all_of) > 1 || constrains_beside(schema, "allOf")) {
            const json_t *merged = merge_all_of(c, schema, all_of);
            if (merged) end = compile_schema(c, merged, from);
        } else {
            size_t saved = pointer_push(c, "allOf");
            size_t saved2 = pointer_push_index(c, 0);
            end = compile_schema(c, json_array_get(all_of, 0), from);
            pointer_pop(c, saved2);
            pointer_pop(c, saved);
        }
    } else if (json_object_get(schema, "enum") || json_object_get(schema, "const")) {
        end = build_literals(c, schema, from);
    } else {
        end = build_typed(c, schema, from);
    }
    c->inline_depth--;
    return end;
}

/* ---- whole-graph passes ------------------------------------------------------------------ */

/* A machine that can call itself (directly or through others) before consuming a byte would
 * recurse without progress: {"$ref": "#"} at the root, a left-recursive anyOf. */
static bool check_progress(compiler *c, const gptoss_json_schema *s) {
    int32_t nm = s->n_machines;
    int32_t *stamp = calloc((size_t)s->n_states, sizeof *stamp);
    int32_t *work = malloc((size_t)s->n_states * sizeof *work);
    int32_t *first = NULL; /* pairs (caller, callee) */
    size_t n_pairs = 0, cap_pairs = 0;
    int32_t *adj_start = calloc((size_t)nm + 1, sizeof *adj_start);
    int32_t *adj = NULL, *color = calloc((size_t)nm, sizeof *color);
    int32_t *path = malloc(((size_t)nm + 1) * 2 * sizeof *path);
    bool ok = stamp && work && adj_start && color && path;
    for (int32_t m = 0; m < nm && ok; m++) {
        int32_t n = 0;
        work[n++] = s->machines[m].start;
        stamp[s->machines[m].start] = m + 1;
        while (n > 0 && ok) {
            int32_t u = work[--n];
            for (int32_t e = s->edge_start[u]; e < s->edge_start[u + 1]; e++) {
                const nfa_edge *edge = &s->edges[e];
                if (edge->kind == EDGE_CALL) {
                    if (n_pairs + 2 > cap_pairs) {
                        cap_pairs = cap_pairs ? cap_pairs * 2 : 64;
                        int32_t *p = realloc(first, cap_pairs * sizeof *p);
                        if (!p) {
                            ok = false;
                            break;
                        }
                        first = p;
                    }
                    first[n_pairs++] = m;
                    first[n_pairs++] = edge->callee;
                    adj_start[m + 1]++;
                }
                if (edge->kind == EDGE_EPS && stamp[edge->to] != m + 1) {
                    stamp[edge->to] = m + 1;
                    work[n++] = edge->to;
                }
            }
        }
    }
    if (ok) {
        for (int32_t m = 0; m < nm; m++)
            adj_start[m + 1] += adj_start[m];
        adj = malloc((n_pairs / 2 + 1) * sizeof *adj);
        ok = adj != NULL;
        /* pairs were appended in caller order, so they are already grouped */
        for (size_t i = 0; ok && i < n_pairs; i += 2)
            adj[i / 2] = first[i + 1];
    }
    /* iterative DFS; a grey machine reached again closes a cycle */
    for (int32_t root = 0; ok && root < nm && !c->failed; root++) {
        if (color[root]) continue;
        int32_t depth = 0;
        path[0] = root, path[1] = adj_start[root];
        color[root] = 1;
        while (depth >= 0 && !c->failed) {
            int32_t m = path[2 * depth];
            int32_t *next = &path[2 * depth + 1];
            if (*next == adj_start[m + 1]) {
                color[m] = 2;
                depth--;
                continue;
            }
            int32_t callee = adj[(*next)++];
            if (color[callee] == 1) {
                const char *p = s->machines[callee].pointer;
                fail(c, "$ref cycle that consumes no input at %s", p[0] ? p : "/");
            } else if (color[callee] == 0) {
                color[callee] = 1;
                depth++;
                path[2 * depth] = callee, path[2 * depth + 1] = adj_start[callee];
            }
        }
    }
    if (!ok) fail(c, "out of memory compiling the schema");
    free(stamp);
    free(work);
    free(first);
    free(adj_start);
    free(adj);
    free(color);
    free(path);
    return !c->failed;
}

/* dist[depth][state]: fewest bytes from state to its machine's exit, with `depth` frames on
 * the stack (calls need depth + 1 <= JSON_MAX_STACK). */
static bool compute_distances(gptoss_json_schema *s) {
    int32_t n = s->n_states;
    size_t levels = JSON_MAX_STACK + 1;
    s->dist = malloc(levels * (size_t)n * sizeof *s->dist);
    int32_t *rev_start = calloc((size_t)n + 1, sizeof *rev_start);
    int32_t n_edges = s->edge_start[n];
    int32_t *rev = malloc((size_t)(n_edges ? n_edges : 1) * sizeof *rev);
    uint64_t *heap = malloc(((size_t)n_edges + (size_t)n + 1) * sizeof *heap);
    bool ok = s->dist && rev_start && rev && heap;
    if (ok) {
        for (int32_t e = 0; e < n_edges; e++)
            rev_start[s->edges[e].to + 1]++;
        for (int32_t i = 0; i < n; i++)
            rev_start[i + 1] += rev_start[i];
        int32_t *fill = malloc((size_t)n * sizeof *fill);
        if (!fill) ok = false;
        for (int32_t i = 0; ok && i < n; i++)
            fill[i] = rev_start[i];
        for (int32_t e = 0; ok && e < n_edges; e++)
            rev[fill[s->edges[e].to]++] = e;
        free(fill);
    }
    for (int32_t depth = JSON_MAX_STACK; ok && depth >= 0; depth--) {
        uint32_t *d = s->dist + (size_t)depth * (size_t)n;
        const uint32_t *deeper = depth < JSON_MAX_STACK ? d + n : NULL;
        for (int32_t i = 0; i < n; i++)
            d[i] = DIST_INF;
        size_t heap_n = 0;
        for (int32_t m = 0; m < s->n_machines; m++) {
            d[s->machines[m].exit] = 0;
            heap[heap_n++] = (uint64_t)(uint32_t)s->machines[m].exit; /* distance 0 */
        }
        while (heap_n > 0) {
            uint64_t top = heap[0];
            heap[0] = heap[--heap_n];
            for (size_t i = 0;;) { /* sift down */
                size_t l = 2 * i + 1, r = l + 1, m = i;
                if (l < heap_n && heap[l] < heap[m]) m = l;
                if (r < heap_n && heap[r] < heap[m]) m = r;
                if (m == i) break;
                uint64_t t = heap[i];
                heap[i] = heap[m], heap[m] = t, i = m;
            }
            uint32_t du = (uint32_t)(top >> 32);
            int32_t u = (int32_t)(uint32_t)top;
            if (du > d[u]) continue;
            for (int32_t k = rev_start[u]; k < rev_start[u + 1]; k++) {
                const nfa_edge *e = &s->edges[rev[k]];
                uint32_t w = e->kind == EDGE_BYTE  ? 1
                             : e->kind == EDGE_EPS ? 0
                             : deeper              ? deeper[s->machines[e->callee].start]
                                                   : DIST_INF;
                uint32_t nd = dist_add(du, w);
                if (nd < d[e->from]) {
                    d[e->from] = nd;
                    size_t i = heap_n++;
                    heap[i] = ((uint64_t)nd << 32) | (uint32_t)e->from;
                    while (i > 0 && heap[(i - 1) / 2] > heap[i]) { /* sift up */
                        uint64_t t = heap[i];
                        heap[i] = heap[(i - 1) / 2], heap[(i - 1) / 2] = t, i = (i - 1) / 2;
                    }
                }
            }
        }
        /* a level equal to the one below the stack top repeats at every shallower depth
         * (each is computed from the next only): copy it instead of searching again */
        if (deeper && memcmp(d, deeper, (size_t)n * sizeof *d) == 0) {
            for (int32_t up = depth - 1; up >= 0; up--)
                memcpy(s->dist + (size_t)up * (size_t)n, d, (size_t)n * sizeof *d);
            break;
        }
    }
    free(rev_start);
    free(rev);
    free(heap);
    return ok;
}

void json_machines_free(machine *machines, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        free(machines[i].pointer);
    free(machines);
}

/* Moves the compiler's graph into s, edges grouped by source. */
static bool take_graph(compiler *c, gptoss_json_schema *s) {
    s->n_states = c->n_states;
    s->machines = c->machines, s->n_machines = c->n_machines;
    c->machines = NULL, c->n_machines = 0;
    s->edge_start = calloc((size_t)s->n_states + 1, sizeof *s->edge_start);
    s->edges = malloc((size_t)(c->n_edges ? c->n_edges : 1) * sizeof *s->edges);
    s->exit_of = malloc((size_t)s->n_states * sizeof *s->exit_of);
    if (!s->edge_start || !s->edges || !s->exit_of) return false;
    for (int32_t e = 0; e < c->n_edges; e++)
        s->edge_start[c->edges[e].from + 1]++;
    for (int32_t i = 0; i < s->n_states; i++)
        s->edge_start[i + 1] += s->edge_start[i];
    int32_t *fill = malloc((size_t)s->n_states * sizeof *fill);
    if (!fill) return false;
    memcpy(fill, s->edge_start, (size_t)s->n_states * sizeof *fill);
    for (int32_t e = 0; e < c->n_edges; e++)
        s->edges[fill[c->edges[e].from]++] = c->edges[e];
    free(fill);
    for (int32_t i = 0; i < s->n_states; i++)
        s->exit_of[i] = -1;
    for (int32_t m = 0; m < s->n_machines; m++)
        s->exit_of[s->machines[m].exit] = m;
    return true;
}

/* ---- the whole compilation ------------------------------------------------------------- */

gptoss_status json_schema_build(const json_t *schema, gptoss_json_schema *s, gptoss_error *error) {
    compiler c = {.root = schema, .error = error, .merged = json_array()};
    if (!c.merged) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i <= JSON_ANY_NESTING; i++)
        c.any_machine[i] = -1;
    c.string_machine = -1;
    c.char_machine = -1;
    /* machine 0 is the root: the schema, or (json_object mode) any object */
    new_machine(&c, schema, -1);
    while (!c.failed && c.next_to_compile < c.n_machines) {
        machine m = c.machines[c.next_to_compile++];
        snprintf(c.pointer, sizeof c.pointer, "%s", m.pointer);
        c.pointer_len = strlen(c.pointer);
        int32_t end;
        if (m.schema)
            end = compile_schema(&c, m.schema, m.start);
        else if (m.any_level == STRING_MACHINE)
            end = any_string_body(&c, m.start);
        else if (m.any_level == CHAR_MACHINE)
            any_string_char(&c, m.start, end = new_state(&c));
        else if (m.any_level >= 0)
            end = any_value_body(&c, m.start, m.any_level);
        else
            end = any_object(&c, m.start, JSON_ANY_NESTING);
        eps(&c, end, m.exit);
    }
    bool ok = !c.failed;
    if (ok && !take_graph(&c, s)) ok = fail(&c, "out of memory compiling the schema");
    free(c.edges);
    json_machines_free(c.machines, c.n_machines);
    json_decref(c.merged);
    if (ok) ok = check_progress(&c, s);
    if (ok && !compute_distances(s)) ok = fail(&c, "out of memory compiling the schema");
    if (ok && dist_at(s, s->machines[0].start, 0) >= DIST_INF)
        ok = fail(&c,
                  "schema accepts no value (or only values nested deeper than %d "
                  "references and arrays) at /",
                  JSON_MAX_STACK);
    if (ok) return GPTOSS_OK;
    gptoss_status status = error->status ? error->status : GPTOSS_ERR_INVALID_ARGUMENT;
    if (strstr(error->message, "out of memory")) status = GPTOSS_ERR_OUT_OF_MEMORY;
    error->status = status;
    return status;
}
