/*
 * draft_eagle3.c - the `eagle3` draft source (see draft_eagle3.h).
 *
 * Owns: the head, its executor (the CPU forward, or the target's GPU where its backend runs
 * the head: gptoss_draft_target.head_exec), one record per sequence (head KV cache in the
 * executor's memory and the target hidden states not yet run through the head) and grow-only
 * row buffers.
 *
 * A record's invariant: the head cache holds positions [start, start + n) computed from the
 * target's states and committed tokens; `pending` holds the target states of the positions
 * right after it, [start + n, start + n + n_pending), waiting for their next token.
 */
#include "engine/draft_eagle3.h"
#include "backend/cpu/eagle3_forward.h"
#include "model/eagle3.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records of sequences absent from this many observed steps are freed: finished ones go with
 * their caches, and one that comes back (preempted, so recomputed) starts a fresh head cache
 * at the first position the target computes for it. */
#define FORGET_AFTER_STEPS 32

/* After a step, a sequence's final positions run through the head only once this many wait
 * (a prompt chunk, or a sequence that has not drafted for a while); fewer wait for its next
 * proposal, which runs them in the same head forward as its first draft. One decode step then
 * costs one head forward per round, not one more to observe it, and a sequence that does not
 * draft catches up in forwards of this many rows (on a GPU, about the cost of one). */
#define OBSERVE_BATCH_ROWS 32

typedef struct head_seq {
    uint64_t priority, index; /* the sequence's identity */
    uint64_t last_seen;       /* the observe count when it was last in a step */
    gptoss_eagle3_kv kv;
    float *pending; /* [cap_pending, 3H] */
    int32_t n_pending, cap_pending;
} head_seq;

struct gptoss_eagle3_drafter {
    gptoss_eagle3_head *head;
    const gptoss_eagle3_config *c;
    const gptoss_eagle3_weights *w;
    gptoss_eagle3_exec exec; /* state NULL until made */
    gptoss_draft_target target;
    int32_t aux_width; /* 3H */
    uint64_t n_observed;
    head_seq *seqs;
    int32_t n_seqs, cap_seqs;
    int32_t hint; /* where the last lookup found its record */
    /* rows of one head forward */
    gptoss_eagle3_row *rows;
    int32_t *row_tokens; /* [cap_rows] token whose embedding each row reads */
    int32_t *row_seq;    /* [cap_rows] index into the caller's array */
    int32_t *row_owner;  /* [cap_rows] a chained row's drafting record */
    float *embeds;       /* [cap_rows, H] */
    float *prenorm;      /* [cap_rows, H] outputs */
    float *chain;        /* [cap_rows, H] the previous round's prenorm of each drafting seq */
    int32_t cap_rows;
    head_seq **active; /* [cap_rows] the records drafting this round */
    /* GPTOSS_EAGLE3_DUMP=DIR: the first sequence's target rows, for scripts/eagle3-reference.py
     * (records: int32 position, token, cache start; f32 aux[3H], logits[DV]). */
    /* where the time goes (logged at debug level when freed) */
    double t_states, t_forward, t_observe_forward;
    uint64_t n_forwards, n_rows_run, n_observe_forwards;
    FILE *dump;
    bool dump_bound;
    uint64_t dump_priority, dump_index;
    float *dump_logits; /* [cap_rows, DV] */
};

static int32_t kv_end(const head_seq *s) {
    return s->kv.start + s->kv.n;
}

static void restart(head_seq *s, int32_t position) {
    s->kv.start = position;
    s->kv.n = 0;
    s->n_pending = 0;
}

static head_seq *lookup(gptoss_eagle3_drafter *d, uint64_t priority, uint64_t index) {
    for (int32_t j = 0; j < d->n_seqs; j++) {
        int32_t i = (d->hint + j) % d->n_seqs;
        if (d->seqs[i].priority == priority && d->seqs[i].index == index) {
            d->hint = i + 1 < d->n_seqs ? i + 1 : 0;
            return &d->seqs[i];
        }
    }
    return NULL;
}

