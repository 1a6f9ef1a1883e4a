/*
 * gguf_writer.c - see gguf_writer.h.
 */
#include "format/gguf_writer.h"
#include "format/gguf.h"
#include "util/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct wtensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[GPTOSS_GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t offset;
    uint64_t n_bytes;
} wtensor;

struct gptoss_gguf_writer {
    uint8_t *meta; /* encoded metadata pairs */
    size_t meta_len, meta_cap;
    uint64_t n_kvs;
    wtensor *tensors;
    size_t n_tensors, tensors_cap;
    uint64_t data_size; /* bytes of the data section so far, aligned */
    uint32_t alignment;
    bool failed; /* out of memory or a bad declaration */
    char failure[160];
};

gptoss_gguf_writer *gptoss_gguf_writer_new(void) {
    gptoss_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GPTOSS_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gptoss_gguf_writer_free(gptoss_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    free(w->meta);
    free(w);
}

static void put(gptoss_gguf_writer *w, const void *bytes, size_t n) {
    if (w->failed) return;
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n)
            cap *= 2;
        uint8_t *grown = realloc(w->meta, cap);
        if (!grown) {
            w->failed = true;
            snprintf(w->failure, sizeof w->failure, "out of memory building the GGUF header");
            return;
        }
        w->meta = grown;
        w->meta_cap = cap;
    }
    memcpy(w->meta + w->meta_len, bytes, n);
    w->meta_len += n;
}

static void put_u32(gptoss_gguf_writer *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}
static void put_u64(gptoss_gguf_writer *w, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, 8);
}
static void put_str(gptoss_gguf_writer *w, const char *s, size_t len) {
    put_u64(w, len);
    put(w, s, len);
}
static void put_key(gptoss_gguf_writer *w, const char *key, uint32_t type) {
    put_str(w, key, strlen(key));
    put_u32(w, type);
    w->n_kvs++;
}

void gptoss_gguf_add_u16(gptoss_gguf_writer *w, const char *key, uint16_t v) {
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put_key(w, key, GPTOSS_GGUF_U16);
    put(w, b, 2);
}
void gptoss_gguf_add_u32(gptoss_gguf_writer *w, const char *key, uint32_t v) {
    put_key(w, key, GPTOSS_GGUF_U32);
    put_u32(w, v);
    /* The padding is written from a 4 KiB block of zeros: larger alignments are refused. */
    if (strcmp(key, "general.alignment") == 0) {
        if (v && !(v & (v - 1)) && v <= 4096)
            w->alignment = v;
        else {
            w->failed = true;
            snprintf(w->failure, sizeof w->failure, "bad alignment %u", v);
        }
    }
}
void gptoss_gguf_add_i32(gptoss_gguf_writer *w, const char *key, int32_t v) {
    put_key(w, key, GPTOSS_GGUF_I32);
    put_u32(w, (uint32_t)v);
}
void gptoss_gguf_add_f32(gptoss_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_key(w, key, GPTOSS_GGUF_F32);
    put_u32(w, u);
}
void gptoss_gguf_add_bool(gptoss_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    put_key(w, key, GPTOSS_GGUF_BOOL);
    put(w, &b, 1);
}
void gptoss_gguf_add_string(gptoss_gguf_writer *w, const char *key, const char *v, size_t len) {
    put_key(w, key, GPTOSS_GGUF_STRING);
    put_str(w, v, len);
}
void gptoss_gguf_add_array_strings(gptoss_gguf_writer *w, const char *key, size_t n,
                                   const char *const *v, const size_t *lens) {
    put_key(w, key, GPTOSS_GGUF_ARRAY);
    put_u32(w, GPTOSS_GGUF_STRING);
    put_u64(w, n);
    for (size_t i = 0; i < n; i++)
        put_str(w, v[i], lens ? lens[i] : strlen(v[i]));
}
void gptoss_gguf_add_array_i32(gptoss_gguf_writer *w, const char *key, size_t n, const int32_t *v) {
    put_key(w, key, GPTOSS_GGUF_ARRAY);
    put_u32(w, GPTOSS_GGUF_I32);
    put_u64(w, n);
    for (size_t i = 0; i < n; i++)
        put_u32(w, (uint32_t)v[i]);
}
void gptoss_gguf_add_array_bool(gptoss_gguf_writer *w, const char *key, size_t n, const bool *v) {
    put_key(w, key, GPTOSS_GGUF_ARRAY);
    put_u32(w, GPTOSS_GGUF_BOOL);
    put_u64(w, n);
    for (size_t i = 0; i < n; i++) {
        uint8_t b = v[i];
        put(w, &b, 1);
    }
}

