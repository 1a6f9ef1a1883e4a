/*
 * gguf.h - memory-mapped, validated GGUF files (spec section 4.2) and the ggml tensor types
 * they hold.
 *
 * A file is mapped read-only once; metadata values and tensor data are views into the mapping.
 * Opening validates everything a later reader relies on: magic, version, counts bounded by
 * the file size, every metadata value (strings and arrays inside the file, known value types,
 * no nested arrays, no duplicate keys), general.alignment, every tensor info (known ggml type,
 * at most 4 dimensions, rows made of whole blocks, no size overflow, aligned offset, byte
 * range inside the data section, no overlap, no duplicate names). Knows nothing about models.
 */
#ifndef GPTOSS_FORMAT_GGUF_H
#define GPTOSS_FORMAT_GGUF_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPTOSS_GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GPTOSS_GGUF_VERSION 3u
#define GPTOSS_GGUF_DEFAULT_ALIGNMENT 32u
#define GPTOSS_GGUF_MAX_DIMS 4

/* Metadata value types. */
typedef enum gptoss_gguf_vtype {
    GPTOSS_GGUF_U8 = 0,
    GPTOSS_GGUF_I8 = 1,
    GPTOSS_GGUF_U16 = 2,
    GPTOSS_GGUF_I16 = 3,
    GPTOSS_GGUF_U32 = 4,
    GPTOSS_GGUF_I32 = 5,
    GPTOSS_GGUF_F32 = 6,
    GPTOSS_GGUF_BOOL = 7,
    GPTOSS_GGUF_STRING = 8,
    GPTOSS_GGUF_ARRAY = 9,
    GPTOSS_GGUF_U64 = 10,
    GPTOSS_GGUF_I64 = 11,
    GPTOSS_GGUF_F64 = 12,
    GPTOSS_GGUF_N_VTYPES
} gptoss_gguf_vtype;

/* The ggml tensor types this project reads or writes (the reader knows the sizes of all of
 * ggml's current types so that it can validate any file; see gptoss_ggml_type_info). */
enum {
    GPTOSS_GGML_F32 = 0,
    GPTOSS_GGML_F16 = 1,
    GPTOSS_GGML_Q8_0 = 8,
    GPTOSS_GGML_BF16 = 30,
    GPTOSS_GGML_MXFP4 = 39,
};

/* Block geometry of a ggml type: block_size elements take type_size bytes. False for a type
 * number ggml does not define (or no longer defines). */
bool gptoss_ggml_type_info(uint32_t type, uint32_t *block_size, uint32_t *type_size,
                           const char **name);
/* "MXFP4", or "type 77" in buf for unknown ones. */
const char *gptoss_ggml_type_name(uint32_t type, char *buf, size_t size);
const char *gptoss_gguf_vtype_name(uint32_t vtype);

typedef struct gptoss_gguf_str {
    const char *ptr; /* into the mapping, not NUL-terminated */
    uint64_t len;
} gptoss_gguf_str;

typedef struct gptoss_gguf_kv {
    gptoss_gguf_str key;
    uint32_t type;            /* gptoss_gguf_vtype */
    uint32_t elem_type;       /* for arrays: the element type */
    uint64_t count;           /* for arrays: number of elements; 1 otherwise */
    const uint8_t *data;      /* scalar bytes, string bytes, or the first array element */
    gptoss_gguf_str str;      /* for a string value */
    gptoss_gguf_str *strings; /* for an array of strings: [count], owned */
} gptoss_gguf_kv;

typedef struct gptoss_gguf_tensor {
    gptoss_gguf_str name;
    uint32_t n_dims;
    int64_t ne[GPTOSS_GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    uint32_t type;
    uint64_t offset;     /* from the start of the data section */
    uint64_t n_bytes;    /* from ne and the type's block geometry */
    const uint8_t *data; /* into the mapping (or buffer) */
} gptoss_gguf_tensor;

typedef struct gptoss_gguf_file {
    char *path; /* owned copy; NULL for a parsed buffer */
    uint8_t *map;
    size_t map_size;
    uint32_t version;
    uint32_t alignment;
    gptoss_gguf_kv *kvs; /* [n_kvs], file order */
    uint64_t n_kvs;
    gptoss_gguf_tensor *tensors; /* [n_tensors], file order */
    uint64_t n_tensors;
    uint64_t data_offset; /* file offset of the data section */
    const uint8_t *data;
    uint64_t data_size;
} gptoss_gguf_file;

/* Maps and validates one file; errors are prefixed with the path. *out is NULL on failure. */
gptoss_status gptoss_gguf_open(const char *path, gptoss_gguf_file **out, gptoss_error *error);
/* Validates a whole file held in memory (buf must outlive *out). For tests and fuzzing. */
gptoss_status gptoss_gguf_parse(const uint8_t *buf, size_t size, gptoss_gguf_file **out,
                                gptoss_error *error);
void gptoss_gguf_close(gptoss_gguf_file *file);

/* Whether the first bytes of the file at path are the GGUF magic (false if unreadable). */
bool gptoss_gguf_sniff(const char *path);

/* Lookups by name; NULL if absent. */
const gptoss_gguf_kv *gptoss_gguf_find_kv(const gptoss_gguf_file *file, const char *key);
const gptoss_gguf_tensor *gptoss_gguf_find_tensor(const gptoss_gguf_file *file, const char *name);

/* Typed metadata reads. A missing key gives GPTOSS_ERR_MODEL "metadata key K is missing"
 * when required, else leaves *out unchanged and returns OK. A key of the wrong type, or an
 * integer out of [lo, hi], is an error naming the key and both types. Integer reads accept any
 * integer type whose value fits; float reads accept f32, f64 and integers. */
gptoss_status gptoss_gguf_get_int(const gptoss_gguf_file *file, const char *key, bool required,
                                  int64_t lo, int64_t hi, int64_t *out, gptoss_error *error);
gptoss_status gptoss_gguf_get_float(const gptoss_gguf_file *file, const char *key, bool required,
                                    double *out, gptoss_error *error);
gptoss_status gptoss_gguf_get_bool(const gptoss_gguf_file *file, const char *key, bool required,
                                   bool *out, gptoss_error *error);
gptoss_status gptoss_gguf_get_string(const gptoss_gguf_file *file, const char *key, bool required,
                                     gptoss_gguf_str *out, gptoss_error *error);
/* An array of elem_type (required); *out is the kv. */
gptoss_status gptoss_gguf_get_array(const gptoss_gguf_file *file, const char *key,
                                    uint32_t elem_type, const gptoss_gguf_kv **out,
                                    gptoss_error *error);
/* Element i of an integer array as int64 (the caller checked the type and i < count). */
int64_t gptoss_gguf_array_int(const gptoss_gguf_kv *kv, uint64_t i);

/* An f32 read back as the shortest decimal that rounds to it (as a double): 1e-5 stored as f32
 * reads back as the double 1e-5, the value a JSON config gives. */
double gptoss_gguf_f32_decimal(float v);

/* Whether a string value equals a C string. */
bool gptoss_gguf_str_is(gptoss_gguf_str s, const char *text);

#endif
