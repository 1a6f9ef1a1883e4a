/*
 * json_regex.h - the character level of JSON Schema strings: sets of code points, a regex
 * subset (the `pattern` keyword and the string formats) compiled to an NFA over characters,
 * the product with a length range (minLength/maxLength), and UTF-8 byte sequences of code
 * point ranges. json_schema.c turns these character NFAs into bytes of JSON string content.
 *
 * Owns: char_nfa (its states, edges and code point sets). Knows nothing of tokens or schemas.
 */
#ifndef GPTOSS_STRUCTURED_JSON_REGEX_H
#define GPTOSS_STRUCTURED_JSON_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CP_MAX 0x10FFFFu

typedef struct cp_range {
    uint32_t lo, hi; /* inclusive; never overlapping within a set, sorted */
} cp_range;

typedef struct cp_set {
    cp_range *ranges; /* [n] */
    int32_t n;
} cp_set;

typedef struct char_edge {
    int32_t from, to;
    int32_t set; /* index into char_nfa.sets, or -1 for an epsilon edge */
} char_edge;

/* An NFA over characters with one start and one accepting state. */
typedef struct char_nfa {
    int32_t n_states, start, accept;
    char_edge *edges; /* [n_edges] */
    int32_t n_edges, cap_edges;
    cp_set *sets; /* [n_sets] */
    int32_t n_sets, cap_sets;
    int32_t max_states; /* refuse to grow beyond this */
    bool failed;        /* out of memory or over max_states */
} char_nfa;

void char_nfa_init(char_nfa *nfa, int32_t max_states);
void char_nfa_free(char_nfa *nfa);

/* Compiles a regex of the documented subset. Unanchored ends match anything (JSON Schema
 * patterns search). On failure returns false with a message (no pointer, no keyword). */
bool json_regex_compile(const char *pattern, char_nfa *out, char *message, size_t message_len);

/* The NFA of any string of min..max characters (max < 0: unbounded). */
bool char_nfa_any(char_nfa *out, int32_t min_len, int32_t max_len, char *message,
                  size_t message_len);

/* Replaces *nfa by its product with a length range: accepts the strings it accepted whose
 * length is within min..max (max < 0: unbounded). */
bool char_nfa_limit_length(char_nfa *nfa, int32_t min_len, int32_t max_len, char *message,
                           size_t message_len);

/* Replaces *a by the product of a and b: the strings both accept (a `pattern` beside a
 * `format`). Only pairs of states reachable from the start are built. */
bool char_nfa_intersect(char_nfa *a, const char_nfa *b, char *message, size_t message_len);

/* Whether a set is every code point (the unconstrained string character). */
bool cp_set_is_all(const cp_set *set);

/* Calls emit once per UTF-8 byte-range sequence covering the code points lo..hi (surrogates
 * excluded): n bytes, byte i within [first[i], last[i]]. */
typedef void (*utf8_sequence_fn)(void *user, int n, const uint8_t *first, const uint8_t *last);
void utf8_sequences(uint32_t lo, uint32_t hi, utf8_sequence_fn emit, void *user);

/* The regex (in the subset above) of a supported string format, or NULL. */
const char *json_format_regex(const char *format);

#endif
