/*
 * tokenizer.c - loading tokenizer.json, the special tokens, and whole-sequence decoding.
 *
 * Owns: the gptoss_tokenizer object (allocation, validation of everything read from the
 * file, freeing) and gptoss_tokens. Reads tokenizer.json with the scanner in json_scan.c:
 * model.vocab (GPT-2 byte-alphabet strings -> ids), added_tokens (the specials), and the
 * pre-tokenizer regex (only to check it is the o200k one we implement). model.merges is
 * validated as JSON and otherwise ignored: as in tiktoken, merge priority is the rank (id) of
 * the merged token, which the vocabulary already gives.
 * Must not: print, or accept a file it cannot fully vouch for.
 */
#include "tokenizer/tokenizer_internal.h"

#include "format/gguf.h"
#include "util/json_scan.h"
#include "util/utf8.h"
#include "util/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Ids beyond these are rejected: they would only make the id-indexed tables huge. */
enum {
    MAX_ORDINARY_ID = 1 << 22,
    MAX_SPECIAL_ID = (1 << 22) + (1 << 20),
    MAX_TOKEN_BYTES = 1 << 16,
    MAX_FILE_BYTES = 1 << 30,
};

/* ---------------------------------------------------------------------------------------- */
/* gptoss_tokens                                                                              */
/* ---------------------------------------------------------------------------------------- */

gptoss_status gptoss_tokens_push(gptoss_tokens *tokens, int32_t id, gptoss_error *error) {
    if (tokens->n == tokens->capacity) {
        size_t cap = tokens->capacity ? tokens->capacity * 2 : 64;
        int32_t *grown = realloc(tokens->ids, cap * sizeof *grown);
        if (!grown)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                    "out of memory growing a token list to %zu ids", cap);
        tokens->ids = grown;
        tokens->capacity = cap;
    }
    tokens->ids[tokens->n++] = id;
    return GPTOSS_OK;
}

