/*
 * harmony_constraint.c - harmony framing of structured output (see harmony_constraint.h).
 *
 * Owns: two tries of header token sequences ("<|start|>assistant" + header, one tokenization
 * each): one of every target, one of the budgeted targets only, walked side by side so that
 * budget pressure can narrow a header that is already under way; the mask of text tokens
 * (copied, not rebuilt, for free bodies); and the per-choice state machine
 * HEADER -> BODY -> (HEADER after <|end|> | DONE after a turn-ending token).
 */
#include "structured/harmony_constraint.h"

#include "model/special_tokens.h"

#include <stdlib.h>
#include <string.h>

typedef struct trie_node {
    int32_t *tokens;   /* [n] edge labels */
    int32_t *children; /* [n] node index per edge */
    int32_t n, cap;
    int32_t target; /* a leaf: the target its header completes; else -1 */
    int32_t depth;  /* most tokens from here to a leaf */
} trie_node;

typedef struct trie {
    trie_node *nodes; /* [n] node 0 is the root (before <|start|>) */
    int32_t n, cap;
} trie;

typedef struct frame_target {
    char *header;
    gptoss_harmony_body_kind kind;
    int32_t end_token;
    bool budgeted;
    gptoss_harmony_body_source body;
} frame_target;

struct gptoss_harmony_frame {
    frame_target *targets; /* [n_targets] */
    size_t n_targets;
    trie all;               /* every target */
    trie budgeted;          /* the budgeted targets (n == 0: none) */
    int32_t all_start;      /* node of `all` after "<|start|>assistant" */
    int32_t budgeted_start; /* ... of `budgeted`, or -1 */
    bool budget_applies;    /* a constrained body exists and a budgeted target to fall back to */
    int32_t max_tokens;     /* 0: no budget */
    int32_t body_reserve;
    int32_t budgeted_depth; /* longest budgeted path from the root */
    uint32_t *text_mask;    /* [text_words] ordinary tokens */
    size_t text_words;
};

enum state { S_HEADER, S_BODY, S_DONE, S_BROKEN };

struct gptoss_harmony_constraint {
    const gptoss_harmony_frame *frame;
    int32_t n_seen; /* generated tokens taken so far */
    enum state state;
    int32_t node;                  /* S_HEADER: node of frame->all */
    int32_t bnode;                 /* S_HEADER: node of frame->budgeted with the same path, or -1 */
    int32_t target;                /* S_BODY: the target being written */
    gptoss_token_constraint *body; /* S_BODY of a CONSTRAINED target */
};

/* ---- tries ---------------------------------------------------------------------------------- */

static int32_t trie_new_node(trie *t) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 16;
        trie_node *nodes = realloc(t->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) return -1;
        t->nodes = nodes;
        t->cap = cap;
    }
    trie_node *node = &t->nodes[t->n];
    memset(node, 0, sizeof *node);
    node->target = -1;
    return t->n++;
}

static int32_t trie_child(const trie *t, int32_t node, int32_t token) {
    const trie_node *nd = &t->nodes[node];
    for (int32_t i = 0; i < nd->n; i++)
        if (nd->tokens[i] == token) return nd->children[i];
    return -1;
}

/* Inserts ids[0..n) ending at target. Returns false on out-of-memory; *conflict when the path
 * is a prefix of another or passes through a leaf. */
static bool trie_insert(trie *t, const int32_t *ids, size_t n, int32_t target, bool *conflict) {
    if (t->n == 0 && trie_new_node(t) < 0) return false;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->nodes[node].target >= 0) *conflict = true;
        int32_t next = trie_child(t, node, ids[i]);
        if (next < 0) {
            next = trie_new_node(t);
            if (next < 0) return false;
            trie_node *nd = &t->nodes[node];
            if (nd->n == nd->cap) {
                int32_t cap = nd->cap ? nd->cap * 2 : 4;
                int32_t *tokens = realloc(nd->tokens, (size_t)cap * sizeof *tokens);
                if (!tokens) return false;
                nd->tokens = tokens;
                int32_t *children = realloc(nd->children, (size_t)cap * sizeof *children);
                if (!children) return false;
                nd->children = children;
                nd->cap = cap;
            }
            nd->tokens[nd->n] = ids[i];
            nd->children[nd->n] = next;
            nd->n++;
        }
        node = next;
    }
    if (t->nodes[node].n > 0 || t->nodes[node].target >= 0) *conflict = true;
    t->nodes[node].target = target;
    return true;
}

