/*
 * test_json_schema.c - the JSON Schema matcher's API with the real gpt-oss tokenizer: every
 * refused keyword named with its JSON pointer, $ref cycles, a 1 MB schema, json_object mode,
 * exact acceptance of hand-written documents (integer ranges, formats, patterns, property
 * order, whitespace), budgets, and that special tokens are never allowed. The random walks
 * validated by ajv are in test_json_schema_walks.sh.
 */
#include "../tokenizer/tok_test_util.h"
#include "structured/json_schema.h"
#include "util/clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gptoss_tokenizer *tok;
static gptoss_json_vocab *vocab;
#define N_VOCAB 201088
#define MASK_WORDS ((N_VOCAB + 31) / 32)

static int setup(void **state) {
    (void)state;
    tok = tok_test_load();
    gptoss_error err = {0};
    if (gptoss_json_vocab_create(tok, &vocab, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_json_vocab_free(vocab);
    gptoss_tokenizer_free(tok);
    return 0;
}

static gptoss_json_schema *compile_text(const char *text, gptoss_status *status, char *message) {
    json_error_t jerr;
    json_t *schema = text ? json_loads(text, 0, &jerr) : NULL;
    if (text && !schema) fail_msg("bad test schema %s: %s", text, jerr.text);
    gptoss_json_schema *compiled = NULL;
    gptoss_error err = {0};
    *status = gptoss_json_schema_compile(schema, vocab, &compiled, &err);
    if (message) snprintf(message, GPTOSS_ERROR_MESSAGE_MAX, "%s", err.message);
    json_decref(schema);
    return compiled;
}

static gptoss_json_schema *compile_ok(const char *text) {
    gptoss_status st;
    char message[GPTOSS_ERROR_MESSAGE_MAX];
    gptoss_json_schema *s = compile_text(text, &st, message);
    if (st != GPTOSS_OK) fail_msg("schema %s refused: %s", text ? text : "(null)", message);
    return s;
}

static void expect_refused(const char *text, const char *needle) {
    gptoss_status st;
    char message[GPTOSS_ERROR_MESSAGE_MAX];
    gptoss_json_schema *s = compile_text(text, &st, message);
    if (st == GPTOSS_OK) {
        gptoss_json_schema_free(s);
        fail_msg("schema %s compiled; expected a refusal with '%s'", text, needle);
    }
    assert_int_equal(st, GPTOSS_ERR_INVALID_ARGUMENT);
    if (!strstr(message, needle))
        fail_msg("schema %s: message '%s' lacks '%s'", text, message, needle);
}

/* Whether the document's tokens are each allowed (and taken) and it ends complete. */
static bool accepts_with(gptoss_json_schema *s, const char *doc) {
    gptoss_tokens ids = tok_test_encode(tok, doc, strlen(doc), false);
    gptoss_token_constraint *m = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_json_matcher_create(s, &m, &err), GPTOSS_OK);
    static uint32_t mask[MASK_WORDS];
    bool ok = true;
    for (size_t i = 0; i < ids.n && ok; i++) {
        memset(mask, 0, sizeof mask);
        gptoss_constraint_allow(m, mask, N_VOCAB);
        bool in_mask = mask[ids.ids[i] / 32] >> (ids.ids[i] % 32) & 1;
        bool taken = gptoss_constraint_advance(m, ids.ids[i]);
        assert_int_equal(in_mask, taken); /* advance agrees with the mask */
        ok = taken;
    }
    ok = ok && gptoss_constraint_complete(m);
    gptoss_constraint_free(m);
    gptoss_tokens_free(&ids);
    return ok;
}

static bool accepts(const char *schema, const char *doc) {
    gptoss_json_schema *s = compile_ok(schema);
    bool ok = accepts_with(s, doc);
    gptoss_json_schema_free(s);
    return ok;
}

#define ACCEPT(schema, doc)                                                                        \
    do {                                                                                           \
        if (!accepts(schema, doc)) fail_msg("schema %s should accept %s", schema, doc);            \
    } while (0)
#define REJECT(schema, doc)                                                                        \
    do {                                                                                           \
        if (accepts(schema, doc)) fail_msg("schema %s should reject %s", schema, doc);             \
    } while (0)

static void test_refused_keywords(void **state) {
    (void)state;
    static const char *keywords[] = {"not",
                                     "if",
                                     "then",
                                     "else",
                                     "patternProperties",
                                     "minProperties",
                                     "maxProperties",
                                     "uniqueItems",
                                     "contains",
                                     "propertyNames",
                                     "multipleOf",
                                     "dependentRequired",
                                     "dependentSchemas",
                                     "unevaluatedProperties",
                                     "additionalItems",
                                     "nullable",
                                     "minContains",
                                     "$dynamicRef",
                                     "contentEncoding"};
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++) {
        char schema[256], needle[128];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"%s\":1}}}",
                 keywords[i]);
        snprintf(needle, sizeof needle, "unsupported keyword '%s' at /properties/a", keywords[i]);
        expect_refused(schema, needle);
    }
    expect_refused("{\"not\":{}}", "unsupported keyword 'not' at /");
    expect_refused("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"x~/\":"
                   "{\"if\":{}}}}}",
                   "unsupported keyword 'if' at /items/properties/x~0~1");
    expect_refused("{\"type\":\"strin\"}", "unknown type 'strin' at /type");
    expect_refused("{\"type\":\"string\",\"format\":\"ipv6\"}",
                   "unsupported format 'ipv6' at /format");
    expect_refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}",
                   "merges only object schemas (type, properties, required): 'type' at /allOf");
    expect_refused("{\"allOf\":[{\"properties\":{\"a\":{}}},{\"properties\":{\"a\":{}}}]}",
                   "both declare property 'a'");
    expect_refused("{\"type\":\"string\",\"anyOf\":[{\"maxLength\":3}]}",
                   "keyword 'type' beside 'anyOf'");
    expect_refused("{\"type\":\"array\",\"items\":[{}]}", "at /items");
    expect_refused("{\"type\":\"integer\",\"minimum\":\"3\"}",
                   "'minimum' must be a number at /minimum");
}

