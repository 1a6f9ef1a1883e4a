/*
 * safetensors_writer.h - writing safetensors files whose tensor data is produced in chunks
 * by a callback, so multi-gigabyte checkpoints never sit in memory.
 */
#ifndef GPTOSS_FORMAT_SAFETENSORS_WRITER_H
#define GPTOSS_FORMAT_SAFETENSORS_WRITER_H

#include "format/tensor.h"
#include "gptoss.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gptoss_st_write_tensor {
    const char *name;
    gptoss_dtype dtype;
    int32_t n_dims;
    const int64_t *shape; /* [n_dims] */
} gptoss_st_write_tensor;

/* Fills out[0..len) with bytes [offset, offset + len) of tensor `index`. */
typedef void (*gptoss_st_fill_fn)(void *user, size_t index, uint64_t offset, uint8_t *out,
                                  size_t len);

/* Progress: bytes written so far of this file. */
typedef void (*gptoss_st_written_fn)(void *user, uint64_t bytes);

/* Writes `path` (via a temporary file renamed into place, so a crash never leaves a file that
 * looks complete). The header is padded with spaces to a multiple of 8 bytes and carries
 * {"format": "pt"} metadata; tensors are laid out in the given order. */
gptoss_status gptoss_st_write(const char *path, const gptoss_st_write_tensor *tensors,
                              size_t n_tensors, gptoss_st_fill_fn fill,
                              gptoss_st_written_fn written, void *user, gptoss_error *error);

#endif
