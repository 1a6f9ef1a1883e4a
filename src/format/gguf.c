/*
 * gguf.c - reading and validating GGUF files (see gguf.h).
 *
 * A cursor walks the header with every read bounds-checked against the mapping, and every
 * count is checked against the bytes left before anything is allocated from it, so a hostile
 * file can neither make us read outside the mapping nor allocate more than a small multiple of
 * its own size.
 */
#include "format/gguf.h"
#include "util/error.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- ggml types ------------------------------------------------------------------------- */

typedef struct ggml_type_row {
    uint32_t type;
    uint32_t block_size;
    uint32_t type_size;
    const char *name;
} ggml_type_row;

/* ggml's type numbers and block geometry (ggml.h, ggml-common.h). Numbers ggml retired (4, 5,
 * 31-33, 36-38) are unknown on purpose. */
static const ggml_type_row ggml_types[] = {
    {0, 1, 4, "F32"},         {1, 1, 2, "F16"},         {2, 32, 18, "Q4_0"},
    {3, 32, 20, "Q4_1"},      {6, 32, 22, "Q5_0"},      {7, 32, 24, "Q5_1"},
    {8, 32, 34, "Q8_0"},      {9, 32, 36, "Q8_1"},      {10, 256, 84, "Q2_K"},
    {11, 256, 110, "Q3_K"},   {12, 256, 144, "Q4_K"},   {13, 256, 176, "Q5_K"},
    {14, 256, 210, "Q6_K"},   {15, 256, 292, "Q8_K"},   {16, 256, 66, "IQ2_XXS"},
    {17, 256, 74, "IQ2_XS"},  {18, 256, 98, "IQ3_XXS"}, {19, 256, 50, "IQ1_S"},
    {20, 32, 18, "IQ4_NL"},   {21, 256, 110, "IQ3_S"},  {22, 256, 82, "IQ2_S"},
    {23, 256, 136, "IQ4_XS"}, {24, 1, 1, "I8"},         {25, 1, 2, "I16"},
    {26, 1, 4, "I32"},        {27, 1, 8, "I64"},        {28, 1, 8, "F64"},
    {29, 256, 56, "IQ1_M"},   {30, 1, 2, "BF16"},       {34, 256, 54, "TQ1_0"},
    {35, 256, 66, "TQ2_0"},   {39, 32, 17, "MXFP4"},
};

bool gptoss_ggml_type_info(uint32_t type, uint32_t *block_size, uint32_t *type_size,
                           const char **name) {
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].type == type) {
            if (block_size) *block_size = ggml_types[i].block_size;
            if (type_size) *type_size = ggml_types[i].type_size;
            if (name) *name = ggml_types[i].name;
            return true;
        }
    return false;
}

const char *gptoss_ggml_type_name(uint32_t type, char *buf, size_t size) {
    const char *name;
    if (gptoss_ggml_type_info(type, NULL, NULL, &name)) return name;
    snprintf(buf, size, "type %u", type);
    return buf;
}

const char *gptoss_gguf_vtype_name(uint32_t vtype) {
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return vtype < GPTOSS_GGUF_N_VTYPES ? names[vtype] : "unknown";
}

static size_t vtype_size(uint32_t vtype) {
    switch (vtype) {
    case GPTOSS_GGUF_U8:
    case GPTOSS_GGUF_I8:
    case GPTOSS_GGUF_BOOL:
        return 1;
    case GPTOSS_GGUF_U16:
    case GPTOSS_GGUF_I16:
        return 2;
    case GPTOSS_GGUF_U32:
    case GPTOSS_GGUF_I32:
    case GPTOSS_GGUF_F32:
        return 4;
    case GPTOSS_GGUF_U64:
    case GPTOSS_GGUF_I64:
    case GPTOSS_GGUF_F64:
        return 8;
    default:
        return 0; /* string, array: variable */
    }
}

