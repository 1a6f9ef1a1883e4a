/*
 * stream_decoder.c - incremental decoding of generated tokens into whole UTF-8 text.
 *
 * A token may end in the middle of a character (byte-level BPE: ids 0..255 are single
 * bytes), so bytes of an unfinished sequence are held until the sequence completes. Bytes
 * that can never become valid UTF-8 turn into U+FFFD, one per maximal invalid subpart (the
 * Unicode "substitution of maximal subparts" practice), and the byte that broke a sequence is
 * examined afresh so the valid text after it is kept.
 * Owns: the pending bytes inside gptoss_stream_decoder. Must not: allocate.
 */
#include "tokenizer/tokenizer_internal.h"

#include "util/utf8.h"
#include "util/error.h"

#include <string.h>

static const unsigned char replacement[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */

void gptoss_stream_decoder_init(gptoss_stream_decoder *decoder, const gptoss_tokenizer *tokenizer) {
    memset(decoder, 0, sizeof *decoder);
    decoder->tokenizer = tokenizer;
}

size_t gptoss_stream_decoder_out_capacity(const gptoss_tokenizer *tokenizer) {
    /* Each input byte yields at most 3 output bytes amortized (a U+FFFD), plus what the
     * pending bytes can turn into (one U+FFFD or a completed 4-byte character) and a margin. */
    return 3 * (size_t)tokenizer->max_token_len + 16;
}

/* Feeds one byte; appends completed text to out (capacity checked by the caller). */
static size_t feed_byte(gptoss_stream_decoder *d, unsigned char byte, unsigned char *out) {
    size_t n = 0;
    for (;;) {
        if (d->n_pending == 0) {
            if (byte < 0x80) {
                out[n++] = byte;
            } else if (gptoss_utf8_lead_length(byte)) {
                d->pending[d->n_pending++] = byte;
            } else {
                memcpy(out + n, replacement, 3);
                n += 3;
            }
            return n;
        }
        if (gptoss_utf8_continues(d->pending, d->n_pending, byte)) {
            d->pending[d->n_pending++] = byte;
            if (d->n_pending == gptoss_utf8_lead_length(d->pending[0])) {
                memcpy(out + n, d->pending, d->n_pending);
                n += d->n_pending;
                d->n_pending = 0;
            }
            return n;
        }
        /* The held bytes can never complete: replace them, then look at this byte again. */
        memcpy(out + n, replacement, 3);
        n += 3;
        d->n_pending = 0;
    }
}

gptoss_status gptoss_stream_decoder_push(gptoss_stream_decoder *decoder, int32_t id, char *out,
                                         size_t out_capacity, size_t *out_len,
                                         gptoss_error *error) {
    *out_len = 0;
    size_t len;
    const char *bytes = gptoss_tokenizer_token_bytes(decoder->tokenizer, id, &len);
    if (!bytes)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "unknown token id %d (this tokenizer knows ids 0..%d)", id,
                                decoder->tokenizer->n_vocab - 1);
    /* Worst case: 3 bytes per input byte, plus the pending bytes as U+FFFD or a character. */
    if (out_capacity < 3 * len + 8)
        return gptoss_set_error(
            error, GPTOSS_ERR_INVALID_ARGUMENT,
            "stream decoder output buffer of %zu bytes is too small for token %d (need %zu)",
            out_capacity, id, 3 * len + 8);
    unsigned char *dst = (unsigned char *)out;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += feed_byte(decoder, (unsigned char)bytes[i], dst + n);
    *out_len = n;
    return GPTOSS_OK;
}

void gptoss_stream_decoder_flush(gptoss_stream_decoder *decoder, char *out, size_t out_capacity,
                                 size_t *out_len) {
    *out_len = 0;
    if (decoder->n_pending == 0) return;
    /* An unfinished sequence at the end is one maximal subpart: one U+FFFD. */
    if (out_capacity >= 3) {
        memcpy(out, replacement, 3);
        *out_len = 3;
    }
    decoder->n_pending = 0;
}
