/*
 * json_schema.c - the run time of compiled JSON Schemas (see json_schema.h, json_automaton.h and
 * docs/structured-output.md): the per-tokenizer vocabulary, the lazy DFA, token masks and the
 * matcher.
 *
 * The pushdown automaton is determinized lazily: a DFA state is an interned, sorted set of live
 * configurations (those that can still complete within the stack bound), with a 256-entry
 * next-state table filled on demand. A state's token mask comes from one linear pass over the
 * preorder token trie that follows the DFA and skips every rejected subtree; it is cached in
 * the state (25 KB), so a state seen before costs one OR of the mask. Budgets use the
 * distances of json_automaton.h: `allow` under a budget offers only tokens after which the
 * shortest completion fits.
 *
 * Owns: the DFA cache of each schema (behind one mutex per schema) and the matchers.
 */
#include "structured/json_automaton.h"

#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the vocabulary ---------------------------------------------------------------------- */

gptoss_status gptoss_json_vocab_create(const gptoss_tokenizer *tokenizer, gptoss_json_vocab **out,
                                       gptoss_error *error) {
    *out = NULL;
    gptoss_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    gptoss_status st = token_trie_build(tokenizer, &v->trie, error);
    if (st != GPTOSS_OK) {
        free(v);
        return st;
    }
    *out = v;
    return GPTOSS_OK;
}

void gptoss_json_vocab_free(gptoss_json_vocab *vocab) {
    if (!vocab) return;
    token_trie_free(&vocab->trie);
    free(vocab);
}

/* ---- the lazy DFA (all under schema->lock) ----------------------------------------------- */

static inline uint32_t hash64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* The frame (ret, parent), interned; -1 when out of memory. */
static int32_t intern_frame(gptoss_json_schema *s, int32_t ret, int32_t parent) {
    uint32_t h = hash64(((uint64_t)(uint32_t)ret << 32) | (uint32_t)parent);
    int32_t mask = s->frame_table_size - 1;
    for (int32_t i = (int32_t)(h & (uint32_t)mask);; i = (i + 1) & mask) {
        int32_t id = s->frame_table[i];
        if (id < 0) break;
        if (s->frames[id].ret == ret && s->frames[id].parent == parent) return id;
    }
    if (s->n_frames == s->cap_frames) {
        int32_t cap = s->cap_frames * 2;
        stack_frame *f = realloc(s->frames, (size_t)cap * sizeof *f);
        if (!f) return -1;
        s->frames = f;
        s->cap_frames = cap;
    }
    if (2 * (s->n_frames + 1) > s->frame_table_size) {
        int32_t size = s->frame_table_size * 2;
        int32_t *t = malloc((size_t)size * sizeof *t);
        if (!t) return -1;
        memset(t, 0xFF, (size_t)size * sizeof *t);
        for (int32_t id = 0; id < s->n_frames; id++) {
            uint32_t hh = hash64(((uint64_t)(uint32_t)s->frames[id].ret << 32) |
                                 (uint32_t)s->frames[id].parent);
            int32_t i = (int32_t)(hh & (uint32_t)(size - 1));
            while (t[i] >= 0)
                i = (i + 1) & (size - 1);
            t[i] = id;
        }
        free(s->frame_table);
        s->frame_table = t;
        s->frame_table_size = size;
        mask = size - 1;
    }
    int32_t id = s->n_frames++;
    const stack_frame *p = &s->frames[parent];
    s->frames[id] = (stack_frame){.ret = ret,
                                  .parent = parent,
                                  .depth = p->depth + 1,
                                  .dist = dist_add(dist_at(s, ret, p->depth), p->dist)};
    int32_t i = (int32_t)(h & (uint32_t)mask);
    while (s->frame_table[i] >= 0)
        i = (i + 1) & mask;
    s->frame_table[i] = id;
    return id;
}

