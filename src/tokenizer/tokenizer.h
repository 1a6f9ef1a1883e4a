/*
 * tokenizer.h - o200k_harmony byte-level BPE, loaded from a model folder's tokenizer.json.
 *
 * Owns: the vocabulary (token id -> bytes), the rank table used for merges, the special
 * tokens, and the compiled pre-tokenizer regex. Knows nothing of chat formats (chat/ does)
 * or of models (model/ does).
 *
 * Ids: ordinary tokens are 0..199997 (id = merge rank); special tokens start at 199998.
 */
#ifndef GPTOSS_TOKENIZER_H
#define GPTOSS_TOKENIZER_H

#include "gptoss.h"
#include "model/special_tokens.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Special token ids of o200k_harmony: model/special_tokens.h (GPTOSS_TOKEN_*). */

typedef struct gptoss_tokenizer gptoss_tokenizer;

/* A growable array of token ids. Zero-initialize; free with gptoss_tokens_free. */
typedef struct gptoss_tokens {
    int32_t *ids;    /* [n] */
    size_t n;        /* ids in use */
    size_t capacity; /* ids allocated */
} gptoss_tokens;

gptoss_status gptoss_tokens_push(gptoss_tokens *tokens, int32_t id, gptoss_error *error);
void gptoss_tokens_free(gptoss_tokens *tokens);

/* Loads tokenizer.json (the file's path, not the folder). Validates it and reports what is
 * wrong with a corrupt file: JSON syntax (with line:column), a missing model/vocab, vocab keys
 * outside the byte-level alphabet, duplicate or missing ids, duplicate token bytes, added
 * tokens colliding with vocab ids, a pre-tokenizer regex other than o200k's. All added_tokens
 * are treated as special tokens. A missing file is GPTOSS_ERR_IO. Thread-safe to use
 * concurrently once loaded (nothing below mutates it). */
gptoss_status gptoss_tokenizer_load(const char *tokenizer_json_path, gptoss_tokenizer **out,
                                    gptoss_error *error);
/* A GGUF file given to gptoss_tokenizer_load is read instead from its tokenizer.ggml.* metadata
 * (tokenizer_gguf.c): the same tokenizer, id for id, as its model's tokenizer.json. */

/* Where the tokenizer of a model path is: the file itself for a GGUF file, else
 * MODEL/tokenizer.json. False if it does not fit in size bytes. */
bool gptoss_tokenizer_path_for_model(const char *model_path, char *out, size_t size);
void gptoss_tokenizer_free(gptoss_tokenizer *tokenizer);

/* Number of token ids the tokenizer knows (ordinary + special), i.e. max id + 1. */
int32_t gptoss_tokenizer_n_vocab(const gptoss_tokenizer *tokenizer);

/* Number of ordinary (BPE) tokens: ids 0..n-1 (199998 for o200k_harmony). */
int32_t gptoss_tokenizer_n_ordinary(const gptoss_tokenizer *tokenizer);

/* Length in bytes of the longest token, ordinary or special. */
size_t gptoss_tokenizer_max_token_bytes(const gptoss_tokenizer *tokenizer);

/* Appends the ids of text[0..len) to *out. When allow_special is true, special-token strings
 * such as "<|start|>" in the text become their ids; otherwise they are encoded as ordinary
 * text. Text that is not valid UTF-8 is still encoded (never an error): each maximal run of
 * invalid bytes is its own BPE piece, so decode(encode(x)) == x for any bytes. Errors only on
 * out-of-memory or text of 4 GiB or more; *out is then left as it was. */
gptoss_status gptoss_tokenizer_encode(const gptoss_tokenizer *tokenizer, const char *text,
                                      size_t len, bool allow_special, gptoss_tokens *out,
                                      gptoss_error *error);

/* The bytes of one token (special tokens give their literal text). NULL for an unknown id. */
const char *gptoss_tokenizer_token_bytes(const gptoss_tokenizer *tokenizer, int32_t id,
                                         size_t *len);

/* Id of a special token by its text ("<|call|>"), or -1. */
int32_t gptoss_tokenizer_special_id(const gptoss_tokenizer *tokenizer, const char *text);

/* Whether id is a special token. */
bool gptoss_tokenizer_is_special(const gptoss_tokenizer *tokenizer, int32_t id);

/* Decodes ids to bytes (malloc'd, NUL-terminated for convenience; *len excludes the NUL).
 * Unknown ids are an error naming the id. */
gptoss_status gptoss_tokenizer_decode(const gptoss_tokenizer *tokenizer, const int32_t *ids,
                                      size_t n, char **text, size_t *len, gptoss_error *error);

/* Incremental decoder for streaming: feed ids one at a time, get only complete UTF-8 text.
 * Bytes of an incomplete sequence are held until completed; bytes that can never become
 * valid UTF-8 are emitted as U+FFFD. Flush at the end emits whatever is held (as U+FFFD if
 * incomplete). Never loses bytes of valid text. */
typedef struct gptoss_stream_decoder {
    const gptoss_tokenizer *tokenizer;
    unsigned char pending[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t n_pending;
} gptoss_stream_decoder;

void gptoss_stream_decoder_init(gptoss_stream_decoder *decoder, const gptoss_tokenizer *tokenizer);

/* An output capacity that suffices for gptoss_stream_decoder_push with any token. */
size_t gptoss_stream_decoder_out_capacity(const gptoss_tokenizer *tokenizer);

/* Writes the text completed by `id` to out[0..*out_len) (out has out_capacity bytes; 3 times
 * the token's length + 8 always suffices, and gptoss_stream_decoder_out_capacity() for any
 * token). An unknown id or a too-small buffer is an error and changes nothing. */
gptoss_status gptoss_stream_decoder_push(gptoss_stream_decoder *decoder, int32_t id, char *out,
                                         size_t out_capacity, size_t *out_len, gptoss_error *error);
/* Writes a U+FFFD for held bytes of an unfinished sequence (out needs 3 bytes) and resets. */
void gptoss_stream_decoder_flush(gptoss_stream_decoder *decoder, char *out, size_t out_capacity,
                                 size_t *out_len);

#endif