void gptoss_tokens_free(gptoss_tokens *tokens) {
    if (!tokens) return;
    free(tokens->ids);
    tokens->ids = NULL;
    tokens->n = tokens->capacity = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The GPT-2 byte-level alphabet (spec 5.4)                                                    */
/* ---------------------------------------------------------------------------------------- */

/* code point -> byte for code points below 0x144; -1 where no byte maps there. */
static void byte_alphabet_inverse(int16_t inverse[0x144]) {
    for (int i = 0; i < 0x144; i++)
        inverse[i] = -1;
    int next = 0;
    for (int b = 0; b < 256; b++) {
        bool printable =
            (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        if (printable) {
            inverse[b] = (int16_t)b;
        } else {
            inverse[0x100 + next] = (int16_t)b;
            next++;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Loading                                                                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct vocab_entry {
    int32_t id;      /* id from the file */
    uint32_t offset; /* bytes in the pool */
    uint32_t len;    /* byte count */
} vocab_entry;

typedef struct loader {
    gptoss_jscan scan;     /* cursor over the file */
    gptoss_tokenizer *tok; /* being built */
    size_t pool_cap;       /* bytes allocated for tok->pool */
    vocab_entry *vocab;    /* [n_vocab_entries] ordinary entries in file order */
    size_t n_vocab_entries;
    size_t vocab_cap;
    bool have_model, have_vocab, have_added;
    int16_t alphabet[0x144]; /* byte-level alphabet inverse */
} loader;

static gptoss_status pool_append(loader *ld, const void *bytes, size_t len, uint32_t *offset,
                                 gptoss_error *error) {
    gptoss_tokenizer *tok = ld->tok;
    if (tok->pool_len + len > UINT32_MAX)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: token bytes exceed 4 GiB",
                                ld->scan.what);
    if (tok->pool_len + len > ld->pool_cap) {
        size_t cap = ld->pool_cap ? ld->pool_cap : (1u << 20);
        while (cap < tok->pool_len + len)
            cap *= 2;
        unsigned char *grown = realloc(tok->pool, cap);
        if (!grown)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s",
                                    ld->scan.what);
        tok->pool = grown;
        ld->pool_cap = cap;
    }
    memcpy(tok->pool + tok->pool_len, bytes, len);
    *offset = (uint32_t)tok->pool_len;
    tok->pool_len += len;
    return GPTOSS_OK;
}

/* Converts a byte-level alphabet string to raw bytes in place (the raw form is never longer).
 * Returns SIZE_MAX, or the byte offset of the first character outside the alphabet. The input
 * must be valid UTF-8. */
static size_t unmap_bytes(const int16_t *alphabet, unsigned char *buf, size_t n_in,
                          size_t *n_out_ret) {
    size_t n_out = 0;
    for (size_t i = 0; i < n_in;) {
        uint32_t cp;
        size_t len = gptoss_utf8_sequence_length(buf + i, n_in - i);
        if (len == 0) return i;
        if (len == 1)
            cp = buf[i];
        else if (len == 2)
            cp = ((uint32_t)(buf[i] & 0x1F) << 6) | (buf[i + 1] & 0x3F);
        else
            cp = 0x144; /* 3- and 4-byte sequences are all above the alphabet */
        if (cp >= 0x144 || alphabet[cp] < 0) return i;
        buf[n_out++] = (unsigned char)alphabet[cp];
        i += len;
    }
    *n_out_ret = n_out;
    return SIZE_MAX;
}

/* Converts the scanner's current string from the byte-level alphabet to raw bytes, in place. */
static gptoss_status unmap_byte_alphabet(loader *ld, gptoss_error *error) {
    gptoss_jscan *scan = &ld->scan;
    size_t n_out = 0;
    size_t bad =
        unmap_bytes(ld->alphabet, (unsigned char *)scan->scratch, scan->scratch_len, &n_out);
    if (bad != SIZE_MAX)
        return gptoss_jscan_fail(scan, error,
                                 "vocab key \"%.40s\" has a character (at byte %zu) outside "
                                 "the byte-level alphabet; "
                                 "tokenizer.json vocab keys must be GPT-2 byte-level strings",
                                 scan->scratch, bad);
    scan->scratch_len = n_out;
    return GPTOSS_OK;
}

/* Appends one ordinary token (raw bytes) to the vocab being read. */
static gptoss_status add_vocab_entry(loader *ld, int32_t id, const void *bytes, size_t len,
                                     gptoss_error *error) {
    if (ld->n_vocab_entries == ld->vocab_cap) {
        size_t cap = ld->vocab_cap ? ld->vocab_cap * 2 : 1u << 18;
        vocab_entry *grown = realloc(ld->vocab, cap * sizeof *grown);
        if (!grown)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s",
                                    ld->scan.what);
        ld->vocab = grown;
        ld->vocab_cap = cap;
    }
    vocab_entry *entry = &ld->vocab[ld->n_vocab_entries++];
    entry->id = id;
    entry->len = (uint32_t)len;
    return pool_append(ld, bytes, len, &entry->offset, error);
}

/* Appends one special token (its text) to the specials being read. */
static gptoss_status add_special(loader *ld, int32_t id, const void *text, size_t len, size_t *cap,
                                 gptoss_error *error) {
    gptoss_tokenizer *tok = ld->tok;
    uint32_t offset;
    gptoss_status st = pool_append(ld, text, len, &offset, error);
    if (st) return st;
    if ((size_t)tok->n_special == *cap) {
        *cap = *cap ? *cap * 2 : 32;
        gptoss_special_token *grown = realloc(tok->specials, *cap * sizeof *grown);
        if (!grown)
            return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s",
                                    ld->scan.what);
        tok->specials = grown;
    }
    tok->specials[tok->n_special++] = (gptoss_special_token){id, offset, (uint32_t)len};
    return GPTOSS_OK;
}

static gptoss_status read_vocab(loader *ld, gptoss_error *error) {
    gptoss_jscan *scan = &ld->scan;
    if (ld->have_vocab)
        return gptoss_jscan_fail(scan, error, "\"vocab\" appears twice in \"model\"");
    ld->have_vocab = true;
    if (gptoss_jscan_peek(scan) != '{')
        return gptoss_jscan_fail(scan, error, "\"model.vocab\" must be an object of string -> id");
    bool more;
    gptoss_status st = gptoss_jscan_object_begin(scan, &more, error);
    while (!st && more) {
        if ((st = gptoss_jscan_key(scan, error))) break;
        if (scan->scratch_len == 0) {
            st = gptoss_jscan_fail(scan, error, "empty vocab key");
            break;
        }
        if ((st = unmap_byte_alphabet(ld, error))) break;
        if (scan->scratch_len > MAX_TOKEN_BYTES) {
            st = gptoss_jscan_fail(scan, error,
                                   "vocab key of %zu bytes is longer than the %d allowed",
                                   scan->scratch_len, MAX_TOKEN_BYTES);
            break;
        }
        int64_t id;
        if ((st = gptoss_jscan_int(scan, 0, MAX_ORDINARY_ID - 1, &id, error))) {
            if (error) gptoss_error_prefix(error, "vocab id: ");
            break;
        }
        if ((st = add_vocab_entry(ld, (int32_t)id, scan->scratch, scan->scratch_len, error))) break;
        st = gptoss_jscan_object_next(scan, &more, error);
    }
    return st;
}

static gptoss_status read_model(loader *ld, gptoss_error *error) {
    gptoss_jscan *scan = &ld->scan;
    if (ld->have_model) return gptoss_jscan_fail(scan, error, "\"model\" appears twice");
    ld->have_model = true;
    if (gptoss_jscan_peek(scan) != '{')
        return gptoss_jscan_fail(scan, error, "\"model\" must be an object");
    bool more;
    gptoss_status st = gptoss_jscan_object_begin(scan, &more, error);
    while (!st && more) {
        if ((st = gptoss_jscan_key(scan, error))) break;
        if (gptoss_jscan_scratch_is(scan, "vocab")) {
            st = read_vocab(ld, error);
        } else if (gptoss_jscan_scratch_is(scan, "type")) {
            if (gptoss_jscan_peek(scan) != '"') {
                st = gptoss_jscan_fail(scan, error, "\"model.type\" must be a string");
                break;
            }
            if ((st = gptoss_jscan_string(scan, error))) break;
            if (!gptoss_jscan_scratch_is(scan, "BPE")) {
                char type[64];
                snprintf(type, sizeof type, "%s", scan->scratch);
                st = gptoss_set_error(
                    error, GPTOSS_ERR_UNSUPPORTED,
                    "%s: model.type is \"%s\"; only byte-level \"BPE\" (o200k) is supported",
                    scan->what, type);
            }
        } else {
            /* merges, dropout, ignore_merges, ...: validated as JSON, not needed (see top). */
            st = gptoss_jscan_skip(scan, error);
        }
        if (st) break;
        st = gptoss_jscan_object_next(scan, &more, error);
    }
    return st;
}

typedef struct added_token {
    int64_t id;      /* -1 until read */
    uint32_t offset; /* content bytes in the pool */
    uint32_t len;
    bool has_content;
} added_token;

static gptoss_status read_added_tokens(loader *ld, gptoss_error *error) {
    gptoss_jscan *scan = &ld->scan;
    gptoss_tokenizer *tok = ld->tok;
    if (ld->have_added) return gptoss_jscan_fail(scan, error, "\"added_tokens\" appears twice");
    ld->have_added = true;
    if (gptoss_jscan_peek(scan) != '[')
        return gptoss_jscan_fail(scan, error, "\"added_tokens\" must be an array");
    bool more;
    size_t cap = 0;
    gptoss_status st = gptoss_jscan_array_begin(scan, &more, error);
    while (!st && more) {
        if (gptoss_jscan_peek(scan) != '{')
            return gptoss_jscan_fail(
                scan, error, "each added token must be an object with \"id\" and \"content\"");
        added_token added = {.id = -1};
        bool more_fields;
        if ((st = gptoss_jscan_object_begin(scan, &more_fields, error))) return st;
        while (more_fields) {
            if ((st = gptoss_jscan_key(scan, error))) return st;
            if (gptoss_jscan_scratch_is(scan, "id")) {
                if ((st = gptoss_jscan_int(scan, 0, MAX_SPECIAL_ID - 1, &added.id, error))) {
                    if (error) gptoss_error_prefix(error, "added token id: ");
                    return st;
                }
            } else if (gptoss_jscan_scratch_is(scan, "content")) {
                if (gptoss_jscan_peek(scan) != '"')
                    return gptoss_jscan_fail(scan, error,
                                             "added token \"content\" must be a string");
                if ((st = gptoss_jscan_string(scan, error))) return st;
                if (scan->scratch_len == 0)
                    return gptoss_jscan_fail(scan, error, "added token with empty \"content\"");
                if (scan->scratch_len > MAX_TOKEN_BYTES)
                    return gptoss_jscan_fail(scan, error, "added token content is too long");
                if ((st = pool_append(ld, scan->scratch, scan->scratch_len, &added.offset, error)))
                    return st;
                added.len = (uint32_t)scan->scratch_len;
                added.has_content = true;
            } else {
                if ((st = gptoss_jscan_skip(scan, error))) return st;
            }
            if ((st = gptoss_jscan_object_next(scan, &more_fields, error))) return st;
        }
        if (added.id < 0 || !added.has_content)
            return gptoss_jscan_fail(scan, error, "added token #%d lacks %s", tok->n_special,
                                     added.id < 0 ? "\"id\"" : "\"content\"");
        if ((size_t)tok->n_special == cap) {
            cap = cap ? cap * 2 : 32;
            gptoss_special_token *grown = realloc(tok->specials, cap * sizeof *grown);
            if (!grown)
                return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s",
                                        scan->what);
            tok->specials = grown;
        }
        tok->specials[tok->n_special++] =
            (gptoss_special_token){(int32_t)added.id, added.offset, added.len};
        st = gptoss_jscan_array_next(scan, &more, error);
    }
    return st;
}

