/*
 * sampling_ref.c - the host reference of the sampling rule (see sampling_ref.h and
 * sampling_rule.h for the rule itself).
 *
 * One draw costs a few passes over the row, never a sort of it:
 *   - processed logits m (a copy with NaN as -inf, the allowed-token mask, then the sparse
 *     edits) and their maximum, in one vectorized pass when nothing is masked or edited;
 *   - the weights W, computed exactly as gptoss_sampling_weight but vectorized (integer bit
 *     tests instead of float branches), only for blocks of 64 tokens that hold a token with
 *     x > -33 (below, W is 0); in a language model's row most blocks are skipped;
 *   - without top_k / top_p, partial sums of W per block, so the id-order walk of the draw
 *     only enters one block;
 *   - with top_k / top_p, the kept set is a prefix of the order (m desc, id asc), so it is
 *     known once its last token is: a radix selection over the bits of m (12, 12, then up to 8
 *     bits of the candidates' key range) with the count and the W total of each bucket finds
 *     that token exactly, visiting only
 *     the bucket that holds it at each level, among the "live" tokens (x > -33: a prefix of
 *     the order that holds every positive weight). Equal m stay in id order throughout.
 */
#include "backend/sampling_ref.h"

#include "backend/sampling_rule.h"
#include "util/error.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_TOKENS 64 /* tokens per partial sum of the id-order walk, and per zero test */
#define LEVEL_BUCKETS 4096

struct gptoss_sample_scratch {
    int32_t vocab;
    float *m;            /* [vocab] processed logits */
    float *weight;       /* [vocab] W (an integer up to 2^32, exact as a float) */
    int32_t *list_a;     /* [vocab] candidates of a selection level, in id order */
    int32_t *list_b;     /* [vocab] the same, one level down */
    int32_t *prefix;     /* [vocab] the top_k prefix, in id order */
    int32_t *live;       /* [vocab] tokens that may have a positive weight, in id order */
    uint64_t *block_sum; /* [vocab / BLOCK_TOKENS + 1] */
    uint32_t count[LEVEL_BUCKETS];
    uint64_t wsum[LEVEL_BUCKETS];
};

gptoss_status gptoss_sample_scratch_create(int32_t vocab, gptoss_sample_scratch **out,
                                           gptoss_error *error) {
    *out = NULL;
    if (vocab < 1)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "sampling scratch: vocabulary size %d", vocab);
    gptoss_sample_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory (sampling scratch)");
    const size_t n = (size_t)vocab;
    s->vocab = vocab;
    s->m = malloc(n * sizeof(float));
    s->weight = malloc(n * sizeof(float));
    s->list_a = malloc(n * sizeof(int32_t));
    s->list_b = malloc(n * sizeof(int32_t));
    s->prefix = malloc(n * sizeof(int32_t));
    s->live = malloc(n * sizeof(int32_t));
    s->block_sum = malloc((n / BLOCK_TOKENS + 1) * sizeof(uint64_t));
    if (!s->m || !s->weight || !s->list_a || !s->list_b || !s->prefix || !s->live ||
        !s->block_sum) {
        gptoss_sample_scratch_free(s);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory (sampling scratch for %d tokens)", vocab);
    }
    *out = s;
    return GPTOSS_OK;
}

void gptoss_sample_scratch_free(gptoss_sample_scratch *s) {
    if (!s) return;
    free(s->m);
    free(s->weight);
    free(s->list_a);
    free(s->list_b);
    free(s->prefix);
    free(s->live);
    free(s->block_sum);
    free(s);
}

/* ---- processed logits -------------------------------------------------------------------- */

/* The loops over whole rows are written with integer bit tests and masks instead of float
 * compares and branches: GCC vectorizes them so (a float compare may trap, so it keeps those
 * as branches), and they compute exactly the rule's values. */