static void test_refused_patterns(void **state) {
    (void)state;
    static const char *patterns[][2] = {
        {"a(?=b)", "lookaround"},
        {"a(?!b)", "lookaround"},
        {"(?<=a)b", "lookaround"},
        {"(a)\\\\1", "backreference"},
        {"\\\\bword", "word boundaries"},
        {"a^b", "anchors"},
        {"a$b", "anchors"},
        {"\\\\p{L}", "property"},
        {"(ab", "unbalanced"},
        {"[ab", "unterminated"},
        {"a{2,1}", "n < m"},
        {"*a", "without an operand"},
    };
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        char schema[256];
        snprintf(schema, sizeof schema,
                 "{\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"%s\"}}}",
                 patterns[i][0]);
        expect_refused(schema, patterns[i][1]);
        expect_refused(schema, "at /properties/p/pattern");
    }
}

static void test_refs(void **state) {
    (void)state;
    expect_refused("{\"$ref\":\"#\"}", "$ref cycle that consumes no input");
    expect_refused("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
                   "\"$ref\":\"#/$defs/a\"}",
                   "$ref cycle that consumes no input at /$defs/a");
    expect_refused("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},"
                   "\"$ref\":\"#/$defs/a\"}",
                   "cycle");
    /* progress, but no finite value: every object needs another inside */
    expect_refused(
        "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
        "accepts no value");
    expect_refused("{\"$ref\":\"other.json#/a\"}", "only local");
    expect_refused("{\"$defs\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"not\":{}}}}},"
                   "\"$ref\":\"#/$defs/a\"}",
                   "unsupported keyword 'not' at /$defs/a/properties/b");
    expect_refused("{\"$ref\":\"#/$defs/missing\"}",
                   "unresolvable $ref '#/$defs/missing' at /$ref");
    /* recursion unrolled to the stack bound: a linked list */
    const char *list =
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
        "\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":"
        "\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},"
        "\"$ref\":\"#/$defs/n\"}";
    ACCEPT(list, "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}");
    REJECT(list, "{\"v\":1,\"next\":{\"v\":2}}");
    char deep[4096] = "", closing[64] = "";
    for (int i = 0; i < 40; i++)
        strcat(deep, "{\"v\":1,\"next\":");
    strcat(deep, "null");
    for (int i = 0; i < 40; i++)
        strcat(deep, "}");
    (void)closing;
    REJECT(list, deep); /* beyond the 32-frame bound */
    ACCEPT("{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\",\"items\":{\"$ref\":"
           "\"#/definitions/s\"}}",
           "[\"a\", \"b\"]");
}