static inline uint32_t config_dist(const gptoss_json_schema *s, uint64_t config) {
    const stack_frame *f = &s->frames[config >> 32];
    return dist_add(dist_at(s, (int32_t)(uint32_t)config, f->depth), f->dist);
}

static bool seen_insert(gptoss_json_schema *s, uint64_t key, int32_t *n_seen) {
    if (2 * (*n_seen + 1) > s->seen_size) {
        int32_t size = s->seen_size * 2;
        uint64_t *t = malloc((size_t)size * sizeof *t);
        if (!t) return false;
        memset(t, 0xFF, (size_t)size * sizeof *t);
        for (int32_t i = 0; i < s->seen_size; i++) {
            if (s->seen[i] == UINT64_MAX) continue;
            int32_t j = (int32_t)(hash64(s->seen[i]) & (uint32_t)(size - 1));
            while (t[j] != UINT64_MAX)
                j = (j + 1) & (size - 1);
            t[j] = s->seen[i];
        }
        free(s->seen);
        s->seen = t;
        s->seen_size = size;
    }
    int32_t mask = s->seen_size - 1;
    for (int32_t i = (int32_t)(hash64(key) & (uint32_t)mask);; i = (i + 1) & mask) {
        if (s->seen[i] == key) return false;
        if (s->seen[i] == UINT64_MAX) {
            s->seen[i] = key;
            (*n_seen)++;
            return true;
        }
    }
}

static bool push_u64(uint64_t **buf, int32_t *n, int32_t *cap, uint64_t v) {
    if (*n == *cap) {
        int32_t c = *cap ? *cap * 2 : 256;
        uint64_t *b = realloc(*buf, (size_t)c * sizeof *b);
        if (!b) return false;
        *buf = b;
        *cap = c;
    }
    (*buf)[(*n)++] = v;
    return true;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Interns the DFA state of a sorted configuration set; NEXT_DEAD when out of memory or over
 * the state limit. */
static int32_t intern_dfa(gptoss_json_schema *s, const uint64_t *configs, int32_t n) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ hash64(configs[i])) * 16777619u;
    int32_t mask = s->dfa_table_size - 1;
    for (int32_t i = (int32_t)(h & (uint32_t)mask);; i = (i + 1) & mask) {
        int32_t id = s->dfa_table[i];
        if (id < 0) break;
        const dfa_state *d = &s->dfa[id];
        if (d->hash == h && d->n_configs == n &&
            memcmp(d->configs, configs, (size_t)n * sizeof *configs) == 0)
            return id;
    }
    if (s->n_dfa == s->cap_dfa) {
        int32_t cap = s->cap_dfa * 2;
        dfa_state *d = realloc(s->dfa, (size_t)cap * sizeof *d);
        if (d) s->dfa = d;
        int32_t **nx = realloc(s->next, (size_t)cap * sizeof *nx);
        if (nx) s->next = nx;
        uint32_t *dd = realloc(s->dfa_dist, (size_t)cap * sizeof *dd);
        if (dd) s->dfa_dist = dd;
        if (!d || !nx || !dd) return NEXT_DEAD;
        s->cap_dfa = cap;
    }
    if (2 * (s->n_dfa + 1) > s->dfa_table_size) {
        int32_t size = s->dfa_table_size * 2;
        int32_t *t = malloc((size_t)size * sizeof *t);
        if (!t) return NEXT_DEAD;
        memset(t, 0xFF, (size_t)size * sizeof *t);
        for (int32_t id = 0; id < s->n_dfa; id++) {
            int32_t i = (int32_t)(s->dfa[id].hash & (uint32_t)(size - 1));
            while (t[i] >= 0)
                i = (i + 1) & (size - 1);
            t[i] = id;
        }
        free(s->dfa_table);
        s->dfa_table = t;
        s->dfa_table_size = size;
        mask = size - 1;
    }
    uint64_t *copy = malloc((size_t)n * sizeof *copy);
    int32_t *next = malloc(256 * sizeof *next);
    if (!copy || !next) {
        free(copy);
        free(next);
        return NEXT_DEAD;
    }
    memcpy(copy, configs, (size_t)n * sizeof *copy);
    for (int i = 0; i < 256; i++)
        next[i] = NEXT_UNKNOWN;
    uint32_t best = DIST_INF;
    bool accept = false;
    uint64_t accept_config = (uint32_t)s->machines[0].exit; /* root exit, empty stack */
    for (int32_t i = 0; i < n; i++) {
        uint32_t d = config_dist(s, configs[i]);
        if (d < best) best = d;
        if (configs[i] == accept_config) accept = true;
    }
    int32_t id = s->n_dfa++;
    s->dfa[id] = (dfa_state){.configs = copy, .n_configs = n, .hash = h, .accept = accept};
    s->next[id] = next;
    s->dfa_dist[id] = best;
    int32_t i = (int32_t)(h & (uint32_t)mask);
    while (s->dfa_table[i] >= 0)
        i = (i + 1) & mask;
    s->dfa_table[i] = id;
    return id;
}

