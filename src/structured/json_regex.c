/*
 * json_regex.c - code point sets, the regex subset, length products and UTF-8 sequences (see
 * json_regex.h).
 *
 * The subset: literals; classes [..] with ranges, negation and escapes; . \d \D \w \W \s \S;
 * groups (..), (?:..), (?<name>..); alternation |; quantifiers ? * + {m} {m,} {m,n} (a lazy
 * '?' suffix is accepted: it matches the same strings); ^ only at the start and $ only at the
 * end. Lookaround, backreferences, word boundaries and \p{..} are refused. Semantics are those
 * of an ECMAScript regex with the u flag (as JSON Schema validators use them): '.' is any code
 * point but \n \r U+2028 U+2029.
 */
#include "structured/json_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- char NFA construction -------------------------------------------------------------- */

void char_nfa_init(char_nfa *nfa, int32_t max_states) {
    memset(nfa, 0, sizeof *nfa);
    nfa->max_states = max_states;
}

void char_nfa_free(char_nfa *nfa) {
    for (int32_t i = 0; i < nfa->n_sets; i++)
        free(nfa->sets[i].ranges);
    free(nfa->sets);
    free(nfa->edges);
    memset(nfa, 0, sizeof *nfa);
}

static int32_t cn_state(char_nfa *nfa) {
    if (nfa->n_states >= nfa->max_states) {
        nfa->failed = true;
        return 0;
    }
    return nfa->n_states++;
}

static void cn_edge(char_nfa *nfa, int32_t from, int32_t to, int32_t set) {
    if (nfa->failed) return;
    if (nfa->n_edges == nfa->cap_edges) {
        int32_t cap = nfa->cap_edges ? nfa->cap_edges * 2 : 64;
        char_edge *e = realloc(nfa->edges, (size_t)cap * sizeof *e);
        if (!e) {
            nfa->failed = true;
            return;
        }
        nfa->edges = e;
        nfa->cap_edges = cap;
    }
    nfa->edges[nfa->n_edges++] = (char_edge){from, to, set};
}

/* Takes ownership of ranges (sorted, disjoint). Returns the set index or -1. */
static int32_t cn_set(char_nfa *nfa, cp_range *ranges, int32_t n) {
    if (nfa->n_sets == nfa->cap_sets) {
        int32_t cap = nfa->cap_sets ? nfa->cap_sets * 2 : 16;
        cp_set *s = realloc(nfa->sets, (size_t)cap * sizeof *s);
        if (!s) {
            free(ranges);
            nfa->failed = true;
            return -1;
        }
        nfa->sets = s;
        nfa->cap_sets = cap;
    }
    nfa->sets[nfa->n_sets] = (cp_set){ranges, n};
    return nfa->n_sets++;
}

/* ---- code point sets (growable, normalized on demand) ----------------------------------- */

typedef struct range_buf {
    cp_range *r;
    int32_t n, cap;
    bool failed;
} range_buf;

static void rb_add(range_buf *b, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    if (b->n == b->cap) {
        int32_t cap = b->cap ? b->cap * 2 : 8;
        cp_range *r = realloc(b->r, (size_t)cap * sizeof *r);
        if (!r) {
            b->failed = true;
            return;
        }
        b->r = r;
        b->cap = cap;
    }
    b->r[b->n++] = (cp_range){lo, hi};
}

