/*
 * constraint.h - a token-level constraint on one generated sequence: which token ids may come
 * next, given the ones taken so far. Structured output is built from these: a JSON Schema
 * matcher (json_schema.h) constrains a message body, and the harmony layer (harmony_constraint.h)
 * frames bodies with forced headers and end tokens, leaving reasoning free.
 *
 * Owns: nothing but the interface. A constraint is an object with an ops table; it belongs to
 * one sequence (one choice of one request) and is used from one thread at a time.
 */
#ifndef GPTOSS_STRUCTURED_CONSTRAINT_H
#define GPTOSS_STRUCTURED_CONSTRAINT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gptoss_token_constraint gptoss_token_constraint;

typedef struct gptoss_token_constraint_ops {
    /* ORs the ids that may come next into mask[(vocab + 31) / 32] (token t: bit t % 32 of word
     * t / 32). Leaves the mask untouched when no token can extend what was taken. */
    void (*allow)(gptoss_token_constraint *self, uint32_t *mask, int32_t vocab);
    /* Takes one token. Returns false (and leaves the state unchanged) when it was not allowed. */
    bool (*advance)(gptoss_token_constraint *self, int32_t token);
    /* Whether what was taken so far is complete: the owner may end the body here (a JSON value
     * that is whole, though more digits of a number could still follow). */
    bool (*complete)(const gptoss_token_constraint *self);
    void (*free)(gptoss_token_constraint *self);
} gptoss_token_constraint_ops;

/* Implementations embed this as their first member. */
struct gptoss_token_constraint {
    const gptoss_token_constraint_ops *ops;
};

static inline void gptoss_constraint_allow(gptoss_token_constraint *c, uint32_t *mask,
                                           int32_t vocab) {
    c->ops->allow(c, mask, vocab);
}
static inline bool gptoss_constraint_advance(gptoss_token_constraint *c, int32_t token) {
    return c->ops->advance(c, token);
}
static inline bool gptoss_constraint_complete(const gptoss_token_constraint *c) {
    return c->ops->complete(c);
}
static inline void gptoss_constraint_free(gptoss_token_constraint *c) {
    if (c) c->ops->free(c);
}

#endif
