/*
 * bpe.c - the byte-pair merge of one pre-token piece (tiktoken semantics, spec 5.3).
 *
 * Start from single bytes; repeatedly merge the adjacent pair whose concatenation has the
 * lowest rank in the vocabulary (the leftmost such pair on ties) until no adjacent pair's
 * concatenation is a token. Two implementations with identical results:
 *   - short pieces (the common case): arrays of part boundaries and pair ranks, scanned for
 *     the minimum; O(n^2) but n is small and everything stays in cache;
 *   - long pieces (runs of spaces, a megabyte without a break): a doubly linked list of parts
 *     and a binary heap of candidate pairs keyed by (rank, start), with stale entries
 *     discarded on pop; O(n log n), so no input makes encoding quadratic.
 * Owns: nothing beyond its scratch memory. Must not: split or look at anything outside the
 * piece it is given (the pre-tokenizer decided the piece).
 */
#include "tokenizer/tokenizer_internal.h"

#include "util/error.h"

#include <stdlib.h>

/* Pieces up to this many bytes use the array scan; longer ones the heap. */
#define BPE_SMALL_MAX 128

#define NO_RANK INT32_MAX

static inline int32_t pair_rank(const gptoss_tokenizer *tok, const unsigned char *piece,
                                size_t start, size_t end) {
    int32_t rank = gptoss_tok_rank(tok, piece + start, end - start);
    return rank < 0 ? NO_RANK : rank;
}

static gptoss_status bpe_small(const gptoss_tokenizer *tok, const unsigned char *piece, size_t len,
                               gptoss_tokens *out, gptoss_error *error) {
    /* starts[i] is where part i begins; starts[n_parts] == len. ranks[i] is the rank of the
     * concatenation of parts i and i+1 (NO_RANK when it is not a token or i+1 is last). */
    uint32_t starts[BPE_SMALL_MAX + 1];
    int32_t ranks[BPE_SMALL_MAX];
    size_t n_parts = len;
    for (size_t i = 0; i <= len; i++)
        starts[i] = (uint32_t)i;
    for (size_t i = 0; i + 1 < len; i++)
        ranks[i] = pair_rank(tok, piece, i, i + 2);
    if (len) ranks[len - 1] = NO_RANK;
    while (n_parts > 1) {
        int32_t best = NO_RANK;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n_parts; i++) {
            if (ranks[i] < best) {
                best = ranks[i];
                at = i;
            }
        }
        if (best == NO_RANK) break;
        /* Merge parts at and at+1: drop boundary at+1. */
        for (size_t i = at + 1; i < n_parts; i++)
            starts[i] = starts[i + 1];
        for (size_t i = at + 1; i + 1 < n_parts; i++)
            ranks[i] = ranks[i + 1];
        n_parts--;
        ranks[at] = at + 1 < n_parts ? pair_rank(tok, piece, starts[at], starts[at + 2]) : NO_RANK;
        if (at > 0) ranks[at - 1] = pair_rank(tok, piece, starts[at - 1], starts[at + 1]);
    }
    for (size_t i = 0; i < n_parts; i++) {
        int32_t rank = gptoss_tok_rank(tok, piece + starts[i], starts[i + 1] - starts[i]);
        gptoss_status st = gptoss_tok_push(out, rank, error);
        if (st) return st;
    }
    return GPTOSS_OK;
}

/* Heap entries are (rank << 32 | start): lowest rank first, then leftmost. An entry is
 * current when a part still starts at `start` and the pair starting there still has that
 * rank (a rank names one byte string, so the pair is then exactly that token). */
static void heap_push(uint64_t *heap, size_t *n, uint64_t key) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent] <= key) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = key;
}

static void sift_down(uint64_t *heap, size_t count, size_t i, uint64_t key) {
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= count) break;
        if (child + 1 < count && heap[child + 1] < heap[child]) child++;
        if (heap[child] >= key) break;
        heap[i] = heap[child];
        i = child;
    }
    heap[i] = key;
}