static head_seq *lookup_or_add(gptoss_eagle3_drafter *d, uint64_t priority, uint64_t index) {
    head_seq *s = lookup(d, priority, index);
    if (s) return s;
    if (d->n_seqs == d->cap_seqs) {
        int32_t cap = d->cap_seqs ? 2 * d->cap_seqs : 16;
        head_seq *grown = realloc(d->seqs, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        d->seqs = grown;
        d->cap_seqs = cap;
    }
    s = &d->seqs[d->n_seqs++];
    memset(s, 0, sizeof *s);
    s->priority = priority;
    s->index = index;
    return s;
}

static bool grow_rows(gptoss_eagle3_drafter *d, int32_t n) {
    if (n <= d->cap_rows) return true;
    int32_t cap = d->cap_rows ? d->cap_rows : 64;
    while (cap < n)
        cap *= 2;
    size_t H = (size_t)d->c->hidden_size;
#define GROW(field, count)                                                                         \
    do {                                                                                           \
        void *p = realloc(d->field, (count) * sizeof *d->field);                                   \
        if (!p) return false;                                                                      \
        d->field = p;                                                                              \
    } while (0)
    GROW(rows, (size_t)cap);
    GROW(row_tokens, (size_t)cap);
    GROW(row_seq, (size_t)cap);
    GROW(row_owner, (size_t)cap);
    GROW(embeds, (size_t)cap * H);
    GROW(prenorm, (size_t)cap * H);
    GROW(chain, (size_t)cap * H);
    GROW(active, (size_t)cap);
    if (d->dump) GROW(dump_logits, (size_t)cap * d->c->draft_vocab_size);
#undef GROW
    d->cap_rows = cap;
    return true;
}

/* Fills the embeddings of rows [0, n) from row_tokens: the head's own table, else the
 * target's (an executor that embeds the tokens itself needs none). */
static gptoss_status fill_embeds(gptoss_eagle3_drafter *d, int32_t n, gptoss_error *error) {
    const int32_t H = d->c->hidden_size;
    if (!d->exec.wants_embed) return GPTOSS_OK;
    if (!d->w->embed.data)
        return d->target.embed_tokens(d->target.user, d->row_tokens, n, d->embeds, error);
    const uint8_t *table = d->w->embed.data;
    for (int32_t r = 0; r < n; r++)
        for (int32_t h = 0; h < H; h++) {
            const uint8_t *p = table + ((size_t)d->row_tokens[r] * H + h) * 2;
            d->embeds[(size_t)r * H + h] = gptoss_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
        }
    return GPTOSS_OK;
}

/* ---- GPTOSS_EAGLE3_DUMP ------------------------------------------------------------------ */

static head_seq *seq_of_kv(gptoss_eagle3_kv *kv) {
    return (head_seq *)((char *)kv - offsetof(head_seq, kv));
}

static bool dumped(gptoss_eagle3_drafter *d, const gptoss_eagle3_row *row) {
    const head_seq *s = seq_of_kv(row->kv);
    if (!d->dump_bound) {
        d->dump_bound = true;
        d->dump_priority = s->priority;
        d->dump_index = s->index;
    }
    return row->aux && s->priority == d->dump_priority && s->index == d->dump_index;
}

static void dump_prepare(gptoss_eagle3_drafter *d, int32_t n) {
    for (int32_t r = 0; r < n; r++)
        if (dumped(d, &d->rows[r]))
            d->rows[r].logits = d->dump_logits + (size_t)r * d->c->draft_vocab_size;
}

static void dump_write(gptoss_eagle3_drafter *d, int32_t n) {
    for (int32_t r = 0; r < n; r++) {
        const gptoss_eagle3_row *row = &d->rows[r];
        if (!row->logits) continue;
        int32_t head[3] = {row->position, d->row_tokens[r], row->kv->start};
        fwrite(head, sizeof head, 1, d->dump);
        fwrite(row->aux, sizeof(float), (size_t)d->aux_width, d->dump);
        fwrite(row->logits, sizeof(float), (size_t)d->c->draft_vocab_size, d->dump);
    }
    fflush(d->dump);
}

static void dump_open(gptoss_eagle3_drafter *d, const char *head_dir, const int32_t *b) {
    const char *dir = getenv("GPTOSS_EAGLE3_DUMP");
    if (!dir || !dir[0]) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/eagle3_dump.json", dir);
    FILE *meta = fopen(path, "w");
    snprintf(path, sizeof path, "%s/eagle3_dump.bin", dir);
    d->dump = meta ? fopen(path, "wb") : NULL;
    if (!d->dump) {
        GPTOSS_LOG_W("draft", "GPTOSS_EAGLE3_DUMP: cannot write into %s", dir);
        if (meta) fclose(meta);
        return;
    }
    fprintf(
        meta,
        "{\"head\": \"%s\", \"hidden_size\": %d, \"draft_vocab_size\": %d, "
        "\"boundaries\": [%d, %d, %d], \"record\": \"int32 position, int32 next_token, "
        "int32 cache_start, float32 aux[3 * hidden_size], float32 logits[draft_vocab_size]\"}\n",
        head_dir, d->c->hidden_size, d->c->draft_vocab_size, b[0], b[1], b[2]);
    fclose(meta);
    GPTOSS_LOG_I("draft", "GPTOSS_EAGLE3_DUMP: writing the first sequence's head rows to %s", path);
}

/* Runs rows [0, n) (their tokens, kv, positions, inputs set); on failure the records involved
 * restart, so a later step rebuilds them. */
static bool run_rows(gptoss_eagle3_drafter *d, int32_t n) {
    if (n == 0) return true;
    gptoss_error err = {0};
    const int32_t H = d->c->hidden_size;
    gptoss_status st = fill_embeds(d, n, &err);
    for (int32_t r = 0; r < n; r++) {
        d->rows[r].token = d->row_tokens[r];
        d->rows[r].embed = d->exec.wants_embed ? d->embeds + (size_t)r * H : NULL;
        d->rows[r].prenorm = d->prenorm + (size_t)r * H;
    }
    if (d->dump) dump_prepare(d, n);
    const double t0 = gptoss_now_seconds();
    if (st == GPTOSS_OK) st = d->exec.forward(d->exec.state, d->rows, n, &err);
    d->t_forward += gptoss_now_seconds() - t0;
    d->n_forwards++;
    d->n_rows_run += (uint64_t)n;
    if (st == GPTOSS_OK && d->dump) dump_write(d, n);
    if (st == GPTOSS_OK) return true;
    GPTOSS_LOG_W("draft", "EAGLE3 head forward failed (%s); its sequences draft again later",
                 err.message);
    for (int32_t r = 0; r < n; r++)
        restart(seq_of_kv(d->rows[r].kv), 0x3fffffff);
    return false;
}

gptoss_status gptoss_eagle3_drafter_create(const gptoss_draft_options *o, int32_t vocab_size,
                                           const gptoss_draft_target *target,
                                           gptoss_eagle3_drafter **out, gptoss_error *error) {
    *out = NULL;
    if (!o->model_dir || !o->model_dir[0])
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "--draft eagle3 needs --draft-model DIR (an EAGLE3 head folder)");
    if (!target || !target->capture_hidden || !target->captured_hidden || !target->embed_tokens)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED,
                                "--draft eagle3 needs a target backend that hands over its "
                                "hidden states");
    gptoss_eagle3_drafter *d = calloc(1, sizeof *d);
    if (!d) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    d->target = *target;
    int32_t boundaries[GPTOSS_EAGLE3_N_AUX];
    gptoss_status st = gptoss_eagle3_load(o->model_dir, &d->head, error);
    if (st == GPTOSS_OK)
        st = gptoss_eagle3_check_target(d->head, target->hidden_size, vocab_size, target->n_layers,
                                        boundaries, error);
    if (st == GPTOSS_OK) {
        d->c = gptoss_eagle3_head_config(d->head);
        d->w = gptoss_eagle3_head_weights(d->head);
        d->aux_width = GPTOSS_EAGLE3_N_AUX * d->c->hidden_size;
        st = target->head_exec ? target->head_exec(target->user, d->head, &d->exec, error)
                               : gptoss_eagle3_cpu_exec(d->head, &d->exec, error);
    }
    if (st == GPTOSS_OK)
        st = target->capture_hidden(target->user, boundaries, GPTOSS_EAGLE3_N_AUX, error);
    if (st != GPTOSS_OK) {
        gptoss_eagle3_drafter_free(d);
        return st;
    }
    dump_open(d, o->model_dir, boundaries);
    GPTOSS_LOG_I("draft",
                 "EAGLE3 head %s: draft vocabulary %d, reads the residual stream after target "
                 "layers %d, %d, %d",
                 o->model_dir, d->c->draft_vocab_size, boundaries[0], boundaries[1], boundaries[2]);
    *out = d;
    return GPTOSS_OK;
}