static void test_values(void **state) {
    (void)state;
    const char *person =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"email\":{"
        "\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"name\",\"age\"],"
        "\"additionalProperties\":false}";
    ACCEPT(person, "{\"name\":\"Ann\",\"age\":37}");
    ACCEPT(person, "{\"name\": \"Ann\", \"age\": 120, \"email\": \"ann.b@example.com\"}");
    REJECT(person, "{\"name\":\"Ann\",\"age\":121}");
    REJECT(person, "{\"age\":3,\"name\":\"Ann\"}");         /* schema order */
    REJECT(person, "{\"name\":\"Ann\"}");                   /* required */
    REJECT(person, "{\"name\":\"Ann\",\"age\":3,\"x\":1}"); /* additionalProperties */
    REJECT(person, "{\"name\":\"Ann\",  \"age\":3}");       /* two spaces */
    REJECT(person, "{ \"name\":\"Ann\",\"age\":3}");        /* space after '{' */
    REJECT(person, "{\"name\":\"Ann\",\"age\":3,\"email\":\"not-an-email\"}");
    const char *open = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}}}";
    ACCEPT(open, "{\"id\":1,\"other\":[true,{\"x\":null}]}");
    REJECT(open, "{\"id\":1,\"id\":2}"); /* an extra key never repeats a declared one */
    const char *quoted = "{\"properties\":{\"q\\\"uote\":{\"type\":\"null\"}}}";
    ACCEPT(quoted, "{\"q\\\"\":1}");     /* another key may share an escape with a name */
    REJECT(quoted, "{\"q\\a\":1}");      /* but never leave it inside the escape */
    REJECT(quoted, "{\"q\\\"uote\":1}"); /* nor be the name */
    ACCEPT("{\"type\":\"integer\",\"exclusiveMinimum\":-20,\"exclusiveMaximum\":1005}", "-19");
    ACCEPT("{\"type\":\"integer\",\"exclusiveMinimum\":-20,\"exclusiveMaximum\":1005}", "1004");
    REJECT("{\"type\":\"integer\",\"exclusiveMinimum\":-20,\"exclusiveMaximum\":1005}", "1005");
    REJECT("{\"type\":\"integer\",\"exclusiveMinimum\":-20,\"exclusiveMaximum\":1005}", "-20");
    REJECT("{\"type\":\"integer\"}", "012");
    REJECT("{\"type\":\"integer\"}", "1.5");
    ACCEPT("{\"type\":\"number\",\"minimum\":0.5,\"maximum\":10.25}", "9.75");
    REJECT("{\"type\":\"number\",\"minimum\":0.5,\"maximum\":10.25}", "11");
    ACCEPT("{\"type\":\"number\"}", "-0.5e+12");
    ACCEPT("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-28\"");
    REJECT("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-30\"");
    ACCEPT("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-12-31T23:59:59.5Z\"");
    ACCEPT("{\"type\":\"string\",\"format\":\"time\"}", "\"08:30:00+02:00\"");
    ACCEPT("{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"");
    ACCEPT("{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]{2,5}$\"}", "\"Paris\"");
    REJECT("{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]{2,5}$\"}", "\"paris\"");
    ACCEPT("{\"type\":\"string\",\"pattern\":\"b+\"}", "\"abbc\"");
    ACCEPT("{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\",\"maxLength\":3}", "\"123\"");
    ACCEPT("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"\\u00e9\\n\"");
    REJECT("{\"type\":\"string\",\"maxLength\":3}", "\"abcd\"");
    ACCEPT("{\"type\":\"string\",\"minLength\":2,\"maxLength\":20000}", "\"ab\\u00e9\"");
    REJECT("{\"type\":\"string\",\"minLength\":3000,\"maxLength\":20000}", "\"ab\"");
    REJECT("{\"type\":\"string\"}", "\"\\ud800\""); /* surrogate escapes are not emitted */
    ACCEPT("{\"enum\":[\"a\",1,null,{\"k\":[1]}]}", "{\"k\":[1]}");
    REJECT("{\"type\":\"string\",\"enum\":[\"a\",1]}", "1");
    ACCEPT("{\"const\":\"x\\\"y\"}", "\"x\\\"y\"");
    ACCEPT("{\"type\":[\"string\",\"null\"]}", "null");
    const char *merged = "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                         "\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":"
                         "\"boolean\"}},\"required\":[\"b\"]}],\"title\":\"T\"}";
    ACCEPT(merged, "{\"a\":1,\"b\":true}");
    REJECT(merged, "{\"a\":1}");
    ACCEPT("{\"allOf\":[{\"$ref\":\"#/$defs/s\"}],\"description\":\"d\",\"$defs\":{\"s\":{"
           "\"type\":\"string\"}}}",
           "\"x\"");
    ACCEPT("{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"array\",\"prefixItems\":[{\"type\":"
           "\"integer\"}],\"items\":false}]}",
           "[7]");
    REJECT("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false}",
           "[7,8]");
    ACCEPT("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
           "[true, false, true]");
    REJECT("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":3}",
           "[true]");
}

