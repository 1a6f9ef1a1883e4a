/*
 * draft.c - the draft sources (see draft.h): prompt lookup and replay here, the EAGLE3 head
 * behind the same handle (draft_eagle3.c).
 *
 * Owns: the drafter handle (its options, the head drafter). Reads the token arrays it is
 * given, never writes them.
 */
#include "engine/draft.h"
#include "engine/draft_eagle3.h"

#include "util/error.h"

#include <stdlib.h>
#include <string.h>

struct gptoss_drafter {
    gptoss_draft_options options;
    int32_t vocab_size;
    /* One proposal per sequence; a model-based source would run its batch here. */
    void (*propose)(const gptoss_drafter *d, gptoss_draft_seq *seq);
    gptoss_eagle3_drafter *eagle3; /* kind EAGLE3: proposes for the whole batch itself */
};

gptoss_draft_options gptoss_draft_options_default(void) {
    gptoss_draft_options o;
    memset(&o, 0, sizeof o);
    o.kind = GPTOSS_DRAFT_NONE;
    o.num_speculative_tokens = 3;
    o.max_batch = 16;
    o.ngram_max = 3;
    o.ngram_min = 1;
    o.min_acceptance = 0.25f;
    o.cooldown_steps = 32;
    o.replay_accept = 1.0f;
    o.replay_seed = 0;
    return o;
}

const char *gptoss_draft_kind_name(gptoss_draft_kind kind) {
    switch (kind) {
    case GPTOSS_DRAFT_NONE:
        return "none";
    case GPTOSS_DRAFT_NGRAM:
        return "ngram";
    case GPTOSS_DRAFT_REPLAY:
        return "replay";
    case GPTOSS_DRAFT_EAGLE3:
        return "eagle3";
    }
    return NULL;
}

bool gptoss_draft_kind_parse(const char *text, gptoss_draft_kind *kind) {
    for (int i = GPTOSS_DRAFT_NONE; i <= GPTOSS_DRAFT_EAGLE3; i++) {
        if (strcmp(text, gptoss_draft_kind_name((gptoss_draft_kind)i)) == 0) {
            *kind = (gptoss_draft_kind)i;
            return true;
        }
    }
    return false;
}

gptoss_status gptoss_draft_options_validate(const gptoss_draft_options *o, gptoss_error *error) {
    const gptoss_status bad = GPTOSS_ERR_INVALID_ARGUMENT;
    if (!gptoss_draft_kind_name(o->kind))
        return gptoss_set_error(error, bad, "draft options: unknown draft kind %d", (int)o->kind);
    if (o->kind == GPTOSS_DRAFT_NONE) return GPTOSS_OK;
    if (o->num_speculative_tokens < 1 || o->num_speculative_tokens > GPTOSS_MAX_SPECULATIVE_TOKENS)
        return gptoss_set_error(error, bad,
                                "draft options: num_speculative_tokens %d is out of range [1, %d]",
                                o->num_speculative_tokens, GPTOSS_MAX_SPECULATIVE_TOKENS);
    if (o->max_batch < 0)
        return gptoss_set_error(error, bad, "draft options: max_batch %d is negative",
                                o->max_batch);
    if (o->ngram_min < 1 || o->ngram_max < o->ngram_min || o->ngram_max > 64)
        return gptoss_set_error(error, bad,
                                "draft options: n-gram lengths %d..%d must satisfy "
                                "1 <= ngram_min <= ngram_max <= 64",
                                o->ngram_min, o->ngram_max);
    if (!(o->min_acceptance >= 0.0f && o->min_acceptance <= 1.0f))
        return gptoss_set_error(error, bad, "draft options: min_acceptance must be in [0, 1]");
    if (o->cooldown_steps < 0)
        return gptoss_set_error(error, bad, "draft options: cooldown_steps %d is negative",
                                o->cooldown_steps);
    if (!(o->replay_accept >= 0.0f && o->replay_accept <= 1.0f))
        return gptoss_set_error(error, bad, "draft options: replay_accept must be in [0, 1]");
    if (o->kind == GPTOSS_DRAFT_EAGLE3 && (!o->model_dir || !o->model_dir[0]))
        return gptoss_set_error(error, bad,
                                "draft options: the eagle3 draft needs model_dir (--draft-model "
                                "DIR, an EAGLE3 head folder)");
    return GPTOSS_OK;
}

/* ---- prompt lookup ----------------------------------------------------------------------- */

