/*
 * test_gguf.c - the GGUF reader against the format rules (spec 4.2): a small file built byte by
 * byte here (not with our writer) with every metadata value type, two tensors and a non-default
 * alignment reads back exactly; then each way a file can be wrong (table of mutations of that
 * file: truncation, magic, version, counts, lengths, types, offsets, overlap, duplicates) gives
 * its own message, every truncation and every single-byte corruption fails cleanly, and typed
 * metadata reads refuse the wrong type.
 */
#include "test_support.h"

#include "format/gguf.h"

#include <stdlib.h>
#include <string.h>

/* ---- a byte builder, independent of src/format/gguf_writer.c ------------------------------ */

typedef struct bytes {
    uint8_t b[4096];
    size_t n;
} bytes;

static void u8(bytes *o, uint8_t v) {
    o->b[o->n++] = v;
}
static void u32(bytes *o, uint32_t v) {
    for (int i = 0; i < 4; i++)
        u8(o, (uint8_t)(v >> (8 * i)));
}
static void u64(bytes *o, uint64_t v) {
    for (int i = 0; i < 8; i++)
        u8(o, (uint8_t)(v >> (8 * i)));
}
static void str(bytes *o, const char *s) {
    u64(o, strlen(s));
    memcpy(o->b + o->n, s, strlen(s));
    o->n += strlen(s);
}
static void key(bytes *o, const char *k, uint32_t type) {
    str(o, k);
    u32(o, type);
}

/* Where the fields the mutations patch are. */
typedef struct layout {
    size_t version, n_tensors, n_kv;
    size_t u8_type;     /* value type of "a.u8" */
    size_t i8_key;      /* key bytes of "a.i8" */
    size_t bool_value;  /* value of "a.bool" */
    size_t strs_count;  /* element count of "a.strs" */
    size_t strs_len0;   /* length of its first string */
    size_t ints_elem;   /* element type of "a.ints" */
    size_t ints_count;  /* element count of "a.ints" */
    size_t align_type;  /* value type of general.alignment */
    size_t align_value; /* its value */
    size_t t0_ndims, t0_type, t0_offset;
    size_t t1_name, t1_ne0, t1_offset;
    size_t data; /* start of the data section */
} layout;

static bytes valid_file(layout *L) {
    bytes o = {.n = 0};
    u32(&o, 0x46554747);
    L->version = o.n;
    u32(&o, 3);
    L->n_tensors = o.n;
    u64(&o, 2);
    L->n_kv = o.n;
    u64(&o, 15);
    key(&o, "general.architecture", 8);
    str(&o, "gpt-oss");
    key(&o, "a.u8", 0);
    L->u8_type = o.n - 4;
    u8(&o, 200);
    L->i8_key = o.n + 8;
    key(&o, "a.i8", 1);
    u8(&o, (uint8_t)-3);
    key(&o, "a.u16", 2);
    u8(&o, 0x34), u8(&o, 0x12);
    key(&o, "a.i16", 3);
    u8(&o, 0xfe), u8(&o, 0xff);
    key(&o, "a.u32", 4);
    u32(&o, 4000000000u);
    key(&o, "a.i32", 5);
    u32(&o, (uint32_t)-70000);
    key(&o, "a.f32", 6);
    u32(&o, 0x3fc00000); /* 1.5 */
    key(&o, "a.bool", 7);
    L->bool_value = o.n;
    u8(&o, 1);
    key(&o, "a.u64", 10);
    u64(&o, 0x8000000000000001ull);
    key(&o, "a.i64", 11);
    u64(&o, (uint64_t)-5);
    key(&o, "a.f64", 12);
    u64(&o, 0x4002000000000000ull); /* 2.25 */
    key(&o, "a.strs", 9);
    u32(&o, 8);
    L->strs_count = o.n;
    u64(&o, 3);
    L->strs_len0 = o.n;
    str(&o, "x");
    str(&o, "yz");
    str(&o, "");
    key(&o, "a.ints", 9);
    L->ints_elem = o.n;
    u32(&o, 5);
    L->ints_count = o.n;
    u64(&o, 3);
    u32(&o, 1), u32(&o, (uint32_t)-2), u32(&o, 3);
    key(&o, "general.alignment", 4);
    L->align_type = o.n - 4;
    L->align_value = o.n;
    u32(&o, 64);
    /* t0: F32 [4, 2] at 0 (32 bytes); t1: MXFP4 [32] at 64 (17 bytes). */
    str(&o, "t0");
    L->t0_ndims = o.n;
    u32(&o, 2);
    u64(&o, 4), u64(&o, 2);
    L->t0_type = o.n;
    u32(&o, 0);
    L->t0_offset = o.n;
    u64(&o, 0);
    L->t1_name = o.n + 8;
    str(&o, "t1");
    u32(&o, 1);
    L->t1_ne0 = o.n;
    u64(&o, 32);
    u32(&o, 39);
    L->t1_offset = o.n;
    u64(&o, 64);
    while (o.n % 64)
        u8(&o, 0);
    L->data = o.n;
    for (int i = 0; i < 8; i++)
        u32(&o, 0x3f800000u + (uint32_t)i); /* t0 values */
    while (o.n % 64)
        u8(&o, 0);
    u8(&o, 127);
    for (int i = 0; i < 16; i++)
        u8(&o, (uint8_t)(i * 17));
    return o;
}

