/*
 * eagle3_writer.h - writes a random-weight EAGLE3 draft head in the published Hugging Face
 * layout (model/eagle3.h): config.json and model.safetensors with bf16 weights, d2t as int64
 * and t2d as bool. Same seed, same bytes.
 */
#ifndef GPTOSS_TOOLS_EAGLE3_WRITER_H
#define GPTOSS_TOOLS_EAGLE3_WRITER_H

#include "model/eagle3.h"

#include <stdbool.h>
#include <stdint.h>

/* The head presets of `make-model`: "eagle3-tiny" (fits the `tiny` target), "eagle3-20b",
 * "eagle3-120b" (the published heads' shapes). */
gptoss_status gptoss_eagle3_preset(const char *name, gptoss_eagle3_config *config,
                                   gptoss_error *error);

/* Writes the head into dir (created if needed). with_embed: also write embed_tokens.weight
 * (published gpt-oss heads leave it out and read the target's). */
gptoss_status gptoss_eagle3_write_random(const gptoss_eagle3_config *config, const char *dir,
                                         uint64_t seed, bool with_embed, gptoss_error *error);

/* The target id of draft id d in a head written with this config and seed (what its d2t
 * holds: d + d2t[d]); strictly increasing in d. */
int32_t gptoss_eagle3_random_draft_target(const gptoss_eagle3_config *config, uint64_t seed,
                                          int32_t d);

#endif
