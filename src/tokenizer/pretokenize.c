/*
 * pretokenize.c - the o200k pre-tokenizer: splitting text into pieces with the regex of spec
 * section 5.2 (PCRE2, Unicode properties, JIT), then handing each piece to BPE.
 *
 * Owns: the compiled regex and the ordinary-text encoding loop. PCRE2 only accepts valid
 * UTF-8, so the text is cut into maximal valid runs first; each run of invalid bytes becomes
 * one piece of its own (tiktoken never sees such text since it takes Rust strings, so this
 * is our definition: it is lossless and never an error).
 * Must not: know about special tokens (encode.c splits them out before calling here).
 */
#include "tokenizer/tokenizer_internal.h"

#include "util/utf8.h"
#include "util/error.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* Spec 5.2, character for character as tokenizer.json's pre_tokenizer "Regex" holds it. */
const char gptoss_tok_o200k_pattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'"
    "s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:"
    "'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/*
 * The same pattern as PCRE2 compiles it. tiktoken runs it with Rust's regex engine, where \s
 * is the Unicode White_Space property; PCRE2's \s (even with UCP) leaves out U+0085 NEXT
 * LINE, so White_Space is spelled out here. (JavaScript's \s differs the other way: it adds
 * U+FEFF, which is why gpt-tokenizer disagrees with tiktoken on U+FEFF; see
 * tests/tokenizer/test_pretokenize.c.)
 */
#define WHITE_SPACE                                                                                \
    "\\t-\\r "                                                                                     \
    "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char pcre2_pattern[] = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*["
                                    "\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                                    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+["
                                    "\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                                    "|\\p{N}{1,3}"
                                    "| ?[^" WHITE_SPACE "\\p{L}\\p{N}]+[\\r\\n/]*"
                                    "|[" WHITE_SPACE "]*[\\r\\n]+"
                                    "|[" WHITE_SPACE "]+(?![^" WHITE_SPACE "])"
                                    "|[" WHITE_SPACE "]+";

gptoss_status gptoss_tok_regex_compile(gptoss_tokenizer *tok, gptoss_error *error) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pcre2_pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &code, &offset, NULL);
    if (!re) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(code, message, sizeof message);
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "cannot compile the o200k pre-tokenizer regex at offset %zu: %s "
                                "(PCRE2 built without Unicode support?)",
                                (size_t)offset, (const char *)message);
    }
    /* JIT is an optimization: without it (e.g. an SELinux-restricted system) the interpreter
     * gives the same matches, only slower. */
    tok->regex_jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    tok->regex = re;
    return GPTOSS_OK;
}

