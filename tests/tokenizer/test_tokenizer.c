/*
 * test_tokenizer.c - the tokenizer against the spec's test vectors (spec 5.6, from OpenAI's
 * harmony tests), special-token parsing on and off, hand-worked BPE cases on small
 * synthetic vocabularies (tie-breaking, the long-piece path), bad input (invalid UTF-8, NUL
 * bytes, 10 MB inputs under a time bound, unknown ids) and corrupt tokenizer.json files.
 */
#include "tok_test_util.h"

#include <time.h>

static gptoss_tokenizer *real;

static int setup(void **state) {
    (void)state;
    real = tok_test_load();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_tokenizer_free(real);
    return 0;
}

/* CPU time of this thread: the tokenizer is single-threaded, and CPU time is what the
 * bounds below are about; wall time on a shared CI machine would make them flaky. */
static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool sanitized(void) {
    const char *s = getenv("GPTOSS_SANITIZE");
    return s && !strcmp(s, "1");
}

#define EXPECT_IDS(text, special, ...)                                                             \
    do {                                                                                           \
        const int32_t expected_[] = {__VA_ARGS__};                                                 \
        gptoss_tokens got_ = tok_test_encode(real, text, strlen(text), special);                   \
        tok_test_assert_ids(&got_, expected_, sizeof expected_ / sizeof expected_[0], text);       \
        gptoss_tokens_free(&got_);                                                                 \
    } while (0)

/* Decodes ids and asserts the bytes equal text[0..len). */
static void assert_roundtrip(const gptoss_tokenizer *tok, const char *text, size_t len,
                             bool special) {
    gptoss_tokens ids = tok_test_encode(tok, text, len, special);
    char *back = NULL;
    size_t back_len = 0;
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_decode(tok, ids.ids, ids.n, &back, &back_len, &err),
                     GPTOSS_OK);
    assert_int_equal(back_len, len);
    assert_memory_equal(back, text, len);
    free(back);
    gptoss_tokens_free(&ids);
}

/* ---- spec 5.6 vectors ------------------------------------------------------------------- */

static void test_spec_vectors(void **state) {
    (void)state;
    EXPECT_IDS("hello world", false, 24912, 2375);
    EXPECT_IDS("<|channel|>analysis<|message|>", true, 200005, 35644, 200008);
    EXPECT_IDS("assistant", false, 173781);
    EXPECT_IDS("final", false, 17196);
    EXPECT_IDS("user", false, 1428);
    EXPECT_IDS("User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.", false, 1844,
               31064, 25, 392, 4827, 382, 220, 17, 659, 220, 17, 16842, 12295, 81645, 13, 51441,
               6052, 13);
    EXPECT_IDS("2 + 2 = 4.", false, 17, 659, 220, 17, 314, 220, 19, 13);
}