static inline int32_t float_bits(float x) {
    int32_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

static inline float bits_float(int32_t i) {
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}

static inline bool allowed(const uint32_t *mask, int32_t token) {
    return !mask || ((mask[token >> 5] >> (token & 31)) & 1u);
}

static inline float not_nan(float x) {
    return x != x ? -INFINITY : x;
}

/* An unsigned key that orders like the float (NaN excluded; -0 sorts just below +0). */
static inline uint32_t float_key(float x) {
    uint32_t u = (uint32_t)float_bits(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Largest key of m[0..V). */
static uint32_t max_key(const float *restrict m, int32_t V) {
    uint32_t best = 0;
    for (int32_t j = 0; j < V; j++) {
        uint32_t key = float_key(m[j]);
        best = key > best ? key : best;
    }
    return best;
}

/* m = the rule's step 1; returns max m. */
static float process(const float *restrict logits, int32_t V, const gptoss_sample_row *row,
                     const gptoss_sample_edit *edits, const uint32_t *mask, float *restrict m) {
    uint32_t best_key = 0;
    for (int32_t j = 0; j < V; j++) { /* NaN -> -inf, and the maximum on the way */
        int32_t i = float_bits(logits[j]);
        i = (i & 0x7fffffff) > 0x7f800000 ? (int32_t)0xff800000u : i;
        m[j] = bits_float(i);
        uint32_t key = (uint32_t)i & 0x80000000u ? ~(uint32_t)i : ((uint32_t)i | 0x80000000u);
        best_key = key > best_key ? key : best_key;
    }
    if (mask)
        for (int32_t j = 0; j < V; j++)
            if (!allowed(mask, j)) m[j] = -INFINITY;
    const float r = row->repetition_penalty;
    for (int32_t e = 0; e < row->n_edits; e++) {
        const gptoss_sample_edit *ed = &edits[e];
        const int32_t t = ed->token;
        float x = GPTOSS_SR_ADD(not_nan(logits[t]), ed->bias);
        if (ed->masked || !allowed(mask, t)) x = -INFINITY;
        if (ed->seen && r != 1.0f) x = gptoss_sampling_repetition(x, r);
        if (ed->output_count > 0)
            x = gptoss_sampling_freq_presence(x, row->frequency_penalty, row->presence_penalty,
                                              ed->output_count);
        m[t] = x;
    }
    if (mask || row->n_edits > 0) best_key = max_key(m, V);
    return bits_float((int32_t)((best_key & 0x80000000u) ? (best_key & 0x7fffffffu) : ~best_key));
}

/* The greedy token: the first with m == mx. */
static int32_t first_max(const float *m, int32_t V, float mx) {
    int32_t best = 0;
    while (best < V - 1 && m[best] != mx)
        best++;
    return best;
}

/* ---- weights ----------------------------------------------------------------------------- */

/* The weights of n tokens, one vectorized loop (see gptoss_sample_weights). */
static void weights_span(const float *restrict m, float *restrict weight, int32_t n, float mx,
                         float scale) {
    const int32_t minus_126 = (int32_t)0xc2fc0000u, plus_inf = 0x7f800000, two_23 = 0x4b000000;
    for (int32_t j = 0; j < n; j++) {
        /* gptoss_sampling_exp2(x): 0 unless x > -126 (NaN fails), x clamped to <= 0 */
        int32_t i = float_bits(gptoss_sampling_log2_weight(m[j], mx, scale));
        const int32_t keep = (i < minus_126) | ((i >= 0) & (i <= plus_inf));
        i &= -keep;
        i = i > 0 ? 0 : i;
        const float x = bits_float(i);
        const float round_magic = 12582912.0f;
        float k = GPTOSS_SR_SUB(GPTOSS_SR_ADD(x, round_magic), round_magic);
        float f = GPTOSS_SR_MUL(GPTOSS_SR_SUB(x, k), 0.6931471805599453f);
        float p = 1.0f / 720.0f;
        p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f / 120.0f);
        p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f / 24.0f);
        p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f / 6.0f);
        p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 0.5f);
        p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f);
        p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f);
        const int32_t ki = (int32_t)k;
        const float w = GPTOSS_SR_MUL(p, bits_float((int32_t)((uint32_t)(ki + 127) << 23)));
        /* gptoss_sampling_weight: w * 2^32 truncated (values from 2^23 up are integers) */
        const float scaled = GPTOSS_SR_MUL(w, 4294967296.0f);
        const int32_t sb = float_bits(scaled), small = sb < two_23;
        const float truncated = (float)(int32_t)bits_float(sb & -small);
        weight[j] = bits_float(((float_bits(truncated) & -small) | (sb & (small - 1))) & -keep);
    }
}