static void test_json_object_mode(void **state) {
    (void)state;
    gptoss_json_schema *s = compile_ok(NULL);
    assert_true(accepts_with(s, "{\"a\": [1, {\"b\": null}], \"c\": \"x\\u00e9\", \"d\": -1.5e3}"));
    assert_true(accepts_with(s, "{}"));
    assert_false(accepts_with(s, "[1]"));
    assert_false(accepts_with(s, "{\"a\":1"));
    assert_false(accepts_with(s, "{\"a\":tru}"));
    /* special tokens are never allowed, even where the value is complete */
    gptoss_token_constraint *m = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_json_matcher_create(s, &m, &err), GPTOSS_OK);
    static uint32_t mask[MASK_WORDS];
    int32_t n_ordinary = gptoss_tokenizer_n_ordinary(tok);
    memset(mask, 0, sizeof mask);
    gptoss_constraint_allow(m, mask, N_VOCAB);
    for (int32_t t = n_ordinary; t < N_VOCAB; t++)
        assert_false(mask[t / 32] >> (t % 32) & 1);
    assert_false(gptoss_constraint_advance(m, gptoss_tokenizer_special_id(tok, "<|return|>")));
    gptoss_constraint_free(m);
    gptoss_json_schema_free(s);
}

static int count_bits(const uint32_t *mask) {
    int n = 0;
    for (int w = 0; w < MASK_WORDS; w++)
        n += __builtin_popcount(mask[w]);
    return n;
}

