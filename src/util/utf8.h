/*
 * utf8.h - UTF-8 validation helpers shared by the JSON scanner, the tokenizer and the server.
 *
 * Owns: the one definition of "valid UTF-8" the project uses (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), which is also what PCRE2 requires of its subjects.
 * Must not: allocate or print.
 */
#ifndef GPTOSS_UTIL_UTF8_H
#define GPTOSS_UTIL_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the valid UTF-8 sequence starting at s[0] within s[0..avail), or 0 when
 * the bytes there are not (or not yet, if avail is short) a complete valid sequence. */
size_t gptoss_utf8_sequence_length(const unsigned char *s, size_t avail);

/* Length of the longest valid UTF-8 prefix of s[0..len). */
size_t gptoss_utf8_valid_prefix(const unsigned char *s, size_t len);

/* Expected total length (2..4) of a sequence whose lead byte is `lead`, or 0 when `lead` can
 * never start a multi-byte sequence (ASCII, continuation bytes, C0, C1, F5..FF). */
size_t gptoss_utf8_lead_length(unsigned char lead);

/* Whether `byte` may follow the bytes seq[0..n) (n >= 1, seq[0] a valid lead) in a valid
 * sequence. Encodes the second-byte limits of E0, ED, F0 and F4. */
int gptoss_utf8_continues(const unsigned char *seq, size_t n, unsigned char byte);

/* Writes the UTF-8 encoding of code point cp (<= 0x10FFFF) to out; returns its length. */
size_t gptoss_utf8_encode(uint32_t cp, unsigned char *out);

#endif