static int range_cmp(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping or adjacent ranges. */
static void rb_normalize(range_buf *b) {
    if (b->n == 0) return;
    qsort(b->r, (size_t)b->n, sizeof *b->r, range_cmp);
    int32_t out = 0;
    for (int32_t i = 1; i < b->n; i++) {
        if (b->r[i].lo <= b->r[out].hi + 1) {
            if (b->r[i].hi > b->r[out].hi) b->r[out].hi = b->r[i].hi;
        } else {
            b->r[++out] = b->r[i];
        }
    }
    b->n = out + 1;
}

static void rb_negate(range_buf *b) {
    rb_normalize(b);
    range_buf n = {0};
    uint32_t next = 0;
    for (int32_t i = 0; i < b->n; i++) {
        if (b->r[i].lo > next) rb_add(&n, next, b->r[i].lo - 1);
        next = b->r[i].hi + 1;
    }
    if (next <= CP_MAX) rb_add(&n, next, CP_MAX);
    free(b->r);
    n.failed |= b->failed;
    *b = n;
}

bool cp_set_is_all(const cp_set *set) {
    return set->n == 1 && set->ranges[0].lo == 0 && set->ranges[0].hi == CP_MAX;
}

static void add_digit(range_buf *b) {
    rb_add(b, '0', '9');
}
static void add_word(range_buf *b) {
    rb_add(b, '0', '9');
    rb_add(b, 'A', 'Z');
    rb_add(b, '_', '_');
    rb_add(b, 'a', 'z');
}
static void add_space(range_buf *b) {
    static const uint32_t singles[] = {0x20,   0xA0,   0x1680, 0x2028, 0x2029,
                                       0x202F, 0x205F, 0x3000, 0xFEFF};
    rb_add(b, 0x09, 0x0D);
    rb_add(b, 0x2000, 0x200A);
    for (size_t i = 0; i < sizeof singles / sizeof singles[0]; i++)
        rb_add(b, singles[i], singles[i]);
}
static void add_negated(range_buf *b, void (*add)(range_buf *)) {
    range_buf t = {0};
    add(&t);
    rb_negate(&t);
    for (int32_t i = 0; i < t.n; i++)
        rb_add(b, t.r[i].lo, t.r[i].hi);
    b->failed |= t.failed;
    free(t.r);
}
static void add_dot(range_buf *b) {
    rb_add(b, 0, 0x09);
    rb_add(b, 0x0B, 0x0C);
    rb_add(b, 0x0E, 0x2027);
    rb_add(b, 0x202A, CP_MAX);
}

/* ---- the regex parser ------------------------------------------------------------------- */

/* AST nodes in a pool; CAT and ALT are binary. */
enum { RX_SET, RX_CAT, RX_ALT, RX_REP, RX_EMPTY };
typedef struct rx_node {
    int kind;
    int32_t set;      /* RX_SET: index into the NFA's sets */
    int32_t a, b;     /* children */
    int32_t min, max; /* RX_REP; max < 0: unbounded */
} rx_node;

typedef struct rx_parser {
    const char *p, *end;
    char_nfa *nfa;
    rx_node *nodes;
    int32_t n_nodes, cap_nodes;
    char *message;
    size_t message_len;
    bool failed;
    int depth;
} rx_parser;

#define RX_MAX_REPEAT 1000
#define RX_MAX_DEPTH 64

static bool rx_fail(rx_parser *ps, const char *fmt, const char *what) {
    if (!ps->failed) snprintf(ps->message, ps->message_len, fmt, what);
    ps->failed = true;
    return false;
}

static int32_t rx_node_new(rx_parser *ps, rx_node node) {
    if (ps->failed) return -1;
    if (ps->n_nodes == ps->cap_nodes) {
        int32_t cap = ps->cap_nodes ? ps->cap_nodes * 2 : 64;
        rx_node *n = realloc(ps->nodes, (size_t)cap * sizeof *n);
        if (!n) {
            rx_fail(ps, "%s", "out of memory");
            return -1;
        }
        ps->nodes = n;
        ps->cap_nodes = cap;
    }
    ps->nodes[ps->n_nodes] = node;
    return ps->n_nodes++;
}

static int32_t rx_set_node(rx_parser *ps, range_buf *b) {
    if (b->failed) {
        free(b->r);
        rx_fail(ps, "%s", "out of memory");
        return -1;
    }
    rb_normalize(b);
    int32_t set = cn_set(ps->nfa, b->r, b->n);
    if (set < 0) return rx_fail(ps, "%s", "out of memory"), -1;
    return rx_node_new(ps, (rx_node){.kind = RX_SET, .set = set});
}

/* Decodes one UTF-8 code point of the pattern (the pattern is a JSON string, so valid). */
static uint32_t rx_next_cp(rx_parser *ps) {
    const unsigned char *s = (const unsigned char *)ps->p;
    uint32_t c = s[0];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (ps->p + n > ps->end) n = 1;
    if (n == 2) c = ((c & 0x1F) << 6) | (s[1] & 0x3F);
    if (n == 3) c = ((c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    if (n == 4)
        c = ((c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
            (s[3] & 0x3F);
    ps->p += n;
    return c;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool rx_hex(rx_parser *ps, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (ps->p >= ps->end || hex_value(*ps->p) < 0)
            return rx_fail(ps, "%s", "bad hexadecimal escape in pattern");
        v = v * 16 + (uint32_t)hex_value(*ps->p++);
    }
    *out = v;
    return true;
}

/* After a backslash: adds a class escape to b, or sets *cp to a single character. Returns 1 for
 * a class, 0 for a character, -1 on error. in_class: inside [...] (\b is backspace there). */
static int rx_escape(rx_parser *ps, range_buf *b, uint32_t *cp, bool in_class) {
    if (ps->p >= ps->end) return rx_fail(ps, "%s", "pattern ends with a backslash"), -1;
    char c = *ps->p++;
    switch (c) {
    case 'd':
        add_digit(b);
        return 1;
    case 'D':
        add_negated(b, add_digit);
        return 1;
    case 'w':
        add_word(b);
        return 1;
    case 'W':
        add_negated(b, add_word);
        return 1;
    case 's':
        add_space(b);
        return 1;
    case 'S':
        add_negated(b, add_space);
        return 1;
    case 't':
        *cp = '\t';
        return 0;
    case 'n':
        *cp = '\n';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 'f':
        *cp = '\f';
        return 0;
    case 'v':
        *cp = '\v';
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case 'x':
        return rx_hex(ps, 2, cp) ? 0 : -1;
    case 'u':
        if (ps->p < ps->end && *ps->p == '{') {
            ps->p++;
            uint32_t v = 0;
            int n = 0;
            while (ps->p < ps->end && hex_value(*ps->p) >= 0 && n < 6)
                v = v * 16 + (uint32_t)hex_value(*ps->p++), n++;
            if (ps->p >= ps->end || *ps->p != '}' || n == 0 || v > CP_MAX)
                return rx_fail(ps, "%s", "bad \\u{...} escape in pattern"), -1;
            ps->p++;
            *cp = v;
            return 0;
        }
        return rx_hex(ps, 4, cp) ? 0 : -1;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return rx_fail(ps, "%s", "word boundaries (\\b) are not supported in pattern"), -1;
    case 'B':
        return rx_fail(ps, "%s", "word boundaries (\\B) are not supported in pattern"), -1;
    case 'k':
        return rx_fail(ps, "%s", "backreferences (\\k) are not supported in pattern"), -1;
    case 'p':
    case 'P':
        return rx_fail(ps, "%s", "Unicode property escapes (\\p) are not supported in pattern"), -1;
    case 'c':
        return rx_fail(ps, "%s", "control escapes (\\c) are not supported in pattern"), -1;
    default:
        if (c >= '1' && c <= '9')
            return rx_fail(ps, "%s", "backreferences (\\1..\\9) are not supported in pattern"), -1;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(ps, "unknown escape '\\%s' in pattern", (char[]){c, 0}), -1;
        ps->p--;
        *cp = rx_next_cp(ps);
        return 0;
    }
}

static int32_t rx_class(rx_parser *ps) {
    range_buf b = {0};
    bool negate = false;
    if (ps->p < ps->end && *ps->p == '^') negate = true, ps->p++;
    while (ps->p < ps->end && *ps->p != ']' && !ps->failed) {
        uint32_t lo;
        if (*ps->p == '\\') {
            ps->p++;
            int kind = rx_escape(ps, &b, &lo, true);
            if (kind < 0) break;
            if (kind == 1) continue;
        } else {
            lo = rx_next_cp(ps);
        }
        uint32_t hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                int kind = rx_escape(ps, &b, &hi, true);
                if (kind < 0) break;
                if (kind == 1) {
                    rx_fail(ps, "%s", "a class escape cannot end a range in pattern");
                    break;
                }
            } else {
                hi = rx_next_cp(ps);
            }
            if (hi < lo) {
                rx_fail(ps, "%s", "a range out of order in a class of pattern");
                break;
            }
        }
        rb_add(&b, lo, hi);
    }
    if (ps->failed) {
        free(b.r);
        return -1;
    }
    if (ps->p >= ps->end) {
        free(b.r);
        return rx_fail(ps, "%s", "unterminated class '[' in pattern"), -1;
    }
    ps->p++; /* ']' */
    if (negate) rb_negate(&b);
    return rx_set_node(ps, &b);
}

static int32_t rx_alt(rx_parser *ps);

static int32_t rx_atom(rx_parser *ps) {
    char c = *ps->p;
    range_buf b = {0};
    switch (c) {
    case '(': {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?') {
            const char *q = ps->p + 1;
            if (q < ps->end && *q == ':') {
                ps->p += 2;
            } else if (q + 1 < ps->end && *q == '<' && q[1] != '=' && q[1] != '!') {
                const char *close = memchr(q, '>', (size_t)(ps->end - q));
                if (!close) return rx_fail(ps, "%s", "bad named group in pattern"), -1;
                ps->p = close + 1;
            } else {
                return rx_fail(ps, "%s",
                               "lookaround and (?...) groups are not supported in pattern"),
                       -1;
            }
        }
        if (++ps->depth > RX_MAX_DEPTH)
            return rx_fail(ps, "%s", "groups nested too deeply in pattern"), -1;
        int32_t inner = rx_alt(ps);
        ps->depth--;
        if (ps->failed) return -1;
        if (ps->p >= ps->end || *ps->p != ')')
            return rx_fail(ps, "%s", "unbalanced '(' in pattern"), -1;
        ps->p++;
        return inner;
    }
    case '[':
        ps->p++;
        return rx_class(ps);
    case '.':
        ps->p++;
        add_dot(&b);
        return rx_set_node(ps, &b);
    case '^':
    case '$':
        return rx_fail(ps, "%s", "anchors ^ and $ are supported only at the ends of pattern"), -1;
    case ')':
        return rx_fail(ps, "%s", "unbalanced ')' in pattern"), -1;
    case '*':
    case '+':
    case '?':
    case '{':
        return rx_fail(ps, "%s", "a quantifier without an operand in pattern"), -1;
    case '\\': {
        ps->p++;
        uint32_t cp = 0;
        int kind = rx_escape(ps, &b, &cp, false);
        if (kind < 0) {
            free(b.r);
            return -1;
        }
        if (kind == 0) rb_add(&b, cp, cp);
        return rx_set_node(ps, &b);
    }
    default: {
        uint32_t cp = rx_next_cp(ps);
        rb_add(&b, cp, cp);
        return rx_set_node(ps, &b);
    }
    }
}

static bool rx_number(rx_parser *ps, int32_t *out) {
    int64_t v = 0;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return false;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > RX_MAX_REPEAT) v = RX_MAX_REPEAT + 1;
    }
    *out = (int32_t)v;
    return true;
}