/* Whether x = (m - mx) * scale may give a positive weight: x > -33 (for x <= -33, 2^x * 2^32
 * < 0.71: x rounds to k <= -33 and the polynomial stays below 1.42, so W = 0). Since x grows
 * with m, the tokens that pass are a prefix of the order (m desc, id asc). */
static inline int32_t may_weigh(float m, float mx, float scale) {
    const int32_t i = float_bits(gptoss_sampling_log2_weight(m, mx, scale));
    return (i < (int32_t)0xc2040000u) | ((i >= 0) & (i <= 0x7f800000));
}

static bool all_zero_weight(const float *restrict m, int32_t n, float mx, float scale) {
    int32_t any = 0;
    for (int32_t j = 0; j < n; j++)
        any |= may_weigh(m[j], mx, scale);
    return !any;
}

/* Sum of weight[0, n) as an integer (doubles add integers below 2^53 exactly). */
static uint64_t weight_sum(const float *restrict weight, int32_t n) {
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        s[0] += (double)weight[j];
        s[1] += (double)weight[j + 1];
        s[2] += (double)weight[j + 2];
        s[3] += (double)weight[j + 3];
    }
    for (; j < n; j++)
        s[0] += (double)weight[j];
    return (uint64_t)s[0] + (uint64_t)s[1] + (uint64_t)s[2] + (uint64_t)s[3];
}

/* The weights, and when block_sum is not NULL the total of each block of BLOCK_TOKENS. Most
 * of a language model's row lies far below its maximum: blocks of such tokens only need a
 * cheap test, not the polynomial. */
static int32_t weights_and_sums(const float *restrict m, float *restrict weight, int32_t n,
                                float mx, float scale, uint64_t *block_sum, int32_t *live) {
    int32_t n_live = 0;
    for (int32_t from = 0, b = 0; from < n; from += BLOCK_TOKENS, b++) {
        const int32_t len = n - from < BLOCK_TOKENS ? n - from : BLOCK_TOKENS;
        if (all_zero_weight(m + from, len, mx, scale)) {
            memset(weight + from, 0, (size_t)len * sizeof *weight);
            if (block_sum) block_sum[b] = 0;
            continue;
        }
        weights_span(m + from, weight + from, len, mx, scale);
        if (block_sum) block_sum[b] = weight_sum(weight + from, len);
        if (live)
            for (int32_t j = from; j < from + len; j++)
                if (may_weigh(m[j], mx, scale)) live[n_live++] = j;
    }
    return n_live;
}

void gptoss_sample_weights(const float *m, float *weight, int32_t n, float mx, float scale) {
    weights_and_sums(m, weight, n, mx, scale, NULL, NULL);
}

/* W of token j (weight[] holds it exactly, as a float). */
static inline uint64_t weight_of(const float *weight, int32_t j) {
    return (uint64_t)weight[j];
}

/* ---- the order (m desc, id asc) ---------------------------------------------------------- */

/* An unsigned key that orders like m (m is never NaN here; -0 and +0 are equal). */
static inline uint32_t order_key(float m) {
    return float_key(m == 0.0f ? 0.0f : m);
}

/* The last token of a kept prefix of the order. */
typedef struct cut {
    bool on;
    uint32_t key;
    int32_t id;
} cut;

static inline bool within(const cut *c, uint32_t key, int32_t id) {
    return !c->on || key > c->key || (key == c->key && id <= c->id);
}

/* Which token ends the prefix: the first position where the running count reaches k
 * (top_k), or where the running weight reaches top_p of total (top_p). */
