/*
 * harmony_constraint.h - structured output framed in harmony: which tokens a choice may draw
 * next, given the harmony stream it generated after the prompt's "<|start|>assistant".
 *
 * A frame lists the messages the model may write (targets): each is a header (the text after
 * "<|start|>assistant" up to and including <|message|>), a body kind and the token that ends
 * it. Headers are forced token by token along one tokenization of each target's header (a
 * trie), so the model chooses among the targets but cannot write another header. Bodies:
 *   REASONING  free text ending in <|end|>, after which a new message starts (more reasoning
 *              or another target); the analysis channel;
 *   TEXT       free text ending in the target's end token;
 *   CONSTRAINED text accepted by a body constraint (the JSON matcher), then only the end token
 *              once the constraint says the body is complete.
 * Text means the tokenizer's ordinary tokens: no special token appears inside a body.
 *
 * Budget: with max_tokens > 0, the output always fits. Targets marked `budgeted` (constrained
 * bodies) are kept reachable: when reasoning (or a header that leads away from them) would
 * leave too few tokens for the longest budgeted header, body_reserve body tokens and the end
 * token, the reasoning is ended and only budgeted headers are allowed; inside a constrained
 * body the constraint is told how many tokens remain (set_budget) so it closes in time.
 *
 * Owns: the frame (targets copied, tries, the text mask; immutable, shared by the choices of a
 * request) and each choice's state (trie position, body constraint, tokens seen). Advancing is
 * incremental: each call looks only at the tokens generated since the previous call.
 */
#ifndef GPTOSS_STRUCTURED_HARMONY_CONSTRAINT_H
#define GPTOSS_STRUCTURED_HARMONY_CONSTRAINT_H

#include "structured/constraint.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gptoss_harmony_body_kind {
    GPTOSS_HARMONY_BODY_REASONING = 0,
    GPTOSS_HARMONY_BODY_TEXT = 1,
    GPTOSS_HARMONY_BODY_CONSTRAINED = 2,
} gptoss_harmony_body_kind;

/* Makes the body constraint of a CONSTRAINED target, once per message that uses it. */
typedef struct gptoss_harmony_body_source {
    gptoss_status (*create)(void *user, gptoss_token_constraint **out, gptoss_error *error);
    /* Optional: the body may take at most tokens_left more tokens, the next one included. */
    void (*set_budget)(gptoss_token_constraint *body, int32_t tokens_left);
    void *user; /* borrowed: must outlive every choice state */
} gptoss_harmony_body_source;

typedef struct gptoss_harmony_target {
    const char *header; /* "<|channel|>final<|message|>" (copied) */
    gptoss_harmony_body_kind kind;
    int32_t end_token; /* <|end|> for reasoning, <|return|>, <|call|> or <|end|> otherwise */
    bool budgeted;     /* kept reachable within max_tokens (CONSTRAINED targets) */
    gptoss_harmony_body_source body; /* CONSTRAINED only */
} gptoss_harmony_target;

typedef struct gptoss_harmony_frame gptoss_harmony_frame;

/* max_tokens: the most tokens a choice generates (0: no budget). body_reserve: the body tokens
 * a budgeted target is guaranteed when reasoning is cut short. Fails (INVALID_ARGUMENT) for
 * a header that does not end in <|message|> or that tokenizes as a prefix of another. */
gptoss_status gptoss_harmony_frame_create(const gptoss_tokenizer *tokenizer,
                                          const gptoss_harmony_target *targets, size_t n_targets,
                                          int32_t max_tokens, int32_t body_reserve,
                                          gptoss_harmony_frame **out, gptoss_error *error);
void gptoss_harmony_frame_free(gptoss_harmony_frame *frame);

typedef struct gptoss_harmony_constraint gptoss_harmony_constraint;

/* One choice's state; frame must outlive it. */
gptoss_status gptoss_harmony_constraint_create(const gptoss_harmony_frame *frame,
                                               gptoss_harmony_constraint **out,
                                               gptoss_error *error);
void gptoss_harmony_constraint_free(gptoss_harmony_constraint *c);

/* Takes generated[n_seen..n_generated) (the tokens since the last call; generated holds all
 * of the choice's tokens) and ORs the tokens allowed next into mask[(vocab + 31) / 32].
 * Returns false when a token broke the frame (it was not allowed) or nothing may come next;
 * the state then stays broken. */
bool gptoss_harmony_constraint_next(gptoss_harmony_constraint *c, const int32_t *generated,
                                    int32_t n_generated, uint32_t *mask, int32_t vocab);

/* Whether the choice ended a non-reasoning target with its end token. */
bool gptoss_harmony_constraint_done(const gptoss_harmony_constraint *c);

/* Replaces the budget given to gptoss_harmony_frame_create; only before choice states exist. */
void gptoss_harmony_frame_set_budget(gptoss_harmony_frame *frame, int32_t max_tokens,
                                     int32_t body_reserve);

/* The most tokens a budgeted target needs after reasoning ends (for tests and logs). */
int32_t gptoss_harmony_frame_reserve(const gptoss_harmony_frame *frame);

#endif