/* ---- the cursor --------------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *buf;
    size_t size;
    size_t pos;
} cursor;

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bool need(const cursor *c, uint64_t n) {
    return n <= c->size - c->pos;
}

static gptoss_status truncated(const cursor *c, const char *what, gptoss_error *error) {
    return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                            "file truncated: %s at byte %zu runs past the end (%zu bytes)", what,
                            c->pos, c->size);
}

static gptoss_status read_u32(cursor *c, const char *what, uint32_t *out, gptoss_error *error) {
    if (!need(c, 4)) return truncated(c, what, error);
    *out = le32(c->buf + c->pos);
    c->pos += 4;
    return GPTOSS_OK;
}

static gptoss_status read_u64(cursor *c, const char *what, uint64_t *out, gptoss_error *error) {
    if (!need(c, 8)) return truncated(c, what, error);
    *out = le64(c->buf + c->pos);
    c->pos += 8;
    return GPTOSS_OK;
}

static gptoss_status read_str(cursor *c, const char *what, gptoss_gguf_str *out,
                              gptoss_error *error) {
    uint64_t len = 0;
    gptoss_status st = read_u64(c, what, &len, error);
    if (st) return st;
    if (!need(c, len))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "%s at byte %zu: string length %llu runs past the end of the "
                                "file (%zu bytes; truncated?)",
                                what, c->pos - 8, (unsigned long long)len, c->size);
    out->ptr = (const char *)c->buf + c->pos;
    out->len = len;
    c->pos += (size_t)len;
    return GPTOSS_OK;
}

/* ---- metadata ----------------------------------------------------------------------------- */

static gptoss_status read_value(cursor *c, gptoss_gguf_kv *kv, gptoss_error *error) {
    char key[96];
    snprintf(key, sizeof key, "metadata %.*s", (int)(kv->key.len > 64 ? 64 : kv->key.len),
             kv->key.ptr);
    gptoss_status st;
    kv->count = 1;
    if (kv->type == GPTOSS_GGUF_STRING) {
        if ((st = read_str(c, key, &kv->str, error))) return st;
        kv->data = (const uint8_t *)kv->str.ptr;
        return GPTOSS_OK;
    }
    if (kv->type == GPTOSS_GGUF_ARRAY) {
        if ((st = read_u32(c, key, &kv->elem_type, error))) return st;
        if ((st = read_u64(c, key, &kv->count, error))) return st;
        if (kv->elem_type == GPTOSS_GGUF_ARRAY)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s: arrays of arrays are not supported", key);
        if (kv->elem_type >= GPTOSS_GGUF_N_VTYPES)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: unknown array element type %u",
                                    key, kv->elem_type);
        kv->data = c->buf + c->pos;
        if (kv->elem_type == GPTOSS_GGUF_STRING) {
            /* Each string takes at least its 8-byte length: bounds the allocation. */
            if (kv->count > (c->size - c->pos) / 8)
                return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                        "%s: %llu strings cannot fit in the %zu bytes left (absurd "
                                        "count or truncated file)",
                                        key, (unsigned long long)kv->count, c->size - c->pos);
            kv->strings = malloc((kv->count ? kv->count : 1) * sizeof *kv->strings);
            if (!kv->strings)
                return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "%s: out of memory", key);
            for (uint64_t i = 0; i < kv->count; i++)
                if ((st = read_str(c, key, &kv->strings[i], error))) return st;
            return GPTOSS_OK;
        }
        size_t es = vtype_size(kv->elem_type);
        if (kv->count > (c->size - c->pos) / es)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "%s: array of %llu %s runs past the end of the file (%zu bytes "
                                    "left; absurd count or truncated file)",
                                    key, (unsigned long long)kv->count,
                                    gptoss_gguf_vtype_name(kv->elem_type), c->size - c->pos);
        if (kv->elem_type == GPTOSS_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->count; i++)
                if (c->buf[c->pos + i] > 1)
                    return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                            "%s: element %llu is not a bool (byte %u)", key,
                                            (unsigned long long)i, c->buf[c->pos + i]);
        c->pos += (size_t)(kv->count * es);
        return GPTOSS_OK;
    }
    size_t es = vtype_size(kv->type);
    if (es == 0)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: unknown value type %u", key,
                                kv->type);
    if (!need(c, es)) return truncated(c, key, error);
    kv->data = c->buf + c->pos;
    if (kv->type == GPTOSS_GGUF_BOOL && kv->data[0] > 1)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s: not a bool (byte %u)", key,
                                kv->data[0]);
    c->pos += es;
    return GPTOSS_OK;
}

