/*
 * test_sha256.c - SHA-256 against the FIPS 180-4 example vectors.
 */
#include "test_support.h"

#include "util/sha256.h"

#include <string.h>

static void check(const char *message, size_t repeat, const char *want) {
    gptoss_sha256 h;
    gptoss_sha256_init(&h);
    for (size_t i = 0; i < repeat; i++) gptoss_sha256_update(&h, message, strlen(message));
    uint8_t digest[32];
    char hex[65];
    gptoss_sha256_final(&h, digest);
    gptoss_sha256_hex(digest, hex);
    assert_string_equal(hex, want);
}

static void test_vectors(void **state) {
    (void)state;
    check("abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check("", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    check("a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_vectors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
