/*
 * test_stream_decoder.c - incremental decoding: characters split across tokens are emitted
 * only once complete, the concatenated stream equals the full decode for valid text, and
 * invalid bytes become U+FFFD (one per maximal invalid subpart, as the Unicode standard
 * recommends and browsers' TextDecoder does) without losing the valid text after them.
 * Expected outputs are written from the UTF-8 definition, not produced by our code.
 */
#include "tok_test_util.h"

static gptoss_tokenizer *tok;

static int setup(void **state) {
    (void)state;
    tok = tok_test_load();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_tokenizer_free(tok);
    return 0;
}

/* The id of the single-byte token for byte b, by the o200k rank order of spec 5.4: the 188
 * printable bytes in byte order get ranks 0..187, the other 68 bytes 188..255. */
static int32_t byte_id(unsigned char b) {
    int32_t printable = 0, other = 0;
    for (unsigned x = 0; x < b; x++) {
        if ((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)
            printable++;
        else
            other++;
    }
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return printable;
    return 188 + other;
}

/* Streams ids; returns the concatenated output (malloc'd) and checks every chunk is valid
 * UTF-8 on its own. */
static char *stream(const int32_t *ids, size_t n, size_t *total, bool flush) {
    gptoss_stream_decoder dec;
    gptoss_stream_decoder_init(&dec, tok);
    size_t cap = gptoss_stream_decoder_out_capacity(tok);
    char *chunk = malloc(cap);
    char *all = malloc(n * cap + 8);
    *total = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t len = 0;
        if (i < n) {
            gptoss_error err = {0};
            assert_int_equal(gptoss_stream_decoder_push(&dec, ids[i], chunk, cap, &len, &err),
                             GPTOSS_OK);
        } else if (flush) {
            gptoss_stream_decoder_flush(&dec, chunk, cap, &len);
        }
        /* Each chunk must be complete UTF-8: check with a strict decoder written here. */
        for (size_t j = 0; j < len;) {
            unsigned char c = (unsigned char)chunk[j];
            size_t need = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
            assert_true(need > 0 && j + need <= len);
            for (size_t k = 1; k < need; k++)
                assert_int_equal((unsigned char)chunk[j + k] >> 6, 2);
            j += need;
        }
        memcpy(all + *total, chunk, len);
        *total += len;
    }
    free(chunk);
    return all;
}

static void expect_bytes_stream(const char *bytes, size_t n, const char *expected, bool flush) {
    int32_t ids[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        ids[i] = byte_id((unsigned char)bytes[i]);
    size_t len;
    char *out = stream(ids, n, &len, flush);
    if (len != strlen(expected) || memcmp(out, expected, len) != 0)
        fail_msg("stream of %zu bytes: got %.*s, expected %s", n, (int)len, out, expected);
    free(out);
}

static void test_byte_ids_match_vocab(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        size_t len;
        const char *bytes = gptoss_tokenizer_token_bytes(tok, byte_id((unsigned char)b), &len);
        assert_int_equal(len, 1);
        assert_int_equal((unsigned char)bytes[0], b);
    }
}

static void test_split_characters(void **state) {
    (void)state;
    /* Every byte its own token: nothing is emitted until a character completes. */
    const char *text =
        "a\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb \xc3\xa9!";
    size_t n = strlen(text);
    gptoss_stream_decoder dec;
    gptoss_stream_decoder_init(&dec, tok);
    char out[64];
    size_t len, got = 0;
    char all[128];
    /* Bytes after which a character is complete (and so something is emitted). */
    const size_t complete_after[] = {0, 3, 6, 7, 11, 14, 18, 19, 21, 22};
    size_t next_complete = 0;
    for (size_t i = 0; i < n; i++) {
        gptoss_error err = {0};
        assert_int_equal(gptoss_stream_decoder_push(&dec, byte_id((unsigned char)text[i]), out,
                                                    sizeof out, &len, &err),
                         GPTOSS_OK);
        if (next_complete < 10 && i + 1 == complete_after[next_complete] + 1) {
            assert_true(len > 0);
            next_complete++;
        } else {
            assert_int_equal(len, 0);
        }
        memcpy(all + got, out, len);
        got += len;
    }
    gptoss_stream_decoder_flush(&dec, out, sizeof out, &len);
    assert_int_equal(len, 0);
    assert_int_equal(got, n);
    assert_memory_equal(all, text, n);
}