static int compare_str(const gptoss_gguf_str *a, const gptoss_gguf_str *b) {
    size_t n = a->len < b->len ? (size_t)a->len : (size_t)b->len;
    int r = memcmp(a->ptr, b->ptr, n);
    if (r) return r;
    return a->len < b->len ? -1 : a->len > b->len;
}

static int compare_kv_ptr(const void *a, const void *b) {
    const gptoss_gguf_kv *const *x = a, *const *y = b;
    return compare_str(&(*x)->key, &(*y)->key);
}

static int compare_tensor_name(const void *a, const void *b) {
    const gptoss_gguf_tensor *const *x = a, *const *y = b;
    return compare_str(&(*x)->name, &(*y)->name);
}

static int compare_tensor_offset(const void *a, const void *b) {
    const gptoss_gguf_tensor *const *x = a, *const *y = b;
    if ((*x)->offset != (*y)->offset) return (*x)->offset < (*y)->offset ? -1 : 1;
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------------ */

static gptoss_status read_tensor_info(cursor *c, uint64_t index, gptoss_gguf_tensor *t,
                                      gptoss_error *error) {
    char what[64];
    snprintf(what, sizeof what, "tensor info #%llu", (unsigned long long)index);
    gptoss_status st = read_str(c, what, &t->name, error);
    if (st) return st;
    int nl = (int)(t->name.len > 80 ? 80 : t->name.len);
    if (t->name.len == 0)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s has an empty name", what);
    if ((st = read_u32(c, what, &t->n_dims, error))) return st;
    if (t->n_dims == 0 || t->n_dims > GPTOSS_GGUF_MAX_DIMS)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %.*s: %u dimensions (1 to %d allowed)", nl, t->name.ptr,
                                t->n_dims, GPTOSS_GGUF_MAX_DIMS);
    for (int d = 0; d < GPTOSS_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v = 0;
        if ((st = read_u64(c, what, &v, error))) return st;
        if (v > (uint64_t)INT64_MAX)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "tensor %.*s: ne[%u] = %llu is absurd", nl, t->name.ptr, d,
                                    (unsigned long long)v);
        t->ne[d] = (int64_t)v;
    }
    if ((st = read_u32(c, what, &t->type, error))) return st;
    if ((st = read_u64(c, what, &t->offset, error))) return st;
    uint32_t bs = 1, ts = 0;
    if (!gptoss_ggml_type_info(t->type, &bs, &ts, NULL))
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "tensor %.*s: unknown ggml type %u", nl,
                                t->name.ptr, t->type);
    if (t->ne[0] % bs != 0)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "tensor %.*s: ne[0] = %lld is not a multiple of the %u-element "
                                "blocks of its type",
                                nl, t->name.ptr, (long long)t->ne[0], bs);
    /* Bytes = ne0/bs * ts * ne1 * ne2 * ne3, each product checked; a zero dim gives 0. */
    uint64_t bytes = (uint64_t)(t->ne[0] / bs) * ts;
    bool zero = bytes == 0;
    for (int d = 1; d < GPTOSS_GGUF_MAX_DIMS && !zero; d++) {
        uint64_t v = (uint64_t)t->ne[d];
        if (v == 0) {
            zero = true;
        } else {
            if (bytes > UINT64_MAX / v || (t->ne[0] / bs) > INT64_MAX / (int64_t)v)
                return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                        "tensor %.*s: shape is absurdly large", nl, t->name.ptr);
            bytes *= v;
        }
    }
    t->n_bytes = zero ? 0 : bytes;
    return GPTOSS_OK;
}