/* Walks the pre_tokenizer section looking for "Regex" patterns: the only one we accept is
 * the o200k pattern this tokenizer implements, so a different tokenizer.json is refused
 * rather than silently tokenized wrong. */
static gptoss_status check_pre_tokenizer(loader *ld, int depth, bool *found, gptoss_error *error) {
    gptoss_jscan *scan = &ld->scan;
    if (depth > 32) return gptoss_jscan_fail(scan, error, "\"pre_tokenizer\" is nested too deeply");
    char c = gptoss_jscan_peek(scan);
    bool more;
    gptoss_status st;
    if (c == '{') {
        if ((st = gptoss_jscan_object_begin(scan, &more, error))) return st;
        while (more) {
            if ((st = gptoss_jscan_key(scan, error))) return st;
            if (gptoss_jscan_scratch_is(scan, "Regex") && gptoss_jscan_peek(scan) == '"') {
                if ((st = gptoss_jscan_string(scan, error))) return st;
                if (!gptoss_jscan_scratch_is(scan, gptoss_tok_o200k_pattern))
                    return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                            "%s: the pre-tokenizer regex is not o200k's; only "
                                            "o200k_harmony tokenizers (gpt-oss) are supported",
                                            scan->what);
                *found = true;
            } else if ((st = check_pre_tokenizer(ld, depth + 1, found, error))) {
                return st;
            }
            if ((st = gptoss_jscan_object_next(scan, &more, error))) return st;
        }
        return GPTOSS_OK;
    }
    if (c == '[') {
        if ((st = gptoss_jscan_array_begin(scan, &more, error))) return st;
        while (more) {
            if ((st = check_pre_tokenizer(ld, depth + 1, found, error))) return st;
            if ((st = gptoss_jscan_array_next(scan, &more, error))) return st;
        }
        return GPTOSS_OK;
    }
    return gptoss_jscan_skip(scan, error);
}

