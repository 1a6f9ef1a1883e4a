/*
 * encode.c - gptoss_tokenizer_encode: special-token splitting around ordinary encoding.
 *
 * Owns: the caller's choice between parsing special tokens ("<|start|>" -> 200006) and
 * treating them as text. As in tiktoken, the text between two special tokens is encoded on
 * its own, so the regex never sees across a special token.
 * Must not: touch the BPE or regex internals (pretokenize.c and bpe.c own them).
 */
#include "tokenizer/tokenizer_internal.h"

#include "util/error.h"

#include <string.h>

/* The special token that starts at text[0], or NULL. Specials all begin with "<|" in the
 * gpt-oss tokenizer, but any added token works: each is compared in full. When two match,
 * the longer wins. */
static const gptoss_special_token *special_at(const gptoss_tokenizer *tok,
                                              const unsigned char *text, size_t avail) {
    const gptoss_special_token *best = NULL;
    for (int32_t i = 0; i < tok->n_special; i++) {
        const gptoss_special_token *s = &tok->specials[i];
        if (s->len <= avail && tok->pool[s->offset] == text[0] &&
            memcmp(tok->pool + s->offset, text, s->len) == 0 && (!best || s->len > best->len))
            best = s;
    }
    return best;
}

gptoss_status gptoss_tokenizer_encode(const gptoss_tokenizer *tok, const char *text, size_t len,
                                      bool allow_special, gptoss_tokens *out, gptoss_error *error) {
    if (!tok || !out || (!text && len))
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "gptoss_tokenizer_encode: NULL argument");
    if (len >= UINT32_MAX)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "text of %zu bytes is too long to encode at once (limit 4 GiB)",
                                len);
    const unsigned char *bytes = (const unsigned char *)text;
    size_t n_before = out->n;
    gptoss_status st = GPTOSS_OK;
    if (!allow_special || tok->n_special == 0) {
        st = gptoss_tok_encode_ordinary(tok, bytes, len, out, error);
    } else {
        /* Bitmap of the first bytes of special tokens, so most bytes are skipped at once. */
        bool first_byte[256] = {false};
        for (int32_t i = 0; i < tok->n_special; i++)
            first_byte[tok->pool[tok->specials[i].offset]] = true;
        size_t segment = 0;
        for (size_t i = 0; i < len && !st; i++) {
            if (!first_byte[bytes[i]]) continue;
            const gptoss_special_token *s = special_at(tok, bytes + i, len - i);
            if (!s) continue;
            st = gptoss_tok_encode_ordinary(tok, bytes + segment, i - segment, out, error);
            if (!st) st = gptoss_tok_push(out, s->id, error);
            i += s->len - 1;
            segment = i + 1;
        }
        if (!st) st = gptoss_tok_encode_ordinary(tok, bytes + segment, len - segment, out, error);
    }
    /* On failure the caller's list is left as it was. */
    if (st) out->n = n_before;
    return st;
}
