/*
 * tokenizer_internal.h - the tokenizer's data, shared by the files of src/tokenizer only.
 *
 * Owns: the layout of struct gptoss_tokenizer and the internal entry points between
 * tokenizer.c (loading, specials, decode), vocab_hash.c (bytes -> rank lookup), bpe.c (the
 * merge loop) and pretokenize.c (the regex split). Must not be included outside
 * src/tokenizer; everything else goes through tokenizer.h.
 */
#ifndef GPTOSS_TOKENIZER_INTERNAL_H
#define GPTOSS_TOKENIZER_INTERNAL_H

#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A token's bytes inside gptoss_tokenizer.pool. */
typedef struct gptoss_token_span {
    uint32_t offset; /* first byte in pool */
    uint32_t len;    /* bytes; GPTOSS_TOKEN_ABSENT for an id the file does not define */
} gptoss_token_span;

#define GPTOSS_TOKEN_ABSENT UINT32_MAX

/* One slot of the bytes -> rank hash table; both fields in one cache line fetch. */
typedef struct gptoss_vocab_slot {
    uint32_t tag;   /* upper 32 bits of the key's hash (fast reject) */
    uint32_t id_p1; /* ordinary id + 1; 0 = empty slot */
} gptoss_vocab_slot;

typedef struct gptoss_special_token {
    int32_t id;      /* token id (>= n_ordinary) */
    uint32_t offset; /* its text in pool */
    uint32_t len;    /* bytes of its text, e.g. 7 for "<|end|>" */
} gptoss_special_token;

struct gptoss_tokenizer {
    int32_t n_ordinary;       /* ordinary (BPE) tokens: ids [0, n_ordinary), id = merge rank */
    int32_t n_vocab;          /* max id + 1 over ordinary and special tokens */
    unsigned char *pool;      /* [pool_len] bytes of every token, ordinary and special */
    size_t pool_len;          /* bytes used in pool */
    gptoss_token_span *spans; /* [n_vocab] where each id's bytes are */
    bool *is_special;         /* [n_vocab] whether an id is a special token */
    gptoss_vocab_slot *slots; /* [slot_mask + 1] open-addressing table of ordinary tokens */
    uint32_t slot_mask;       /* table size - 1 (a power of two >= 2 * n_ordinary) */
    uint32_t max_token_len;   /* longest token in bytes (bounds stream decoder output) */
    int32_t byte_rank[256];   /* id of each single-byte token (all 256 must exist) */
    int32_t *pair_rank;       /* [65536] id of the two-byte token b0 b1 at b0 << 8 | b1, or -1:
                                 BPE's first pass looks up every adjacent byte pair */
    int32_t n_special;        /* special tokens */
    gptoss_special_token *specials; /* [n_special], in file order */
    void *regex;                    /* compiled pre-tokenizer (pcre2_code *) */
    bool regex_jit;                 /* whether the regex was JIT-compiled */
};

/* One token given to gptoss_tok_build. */
typedef struct gptoss_tok_source {
    int32_t id;
    const char *text; /* ordinary: GPT-2 byte-level alphabet; special: the text itself */
    size_t len;
    bool special;
} gptoss_tok_source;

/* Builds a tokenizer from a token list, with the same checks and tables as the tokenizer.json
 * loader (tokenizer_gguf.c reads GGUF vocabularies through it). */
gptoss_status gptoss_tok_build(const char *what, const gptoss_tok_source *tokens, size_t n,
                               gptoss_tokenizer **out, gptoss_error *error);

/* Loads the vocabulary of a GGUF file (tokenizer_gguf.c). */
gptoss_status gptoss_tokenizer_load_gguf(const char *path, gptoss_tokenizer **out,
                                         gptoss_error *error);

/* 64-bit hash of a byte string (fast, not cryptographic). */
uint64_t gptoss_tok_hash(const unsigned char *bytes, size_t len);

/* Rank (= id) of an ordinary token with exactly these bytes, or -1. */
int32_t gptoss_tok_rank(const gptoss_tokenizer *tok, const unsigned char *bytes, size_t len);

/* The same, given hash = gptoss_tok_hash(bytes, len) (for callers that reuse the hash). */
int32_t gptoss_tok_rank_hashed(const gptoss_tokenizer *tok, const unsigned char *bytes, size_t len,
                               uint64_t hash);

/* Inserts ordinary token `id` (bytes already in the pool) into the table; false when a token
 * with the same bytes is already there (a duplicate vocabulary entry). */
bool gptoss_tok_hash_insert(gptoss_tokenizer *tok, int32_t id);

/* Appends the BPE ids of one pre-token piece (1 or more bytes) to out. */
gptoss_status gptoss_tok_bpe(const gptoss_tokenizer *tok, const unsigned char *piece, size_t len,
                             gptoss_tokens *out, gptoss_error *error);

/* Compiles the o200k pre-tokenizer regex into tok->regex. */
gptoss_status gptoss_tok_regex_compile(gptoss_tokenizer *tok, gptoss_error *error);
void gptoss_tok_regex_free(gptoss_tokenizer *tok);

/* The o200k pre-tokenizer pattern (spec 5.2) as PCRE2 source. */
extern const char gptoss_tok_o200k_pattern[];

/* Receives one pre-token piece. */
typedef gptoss_status (*gptoss_tok_piece_fn)(void *user, const unsigned char *piece, size_t len,
                                             gptoss_error *error);

/* Splits text into pre-token pieces: valid UTF-8 runs by the o200k regex (with the ASCII fast
 * path when ascii_fast_path, else PCRE2 alone, which tests use as the reference), each
 * maximal run of invalid bytes as one piece. */
gptoss_status gptoss_tok_split(const gptoss_tokenizer *tok, const unsigned char *text, size_t len,
                               bool ascii_fast_path, gptoss_tok_piece_fn fn, void *user,
                               gptoss_error *error);

/* Encodes text without special tokens: valid UTF-8 runs are split by the regex, bytes that are
 * not valid UTF-8 form their own pieces; each piece goes through BPE. */
gptoss_status gptoss_tok_encode_ordinary(const gptoss_tokenizer *tok, const unsigned char *text,
                                         size_t len, gptoss_tokens *out, gptoss_error *error);

/* Fast push used on the hot path (gptoss_tokens_push is the public one). */
static inline gptoss_status gptoss_tok_push(gptoss_tokens *tokens, int32_t id,
                                            gptoss_error *error) {
    if (tokens->n < tokens->capacity) {
        tokens->ids[tokens->n++] = id;
        return GPTOSS_OK;
    }
    return gptoss_tokens_push(tokens, id, error);
}

#endif
