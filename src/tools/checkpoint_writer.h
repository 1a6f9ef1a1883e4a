/*
 * checkpoint_writer.h - writes a random-weight gpt-oss checkpoint in the published Hugging
 * Face layout: config.json (with quantization_config), generation_config.json, sharded
 * safetensors + model.safetensors.index.json (or one model.safetensors), MXFP4 expert
 * blocks/scales as U8, BF16 for the rest, and the tokenizer files.
 */
#ifndef GPTOSS_TOOLS_CHECKPOINT_WRITER_H
#define GPTOSS_TOOLS_CHECKPOINT_WRITER_H

#include "gptoss.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct gptoss_checkpoint_options {
    uint64_t seed;            /* same seed, same bytes */
    uint64_t max_shard_bytes; /* 0 = the published layout: 3 shards for 20b, 15 for 120b */
    bool single_file;         /* write model.safetensors without an index */
    const char
        *tokenizer_dir; /* folder holding tokenizer.json (+ tokenizer_config.json); NULL = none */
    gptoss_progress_fn progress; /* optional */
    void *progress_user;
} gptoss_checkpoint_options;

/* Writes the checkpoint into dir (created if needed; existing model files are replaced). */
gptoss_status gptoss_checkpoint_write_random(const gptoss_config *config, const char *dir,
                                             const gptoss_checkpoint_options *options,
                                             gptoss_error *error);

#endif