static int32_t rx_repeat(rx_parser *ps) {
    int32_t node = rx_atom(ps);
    while (!ps->failed && ps->p < ps->end) {
        int32_t min, max;
        char c = *ps->p;
        if (c == '*')
            min = 0, max = -1, ps->p++;
        else if (c == '+')
            min = 1, max = -1, ps->p++;
        else if (c == '?')
            min = 0, max = 1, ps->p++;
        else if (c == '{') {
            const char *save = ps->p;
            ps->p++;
            if (!rx_number(ps, &min)) {
                ps->p = save;
                return rx_fail(ps, "%s", "a '{' that is not a quantifier in pattern (escape it)"),
                       -1;
            }
            max = min;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                if (!rx_number(ps, &max)) max = -1;
            }
            if (ps->p >= ps->end || *ps->p != '}')
                return rx_fail(ps, "%s", "bad {m,n} quantifier in pattern"), -1;
            ps->p++;
            if (min > RX_MAX_REPEAT || max > RX_MAX_REPEAT)
                return rx_fail(ps, "%s", "a {m,n} count above 1000 in pattern"), -1;
            if (max >= 0 && max < min)
                return rx_fail(ps, "%s", "a {m,n} quantifier with n < m in pattern"), -1;
        } else {
            break;
        }
        if (ps->p < ps->end && *ps->p == '?') ps->p++; /* lazy: same language */
        node = rx_node_new(ps, (rx_node){.kind = RX_REP, .a = node, .min = min, .max = max});
    }
    return node;
}