/* Children always have larger indices than their parent: one backward pass sets depths. */
static void trie_depths(trie *t) {
    for (int32_t i = t->n - 1; i >= 0; i--) {
        trie_node *nd = &t->nodes[i];
        nd->depth = 0;
        for (int32_t k = 0; k < nd->n; k++) {
            int32_t d = t->nodes[nd->children[k]].depth + 1;
            if (d > nd->depth) nd->depth = d;
        }
    }
}

static int32_t trie_walk(const trie *t, const int32_t *ids, size_t n) {
    if (t->n == 0) return -1;
    int32_t node = 0;
    for (size_t i = 0; i < n && node >= 0; i++)
        node = trie_child(t, node, ids[i]);
    return node;
}

static void trie_free(trie *t) {
    for (int32_t i = 0; i < t->n; i++) {
        free(t->nodes[i].tokens);
        free(t->nodes[i].children);
    }
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

/* ---- the frame ------------------------------------------------------------------------------ */

void gptoss_harmony_frame_free(gptoss_harmony_frame *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_targets; i++)
        free(f->targets[i].header);
    free(f->targets);
    trie_free(&f->all);
    trie_free(&f->budgeted);
    free(f->text_mask);
    free(f);
}

static gptoss_status frame_fail(gptoss_harmony_frame *f, gptoss_tokens *ids, gptoss_status st) {
    gptoss_tokens_free(ids);
    gptoss_harmony_frame_free(f);
    return st;
}

gptoss_status gptoss_harmony_frame_create(const gptoss_tokenizer *tokenizer,
                                          const gptoss_harmony_target *targets, size_t n_targets,
                                          int32_t max_tokens, int32_t body_reserve,
                                          gptoss_harmony_frame **out, gptoss_error *error) {
    *out = NULL;
    const gptoss_status bad = GPTOSS_ERR_INVALID_ARGUMENT, oom = GPTOSS_ERR_OUT_OF_MEMORY;
    if (n_targets == 0 || max_tokens < 0 || body_reserve < 0)
        return gptoss_set_error(error, bad, "harmony frame: no targets or a negative budget");
    gptoss_harmony_frame *f = calloc(1, sizeof *f);
    if (!f) return gptoss_set_error(error, oom, "out of memory");
    f->targets = calloc(n_targets, sizeof *f->targets);
    if (!f->targets) return frame_fail(f, NULL, gptoss_set_error(error, oom, "out of memory"));
    f->n_targets = n_targets;
    f->max_tokens = max_tokens;
    f->body_reserve = body_reserve;
    gptoss_tokens ids = {0};
    static const char start[] = "<|start|>assistant";
    gptoss_status st = gptoss_tokenizer_encode(tokenizer, start, strlen(start), true, &ids, error);
    if (st) return frame_fail(f, &ids, st);
    const size_t n_start = ids.n;
    bool has_budget_body = false;
    for (size_t i = 0; i < n_targets; i++) {
        const gptoss_harmony_target *in = &targets[i];
        frame_target *t = &f->targets[i];
        t->header = strdup(in->header ? in->header : "");
        if (!t->header) return frame_fail(f, &ids, gptoss_set_error(error, oom, "out of memory"));
        t->kind = in->kind;
        t->end_token = in->kind == GPTOSS_HARMONY_BODY_REASONING ? GPTOSS_TOKEN_END : in->end_token;
        t->budgeted = in->budgeted && in->kind != GPTOSS_HARMONY_BODY_REASONING;
        t->body = in->body;
        if (in->kind == GPTOSS_HARMONY_BODY_CONSTRAINED) {
            if (!in->body.create)
                return frame_fail(f, &ids,
                                  gptoss_set_error(error, bad,
                                                   "harmony frame: target '%s' has no "
                                                   "body constraint",
                                                   t->header));
            has_budget_body = true;
        }
        ids.n = n_start;
        st = gptoss_tokenizer_encode(tokenizer, t->header, strlen(t->header), true, &ids, error);
        if (st) return frame_fail(f, &ids, st);
        if (ids.n == n_start || ids.ids[ids.n - 1] != GPTOSS_TOKEN_MESSAGE)
            return frame_fail(f, &ids,
                              gptoss_set_error(error, bad,
                                               "harmony frame: header '%s' does not end in "
                                               "<|message|>",
                                               t->header));
        bool conflict = false;
        if (!trie_insert(&f->all, ids.ids, ids.n, (int32_t)i, &conflict) ||
            (t->budgeted && !trie_insert(&f->budgeted, ids.ids, ids.n, (int32_t)i, &conflict)))
            return frame_fail(f, &ids, gptoss_set_error(error, oom, "out of memory"));
        if (conflict)
            return frame_fail(f, &ids,
                              gptoss_set_error(error, bad,
                                               "harmony frame: header '%s' repeats or extends "
                                               "another target's header",
                                               t->header));
    }
    trie_depths(&f->all);
    trie_depths(&f->budgeted);
    f->all_start = trie_walk(&f->all, ids.ids, n_start);
    f->budgeted_start = trie_walk(&f->budgeted, ids.ids, n_start);
    f->budgeted_depth = f->budgeted.n ? f->budgeted.nodes[0].depth : 0;
    gptoss_tokens_free(&ids);
    /* A budget only matters where a body could otherwise be cut: free text may run to the
     * length limit as it always could. */
    f->budget_applies = has_budget_body && f->budgeted.n > 0;
    if (!f->budget_applies) f->max_tokens = 0;
    const int32_t n_vocab = gptoss_tokenizer_n_vocab(tokenizer);
    const int32_t n_text = gptoss_tokenizer_n_ordinary(tokenizer);
    f->text_words = ((size_t)n_vocab + 31) / 32;
    f->text_mask = calloc(f->text_words, sizeof *f->text_mask);
    if (!f->text_mask) return frame_fail(f, NULL, gptoss_set_error(error, oom, "out of memory"));
    for (int32_t t = 0; t < n_text; t++)
        if (!gptoss_tokenizer_is_special(tokenizer, t)) f->text_mask[t / 32] |= 1u << (t % 32);
    *out = f;
    return GPTOSS_OK;
}

