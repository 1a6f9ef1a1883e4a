/*
 * token_trie.h - the ordinary tokens of a vocabulary as a byte trie laid out in preorder, so
 * that walking it with an automaton is one linear pass that skips rejected subtrees.
 *
 * Owns: the node array and a copy of every ordinary token's bytes. Immutable once built.
 */
#ifndef GPTOSS_STRUCTURED_TOKEN_TRIE_H
#define GPTOSS_STRUCTURED_TOKEN_TRIE_H

#include "gptoss.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>

typedef struct token_trie_node {
    uint8_t byte;   /* the byte on the edge from the parent */
    uint16_t depth; /* 1 for children of the root: the prefix length */
    int32_t token;  /* the token whose bytes end here, or -1 */
    int32_t skip;   /* index of the first node after this node's subtree */
} token_trie_node;

typedef struct token_trie {
    token_trie_node *nodes; /* [n_nodes], preorder */
    int32_t n_nodes;
    int32_t n_tokens;  /* ordinary token ids are 0..n_tokens-1 */
    int32_t max_depth; /* longest token in bytes */
    uint8_t *bytes;    /* every token's bytes, concatenated */
    uint32_t *offsets; /* [n_tokens + 1] into bytes */
} token_trie;

gptoss_status token_trie_build(const gptoss_tokenizer *tokenizer, token_trie *out,
                               gptoss_error *error);
void token_trie_free(token_trie *trie);

#endif