static void test_real_tokens_stream_equals_decode(void **state) {
    (void)state;
    static const char *const texts[] = {
        "\xf0\x9f\xab\xa0", /* a new emoji: split across 3 tokens */
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7\xe2\x80\x8d\xf0"
        "\x9f\x91\xa6 family",
        "\xe6\xb8\x85\xe6\x99\xa8\xe7\x9a\x84\xe9\x9b\xbe\xe6\xb0\x94 "
        "\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\x99\xe0\xb8\x99\xe0\xb8\xb5\xe0\xb9\x89",
        "\xf0\x90\x8c\xb0\xf0\x90\x8c\xb1\xf0\x90\x8c\xb2 "
        "\xf0\x9d\x95\xb3\xf0\x9d\x96\x8a\xf0\x9d\x96\x91",
        "<|start|>user<|message|>caf\xc3\xa9 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbf<|end|>",
    };
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        gptoss_tokens ids = tok_test_encode(tok, texts[t], strlen(texts[t]), true);
        size_t len;
        char *out = stream(ids.ids, ids.n, &len, true);
        assert_int_equal(len, strlen(texts[t]));
        assert_memory_equal(out, texts[t], len);
        free(out);
        gptoss_tokens_free(&ids);
    }
    /* The first text really is split mid-character (else this test proves little). */
    gptoss_tokens ids = tok_test_encode(tok, texts[0], 4, false);
    assert_true(ids.n > 1);
    gptoss_tokens_free(&ids);
}

#define FFFD "\xef\xbf\xbd"

static void test_invalid_bytes(void **state) {
    (void)state;
    expect_bytes_stream("\xff", 1, FFFD, true);
    expect_bytes_stream("\xe4"
                        "a",
                        2, FFFD "a", true);
    expect_bytes_stream("\xe4\xb8"
                        "x\xe4\xb8\xad",
                        6, FFFD "x\xe4\xb8\xad", true);
    expect_bytes_stream("\xf0\x9f"
                        "\xe4\xb8\xad",
                        5, FFFD "\xe4\xb8\xad", true);
    expect_bytes_stream("\xed\xa0\x80"
                        "ok",
                        5, FFFD FFFD FFFD "ok", true);                     /* a surrogate */
    expect_bytes_stream("\xc0\xaf", 2, FFFD FFFD, true);                   /* overlong '/' */
    expect_bytes_stream("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, true); /* above U+10FFFF */
    expect_bytes_stream("\x80\x80"
                        "a",
                        3, FFFD FFFD "a", true);                  /* stray continuations */
    expect_bytes_stream("\xe0\x80\x80", 3, FFFD FFFD FFFD, true); /* overlong 3-byte */
    /* An unfinished character at the end: held back, then one U+FFFD at flush. */
    expect_bytes_stream("ab\xe4\xb8", 4, "ab", false);
    expect_bytes_stream("ab\xe4\xb8", 4, "ab" FFFD, true);
    expect_bytes_stream("\xf0\x9f\x98", 3, FFFD, true);
}

static void test_errors(void **state) {
    (void)state;
    gptoss_stream_decoder dec;
    gptoss_stream_decoder_init(&dec, tok);
    char out[256];
    size_t len = 7;
    gptoss_error err = {0};
    assert_int_equal(gptoss_stream_decoder_push(&dec, 999999, out, sizeof out, &len, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_int_equal(len, 0);
    assert_non_null(strstr(err.message, "999999"));
    assert_int_equal(gptoss_stream_decoder_push(&dec, -1, out, sizeof out, &len, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    /* Too small a buffer is refused and changes nothing: the held byte survives. */
    assert_int_equal(gptoss_stream_decoder_push(&dec, byte_id(0xe4), out, sizeof out, &len, &err),
                     GPTOSS_OK);
    assert_int_equal(len, 0);
    assert_int_equal(gptoss_stream_decoder_push(&dec, byte_id(0xb8), out, 2, &len, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_int_equal(gptoss_stream_decoder_push(&dec, byte_id(0xb8), out, sizeof out, &len, &err),
                     GPTOSS_OK);
    assert_int_equal(gptoss_stream_decoder_push(&dec, byte_id(0xad), out, sizeof out, &len, &err),
                     GPTOSS_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(out, "\xe4\xb8\xad", 3);
    /* The capacity helper covers the longest token even if every byte were invalid. */
    assert_true(gptoss_stream_decoder_out_capacity(tok) >=
                3 * gptoss_tokenizer_max_token_bytes(tok) + 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_ids_match_vocab),
        cmocka_unit_test(test_split_characters),
        cmocka_unit_test(test_real_tokens_stream_equals_decode),
        cmocka_unit_test(test_invalid_bytes),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
