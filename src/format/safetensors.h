/*
 * safetensors.h - memory-mapped, validated safetensors files (spec section 4.1).
 *
 * A file is mapped read-only once; tensors are views into the mapping (zero-copy). Opening
 * validates everything a later reader relies on: header length sane and inside the file,
 * JSON well-formed with no duplicate names, dtypes known, shape x dtype size equal to the byte
 * range, ranges inside the data buffer and not overlapping. Knows nothing about models.
 */
#ifndef GPTOSS_FORMAT_SAFETENSORS_H
#define GPTOSS_FORMAT_SAFETENSORS_H

#include "format/tensor.h"
#include "gptoss.h"

#include <stddef.h>
#include <stdint.h>

/* The reference reader refuses headers over 100 MB; so do we. */
#define GPTOSS_SAFETENSORS_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct gptoss_st_tensor {
    char *name; /* owned */
    gptoss_dtype dtype;
    int32_t n_dims;
    int64_t shape[GPTOSS_MAX_DIMS];
    uint64_t begin;      /* byte offset in the data buffer */
    uint64_t end;        /* exclusive */
    const uint8_t *data; /* points into the mapping */
} gptoss_st_tensor;

typedef struct gptoss_st_file {
    char *path;                /* owned copy */
    uint8_t *map;              /* whole file, read-only mapping */
    size_t map_size;           /* file size in bytes */
    uint64_t header_len;       /* N from the first 8 bytes */
    const uint8_t *data;       /* start of the data buffer = map + 8 + N */
    uint64_t data_size;        /* bytes after the header */
    gptoss_st_tensor *tensors; /* [n_tensors], in header order */
    size_t n_tensors;
} gptoss_st_file;

/* Maps and validates one file. *out is NULL on failure. */
gptoss_status gptoss_st_open(const char *path, gptoss_st_file **out, gptoss_error *error);
void gptoss_st_close(gptoss_st_file *file);

/* Linear search by name; NULL if absent. */
const gptoss_st_tensor *gptoss_st_find(const gptoss_st_file *file, const char *name);

/* Validates one header buffer (the JSON text, N bytes) against a data buffer of data_size
 * bytes and fills tensors. Exposed for tests and fuzzing; gptoss_st_open calls it. */
gptoss_status gptoss_st_parse_header(const char *json_text, size_t json_len, uint64_t data_size,
                                     gptoss_st_tensor **tensors, size_t *n_tensors,
                                     gptoss_error *error);
void gptoss_st_free_tensors(gptoss_st_tensor *tensors, size_t n_tensors);

#endif