typedef struct goal {
    bool by_count;
    uint64_t k;
    float top_p;
    uint64_t total;
} goal;

static inline bool reached(const goal *g, uint64_t count, uint64_t wsum) {
    return g->by_count ? count >= g->k : gptoss_sampling_top_p_reached(wsum, g->total, g->top_p);
}

typedef struct candidates {
    const int32_t *ids; /* in id order, or NULL: every token 0..n-1 */
    int32_t n;
    double min_w; /* min_p threshold on W (0: off) */
    bool min_p_on;
} candidates;

static inline bool eligible(const candidates *c, const float *weight, int32_t j) {
    return !c->min_p_on || (double)weight_of(weight, j) >= c->min_w;
}

/* The highest bucket (of n, scanned from the top) at which goal g is reached, adding the
 * buckets above it to the running count and weight. */
static int scan_buckets(const goal *g, const uint32_t *count, const uint64_t *wsum, int n,
                        uint64_t *acc_count, uint64_t *acc_w) {
    int b = n - 1;
    for (; b > 0; b--) {
        if (reached(g, *acc_count + count[b], *acc_w + wsum[b])) break;
        *acc_count += count[b];
        *acc_w += wsum[b];
    }
    return b;
}

/* Radix selection of the token where goal g is reached, over the candidates in the order.
 * The buckets cover the candidates' key range [lo, hi] (d = key - lo): level 1 the top 12
 * bits of d's width, level 2 the next 12, level 3 the rest (at most 8), so values packed in a
 * narrow range still spread over the buckets. Returns whether the goal was reached; *count /
 * *wsum are the totals through that token (or of all candidates when it was not).
 * goal->total == 0 means "the candidates' total", filled in by the first pass. */