static gptoss_status read_document(loader *ld, gptoss_error *error) {
    gptoss_jscan *scan = &ld->scan;
    if (gptoss_jscan_peek(scan) != '{')
        return gptoss_jscan_fail(scan, error,
                                 "not a tokenizer.json: the file must be a JSON object");
    bool more;
    gptoss_status st = gptoss_jscan_object_begin(scan, &more, error);
    while (!st && more) {
        if ((st = gptoss_jscan_key(scan, error))) break;
        if (gptoss_jscan_scratch_is(scan, "model")) {
            st = read_model(ld, error);
        } else if (gptoss_jscan_scratch_is(scan, "added_tokens")) {
            st = read_added_tokens(ld, error);
        } else if (gptoss_jscan_scratch_is(scan, "pre_tokenizer")) {
            bool found = false;
            st = check_pre_tokenizer(ld, 0, &found, error);
        } else {
            st = gptoss_jscan_skip(scan, error);
        }
        if (st) break;
        st = gptoss_jscan_object_next(scan, &more, error);
    }
    if (st) return st;
    if (gptoss_jscan_peek(scan) != 0)
        return gptoss_jscan_fail(scan, error, "unexpected data after the top-level object");
    if (!ld->have_model)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "%s: no \"model\" object (not a Hugging Face tokenizer.json?)",
                                scan->what);
    if (!ld->have_vocab)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: \"model\" has no \"vocab\"",
                                scan->what);
    return GPTOSS_OK;
}

