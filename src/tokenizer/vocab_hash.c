/*
 * vocab_hash.c - the bytes -> rank table of the ordinary vocabulary.
 *
 * Open addressing with linear probing over a power-of-two table at most half full. Each slot
 * keeps the id (+1, so 0 means empty) and 32 more bits of the hash, so a probe rarely has to
 * compare bytes it will not match. Owns nothing but the lookup; tokenizer.c allocates and
 * frees the arrays.
 */
#include "tokenizer/tokenizer_internal.h"

#include <string.h>

uint64_t gptoss_tok_hash(const unsigned char *bytes, size_t len) {
    /* Eight bytes per multiply; the final avalanche spreads every input bit over the word,
     * since the table uses the low bits for the slot and the high bits for the tag. */
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)len * 0xC2B2AE3D27D4EB4Full);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, bytes + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    if (i < len) {
        uint64_t w = 0;
        memcpy(&w, bytes + i, len - i);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    }
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
}

int32_t gptoss_tok_rank_hashed(const gptoss_tokenizer *tok, const unsigned char *bytes, size_t len,
                               uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t slot = (uint32_t)h & tok->slot_mask;; slot = (slot + 1) & tok->slot_mask) {
        gptoss_vocab_slot entry = tok->slots[slot];
        if (entry.id_p1 == 0) return -1;
        if (entry.tag != tag) continue;
        const gptoss_token_span *span = &tok->spans[entry.id_p1 - 1];
        if (span->len == len && memcmp(tok->pool + span->offset, bytes, len) == 0)
            return (int32_t)(entry.id_p1 - 1);
    }
}

int32_t gptoss_tok_rank(const gptoss_tokenizer *tok, const unsigned char *bytes, size_t len) {
    if (len == 1) return tok->byte_rank[bytes[0]];
    if (len == 2) return tok->pair_rank[(unsigned)bytes[0] << 8 | bytes[1]];
    if (len > tok->max_token_len) return -1;
    return gptoss_tok_rank_hashed(tok, bytes, len, gptoss_tok_hash(bytes, len));
}

bool gptoss_tok_hash_insert(gptoss_tokenizer *tok, int32_t id) {
    const gptoss_token_span *span = &tok->spans[id];
    const unsigned char *bytes = tok->pool + span->offset;
    uint64_t h = gptoss_tok_hash(bytes, span->len);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t slot = (uint32_t)h & tok->slot_mask;; slot = (slot + 1) & tok->slot_mask) {
        gptoss_vocab_slot *entry = &tok->slots[slot];
        if (entry->id_p1 == 0) {
            entry->id_p1 = (uint32_t)id + 1;
            entry->tag = tag;
            return true;
        }
        if (entry->tag != tag) continue;
        const gptoss_token_span *other = &tok->spans[entry->id_p1 - 1];
        if (other->len == span->len && memcmp(tok->pool + other->offset, bytes, span->len) == 0)
            return false;
    }
}