static uint64_t heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0];
    uint64_t last = heap[--(*n)];
    if (*n) sift_down(heap, *n, 0, last);
    return top;
}

static gptoss_status bpe_large(const gptoss_tokenizer *tok, const unsigned char *piece, size_t len,
                               gptoss_tokens *out, gptoss_error *error) {
    if (len >= UINT32_MAX)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "a single pre-token of %zu bytes is too long to encode", len);
    /* Parts are named by their first byte s. next[s]: start of the following part (len for
     * the last; next[len] == len). prev[s]: start of the previous part. pair[s]: rank of the
     * concatenation of part s and the next, NO_RANK if none; pair[s] == NO_RANK also for
     * bytes that no longer start a part. About 29 bytes of scratch per input byte. */
    uint32_t *next = malloc((len + 1) * sizeof *next);
    uint32_t *prev = malloc(len * sizeof *prev);
    int32_t *pair = malloc(len * sizeof *pair);
    size_t heap_cap = 2 * len;
    uint64_t *heap = malloc(heap_cap * sizeof *heap);
    gptoss_status st = GPTOSS_OK;
    if (!next || !prev || !pair || !heap) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                              "out of memory encoding a %zu-byte piece", len);
        goto done;
    }
    size_t n_heap = 0;
    for (uint32_t i = 0; i < len; i++) {
        next[i] = i + 1;
        prev[i] = i - 1; /* wraps for i == 0; never read there */
        pair[i] = i + 1 < len ? pair_rank(tok, piece, i, i + 2) : NO_RANK;
        if (pair[i] != NO_RANK) heap_push(heap, &n_heap, (uint64_t)pair[i] << 32 | i);
    }
    next[len] = (uint32_t)len;
    while (n_heap) {
        uint64_t key = heap_pop(heap, &n_heap);
        uint32_t start = (uint32_t)(key & 0xFFFFFFFFu);
        if (pair[start] != (int32_t)(key >> 32)) continue; /* stale */
        /* Merge the part after `start` into it. */
        uint32_t right = next[start];
        uint32_t end = next[right];
        pair[right] = NO_RANK;
        next[start] = end;
        if (end < len) prev[end] = start;
        if (n_heap + 2 > heap_cap) {
            /* Stale entries filled the heap: rebuild it from the live pairs (O(n), and at
             * most about once per piece since the heap grows by one per merge at most). */
            n_heap = 0;
            for (uint32_t s = 0; s < len; s = next[s])
                if (pair[s] != NO_RANK && s != start) heap[n_heap++] = (uint64_t)pair[s] << 32 | s;
            for (size_t i = n_heap / 2; i-- > 0;)
                sift_down(heap, n_heap, i, heap[i]);
        }
        pair[start] = end < len ? pair_rank(tok, piece, start, next[end]) : NO_RANK;
        if (pair[start] != NO_RANK) heap_push(heap, &n_heap, (uint64_t)pair[start] << 32 | start);
        if (start > 0) {
            uint32_t p = prev[start];
            pair[p] = pair_rank(tok, piece, p, end);
            if (pair[p] != NO_RANK) heap_push(heap, &n_heap, (uint64_t)pair[p] << 32 | p);
        }
    }
    for (uint32_t s = 0; s < len && !st; s = next[s])
        st = gptoss_tok_push(out, gptoss_tok_rank(tok, piece + s, next[s] - s), error);
done:
    free(next);
    free(prev);
    free(pair);
    free(heap);
    return st;
}

gptoss_status gptoss_tok_bpe(const gptoss_tokenizer *tok, const unsigned char *piece, size_t len,
                             gptoss_tokens *out, gptoss_error *error) {
    if (len == 0) return GPTOSS_OK;
    if (len <= BPE_SMALL_MAX) return bpe_small(tok, piece, len, out, error);
    return bpe_large(tok, piece, len, out, error);
}
