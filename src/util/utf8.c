/*
 * utf8.c - UTF-8 validation helpers (see utf8.h).
 */
#include "util/utf8.h"

#include <string.h>

size_t gptoss_utf8_lead_length(unsigned char lead) {
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

int gptoss_utf8_continues(const unsigned char *seq, size_t n, unsigned char byte) {
    if (n == 1) {
        /* The second byte carries the range limits that rule out overlongs, surrogates and
         * code points above U+10FFFF. */
        switch (seq[0]) {
        case 0xE0:
            return byte >= 0xA0 && byte <= 0xBF;
        case 0xED:
            return byte >= 0x80 && byte <= 0x9F;
        case 0xF0:
            return byte >= 0x90 && byte <= 0xBF;
        case 0xF4:
            return byte >= 0x80 && byte <= 0x8F;
        default:
            break;
        }
    }
    return byte >= 0x80 && byte <= 0xBF;
}

size_t gptoss_utf8_sequence_length(const unsigned char *s, size_t avail) {
    if (avail == 0) return 0;
    if (s[0] < 0x80) return 1;
    size_t need = gptoss_utf8_lead_length(s[0]);
    if (need == 0 || avail < need) return 0;
    for (size_t i = 1; i < need; i++)
        if (!gptoss_utf8_continues(s, i, s[i])) return 0;
    return need;
}

size_t gptoss_utf8_valid_prefix(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, eight bytes at a time. */
        while (i + 8 <= len) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if (word & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t n = gptoss_utf8_sequence_length(s + i, len - i);
        if (n == 0) break;
        i += n;
    }
    return i;
}

size_t gptoss_utf8_encode(uint32_t cp, unsigned char *out) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}