static int32_t rx_cat(rx_parser *ps) {
    int32_t node = -1;
    while (!ps->failed && ps->p < ps->end && *ps->p != '|' && *ps->p != ')') {
        int32_t next = rx_repeat(ps);
        node = node < 0 ? next : rx_node_new(ps, (rx_node){.kind = RX_CAT, .a = node, .b = next});
    }
    if (node < 0) node = rx_node_new(ps, (rx_node){.kind = RX_EMPTY});
    return node;
}

static int32_t rx_alt(rx_parser *ps) {
    int32_t node = rx_cat(ps);
    while (!ps->failed && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        int32_t next = rx_cat(ps);
        node = rx_node_new(ps, (rx_node){.kind = RX_ALT, .a = node, .b = next});
    }
    return node;
}

/* Thompson construction from `from`; returns the end state. */
static int32_t rx_build(rx_parser *ps, int32_t node, int32_t from) {
    char_nfa *nfa = ps->nfa;
    if (nfa->failed) return from;
    rx_node n = ps->nodes[node];
    switch (n.kind) {
    case RX_EMPTY:
        return from;
    case RX_SET: {
        int32_t to = cn_state(nfa);
        cn_edge(nfa, from, to, n.set);
        return to;
    }
    case RX_CAT:
        return rx_build(ps, n.b, rx_build(ps, n.a, from));
    case RX_ALT: {
        int32_t to = cn_state(nfa);
        int32_t a = cn_state(nfa), b = cn_state(nfa);
        cn_edge(nfa, from, a, -1);
        cn_edge(nfa, from, b, -1);
        cn_edge(nfa, rx_build(ps, n.a, a), to, -1);
        cn_edge(nfa, rx_build(ps, n.b, b), to, -1);
        return to;
    }
    default: { /* RX_REP */
        int32_t at = from;
        for (int32_t i = 0; i < n.min && !nfa->failed; i++)
            at = rx_build(ps, n.a, at);
        if (n.max < 0) {
            /* a loop through a fresh state, so an empty body cannot join unrelated paths */
            int32_t loop = cn_state(nfa);
            cn_edge(nfa, at, loop, -1);
            int32_t body_end = rx_build(ps, n.a, loop);
            cn_edge(nfa, body_end, loop, -1);
            return loop;
        }
        int32_t end = cn_state(nfa);
        for (int32_t i = n.min; i < n.max && !nfa->failed; i++) {
            cn_edge(nfa, at, end, -1);
            at = rx_build(ps, n.a, at);
        }
        cn_edge(nfa, at, end, -1);
        return end;
    }
    }
}