static void test_budget(void **state) {
    (void)state;
    gptoss_json_schema *s = compile_ok("{\"type\":\"string\"}");
    gptoss_token_constraint *m = NULL;
    gptoss_error err = {0};
    static uint32_t mask[MASK_WORDS];
    assert_int_equal(gptoss_json_matcher_create(s, &m, &err), GPTOSS_OK);
    gptoss_tokens ids = tok_test_encode(tok, "\"ab", 3, false);
    for (size_t i = 0; i < ids.n; i++)
        assert_true(gptoss_constraint_advance(m, ids.ids[i]));
    memset(mask, 0, sizeof mask);
    gptoss_constraint_allow(m, mask, N_VOCAB);
    assert_true(count_bits(mask) > 100000); /* unlimited: nearly any text */
    /* one token left: only tokens that close the string ('"', ' "', 'x"', ...) */
    gptoss_json_matcher_set_budget(m, 1);
    memset(mask, 0, sizeof mask);
    gptoss_constraint_allow(m, mask, N_VOCAB);
    gptoss_tokens quote = tok_test_encode(tok, "\"", 1, false);
    assert_true(count_bits(mask) > 1);
    assert_true(mask[quote.ids[0] / 32] >> (quote.ids[0] % 32) & 1);
    for (int32_t t = 0; t < N_VOCAB; t++) {
        if (!(mask[t / 32] >> (t % 32) & 1)) continue;
        size_t n;
        const char *b = gptoss_tokenizer_token_bytes(tok, t, &n);
        assert_true(n >= 1 && b[n - 1] == '"');
    }
    assert_false(gptoss_constraint_complete(m));
    assert_true(gptoss_constraint_advance(m, quote.ids[0]));
    assert_true(gptoss_constraint_complete(m));
    memset(mask, 0, sizeof mask);
    gptoss_constraint_allow(m, mask, N_VOCAB); /* budget 0: nothing */
    assert_int_equal(count_bits(mask), 0);
    gptoss_constraint_free(m);
    /* a budget of 3 tokens for a required structure: every step keeps completion possible */
    gptoss_json_schema *obj = compile_ok(
        "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"minLength\":2}},"
        "\"required\":[\"k\"],\"additionalProperties\":false}");
    assert_int_equal(gptoss_json_matcher_create(obj, &m, &err), GPTOSS_OK);
    gptoss_json_matcher_set_budget(m, 12);
    memset(mask, 0, sizeof mask);
    gptoss_constraint_allow(m, mask, N_VOCAB);
    assert_true(count_bits(mask) > 0);
    gptoss_json_matcher_set_budget(m, 5); /* '{"k":"xx"}' needs 10 bytes: not all one-byte */
    memset(mask, 0, sizeof mask);
    gptoss_constraint_allow(m, mask, N_VOCAB);
    size_t len;
    for (int32_t t = 0; t < N_VOCAB; t++)
        if (mask[t / 32] >> (t % 32) & 1) {
            gptoss_tokenizer_token_bytes(tok, t, &len);
            assert_true(len >= 6); /* 4 tokens must cover the remaining bytes */
        }
    gptoss_constraint_free(m);
    gptoss_json_schema_free(obj);
    gptoss_tokens_free(&ids);
    gptoss_tokens_free(&quote);
    gptoss_json_schema_free(s);
}

/* A 1 MB schema compiles within limits or is refused cleanly, in bounded time. */
static void test_large_schemas(void **state) {
    (void)state;
    size_t cap = 1200000, n = 0;
    char *text = malloc(cap);
    n += (size_t)sprintf(text + n, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; n < 1000000; i++)
        n += (size_t)sprintf(text + n,
                             "%s\"property_%d\":{\"type\":\"string\",\"description\":\"field "
                             "number %d of a generated schema\"}",
                             i ? "," : "", i, i);
    n += (size_t)sprintf(text + n, "},\"additionalProperties\":false}");
    double t0 = gptoss_now_seconds();
    gptoss_status st;
    char message[GPTOSS_ERROR_MESSAGE_MAX];
    gptoss_json_schema *s = compile_text(text, &st, message);
    double seconds = gptoss_now_seconds() - t0;
    printf("1 MB schema of %zu bytes: %s in %.0f ms (%s)\n", n,
           st == GPTOSS_OK ? "compiled" : "refused", seconds * 1e3,
           st == GPTOSS_OK ? "ok" : message);
    assert_true(seconds < 10);
    if (st == GPTOSS_OK) {
        assert_true(accepts_with(s, "{\"property_0\":\"a\",\"property_7\":\"b\"}"));
        gptoss_json_schema_free(s);
    } else {
        assert_non_null(strstr(message, "too large"));
    }
    /* a 1 MB enum */
    n = 0;
    n += (size_t)sprintf(text + n, "{\"enum\":[");
    for (int i = 0; n < 1000000; i++)
        n += (size_t)sprintf(text + n, "%s\"value number %d\"", i ? "," : "", i);
    n += (size_t)sprintf(text + n, "]}");
    t0 = gptoss_now_seconds();
    s = compile_text(text, &st, message);
    seconds = gptoss_now_seconds() - t0;
    printf("1 MB enum: %s in %.0f ms (%s)\n", st == GPTOSS_OK ? "compiled" : "refused",
           seconds * 1e3, st == GPTOSS_OK ? "ok" : message);
    assert_true(seconds < 10);
    if (st == GPTOSS_OK)
        gptoss_json_schema_free(s);
    else
        assert_non_null(strstr(message, "too large"));
    free(text);
}