size_t gptoss_gguf_add_tensor(gptoss_gguf_writer *w, const char *name, uint32_t n_dims,
                              const int64_t *ne, uint32_t ggml_type) {
    uint32_t bs = 1, ts = 0;
    if (w->failed) return 0;
    if (n_dims < 1 || n_dims > GPTOSS_GGUF_MAX_DIMS ||
        !gptoss_ggml_type_info(ggml_type, &bs, &ts, NULL) || ne[0] % bs != 0) {
        w->failed = true;
        snprintf(w->failure, sizeof w->failure, "tensor %s: bad declaration (type %u)", name,
                 ggml_type);
        return 0;
    }
    if (w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 64;
        wtensor *grown = realloc(w->tensors, cap * sizeof *grown);
        if (!grown) {
            w->failed = true;
            snprintf(w->failure, sizeof w->failure, "out of memory");
            return 0;
        }
        w->tensors = grown;
        w->tensors_cap = cap;
    }
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->n_dims = n_dims;
    uint64_t bytes = (uint64_t)(ne[0] / bs) * ts;
    for (uint32_t d = 0; d < GPTOSS_GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        if (d > 0) bytes *= (uint64_t)t->ne[d];
    }
    t->type = ggml_type;
    t->n_bytes = bytes;
    t->offset = w->data_size;
    w->data_size += (bytes + w->alignment - 1) / w->alignment * w->alignment;
    return w->n_tensors++;
}

static bool write_all(FILE *f, const void *p, size_t n) {
    return fwrite(p, 1, n, f) == n;
}

gptoss_status gptoss_gguf_writer_write(gptoss_gguf_writer *w, const char *path,
                                       gptoss_gguf_fill_fn fill, void *user, gptoss_error *error) {
    if (w->failed) return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "%s", w->failure);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: cannot create: %s", tmp,
                                strerror(errno));
    /* Header: magic, version, counts, the metadata, the tensor infos. */
    gptoss_gguf_writer *h = gptoss_gguf_writer_new();
    gptoss_status st = GPTOSS_OK;
    uint8_t *buf = NULL;
    if (!h) {
        fclose(f);
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    put_u32(h, GPTOSS_GGUF_MAGIC);
    put_u32(h, GPTOSS_GGUF_VERSION);
    put_u64(h, w->n_tensors);
    put_u64(h, w->n_kvs);
    put(h, w->meta, w->meta_len);
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_str(h, t->name, strlen(t->name));
        put_u32(h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_u64(h, (uint64_t)t->ne[d]);
        put_u32(h, t->type);
        put_u64(h, t->offset);
    }
    size_t pad = (w->alignment - h->meta_len % w->alignment) % w->alignment;
    static const uint8_t zeros[4096];
    if (h->failed)
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "%s", h->failure);
    else if (!write_all(f, h->meta, h->meta_len) || !write_all(f, zeros, pad))
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    gptoss_gguf_writer_free(h);
    size_t buf_cap = 0;
    for (size_t i = 0; i < w->n_tensors && st == GPTOSS_OK; i++) {
        const wtensor *t = &w->tensors[i];
        if (t->n_bytes > buf_cap) {
            free(buf);
            buf = malloc(t->n_bytes);
            buf_cap = buf ? t->n_bytes : 0;
            if (!buf) {
                st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                      "out of memory for tensor %s (%llu bytes)", t->name,
                                      (unsigned long long)t->n_bytes);
                break;
            }
        }
        if ((st = fill(user, i, buf, t->n_bytes, error))) break;
        size_t tpad = (w->alignment - t->n_bytes % w->alignment) % w->alignment;
        if (!write_all(f, buf, t->n_bytes) || !write_all(f, zeros, tpad))
            st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: write failed: %s", tmp,
                                  strerror(errno));
    }
    free(buf);
    if (fclose(f) != 0 && st == GPTOSS_OK)
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (st == GPTOSS_OK && rename(tmp, path) != 0)
        st = gptoss_set_error(error, GPTOSS_ERR_IO, "cannot rename %s to %s: %s", tmp, path,
                              strerror(errno));
    if (st != GPTOSS_OK) remove(tmp);
    return st;
}