static int32_t any_char_set(char_nfa *nfa) {
    cp_range *r = malloc(sizeof *r);
    if (!r) {
        nfa->failed = true;
        return -1;
    }
    r[0] = (cp_range){0, CP_MAX};
    return cn_set(nfa, r, 1);
}

/* A self-loop over any character at `state`. */
static void any_loop(char_nfa *nfa, int32_t state) {
    int32_t set = any_char_set(nfa);
    if (set >= 0) cn_edge(nfa, state, state, set);
}

bool json_regex_compile(const char *pattern, char_nfa *out, char *message, size_t message_len) {
    size_t len = strlen(pattern);
    bool anchor_start = len > 0 && pattern[0] == '^';
    bool anchor_end = false;
    if (len > (size_t)anchor_start && pattern[len - 1] == '$') {
        size_t slashes = 0;
        while (len >= 2 + slashes && pattern[len - 2 - slashes] == '\\')
            slashes++;
        anchor_end = slashes % 2 == 0;
    }
    rx_parser ps = {.p = pattern + anchor_start,
                    .end = pattern + len - anchor_end,
                    .nfa = out,
                    .message = message,
                    .message_len = message_len};
    int32_t root = rx_alt(&ps);
    if (!ps.failed && ps.p < ps.end) rx_fail(&ps, "%s", "unbalanced ')' in pattern");
    if (!ps.failed) {
        out->start = cn_state(out);
        int32_t at = out->start;
        if (!anchor_start) any_loop(out, at);
        at = rx_build(&ps, root, at);
        out->accept = cn_state(out);
        cn_edge(out, at, out->accept, -1);
        if (!anchor_end) any_loop(out, out->accept);
        if (out->failed)
            rx_fail(&ps, "%s", "pattern too large (its automaton exceeds the state limit)");
    }
    free(ps.nodes);
    return !ps.failed;
}

