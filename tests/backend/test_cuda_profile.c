/*
 * test_cuda_profile.c - the CUDA kernel profiles (src/backend/cuda/profile.c, plain C, so it is
 * compiled in here and tested without a GPU): the capabilities of a device from its compute
 * capability, each profile's limits (an A100's, an RTX 4090's, an H100's) applied to newer
 * devices, the refusal of a profile above the device, the names, and the tuning's
 * device_profile (GPTOSS_CUDA_DEVICE_PROFILE) overriding the backend option.
 */
#include "test_support.h"

#include "backend/cuda/profile.c"
#include "backend/cuda/tuning.c"

#include <stdlib.h>
#include <string.h>

#define KB 1024u

static gptoss_cuda_caps h100(void) {
    return gptoss_cuda_caps_of(9, 0, 227 * KB, 228 * KB, false);
}

static void test_device_capabilities(void **state) {
    (void)state;
    gptoss_cuda_caps a100 = gptoss_cuda_caps_of(8, 0, 163 * KB, 164 * KB, false);
    assert_int_equal(a100.sm, 80);
    assert_false(a100.pdl || a100.tma || a100.wgmma || a100.fp8);
    gptoss_cuda_caps rtx4090 = gptoss_cuda_caps_of(8, 9, 99 * KB, 100 * KB, false);
    assert_true(rtx4090.fp8);
    assert_false(rtx4090.pdl || rtx4090.tma || rtx4090.wgmma);
    gptoss_cuda_caps h = h100();
    assert_true(h.pdl && h.tma && h.wgmma && h.fp8);
    /* wgmma is compute capability 9.0 alone: Blackwell has TMA and PDL but no wgmma */
    gptoss_cuda_caps gb10 = gptoss_cuda_caps_of(12, 1, 99 * KB, 100 * KB, true);
    assert_int_equal(gb10.sm, 121);
    assert_true(gb10.pdl && gb10.tma && gb10.fp8 && gb10.integrated);
    assert_false(gb10.wgmma);
    assert_false(gptoss_cuda_caps_of(10, 0, 227 * KB, 228 * KB, false).wgmma);
}

static void test_profiles_on_h100(void **state) {
    (void)state;
    gptoss_cuda_caps dev = h100(), out;
    gptoss_error err = {0};

    assert_int_equal(gptoss_cuda_caps_limit(&dev, GPTOSS_CUDA_PROFILE_AUTO, "H100", &out, &err),
                     GPTOSS_OK);
    assert_memory_equal(&out, &dev, sizeof dev);

    assert_int_equal(gptoss_cuda_caps_limit(&dev, GPTOSS_CUDA_PROFILE_AMPERE, "H100", &out, &err),
                     GPTOSS_OK);
    assert_int_equal(out.sm, 80);
    assert_int_equal(out.smem_per_block, 163 * KB);
    assert_int_equal(out.smem_per_sm, 164 * KB);
    assert_false(out.pdl || out.tma || out.wgmma || out.fp8);

    assert_int_equal(gptoss_cuda_caps_limit(&dev, GPTOSS_CUDA_PROFILE_ADA, "H100", &out, &err),
                     GPTOSS_OK);
    assert_int_equal(out.sm, 89);
    assert_int_equal(out.smem_per_block, 99 * KB);
    assert_int_equal(out.smem_per_sm, 100 * KB);
    assert_true(out.fp8);
    assert_false(out.pdl || out.tma || out.wgmma);

    assert_int_equal(gptoss_cuda_caps_limit(&dev, GPTOSS_CUDA_PROFILE_HOPPER, "H100", &out, &err),
                     GPTOSS_OK);
    assert_true(out.pdl && out.tma && out.wgmma && out.fp8);
    assert_int_equal(out.sm, 90);
}

static void expect_refused(gptoss_cuda_caps dev, gptoss_cuda_profile p, const char *name,
                           const char *lack) {
    gptoss_cuda_caps out;
    gptoss_error err = {0};
    assert_int_equal(gptoss_cuda_caps_limit(&dev, p, name, &out, &err), GPTOSS_ERR_UNSUPPORTED);
    if (!strstr(err.message, gptoss_cuda_profile_name(p)) || !strstr(err.message, name) ||
        !strstr(err.message, lack) || !strstr(err.message, "--cuda-profile"))
        fail_msg("message: %s", err.message);
}