static bool select_cut(gptoss_sample_scratch *s, const candidates *c, goal *g, cut *out,
                       uint64_t *count_out, uint64_t *wsum_out) {
    const float *m = s->m, *weight = s->weight;
    uint32_t *count = s->count;
    uint64_t *wsum = s->wsum;
    uint32_t lo = UINT32_MAX, hi = 0;
    uint64_t total_count = 0, total_w = 0;
    for (int32_t i = 0; i < c->n; i++) {
        const int32_t j = c->ids ? c->ids[i] : i;
        if (!eligible(c, weight, j)) continue;
        const uint32_t key = order_key(m[j]);
        lo = key < lo ? key : lo;
        hi = key > hi ? key : hi;
        total_count++;
        total_w += weight_of(weight, j);
    }
    if (!g->by_count && g->total == 0) g->total = total_w;
    if (total_count == 0 || !reached(g, total_count, total_w)) {
        *count_out = total_count;
        *wsum_out = total_w;
        return false;
    }
    const uint32_t range = hi - lo;
    const int width = range ? 32 - __builtin_clz(range) : 0;
    const int s1 = width > 12 ? width - 12 : 0, s2 = s1 > 12 ? s1 - 12 : 0;
    const uint32_t mask2 = (1u << (s1 - s2)) - 1u, mask3 = (1u << s2) - 1u;
    uint64_t acc_count = 0, acc_w = 0;
    /* Level 1, over every candidate. */
    const int n1 = (int)(range >> s1) + 1;
    memset(count, 0, (size_t)n1 * sizeof *count);
    memset(wsum, 0, (size_t)n1 * sizeof *wsum);
    for (int32_t i = 0; i < c->n; i++) {
        const int32_t j = c->ids ? c->ids[i] : i;
        if (!eligible(c, weight, j)) continue;
        const uint32_t b = (order_key(m[j]) - lo) >> s1;
        count[b]++;
        wsum[b] += weight_of(weight, j);
    }
    const uint32_t b1 = (uint32_t)scan_buckets(g, count, wsum, n1, &acc_count, &acc_w);
    /* Level 2, over the tokens of bucket b1. */
    int32_t n_a = 0;
    for (int32_t i = 0; i < c->n; i++) {
        const int32_t j = c->ids ? c->ids[i] : i;
        if (((order_key(m[j]) - lo) >> s1) == b1 && eligible(c, weight, j)) s->list_a[n_a++] = j;
    }
    const int n2 = (int)mask2 + 1;
    memset(count, 0, (size_t)n2 * sizeof *count);
    memset(wsum, 0, (size_t)n2 * sizeof *wsum);
    for (int32_t i = 0; i < n_a; i++) {
        const int32_t j = s->list_a[i];
        const uint32_t b = ((order_key(m[j]) - lo) >> s2) & mask2;
        count[b]++;
        wsum[b] += weight_of(weight, j);
    }
    const uint32_t b2 = (uint32_t)scan_buckets(g, count, wsum, n2, &acc_count, &acc_w);
    /* Level 3, over the tokens of bucket b2. */
    int32_t n_b = 0;
    for (int32_t i = 0; i < n_a; i++) {
        const int32_t j = s->list_a[i];
        if ((((order_key(m[j]) - lo) >> s2) & mask2) == b2) s->list_b[n_b++] = j;
    }
    const int n3 = (int)mask3 + 1;
    memset(count, 0, (size_t)n3 * sizeof *count);
    memset(wsum, 0, (size_t)n3 * sizeof *wsum);
    for (int32_t i = 0; i < n_b; i++) {
        const int32_t j = s->list_b[i];
        const uint32_t b = (order_key(m[j]) - lo) & mask3;
        count[b]++;
        wsum[b] += weight_of(weight, j);
    }
    const uint32_t b3 = (uint32_t)scan_buckets(g, count, wsum, n3, &acc_count, &acc_w);
    /* Equal keys: the order is the id order, which the lists kept. */
    const uint32_t key = lo + (b1 << s1) + (b2 << s2) + b3;
    for (int32_t i = 0; i < n_b; i++) {
        const int32_t j = s->list_b[i];
        if (order_key(m[j]) != key) continue;
        acc_count++;
        acc_w += weight_of(weight, j);
        if (reached(g, acc_count, acc_w)) {
            out->on = true;
            out->key = key;
            out->id = j;
            *count_out = acc_count;
            *wsum_out = acc_w;
            return true;
        }
    }
    /* Unreachable: the bucket totals said the goal is reached inside this bucket. */
    *count_out = acc_count;
    *wsum_out = acc_w;
    return false;
}

/* ---- the draw ---------------------------------------------------------------------------- */