void gptoss_eagle3_drafter_free(gptoss_eagle3_drafter *d) {
    if (!d) return;
    GPTOSS_LOG_D("draft",
                 "EAGLE3 head: %llu steps observed (%.1f ms reading their states), %llu forwards "
                 "of %llu rows in %.1f ms (%llu of them after a step: %.1f ms)",
                 (unsigned long long)d->n_observed, 1e3 * d->t_states,
                 (unsigned long long)d->n_forwards, (unsigned long long)d->n_rows_run,
                 1e3 * d->t_forward, (unsigned long long)d->n_observe_forwards,
                 1e3 * d->t_observe_forward);
    if (d->head && d->exec.state) /* stop the target keeping states nobody reads */
        d->target.capture_hidden(d->target.user, NULL, 0, &(gptoss_error){0});
    for (int32_t i = 0; i < d->n_seqs; i++) {
        d->exec.kv_release(d->exec.state, &d->seqs[i].kv);
        free(d->seqs[i].pending);
    }
    free(d->seqs);
    free(d->rows), free(d->row_tokens), free(d->row_seq), free(d->row_owner), free(d->embeds),
        free(d->prenorm);
    free(d->chain), free(d->active), free(d->dump_logits);
    if (d->dump) fclose(d->dump);
    if (d->exec.state) d->exec.destroy(d->exec.state);
    gptoss_eagle3_free(d->head);
    free(d);
}

