/*
 * json_walk.c - drives the JSON Schema matcher for tests/structured/json_schema_walks.mjs:
 * compiles each schema of a file, takes seeded random walks (each step a uniformly random
 * token of the mask, under a token budget), checks the matcher's invariants on the way, and
 * writes every walk's bytes (hex) for the node side to parse and validate with ajv. Prints a
 * microbenchmark: compile times and `allow` times on cached and first-visit states.
 *
 * Usage: json_walk TOKENIZER_JSON SCHEMAS_JSON OUT_JSONL WALKS BUDGET SEED
 * SCHEMAS_JSON is an array; each element {"schema": S} compiles S, {"json_object": true}
 * compiles the json_object mode.
 */
#include "structured/json_schema.h"
#include "util/clock.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

static void add_sample(samples *s, double v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) abort();
    }
    s->v[s->n++] = v;
}

static void print_stats(const char *what, samples *s) {
    if (s->n == 0) return;
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    printf("%-34s n=%-7zu median %.4f ms  p99 %.4f ms  worst %.4f ms\n", what, s->n, s->v[s->n / 2],
           s->v[(size_t)((double)s->n * 0.99)], s->v[s->n - 1]);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON SCHEMAS_JSON OUT_JSONL WALKS BUDGET SEED\n",
                argv[0]);
        return 2;
    }
    int walks = atoi(argv[4]), budget = atoi(argv[5]);
    rng_state = strtoull(argv[6], NULL, 10) * 2654435761u + 1;
    gptoss_error err = {0};
    gptoss_tokenizer *tok = NULL;
    if (gptoss_tokenizer_load(argv[1], &tok, &err) != GPTOSS_OK) {
        fprintf(stderr, "tokenizer: %s\n", err.message);
        return 1;
    }
    double t0 = gptoss_now_seconds();
    gptoss_json_vocab *vocab = NULL;
    if (gptoss_json_vocab_create(tok, &vocab, &err) != GPTOSS_OK) {
        fprintf(stderr, "vocab: %s\n", err.message);
        return 1;
    }
    printf("vocabulary trie built in %.1f ms\n", (gptoss_now_seconds() - t0) * 1e3);
    json_error_t jerr;
    json_t *list = json_load_file(argv[2], 0, &jerr);
    if (!json_is_array(list)) {
        fprintf(stderr, "%s: %s\n", argv[2], jerr.text);
        return 1;
    }
    FILE *out = fopen(argv[3], "w");
    if (!out) {
        perror(argv[3]);
        return 1;
    }
    int32_t n_vocab = 201088, n_ordinary = gptoss_tokenizer_n_ordinary(tok);
    size_t words = ((size_t)n_vocab + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    uint32_t *shadow_mask = malloc(words * sizeof *shadow_mask);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    char *hex = malloc(1 << 20);
    samples compile_ms = {0}, allow_ms = {0}, cached_ms = {0}, start_ms = {0}, unlimited_ms = {0};
    int violations = 0;
    size_t index;
    json_t *entry;
    json_array_foreach(list, index, entry) {
        const json_t *schema = json_object_get(entry, "schema");
        bool object_mode = json_is_true(json_object_get(entry, "json_object"));
        gptoss_json_schema *compiled = NULL;
        double c0 = gptoss_now_seconds();
        gptoss_status st =
            gptoss_json_schema_compile(object_mode ? NULL : schema, vocab, &compiled, &err);
        double ms = (gptoss_now_seconds() - c0) * 1e3;
        json_t *result = json_object();
        json_object_set_new(result, "i", json_integer((json_int_t)index));
        if (st != GPTOSS_OK) {
            json_object_set_new(result, "ok", json_false());
            json_object_set_new(result, "error", json_string(err.message));
        } else {
            add_sample(&compile_ms, ms);
            json_object_set_new(result, "ok", json_true());
            json_object_set_new(result, "compile_ms", json_real(ms));
            json_t *outputs = json_array(), *problems = json_array();
            for (int w = 0; w < walks; w++) {
                gptoss_token_constraint *m = NULL;
                if (gptoss_json_matcher_create(compiled, &m, &err) != GPTOSS_OK) abort();
                /* a schema whose shortest value exceeds the budget offers nothing at the
                 * start: such a walk starts again with twice the budget */
                int32_t walk_budget = budget;
                gptoss_token_constraint *shadow = NULL;
                if (gptoss_json_matcher_create(compiled, &shadow, &err) != GPTOSS_OK) abort();
            restart:
                gptoss_json_matcher_set_budget(m, walk_budget);
                size_t hex_len = 0;
                char problem[256] = "";
                for (int step = 0;; step++) {
                    memset(mask, 0, words * sizeof *mask);
                    double a0 = gptoss_now_seconds();
                    gptoss_constraint_allow(m, mask, n_vocab);
                    double a_ms = (gptoss_now_seconds() - a0) * 1e3;
                    add_sample(&allow_ms, a_ms);
                    if (a_ms > 30 && getenv("JSON_WALK_SLOW"))
                        fprintf(stderr, "slow allow: schema %zu step %d %.1f ms\n", index, step,
                                a_ms);
                    if (step == 0 && w == 0) add_sample(&start_ms, a_ms);
                    /* the shadow matcher (no budget) serves every state from its cache
                     * once visited: its first call is a first visit or a cache hit, its second
                     * always a cache hit */
                    a0 = gptoss_now_seconds();
                    gptoss_constraint_allow(shadow, shadow_mask, n_vocab);
                    add_sample(&unlimited_ms, (gptoss_now_seconds() - a0) * 1e3);
                    a0 = gptoss_now_seconds();
                    gptoss_constraint_allow(shadow, shadow_mask, n_vocab);
                    add_sample(&cached_ms, (gptoss_now_seconds() - a0) * 1e3);
                    int32_t n_allowed = 0;
                    for (size_t wd = 0; wd < words; wd++) {
                        uint32_t bits = mask[wd];
                        while (bits) {
                            int b = __builtin_ctz(bits);
                            bits &= bits - 1;
                            allowed[n_allowed++] = (int32_t)(wd * 32 + (size_t)b);
                        }
                    }
                    bool complete = gptoss_constraint_complete(m);
                    if (n_allowed > 0 && allowed[n_allowed - 1] >= n_ordinary) {
                        snprintf(problem, sizeof problem, "special token %d allowed",
                                 allowed[n_allowed - 1]);
                        break;
                    }
                    if (n_allowed == 0 && step == 0 && !complete && walk_budget < 1 << 16) {
                        walk_budget *= 2;
                        goto restart;
                    }
                    if (n_allowed == 0) {
                        if (!complete)
                            snprintf(problem, sizeof problem,
                                     "empty mask while incomplete at step %d", step);
                        break;
                    }
                    if (complete && rng() % 4 == 0) break;
                    /* a token outside the mask (and a special one) must be refused */
                    int32_t other = (int32_t)(rng() % (uint64_t)n_vocab);
                    if (!(mask[other / 32] >> (other % 32) & 1) &&
                        gptoss_constraint_advance(m, other)) {
                        snprintf(problem, sizeof problem, "advance took token %d outside the mask",
                                 other);
                        break;
                    }
                    if (gptoss_constraint_advance(m, n_ordinary + (int32_t)(rng() % 20))) {
                        snprintf(problem, sizeof problem, "advance took a special token");
                        break;
                    }
                    int32_t pick = allowed[rng() % (uint64_t)n_allowed];
                    if (!gptoss_constraint_advance(shadow, pick)) {
                        snprintf(problem, sizeof problem, "unbudgeted matcher refused %d", pick);
                        break;
                    }
                    if (!gptoss_constraint_advance(m, pick)) {
                        snprintf(problem, sizeof problem, "advance refused allowed token %d", pick);
                        break;
                    }
                    if (step > walk_budget) {
                        snprintf(problem, sizeof problem, "walk exceeded the budget");
                        break;
                    }
                    size_t len = 0;
                    const char *bytes = gptoss_tokenizer_token_bytes(tok, pick, &len);
                    for (size_t i = 0; i < len && hex_len + 3 < (1 << 20); i++)
                        hex_len += (size_t)sprintf(hex + hex_len, "%02x", (unsigned char)bytes[i]);
                }
                hex[hex_len] = 0;
                json_array_append_new(outputs, json_string(hex));
                if (problem[0]) {
                    json_array_append_new(problems, json_string(problem));
                    violations++;
                }
                gptoss_constraint_free(m);
                gptoss_constraint_free(shadow);
            }
            json_object_set_new(result, "walk_ms",
                                json_real((gptoss_now_seconds() - c0) * 1e3 - ms));
            json_object_set_new(result, "walks", outputs);
            json_object_set_new(result, "violations", problems);
            gptoss_json_schema_free(compiled);
        }
        char *line = json_dumps(result, JSON_COMPACT);
        fprintf(out, "%s\n", line);
        free(line);
        json_decref(result);
    }
    fclose(out);
    print_stats("compile", &compile_ms);
    print_stats("allow, budgeted walk", &allow_ms);
    print_stats("allow, no budget (first call)", &unlimited_ms);
    print_stats("allow, no budget (cached state)", &cached_ms);
    print_stats("allow, start state (first visit)", &start_ms);
    printf("matcher invariant violations: %d\n", violations);
    json_decref(list);
    free(mask);
    free(shadow_mask);
    free(allowed);
    free(hex);
    free(compile_ms.v), free(allow_ms.v), free(cached_ms.v), free(start_ms.v), free(unlimited_ms.v);
    gptoss_json_vocab_free(vocab);
    gptoss_tokenizer_free(tok);
    return 0;
}
