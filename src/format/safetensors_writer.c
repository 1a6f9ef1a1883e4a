/*
 * safetensors_writer.c - see safetensors_writer.h.
 */
#include "format/safetensors_writer.h"
#include "util/error.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES ((size_t)32 << 20)

gptoss_status gptoss_st_write(const char *path, const gptoss_st_write_tensor *tensors,
                              size_t n_tensors, gptoss_st_fill_fn fill,
                              gptoss_st_written_fn written, void *user, gptoss_error *error) {
    json_t *header = json_object();
    json_object_set_new(header, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t offset = 0;
    uint64_t *sizes = calloc(n_tensors ? n_tensors : 1, sizeof *sizes);
    if (!sizes) {
        json_decref(header);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < n_tensors; i++) {
        uint64_t bytes = gptoss_dtype_size(tensors[i].dtype);
        json_t *shape = json_array();
        for (int32_t d = 0; d < tensors[i].n_dims; d++) {
            bytes *= (uint64_t)tensors[i].shape[d];
            json_array_append_new(shape, json_integer(tensors[i].shape[d]));
        }
        sizes[i] = bytes;
        json_object_set_new(
            header, tensors[i].name,
            json_pack("{s:s,s:o,s:[I,I]}", "dtype", gptoss_dtype_name(tensors[i].dtype), "shape",
                      shape, "data_offsets", (json_int_t)offset, (json_int_t)(offset + bytes)));
        offset += bytes;
    }
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(header);
    if (!text) {
        free(sizes);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t text_len = strlen(text);
    size_t padded = (text_len + 7) / 8 * 8;

    char tmp_path[4200];
    snprintf(tmp_path, sizeof tmp_path, "%s.partial", path);
    FILE *f = fopen(tmp_path, "wb");
    uint8_t *chunk = malloc(CHUNK_BYTES);
    gptoss_status st = GPTOSS_OK;
    if (!f)
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot create: %s", tmp_path,
                              strerror(errno));
    else if (!chunk)
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == GPTOSS_OK) {
        uint8_t len_bytes[8];
        for (int i = 0; i < 8; i++)
            len_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        bool ok = fwrite(len_bytes, 1, 8, f) == 8 && fwrite(text, 1, text_len, f) == text_len;
        for (size_t i = text_len; ok && i < padded; i++)
            ok = fputc(' ', f) != EOF;
        uint64_t total = 8 + padded;
        for (size_t i = 0; ok && i < n_tensors; i++) {
            for (uint64_t pos = 0; ok && pos < sizes[i]; pos += CHUNK_BYTES) {
                size_t len = (size_t)(sizes[i] - pos < CHUNK_BYTES ? sizes[i] - pos : CHUNK_BYTES);
                fill(user, i, pos, chunk, len);
                ok = fwrite(chunk, 1, len, f) == len;
                total += len;
                if (written) written(user, total);
            }
        }
        if (!ok)
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: write failed: %s", tmp_path,
                                  strerror(errno));
    }
    if (f && fclose(f) != 0 && st == GPTOSS_OK)
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: close failed: %s", tmp_path,
                              strerror(errno));
    if (st == GPTOSS_OK && rename(tmp_path, path) != 0)
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    if (st != GPTOSS_OK) remove(tmp_path);
    free(chunk);
    free(text);
    free(sizes);
    return st;
}