/* ---- the whole file ----------------------------------------------------------------------- */

static void free_file_contents(gptoss_gguf_file *f) {
    if (f->kvs)
        for (uint64_t i = 0; i < f->n_kvs; i++)
            free(f->kvs[i].strings);
    free(f->kvs);
    free(f->tensors);
}

static gptoss_status parse(const uint8_t *buf, size_t size, gptoss_gguf_file *f,
                           gptoss_error *error) {
    cursor c = {buf, size, 0};
    uint32_t magic = 0;
    gptoss_status st;
    if (size < 4) return truncated(&c, "the magic", error);
    if ((st = read_u32(&c, "the magic", &magic, error))) return st;
    if (magic != GPTOSS_GGUF_MAGIC)
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "not a GGUF file: the magic is %02x %02x %02x %02x, expected "
                                "\"GGUF\" (47 47 55 46)",
                                buf[0], buf[1], buf[2], buf[3]);
    if ((st = read_u32(&c, "the version", &f->version, error))) return st;
    if (f->version != 2 && f->version != 3) {
        if ((f->version & 0xffff) == 0 && f->version != 0)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                    "GGUF version %u reads like a big-endian file, which is not "
                                    "supported",
                                    f->version);
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "GGUF version %u is not supported (versions 2 and 3 are)",
                                f->version);
    }
    if ((st = read_u64(&c, "the tensor count", &f->n_tensors, error)) ||
        (st = read_u64(&c, "the metadata count", &f->n_kvs, error)))
        return st;
    /* A metadata pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
     * least 8 + 4 + 8 + 4 + 8. */
    size_t left = size - c.pos;
    if (f->n_kvs > left / 13)
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "metadata count %llu is absurd for a %zu-byte file (or it is truncated)",
            (unsigned long long)f->n_kvs, size);
    if (f->n_tensors > left / 32)
        return gptoss_set_error(
            error, GPTOSS_ERR_FORMAT,
            "tensor count %llu is absurd for a %zu-byte file (or it is truncated)",
            (unsigned long long)f->n_tensors, size);
    f->kvs = calloc(f->n_kvs ? f->n_kvs : 1, sizeof *f->kvs);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors)
        return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY,
                                "out of memory reading the header");
    for (uint64_t i = 0; i < f->n_kvs; i++) {
        gptoss_gguf_kv *kv = &f->kvs[i];
        char what[64];
        snprintf(what, sizeof what, "metadata key #%llu", (unsigned long long)i);
        if ((st = read_str(&c, what, &kv->key, error))) return st;
        if (kv->key.len == 0)
            return gptoss_set_error(error, GPTOSS_ERR_FORMAT, "%s is empty", what);
        if ((st = read_u32(&c, what, &kv->type, error))) return st;
        if (kv->type >= GPTOSS_GGUF_N_VTYPES)
            return gptoss_set_error(
                error, GPTOSS_ERR_FORMAT, "metadata %.*s: unknown value type %u",
                (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.ptr, kv->type);
        if ((st = read_value(&c, kv, error))) return st;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((st = read_tensor_info(&c, i, &f->tensors[i], error))) return st;

    /* Duplicates: sort pointers by name and compare neighbours. */
    uint64_t n_sort = f->n_kvs > f->n_tensors ? f->n_kvs : f->n_tensors;
    void **order = malloc((n_sort ? n_sort : 1) * sizeof *order);
    if (!order) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint64_t i = 0; i < f->n_kvs; i++)
        order[i] = &f->kvs[i];
    qsort(order, f->n_kvs, sizeof *order, compare_kv_ptr);
    for (uint64_t i = 1; i < f->n_kvs; i++) {
        const gptoss_gguf_kv *a = order[i - 1], *b = order[i];
        if (compare_str(&a->key, &b->key) == 0) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "metadata key %.*s appears twice",
                                  (int)(a->key.len > 64 ? 64 : a->key.len), a->key.ptr);
            free(order);
            return st;
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    qsort(order, f->n_tensors, sizeof *order, compare_tensor_name);
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        const gptoss_gguf_tensor *a = order[i - 1], *b = order[i];
        if (compare_str(&a->name, &b->name) == 0) {
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT, "tensor %.*s appears twice",
                                  (int)(a->name.len > 80 ? 80 : a->name.len), a->name.ptr);
            free(order);
            return st;
        }
    }

    f->alignment = GPTOSS_GGUF_DEFAULT_ALIGNMENT;
    const gptoss_gguf_kv *al = gptoss_gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GPTOSS_GGUF_U32)
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                  "metadata general.alignment has type %s, expected u32",
                                  gptoss_gguf_vtype_name(al->type));
        else {
            f->alignment = le32(al->data);
            if (f->alignment == 0 || (f->alignment & (f->alignment - 1)) ||
                f->alignment > (1u << 30))
                st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                      "general.alignment = %u is not a power of two up to 2^30",
                                      f->alignment);
        }
        if (st) {
            free(order);
            return st;
        }
    }
    /* The data section starts at the next multiple of the alignment. */
    uint64_t data_offset = ((uint64_t)c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (data_offset > size && f->n_tensors > 0) {
        free(order);
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "file truncated: the tensor data section would start at byte %llu "
                                "of a %zu-byte file",
                                (unsigned long long)data_offset, size);
    }
    f->data_offset = data_offset > size ? size : data_offset;
    f->data = buf + f->data_offset;
    f->data_size = size - f->data_offset;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gptoss_gguf_tensor *t = &f->tensors[i];
        int nl = (int)(t->name.len > 80 ? 80 : t->name.len);
        if (t->offset % f->alignment != 0)
            st = gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                  "tensor %.*s: offset %llu is not a multiple of the alignment %u",
                                  nl, t->name.ptr, (unsigned long long)t->offset, f->alignment);
        else if (t->offset > f->data_size || t->n_bytes > f->data_size - t->offset)
            st = gptoss_set_error(
                error, GPTOSS_ERR_FORMAT,
                "tensor %.*s: bytes [%llu, %llu) run past the end of the %llu-byte "
                "data section (file truncated?)",
                nl, t->name.ptr, (unsigned long long)t->offset,
                (unsigned long long)t->offset + t->n_bytes, (unsigned long long)f->data_size);
        if (st) {
            free(order);
            return st;
        }
        t->data = f->data + t->offset;
    }
    qsort(order, f->n_tensors, sizeof *order, compare_tensor_offset);
    const gptoss_gguf_tensor *prev = NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gptoss_gguf_tensor *t = order[i];
        if (t->n_bytes == 0) continue;
        if (prev && t->offset < prev->offset + prev->n_bytes) {
            st = gptoss_set_error(
                error, GPTOSS_ERR_FORMAT, "tensors %.*s [%llu, %llu) and %.*s [%llu, %llu) overlap",
                (int)(prev->name.len > 80 ? 80 : prev->name.len), prev->name.ptr,
                (unsigned long long)prev->offset,
                (unsigned long long)(prev->offset + prev->n_bytes),
                (int)(t->name.len > 80 ? 80 : t->name.len), t->name.ptr,
                (unsigned long long)t->offset, (unsigned long long)(t->offset + t->n_bytes));
            break;
        }
        prev = t;
    }
    free(order);
    return st;
}