bool char_nfa_any(char_nfa *out, int32_t min_len, int32_t max_len, char *message,
                  size_t message_len) {
    out->start = cn_state(out);
    out->accept = out->start;
    any_loop(out, out->start);
    return char_nfa_limit_length(out, min_len, max_len, message, message_len);
}

bool char_nfa_limit_length(char_nfa *nfa, int32_t min_len, int32_t max_len, char *message,
                           size_t message_len) {
    if (min_len == 0 && max_len < 0) return true;
    /* counts 0..cap; when unbounded, the count saturates at min_len */
    int32_t cap = max_len >= 0 ? max_len : min_len;
    int64_t n_states = (int64_t)nfa->n_states * (cap + 1) + 1;
    if (nfa->failed || n_states > nfa->max_states) {
        snprintf(message, message_len,
                 "string length limits too large for this string (%lld automaton states)",
                 (long long)n_states);
        return false;
    }
    char_nfa p;
    char_nfa_init(&p, nfa->max_states);
    p.n_states = (int32_t)n_states;
    /* move the sets over */
    p.sets = nfa->sets, p.n_sets = nfa->n_sets, p.cap_sets = nfa->cap_sets;
    nfa->sets = NULL, nfa->n_sets = 0;
#define AT(q, c) ((q) * (cap + 1) + (c))
    for (int32_t i = 0; i < nfa->n_edges; i++) {
        char_edge e = nfa->edges[i];
        for (int32_t c = 0; c <= cap; c++) {
            if (e.set < 0) {
                cn_edge(&p, AT(e.from, c), AT(e.to, c), -1);
            } else {
                int32_t next = c + 1;
                if (next > cap) {
                    if (max_len >= 0) continue;
                    next = cap;
                }
                cn_edge(&p, AT(e.from, c), AT(e.to, next), e.set);
            }
        }
    }
    p.start = AT(nfa->start, 0);
    p.accept = (int32_t)n_states - 1;
    for (int32_t c = min_len; c <= cap; c++)
        cn_edge(&p, AT(nfa->accept, c), p.accept, -1);
#undef AT
    char_nfa_free(nfa);
    *nfa = p;
    if (nfa->failed) {
        snprintf(message, message_len, "%s", "out of memory");
        return false;
    }
    return true;
}

/* Edges grouped by source state. */
static int32_t *edges_by_source(const char_nfa *nfa) {
    int32_t *start = calloc((size_t)nfa->n_states + 1 + (size_t)nfa->n_edges, sizeof *start);
    if (!start) return NULL;
    int32_t *order = start + nfa->n_states + 1;
    for (int32_t e = 0; e < nfa->n_edges; e++)
        start[nfa->edges[e].from + 1]++;
    for (int32_t i = 0; i < nfa->n_states; i++)
        start[i + 1] += start[i];
    int32_t *fill = malloc((size_t)nfa->n_states * sizeof *fill);
    if (!fill) {
        free(start);
        return NULL;
    }
    memcpy(fill, start, (size_t)nfa->n_states * sizeof *fill);
    for (int32_t e = 0; e < nfa->n_edges; e++)
        order[fill[nfa->edges[e].from]++] = e;
    free(fill);
    return start;
}