/* The DFA state of the epsilon closure of s->work[0..n_work) (configurations that can still
 * complete, kept where they read a byte or accept). */
static int32_t closure(gptoss_json_schema *s, int32_t n_work) {
    int32_t n_found = 0, n_seen = 0;
    for (int32_t i = 0; i < s->seen_size; i++)
        s->seen[i] = UINT64_MAX;
    bool ok = true;
    while (n_work > 0 && ok) {
        uint64_t config = s->work[--n_work];
        if (!seen_insert(s, config, &n_seen)) continue;
        if (config_dist(s, config) >= DIST_INF) continue;
        int32_t state = (int32_t)(uint32_t)config;
        int32_t frame = (int32_t)(config >> 32);
        const stack_frame f = s->frames[frame];
        bool reads = false;
        if (s->exit_of[state] >= 0) {
            if (frame == 0)
                reads = true; /* the root's exit: accepting */
            else
                ok = push_u64(&s->work, &n_work, &s->cap_work,
                              ((uint64_t)(uint32_t)f.parent << 32) | (uint32_t)f.ret);
        }
        for (int32_t e = s->edge_start[state]; e < s->edge_start[state + 1] && ok; e++) {
            const nfa_edge *edge = &s->edges[e];
            if (edge->kind == EDGE_BYTE) {
                reads = true;
            } else if (edge->kind == EDGE_EPS) {
                ok = push_u64(&s->work, &n_work, &s->cap_work,
                              ((uint64_t)(uint32_t)frame << 32) | (uint32_t)edge->to);
            } else if (f.depth + 1 <= JSON_MAX_STACK) {
                int32_t callee_frame = intern_frame(s, edge->to, frame);
                ok = callee_frame >= 0 && push_u64(&s->work, &n_work, &s->cap_work,
                                                   ((uint64_t)(uint32_t)callee_frame << 32) |
                                                       (uint32_t)s->machines[edge->callee].start);
            }
        }
        if (reads && ok) ok = push_u64(&s->found, &n_found, &s->cap_found, config);
    }
    if (!ok || n_found == 0) return NEXT_DEAD;
    qsort(s->found, (size_t)n_found, sizeof *s->found, cmp_u64);
    return intern_dfa(s, s->found, n_found);
}

static int32_t dfa_step(gptoss_json_schema *s, int32_t from, uint8_t byte) {
    int32_t n_work = 0;
    const dfa_state *d = &s->dfa[from];
    bool ok = true;
    for (int32_t i = 0; i < d->n_configs && ok; i++) {
        uint64_t config = d->configs[i];
        int32_t state = (int32_t)(uint32_t)config;
        for (int32_t e = s->edge_start[state]; e < s->edge_start[state + 1] && ok; e++) {
            const nfa_edge *edge = &s->edges[e];
            if (edge->kind == EDGE_BYTE && edge->lo <= byte && byte <= edge->hi)
                ok = push_u64(&s->work, &n_work, &s->cap_work,
                              (config & 0xFFFFFFFF00000000ULL) | (uint32_t)edge->to);
        }
    }
    int32_t to = ok && n_work > 0 ? closure(s, n_work) : NEXT_DEAD;
    s->next[from][byte] = to;
    return to;
}