gptoss_status gptoss_gguf_parse(const uint8_t *buf, size_t size, gptoss_gguf_file **out,
                                gptoss_error *error) {
    *out = NULL;
    gptoss_gguf_file *f = calloc(1, sizeof *f);
    if (!f) return gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    gptoss_status st = parse(buf, size, f, error);
    if (st) {
        free_file_contents(f);
        free(f);
        return st;
    }
    *out = f;
    return GPTOSS_OK;
}

gptoss_status gptoss_gguf_open(const char *path, gptoss_gguf_file **out, gptoss_error *error) {
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
    if (size < 24) {
        close(fd);
        return gptoss_set_error(error, GPTOSS_ERR_FORMAT,
                                "%s: file is %zu bytes, too short for a GGUF header (truncated?)",
                                path, size);
    }
    uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return gptoss_set_error(error, GPTOSS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    gptoss_gguf_file *f = NULL;
    gptoss_status st = gptoss_gguf_parse(map, size, &f, error);
    if (st == GPTOSS_OK && !(f->path = strdup(path))) {
        st = gptoss_set_error(error, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        gptoss_gguf_close(f);
        f = NULL;
    }
    if (st) {
        gptoss_error_prefix(error, "%s: ", path);
        munmap(map, size);
        return st;
    }
    f->map = map;
    f->map_size = size;
    *out = f;
    return GPTOSS_OK;
}

void gptoss_gguf_close(gptoss_gguf_file *file) {
    if (!file) return;
    free_file_contents(file);
    if (file->map) munmap(file->map, file->map_size);
    free(file->path);
    free(file);
}

bool gptoss_gguf_sniff(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint8_t magic[4];
    bool ok = fread(magic, 1, 4, f) == 4 && le32(magic) == GPTOSS_GGUF_MAGIC;
    fclose(f);
    return ok;
}

double gptoss_gguf_f32_decimal(float v) {
    if (!isfinite(v)) return v;
    char buf[40];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v) return strtod(buf, NULL);
    }
    return v;
}