static void test_profile_above_device_refused(void **state) {
    (void)state;
    gptoss_cuda_caps a100 = gptoss_cuda_caps_of(8, 0, 163 * KB, 164 * KB, false);
    expect_refused(a100, GPTOSS_CUDA_PROFILE_ADA, "A100", "older compute capability");
    expect_refused(a100, GPTOSS_CUDA_PROFILE_HOPPER, "A100", "older compute capability");
    gptoss_cuda_caps rtx4090 = gptoss_cuda_caps_of(8, 9, 99 * KB, 100 * KB, false);
    expect_refused(rtx4090, GPTOSS_CUDA_PROFILE_HOPPER, "RTX 4090", "older compute capability");
    /* a newer GPU without wgmma cannot run the hopper profile's kernels */
    gptoss_cuda_caps gb10 = gptoss_cuda_caps_of(12, 1, 99 * KB, 100 * KB, true);
    expect_refused(gb10, GPTOSS_CUDA_PROFILE_HOPPER, "GB10", "no wgmma");
    /* ... but takes the lower ones, keeping its smaller shared memory */
    gptoss_cuda_caps out;
    gptoss_error err = {0};
    assert_int_equal(gptoss_cuda_caps_limit(&gb10, GPTOSS_CUDA_PROFILE_AMPERE, "GB10", &out, &err),
                     GPTOSS_OK);
    assert_int_equal(out.smem_per_block, 99 * KB);
    assert_false(out.tma || out.pdl || out.fp8);
    assert_true(out.integrated); /* the memory stays what it is */
    /* an RTX 3090 (sm_86, 99 KB) under ampere: allowed, with its own shared memory */
    gptoss_cuda_caps rtx3090 = gptoss_cuda_caps_of(8, 6, 99 * KB, 100 * KB, false);
    assert_int_equal(
        gptoss_cuda_caps_limit(&rtx3090, GPTOSS_CUDA_PROFILE_AMPERE, "RTX 3090", &out, &err),
        GPTOSS_OK);
    assert_int_equal(out.sm, 80);
    assert_int_equal(out.smem_per_block, 99 * KB);
}

static void test_names(void **state) {
    (void)state;
    const char *names[] = {"auto", "ampere", "ada", "hopper"};
    for (int i = 0; i < 4; i++) {
        gptoss_cuda_profile p = GPTOSS_CUDA_PROFILE_HOPPER;
        assert_true(gptoss_cuda_profile_parse(names[i], &p));
        assert_int_equal(p, i);
        assert_string_equal(gptoss_cuda_profile_name(p), names[i]);
    }
    gptoss_cuda_profile p = GPTOSS_CUDA_PROFILE_ADA;
    assert_false(gptoss_cuda_profile_parse("Ampere", &p));
    assert_false(gptoss_cuda_profile_parse("", &p));
    assert_false(gptoss_cuda_profile_parse(NULL, &p));
    assert_int_equal(p, GPTOSS_CUDA_PROFILE_ADA); /* untouched on failure */
    assert_string_equal(gptoss_cuda_profile_name((gptoss_cuda_profile)7), "?");
}

static void test_tuning_overrides_option(void **state) {
    (void)state;
    gptoss_error err = {0};
    gptoss_cuda_tuning t;
    unsetenv("GPTOSS_CUDA_DEVICE_PROFILE");
    assert_int_equal(gptoss_cuda_tuning_init(&t, NULL, &err), GPTOSS_OK);
    gptoss_cuda_profile p = GPTOSS_CUDA_PROFILE_AUTO;
    /* not given in the tuning: the option decides */
    assert_int_equal(
        gptoss_cuda_profile_resolve(GPTOSS_CUDA_PROFILE_ADA, t.device_profile, &p, &err),
        GPTOSS_OK);
    assert_int_equal(p, GPTOSS_CUDA_PROFILE_ADA);
    /* the variable wins over the option, auto included */
    setenv("GPTOSS_CUDA_DEVICE_PROFILE", "ampere", 1);
    assert_int_equal(gptoss_cuda_tuning_init(&t, "device_profile=hopper", &err), GPTOSS_OK);
    assert_int_equal(
        gptoss_cuda_profile_resolve(GPTOSS_CUDA_PROFILE_ADA, t.device_profile, &p, &err),
        GPTOSS_OK);
    assert_int_equal(p, GPTOSS_CUDA_PROFILE_AMPERE);
    setenv("GPTOSS_CUDA_DEVICE_PROFILE", "auto", 1);
    assert_int_equal(gptoss_cuda_tuning_init(&t, NULL, &err), GPTOSS_OK);
    assert_int_equal(
        gptoss_cuda_profile_resolve(GPTOSS_CUDA_PROFILE_ADA, t.device_profile, &p, &err),
        GPTOSS_OK);
    assert_int_equal(p, GPTOSS_CUDA_PROFILE_AUTO);
    /* a bad value names the variable and the choices */
    setenv("GPTOSS_CUDA_DEVICE_PROFILE", "volta", 1);
    assert_int_equal(gptoss_cuda_tuning_init(&t, NULL, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    if (!strstr(err.message, "GPTOSS_CUDA_DEVICE_PROFILE=volta") || !strstr(err.message, "ampere"))
        fail_msg("message: %s", err.message);
    unsetenv("GPTOSS_CUDA_DEVICE_PROFILE");
    /* an option outside the enum is refused */
    assert_int_equal(gptoss_cuda_profile_resolve((gptoss_cuda_profile)9, -1, &p, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
}

static void test_describe(void **state) {
    (void)state;
    gptoss_cuda_caps dev = h100(), out;
    gptoss_error err = {0};
    assert_int_equal(gptoss_cuda_caps_limit(&dev, GPTOSS_CUDA_PROFILE_ADA, "H100", &out, &err),
                     GPTOSS_OK);
    char buf[160];
    gptoss_cuda_caps_describe(&out, buf, sizeof buf);
    assert_string_equal(buf, "sm_89, 99 KB smem/block, no PDL, no TMA, no wgmma, FP8");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_capabilities),
        cmocka_unit_test(test_profiles_on_h100),
        cmocka_unit_test(test_profile_above_device_refused),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_tuning_overrides_option),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