/* Appends the step's states of s (positions p0 ..) after rolling the record back to p0. */
static bool take_states(gptoss_eagle3_drafter *d, head_seq *s, int32_t p0, const float *states,
                        int32_t n) {
    const int32_t end = kv_end(s), pend_end = end + s->n_pending;
    if (p0 < s->kv.start || p0 > pend_end)
        restart(s, p0); /* recomputed from earlier, or a gap (prefix cache, fork): start here */
    else if (p0 < end)
        s->kv.n = p0 - s->kv.start, s->n_pending = 0;
    else
        s->n_pending = p0 - end;
    if (s->n_pending + n > s->cap_pending) {
        int32_t cap = s->cap_pending ? s->cap_pending : 8;
        while (cap < s->n_pending + n)
            cap *= 2;
        float *grown = realloc(s->pending, (size_t)cap * d->aux_width * sizeof *grown);
        if (!grown) {
            restart(s, 0x3fffffff);
            return false;
        }
        s->pending = grown;
        s->cap_pending = cap;
    }
    memcpy(s->pending + (size_t)s->n_pending * d->aux_width, states,
           (size_t)n * d->aux_width * sizeof *states);
    s->n_pending += n;
    return true;
}

/* Adds rows for the pending positions of s up to `last` (inclusive); returns the new count. */
static int32_t add_pending_rows(gptoss_eagle3_drafter *d, head_seq *s, const int32_t *tokens,
                                int32_t last, int32_t n_rows, int32_t owner) {
    for (int32_t p = kv_end(s), i = 0; p <= last && i < s->n_pending; p++, i++) {
        gptoss_eagle3_row *row = &d->rows[n_rows];
        memset(row, 0, sizeof *row);
        row->kv = &s->kv;
        row->position = p;
        row->aux = s->pending + (size_t)i * d->aux_width;
        d->row_tokens[n_rows] = tokens[p + 1];
        d->row_seq[n_rows] = owner;
        n_rows++;
    }
    return n_rows;
}

/* Drops the first `used` pending rows of s (they are in the head cache now). */
static void drop_pending(gptoss_eagle3_drafter *d, head_seq *s, int32_t used) {
    if (used <= 0) return;
    if (used > s->n_pending) used = s->n_pending;
    memmove(s->pending, s->pending + (size_t)used * d->aux_width,
            (size_t)(s->n_pending - used) * d->aux_width * sizeof *s->pending);
    s->n_pending -= used;
}

void gptoss_eagle3_drafter_observe(gptoss_eagle3_drafter *d, const gptoss_draft_observed *seqs,
                                   int32_t n) {
    d->n_observed++;
    int32_t n_states = 0;
    const double t0 = gptoss_now_seconds();
    const float *states = d->target.captured_hidden(d->target.user, &n_states);
    /* First every record (adding may move them), then the rows that point into them. */
    for (int32_t i = 0; i < n && states; i++) {
        const gptoss_draft_observed *o = &seqs[i];
        if (o->first_row < 0 || o->n_computed < 1 || o->first_row + o->n_computed > n_states)
            continue;
        head_seq *s = lookup_or_add(d, o->seq_priority, o->seq_index);
        if (!s) continue;
        s->last_seen = d->n_observed;
        take_states(d, s, o->first_position, states + (size_t)o->first_row * d->aux_width,
                    o->n_computed);
    }
    const double t1 = gptoss_now_seconds();
    d->t_states += t1 - t0;
    /* Run what is final: positions whose next token is committed. */
    int32_t n_rows = 0, n_runs = 0;
    for (int32_t i = 0; i < n && states; i++) {
        const gptoss_draft_observed *o = &seqs[i];
        head_seq *s = lookup(d, o->seq_priority, o->seq_index);
        const int32_t last = o->n_tokens - 2;
        if (!s || s->last_seen != d->n_observed || last < kv_end(s) ||
            s->n_pending < OBSERVE_BATCH_ROWS)
            continue;
        if (!grow_rows(d, n_rows + (last - kv_end(s) + 1))) break;
        n_rows = add_pending_rows(d, s, o->tokens, last, n_rows, i);
        d->active[n_runs++] = s;
    }
    if (n_rows > 0) d->n_observe_forwards++;
    if (n_rows > 0 && run_rows(d, n_rows)) {
        int32_t run = 0;
        for (int32_t r = 0; r < n_rows; r++) {
            int32_t len = 1;
            while (r + 1 < n_rows && d->rows[r + 1].kv == d->rows[r].kv)
                r++, len++;
            drop_pending(d, d->active[run++], len);
        }
    }
    d->t_observe_forward += gptoss_now_seconds() - t1;
    /* Forget sequences that stopped appearing. */
    for (int32_t i = 0; i < d->n_seqs;) {
        if (d->n_observed - d->seqs[i].last_seen > FORGET_AFTER_STEPS) {
            d->exec.kv_release(d->exec.state, &d->seqs[i].kv);
            free(d->seqs[i].pending);
            d->seqs[i] = d->seqs[--d->n_seqs];
        } else {
            i++;
        }
    }
}

