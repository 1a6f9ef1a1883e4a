/*
 * fuzz_tokenizer_decode.c - libFuzzer target: arbitrary id sequences (4 bytes each, many
 * out of range) through the whole-sequence decoder and the streaming decoder. Checks that
 * unknown ids are refused by both, and that for known ids the stream emits only valid
 * UTF-8 that equals the full decode whenever the full decode is valid UTF-8.
 * The tokenizer is loaded once from $GPTOSS_TOKENIZER_JSON.
 */
#include "fuzz_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether s[0..n) is valid UTF-8 (written independently of the library's helper). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        }
        /* need: continuation bytes; [lo, hi]: range of the first one (spec'd by RFC 3629). */
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c == 0xE0)
            need = 2, lo = 0xA0;
        else if (c == 0xED)
            need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF)
            need = 2;
        else if (c == 0xF0)
            need = 3, lo = 0x90;
        else if (c == 0xF4)
            need = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3)
            need = 3;
        else
            return false;
        if (i + need >= n) return false; /* truncated at the end */
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
        i += need + 1;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t n = size / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int32_t n_vocab = gptoss_tokenizer_n_vocab(tokenizer);
    bool all_known = true;
    for (size_t i = 0; i < n; i++) {
        uint32_t raw;
        memcpy(&raw, data + 4 * i, 4);
        /* Mostly small ids (where single bytes and short tokens live), some anywhere. */
        ids[i] = (raw & 0x80000000u) ? (int32_t)raw : (int32_t)(raw % (uint32_t)(n_vocab + 16));
        if (ids[i] < 0 || ids[i] >= n_vocab ||
            !gptoss_tokenizer_token_bytes(tokenizer, ids[i], NULL))
            all_known = false;
    }
    char *text = NULL;
    size_t len = 0;
    gptoss_error err = {0};
    gptoss_status st = gptoss_tokenizer_decode(tokenizer, ids, n, &text, &len, &err);
    if ((st == GPTOSS_OK) != all_known) abort();

    gptoss_stream_decoder dec;
    gptoss_stream_decoder_init(&dec, tokenizer);
    size_t cap = gptoss_stream_decoder_out_capacity(tokenizer);
    char *chunk = malloc(cap);
    char *streamed = malloc(n * cap + 8);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t got = 0;
        gptoss_status ps = gptoss_stream_decoder_push(&dec, ids[i], chunk, cap, &got, &err);
        bool known = ids[i] >= 0 && ids[i] < n_vocab &&
                     gptoss_tokenizer_token_bytes(tokenizer, ids[i], NULL);
        if ((ps == GPTOSS_OK) != known) abort();
        if (got > cap) abort();
        memcpy(streamed + total, chunk, got);
        total += got;
    }
    size_t got = 0;
    gptoss_stream_decoder_flush(&dec, chunk, cap, &got);
    memcpy(streamed + total, chunk, got);
    total += got;
    if (!valid_utf8((const unsigned char *)streamed, total)) abort();
    if (st == GPTOSS_OK && valid_utf8((const unsigned char *)text, len) &&
        (total != len || memcmp(streamed, text, len) != 0))
        abort();
    free(chunk);
    free(streamed);
    free(text);
    free(ids);
    return 0;
}
