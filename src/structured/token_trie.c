/*
 * token_trie.c - builds the preorder token trie (see token_trie.h): tokens sorted by their
 * bytes; each token adds the nodes past its common prefix with the one before it.
 */
#include "structured/token_trie.h"

#include "util/error.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local const token_trie *sort_trie; /* qsort has no context argument in C11 */

static int token_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const token_trie *t = sort_trie;
    uint32_t lx = t->offsets[x + 1] - t->offsets[x], ly = t->offsets[y + 1] - t->offsets[y];
    int c = memcmp(t->bytes + t->offsets[x], t->bytes + t->offsets[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly;
}

gptoss_status token_trie_build(const gptoss_tokenizer *tokenizer, token_trie *out,
                               gptoss_error *error) {
    memset(out, 0, sizeof *out);
    int32_t n = gptoss_tokenizer_n_ordinary(tokenizer);
    size_t total = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t len = 0;
        if (gptoss_tokenizer_token_bytes(tokenizer, id, &len)) total += len;
    }
    out->n_tokens = n;
    out->offsets = malloc(((size_t)n + 1) * sizeof *out->offsets);
    out->bytes = malloc(total ? total : 1);
    int32_t *order = malloc((size_t)n * sizeof *order);
    /* every node is a byte of some token: total bounds the node count */
    out->nodes = malloc((total ? total : 1) * sizeof *out->nodes);
    int32_t *open = NULL;
    if (!out->offsets || !out->bytes || !order || !out->nodes) goto oom;
    size_t at = 0;
    for (int32_t id = 0; id < n; id++) {
        size_t len = 0;
        const char *b = gptoss_tokenizer_token_bytes(tokenizer, id, &len);
        out->offsets[id] = (uint32_t)at;
        if (b && len > 0xFFFF) {
            free(order);
            token_trie_free(out);
            return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                    "token %d is %zu bytes long (at most 65535 supported)", id,
                                    len);
        }
        if (b) memcpy(out->bytes + at, b, len), at += len;
        order[id] = id;
        if ((int32_t)len > out->max_depth) out->max_depth = (int32_t)len;
    }
    out->offsets[n] = (uint32_t)at;
    sort_trie = out;
    qsort(order, (size_t)n, sizeof *order, token_cmp);
    /* open[d]: the node at depth d+1 on the current path, to set skips when it closes */
    open = malloc(((size_t)out->max_depth + 1) * sizeof *open);
    if (!open) goto oom;
    int32_t n_nodes = 0, path = 0; /* nodes on the current path */
    int32_t prev = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = order[i];
        const uint8_t *b = out->bytes + out->offsets[id];
        int32_t len = (int32_t)(out->offsets[id + 1] - out->offsets[id]);
        if (len == 0) continue;
        int32_t common = 0;
        if (prev >= 0) {
            const uint8_t *pb = out->bytes + out->offsets[prev];
            int32_t plen = (int32_t)(out->offsets[prev + 1] - out->offsets[prev]);
            while (common < len && common < plen && pb[common] == b[common])
                common++;
        }
        while (path > common)
            out->nodes[open[--path]].skip = n_nodes;
        for (int32_t d = common; d < len; d++) {
            out->nodes[n_nodes] =
                (token_trie_node){.byte = b[d], .depth = (uint16_t)(d + 1), .token = -1, .skip = 0};
            open[path++] = n_nodes++;
        }
        out->nodes[open[len - 1]].token = id;
        prev = id;
    }
    while (path > 0)
        out->nodes[open[--path]].skip = n_nodes;
    out->n_nodes = n_nodes;
    free(open);
    free(order);
    return GPTOSS_OK;
oom:
    free(open);
    free(order);
    token_trie_free(out);
    return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                            "out of memory building the token trie");
}

void token_trie_free(token_trie *trie) {
    free(trie->nodes);
    free(trie->bytes);
    free(trie->offsets);
    memset(trie, 0, sizeof *trie);
}