static inline int32_t dfa_next(gptoss_json_schema *s, int32_t from, uint8_t byte) {
    int32_t to = s->next[from][byte];
    return to != NEXT_UNKNOWN ? to : dfa_step(s, from, byte);
}

/* Sets the bit of every token after which the state can complete within `limit` bytes (and
 * id < n_bits). Returns the largest such distance. */
static uint32_t walk_trie(gptoss_json_schema *s, int32_t from, uint32_t limit, uint32_t *mask,
                          int32_t n_bits, int32_t *n_up, int32_t *n_down) {
    uint32_t d0 = s->dfa_dist[from];
    bool collect = n_up != NULL;
    const token_trie *t = &s->vocab->trie;
    const token_trie_node *nodes = t->nodes;
    int32_t *stack = s->walk_stack;
    uint32_t max_after = 0;
    stack[0] = from;
    for (int32_t i = 0; i < t->n_nodes;) {
        const token_trie_node *node = &nodes[i];
        int32_t parent = stack[node->depth - 1];
        int32_t to = s->next[parent][node->byte];
        if (to == NEXT_UNKNOWN) to = dfa_step(s, parent, node->byte);
        if (to < 0) {
            i = node->skip;
            continue;
        }
        stack[node->depth] = to;
        if (node->token >= 0 && node->token < n_bits) {
            uint32_t d = s->dfa_dist[to];
            if (d <= limit) {
                mask[node->token >> 5] |= 1u << (node->token & 31);
                if (d > max_after) max_after = d;
                uint64_t move = ((uint64_t)d << 32) | (uint32_t)node->token;
                if (collect && d > d0 && !push_u64(&s->up, n_up, &s->cap_up, move)) collect = false;
                if (collect && d < d0 && !push_u64(&s->down, n_down, &s->cap_down, move))
                    collect = false;
            }
        }
        i++;
    }
    if (n_up && !collect) *n_up = *n_down = -1; /* out of memory: no moves */
    return max_after;
}

static void drop_masks(gptoss_json_schema *s) {
    for (int32_t i = 0; i < s->n_dfa; i++) {
        free(s->dfa[i].mask);
        free(s->dfa[i].moves);
        s->dfa[i].mask = NULL;
        s->dfa[i].moves = NULL;
    }
    s->mask_bytes = 0;
}

/* The cached mask of a state (computed on first use); NULL when out of memory. */
static const uint32_t *state_mask(gptoss_json_schema *s, int32_t state) {
    if (s->dfa[state].mask) return s->dfa[state].mask;
    size_t bytes = (size_t)s->mask_words * sizeof(uint32_t);
    if (s->mask_bytes + bytes > JSON_MASK_CACHE_BYTES) drop_masks(s);
    uint32_t *mask = calloc((size_t)s->mask_words, sizeof *mask);
    if (!mask) return NULL;
    int32_t n_up = 0, n_down = 0;
    uint32_t max_after =
        walk_trie(s, state, DIST_INF - 1, mask, s->vocab->trie.n_tokens, &n_up, &n_down);
    dfa_state *d = &s->dfa[state];
    d->mask = mask;
    d->max_after = max_after;
    d->moves = NULL;
    d->n_up = d->n_down = 0;
    if (n_up >= 0 && n_up + n_down > 0) {
        d->moves = malloc((size_t)(n_up + n_down) * sizeof *d->moves);
        if (d->moves) {
            /* either list may be empty (and its buffer never allocated) */
            if (n_up > 0) memcpy(d->moves, s->up, (size_t)n_up * sizeof *d->moves);
            if (n_down > 0) memcpy(d->moves + n_up, s->down, (size_t)n_down * sizeof *d->moves);
            d->n_up = n_up, d->n_down = n_down;
            bytes += (size_t)(n_up + n_down) * sizeof *d->moves;
        }
    }
    s->mask_bytes += bytes;
    return mask;
}

