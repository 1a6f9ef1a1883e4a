/*
 * safetensors.c - reading and validating safetensors files (see safetensors.h).
 *
 * The mapping is read-only and private; tensors are never copied. Every number from the file
 * is checked before it is used in arithmetic, so a hostile header cannot make us read outside
 * the mapping or overflow a size computation.
 */
#include "format/safetensors.h"
#include "util/error.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void gptoss_st_free_tensors(gptoss_st_tensor *tensors, size_t n_tensors) {
    if (!tensors) return;
    for (size_t i = 0; i < n_tensors; i++)
        free(tensors[i].name);
    free(tensors);
}

static int compare_by_begin(const void *a, const void *b) {
    const gptoss_st_tensor *const *x = a, *const *y = b;
    if ((*x)->begin != (*y)->begin) return (*x)->begin < (*y)->begin ? -1 : 1;
    if ((*x)->end != (*y)->end) return (*x)->end < (*y)->end ? -1 : 1;
    return 0;
}

/* Reads a JSON integer that must be a non-negative int64. */
static bool json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

static gptoss_status parse_entry(const char *name, json_t *entry, uint64_t data_size,
                                 gptoss_st_tensor *t, gptoss_error *error) {
    if (!json_is_object(entry))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "tensor %s: entry is not a JSON object",
                                name);
    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: missing or non-string \"dtype\"", name);
    t->dtype = gptoss_dtype_from_name(json_string_value(dtype));
    if (t->dtype == GPTOSS_DTYPE_UNKNOWN)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "tensor %s: unknown dtype \"%s\"", name,
                                json_string_value(dtype));
    if (!json_is_array(shape))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: missing or non-array \"shape\"", name);
    size_t n_dims = json_array_size(shape);
    if (n_dims > GPTOSS_MAX_DIMS)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: %zu dimensions (at most %d supported)", name, n_dims,
                                GPTOSS_MAX_DIMS);
    t->n_dims = (int32_t)n_dims;
    /* numel * element size must not overflow; every factor is bounded by the data size. */
    uint64_t n_bytes = gptoss_dtype_size(t->dtype);
    bool zero = false;
    for (size_t d = 0; d < n_dims; d++) {
        uint64_t dim;
        if (!json_u64(json_array_get(shape, d), &dim))
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "tensor %s: shape[%zu] is not a non-negative integer", name, d);
        t->shape[d] = (int64_t)dim;
        if (dim == 0)
            zero = true;
        else if (!zero) {
            if (dim > UINT64_MAX / n_bytes)
                return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                        "tensor %s: shape is absurdly large", name);
            n_bytes *= dim;
        }
    }
    if (zero) n_bytes = 0;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: \"data_offsets\" must be an array [begin, end]", name);
    if (!json_u64(json_array_get(offsets, 0), &t->begin) ||
        !json_u64(json_array_get(offsets, 1), &t->end))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: data_offsets must be non-negative integers", name);
    if (t->end < t->begin)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: data_offsets end %llu < begin %llu", name,
                                (unsigned long long)t->end, (unsigned long long)t->begin);
    if (t->end > data_size)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %s: data_offsets [%llu, %llu) run past the end of the data "
                                "(%llu bytes; file truncated?)",
                                name, (unsigned long long)t->begin, (unsigned long long)t->end,
                                (unsigned long long)data_size);
    if (t->end - t->begin != n_bytes) {
        char dims[256] = "";
        size_t used = 0;
        for (size_t d = 0; d < n_dims && used < sizeof dims - 24; d++)
            used += (size_t)snprintf(dims + used, sizeof dims - used, "%s%lld", d ? "," : "",
                                     (long long)t->shape[d]);
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "tensor %s: shape [%s] of %s needs %llu bytes but data_offsets span %llu", name, dims,
            gptoss_dtype_name(t->dtype), (unsigned long long)n_bytes,
            (unsigned long long)(t->end - t->begin));
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_st_parse_header(const char *json_text, size_t json_len, uint64_t data_size,
                                     gptoss_st_tensor **tensors_out, size_t *n_out,
                                     gptoss_error *error) {
    *tensors_out = NULL;
    *n_out = 0;
    if (json_len == 0 || json_text[0] != '{')
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "header does not start with '{'");
    /* The header may be right-padded with spaces; jansson accepts trailing whitespace. */
    json_error_t jerr;
    json_t *root = json_loadb(json_text, json_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "header is not valid JSON: %s (line %d, column %d)", jerr.text,
                                jerr.line, jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "header is not a JSON object");
    }
    size_t n = json_object_size(root);
    gptoss_st_tensor *tensors = calloc(n ? n : 1, sizeof *tensors);
    if (!tensors) {
        json_decref(root);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory reading header");
    }
    size_t count = 0;
    gptoss_status st = GPTOSS_OK;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(value)) {
                st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "__metadata__ is not an object");
                break;
            }
            continue;
        }
        gptoss_st_tensor *t = &tensors[count];
        st = parse_entry(key, value, data_size, t, error);
        if (st != GPTOSS_OK) break;
        t->name = strdup(key);
        if (!t->name) {
            st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        count++;
    }
    json_decref(root);
    if (st == GPTOSS_OK && count > 1) {
        /* Overlap check on byte ranges sorted by start; empty tensors overlap nothing. */
        gptoss_st_tensor **order = malloc(count * sizeof *order);
        if (!order)
            st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        else {
            for (size_t i = 0; i < count; i++)
                order[i] = &tensors[i];
            qsort(order, count, sizeof *order, compare_by_begin);
            const gptoss_st_tensor *prev = NULL;
            for (size_t i = 0; i < count; i++) {
                const gptoss_st_tensor *t = order[i];
                if (t->begin == t->end) continue;
                if (prev && t->begin < prev->end) {
                    st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                          "tensors %s [%llu, %llu) and %s [%llu, %llu) overlap",
                                          prev->name, (unsigned long long)prev->begin,
                                          (unsigned long long)prev->end, t->name,
                                          (unsigned long long)t->begin, (unsigned long long)t->end);
                    break;
                }
                prev = t;
            }
            free(order);
        }
    }
    if (st != GPTOSS_OK) {
        gptoss_st_free_tensors(tensors, count);
        return st;
    }
    *tensors_out = tensors;
    *n_out = count;
    return GPTOSS_OK;
}

