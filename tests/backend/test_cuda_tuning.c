/*
 * test_cuda_tuning.c - the CUDA backend's tuning knobs (src/backend/cuda/tuning.c, plain C, so
 * it is compiled in here and tested without a GPU): the defaults the table in tuning.h
 * documents, the "key=value,..." string of gptoss_backend_options.cuda_tuning, the
 * GPTOSS_CUDA_* variables overriding it, and the errors for unknown keys and bad values.
 */
#include "test_support.h"

#include "backend/cuda/tuning.c"

#include <stdlib.h>
#include <string.h>

/* Every variable of the table, so that the runner's environment cannot leak into a case. */
static const char *const all_env[] = {
    "GPTOSS_CUDA_GRAPHS",           "GPTOSS_CUDA_PDL",           "GPTOSS_CUDA_GEMV",
    "GPTOSS_CUDA_GEMV_KERNEL",      "GPTOSS_CUDA_ATTN_TC",       "GPTOSS_CUDA_ATTN_DECODE",
    "GPTOSS_CUDA_ADC_WARPS",        "GPTOSS_CUDA_NORM_ROUTER",   "GPTOSS_CUDA_QKV_ROPE",
    "GPTOSS_CUDA_ROUTER_FUSED_MAX", "GPTOSS_CUDA_MOE_PATH",      "GPTOSS_CUDA_MOE_PAIR_KERNEL",
    "GPTOSS_CUDA_MOE_PAIR_TOKENS",  "GPTOSS_CUDA_MOE_INFLIGHT",  "GPTOSS_CUDA_MOE_WG_MIN",
    "GPTOSS_CUDA_MOE_MAX_TILE",     "GPTOSS_CUDA_MOE_TILE_PCT",  "GPTOSS_CUDA_PROFILE",
    "GPTOSS_STEP_TIMING",           "GPTOSS_CUDA_ABLATE",        "GPTOSS_CUDA_DEVICE_PROFILE",
    "GPTOSS_CUDA_HOST_WEIGHTS",     "GPTOSS_CUDA_BI_DENSE_MAX",  "GPTOSS_CUDA_BI_MOE_MAX",
    "GPTOSS_CUDA_BI_MOE_WIDE",      "GPTOSS_CUDA_BI_DENSE_WIDE", "GPTOSS_CUDA_BI_MOE_PAIRS"};

static int clear_env(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof all_env / sizeof all_env[0]; i++)
        unsetenv(all_env[i]);
    return 0;
}

static void test_defaults(void **state) {
    (void)state;
    gptoss_cuda_tuning t;
    gptoss_error err = {0};
    assert_int_equal(gptoss_cuda_tuning_init(&t, NULL, &err), GPTOSS_OK);
    assert_true(t.graphs && t.pdl && t.attn_tc && t.attn_decode && t.norm_router && t.qkv_rope);
    assert_int_equal(t.gemv, GPTOSS_CUDA_GEMV_ON);
    assert_int_equal(t.gemv_kernel, GPTOSS_CUDA_GEMV_KERNEL_AUTO);
    assert_int_equal(t.adc_warps, 0);
    assert_int_equal(t.router_fused_max, 8);
    assert_int_equal(t.moe_path, 0);
    assert_int_equal(t.moe_pair_kernel, GPTOSS_CUDA_PAIR_KERNEL_AUTO);
    assert_int_equal(t.moe_pair_tokens, 0);
    assert_int_equal(t.moe_inflight, 3);
    assert_false(t.moe_inflight_report);
    assert_int_equal(t.moe_wg_min, 24);
    assert_int_equal(t.moe_max_tile, 64);
    assert_int_equal(t.moe_tile_pct, 125);
    assert_int_equal(t.moe_mma_stage_kb, 0); /* by tile height */
    assert_false(t.moe_mma_slab);
    assert_int_equal(t.bi_dense_max, 16);
    assert_int_equal(t.bi_dense_large, 1);
    assert_int_equal(t.bi_moe_tile, 64);
    assert_int_equal(t.bi_moe_max, 64);
    assert_true(t.bi_moe_wide && t.bi_dense_wide);
    assert_int_equal(t.bi_moe_pairs, 1);
    assert_false(t.profile || t.step_timing);
    assert_int_equal(t.ablate, 0);
    assert_int_equal(t.device_profile, -1); /* not given: the backend option decides */
    assert_false(t.host_weights);
}

