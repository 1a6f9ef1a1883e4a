/*
 * draft.h - draft sources of speculative decoding: given a sequence's tokens, propose up to k
 * tokens that may follow. The engine verifies them against the target model (engine_thread.c,
 * docs/speculative.md); a draft source never decides what is emitted, only how many positions
 * one step verifies, so a bad draft costs time, never correctness.
 *
 * One call per step proposes for every drafting sequence at once, so a model-based source
 * (a draft head run as one batched forward) fits the same interface. `ngram` (prompt lookup)
 * and `replay` (measurement: a recorded continuation with tokens made wrong at a chosen rate)
 * need no model; `eagle3` runs a draft head (draft_eagle3.c) that also observes every step's
 * target hidden states (gptoss_drafter_observe). Engine thread only; must not know about
 * requests.
 */
#ifndef GPTOSS_ENGINE_DRAFT_H
#define GPTOSS_ENGINE_DRAFT_H

#include "gptoss_engine.h"

#include <stdint.h>

/* One sequence's draft request and answer. */
typedef struct gptoss_draft_seq {
    const int32_t *tokens; /* [n_tokens] prompt then generated tokens */
    int32_t n_tokens;
    int32_t n_prompt;
    const int32_t *replay; /* replay: the recorded continuation of the prompt, or NULL */
    int32_t n_replay;
    uint64_t key;                     /* identifies the sequence (the replay's wrong-token draws) */
    uint64_t seq_priority, seq_index; /* the sequence's identity (draft heads' state) */
    int32_t k;     /* propose at most this many (1..GPTOSS_MAX_SPECULATIVE_TOKENS) */
    int32_t *out;  /* [k] the proposals */
    int32_t n_out; /* written: 0..k */
} gptoss_draft_seq;

typedef struct gptoss_drafter gptoss_drafter;

/* Checks the draft options (the message names the field). */
gptoss_status gptoss_draft_options_validate(const gptoss_draft_options *o, gptoss_error *error);

/* The defaults of gptoss_engine_options_default (kind NONE). */
gptoss_draft_options gptoss_draft_options_default(void);

/* A draft source for o->kind (not NONE) over a vocabulary of vocab_size tokens. target: the
 * target model's side for a draft head (eagle3; unused by the others, may be NULL then). */
gptoss_status gptoss_drafter_create(const gptoss_draft_options *o, int32_t vocab_size,
                                    const gptoss_draft_target *target, gptoss_drafter **out,
                                    gptoss_error *error);

/* One sequence of a step that ran: what the target just computed for it. */
typedef struct gptoss_draft_observed {
    uint64_t seq_priority, seq_index; /* identity, as in gptoss_draft_seq */
    const int32_t *tokens;            /* [n_tokens] committed tokens (no drafts) */
    int32_t n_tokens;
    int32_t first_position; /* position of the step's first token of this sequence */
    int32_t n_computed;     /* its tokens in the step (drafts included) */
    int32_t first_row;      /* index of its first token in the plan */
} gptoss_draft_observed;

/* Whether the source wants gptoss_drafter_observe after every step (draft heads). */
bool gptoss_drafter_observes(const gptoss_drafter *d);

/* After a step's forward succeeded and before its tokens are delivered: the target's hidden
 * states of the plan's tokens are read now (they are gone after the next forward). */
void gptoss_drafter_observe(gptoss_drafter *d, const gptoss_draft_observed *seqs, int32_t n);

/* Fills out / n_out of each of seqs[0..n). */
void gptoss_drafter_propose(gptoss_drafter *d, gptoss_draft_seq *seqs, int32_t n);

void gptoss_drafter_free(gptoss_drafter *d);

/* Prompt lookup over tokens[0..n): for n-gram lengths from ngram_max down to ngram_min, the
 * latest earlier occurrence of the last n tokens; proposes up to k of the tokens that followed
 * it (stopping at the end of the text). Returns the number written to out. */
int32_t gptoss_draft_ngram(const int32_t *tokens, int32_t n, int32_t ngram_max, int32_t ngram_min,
                           int32_t k, int32_t *out);

/* The "names" of the kinds: "none", "ngram", "replay", "eagle3" (NULL for a value outside the
 * enum), and the parse of one (false for anything else). */
const char *gptoss_draft_kind_name(gptoss_draft_kind kind);
bool gptoss_draft_kind_parse(const char *text, gptoss_draft_kind *kind);

#endif
