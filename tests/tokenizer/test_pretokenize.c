/*
 * test_pretokenize.c - the ASCII fast path of the pre-tokenizer against PCRE2 running the
 * o200k regex alone (the reference engine), on many random strings drawn from an alphabet
 * built to hit every alternative's edges: mixed-case letters around apostrophes
 * (contractions), digits, spaces, tabs, \r, \n, \v, \f, '/', punctuation, control bytes, and
 * a few non-ASCII characters (letters, a digit, a space, a mark, "ſ") that force deferral.
 */
#include "tok_test_util.h"
#include "tokenizer/tokenizer_internal.h"

typedef struct pieces {
    size_t ends[4096]; /* end offset of each piece */
    size_t n;
    const unsigned char *base;
} pieces;

static gptoss_status record(void *user, const unsigned char *piece, size_t len, gptoss_error *error) {
    (void)error;
    pieces *p = user;
    if (p->n < 4096) p->ends[p->n++] = (size_t)(piece - p->base) + len;
    return GPTOSS_OK;
}

static void split(const gptoss_tokenizer *tok, const char *text, size_t len, bool fast, pieces *out) {
    out->n = 0;
    out->base = (const unsigned char *)text;
    gptoss_error err = {0};
    assert_int_equal(gptoss_tok_split(tok, (const unsigned char *)text, len, fast, record, out, &err), GPTOSS_OK);
}

static void print_escaped(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f) fputc(c, stderr);
        else fprintf(stderr, "\\x%02x", c);
    }
}

static void test_fast_path_matches_pcre2(void **state) {
    (void)state;
    gptoss_tokenizer *tok = tok_test_load();
    static const char *const alphabet[] = {
        "a", "b", "s", "t", "d", "m", "l", "r", "e", "v", "A", "B", "S", "T", "D", "M", "L", "R", "E", "V",
        "'", "'", "'", "0", "1", "9", " ", " ", " ", "\t", "\n", "\r", "\v", "\f", "/", ".", "!", "-", "_",
        "\x01", "\x1f", "\x7f", "\xc3\xa9", "\xc3\x89", "\xd9\xa3", "\xc2\xa0", "\xcc\x81", "\xc5\xbf", "\xe4\xb8\xad",
        "\xe3\x80\x80", "\xf0\x9f\x98\x80",
    };
    const size_t n_alpha = sizeof alphabet / sizeof alphabet[0];
    uint32_t seed = 99;
    static pieces fast, slow;
    char text[256];
    int iterations = getenv("GPTOSS_SANITIZE") && !strcmp(getenv("GPTOSS_SANITIZE"), "1") ? 30000 : 200000;
    for (int it = 0; it < iterations; it++) {
        size_t len = 0;
        seed = seed * 1664525u + 1013904223u;
        size_t n_chars = 1 + (seed >> 8) % 24;
        bool ascii_only = (seed >> 4) % 3 != 0;
        for (size_t i = 0; i < n_chars; i++) {
            seed = seed * 1664525u + 1013904223u;
            const char *ch = alphabet[(seed >> 8) % (ascii_only ? 42 : n_alpha)];
            size_t l = strlen(ch);
            memcpy(text + len, ch, l);
            len += l;
        }
        split(tok, text, len, true, &fast);
        split(tok, text, len, false, &slow);
        bool same = fast.n == slow.n;
        for (size_t i = 0; same && i < fast.n; i++) same = fast.ends[i] == slow.ends[i];
        if (!same) {
            fprintf(stderr, "pieces differ for \"");
            print_escaped(text, len);
            fprintf(stderr, "\"\n  fast path:");
            for (size_t i = 0; i < fast.n; i++) fprintf(stderr, " %zu", fast.ends[i]);
            fprintf(stderr, "\n  PCRE2:    ");
            for (size_t i = 0; i < slow.n; i++) fprintf(stderr, " %zu", slow.ends[i]);
            fprintf(stderr, "\n");
            fail_msg("ASCII fast path disagrees with PCRE2");
        }
    }
    gptoss_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_path_matches_pcre2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