/* Builds the id-indexed tables from what was read and checks them as a whole. */
static gptoss_status build_tables(loader *ld, gptoss_error *error) {
    gptoss_tokenizer *tok = ld->tok;
    const char *what = ld->scan.what;
    if (ld->n_vocab_entries < 256)
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "%s: the vocab has %zu entries; a byte-level BPE needs at least the 256 single bytes",
            what, ld->n_vocab_entries);
    int32_t max_id = -1;
    for (size_t i = 0; i < ld->n_vocab_entries; i++)
        if (ld->vocab[i].id > max_id) max_id = ld->vocab[i].id;
    tok->n_ordinary = max_id + 1;
    tok->n_vocab = tok->n_ordinary;
    for (int32_t i = 0; i < tok->n_special; i++) {
        if (tok->specials[i].id < tok->n_ordinary)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s: added token \"%.*s\" has id %d, which is already an "
                                    "ordinary vocab id (ordinary ids are 0..%d)",
                                    what, (int)tok->specials[i].len,
                                    (const char *)tok->pool + tok->specials[i].offset,
                                    tok->specials[i].id, tok->n_ordinary - 1);
        if (tok->specials[i].id + 1 > tok->n_vocab) tok->n_vocab = tok->specials[i].id + 1;
    }
    tok->spans = malloc((size_t)tok->n_vocab * sizeof *tok->spans);
    tok->is_special = calloc((size_t)tok->n_vocab, sizeof *tok->is_special);
    if (!tok->spans || !tok->is_special)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s", what);
    for (int32_t i = 0; i < tok->n_vocab; i++)
        tok->spans[i] = (gptoss_token_span){0, GPTOSS_TOKEN_ABSENT};
    for (size_t i = 0; i < ld->n_vocab_entries; i++) {
        const vocab_entry *e = &ld->vocab[i];
        if (tok->spans[e->id].len != GPTOSS_TOKEN_ABSENT)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s: vocab id %d is given to two different keys", what, e->id);
        tok->spans[e->id] = (gptoss_token_span){e->offset, e->len};
        if (e->len > tok->max_token_len) tok->max_token_len = e->len;
    }
    /* tiktoken ranks are dense: a hole would make an id decode to nothing. */
    for (int32_t id = 0; id < tok->n_ordinary; id++)
        if (tok->spans[id].len == GPTOSS_TOKEN_ABSENT)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s: vocab ids must be dense 0..%d but id %d is missing", what,
                                    tok->n_ordinary - 1, id);
    for (int32_t i = 0; i < tok->n_special; i++) {
        const gptoss_special_token *s = &tok->specials[i];
        if (tok->spans[s->id].len != GPTOSS_TOKEN_ABSENT)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: added token id %d appears twice",
                                    what, s->id);
        for (int32_t j = 0; j < i; j++)
            if (tok->specials[j].len == s->len &&
                memcmp(tok->pool + tok->specials[j].offset, tok->pool + s->offset, s->len) == 0)
                return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                        "%s: added token \"%.*s\" appears twice (ids %d and %d)",
                                        what, (int)s->len, (const char *)tok->pool + s->offset,
                                        tok->specials[j].id, s->id);
        tok->spans[s->id] = (gptoss_token_span){s->offset, s->len};
        tok->is_special[s->id] = true;
        if (s->len > tok->max_token_len) tok->max_token_len = s->len;
    }
    /* The hash table of ordinary tokens, at most half full. */
    uint32_t size = 1024;
    while (size < 2u * (uint32_t)tok->n_ordinary)
        size *= 2;
    tok->slot_mask = size - 1;
    tok->slots = calloc(size, sizeof *tok->slots);
    if (!tok->slots)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s", what);
    tok->pair_rank = malloc(65536 * sizeof *tok->pair_rank);
    if (!tok->pair_rank)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s", what);
    for (int i = 0; i < 65536; i++)
        tok->pair_rank[i] = -1;
    for (int i = 0; i < 256; i++)
        tok->byte_rank[i] = -1;
    for (int32_t id = 0; id < tok->n_ordinary; id++) {
        if (!gptoss_tok_hash_insert(tok, id)) {
            const gptoss_token_span *s = &tok->spans[id];
            int32_t other = gptoss_tok_rank(tok, tok->pool + s->offset, s->len);
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s: vocab ids %d and %d have the same bytes", what, other, id);
        }
        const unsigned char *bytes = tok->pool + tok->spans[id].offset;
        if (tok->spans[id].len == 1) tok->byte_rank[bytes[0]] = id;
        if (tok->spans[id].len == 2) tok->pair_rank[(unsigned)bytes[0] << 8 | bytes[1]] = id;
    }
    for (int b = 0; b < 256; b++)
        if (tok->byte_rank[b] < 0)
            return gptoss_set_error(
                error, GPTOSS_ERR_FORMAT,
                "%s: the vocab lacks the single byte 0x%02x; byte-level BPE needs all 256", what,
                b);
    return GPTOSS_OK;
}