typedef struct walker {
    gptoss_json_schema *schema;
    uint64_t seed;
    int walks_ok;
} walker;

/* Random walks (budget 60) on a schema shared with other threads; counts walks whose text
 * jansson parses. */
static void *walk_thread(void *arg) {
    walker *w = arg;
    uint32_t *mask = malloc(MASK_WORDS * sizeof *mask);
    int32_t *allowed = malloc(N_VOCAB * sizeof *allowed);
    for (int walk = 0; walk < 6; walk++) {
        gptoss_token_constraint *m = NULL;
        gptoss_error err = {0};
        if (gptoss_json_matcher_create(w->schema, &m, &err) != GPTOSS_OK) break;
        gptoss_json_matcher_set_budget(m, 60);
        char text[8192];
        size_t len = 0;
        for (;;) {
            memset(mask, 0, MASK_WORDS * sizeof *mask);
            gptoss_constraint_allow(m, mask, N_VOCAB);
            int32_t n = 0;
            for (int32_t t = 0; t < N_VOCAB; t++)
                if (mask[t / 32] >> (t % 32) & 1) allowed[n++] = t;
            if (n == 0) break;
            w->seed = w->seed * 6364136223846793005ULL + 1442695040888963407ULL;
            int32_t pick = allowed[(w->seed >> 33) % (uint64_t)n];
            if (!gptoss_constraint_advance(m, pick)) break;
            size_t tl;
            const char *b = gptoss_tokenizer_token_bytes(tok, pick, &tl);
            if (len + tl < sizeof text) memcpy(text + len, b, tl), len += tl;
        }
        json_error_t jerr;
        json_t *v =
            gptoss_constraint_complete(m) ? json_loadb(text, len, JSON_DECODE_ANY, &jerr) : NULL;
        if (v) w->walks_ok++;
        json_decref(v);
        gptoss_constraint_free(m);
    }
    free(mask);
    free(allowed);
    return NULL;
}

/* One compiled schema serves concurrent sequences. */
static void test_threads(void **state) {
    (void)state;
    gptoss_json_schema *schemas[2] = {
        compile_ok(NULL),
        compile_ok("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":"
                   "{\"type\":\"string\",\"maxLength\":4}},\"b\":{\"type\":\"integer\"}},"
                   "\"required\":[\"a\",\"b\"]}")};
    for (int k = 0; k < 2; k++) {
        pthread_t threads[4];
        walker walkers[4];
        for (int i = 0; i < 4; i++) {
            walkers[i] = (walker){.schema = schemas[k], .seed = (uint64_t)(i + 1) * 977};
            assert_int_equal(pthread_create(&threads[i], NULL, walk_thread, &walkers[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(threads[i], NULL);
            assert_int_equal(walkers[i].walks_ok, 6);
        }
        gptoss_json_schema_free(schemas[k]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_keywords),
        cmocka_unit_test(test_refused_patterns),
        cmocka_unit_test(test_refs),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_json_object_mode),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_large_schemas),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