void gptoss_eagle3_drafter_propose(gptoss_eagle3_drafter *d, gptoss_draft_seq *seqs, int32_t n) {
    const int32_t H = d->c->hidden_size;
    int32_t n_rows = 0, n_active = 0, k_max = 0;
    for (int32_t i = 0; i < n; i++) {
        gptoss_draft_seq *q = &seqs[i];
        q->n_out = 0;
        head_seq *s = q->k > 0 ? lookup(d, q->seq_priority, q->seq_index) : NULL;
        /* The head must reach position n_tokens - 2 from the target's states: the rows past
         * it are of rejected drafts (or of the last token, computed by the coming step). */
        const int32_t last = q->n_tokens - 2;
        if (!s || last < kv_end(s) || last >= kv_end(s) + s->n_pending) continue;
        if (!grow_rows(d, n_rows + (last - kv_end(s) + 1))) break;
        n_rows = add_pending_rows(d, s, q->tokens, last, n_rows, i);
        d->rows[n_rows - 1].want_token = true;
        d->active[n_active++] = s;
        if (q->k > k_max) k_max = q->k;
    }
    if (n_rows == 0 || !run_rows(d, n_rows)) return;
    /* Round 0: the first draft of each sequence, from its last target position. */
    int32_t a = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        if (!d->rows[r].want_token) continue;
        gptoss_draft_seq *q = &seqs[d->row_seq[r]];
        head_seq *s = d->active[a];
        s->n_pending = 0; /* all in the cache now; the rest were of rejected positions */
        q->out[q->n_out++] = gptoss_eagle3_target_token(d->w, d->rows[r].draft_token);
        memcpy(d->chain + (size_t)a * H, d->prenorm + (size_t)r * H, (size_t)H * sizeof(float));
        d->row_seq[a] = d->row_seq[r]; /* a < r: compact the owners of the active records */
        a++;
    }
    /* Rounds 1 ..: the head on its own output, one position further each. */
    for (int32_t j = 1; j < k_max; j++) {
        int32_t m = 0;
        for (int32_t i = 0; i < n_active; i++) {
            gptoss_draft_seq *q = &seqs[d->row_seq[i]];
            if (q->n_out != j || q->k <= j) continue;
            gptoss_eagle3_row *row = &d->rows[m];
            memset(row, 0, sizeof *row);
            row->kv = &d->active[i]->kv;
            row->position = q->n_tokens - 2 + j;
            row->hidden = d->chain + (size_t)i * H;
            row->want_token = true;
            d->row_tokens[m] = q->out[j - 1];
            d->row_owner[m] = i;
            m++;
        }
        if (m == 0 || !run_rows(d, m)) break;
        for (int32_t r = 0; r < m; r++) {
            int32_t i = d->row_owner[r];
            gptoss_draft_seq *q = &seqs[d->row_seq[i]];
            q->out[q->n_out++] = gptoss_eagle3_target_token(d->w, d->rows[r].draft_token);
            memcpy(d->chain + (size_t)i * H, d->prenorm + (size_t)r * H, (size_t)H * sizeof(float));
        }
    }
    /* The chained positions read the head's own states, not the target's: drop them. */
    for (int32_t i = 0; i < n_active; i++) {
        gptoss_draft_seq *q = &seqs[d->row_seq[i]];
        head_seq *s = d->active[i];
        if (s->kv.start <= q->n_tokens - 1) s->kv.n = q->n_tokens - 1 - s->kv.start;
    }
}
