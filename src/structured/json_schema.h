/*
 * json_schema.h - JSON Schema compiled to a token-level automaton over the gpt-oss vocabulary:
 * the matcher that forces a message body to be JSON matching a schema (response_format
 * json_schema / json_object, strict function parameters).
 *
 * Owns: the per-tokenizer vocabulary index (token bytes in a trie), compiled schemas (a byte
 * automaton with lazily built states, masks and budgets, shared across threads) and matchers
 * (one per generated sequence). docs/structured-output.md lists what a schema may use.
 */
#ifndef GPTOSS_STRUCTURED_JSON_SCHEMA_H
#define GPTOSS_STRUCTURED_JSON_SCHEMA_H

#include "gptoss.h"
#include "structured/constraint.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdint.h>

/* Per tokenizer: each ordinary token's bytes in a trie. Immutable once made; shared across
 * threads. Must outlive every schema compiled against it. */
typedef struct gptoss_json_vocab gptoss_json_vocab;

gptoss_status gptoss_json_vocab_create(const gptoss_tokenizer *tokenizer, gptoss_json_vocab **out,
                                       gptoss_error *error);
void gptoss_json_vocab_free(gptoss_json_vocab *vocab);

/* A compiled schema; shareable across threads (its lazily filled caches are locked). */
typedef struct gptoss_json_schema gptoss_json_schema;

/* schema NULL: any JSON value whose top level is an object (json_object mode). A refused
 * schema is GPTOSS_ERR_INVALID_ARGUMENT with a message naming the keyword and its JSON
 * pointer, e.g. "unsupported keyword 'not' at /properties/a". */
gptoss_status gptoss_json_schema_compile(const json_t *schema, const gptoss_json_vocab *vocab,
                                         gptoss_json_schema **out, gptoss_error *error);
void gptoss_json_schema_free(gptoss_json_schema *schema);

/* A matcher for one sequence, as a gptoss_token_constraint (allow / advance / complete /
 * free). The schema must outlive it. Never allows special tokens (ids >=
 * gptoss_tokenizer_n_ordinary). */
gptoss_status gptoss_json_matcher_create(gptoss_json_schema *schema, gptoss_token_constraint **out,
                                         gptoss_error *error);

/* Tokens the body may still use. From then on `allow` only offers tokens after which the
 * value can still be completed within the remaining budget (counting one token per byte of
 * the shortest completion, always achievable since every single byte is a token); with
 * budget 0 the value must already be complete. Default: unlimited. */
void gptoss_json_matcher_set_budget(gptoss_token_constraint *matcher, int32_t tokens_left);

#endif