void gptoss_tok_regex_free(gptoss_tokenizer *tok) {
    pcre2_code_free((pcre2_code *)tok->regex);
    tok->regex = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* ASCII fast path                                                                            */
/* ---------------------------------------------------------------------------------------- */

/*
 * Most text is ASCII, and for ASCII the seven alternatives reduce to a few character-class
 * scans. ascii_piece() computes the piece the regex would match at `at` using only ASCII
 * bytes before `ascii_end`; whenever the answer could depend on a character at or past
 * ascii_end (a non-ASCII letter, digit, space or mark might continue a run, or "ſ" might
 * complete a contraction) it returns 0 and the caller asks PCRE2. Subject end (len) is
 * known, not unknown. Agreement with PCRE2 is tested on random ASCII strings
 * (tests/tokenizer/test_pretokenize.c) and with gpt-tokenizer on the corpus.
 */
enum { C_UPPER = 1, C_LOWER, C_DIGIT, C_SPACE, C_NEWLINE, C_OTHER, C_END, C_UNKNOWN };

static inline int ascii_class(const unsigned char *s, size_t j, size_t len, size_t ascii_end) {
    if (j >= len) return C_END;
    if (j >= ascii_end) return C_UNKNOWN;
    unsigned char c = s[j];
    if (c >= 'a' && c <= 'z') return C_LOWER;
    if (c >= 'A' && c <= 'Z') return C_UPPER;
    if (c >= '0' && c <= '9') return C_DIGIT;
    if (c == '\n' || c == '\r') return C_NEWLINE;
    if (c == ' ' || c == '\t' || c == '\v' || c == '\f') return C_SPACE; /* Unicode White_Space */
    return C_OTHER; /* punctuation, symbols and the remaining control characters */
}

/* The optional (?i:'s|'t|'re|'ve|'m|'ll|'d) at k: returns the end, or 0 to defer. */
static inline size_t contraction(const unsigned char *s, size_t k, size_t len, size_t ascii_end) {
    int c = ascii_class(s, k, len, ascii_end);
    if (c == C_UNKNOWN) return 0;
    if (c != C_OTHER || s[k] != '\'') return k;
    int c1 = ascii_class(s, k + 1, len, ascii_end);
    if (c1 == C_UNKNOWN) return 0;
    if (c1 != C_UPPER && c1 != C_LOWER) return k;
    unsigned char l = (unsigned char)(s[k + 1] | 0x20);
    if (l == 's' || l == 't' || l == 'm' || l == 'd') return k + 2;
    unsigned char want = l == 'r' || l == 'v' ? 'e' : l == 'l' ? 'l' : 0;
    if (!want) return k;
    int c2 = ascii_class(s, k + 2, len, ascii_end);
    if (c2 == C_UNKNOWN) return 0;
    if ((c2 == C_UPPER || c2 == C_LOWER) && (s[k + 2] | 0x20) == want) return k + 3;
    return k;
}

static size_t ascii_piece(const unsigned char *s, size_t at, size_t len, size_t ascii_end) {
#define CLS(j) ascii_class(s, (j), len, ascii_end)
    int c = CLS(at);
    size_t k;
    /* 1 and 2: [^\r\n\p{L}\p{N}]? [upper]* [lower]+ contraction? | ... [upper]+ [lower]* ... */
    if (c == C_UPPER || c == C_LOWER || c == C_SPACE || c == C_OTHER) {
        size_t first = (c == C_UPPER || c == C_LOWER) ? at : at + 1;
        k = first;
        int ck;
        while ((ck = CLS(k)) == C_UPPER)
            k++;
        if (ck == C_UNKNOWN) return 0;
        if (ck == C_LOWER) {
            while ((ck = CLS(k)) == C_LOWER)
                k++;
            if (ck == C_UNKNOWN) return 0;
            return contraction(s, k, len, ascii_end);
        }
        if (k > first) return contraction(s, k, len, ascii_end);
        /* The prefix character was not followed by a letter: neither alternative matches. */
    }
    /* 3: \p{N}{1,3} */
    if (c == C_DIGIT) {
        k = at;
        int ck = C_DIGIT;
        while (k < at + 3 && (ck = CLS(k)) == C_DIGIT)
            k++;
        if (k < at + 3 && ck == C_UNKNOWN) return 0;
        return k;
    }
    /* 4: " ?[^\s\p{L}\p{N}]+[\r\n/]*" */
    size_t p = at;
    if (s[at] == ' ') {
        int c1 = CLS(at + 1);
        if (c1 == C_UNKNOWN) return 0;
        if (c1 == C_OTHER) p = at + 1;
    }
    if (CLS(p) == C_OTHER) {
        int ck;
        k = p;
        while ((ck = CLS(k)) == C_OTHER)
            k++;
        if (ck == C_UNKNOWN) return 0;
        while (k < ascii_end && k < len && (s[k] == '\r' || s[k] == '\n' || s[k] == '/'))
            k++;
        return k;
    }
    /* 5, 6, 7: whitespace runs. */
    if (c == C_SPACE || c == C_NEWLINE) {
        size_t w = at, last_newline = SIZE_MAX;
        int cw;
        while ((cw = CLS(w)) == C_SPACE || cw == C_NEWLINE) {
            if (cw == C_NEWLINE) last_newline = w;
            w++;
        }
        if (cw == C_UNKNOWN) return 0;
        if (last_newline != SIZE_MAX) return last_newline + 1; /* \s*[\r\n]+ */
        if (cw == C_END) return w;                             /* \s+(?!\S) at the end */
        if (w - at >= 2) return w - 1;                         /* \s+(?!\S) leaves one */
        return w;                                              /* \s+ */
    }
    return 0;
#undef CLS
}

/* ---------------------------------------------------------------------------------------- */
/* Splitting                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct splitter {
    const gptoss_tokenizer *tok;
    pcre2_match_data *match;      /* reused across matches */
    pcre2_match_context *context; /* NULL until a pathological run needs lifted limits */
    pcre2_jit_stack *jit_stack;   /* with context, when JIT is used */
    bool fast;                    /* use the ASCII fast path */
} splitter;

