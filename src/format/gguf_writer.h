/*
 * gguf_writer.h - writing GGUF v3 files: metadata pairs and tensors, the data section aligned
 * as general.alignment says (32 by default).
 *
 * Metadata is collected in memory; tensors are declared first (name, ne, ggml type) so the
 * header can be written, then their bytes come from a callback one tensor at a time, so a
 * writer never holds more than one tensor. Knows nothing about models.
 */
#ifndef GPTOSS_FORMAT_GGUF_WRITER_H
#define GPTOSS_FORMAT_GGUF_WRITER_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gptoss_gguf_writer gptoss_gguf_writer;

gptoss_gguf_writer *gptoss_gguf_writer_new(void);
void gptoss_gguf_writer_free(gptoss_gguf_writer *w);

/* Metadata, in the order added. Errors (out of memory) are remembered and reported by
 * gptoss_gguf_writer_write. */
void gptoss_gguf_add_u16(gptoss_gguf_writer *w, const char *key, uint16_t v);
void gptoss_gguf_add_u32(gptoss_gguf_writer *w, const char *key, uint32_t v);
void gptoss_gguf_add_i32(gptoss_gguf_writer *w, const char *key, int32_t v);
void gptoss_gguf_add_f32(gptoss_gguf_writer *w, const char *key, float v);
void gptoss_gguf_add_bool(gptoss_gguf_writer *w, const char *key, bool v);
void gptoss_gguf_add_string(gptoss_gguf_writer *w, const char *key, const char *v, size_t len);
void gptoss_gguf_add_array_strings(gptoss_gguf_writer *w, const char *key, size_t n,
                                   const char *const *v, const size_t *lens);
void gptoss_gguf_add_array_i32(gptoss_gguf_writer *w, const char *key, size_t n, const int32_t *v);
void gptoss_gguf_add_array_bool(gptoss_gguf_writer *w, const char *key, size_t n, const bool *v);

/* Declares a tensor (ne[0] innermost, n_dims 1..4); returns its index. */
size_t gptoss_gguf_add_tensor(gptoss_gguf_writer *w, const char *name, uint32_t n_dims,
                              const int64_t *ne, uint32_t ggml_type);

/* Fills out[0..n_bytes) with tensor `index`'s data. */
typedef gptoss_status (*gptoss_gguf_fill_fn)(void *user, size_t index, uint8_t *out, size_t n_bytes,
                                             gptoss_error *error);

/* Writes the file (to path + ".tmp", renamed on success). */
gptoss_status gptoss_gguf_writer_write(gptoss_gguf_writer *w, const char *path,
                                       gptoss_gguf_fill_fn fill, void *user, gptoss_error *error);

#endif
