/*
 * fuzz_tokenizer_encode.c - libFuzzer target: arbitrary bytes through the encoder, with
 * special tokens parsed or not (first byte decides), and the invariant that decoding gives
 * the input back exactly. The tokenizer is loaded once from $GPTOSS_TOKENIZER_JSON.
 */
#include "fuzz_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    bool special = data[0] & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    gptoss_tokens ids = {0};
    gptoss_error err = {0};
    if (gptoss_tokenizer_encode(tokenizer, text, len, special, &ids, &err) != GPTOSS_OK) abort();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= gptoss_tokenizer_n_vocab(tokenizer)) abort();
    char *back = NULL;
    size_t back_len = 0;
    if (gptoss_tokenizer_decode(tokenizer, ids.ids, ids.n, &back, &back_len, &err) != GPTOSS_OK)
        abort();
    if (back_len != len || memcmp(back, text, len) != 0) abort(); /* lossless for any bytes */
    free(back);
    gptoss_tokens_free(&ids);
    return 0;
}