static int regex_match(splitter *sp, const unsigned char *text, size_t len, size_t at) {
    const pcre2_code *re = sp->tok->regex;
    if (sp->tok->regex_jit) return pcre2_jit_match(re, text, len, at, 0, sp->match, sp->context);
    return pcre2_match(re, text, len, at, PCRE2_NO_UTF_CHECK, sp->match, sp->context);
}

/* Splits one valid UTF-8 run, calling fn for each piece. */
static gptoss_status split_valid_run(splitter *sp, const unsigned char *text, size_t len,
                                     gptoss_tok_piece_fn fn, void *user, gptoss_error *error) {
    size_t at = 0, ascii_end = 0;
    while (at < len) {
        if (sp->fast && text[at] < 0x80) {
            if (ascii_end <= at) {
                ascii_end = at;
                while (ascii_end < len && text[ascii_end] < 0x80)
                    ascii_end++;
            }
            size_t end = ascii_piece(text, at, len, ascii_end);
            if (end > at) {
                gptoss_status st = fn(user, text + at, end - at, error);
                if (st) return st;
                at = end;
                continue;
            }
        }
        int rc = regex_match(sp, text, len, at);
        if ((rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT ||
             rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) &&
            !sp->context) {
            /* A pathological run (megabytes of whitespace make `\s*[\r\n]+` backtrack across
             * the whole run) hit PCRE2's default match limit or the 32 KiB JIT stack. The
             * work is still linear, so retry here with the limits lifted. */
            sp->context = pcre2_match_context_create(NULL);
            if (sp->tok->regex_jit)
                sp->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            if (!sp->context || (sp->tok->regex_jit && !sp->jit_stack))
                return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                        "out of memory for the regex match context");
            pcre2_set_match_limit(sp->context, UINT32_MAX);
            pcre2_set_depth_limit(sp->context, UINT32_MAX);
            pcre2_set_heap_limit(sp->context, UINT32_MAX);
            if (sp->jit_stack) pcre2_jit_stack_assign(sp->context, NULL, sp->jit_stack);
            rc = regex_match(sp, text, len, at);
        }
        size_t start, end;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sp->match);
            start = ov[0];
            end = ov[1];
        } else if (rc == PCRE2_ERROR_NOMATCH) {
            start = end = len;
        } else {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof message);
            return gptoss_set_error(error, GPTOSS_ERR_CAPACITY,
                                    "pre-tokenizer regex failed at byte %zu: %s", at,
                                    (const char *)message);
        }
        /* The alternatives cover every character, so gaps and empty matches cannot happen;
         * should they, the skipped bytes still become a piece so nothing is lost. */
        if (start > at) {
            gptoss_status st = fn(user, text + at, start - at, error);
            if (st) return st;
        }
        if (end <= start) {
            if (start >= len) break;
            size_t n = gptoss_utf8_sequence_length(text + start, len - start);
            end = start + (n ? n : 1);
        }
        gptoss_status st = fn(user, text + start, end - start, error);
        if (st) return st;
        at = end;
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_tok_split(const gptoss_tokenizer *tok, const unsigned char *text, size_t len,
                               bool ascii_fast_path, gptoss_tok_piece_fn fn, void *user,
                               gptoss_error *error) {
    if (len == 0) return GPTOSS_OK;
    splitter sp = {.tok = tok, .fast = ascii_fast_path};
    sp.match = pcre2_match_data_create_from_pattern((const pcre2_code *)tok->regex, NULL);
    if (!sp.match)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory creating regex match data");
    gptoss_status st = GPTOSS_OK;
    size_t at = 0;
    while (at < len && !st) {
        size_t valid = gptoss_utf8_valid_prefix(text + at, len - at);
        if (valid) {
            st = split_valid_run(&sp, text + at, valid, fn, user, error);
            at += valid;
            continue;
        }
        /* A maximal run of bytes that do not start a valid sequence: one piece. */
        size_t bad = 1;
        while (at + bad < len && gptoss_utf8_sequence_length(text + at + bad, len - at - bad) == 0)
            bad++;
        st = fn(user, text + at, bad, error);
        at += bad;
    }
    if (sp.jit_stack) pcre2_jit_stack_free(sp.jit_stack);
    if (sp.context) pcre2_match_context_free(sp.context);
    pcre2_match_data_free(sp.match);
    return st;
}