/* Empties the DFA cache (matchers re-intern their configurations) once it holds too many
 * states; called between matcher operations, never inside a trie walk. */
static void maybe_reset(gptoss_json_schema *s) {
    if (s->n_dfa < JSON_MAX_DFA_STATES) return;
    for (int32_t i = 0; i < s->n_dfa; i++) {
        free(s->dfa[i].configs);
        free(s->dfa[i].mask);
        free(s->dfa[i].moves);
        free(s->next[i]);
    }
    s->n_dfa = 0;
    s->mask_bytes = 0;
    memset(s->dfa_table, 0xFF, (size_t)s->dfa_table_size * sizeof *s->dfa_table);
    s->generation++;
    s->work[0] = (uint32_t)s->machines[0].start;
    s->start = closure(s, 1);
}

/* ---- compile and free -------------------------------------------------------------------- */

void gptoss_json_schema_free(gptoss_json_schema *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_dfa; i++) {
        free(s->dfa[i].configs);
        free(s->dfa[i].mask);
        free(s->dfa[i].moves);
        free(s->next[i]);
    }
    free(s->dfa);
    free(s->up);
    free(s->down);
    free(s->scratch_mask);
    free(s->next);
    free(s->dfa_dist);
    free(s->dfa_table);
    free(s->frames);
    free(s->frame_table);
    free(s->work);
    free(s->found);
    free(s->seen);
    free(s->walk_stack);
    free(s->dist);
    free(s->edge_start);
    free(s->edges);
    free(s->exit_of);
    json_machines_free(s->machines, s->n_machines);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static bool init_runtime(gptoss_json_schema *s) {
    s->cap_frames = 64;
    s->frames = malloc((size_t)s->cap_frames * sizeof *s->frames);
    s->frame_table_size = 128;
    s->frame_table = malloc((size_t)s->frame_table_size * sizeof *s->frame_table);
    s->cap_dfa = 64;
    s->dfa = malloc((size_t)s->cap_dfa * sizeof *s->dfa);
    s->next = malloc((size_t)s->cap_dfa * sizeof *s->next);
    s->dfa_dist = malloc((size_t)s->cap_dfa * sizeof *s->dfa_dist);
    s->dfa_table_size = 128;
    s->dfa_table = malloc((size_t)s->dfa_table_size * sizeof *s->dfa_table);
    s->seen_size = 256;
    s->seen = malloc((size_t)s->seen_size * sizeof *s->seen);
    s->walk_stack = malloc(((size_t)s->vocab->trie.max_depth + 1) * sizeof *s->walk_stack);
    if (!s->frames || !s->frame_table || !s->dfa || !s->next || !s->dfa_dist || !s->dfa_table ||
        !s->seen || !s->walk_stack)
        return false;
    memset(s->frame_table, 0xFF, (size_t)s->frame_table_size * sizeof *s->frame_table);
    memset(s->dfa_table, 0xFF, (size_t)s->dfa_table_size * sizeof *s->dfa_table);
    s->frames[0] = (stack_frame){.ret = -1, .parent = -1, .depth = 0, .dist = 0};
    s->n_frames = 1;
    s->frame_table[hash64(((uint64_t)UINT32_MAX << 32) | UINT32_MAX) & 127] = 0;
    s->mask_words = (s->vocab->trie.n_tokens + 31) / 32;
    return true;
}

