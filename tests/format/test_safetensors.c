/*
 * test_safetensors.c - header validation against the safetensors format rules (spec 4.1):
 * what a valid header may contain (padding, metadata, 0-rank and empty tensors) and each way a
 * header can be wrong, with the message naming the problem.
 */
#include "test_support.h"

#include "format/safetensors.h"

#include <string.h>

static gptoss_status parse(const char *json, uint64_t data_size, gptoss_error *err, size_t *n_out) {
    gptoss_st_tensor *tensors = NULL;
    size_t n = 0;
    gptoss_status st = gptoss_st_parse_header(json, strlen(json), data_size, &tensors, &n, err);
    if (n_out) *n_out = n;
    gptoss_st_free_tensors(tensors, n);
    return st;
}

static void expect_error(const char *json, uint64_t data_size, const char *fragment) {
    gptoss_error err = {0};
    gptoss_status st = parse(json, data_size, &err, NULL);
    if (st == GPTOSS_OK) fail_msg("accepted: %s", json);
    if (!strstr(err.message, fragment))
        fail_msg("message '%s' lacks '%s' for %s", err.message, fragment, json);
}

static void test_valid_headers(void **state) {
    (void)state;
    gptoss_error err = {0};
    size_t n = 0;
    /* Padding with spaces, metadata, a 0-rank scalar, an empty tensor anywhere. */
    assert_int_equal(
        parse("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
              "\"data_offsets\":[0,12]},\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,"
              "16]},"
              "\"e\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[16,16]}}        ",
              16, &err, &n),
        GPTOSS_OK);
    assert_int_equal(n, 3);
    /* Tensors in any order; gaps between them are allowed. */
    assert_int_equal(parse("{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                           12, &err, &n),
                     GPTOSS_OK);
}

static void test_invalid_headers(void **state) {
    (void)state;
    expect_error("[1,2]", 0, "does not start with '{'");
    expect_error("{\"a\":", 0, "not valid JSON");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                 2, "not valid JSON"); /* duplicate names */
    expect_error("{\"a\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                 "unknown dtype \"X9\"");
    expect_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "\"dtype\"");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1,
                 "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
                 "[begin, end]");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1,
                 "end 0 < begin 1");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3,
                 "run past the end");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,4]}}", 8,
                 "needs 8 bytes but data_offsets span 4");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                 8, "overlap");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_"
                 "offsets\":[0,4]}}",
                 8, "absurdly large");
    expect_error("{\"__metadata__\":[1]}", 0, "__metadata__");
    expect_error("{\"a\":[]}", 0, "not a JSON object");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_headers),
        cmocka_unit_test(test_invalid_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