static void test_string(void **state) {
    (void)state;
    gptoss_cuda_tuning t;
    gptoss_error err = {0};
    assert_int_equal(
        gptoss_cuda_tuning_init(&t,
                                " gemv=all, norm_router=0,moe_path = 1,attn_tc=off,,"
                                "attn_decode=false,gemv_kernel=ld,moe_pair_kernel=fp8,"
                                "adc_warps=8,router_fused_max=0,moe_inflight=1,graphs=no,"
                                "moe_path=route_gemv,bi_dense_max=0,bi_moe_max=300,"
                                "bi_moe_wide=0,moe_mma_stage_kb=3,moe_mma_slab=on",
                                &err),
        GPTOSS_OK);
    assert_int_equal(t.gemv, GPTOSS_CUDA_GEMV_ALL);
    assert_false(t.norm_router);
    assert_int_equal(t.moe_path, 1); /* route_gemv, after moe_path = 1 */
    assert_false(t.attn_tc);
    assert_false(t.attn_decode);
    assert_int_equal(t.gemv_kernel, GPTOSS_CUDA_GEMV_KERNEL_LD);
    assert_int_equal(t.moe_pair_kernel, GPTOSS_CUDA_PAIR_KERNEL_FP8);
    assert_int_equal(t.adc_warps, 8);
    assert_int_equal(t.router_fused_max, 0);
    assert_int_equal(t.moe_inflight, 1);
    assert_true(t.moe_inflight_report);
    assert_false(t.graphs);
    assert_int_equal(t.bi_dense_max, 0);
    assert_int_equal(t.bi_moe_max, 300);
    assert_false(t.bi_moe_wide);
    assert_int_equal(t.moe_mma_stage_kb, 3);
    assert_true(t.moe_mma_slab);
    /* untouched keys keep their defaults */
    assert_true(t.qkv_rope && t.pdl);
    assert_int_equal(t.moe_tile_pct, 125);
}

static void test_environment_overrides_string(void **state) {
    (void)state;
    gptoss_cuda_tuning t;
    gptoss_error err = {0};
    setenv("GPTOSS_CUDA_MOE_PATH", "2", 1);
    setenv("GPTOSS_CUDA_GEMV", "0", 1);
    setenv("GPTOSS_STEP_TIMING", "1", 1);
    assert_int_equal(gptoss_cuda_tuning_init(&t, "moe_path=mma_gemm,gemv=all,qkv_rope=0", &err),
                     GPTOSS_OK);
    assert_int_equal(t.moe_path, 2);
    assert_int_equal(t.gemv, GPTOSS_CUDA_GEMV_OFF);
    assert_true(t.step_timing);
    assert_false(t.qkv_rope); /* no variable set for it: the string's value */
    clear_env(NULL);
}

static void expect_error(const char *spec, const char *needle1, const char *needle2) {
    gptoss_cuda_tuning t;
    gptoss_error err = {0};
    assert_int_equal(gptoss_cuda_tuning_init(&t, spec, &err), GPTOSS_ERR_INVALID_ARGUMENT);
    if (!strstr(err.message, needle1) || !strstr(err.message, needle2))
        fail_msg("message: %s", err.message);
}

static void test_errors(void **state) {
    (void)state;
    expect_error("moe_paht=4", "unknown key 'moe_paht'", "moe_path");
    expect_error("moe_path=7", "moe_path=7", "one of auto, route_gemv, wmma_gemm");
    expect_error("moe_path=4x", "moe_path=4x", "pair_mma");
    expect_error("moe_path=", "moe_path=", "wgmma_gemm");
    expect_error("router_fused_max=65", "router_fused_max=65", "[0, 64]");
    expect_error("moe_max_tile=4", "moe_max_tile=4", "[8, 128]");
    expect_error("moe_mma_stage_kb=4", "moe_mma_stage_kb=4", "[0, 3]");
    expect_error("moe_mma_slab=2", "moe_mma_slab=2", "0 or 1");
    expect_error("gemv_kernel=fast", "gemv_kernel=fast", "one of auto, ld, tma");
    expect_error("adc_warps=6", "adc_warps=6", "one of 0, 4, 8");
    expect_error("graphs=2", "graphs=2", "0 or 1");
    expect_error("graphs", "'graphs' is not key=value", "");
    setenv("GPTOSS_CUDA_ATTN_TC", "maybe", 1);
    expect_error(NULL, "GPTOSS_CUDA_ATTN_TC=maybe", "0 or 1");
    clear_env(NULL);
}

static void test_ablation_only_in_diagnostics_builds(void **state) {
    (void)state;
    gptoss_cuda_tuning t;
    gptoss_error err = {0};
    gptoss_status st = gptoss_cuda_tuning_init(&t, "ablate=16", &err);
#ifdef GPTOSS_DIAGNOSTICS
    assert_int_equal(st, GPTOSS_OK);
    assert_int_equal(t.ablate, 16);
#else
    assert_int_equal(st, GPTOSS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "needs a diagnostics build"));
    setenv("GPTOSS_CUDA_ABLATE", "0", 1); /* 0 leaves everything in: allowed anywhere */
    assert_int_equal(gptoss_cuda_tuning_init(&t, NULL, &err), GPTOSS_OK);
    clear_env(NULL);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clear_env),
        cmocka_unit_test_setup(test_string, clear_env),
        cmocka_unit_test_setup(test_environment_overrides_string, clear_env),
        cmocka_unit_test_setup(test_errors, clear_env),
        cmocka_unit_test_setup(test_ablation_only_in_diagnostics_builds, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