static int32_t set_intersection(char_nfa *out, const cp_set *x, const cp_set *y) {
    range_buf b = {0};
    for (int32_t i = 0, j = 0; i < x->n && j < y->n;) {
        uint32_t lo = x->ranges[i].lo > y->ranges[j].lo ? x->ranges[i].lo : y->ranges[j].lo;
        uint32_t hi = x->ranges[i].hi < y->ranges[j].hi ? x->ranges[i].hi : y->ranges[j].hi;
        if (lo <= hi) rb_add(&b, lo, hi);
        if (x->ranges[i].hi < y->ranges[j].hi)
            i++;
        else
            j++;
    }
    if (b.failed) {
        free(b.r);
        out->failed = true;
        return -1;
    }
    if (b.n == 0) {
        free(b.r);
        return -2; /* empty */
    }
    return cn_set(out, b.r, b.n);
}

typedef struct pair_map {
    uint64_t *keys;
    int32_t *ids;
    int32_t size, n;
} pair_map;

/* The id of pair key, adding it (and queueing it) when new; -1 on failure. */
static int32_t pair_id(pair_map *m, uint64_t key, char_nfa *out, uint64_t **queue, int32_t *n_queue,
                       int32_t *cap_queue) {
    if (2 * (m->n + 1) > m->size) {
        int32_t size = m->size ? m->size * 2 : 256;
        uint64_t *keys = malloc((size_t)size * sizeof *keys);
        int32_t *ids = malloc((size_t)size * sizeof *ids);
        if (!keys || !ids) {
            free(keys);
            free(ids);
            return -1;
        }
        memset(keys, 0xFF, (size_t)size * sizeof *keys);
        for (int32_t i = 0; i < m->size; i++) {
            if (m->keys[i] == UINT64_MAX) continue;
            int32_t j = (int32_t)((m->keys[i] * 0x9E3779B97F4A7C15ULL) >> 40) & (size - 1);
            while (keys[j] != UINT64_MAX)
                j = (j + 1) & (size - 1);
            keys[j] = m->keys[i], ids[j] = m->ids[i];
        }
        free(m->keys);
        free(m->ids);
        m->keys = keys, m->ids = ids, m->size = size;
    }
    int32_t j = (int32_t)((key * 0x9E3779B97F4A7C15ULL) >> 40) & (m->size - 1);
    while (m->keys[j] != UINT64_MAX) {
        if (m->keys[j] == key) return m->ids[j];
        j = (j + 1) & (m->size - 1);
    }
    int32_t id = cn_state(out);
    if (out->failed) return -1;
    if (*n_queue == *cap_queue) {
        int32_t cap = *cap_queue ? *cap_queue * 2 : 256;
        uint64_t *q = realloc(*queue, (size_t)cap * sizeof *q);
        if (!q) return -1;
        *queue = q, *cap_queue = cap;
    }
    (*queue)[(*n_queue)++] = key;
    m->keys[j] = key, m->ids[j] = id, m->n++;
    return id;
}