gptoss_status gptoss_json_schema_compile(const json_t *schema, const gptoss_json_vocab *vocab,
                                         gptoss_json_schema **out, gptoss_error *error) {
    *out = NULL;
    if (!vocab) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "no vocabulary");
    gptoss_error local = {0};
    if (!error) error = &local;
    gptoss_json_schema *s = calloc(1, sizeof *s);
    if (!s) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    s->vocab = vocab;
    pthread_mutex_init(&s->lock, NULL);
    gptoss_status status = json_schema_build(schema, s, error);
    if (status == GPTOSS_OK && !init_runtime(s)) status = GPTOSS_ERR_OUT_OF_MEMORY;
    if (status == GPTOSS_OK) {
        s->work = malloc(256 * sizeof *s->work);
        s->cap_work = s->work ? 256 : 0;
        if (s->work) {
            s->work[0] = (uint32_t)s->machines[0].start;
            s->start = closure(s, 1);
        }
        if (!s->work || s->start < 0) status = GPTOSS_ERR_OUT_OF_MEMORY;
    }
    if (status != GPTOSS_OK) {
        if (status == GPTOSS_ERR_OUT_OF_MEMORY && !error->message[0])
            gptoss_set_error(error, status, "out of memory compiling the schema");
        error->status = status;
        gptoss_json_schema_free(s);
        return status;
    }
    *out = s;
    return GPTOSS_OK;
}

/* ---- the matcher ------------------------------------------------------------------------- */

typedef struct json_matcher {
    gptoss_token_constraint base;
    gptoss_json_schema *schema;
    int32_t state; /* DFA state, valid while generation matches the schema's */
    uint32_t generation;
    uint64_t *configs; /* [n_configs] the state's configurations, to re-intern it */
    int32_t n_configs, cap_configs;
    int32_t tokens_left; /* < 0: unlimited */
} json_matcher;

/* The matcher's DFA state in the current cache (re-interned after a reset); under the lock. */
static int32_t matcher_state(json_matcher *m) {
    gptoss_json_schema *s = m->schema;
    maybe_reset(s);
    if (m->generation != s->generation) {
        m->state = intern_dfa(s, m->configs, m->n_configs);
        m->generation = s->generation;
    }
    return m->state;
}

static bool matcher_set_state(json_matcher *m, int32_t state) {
    const dfa_state *d = &m->schema->dfa[state];
    if (d->n_configs > m->cap_configs) {
        uint64_t *c = realloc(m->configs, (size_t)d->n_configs * sizeof *c);
        if (!c) return false;
        m->configs = c;
        m->cap_configs = d->n_configs;
    }
    memcpy(m->configs, d->configs, (size_t)d->n_configs * sizeof *m->configs);
    m->n_configs = d->n_configs;
    m->state = state;
    m->generation = m->schema->generation;
    return true;
}

static void matcher_allow(gptoss_token_constraint *self, uint32_t *mask, int32_t vocab) {
    json_matcher *m = (json_matcher *)self;
    gptoss_json_schema *s = m->schema;
    if (m->tokens_left == 0) return;
    int32_t n_tokens = s->vocab->trie.n_tokens;
    int32_t n_bits = vocab < n_tokens ? vocab : n_tokens;
    uint32_t limit = m->tokens_left < 0 ? DIST_INF - 1 : (uint32_t)(m->tokens_left - 1);
    pthread_mutex_lock(&s->lock);
    int32_t state = matcher_state(m);
    const uint32_t *cached = state >= 0 ? state_mask(s, state) : NULL;
    if (state < 0) {
        /* out of memory: nothing is offered */
    } else if (cached && s->dfa[state].max_after <= limit) {
        int32_t full = n_bits / 32;
        for (int32_t w = 0; w < full; w++)
            mask[w] |= cached[w];
        if (n_bits % 32) mask[full] |= cached[full] & ((1u << (n_bits % 32)) - 1);
    } else if (cached && s->dfa[state].moves && limit >= s->dfa_dist[state]) {
        /* the cached mask less the tokens that move too far from completion */
        const dfa_state *d = &s->dfa[state];
        if (!s->scratch_mask) s->scratch_mask = malloc((size_t)s->mask_words * sizeof(uint32_t));
        if (s->scratch_mask) {
            uint32_t *scratch = s->scratch_mask;
            memcpy(scratch, cached, (size_t)s->mask_words * sizeof *scratch);
            for (int32_t i = 0; i < d->n_up; i++) {
                if ((uint32_t)(d->moves[i] >> 32) <= limit) continue;
                uint32_t t = (uint32_t)d->moves[i];
                scratch[t >> 5] &= ~(1u << (t & 31));
            }
            int32_t full = n_bits / 32;
            for (int32_t w = 0; w < full; w++)
                mask[w] |= scratch[w];
            if (n_bits % 32) mask[full] |= scratch[full] & ((1u << (n_bits % 32)) - 1);
        } else {
            walk_trie(s, state, limit, mask, n_bits, NULL, NULL);
        }
    } else if (cached && s->dfa[state].moves) {
        /* fewer tokens left than the distance: only tokens that move closer can fit */
        const dfa_state *d = &s->dfa[state];
        for (int32_t i = d->n_up; i < d->n_up + d->n_down; i++) {
            uint32_t t = (uint32_t)d->moves[i];
            if ((uint32_t)(d->moves[i] >> 32) <= limit && (int32_t)t < n_bits)
                mask[t >> 5] |= 1u << (t & 31);
        }
    } else {
        walk_trie(s, state, limit, mask, n_bits, NULL, NULL);
    }
    pthread_mutex_unlock(&s->lock);
}