static gptoss_status read_file(const char *path, char **data, size_t *len, gptoss_error *error) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "cannot open tokenizer %s: %s", path,
                                strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return gptoss_set_error(error, GPTOSS_ERR_IO, "tokenizer %s is not a regular file", path);
    }
    if (st.st_size > MAX_FILE_BYTES) {
        fclose(f);
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "tokenizer %s is %lld bytes; more than 1 GiB cannot be a tokenizer.json", path,
            (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    size_t got = fread(buf, 1, size, f);
    bool failed = ferror(f) != 0;
    fclose(f);
    if (failed || got != size) {
        free(buf);
        return gptoss_set_error(error, GPTOSS_ERR_IO,
                                "cannot read tokenizer %s (got %zu of %zu bytes)", path, got, size);
    }
    buf[size] = '\0';
    *data = buf;
    *len = size;
    return GPTOSS_OK;
}

gptoss_status gptoss_tokenizer_load(const char *tokenizer_json_path, gptoss_tokenizer **out,
                                    gptoss_error *error) {
    if (!tokenizer_json_path || !out)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "gptoss_tokenizer_load: NULL argument");
    *out = NULL;
    if (gptoss_gguf_sniff(tokenizer_json_path))
        return gptoss_tokenizer_load_gguf(tokenizer_json_path, out, error);
    char *data = NULL;
    size_t len = 0;
    gptoss_status st = read_file(tokenizer_json_path, &data, &len, error);
    if (st) return st;
    loader ld;
    memset(&ld, 0, sizeof ld);
    byte_alphabet_inverse(ld.alphabet);
    ld.tok = calloc(1, sizeof *ld.tok);
    if (!ld.tok) {
        free(data);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s",
                                tokenizer_json_path);
    }
    gptoss_jscan_init(&ld.scan, data, len, tokenizer_json_path);
    st = read_document(&ld, error);
    if (!st) st = build_tables(&ld, error);
    if (!st) st = gptoss_tok_regex_compile(ld.tok, error);
    gptoss_jscan_free(&ld.scan);
    free(ld.vocab);
    free(data);
    if (st) {
        gptoss_tokenizer_free(ld.tok);
        return st;
    }
    *out = ld.tok;
    return GPTOSS_OK;
}