int32_t gptoss_draft_ngram(const int32_t *tokens, int32_t n, int32_t ngram_max, int32_t ngram_min,
                           int32_t k, int32_t *out) {
    for (int32_t len = ngram_max; len >= ngram_min; len--) {
        if (len >= n) continue; /* the suffix needs an earlier place to occur */
        const int32_t *suffix = tokens + n - len;
        /* Latest first: recent text predicts best. A match starting at i is followed by
         * tokens[i + len ..], which exist because i + len <= n - 1. */
        for (int32_t i = n - len - 1; i >= 0; i--) {
            if (tokens[i] != suffix[0] || memcmp(tokens + i, suffix, (size_t)len * sizeof *tokens))
                continue;
            int32_t n_out = 0;
            for (int32_t j = i + len; j < n && n_out < k; j++)
                out[n_out++] = tokens[j];
            return n_out;
        }
    }
    return 0;
}

static void propose_ngram(const gptoss_drafter *d, gptoss_draft_seq *seq) {
    seq->n_out = gptoss_draft_ngram(seq->tokens, seq->n_tokens, d->options.ngram_max,
                                    d->options.ngram_min, seq->k, seq->out);
}

/* ---- replay ------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The recorded token at generated index g, or with probability 1 - replay_accept a different
 * one. The draw is a function of (replay_seed, key, g): the same position drafted again gets
 * the same token, so the acceptance rate is what was asked whatever k is. */
static int32_t replay_token(const gptoss_drafter *d, uint64_t key, int32_t g, int32_t token) {
    uint64_t h = mix64(d->options.replay_seed ^ mix64(key ^ mix64((uint64_t)g + 0x9e37ull)));
    double u = (double)(h >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
    if (u < (double)d->options.replay_accept || d->vocab_size < 2) return token;
    int32_t shift = 1 + (int32_t)(mix64(h) % (uint64_t)(d->vocab_size - 1));
    return (int32_t)(((int64_t)token + shift) % d->vocab_size);
}

static void propose_replay(const gptoss_drafter *d, gptoss_draft_seq *seq) {
    seq->n_out = 0;
    const int32_t g0 = seq->n_tokens - seq->n_prompt; /* generated so far */
    for (int32_t j = 0; j < seq->k; j++) {
        int32_t g = g0 + j;
        if (!seq->replay || g >= seq->n_replay) break;
        seq->out[seq->n_out++] = replay_token(d, seq->key, g, seq->replay[g]);
    }
}

/* ---- the handle -------------------------------------------------------------------------- */

gptoss_status gptoss_drafter_create(const gptoss_draft_options *o, int32_t vocab_size,
                                    const gptoss_draft_target *target, gptoss_drafter **out,
                                    gptoss_error *error) {
    *out = NULL;
    gptoss_status st = gptoss_draft_options_validate(o, error);
    if (st != GPTOSS_OK) return st;
    if (o->kind == GPTOSS_DRAFT_NONE || vocab_size < 1)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "a drafter needs a draft kind and a vocabulary");
    gptoss_drafter *d = calloc(1, sizeof *d);
    if (!d) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory (drafter)");
    d->options = *o;
    d->vocab_size = vocab_size;
    d->options.model_dir = NULL; /* not kept: the caller's string */
    d->propose = o->kind == GPTOSS_DRAFT_NGRAM ? propose_ngram : propose_replay;
    if (o->kind == GPTOSS_DRAFT_EAGLE3 &&
        (st = gptoss_eagle3_drafter_create(o, vocab_size, target, &d->eagle3, error)) !=
            GPTOSS_OK) {
        free(d);
        return st;
    }
    *out = d;
    return GPTOSS_OK;
}

bool gptoss_drafter_observes(const gptoss_drafter *d) {
    return d->eagle3 != NULL;
}

void gptoss_drafter_observe(gptoss_drafter *d, const gptoss_draft_observed *seqs, int32_t n) {
    if (d->eagle3) gptoss_eagle3_drafter_observe(d->eagle3, seqs, n);
}

void gptoss_drafter_propose(gptoss_drafter *d, gptoss_draft_seq *seqs, int32_t n) {
    if (d->eagle3) {
        gptoss_eagle3_drafter_propose(d->eagle3, seqs, n);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        seqs[i].n_out = 0;
        if (seqs[i].k > 0) d->propose(d, &seqs[i]);
    }
}

void gptoss_drafter_free(gptoss_drafter *d) {
    if (d) gptoss_eagle3_drafter_free(d->eagle3);
    free(d);
}