static bool matcher_advance(gptoss_token_constraint *self, int32_t token) {
    json_matcher *m = (json_matcher *)self;
    gptoss_json_schema *s = m->schema;
    const token_trie *t = &s->vocab->trie;
    if (token < 0 || token >= t->n_tokens || m->tokens_left == 0) return false;
    uint32_t begin = t->offsets[token], end = t->offsets[token + 1];
    if (begin == end) return false;
    pthread_mutex_lock(&s->lock);
    int32_t state = matcher_state(m);
    for (uint32_t i = begin; i < end && state >= 0; i++)
        state = dfa_next(s, state, t->bytes[i]);
    bool ok = state >= 0 &&
              (m->tokens_left < 0 || s->dfa_dist[state] <= (uint32_t)(m->tokens_left - 1)) &&
              matcher_set_state(m, state);
    pthread_mutex_unlock(&s->lock);
    if (!ok) return false;
    if (m->tokens_left > 0) m->tokens_left--;
    return true;
}

static bool matcher_complete(const gptoss_token_constraint *self) {
    json_matcher *m = (json_matcher *)(uintptr_t)self; /* may re-intern its state */
    gptoss_json_schema *s = m->schema;
    pthread_mutex_lock(&s->lock);
    int32_t state = matcher_state(m);
    bool accept = state >= 0 && s->dfa[state].accept;
    pthread_mutex_unlock(&s->lock);
    return accept;
}

static void matcher_free(gptoss_token_constraint *self) {
    free(((json_matcher *)self)->configs);
    free(self);
}

static const gptoss_token_constraint_ops json_matcher_ops = {
    .allow = matcher_allow,
    .advance = matcher_advance,
    .complete = matcher_complete,
    .free = matcher_free,
};

gptoss_status gptoss_json_matcher_create(gptoss_json_schema *schema, gptoss_token_constraint **out,
                                         gptoss_error *error) {
    *out = NULL;
    if (!schema) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "no schema");
    json_matcher *m = calloc(1, sizeof *m);
    if (!m) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    m->base.ops = &json_matcher_ops;
    m->schema = schema;
    m->tokens_left = -1;
    pthread_mutex_lock(&schema->lock);
    maybe_reset(schema);
    bool ok = schema->start >= 0 && matcher_set_state(m, schema->start);
    pthread_mutex_unlock(&schema->lock);
    if (!ok) {
        matcher_free(&m->base);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *out = &m->base;
    return GPTOSS_OK;
}

void gptoss_json_matcher_set_budget(gptoss_token_constraint *matcher, int32_t tokens_left) {
    json_matcher *m = (json_matcher *)matcher;
    m->tokens_left = tokens_left < 0 ? 0 : tokens_left;
}
