/*
 * json_automaton.h - the compiled form of a JSON Schema, shared by its compiler
 * (json_schema_compile.c) and its run time (json_schema.c).
 *
 * A schema compiles to a byte-level pushdown automaton: a graph of NFA states with byte-range,
 * epsilon and call edges, where a call runs a "machine" (the automaton of one sub-schema: a
 * $ref target, an array's item schema, or "any JSON value" at a given nesting) and returns.
 * Calls keep the graph linear in the schema size (a $ref used twice is compiled once) and make
 * recursion possible; the call stack is bounded (JSON_MAX_STACK frames), which is the bounded
 * unrolling of recursive schemas. A configuration is (NFA state, stack); stacks are interned
 * as linked frames, so a configuration is a 64-bit value.
 *
 * Budgets. Compilation computes, for each NFA state and stack depth, the fewest bytes to the
 * end of its machine (Dijkstra over reversed edges; a call costs its callee's minimum at the
 * next depth), so the fewest bytes to complete a configuration is a sum along its stack.
 *
 * Owns: nothing; the structures here belong to a gptoss_json_schema.
 */
#ifndef GPTOSS_STRUCTURED_JSON_AUTOMATON_H
#define GPTOSS_STRUCTURED_JSON_AUTOMATON_H

#include "structured/json_schema.h"
#include "structured/token_trie.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define JSON_MAX_STACK 32   /* call frames: $ref recursion, array items, nested any-values */
#define JSON_ANY_NESTING 16 /* nesting of arrays/objects in an unconstrained value */
#define JSON_MAX_INLINE 64  /* schema nesting compiled inline (C recursion bound) */
#define JSON_MAX_NFA_STATES 300000
#define JSON_MAX_CHAR_STATES 60000 /* one string's character automaton */
#define JSON_MAX_DFA_STATES 50000  /* past this, the DFA cache starts over (about 60 MB) */
#define JSON_MASK_CACHE_BYTES ((size_t)64 << 20)
#define DIST_INF 0x3FFFFFFFu
#define NEXT_UNKNOWN (-2)
#define NEXT_DEAD (-1)

struct gptoss_json_vocab {
    token_trie trie;
};

/* ---- the compiled graph ------------------------------------------------------------------ */

enum { EDGE_BYTE, EDGE_EPS, EDGE_CALL };

typedef struct nfa_edge {
    int32_t from, to; /* for a call: to is the return state */
    int32_t callee;   /* machine, for EDGE_CALL */
    uint8_t kind, lo, hi;
} nfa_edge;

typedef struct machine {
    int32_t start, exit;
    const json_t *schema; /* NULL for an any-value machine */
    int32_t any_level; /* any-value: nesting left; -1 json_object root; -3 string; -4 character */
    char *pointer;     /* JSON pointer of the schema, for messages */
} machine;

typedef struct stack_frame {
    int32_t ret;    /* NFA state to return to */
    int32_t parent; /* frame below, 0 = the empty stack */
    int32_t depth;  /* frames in this stack */
    uint32_t dist;  /* bytes to finish every frame of this stack once its top returns */
} stack_frame;

typedef struct dfa_state {
    uint64_t *configs; /* [n_configs] sorted: (stack << 32) | nfa state */
    int32_t n_configs;
    uint32_t hash;
    bool accept;
    uint32_t max_after; /* largest distance after a token in the cached mask */
    uint32_t *mask;     /* cached allowed tokens, or NULL */
    /* with the mask: (distance << 32 | token) of the allowed tokens after which the distance
     * to completion rises ([0, n_up)) or falls ([n_up, n_up + n_down)), for budgets */
    uint64_t *moves;
    int32_t n_up, n_down;
} dfa_state;

struct gptoss_json_schema {
    const gptoss_json_vocab *vocab;
    /* the graph, edges grouped by source (CSR) */
    int32_t n_states;
    int32_t *edge_start; /* [n_states + 1] */
    nfa_edge *edges;
    int32_t *exit_of; /* [n_states]: machine whose exit this is, or -1 */
    machine *machines;
    int32_t n_machines;
    uint32_t *dist; /* [n_states * (JSON_MAX_STACK + 1)]: bytes to the machine's exit at a depth */

    pthread_mutex_t lock; /* guards everything below */
    stack_frame *frames;
    int32_t n_frames, cap_frames;
    int32_t *frame_table; /* open addressing on (ret, parent) */
    int32_t frame_table_size;
    dfa_state *dfa;
    int32_t **next;     /* [n_dfa][256] */
    uint32_t *dfa_dist; /* [n_dfa] fewest bytes to complete */
    int32_t n_dfa, cap_dfa;
    int32_t *dfa_table; /* open addressing on the config set */
    int32_t dfa_table_size;
    int32_t start;
    uint32_t generation; /* bumped when the DFA cache starts over */
    size_t mask_bytes;
    int32_t mask_words;
    /* scratch for closures */
    uint64_t *work, *found;
    int32_t cap_work, cap_found;
    uint64_t *seen;
    int32_t seen_size;
    int32_t *walk_stack; /* [max token length + 1] */
    uint64_t *up, *down; /* scratch for a walk's moves */
    int32_t cap_up, cap_down;
    uint32_t *scratch_mask; /* [mask_words] */
};

static inline uint32_t dist_at(const gptoss_json_schema *s, int32_t state, int32_t depth) {
    return s->dist[(size_t)depth * (size_t)s->n_states + (size_t)state];
}

static inline uint32_t dist_add(uint32_t a, uint32_t b) {
    uint32_t c = a + b;
    return c >= DIST_INF ? DIST_INF : c;
}

/* Builds the graph, its machines and distances into s (the run-time fields stay zero).
 * A refused schema fills error with the keyword and its JSON pointer. */
gptoss_status json_schema_build(const json_t *schema, gptoss_json_schema *s, gptoss_error *error);

void json_machines_free(machine *machines, int32_t n);

#endif