static void test_vocabulary_shape(void **state) {
    (void)state;
    assert_int_equal(gptoss_tokenizer_n_ordinary(real), 199998);
    assert_int_equal(gptoss_tokenizer_n_vocab(real), 200019); /* HF's added tokens end at 200018 */
    size_t len;
    const char *bytes = gptoss_tokenizer_token_bytes(real, 24912, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(bytes, "hello", 5);
    bytes = gptoss_tokenizer_token_bytes(real, 220, &len); /* " " */
    assert_int_equal(len, 1);
    assert_int_equal(bytes[0], ' ');
    assert_null(gptoss_tokenizer_token_bytes(real, -1, &len));
    assert_null(gptoss_tokenizer_token_bytes(real, 200019, &len));
    assert_null(gptoss_tokenizer_token_bytes(real, INT32_MAX, &len));
}

/* ---- special tokens --------------------------------------------------------------------- */

static void test_special_tokens(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int32_t id;
    } named[] = {
        {"<|startoftext|>", GPTOSS_TOKEN_STARTOFTEXT},
        {"<|endoftext|>", GPTOSS_TOKEN_ENDOFTEXT},
        {"<|return|>", GPTOSS_TOKEN_RETURN},
        {"<|constrain|>", GPTOSS_TOKEN_CONSTRAIN},
        {"<|channel|>", GPTOSS_TOKEN_CHANNEL},
        {"<|start|>", GPTOSS_TOKEN_START},
        {"<|end|>", GPTOSS_TOKEN_END},
        {"<|message|>", GPTOSS_TOKEN_MESSAGE},
        {"<|call|>", GPTOSS_TOKEN_CALL},
        {"<|reserved_200000|>", 200000},
        {"<|endofprompt|>", 200018},
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        assert_int_equal(gptoss_tokenizer_special_id(real, named[i].text), named[i].id);
        assert_true(gptoss_tokenizer_is_special(real, named[i].id));
        size_t len;
        const char *bytes = gptoss_tokenizer_token_bytes(real, named[i].id, &len);
        assert_int_equal(len, strlen(named[i].text));
        assert_memory_equal(bytes, named[i].text, len);
    }
    assert_int_equal(gptoss_tokenizer_special_id(real, "<|nope|>"), -1);
    assert_int_equal(gptoss_tokenizer_special_id(real, "<|start"), -1);
    assert_false(gptoss_tokenizer_is_special(real, 24912));
    assert_false(gptoss_tokenizer_is_special(real, -5));
    assert_false(gptoss_tokenizer_is_special(real, 300000));

    /* Expected ids below come from spec 5.3 and from gpt-tokenizer (o200k_harmony).
     * As text (spec 5.3: harmony renders user text with encode_ordinary). */
    EXPECT_IDS("<|start|>", false, 27, 91, 5236, 91, 29);
    /* Parsed. */
    EXPECT_IDS("<|start|>", true, 200006);
    EXPECT_IDS("<|start|>user<|message|>hi<|end|>", true, 200006, 1428, 200008, 3686, 200007);
    EXPECT_IDS("<|start|><|end|>", true, 200006, 200007);
    /* Partial and malformed look-alikes are text in both modes. */
    EXPECT_IDS("<|end", true, 27, 91, 419);
    EXPECT_IDS("<|end", false, 27, 91, 419);
    EXPECT_IDS("<|END|>", true, 27, 91, 7671, 91, 29);
    /* A name only other sources reserve (spec 5.5) is not in tokenizer.json: text. */
    gptoss_tokens a = tok_test_encode(real, "<|reserved_200100|>", 19, true);
    for (size_t i = 0; i < a.n; i++)
        assert_true(a.ids[i] < 199998);
    gptoss_tokens_free(&a);
    /* Special text round-trips in both modes. */
    const char *mixed = "x<|start|>y<|end|><|e<|call|>|>";
    assert_roundtrip(real, mixed, strlen(mixed), true);
    assert_roundtrip(real, mixed, strlen(mixed), false);
}

/* ---- bad and unusual input -------------------------------------------------------------- */

