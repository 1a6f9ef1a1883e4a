/*
 * test_peer.c - our token ids against gpt-tokenizer (npm, o200k_harmony), an independent
 * implementation, on a >= 2 MB deterministic corpus in many scripts (tests/tokenizer/
 * corpus.mjs), with special tokens both as text and parsed. Every id must match; a mismatch
 * names the document, the first differing index, and the text there. Also checks
 * decode(encode(x)) == x for every document.
 */
#include "tok_test_util.h"

#include <stdint.h>

typedef struct reader {
    const unsigned char *p, *end;
} reader;

static uint32_t read_u32(reader *r) {
    if (r->end - r->p < 4) fail_msg("peer file truncated");
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

static const unsigned char *read_bytes(reader *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) fail_msg("peer file truncated");
    const unsigned char *at = r->p;
    r->p += n;
    return at;
}

static void print_context(const gptoss_tokenizer *tok, const int32_t *ids, size_t n, size_t at) {
    size_t from = at > 5 ? at - 5 : 0, to = at + 6 < n ? at + 6 : n;
    for (size_t i = from; i < to; i++) {
        size_t len;
        const char *bytes = gptoss_tokenizer_token_bytes(tok, ids[i], &len);
        fprintf(stderr, "%s%d=", i == at ? " >>" : " ", ids[i]);
        for (size_t j = 0; bytes && j < len; j++) {
            unsigned char c = (unsigned char)bytes[j];
            if (c >= 0x20 && c < 0x7f && c != '\\')
                fputc(c, stderr);
            else
                fprintf(stderr, "\\x%02x", c);
        }
    }
    fputc('\n', stderr);
}

/* Compares one encoding; returns whether it matched (prints where it did not). */
static bool compare(const gptoss_tokenizer *tok, const char *name, const char *mode,
                    const gptoss_tokens *ours, const int32_t *peer, size_t n_peer) {
    size_t i = 0;
    while (i < ours->n && i < n_peer && ours->ids[i] == peer[i])
        i++;
    if (i == ours->n && i == n_peer) return true;
    fprintf(stderr,
            "MISMATCH in document '%s' (%s): first difference at token %zu (ours %zu tokens, peer "
            "%zu)\n",
            name, mode, i, ours->n, n_peer);
    fprintf(stderr, "  ours:");
    print_context(tok, ours->ids, ours->n, i);
    fprintf(stderr, "  peer:");
    print_context(tok, peer, n_peer, i);
    return false;
}

static void test_corpus_matches_gpt_tokenizer(void **state) {
    (void)state;
    const char *src = ts_env("GPTOSS_SOURCE_DIR");
    char *dir = ts_mkdtemp();
    char *peer_path = ts_path(dir, "peer.bin");
    char *out = NULL;
    int rc = ts_run(&out, "cd '%s' && node tests/tokenizer/peer_encode.mjs '%s'", src, peer_path);
    if (rc != 0) fail_msg("node tests/tokenizer/peer_encode.mjs failed (%d): %s", rc, out);
    fprintf(stderr, "%s", out);
    free(out);
    size_t size;
    unsigned char *data = (unsigned char *)ts_read_file(peer_path, &size);
    assert_non_null(data);
    reader r = {data, data + size};
    assert_memory_equal(read_bytes(&r, 4), "GPTK", 4);
    uint32_t n_docs = read_u32(&r);
    gptoss_tokenizer *tok = tok_test_load();
    size_t total_bytes = 0, total_ids = 0, failures = 0;
    for (uint32_t d = 0; d < n_docs; d++) {
        uint32_t name_len = read_u32(&r);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)name_len, (const char *)read_bytes(&r, name_len));
        uint32_t text_len = read_u32(&r);
        const char *text = (const char *)read_bytes(&r, text_len);
        total_bytes += text_len;
        for (int mode = 0; mode < 2; mode++) {
            uint32_t n = read_u32(&r);
            int32_t *peer = malloc(((size_t)n + 1) * sizeof *peer);
            memcpy(peer, read_bytes(&r, (size_t)n * 4), (size_t)n * 4); /* little-endian host */
            gptoss_tokens ours = tok_test_encode(tok, text, text_len, mode == 1);
            if (!compare(tok, name, mode ? "special tokens parsed" : "special tokens as text",
                         &ours, peer, n))
                failures++;
            total_ids += n;
            if (mode == 0) {
                char *back = NULL;
                size_t back_len = 0;
                gptoss_error err = {0};
                assert_int_equal(
                    gptoss_tokenizer_decode(tok, ours.ids, ours.n, &back, &back_len, &err),
                    GPTOSS_OK);
                if (back_len != text_len || memcmp(back, text, text_len) != 0) {
                    fprintf(stderr, "ROUNDTRIP FAILED for document '%s'\n", name);
                    failures++;
                }
                free(back);
            }
            gptoss_tokens_free(&ours);
            free(peer);
        }
    }
    fprintf(stderr, "compared %u documents, %zu bytes, %zu peer ids; %zu failures\n", n_docs,
            total_bytes, total_ids, failures);
    assert_true(total_bytes >= 2000000);
    assert_int_equal(failures, 0);
    gptoss_tokenizer_free(tok);
    free(data);
    ts_rmtree(dir);
    free(dir);
    free(peer_path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_matches_gpt_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
