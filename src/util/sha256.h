/*
 * sha256.h - SHA-256 (FIPS 180-4), incremental. Used to fingerprint checkpoints and, where a
 * strong hash is needed, cache keys.
 */
#ifndef GPTOSS_UTIL_SHA256_H
#define GPTOSS_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define GPTOSS_SHA256_BYTES 32

typedef struct gptoss_sha256 {
    uint32_t state[8]; /* running hash */
    uint64_t n_bytes;  /* message length so far */
    uint8_t block[64]; /* pending partial block */
    size_t n_block;    /* bytes in block */
} gptoss_sha256;

void gptoss_sha256_init(gptoss_sha256 *h);
void gptoss_sha256_update(gptoss_sha256 *h, const void *data, size_t len);
void gptoss_sha256_final(gptoss_sha256 *h, uint8_t digest[32]);
/* digest = SHA-256(data[0..len)). */
void gptoss_sha256_digest(const void *data, size_t len, uint8_t digest[32]);
/* Lower-case hex of a digest into out[65]. */
void gptoss_sha256_hex(const uint8_t digest[32], char out[65]);

#endif