/*
 * Piece cache for long inputs. Natural text repeats its words, and a piece that is not a
 * whole token costs a full BPE; remembering the result of recent such pieces makes repeats
 * cost one hash lookup. The cache lives for one encode call (so the tokenizer stays
 * immutable and thread-safe) and only calls with enough text to repay its allocation use it.
 * Direct-mapped: a collision simply replaces the older entry.
 */
enum {
    PIECE_CACHE_MIN_TEXT = 16 * 1024, /* bytes of text before a cache pays off */
    PIECE_CACHE_SLOTS = 4096,         /* power of two */
    PIECE_CACHE_MAX_BYTES = 48,       /* longer pieces are not cached */
    PIECE_CACHE_MAX_IDS = 12,         /* nor are pieces that need more ids */
};

typedef struct piece_cache_entry {
    uint64_t hash;                              /* gptoss_tok_hash of the piece */
    uint8_t len;                                /* piece bytes; 0 = empty entry */
    uint8_t n_ids;                              /* ids in use */
    unsigned char bytes[PIECE_CACHE_MAX_BYTES]; /* the piece */
    int32_t ids[PIECE_CACHE_MAX_IDS];           /* its BPE ids */
} piece_cache_entry;

typedef struct emit_state {
    const gptoss_tokenizer *tok;
    gptoss_tokens *out;
    piece_cache_entry *cache; /* [PIECE_CACHE_SLOTS] or NULL */
} emit_state;

/* Emits one piece: its rank when the whole piece is a token, BPE otherwise. */
static gptoss_status emit_piece(void *user, const unsigned char *piece, size_t len,
                                gptoss_error *error) {
    emit_state *es = user;
    const gptoss_tokenizer *tok = es->tok;
    if (len == 1) return gptoss_tok_push(es->out, tok->byte_rank[piece[0]], error);
    uint64_t h = gptoss_tok_hash(piece, len);
    if (len <= tok->max_token_len) {
        int32_t rank = gptoss_tok_rank_hashed(tok, piece, len, h);
        if (rank >= 0) return gptoss_tok_push(es->out, rank, error);
    }
    piece_cache_entry *entry = NULL;
    if (es->cache && len <= PIECE_CACHE_MAX_BYTES) {
        entry = &es->cache[h & (PIECE_CACHE_SLOTS - 1)];
        if (entry->hash == h && entry->len == len && memcmp(entry->bytes, piece, len) == 0) {
            for (uint8_t i = 0; i < entry->n_ids; i++) {
                gptoss_status st = gptoss_tok_push(es->out, entry->ids[i], error);
                if (st) return st;
            }
            return GPTOSS_OK;
        }
    }
    size_t first = es->out->n;
    gptoss_status st = gptoss_tok_bpe(tok, piece, len, es->out, error);
    if (!st && entry && es->out->n - first <= PIECE_CACHE_MAX_IDS) {
        entry->hash = h;
        entry->len = (uint8_t)len;
        entry->n_ids = (uint8_t)(es->out->n - first);
        memcpy(entry->bytes, piece, len);
        memcpy(entry->ids, es->out->ids + first, entry->n_ids * sizeof(int32_t));
    }
    return st;
}

gptoss_status gptoss_tok_encode_ordinary(const gptoss_tokenizer *tok, const unsigned char *text,
                                         size_t len, gptoss_tokens *out, gptoss_error *error) {
    emit_state es = {tok, out, NULL};
    /* Without memory for the cache, encoding still works, only slower. */
    if (len >= PIECE_CACHE_MIN_TEXT) es.cache = calloc(PIECE_CACHE_SLOTS, sizeof *es.cache);
    gptoss_status st = gptoss_tok_split(tok, text, len, true, emit_piece, &es, error);
    free(es.cache);
    return st;
}