static void test_invalid_utf8_and_nul(void **state) {
    (void)state;
    static const char *const cases[] = {
        "\xff",
        "\xfe\xff abc",
        "abc\x80",
        "\xc3",
        "\xe4\xb8",
        "\xf0\x9f\x98",
        "a\xc3\x28 b",
        "\xed\xa0\x80",
        "\xc0\xaf",
        "\xf4\x90\x80\x80",
        "x\xe4\xb8y\xe4",
        "\xc3\xa9\xc3",
        " \xff\xff\xff\xff \xff",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_roundtrip(real, cases[i], strlen(cases[i]), false);
    /* Embedded NULs are ordinary characters. */
    const char nul[] = "a\0b\0\0 c\0";
    assert_roundtrip(real, nul, sizeof nul - 1, false);
    assert_roundtrip(real, nul, sizeof nul - 1, true);
    /* An invalid byte splits the text like a boundary: the text around it encodes as alone. */
    gptoss_tokens whole = tok_test_encode(real, "hello\xffworld", 11, false);
    gptoss_tokens left = tok_test_encode(real, "hello", 5, false);
    gptoss_tokens mid = tok_test_encode(real, "\xff", 1, false);
    gptoss_tokens right = tok_test_encode(real, "world", 5, false);
    assert_int_equal(whole.n, left.n + mid.n + right.n);
    assert_int_equal(whole.ids[0], left.ids[0]);
    assert_int_equal(whole.ids[whole.n - 1], right.ids[right.n - 1]);
    gptoss_tokens_free(&whole);
    gptoss_tokens_free(&left);
    gptoss_tokens_free(&mid);
    gptoss_tokens_free(&right);
    /* Empty input: no ids, no error. */
    gptoss_tokens none = tok_test_encode(real, "", 0, true);
    assert_int_equal(none.n, 0);
    gptoss_tokens_free(&none);
}

static void test_decode_unknown_ids(void **state) {
    (void)state;
    const int32_t bad[][2] = {{24912, -1}, {24912, 200019}, {INT32_MAX, 1}, {INT32_MIN, 1}};
    for (size_t i = 0; i < 4; i++) {
        char *text = (char *)0x1;
        size_t len = 99;
        gptoss_error err = {0};
        assert_int_equal(gptoss_tokenizer_decode(real, bad[i], 2, &text, &len, &err),
                         GPTOSS_ERR_INVALID_ARGUMENT);
        assert_null(text);
        assert_non_null(strstr(err.message, "unknown token id"));
    }
    char *text = NULL;
    size_t len;
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_decode(real, NULL, 0, &text, &len, &err), GPTOSS_OK);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
}

/* A deterministic byte generator (LCG), so the large inputs are the same on every run. */
static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void test_large_inputs_are_fast(void **state) {
    (void)state;
    /* 10 MB of mixed text and of random bytes; 2 MB single pieces (one whitespace run, one
     * word) for the long-piece merge, which would take hours if it were quadratic. */
    const size_t sizes[4] = {10u << 20, 2u << 20, 2u << 20, 10u << 20};
    const size_t n_max = 10u << 20;
    char *buf = malloc(n_max);
    assert_non_null(buf);
    /* Budgets are generous (shared 2-core CI, sanitizers) but far below quadratic time. */
    double budget = sanitized() ? 60.0 : 15.0;
    static const char *const fragments[] = {"hello ",
                                            "world",
                                            "\xe4\xb8\xad\xe6\x96\x87",
                                            "  ",
                                            "\n",
                                            "123456",
                                            "\xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd",
                                            "\xff",
                                            "'s ",
                                            "<|end|>",
                                            "\r\n",
                                            "\t\t"};
    uint32_t seed = 12345;
    for (int kind = 0; kind < 4; kind++) {
        size_t n = sizes[kind];
        if (kind == 0) {
            /* Mixed text with invalid bytes and special look-alikes. */
            size_t at = 0;
            while (at < n) {
                const char *f = fragments[lcg(&seed) % 12];
                size_t len = strlen(f);
                if (at + len > n) len = n - at;
                memcpy(buf + at, f, len);
                at += len;
            }
        } else if (kind == 1) {
            memset(buf, ' ', n); /* one 10 MB whitespace piece */
        } else if (kind == 2) {
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)('a' + lcg(&seed) % 26); /* one 10 MB word */
        } else {
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)(lcg(&seed) & 0xFF); /* random bytes */
        }
        double t0 = seconds();
        gptoss_tokens ids = tok_test_encode(real, buf, n, kind == 0);
        double dt = seconds() - t0;
        fprintf(stderr, "%zu-byte input of kind %d: %zu tokens in %.2f s\n", n, kind, ids.n, dt);
        assert_true(dt < budget);
        char *back = NULL;
        size_t back_len = 0;
        gptoss_error err = {0};
        assert_int_equal(gptoss_tokenizer_decode(real, ids.ids, ids.n, &back, &back_len, &err),
                         GPTOSS_OK);
        assert_int_equal(back_len, n);
        assert_memory_equal(back, buf, n);
        free(back);
        gptoss_tokens_free(&ids);
    }
    free(buf);
}