static void put32(bytes *o, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++)
        o->b[at + i] = (uint8_t)(v >> (8 * i));
}
static void put64(bytes *o, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++)
        o->b[at + i] = (uint8_t)(v >> (8 * i));
}

static gptoss_status parse(const bytes *o, size_t size, gptoss_gguf_file **f, gptoss_error *err) {
    /* A private copy of exactly `size` bytes, so ASan sees any read past the end. */
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, o->b, size);
    gptoss_status st = gptoss_gguf_parse(copy, size, f, err);
    if (st == GPTOSS_OK) {
        /* Touch every view while the buffer lives, then drop the file. */
        for (uint64_t i = 0; i < (*f)->n_tensors; i++)
            for (uint64_t b = 0; b < (*f)->tensors[i].n_bytes; b++)
                (void)*(volatile const uint8_t *)&(*f)->tensors[i].data[b];
        gptoss_gguf_close(*f);
        *f = NULL;
    }
    free(copy);
    return st;
}

/* ---- the valid file ----------------------------------------------------------------------- */

static void test_valid_file(void **state) {
    (void)state;
    layout L;
    bytes o = valid_file(&L);
    gptoss_gguf_file *f = NULL;
    gptoss_error err = {0};
    if (gptoss_gguf_parse(o.b, o.n, &f, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_kvs, 15);
    assert_int_equal(f->n_tensors, 2);
    assert_int_equal(f->alignment, 64);
    assert_int_equal(f->data_offset, L.data);
    int64_t i = 0;
    double d = 0;
    bool b = false;
    gptoss_gguf_str s = {0};
    assert_int_equal(gptoss_gguf_get_string(f, "general.architecture", true, &s, &err), GPTOSS_OK);
    assert_true(gptoss_gguf_str_is(s, "gpt-oss"));
    const struct {
        const char *key;
        int64_t value;
    } ints[] = {{"a.u8", 200},           {"a.i8", -3},      {"a.u16", 0x1234}, {"a.i16", -2},
                {"a.u32", 4000000000ll}, {"a.i32", -70000}, {"a.i64", -5}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        assert_int_equal(gptoss_gguf_get_int(f, ints[k].key, true, INT64_MIN, INT64_MAX, &i, &err),
                         GPTOSS_OK);
        assert_int_equal(i, ints[k].value);
    }
    assert_int_equal(gptoss_gguf_get_float(f, "a.f32", true, &d, &err), GPTOSS_OK);
    assert_true(d == 1.5);
    assert_int_equal(gptoss_gguf_get_float(f, "a.f64", true, &d, &err), GPTOSS_OK);
    assert_true(d == 2.25);
    assert_int_equal(gptoss_gguf_get_bool(f, "a.bool", true, &b, &err), GPTOSS_OK);
    assert_true(b);
    const gptoss_gguf_kv *kv = NULL;
    assert_int_equal(gptoss_gguf_get_array(f, "a.strs", GPTOSS_GGUF_STRING, &kv, &err), GPTOSS_OK);
    assert_int_equal(kv->count, 3);
    assert_true(gptoss_gguf_str_is(kv->strings[0], "x"));
    assert_true(gptoss_gguf_str_is(kv->strings[1], "yz"));
    assert_true(gptoss_gguf_str_is(kv->strings[2], ""));
    assert_int_equal(gptoss_gguf_get_array(f, "a.ints", GPTOSS_GGUF_I32, &kv, &err), GPTOSS_OK);
    assert_int_equal(gptoss_gguf_array_int(kv, 1), -2);
    /* Optional keys leave the output alone. */
    i = 42;
    assert_int_equal(gptoss_gguf_get_int(f, "no.such", false, 0, 100, &i, &err), GPTOSS_OK);
    assert_int_equal(i, 42);

    const gptoss_gguf_tensor *t0 = gptoss_gguf_find_tensor(f, "t0");
    const gptoss_gguf_tensor *t1 = gptoss_gguf_find_tensor(f, "t1");
    assert_non_null(t0);
    assert_non_null(t1);
    assert_int_equal(t0->n_dims, 2);
    assert_int_equal(t0->ne[0], 4);
    assert_int_equal(t0->ne[1], 2);
    assert_int_equal(t0->n_bytes, 32);
    assert_ptr_equal(t0->data, o.b + L.data);
    assert_int_equal(t1->type, GPTOSS_GGML_MXFP4);
    assert_int_equal(t1->n_bytes, 17);
    assert_ptr_equal(t1->data, o.b + L.data + 64);
    assert_int_equal(t1->data[0], 127);
    gptoss_gguf_close(f);
}

/* ---- mutations ---------------------------------------------------------------------------- */

typedef struct mutation {
    const char *what;
    void (*apply)(bytes *o, const layout *L, size_t *size);
    const char *fragment; /* expected in the error message */
} mutation;

#define MUT(name, body)                                                                            \
    static void name(bytes *o, const layout *L, size_t *size) {                                    \
        (void)o, (void)L, (void)size;                                                              \
        body;                                                                                      \
    }
MUT(bad_magic, memcpy(o->b, "GGUX", 4))
MUT(ggml_magic, memcpy(o->b, "lmgg", 4))
MUT(version_1, put32(o, L->version, 1))
MUT(version_99, put32(o, L->version, 99))
MUT(version_big_endian, put32(o, L->version, 0x03000000))
MUT(absurd_tensor_count, put64(o, L->n_tensors, 1ull << 40))
MUT(absurd_kv_count, put64(o, L->n_kv, UINT64_MAX))
MUT(absurd_string_length, put64(o, L->strs_len0, 1ull << 50))
MUT(absurd_key_length, put64(o, L->i8_key - 8, UINT64_MAX - 3))
MUT(absurd_string_count, put64(o, L->strs_count, 1ull << 60))
MUT(absurd_array_count, put64(o, L->ints_count, 1ull << 61))
MUT(unknown_value_type, put32(o, L->u8_type, 13))
MUT(unknown_elem_type, put32(o, L->ints_elem, 77))
MUT(nested_array, put32(o, L->ints_elem, 9))
MUT(bad_bool, o->b[L->bool_value] = 2)
MUT(duplicate_key, memcpy(o->b + L->i8_key, "a.u8", 4))
MUT(duplicate_tensor, memcpy(o->b + L->t1_name, "t0", 2))
MUT(unknown_ggml_type, put32(o, L->t0_type, 4))
MUT(huge_ggml_type, put32(o, L->t0_type, 0xffffffffu))
MUT(too_many_dims, put32(o, L->t0_ndims, 5))
MUT(zero_dims, put32(o, L->t0_ndims, 0))
MUT(partial_block, put64(o, L->t1_ne0, 31))
MUT(misaligned_offset, put64(o, L->t1_offset, 65))
MUT(overlap, put64(o, L->t1_offset, 0))
MUT(offset_past_end, put64(o, L->t1_offset, 128))
MUT(offset_huge, put64(o, L->t1_offset, UINT64_MAX - 63))
MUT(huge_shape, put64(o, L->t1_ne0, 1ull << 62))
MUT(alignment_not_pow2, put32(o, L->align_value, 48))
MUT(alignment_zero, put32(o, L->align_value, 0))
MUT(alignment_wrong_type, put32(o, L->align_type, 5))
MUT(truncated_in_data, *size -= 1)
MUT(truncated_in_tensor_infos, *size = L->t1_offset + 3)
MUT(truncated_in_strings, *size = L->strs_len0 + 10)
MUT(truncated_in_header, *size = 20)
MUT(truncated_before_data, *size = L->data - 1)
MUT(truncated_magic, *size = 2)
#undef MUT

static const mutation mutations[] = {
    {"wrong magic", bad_magic, "not a GGUF file"},
    {"old ggml magic", ggml_magic, "not a GGUF file"},
    {"version 1", version_1, "GGUF version 1 is not supported"},
    {"version 99", version_99, "GGUF version 99 is not supported"},
    {"big-endian", version_big_endian, "big-endian"},
    {"absurd tensor count", absurd_tensor_count, "tensor count 1099511627776 is absurd"},
    {"absurd metadata count", absurd_kv_count, "metadata count 18446744073709551615 is absurd"},
    {"absurd string length", absurd_string_length, "string length 1125899906842624 runs past"},
    {"absurd key length", absurd_key_length, "runs past the end"},
    {"absurd string count", absurd_string_count, "strings cannot fit"},
    {"absurd array count", absurd_array_count, "array of 2305843009213693952 i32 runs past"},
    {"unknown value type", unknown_value_type, "metadata a.u8: unknown value type 13"},
    {"unknown element type", unknown_elem_type, "unknown array element type 77"},
    {"nested array", nested_array, "arrays of arrays"},
    {"bad bool", bad_bool, "not a bool"},
    {"duplicate key", duplicate_key, "metadata key a.u8 appears twice"},
    {"duplicate tensor", duplicate_tensor, "tensor t0 appears twice"},
    {"unknown ggml type", unknown_ggml_type, "tensor t0: unknown ggml type 4"},
    {"huge ggml type", huge_ggml_type, "unknown ggml type 4294967295"},
    {"5 dimensions", too_many_dims, "5 dimensions"},
    {"0 dimensions", zero_dims, "0 dimensions"},
    {"partial block", partial_block, "ne[0] = 31 is not a multiple of the 32-element blocks"},
    {"misaligned offset", misaligned_offset, "offset 65 is not a multiple of the alignment 64"},
    {"overlapping tensors", overlap, "overlap"},
    {"offset past the end", offset_past_end, "run past the end of the 81-byte data section"},
    {"offset near 2^64", offset_huge, "run past the end"},
    {"huge shape", huge_shape, "run past the end"},
    {"alignment 48", alignment_not_pow2, "general.alignment = 48 is not a power of two"},
    {"alignment 0", alignment_zero, "general.alignment = 0"},
    {"alignment i32", alignment_wrong_type, "general.alignment has type i32, expected u32"},
    {"truncated in the data", truncated_in_data, "(file truncated?)"},
    {"truncated in the tensor infos", truncated_in_tensor_infos, "truncated"},
    {"truncated in a string array", truncated_in_strings, "truncated"},
    {"truncated in the header", truncated_in_header, "truncated"},
    {"truncated before the data", truncated_before_data, "truncated"},
    {"truncated in the magic", truncated_magic, "file truncated: the magic"},
};

static void test_mutations(void **state) {
    (void)state;
    for (size_t m = 0; m < sizeof mutations / sizeof mutations[0]; m++) {
        layout L;
        bytes o = valid_file(&L);
        size_t size = o.n;
        mutations[m].apply(&o, &L, &size);
        gptoss_gguf_file *f = NULL;
        gptoss_error err = {0};
        if (parse(&o, size, &f, &err) == GPTOSS_OK) fail_msg("%s: accepted", mutations[m].what);
        if (!strstr(err.message, mutations[m].fragment))
            fail_msg("%s: message '%s' lacks '%s'", mutations[m].what, err.message,
                     mutations[m].fragment);
    }
}

/* Every truncation fails with a message that says so; no prefix is accepted. */
static void test_every_truncation(void **state) {
    (void)state;
    layout L;
    bytes o = valid_file(&L);
    for (size_t size = 0; size < o.n; size++) {
        gptoss_gguf_file *f = NULL;
        gptoss_error err = {0};
        if (parse(&o, size, &f, &err) == GPTOSS_OK) fail_msg("accepted at %zu bytes", size);
        if (!strstr(err.message, "truncated"))
            fail_msg("at %zu bytes: '%s' does not say truncated", size, err.message);
    }
}

/* Corrupting any single byte of the header never crashes (ASan checks the reads). */
static void test_every_byte_corrupted(void **state) {
    (void)state;
    layout L;
    bytes clean = valid_file(&L);
    const uint8_t values[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    size_t accepted = 0, refused = 0;
    for (size_t at = 0; at < L.data; at++)
        for (size_t v = 0; v < sizeof values; v++) {
            bytes o = clean;
            if (o.b[at] == values[v]) continue;
            o.b[at] = values[v];
            gptoss_gguf_file *f = NULL;
            gptoss_error err = {0};
            if (parse(&o, o.n, &f, &err) == GPTOSS_OK)
                accepted++;
            else {
                assert_true(err.message[0] != '\0');
                refused++;
            }
        }
    assert_true(refused > accepted); /* most header bytes matter */
}

static void test_wrong_metadata_types(void **state) {
    (void)state;
    layout L;
    bytes o = valid_file(&L);
    gptoss_gguf_file *f = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_gguf_parse(o.b, o.n, &f, &err), GPTOSS_OK);
    int64_t i;
    double d;
    bool b;
    gptoss_gguf_str s;
    const gptoss_gguf_kv *kv;
#define CHECK(call, fragment)                                                                      \
    do {                                                                                           \
        gptoss_error e = {0};                                                                      \
        if ((call) == GPTOSS_OK) fail_msg("accepted: %s", #call);                                  \
        if (!strstr(e.message, fragment)) fail_msg("'%s' lacks '%s'", e.message, fragment);        \
    } while (0)
    CHECK(gptoss_gguf_get_int(f, "general.architecture", true, 0, 10, &i, &e),
          "general.architecture has type string, expected an integer");
    CHECK(gptoss_gguf_get_int(f, "a.u64", true, 0, INT64_MAX, &i, &e), "outside");
    CHECK(gptoss_gguf_get_int(f, "a.u32", true, 0, INT32_MAX, &i, &e),
          "a.u32 = 4000000000 is outside [0, 2147483647]");
    CHECK(gptoss_gguf_get_int(f, "a.f32", true, 0, 10, &i, &e), "has type f32");
    CHECK(gptoss_gguf_get_float(f, "a.strs", true, &d, &e),
          "a.strs has type array of string, expected a number");
    CHECK(gptoss_gguf_get_bool(f, "a.u8", true, &b, &e), "a.u8 has type u8, expected bool");
    CHECK(gptoss_gguf_get_string(f, "a.u32", true, &s, &e), "has type u32, expected string");
    CHECK(gptoss_gguf_get_array(f, "a.ints", GPTOSS_GGUF_STRING, &kv, &e),
          "a.ints has type array of i32, expected array of string");
    CHECK(gptoss_gguf_get_array(f, "a.f64", GPTOSS_GGUF_I32, &kv, &e), "has type f64");
    CHECK(gptoss_gguf_get_int(f, "gpt-oss.block_count", true, 0, 10, &i, &e),
          "metadata key gpt-oss.block_count is missing");
#undef CHECK
    gptoss_gguf_close(f);
}

static void test_open_from_disk(void **state) {
    (void)state;
    layout L;
    bytes o = valid_file(&L);
    char *dir = ts_mkdtemp();
    char *path = ts_path(dir, "m.gguf");
    ts_write_file(path, o.b, o.n);
    gptoss_gguf_file *f = NULL;
    gptoss_error err = {0};
    if (gptoss_gguf_open(path, &f, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    assert_true(gptoss_gguf_sniff(path));
    assert_int_equal(gptoss_gguf_find_tensor(f, "t1")->data[0], 127);
    gptoss_gguf_close(f);
    /* Errors from a file name it. */
    ts_write_file(path, o.b, L.data - 1);
    assert_int_not_equal(gptoss_gguf_open(path, &f, &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, path));
    assert_non_null(strstr(err.message, "truncated"));
    assert_int_equal(gptoss_gguf_open(dir, &f, &err), GPTOSS_ERR_IO);
    assert_false(gptoss_gguf_sniff(dir));
    ts_rmtree(dir);
    free(path);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),           cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_every_truncation),     cmocka_unit_test(test_every_byte_corrupted),
        cmocka_unit_test(test_wrong_metadata_types), cmocka_unit_test(test_open_from_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