void gptoss_harmony_frame_set_budget(gptoss_harmony_frame *f, int32_t max_tokens,
                                     int32_t body_reserve) {
    f->max_tokens = f->budget_applies && max_tokens > 0 ? max_tokens : 0;
    f->body_reserve = body_reserve > 0 ? body_reserve : 0;
}

int32_t gptoss_harmony_frame_reserve(const gptoss_harmony_frame *f) {
    return f->budgeted_depth + f->body_reserve + 1;
}

/* ---- a choice ------------------------------------------------------------------------------- */

gptoss_status gptoss_harmony_constraint_create(const gptoss_harmony_frame *frame,
                                               gptoss_harmony_constraint **out,
                                               gptoss_error *error) {
    gptoss_harmony_constraint *c = calloc(1, sizeof *c);
    if (!c) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    c->frame = frame;
    c->state = S_HEADER;
    c->node = frame->all_start;
    c->bnode = frame->budgeted_start;
    c->target = -1;
    *out = c;
    return GPTOSS_OK;
}

void gptoss_harmony_constraint_free(gptoss_harmony_constraint *c) {
    if (!c) return;
    gptoss_constraint_free(c->body);
    free(c);
}

bool gptoss_harmony_constraint_done(const gptoss_harmony_constraint *c) {
    return c->state == S_DONE;
}

static bool is_text(const gptoss_harmony_frame *f, int32_t token) {
    return token >= 0 && (size_t)token / 32 < f->text_words &&
           (f->text_mask[token / 32] >> (token % 32) & 1u);
}

static void set_bit(uint32_t *mask, int32_t vocab, int32_t token) {
    if (token >= 0 && token < vocab) mask[token / 32] |= 1u << (token % 32);
}

/* Tokens a choice may still draw, this one included (INT32_MAX without a budget). */
static int32_t tokens_left(const gptoss_harmony_constraint *c) {
    const gptoss_harmony_frame *f = c->frame;
    return f->max_tokens > 0 ? f->max_tokens - c->n_seen : INT32_MAX;
}

/* What a detour (finishing the current header to a non-budgeted target, its end token, then a
 * whole budgeted message) costs at most, beyond the current token. */
static int64_t detour_cost(const gptoss_harmony_frame *f, int32_t header_left) {
    return (int64_t)header_left + 1 + f->budgeted_depth + f->body_reserve + 1;
}

/* Budget pressure at a header node: only budgeted headers may continue. */
static bool header_narrowed(const gptoss_harmony_constraint *c) {
    const gptoss_harmony_frame *f = c->frame;
    if (f->max_tokens == 0 || c->bnode < 0) return false;
    return tokens_left(c) < detour_cost(f, f->all.nodes[c->node].depth);
}

/* Budget pressure in a body that ends in <|end|> (reasoning, a preamble): end it now. */
static bool free_body_must_end(const gptoss_harmony_constraint *c) {
    const gptoss_harmony_frame *f = c->frame;
    if (f->max_tokens == 0) return false;
    return tokens_left(c) < 1 + detour_cost(f, 0);
}

