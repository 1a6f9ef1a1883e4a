/*
 * model.h - how a loader builds a gptoss_model: it creates the model from a validated config,
 * hands over the storage its tensors live in, and binds the tensor views by name.
 *
 * Owns: the contract between model/ and the loaders (loader/load_hf.c and
 * loader/load_gguf.c). The model never looks inside the storage; it keeps each handle alive and
 * calls its close function when the model is freed.
 * Must not: name any file format.
 */
#ifndef GPTOSS_MODEL_MODEL_H
#define GPTOSS_MODEL_MODEL_H

#include "format/tensor.h"
#include "model/weights.h"
#include "gptoss.h"

#include <stddef.h>

/* Releases one storage handle (unmaps a file, frees a buffer). */
typedef void (*gptoss_storage_close_fn)(void *handle);

/* A model with this config (copied) and no tensors yet; dir is what gptoss_model_dir
 * reports. Free it with gptoss_model_free. */
gptoss_status gptoss_model_create(const char *dir, const gptoss_config *config, gptoss_model **out,
                                  gptoss_error *error);

/* The model takes ownership of handle: close(handle) runs on gptoss_model_free, or at once if
 * this call fails. close may be NULL. */
gptoss_status gptoss_model_add_storage(gptoss_model *model, void *handle,
                                       gptoss_storage_close_fn close, gptoss_error *error);

/* Binds tensors[0..n_tensors) to the layer slots by name, checking dtype and shape against the
 * config. The views' data must live in storage the model owns; names and the views array
 * itself are copied or no longer needed after the call. origins[i] (may be NULL) names where
 * tensor i came from, for the duplicate-name message. */
gptoss_status gptoss_model_bind(gptoss_model *model, const gptoss_tensor *tensors,
                                const char *const *origins, size_t n_tensors, gptoss_error *error);

/* Converts the expert tensors a loader bound with data NULL (see gptoss_weights.ggml_experts)
 * into storage it adds to the model, setting each view's data. */
typedef gptoss_status (*gptoss_model_unpack_fn)(gptoss_model *model, gptoss_weights *weights,
                                                gptoss_error *error);

/* For a loader that binds the experts without converting them: ggml ([n_layers], in storage the
 * model owns) becomes weights.ggml_experts, and unpack runs on the first
 * gptoss_model_unpack_experts. Call after gptoss_model_bind. */
void gptoss_model_defer_experts(gptoss_model *model, const gptoss_ggml_experts *ggml,
                                gptoss_model_unpack_fn unpack);

#endif