/* ---- synthetic vocabularies: hand-worked BPE --------------------------------------------- */

/* Appends the GPT-2 byte-level form of byte b (spec 5.4) as JSON-ready UTF-8. */
static bool printable_byte(unsigned x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
}

static size_t byte_level(unsigned char b, char *out) {
    unsigned cp;
    if (printable_byte(b)) {
        cp = b;
    } else {
        unsigned rank = 0; /* position among the 68 remapped bytes */
        for (unsigned x = 0; x < b; x++)
            if (!printable_byte(x)) rank++;
        cp = 0x100 + rank;
    }
    if (cp == '"' || cp == '\\') {
        out[0] = '\\';
        out[1] = (char)cp;
        return 2;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Writes a tokenizer.json with the 256 bytes as ids 0..255 (in byte order), `extra` vocab
 * entries (already JSON text, e.g. "\"aa\": 256"), and `tail` appended inside the top-level
 * object (e.g. ", \"added_tokens\": [...]"). Returns the malloc'd path. */
static char *write_vocab(const char *dir, const char *name, const char *extra, const char *tail) {
    size_t cap = 1 << 16, len = 0;
    char *json = malloc(cap);
    len += (size_t)snprintf(json + len, cap - len, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        json[len++] = b ? ',' : ' ';
        json[len++] = '"';
        len += byte_level((unsigned char)b, json + len);
        len += (size_t)snprintf(json + len, cap - len, "\": %d", b);
    }
    len += (size_t)snprintf(json + len, cap - len, "%s%s}, \"merges\": []}%s}",
                            extra[0] ? ", " : "", extra, tail);
    char *path = ts_path(dir, name);
    ts_write_file(path, json, len);
    free(json);
    return path;
}

static gptoss_tokenizer *load_ok(const char *path) {
    gptoss_tokenizer *tok = NULL;
    gptoss_error err = {0};
    if (gptoss_tokenizer_load(path, &tok, &err) != GPTOSS_OK)
        fail_msg("expected %s to load: %s", path, err.message);
    return tok;
}

static void expect_synthetic(gptoss_tokenizer *tok, const char *text, size_t len,
                             const int32_t *expected, size_t n) {
    gptoss_tokens ids = tok_test_encode(tok, text, len, false);
    tok_test_assert_ids(&ids, expected, n, text);
    gptoss_tokens_free(&ids);
}

static void test_bpe_hand_worked(void **state) {
    (void)state;
    char *dir = ts_mkdtemp();
    /* aa=256, aaaa=257, bc=258, abc=259, ab=260. Ranks decide merge order, not length. */
    char *path = write_vocab(
        dir, "t.json", "\"aa\": 256, \"aaaa\": 257, \"bc\": 258, \"abc\": 259, \"ab\": 260", "");
    gptoss_tokenizer *tok = load_ok(path);
    assert_int_equal(gptoss_tokenizer_n_vocab(tok), 261);
    /* Whole piece in vocab: emitted directly. */
    expect_synthetic(tok, "abc", 3, (const int32_t[]){259}, 1);
    /* "aaa": both pairs are "aa" (rank 256); the leftmost merges: [aa][a]. */
    expect_synthetic(tok, "aaa", 3, (const int32_t[]){256, 'a'}, 2);
    /* "aaaaa" -> [aa][aa][a] -> [aaaa][a]. */
    expect_synthetic(tok, "aaaaa", 5, (const int32_t[]){257, 'a'}, 2);
    /* "abcc": pairs ab=260, bc=258, cc=none; bc (lower rank) first -> [a][bc][c]; then
     * a+bc = "abc" = 259 -> [abc][c]. */
    expect_synthetic(tok, "abcc", 4, (const int32_t[]){259, 'c'}, 2);
    /* "abab": ab=260 merges leftmost, then the second -> [ab][ab] ("abab" not a token). */
    expect_synthetic(tok, "abab", 4, (const int32_t[]){260, 260}, 2);
    /* Long pieces take the heap path (> 128 bytes) and must agree with the same rule:
     * 302 a's -> 151 "aa" -> 75 "aaaa" + one "aa"; 301 a's -> 75 "aaaa" + "a". */
    char *as = malloc(400);
    memset(as, 'a', 400);
    int32_t expected[80];
    for (int i = 0; i < 75; i++)
        expected[i] = 257;
    expected[75] = 256;
    expect_synthetic(tok, as, 302, expected, 76);
    expected[75] = 'a';
    expect_synthetic(tok, as, 301, expected, 76);
    /* 200 x "abc" with no separator is one 600-byte piece: "abc" tokens throughout. */
    char *abc = malloc(600);
    for (int i = 0; i < 600; i++)
        abc[i] = "abc"[i % 3];
    int32_t abc_ids[200];
    for (int i = 0; i < 200; i++)
        abc_ids[i] = 259;
    expect_synthetic(tok, abc, 600, abc_ids, 200);
    free(abc);
    free(as);
    gptoss_tokenizer_free(tok);
    free(path);
    ts_rmtree(dir);
    free(dir);
}

static void test_synthetic_specials(void **state) {
    (void)state;
    char *dir = ts_mkdtemp();
    char *path =
        write_vocab(dir, "t.json", "",
                    ", \"added_tokens\": [{\"id\": 300, \"content\": \"<|x|>\", \"special\": true},"
                    " {\"id\": 301, \"content\": \"<|xy|>\"}]");
    gptoss_tokenizer *tok = load_ok(path);
    assert_int_equal(gptoss_tokenizer_n_vocab(tok), 302);
    assert_null(gptoss_tokenizer_token_bytes(tok, 299, NULL)); /* a gap between ids */
    gptoss_tokens ids = tok_test_encode(tok, "a<|x|><|xy|>b", 13, true);
    tok_test_assert_ids(&ids, (const int32_t[]){'a', 300, 301, 'b'}, 4, "synthetic specials");
    gptoss_tokens_free(&ids);
    gptoss_error err = {0};
    char *text;
    size_t len;
    assert_int_equal(gptoss_tokenizer_decode(tok, (const int32_t[]){299}, 1, &text, &len, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    gptoss_tokenizer_free(tok);
    free(path);
    ts_rmtree(dir);
    free(dir);
}

/* ---- corrupt files ---------------------------------------------------------------------- */

static void expect_load_error(const char *path, gptoss_status status, const char *needle) {
    gptoss_tokenizer *tok = (gptoss_tokenizer *)0x1;
    gptoss_error err = {0};
    gptoss_status st = gptoss_tokenizer_load(path, &tok, &err);
    if (st != status || !strstr(err.message, needle))
        fail_msg("loading %s: expected status %d with \"%s\", got %d: %s", path, status, needle, st,
                 err.message);
    assert_null(tok);
}

static void write_text(const char *dir, const char *name, const char *text, char **path) {
    *path = ts_path(dir, name);
    ts_write_file(*path, text, strlen(text));
}

static void test_corrupt_files(void **state) {
    (void)state;
    char *dir = ts_mkdtemp();
    char *p;
    struct {
        const char *name, *text, *needle;
        gptoss_status status;
    } texts[] = {
        {"empty.json", "", "must be a JSON object", GPTOSS_ERR_FORMAT},
        {"notjson.json", "hello, world", "must be a JSON object", GPTOSS_ERR_FORMAT},
        {"array.json", "[1, 2]", "must be a JSON object", GPTOSS_ERR_FORMAT},
        {"nomodel.json", "{\"version\": \"1.0\"}", "no \"model\"", GPTOSS_ERR_FORMAT},
        {"novocab.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "has no \"vocab\"",
         GPTOSS_ERR_FORMAT},
        {"vocabarray.json", "{\"model\": {\"vocab\": [1]}}", "must be an object",
         GPTOSS_ERR_FORMAT},
        {"unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", "only byte-level",
         GPTOSS_ERR_UNSUPPORTED},
        {"trailing.json", "{\"model\": {\"vocab\": {\"a\": 0,}}}", "trailing comma",
         GPTOSS_ERR_FORMAT},
        {"unterminated.json", "{\"model\": {\"vocab\": {\"a", "unterminated string",
         GPTOSS_ERR_FORMAT},
        {"badid.json", "{\"model\": {\"vocab\": {\"a\": \"zero\"}}}", "expected an integer",
         GPTOSS_ERR_FORMAT},
        {"negid.json", "{\"model\": {\"vocab\": {\"a\": -1}}}", "out of range", GPTOSS_ERR_FORMAT},
        {"fracid.json", "{\"model\": {\"vocab\": {\"a\": 1.5}}}", "fraction", GPTOSS_ERR_FORMAT},
        {"hugeid.json", "{\"model\": {\"vocab\": {\"a\": 99999999999999999999}}}", "out of range",
         GPTOSS_ERR_FORMAT},
        {"alphabet.json", "{\"model\": {\"vocab\": {\"a b\": 0}}}",
         "outside the byte-level alphabet", GPTOSS_ERR_FORMAT},
        {"cjkkey.json", "{\"model\": {\"vocab\": {\"\xe4\xb8\xad\": 0}}}",
         "outside the byte-level alphabet", GPTOSS_ERR_FORMAT},
        {"emptykey.json", "{\"model\": {\"vocab\": {\"\": 0}}}", "empty vocab key",
         GPTOSS_ERR_FORMAT},
        {"fewbytes.json", "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}}}", "at least the 256",
         GPTOSS_ERR_FORMAT},
        {"badutf8.json", "{\"model\": {\"vocab\": {\"\xff\": 0}}}", "invalid UTF-8",
         GPTOSS_ERR_FORMAT},
        {"surrogate.json", "{\"model\": {\"vocab\": {\"\\ud800\": 0}}}", "surrogate",
         GPTOSS_ERR_FORMAT},
        {"ctrl.json", "{\"model\": {\"vocab\": {\"a\nb\": 0}}}", "control character",
         GPTOSS_ERR_FORMAT},
        {"after.json", "{\"model\": {\"vocab\": {}}} {}", "after the top-level object",
         GPTOSS_ERR_FORMAT},
        {"twomodels.json", "{\"model\": {\"vocab\": {}}, \"model\": {}}", "appears twice",
         GPTOSS_ERR_FORMAT},
        {"addednotarray.json", "{\"added_tokens\": {}, \"model\": {\"vocab\": {}}}",
         "must be an array", GPTOSS_ERR_FORMAT},
        {"addednoid.json",
         "{\"added_tokens\": [{\"content\": \"<|x|>\"}], \"model\": {\"vocab\": {}}}",
         "lacks \"id\"", GPTOSS_ERR_FORMAT},
        {"regex.json",
         "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}}, "
         "\"model\": {\"vocab\": {}}}",
         "not o200k", GPTOSS_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        write_text(dir, texts[i].name, texts[i].text, &p);
        expect_load_error(p, texts[i].status, texts[i].needle);
        free(p);
    }
    /* Whole-vocabulary checks on otherwise valid files. */
    struct {
        const char *extra, *tail, *needle;
    } vocabs[] = {
        {"\"aa\": 300", "", "id 256 is missing"},                 /* a hole in the ids */
        {"\"aa\": 5", "", "id 5 is given to two different keys"}, /* duplicate id */
        {"\"aa\": 256, \"aa\": 257", "", "have the same bytes"},  /* duplicate key */
        {"\"aa\": 256", ", \"added_tokens\": [{\"id\": 7, \"content\": \"<|x|>\"}]",
         "already an ordinary vocab id"},
        {"\"aa\": 256",
         ", \"added_tokens\": [{\"id\": 300, \"content\": \"<|x|>\"}, {\"id\": 300, \"content\": "
         "\"<|y|>\"}]",
         "appears twice"},
        {"\"aa\": 256",
         ", \"added_tokens\": [{\"id\": 300, \"content\": \"<|x|>\"}, {\"id\": 301, \"content\": "
         "\"<|x|>\"}]",
         "appears twice"},
        {"\"aa\": 256", ", \"added_tokens\": [{\"id\": 300, \"content\": \"\"}]",
         "empty \"content\""},
    };
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "vocab%zu.json", i);
        p = write_vocab(dir, name, vocabs[i].extra, vocabs[i].tail);
        expect_load_error(p, GPTOSS_ERR_FORMAT, vocabs[i].needle);
        free(p);
    }
    /* Deep nesting in a skipped section must not exhaust the stack. */
    size_t depth = 200000;
    char *deep = malloc(2 * depth + 64);
    size_t len = (size_t)sprintf(deep, "{\"x\": ");
    memset(deep + len, '[', depth);
    len += depth;
    memset(deep + len, ']', depth);
    len += depth;
    len += (size_t)sprintf(deep + len, "}");
    p = ts_path(dir, "deep.json");
    ts_write_file(p, deep, len);
    expect_load_error(p, GPTOSS_ERR_FORMAT, "nesting deeper");
    free(p);
    free(deep);
    /* The real file cut short, and the real file with a byte flipped inside the vocab. */
    char *real_path = tok_test_json_path();
    size_t real_len;
    char *real_json = ts_read_file(real_path, &real_len);
    assert_non_null(real_json);
    p = ts_path(dir, "truncated.json");
    ts_write_file(p, real_json, real_len / 2);
    expect_load_error(p, GPTOSS_ERR_FORMAT, "truncated.json:");
    free(p);
    char *vocab_at = strstr(real_json, "\"vocab\"");
    assert_non_null(vocab_at);
    char *colon = strstr(vocab_at + 5000, "\": ");
    colon[1] = ';';
    p = ts_path(dir, "flipped.json");
    ts_write_file(p, real_json, real_len);
    expect_load_error(p, GPTOSS_ERR_FORMAT, "expected ':'");
    free(p);
    free(real_json);
    free(real_path);
    /* Missing file and a folder. */
    p = ts_path(dir, "missing.json");
    expect_load_error(p, GPTOSS_ERR_IO, "cannot open tokenizer");
    free(p);
    expect_load_error(dir, GPTOSS_ERR_IO, "not a regular file");
    ts_rmtree(dir);
    free(dir);
}

static void test_load_time(void **state) {
    (void)state;
    /* The real 27 MB file: well under a second in a normal build (measured ~0.2 s; jansson
     * alone takes ~2.2 s just to parse it). */
    char *path = tok_test_json_path();
    double t0 = seconds();
    gptoss_tokenizer *tok = load_ok(path);
    double dt = seconds() - t0;
    fprintf(stderr, "tokenizer.json load: %.3f s CPU\n", dt);
    if (!sanitized()) assert_true(dt < 1.0);
    gptoss_tokenizer_free(tok);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_vectors),       cmocka_unit_test(test_vocabulary_shape),
        cmocka_unit_test(test_special_tokens),     cmocka_unit_test(test_invalid_utf8_and_nul),
        cmocka_unit_test(test_decode_unknown_ids), cmocka_unit_test(test_large_inputs_are_fast),
        cmocka_unit_test(test_bpe_hand_worked),    cmocka_unit_test(test_synthetic_specials),
        cmocka_unit_test(test_corrupt_files),      cmocka_unit_test(test_load_time),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