/* Tokens the constrained body may still take, the next one included. */
static int32_t body_budget(const gptoss_harmony_constraint *c) {
    return c->frame->max_tokens > 0 ? tokens_left(c) - 1 : INT32_MAX;
}

static bool enter_body(gptoss_harmony_constraint *c, int32_t target) {
    const frame_target *t = &c->frame->targets[target];
    c->state = S_BODY;
    c->target = target;
    if (t->kind != GPTOSS_HARMONY_BODY_CONSTRAINED) return true;
    gptoss_error err = {0};
    return t->body.create(t->body.user, &c->body, &err) == GPTOSS_OK;
}

static bool advance(gptoss_harmony_constraint *c, int32_t token) {
    const gptoss_harmony_frame *f = c->frame;
    switch (c->state) {
    case S_HEADER: {
        int32_t next = trie_child(&f->all, c->node, token);
        if (next < 0) return false;
        int32_t bnext = c->bnode >= 0 ? trie_child(&f->budgeted, c->bnode, token) : -1;
        if (bnext < 0 && header_narrowed(c)) return false;
        c->node = next;
        c->bnode = bnext;
        const int32_t target = f->all.nodes[next].target;
        return target < 0 || enter_body(c, target);
    }
    case S_BODY: {
        const frame_target *t = &f->targets[c->target];
        if (token == t->end_token) {
            if (t->kind == GPTOSS_HARMONY_BODY_CONSTRAINED && !gptoss_constraint_complete(c->body))
                return false;
            gptoss_constraint_free(c->body);
            c->body = NULL;
            if (token == GPTOSS_TOKEN_END) {
                c->state = S_HEADER;
                c->node = 0;
                c->bnode = f->budgeted.n ? 0 : -1;
            } else {
                c->state = S_DONE;
            }
            return true;
        }
        if (t->kind == GPTOSS_HARMONY_BODY_CONSTRAINED)
            return gptoss_constraint_advance(c->body, token);
        return is_text(f, token);
    }
    case S_DONE:
        return true; /* generation went past the turn's end (ignore_eos): nothing to frame */
    case S_BROKEN:
        break;
    }
    return false;
}

static void allow(gptoss_harmony_constraint *c, uint32_t *mask, int32_t vocab) {
    const gptoss_harmony_frame *f = c->frame;
    const size_t words = ((size_t)vocab + 31) / 32;
    switch (c->state) {
    case S_HEADER: {
        const bool narrowed = header_narrowed(c);
        const trie *t = narrowed ? &f->budgeted : &f->all;
        const trie_node *nd = &t->nodes[narrowed ? c->bnode : c->node];
        for (int32_t i = 0; i < nd->n; i++)
            set_bit(mask, vocab, nd->tokens[i]);
        break;
    }
    case S_BODY: {
        const frame_target *t = &f->targets[c->target];
        if (t->kind == GPTOSS_HARMONY_BODY_CONSTRAINED) {
            const int32_t budget = body_budget(c);
            if (budget > 0) {
                if (t->body.set_budget && f->max_tokens > 0) t->body.set_budget(c->body, budget);
                gptoss_constraint_allow(c->body, mask, vocab);
            }
            /* An incomplete body with no budget left ends anyway: the length limit would cut
             * it just the same, and a stop keeps the frame well-formed. */
            if (gptoss_constraint_complete(c->body) || budget <= 0) {
                if (budget <= 0) memset(mask, 0, words * sizeof *mask);
                set_bit(mask, vocab, t->end_token);
            }
            break;
        }
        const bool ends_turn = t->end_token != GPTOSS_TOKEN_END;
        if (ends_turn || !free_body_must_end(c))
            memcpy(mask, f->text_mask,
                   (words < f->text_words ? words : f->text_words) * sizeof *mask);
        set_bit(mask, vocab, t->end_token);
        break;
    }
    case S_DONE:
        memcpy(mask, f->text_mask, (words < f->text_words ? words : f->text_words) * sizeof *mask);
        break;
    case S_BROKEN:
        break;
    }
}

bool gptoss_harmony_constraint_next(gptoss_harmony_constraint *c, const int32_t *generated,
                                    int32_t n_generated, uint32_t *mask, int32_t vocab) {
    if (c->state == S_BROKEN || n_generated < c->n_seen) {
        c->state = S_BROKEN;
        return false;
    }
    while (c->n_seen < n_generated) {
        if (!advance(c, generated[c->n_seen])) {
            c->state = S_BROKEN;
            return false;
        }
        c->n_seen++;
    }
    allow(c, mask, vocab);
    return true;
}
