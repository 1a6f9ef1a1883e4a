/*
 * test_sha256.c - SHA-256 against the FIPS 180-4 example vectors and against coreutils'
 * sha256sum on messages around the padding boundaries.
 */
#include "test_support.h"

#include "util/sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const uint8_t d[32], char out[65]) {
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_fips_vectors(void **state) {
    (void)state;
    uint8_t d[32];
    char h[65];
    gptoss_sha256_digest("", 0, d);
    hex(d, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    gptoss_sha256_digest("abc", 3, d);
    hex(d, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    gptoss_sha256_digest(two, strlen(two), d);
    hex(d, h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a', fed in uneven pieces through the incremental interface. */
    gptoss_sha256 ctx;
    gptoss_sha256_init(&ctx);
    char chunk[997];
    memset(chunk, 'a', sizeof chunk);
    size_t left = 1000000;
    while (left > 0) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        gptoss_sha256_update(&ctx, chunk, n);
        left -= n;
    }
    gptoss_sha256_final(&ctx, d);
    hex(d, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_against_sha256sum(void **state) {
    (void)state;
    char *dir = ts_mkdtemp();
    const size_t lengths[] = {1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000};
    uint8_t data[1000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 131 + 7);
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        char *path = ts_path(dir, "msg.bin");
        ts_write_file(path, data, lengths[k]);
        char *out = NULL;
        assert_int_equal(ts_run(&out, "sha256sum '%s'", path), 0);
        uint8_t d[32];
        char h[65];
        gptoss_sha256_digest(data, lengths[k], d);
        hex(d, h);
        if (strncmp(out, h, 64) != 0)
            fail_msg("length %zu: sha256sum says %.64s, we say %s", lengths[k], out, h);
        free(out);
        free(path);
    }
    ts_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fips_vectors),
        cmocka_unit_test(test_against_sha256sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
