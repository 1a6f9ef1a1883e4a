/*
 * config.h - gpt-oss hyper-parameters: parsing and validating config.json, presets, and
 * writing config.json in the published layout.
 *
 * One source of truth: every shape any layer uses comes from gptoss_config. Knows nothing of
 * files beyond config.json's text, nor of devices.
 */
#ifndef GPTOSS_MODEL_CONFIG_H
#define GPTOSS_MODEL_CONFIG_H

#include "gptoss.h"

#include <stddef.h>
#include <stdint.h>

/* Parses config.json text. Refuses unknown architectures, missing required fields, wrong
 * types and sizes that are zero, negative, inconsistent or absurd, naming the field. */
gptoss_status gptoss_config_parse(const char *json_text, size_t len, gptoss_config *config,
                                  gptoss_error *error);

/* Reads and parses DIR/config.json. */
gptoss_status gptoss_config_load(const char *dir, gptoss_config *config, gptoss_error *error);

/* Checks the ranges and consistency of a filled config (parse calls it). */
gptoss_status gptoss_config_validate(const gptoss_config *config, gptoss_error *error);

/* Fills a named preset: "tiny", "20b" or "120b". */
gptoss_status gptoss_config_preset(const char *name, gptoss_config *config, gptoss_error *error);

/* config.json text in the published Hugging Face layout (malloc'd). */
char *gptoss_config_to_json(const gptoss_config *config);

/* Derived sizes. */
int64_t gptoss_config_q_dim(const gptoss_config *c);  /* n_heads * head_dim */
int64_t gptoss_config_kv_dim(const gptoss_config *c); /* n_kv_heads * head_dim */
/* Layers that attend over a sliding window (layer_is_sliding with sliding_window > 0); the
 * others attend over the whole context. */
int32_t gptoss_config_n_sliding_layers(const gptoss_config *c);
/* Parameter count of the whole checkpoint (MXFP4 values counted as parameters). */
int64_t gptoss_config_n_params(const gptoss_config *c);
/* Bytes of the checkpoint's tensors (bf16 + MXFP4 blocks and scales). */
int64_t gptoss_config_n_bytes(const gptoss_config *c);
/* Parameters used per token, excluding the embedding table (top-k experts only). */
int64_t gptoss_config_n_active_params(const gptoss_config *c);

/* YaRN RoPE tables (spec 2.4): inv_freq[head_dim/2] and the concentration that multiplies
 * both cos and sin. Computed in double, then rounded once to float. */
void gptoss_rope_yarn_inv_freq(const gptoss_config *c, float *inv_freq, float *concentration);

#endif