gptoss_status gptoss_st_open(const char *path, gptoss_st_file **out, gptoss_error *error) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "%s: file is %zu bytes, too short for a safetensors header (truncated?)", path, size);
    }
    uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | map[i]; /* little-endian u64 */
    gptoss_status st = GPTOSS_OK;
    if (n > GPTOSS_SAFETENSORS_MAX_HEADER)
        st = gptoss_set_error(
            error, GPTOSS_ERR_FORMAT, "%s: header length %llu exceeds the %llu byte limit", path,
            (unsigned long long)n, (unsigned long long)GPTOSS_SAFETENSORS_MAX_HEADER);
    else if (n > size - 8)
        st = gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "%s: header length %llu runs past the end of the %zu-byte file (truncated?)", path,
            (unsigned long long)n, size);
    gptoss_st_file *file = NULL;
    if (st == GPTOSS_OK) {
        file = calloc(1, sizeof *file);
        if (!file) st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (st == GPTOSS_OK) {
        file->path = strdup(path);
        file->map = map;
        file->map_size = size;
        file->header_len = n;
        file->data = map + 8 + n;
        file->data_size = size - 8 - n;
        st = gptoss_st_parse_header((const char *)map + 8, (size_t)n, file->data_size,
                                    &file->tensors, &file->n_tensors, error);
        if (st != GPTOSS_OK) gptoss_error_prefix(error, "%s: ", path);
    }
    if (st != GPTOSS_OK) {
        if (file) {
            free(file->path);
            free(file);
        }
        munmap(map, size);
        return st;
    }
    for (size_t i = 0; i < file->n_tensors; i++)
        file->tensors[i].data = file->data + file->tensors[i].begin;
    *out = file;
    return GPTOSS_OK;
}

void gptoss_st_close(gptoss_st_file *file) {
    if (!file) return;
    gptoss_st_free_tensors(file->tensors, file->n_tensors);
    if (file->map) munmap(file->map, file->map_size);
    free(file->path);
    free(file);
}

const gptoss_st_tensor *gptoss_st_find(const gptoss_st_file *file, const char *name) {
    for (size_t i = 0; i < file->n_tensors; i++)
        if (strcmp(file->tensors[i].name, name) == 0) return &file->tensors[i];
    return NULL;
}
