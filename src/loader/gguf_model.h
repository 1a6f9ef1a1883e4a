/*
 * gguf_model.h - gpt-oss models in GGUF files, as llama.cpp and Ollama users have them:
 * loading one (gptoss_model_load hands a .gguf path here) and writing one from a Hugging Face
 * folder (`gptoss convert --to gguf`).
 *
 * Owns: the mapping between GGUF metadata / tensor names and gptoss_config / the Hugging Face
 * tensor layout the backends use (spec section 4.3), including the MXFP4 nibble repacking and
 * the gate/up (de)interleaving. Knows nothing of devices.
 */
#ifndef GPTOSS_LOADER_GGUF_MODEL_H
#define GPTOSS_LOADER_GGUF_MODEL_H

#include "format/gguf.h"
#include "gptoss.h"

/* Loads a gpt-oss GGUF file, or the first part of a split one (see docs/gguf.md for what is
 * accepted). */
gptoss_status gptoss_gguf_model_load(const char *path, gptoss_model **out, gptoss_error *error);

/* Fills config from the file's metadata (general.architecture "gpt-oss" keys) and the shape of
 * token_embd.weight, then validates it. */
gptoss_status gptoss_gguf_read_config(const gptoss_gguf_file *file, gptoss_config *config,
                                      gptoss_error *error);

/* Writes model_dir (a Hugging Face gpt-oss folder) as one GGUF file at out_path: llama.cpp's
 * tensor names, metadata keys and MXFP4 expert layout; dense matrices stay BF16 and vectors
 * become F32 (both lossless); the tokenizer from model_dir/tokenizer.json. */
gptoss_status gptoss_gguf_convert(const char *model_dir, const char *out_path, gptoss_error *error);

#endif