int32_t gptoss_sample_reference(const float *logits, int32_t V, const gptoss_sample_row *row,
                                const gptoss_sample_edit *edits, const uint32_t *allowed_mask,
                                gptoss_sample_scratch *s) {
    const float mx = process(logits, V, row, edits, allowed_mask, s->m);
    /* Greedy; and when no token has a positive weight, the greedy token too. */
    if (row->temperature == 0.0f || !(mx > -INFINITY && mx < INFINITY))
        return first_max(s->m, V, mx);
    const bool top_k_on = row->top_k > 0 && row->top_k < V;
    const bool top_p_on = row->top_p < 1.0f;
    const bool plain = !top_k_on && !top_p_on && !(row->min_p > 0.0f);
    /* The live tokens (a prefix of the order holding every positive weight) stand for the row
     * in top_k / top_p: a cut inside them is the same cut, and a top_k beyond them keeps only
     * zero weights more. */
    const int32_t n_live =
        weights_and_sums(s->m, s->weight, V, mx, gptoss_sampling_scale(row->temperature),
                         plain ? s->block_sum : NULL, plain ? NULL : s->live);
    const float *weight = s->weight;
    const uint64_t r = gptoss_sampling_random(row->seed, row->position, row->choice);
    candidates all = {NULL, V, (double)row->min_p * 4294967296.0, row->min_p > 0.0f};

    if (!top_k_on && !top_p_on) {
        /* Every eligible token: partial sums per block, then one block walked. */
        uint64_t total = 0;
        const int32_t n_blocks = (V + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
        for (int32_t b = 0; b < n_blocks; b++) {
            const int32_t end = (b + 1) * BLOCK_TOKENS < V ? (b + 1) * BLOCK_TOKENS : V;
            if (all.min_p_on) {
                uint64_t sum = 0;
                for (int32_t j = b * BLOCK_TOKENS; j < end; j++) {
                    uint64_t w = weight_of(weight, j);
                    if ((double)w >= all.min_w) sum += w;
                }
                s->block_sum[b] = sum;
            }
            total += s->block_sum[b];
        }
        const uint64_t t = gptoss_sampling_target(r, total);
        uint64_t run = 0;
        for (int32_t b = 0; b < n_blocks; b++) {
            if (run + s->block_sum[b] <= t) {
                run += s->block_sum[b];
                continue;
            }
            const int32_t end = (b + 1) * BLOCK_TOKENS < V ? (b + 1) * BLOCK_TOKENS : V;
            for (int32_t j = b * BLOCK_TOKENS; j < end; j++) {
                if (!eligible(&all, weight, j)) continue;
                run += weight_of(weight, j);
                if (run > t) return j;
            }
        }
        return first_max(s->m, V, mx); /* unreachable: t < total */
    }

    /* top_k, then top_p: each keeps a prefix of the order; the draw then walks the kept
     * tokens in id order. */
    all.ids = s->live;
    all.n = n_live;
    candidates kept = all;
    cut last = {false, 0, 0};
    uint64_t count = 0, total = 0;
    if (top_k_on) {
        goal g = {true, (uint64_t)row->top_k, 1.0f, 0};
        if (select_cut(s, &all, &g, &last, &count, &total)) {
            /* The prefix, in id order: later passes visit only these tokens. */
            int32_t n = 0;
            for (int32_t i = 0; i < n_live; i++) {
                const int32_t j = s->live[i];
                if (within(&last, order_key(s->m[j]), j) && eligible(&all, weight, j))
                    s->prefix[n++] = j;
            }
            kept.ids = s->prefix;
            kept.n = n;
            kept.min_p_on = false; /* already applied */
        }
    }
    if (top_p_on) {
        goal g = {false, 0, row->top_p, top_k_on ? total : 0};
        cut p_last = {false, 0, 0};
        if (select_cut(s, &kept, &g, &p_last, &count, &total)) last = p_last;
    }
    const uint64_t t = gptoss_sampling_target(r, total);
    uint64_t run = 0;
    for (int32_t i = 0; i < kept.n; i++) {
        int32_t j = kept.ids ? kept.ids[i] : i;
        if (!eligible(&kept, weight, j) || !within(&last, order_key(s->m[j]), j)) continue;
        run += weight_of(weight, j);
        if (run > t) return j;
    }
    return first_max(s->m, V, mx); /* unreachable: t < total */
}

/* ---- logprobs ---------------------------------------------------------------------------- */

float gptoss_sample_logprobs(const float *logits, int32_t V, int32_t token, int32_t n_top,
                             int32_t *top_ids, float *top_logprobs) {
    float mx = -INFINITY;
    for (int32_t j = 0; j < V; j++)
        if (logits[j] > mx) mx = logits[j];
    double log_norm = mx;
    if (mx > -INFINITY && mx < INFINITY) {
        double sum = 0.0;
        for (int32_t j = 0; j < V; j++)
            sum += gptoss_sampling_exp2(
                GPTOSS_SR_MUL(GPTOSS_SR_SUB(logits[j], mx), 1.4426950408889634f));
        log_norm = (double)mx + log(sum);
    }
    if (n_top > GPTOSS_MAX_SAMPLE_LOGPROBS) n_top = GPTOSS_MAX_SAMPLE_LOGPROBS;
    int32_t n_have = 0;
    if (n_top > 0) {
        /* Insertion into a short sorted list: most tokens fail the first comparison. */
        float vals[GPTOSS_MAX_SAMPLE_LOGPROBS];
        for (int32_t j = 0; j < V; j++) {
            float x = not_nan(logits[j]);
            if (n_have == n_top && !(x > vals[n_have - 1])) continue;
            int32_t pos = n_have < n_top ? n_have++ : n_top - 1;
            while (pos > 0 && x > vals[pos - 1]) {
                vals[pos] = vals[pos - 1];
                top_ids[pos] = top_ids[pos - 1];
                pos--;
            }
            vals[pos] = x;
            top_ids[pos] = j;
        }
        for (int32_t i = 0; i < n_have; i++) {
            double lp = (double)vals[i] - log_norm;
            top_logprobs[i] = lp == lp ? (float)lp : -INFINITY;
        }
        for (int32_t i = n_have; i < n_top; i++) {
            top_ids[i] = -1;
            top_logprobs[i] = -INFINITY;
        }
    }
    double lp = (double)not_nan(logits[token]) - log_norm;
    return lp == lp ? (float)lp : -INFINITY;
}

/* ---- batches ----------------------------------------------------------------------------- */

gptoss_status gptoss_sample_batch_validate(const gptoss_sample_batch *b, int32_t n_rows, int32_t V,
                                           gptoss_error *error) {
    const gptoss_status bad = GPTOSS_ERR_INVALID_ARGUMENT;
    if (n_rows <= 0) return GPTOSS_OK;
    if (!b || !b->rows || !b->token_ids)
        return gptoss_set_error(error, bad,
                                "sample batch: the rows and the token_ids output are required");
    if (b->n_edits < 0 || (b->n_edits > 0 && !b->edits))
        return gptoss_set_error(error, bad, "sample batch: n_edits = %d without an edits array",
                                b->n_edits);
    if (b->n_allowed_rows < 0 || (b->n_allowed_rows > 0 && !b->allowed_masks == !b->fill_masks))
        return gptoss_set_error(
            error, bad,
            "sample batch: n_allowed_rows = %d needs exactly one of allowed_masks and fill_masks",
            b->n_allowed_rows);
    for (int32_t i = 0; i < n_rows; i++) {
        const gptoss_sample_row *r = &b->rows[i];
        const float T = r->temperature;
        if (!(T >= 0.0f && T < INFINITY) || (T > 0.0f && !(gptoss_sampling_scale(T) < INFINITY)))
            return gptoss_set_error(
                error, bad, "sample row %d: temperature %g is not 0 or a usable positive value", i,
                (double)T);
        if (!(r->top_p > 0.0f && r->top_p <= 1.0f))
            return gptoss_set_error(error, bad, "sample row %d: top_p %g is outside (0, 1]", i,
                                    (double)r->top_p);
        if (!(r->min_p >= 0.0f && r->min_p <= 1.0f))
            return gptoss_set_error(error, bad, "sample row %d: min_p %g is outside [0, 1]", i,
                                    (double)r->min_p);
        if (!(r->repetition_penalty > 0.0f && r->repetition_penalty < INFINITY))
            return gptoss_set_error(
                error, bad, "sample row %d: repetition_penalty %g must be positive and finite", i,
                (double)r->repetition_penalty);
        if (!isfinite(r->frequency_penalty) || !isfinite(r->presence_penalty))
            return gptoss_set_error(
                error, bad, "sample row %d: frequency / presence penalties must be finite", i);
        if (r->position < 0 || r->choice < 0)
            return gptoss_set_error(
                error, bad, "sample row %d: position %lld and choice %d must not be negative", i,
                (long long)r->position, r->choice);
        if (r->n_top_logprobs < -1 || r->n_top_logprobs > GPTOSS_MAX_SAMPLE_LOGPROBS)
            return gptoss_set_error(error, bad,
                                    "sample row %d: n_top_logprobs %d is outside [-1, %d]", i,
                                    r->n_top_logprobs, GPTOSS_MAX_SAMPLE_LOGPROBS);
        if (r->n_top_logprobs >= 0 && !b->logprobs)
            return gptoss_set_error(
                error, bad, "sample row %d asks for logprobs but the logprobs output is NULL", i);
        if (r->n_top_logprobs > 0 && (!b->top_ids || !b->top_logprobs))
            return gptoss_set_error(
                error, bad,
                "sample row %d asks for top logprobs but top_ids / top_logprobs is NULL", i);
        if (r->allowed_row < -1 || r->allowed_row >= b->n_allowed_rows)
            return gptoss_set_error(error, bad, "sample row %d: allowed_row %d is outside [-1, %d)",
                                    i, r->allowed_row, b->n_allowed_rows);
        if (r->n_edits < 0 || r->edit_start < 0 || r->edit_start > b->n_edits - r->n_edits)
            return gptoss_set_error(error, bad,
                                    "sample row %d: edits [%d, %d + %d) are outside the batch's %d",
                                    i, r->edit_start, r->edit_start, r->n_edits, b->n_edits);
        for (int32_t e = 0; e < r->n_edits; e++) {
            const gptoss_sample_edit *ed = &b->edits[r->edit_start + e];
            if (ed->token < 0 || ed->token >= V)
                return gptoss_set_error(
                    error, bad, "sample row %d: edit of token %d outside the vocabulary [0, %d)", i,
                    ed->token, V);
            if (e > 0 && ed->token <= b->edits[r->edit_start + e - 1].token)
                return gptoss_set_error(error, bad,
                                        "sample row %d: edits must be sorted by token with no "
                                        "token twice (%d after %d)",
                                        i, ed->token, b->edits[r->edit_start + e - 1].token);
            if (!isfinite(ed->bias) || ed->output_count < 0)
                return gptoss_set_error(
                    error, bad, "sample row %d: edit of token %d has bias %g / output_count %d", i,
                    ed->token, (double)ed->bias, ed->output_count);
        }
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_sample_batch_fill_masks(const gptoss_sample_batch *batch, uint32_t *masks,
                                             gptoss_sample_batch *out, gptoss_error *error) {
    *out = *batch;
    if (!batch->fill_masks) return GPTOSS_OK;
    gptoss_status st = batch->fill_masks(batch->fill_masks_user, masks, error);
    if (st != GPTOSS_OK) return st;
    out->allowed_masks = masks;
    out->fill_masks = NULL;
    out->fill_masks_user = NULL;
    return GPTOSS_OK;
}

static void sample_row(const float *logits, int32_t V, const gptoss_sample_batch *b, int32_t i,
                       gptoss_sample_scratch *s) {
    const gptoss_sample_row *row = &b->rows[i];
    const size_t words = ((size_t)V + 31) / 32;
    const uint32_t *mask =
        row->allowed_row >= 0 ? b->allowed_masks + (size_t)row->allowed_row * words : NULL;
    const gptoss_sample_edit *edits = row->n_edits > 0 ? b->edits + row->edit_start : NULL;
    const int32_t token = gptoss_sample_reference(logits, V, row, edits, mask, s);
    b->token_ids[i] = token;
    if (row->n_top_logprobs >= 0) {
        const size_t at = (size_t)i * GPTOSS_MAX_SAMPLE_LOGPROBS;
        b->logprobs[i] = gptoss_sample_logprobs(
            logits, V, token, row->n_top_logprobs, row->n_top_logprobs > 0 ? b->top_ids + at : NULL,
            row->n_top_logprobs > 0 ? b->top_logprobs + at : NULL);
    }
}

void gptoss_sample_rows(const float *logits, int32_t V, int32_t n_rows,
                        const gptoss_sample_batch *b, gptoss_sample_scratch *const *scratch,
                        int32_t n_scratch) {
    int n_threads = n_scratch < n_rows ? n_scratch : n_rows;
    if (n_threads <= 1) {
        for (int32_t i = 0; i < n_rows; i++)
            sample_row(logits + (size_t)i * V, V, b, i, scratch[0]);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (int32_t i = 0; i < n_rows; i++)
        sample_row(logits + (size_t)i * V, V, b, i, scratch[omp_get_thread_num()]);
}