/* ---- lookups ------------------------------------------------------------------------------ */

bool gptoss_gguf_str_is(gptoss_gguf_str s, const char *text) {
    size_t n = strlen(text);
    return s.len == n && memcmp(s.ptr, text, n) == 0;
}

const gptoss_gguf_kv *gptoss_gguf_find_kv(const gptoss_gguf_file *file, const char *key) {
    for (uint64_t i = 0; i < file->n_kvs; i++)
        if (gptoss_gguf_str_is(file->kvs[i].key, key)) return &file->kvs[i];
    return NULL;
}

const gptoss_gguf_tensor *gptoss_gguf_find_tensor(const gptoss_gguf_file *file, const char *name) {
    for (uint64_t i = 0; i < file->n_tensors; i++)
        if (gptoss_gguf_str_is(file->tensors[i].name, name)) return &file->tensors[i];
    return NULL;
}

static bool is_int_type(uint32_t t) {
    return t <= GPTOSS_GGUF_I32 || t == GPTOSS_GGUF_U64 || t == GPTOSS_GGUF_I64;
}

/* Integer at p of type t; *too_big set for a u64 above INT64_MAX. */
static int64_t int_at(const uint8_t *p, uint32_t t, bool *too_big) {
    *too_big = false;
    switch (t) {
    case GPTOSS_GGUF_U8:
        return p[0];
    case GPTOSS_GGUF_I8:
        return (int8_t)p[0];
    case GPTOSS_GGUF_U16:
        return (uint16_t)(p[0] | p[1] << 8);
    case GPTOSS_GGUF_I16:
        return (int16_t)(uint16_t)(p[0] | p[1] << 8);
    case GPTOSS_GGUF_U32:
        return le32(p);
    case GPTOSS_GGUF_I32:
        return (int32_t)le32(p);
    case GPTOSS_GGUF_U64: {
        uint64_t v = le64(p);
        if (v > (uint64_t)INT64_MAX) *too_big = true;
        return (int64_t)(v & (uint64_t)INT64_MAX);
    }
    case GPTOSS_GGUF_I64:
        return (int64_t)le64(p);
    case GPTOSS_GGUF_BOOL:
        return p[0];
    default:
        return 0; /* not an integer type: callers check first */
    }
}

int64_t gptoss_gguf_array_int(const gptoss_gguf_kv *kv, uint64_t i) {
    bool too_big;
    return int_at(kv->data + i * vtype_size(kv->elem_type), kv->elem_type, &too_big);
}

static gptoss_status missing(const char *key, gptoss_error *error) {
    return gptoss_set_error(error, GPTOSS_ERR_MODEL, "metadata key %s is missing", key);
}