gptoss_status gptoss_tok_build(const char *what, const gptoss_tok_source *tokens, size_t n,
                               gptoss_tokenizer **out, gptoss_error *error) {
    *out = NULL;
    loader ld;
    memset(&ld, 0, sizeof ld);
    byte_alphabet_inverse(ld.alphabet);
    ld.scan.what = what;
    ld.tok = calloc(1, sizeof *ld.tok);
    unsigned char *buf = malloc(MAX_TOKEN_BYTES);
    gptoss_status st = GPTOSS_OK;
    if (!ld.tok || !buf)
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory loading %s", what);
    size_t special_cap = 0;
    for (size_t i = 0; i < n && !st; i++) {
        const gptoss_tok_source *t = &tokens[i];
        if (t->len == 0 || t->len > MAX_TOKEN_BYTES) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: token %d has %zu bytes (1 to %d)",
                                  what, t->id, t->len, MAX_TOKEN_BYTES);
        } else if (t->id < 0 || t->id >= (t->special ? MAX_SPECIAL_ID : MAX_ORDINARY_ID)) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: token id %d is out of range", what,
                                  t->id);
        } else if (t->special) {
            st = add_special(&ld, t->id, t->text, t->len, &special_cap, error);
        } else {
            memcpy(buf, t->text, t->len);
            size_t n_out = 0;
            size_t bad = unmap_bytes(ld.alphabet, buf, t->len, &n_out);
            if (bad != SIZE_MAX)
                st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                      "%s: token %d \"%.*s\" has a character (at byte %zu) outside "
                                      "the GPT-2 byte-level alphabet",
                                      what, t->id, (int)(t->len > 40 ? 40 : t->len), t->text, bad);
            else
                st = add_vocab_entry(&ld, t->id, buf, n_out, error);
        }
    }
    free(buf);
    if (!st) st = build_tables(&ld, error);
    if (!st) st = gptoss_tok_regex_compile(ld.tok, error);
    free(ld.vocab);
    if (st) {
        gptoss_tokenizer_free(ld.tok);
        return st;
    }
    *out = ld.tok;
    return GPTOSS_OK;
}

void gptoss_tokenizer_free(gptoss_tokenizer *tok) {
    if (!tok) return;
    gptoss_tok_regex_free(tok);
    free(tok->pool);
    free(tok->spans);
    free(tok->is_special);
    free(tok->slots);
    free(tok->pair_rank);
    free(tok->specials);
    free(tok);
}

/* ---------------------------------------------------------------------------------------- */
/* Queries and decoding                                                                       */
/* ---------------------------------------------------------------------------------------- */

int32_t gptoss_tokenizer_n_vocab(const gptoss_tokenizer *tok) {
    return tok->n_vocab;
}

int32_t gptoss_tokenizer_n_ordinary(const gptoss_tokenizer *tok) {
    return tok->n_ordinary;
}

size_t gptoss_tokenizer_max_token_bytes(const gptoss_tokenizer *tok) {
    return tok->max_token_len;
}

const char *gptoss_tokenizer_token_bytes(const gptoss_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab || tok->spans[id].len == GPTOSS_TOKEN_ABSENT) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = tok->spans[id].len;
    return (const char *)tok->pool + tok->spans[id].offset;
}

int32_t gptoss_tokenizer_special_id(const gptoss_tokenizer *tok, const char *text) {
    size_t n = strlen(text);
    for (int32_t i = 0; i < tok->n_special; i++)
        if (tok->specials[i].len == n && memcmp(tok->pool + tok->specials[i].offset, text, n) == 0)
            return tok->specials[i].id;
    return -1;
}

bool gptoss_tokenizer_is_special(const gptoss_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_vocab && tok->is_special[id];
}

gptoss_status gptoss_tokenizer_decode(const gptoss_tokenizer *tok, const int32_t *ids, size_t n,
                                      char **text, size_t *len, gptoss_error *error) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_vocab || tok->spans[id].len == GPTOSS_TOKEN_ABSENT)
            return gptoss_set_error(
                error, GPTOSS_ERR_INVALID_ARGUMENT,
                "unknown token id %d at position %zu (this tokenizer knows ids 0..%d)", id, i,
                tok->n_vocab - 1);
        total += tok->spans[id].len;
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory decoding %zu tokens", n);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const gptoss_token_span *s = &tok->spans[ids[i]];
        memcpy(buf + at, tok->pool + s->offset, s->len);
        at += s->len;
    }
    buf[at] = '\0';
    *text = buf;
    *len = at;
    return GPTOSS_OK;
}