bool char_nfa_intersect(char_nfa *a, const char_nfa *b, char *message, size_t message_len) {
    char_nfa p;
    char_nfa_init(&p, a->max_states);
    int32_t *ea = edges_by_source(a), *eb = edges_by_source(b);
    pair_map map = {0};
    uint64_t *queue = NULL;
    int32_t n_queue = 0, cap_queue = 0, head = 0;
    bool ok = ea && eb;
#define PAIR(x, y) (((uint64_t)(uint32_t)(x) << 32) | (uint32_t)(y))
    if (ok) p.start = pair_id(&map, PAIR(a->start, b->start), &p, &queue, &n_queue, &cap_queue);
    ok = ok && p.start >= 0;
    while (ok && head < n_queue) {
        uint64_t key = queue[head++];
        int32_t x = (int32_t)(key >> 32), y = (int32_t)(uint32_t)key;
        int32_t from = pair_id(&map, key, &p, &queue, &n_queue, &cap_queue);
        const int32_t *oa = ea + a->n_states + 1, *ob = eb + b->n_states + 1;
        for (int32_t i = ea[x]; ok && i < ea[x + 1]; i++) {
            const char_edge *e = &a->edges[oa[i]];
            if (e->set < 0) {
                int32_t to = pair_id(&map, PAIR(e->to, y), &p, &queue, &n_queue, &cap_queue);
                ok = to >= 0;
                if (ok) cn_edge(&p, from, to, -1);
                continue;
            }
            for (int32_t k = eb[y]; ok && k < eb[y + 1]; k++) {
                const char_edge *f = &b->edges[ob[k]];
                if (f->set < 0) continue;
                int32_t set = set_intersection(&p, &a->sets[e->set], &b->sets[f->set]);
                if (set == -2) continue;
                int32_t to =
                    set >= 0 ? pair_id(&map, PAIR(e->to, f->to), &p, &queue, &n_queue, &cap_queue)
                             : -1;
                ok = to >= 0;
                if (ok) cn_edge(&p, from, to, set);
            }
        }
        for (int32_t k = eb[y]; ok && k < eb[y + 1]; k++) {
            const char_edge *f = &b->edges[ob[k]];
            if (f->set >= 0) continue;
            int32_t to = pair_id(&map, PAIR(x, f->to), &p, &queue, &n_queue, &cap_queue);
            ok = to >= 0;
            if (ok) cn_edge(&p, from, to, -1);
        }
    }
    if (ok) p.accept = pair_id(&map, PAIR(a->accept, b->accept), &p, &queue, &n_queue, &cap_queue);
    ok = ok && p.accept >= 0 && !p.failed;
#undef PAIR
    free(ea);
    free(eb);
    free(map.keys);
    free(map.ids);
    free(queue);
    if (!ok) {
        snprintf(message, message_len, "%s",
                 "pattern and format together too large (their product exceeds the state limit)");
        char_nfa_free(&p);
        return false;
    }
    char_nfa_free(a);
    *a = p;
    return true;
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

static int utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Splits lo..hi until each piece's encodings form a product of byte ranges (the standard
 * construction, as in RE2 and Rust's regex-syntax). */
void utf8_sequences(uint32_t lo, uint32_t hi, utf8_sequence_fn emit, void *user) {
    if (lo > hi) return;
    /* surrogates are not characters */
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, emit, user);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, emit, user);
        return;
    }
    static const uint32_t limits[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++) {
        if (lo <= limits[i] && hi > limits[i]) {
            utf8_sequences(lo, limits[i], emit, user);
            utf8_sequences(limits[i] + 1, hi, emit, user);
            return;
        }
    }
    if (hi < 0x80) {
        uint8_t a = (uint8_t)lo, b = (uint8_t)hi;
        emit(user, 1, &a, &b);
        return;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_sequences(lo, lo | m, emit, user);
                utf8_sequences((lo | m) + 1, hi, emit, user);
                return;
            }
            if ((hi & m) != m) {
                utf8_sequences(lo, (hi & ~m) - 1, emit, user);
                utf8_sequences(hi & ~m, hi, emit, user);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    emit(user, n, a, b);
}

/* ---- formats ---------------------------------------------------------------------------- */

/* Each is a subset of what the ajv-formats "full" validators accept: dates check the days of
 * each month (February up to 28, so leap years never matter), times never use a leap second
 * and always carry a time zone. */
#define FMT_DATE                                                                                   \
    "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|" \
    "30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
#define FMT_TIME                                                                                   \
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):["  \
    "0-"                                                                                           \
    "5][0-9])"

#define FMT_LABEL "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"

const char *json_format_regex(const char *format) {
    static const struct {
        const char *name, *regex;
    } formats[] = {
        {"date", "^" FMT_DATE "$"},
        {"time", "^" FMT_TIME "$"},
        {"date-time", "^" FMT_DATE "T" FMT_TIME "$"},
        {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        {"ipv4", "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|"
                 "1[0-9][0-9]|[1-9]?[0-9])$"},
        {"hostname", "^" FMT_LABEL "(?:\\." FMT_LABEL "){0,2}$"},
        {"uri", "^https?://" FMT_LABEL "(?:\\." FMT_LABEL ")*(?:/[A-Za-z0-9._~-]*)*$"},
        {"duration", "^P(?:[0-9]{1,4}Y)?(?:[0-9]{1,4}M)?[0-9]{1,4}D(?:T[0-9]{1,4}H)?$"},
        {"email",
         "^[A-Za-z0-9_%+-]+(?:\\.[A-Za-z0-9_%+-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
         "(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\\.[A-Za-z]{2,}$"},
    };
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (strcmp(format, formats[i].name) == 0) return formats[i].regex;
    return NULL;
}