static gptoss_status wrong_type(const char *key, const gptoss_gguf_kv *kv, const char *expected,
                                gptoss_error *error) {
    return gptoss_set_error(
        error, GPTOSS_ERR_MODEL, "metadata key %s has type %s%s%s, expected %s", key,
        gptoss_gguf_vtype_name(kv->type), kv->type == GPTOSS_GGUF_ARRAY ? " of " : "",
        kv->type == GPTOSS_GGUF_ARRAY ? gptoss_gguf_vtype_name(kv->elem_type) : "", expected);
}

gptoss_status gptoss_gguf_get_int(const gptoss_gguf_file *file, const char *key, bool required,
                                  int64_t lo, int64_t hi, int64_t *out, gptoss_error *error) {
    const gptoss_gguf_kv *kv = gptoss_gguf_find_kv(file, key);
    if (!kv) return required ? missing(key, error) : GPTOSS_OK;
    if (!is_int_type(kv->type)) return wrong_type(key, kv, "an integer", error);
    bool too_big;
    int64_t v = int_at(kv->data, kv->type, &too_big);
    if (too_big || v < lo || v > hi)
        return gptoss_set_error(
            error, GPTOSS_ERR_MODEL, "metadata key %s = %s%lld is outside [%lld, %lld]", key,
            too_big ? "(over 2^63) " : "", (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return GPTOSS_OK;
}

gptoss_status gptoss_gguf_get_float(const gptoss_gguf_file *file, const char *key, bool required,
                                    double *out, gptoss_error *error) {
    const gptoss_gguf_kv *kv = gptoss_gguf_find_kv(file, key);
    if (!kv) return required ? missing(key, error) : GPTOSS_OK;
    if (kv->type == GPTOSS_GGUF_F32) {
        uint32_t u = le32(kv->data);
        float f;
        memcpy(&f, &u, 4);
        *out = f;
    } else if (kv->type == GPTOSS_GGUF_F64) {
        uint64_t u = le64(kv->data);
        double d;
        memcpy(&d, &u, 8);
        *out = d;
    } else if (is_int_type(kv->type)) {
        bool too_big;
        *out = (double)int_at(kv->data, kv->type, &too_big);
    } else {
        return wrong_type(key, kv, "a number", error);
    }
    return GPTOSS_OK;
}

gptoss_status gptoss_gguf_get_bool(const gptoss_gguf_file *file, const char *key, bool required,
                                   bool *out, gptoss_error *error) {
    const gptoss_gguf_kv *kv = gptoss_gguf_find_kv(file, key);
    if (!kv) return required ? missing(key, error) : GPTOSS_OK;
    if (kv->type != GPTOSS_GGUF_BOOL) return wrong_type(key, kv, "bool", error);
    *out = kv->data[0] != 0;
    return GPTOSS_OK;
}

gptoss_status gptoss_gguf_get_string(const gptoss_gguf_file *file, const char *key, bool required,
                                     gptoss_gguf_str *out, gptoss_error *error) {
    const gptoss_gguf_kv *kv = gptoss_gguf_find_kv(file, key);
    if (!kv) return required ? missing(key, error) : GPTOSS_OK;
    if (kv->type != GPTOSS_GGUF_STRING) return wrong_type(key, kv, "string", error);
    *out = kv->str;
    return GPTOSS_OK;
}

gptoss_status gptoss_gguf_get_array(const gptoss_gguf_file *file, const char *key,
                                    uint32_t elem_type, const gptoss_gguf_kv **out,
                                    gptoss_error *error) {
    const gptoss_gguf_kv *kv = gptoss_gguf_find_kv(file, key);
    if (!kv) return missing(key, error);
    if (kv->type != GPTOSS_GGUF_ARRAY || kv->elem_type != elem_type) {
        char expected[32];
        snprintf(expected, sizeof expected, "array of %s", gptoss_gguf_vtype_name(elem_type));
        return wrong_type(key, kv, expected, error);
    }
    *out = kv;
    return GPTOSS_OK;
}
