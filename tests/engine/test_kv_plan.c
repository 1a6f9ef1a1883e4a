/*
 * test_kv_plan.c - the KV sizing policy (engine/kv_plan.h) against page counts worked out by
 * hand from the 20b and tiny shapes (20b: 24 layers, 12 sliding with a 128-token window,
 * 8 KV heads x 64; tiny: 4 layers, 2 sliding with a 16-token window, 2 KV heads x 32), and
 * the engine's refusal of a sliding pool below one window.
 */
#include "test_support.h"

#include "gptoss_engine.h"
#include "engine/kv_plan.h"
#include "model/config.h"
#include "util/error.h"

#include <math.h>
#include <string.h>

static gptoss_config preset(const char *name) {
    gptoss_config c;
    gptoss_error err = {0};
    if (gptoss_config_preset(name, &c, &err) != GPTOSS_OK)
        fail_msg("preset %s: %s", name, err.message);
    return c;
}

static void test_sliding_layers_and_windows(void **state) {
    (void)state;
    gptoss_config c = preset("20b");
    assert_int_equal(gptoss_config_n_sliding_layers(&c), 12);
    c.sliding_window = 0; /* layer types say sliding, but there is no window: none slides */
    assert_int_equal(gptoss_config_n_sliding_layers(&c), 0);
    gptoss_config t = preset("tiny");
    assert_int_equal(gptoss_config_n_sliding_layers(&t), 2);

    /* One window: w - 1 earlier tokens plus the new one, starting anywhere in a page. */
    assert_int_equal(gptoss_kv_min_sliding_blocks(128, 16), 9); /* ceil(127 / 16) + 1 */
    assert_int_equal(gptoss_kv_min_sliding_blocks(16, 16), 2);
    assert_int_equal(gptoss_kv_min_sliding_blocks(17, 16), 2);
    assert_int_equal(gptoss_kv_min_sliding_blocks(1, 16), 1);
    assert_int_equal(gptoss_kv_min_sliding_blocks(0, 16), 0);
    /* 64 windows of ceil(128 / 16) + 2 pages, one chunk of 2048 / 16 pages, 16 spare. */
    assert_int_equal(gptoss_kv_sliding_pool_blocks(128, 16, 64, 2048), 64 * 10 + 128 + 16);
    assert_int_equal(gptoss_kv_sliding_pool_blocks(128, 16, 1024, 2048), 1024 * 10 + 128 + 16);
    assert_int_equal(gptoss_kv_sliding_pool_blocks(0, 16, 64, 2048), 0);
}

static void test_serve_cpu_budget(void **state) {
    (void)state;
    gptoss_error err = {0};
    gptoss_config c = preset("20b");
    gptoss_backend_options bo = gptoss_backend_options_default();
    gptoss_kv_plan_options o = {.max_num_seqs = 64, .max_num_batched_tokens = 2048};
    assert_int_equal(gptoss_kv_plan_serve(&c, &o, &bo, &err), GPTOSS_OK);
    /* fp32 pages: 24 layers x 2 x 8 x 64 x 4 bytes x 16 tokens = 1.5 MiB; 4 GiB / 1.5 MiB */
    assert_int_equal(bo.n_kv_blocks, 2730);
    assert_false(bo.kv_shared_pages);
    assert_true(bo.gpu_memory_utilization == 0);

    gptoss_config t = preset("tiny"); /* 32 KiB a page: 131072 fit, capped */
    bo = gptoss_backend_options_default();
    assert_int_equal(gptoss_kv_plan_serve(&t, &o, &bo, &err), GPTOSS_OK);
    assert_int_equal(bo.n_kv_blocks, GPTOSS_KV_CPU_MAX_BLOCKS);

    bo = gptoss_backend_options_default();
    o.n_kv_blocks = 64; /* asked for: taken as is */
    assert_int_equal(gptoss_kv_plan_serve(&t, &o, &bo, &err), GPTOSS_OK);
    assert_int_equal(bo.n_kv_blocks, 64);
}

static void test_serve_cuda(void **state) {
    (void)state;
    gptoss_error err = {0};
    gptoss_config c = preset("20b");
    gptoss_backend_options bo = gptoss_backend_options_default();
    bo.kind = GPTOSS_BACKEND_CUDA;
    gptoss_kv_plan_options o = {.max_num_seqs = 1024, .max_num_batched_tokens = 2048};
    assert_int_equal(gptoss_kv_plan_serve(&c, &o, &bo, &err), GPTOSS_OK);
    assert_true(bo.kv_shared_pages);
    assert_true(fabs(bo.gpu_memory_utilization - 0.95) < 1e-12);
    assert_int_equal(bo.n_sliding_kv_blocks, 1024 * 10 + 128 + 16);
    assert_int_equal(bo.max_step_tokens, 2048);
    assert_int_equal(bo.max_step_logits, 1025);

    bo = gptoss_backend_options_default();
    bo.kind = GPTOSS_BACKEND_CUDA;
    o.memory_fraction = 0.5;
    assert_int_equal(gptoss_kv_plan_serve(&c, &o, &bo, &err), GPTOSS_OK);
    assert_true(fabs(bo.gpu_memory_utilization - 0.5) < 1e-12);

    /* Pages asked for: no fraction, and a separate sliding pool never larger than them. */
    bo = gptoss_backend_options_default();
    bo.kind = GPTOSS_BACKEND_CUDA;
    o.memory_fraction = 0;
    o.n_kv_blocks = 500;
    assert_int_equal(gptoss_kv_plan_serve(&c, &o, &bo, &err), GPTOSS_OK);
    assert_int_equal(bo.n_kv_blocks, 500);
    assert_int_equal(bo.n_sliding_kv_blocks, 500);
    assert_true(bo.gpu_memory_utilization == 0);
}

static void test_context_and_mib(void **state) {
    (void)state;
    gptoss_config t = preset("tiny");
    gptoss_backend_options bo = gptoss_backend_options_default();
    gptoss_kv_plan_context(&t, 100, &bo); /* 7 pages of 16; the window needs 2 */
    assert_int_equal(bo.n_kv_blocks, 7);
    assert_int_equal(bo.n_sliding_kv_blocks, 7);
    gptoss_config c = preset("20b");
    gptoss_kv_plan_context(&c, 20, &bo); /* 2 pages; a 128-token window needs 9 */
    assert_int_equal(bo.n_kv_blocks, 2);
    assert_int_equal(bo.n_sliding_kv_blocks, 9);

    /* CUDA bf16 pages, 2 x 8 x 64 x 2 = 2048 bytes a token and layer: 12 full layers x
     * 16000 tokens = 375 MiB; a separate sliding pool of 200 pages adds 12 x 3200 tokens. */
    bo = gptoss_backend_options_default();
    bo.kind = GPTOSS_BACKEND_CUDA;
    bo.n_kv_blocks = 1000;
    bo.n_sliding_kv_blocks = 200;
    bo.kv_shared_pages = true;
    assert_true(fabs(gptoss_kv_plan_mib(&c, &bo) - 375.0) < 1e-9);
    bo.kv_shared_pages = false;
    assert_true(fabs(gptoss_kv_plan_mib(&c, &bo) - 450.0) < 1e-9);
}

static gptoss_status never_called(void *user, const gptoss_batch_plan *plan,
                                  const gptoss_sample_batch *batch, gptoss_error *error) {
    (void)user, (void)plan, (void)batch;
    return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "not expected");
}

/* The engine refuses a sliding pool below one window, by the same count kv_plan gives. */
static void test_engine_minimum_sliding_pool(void **state) {
    (void)state;
    gptoss_engine_options o = gptoss_engine_options_default();
    o.forward_sample = never_called;
    o.vocab_size = 64;
    o.sliding_window = 128;
    o.kv_block_size = 16;
    o.n_kv_blocks = 64;
    o.n_sliding_kv_blocks = gptoss_kv_min_sliding_blocks(128, 16) - 1;
    gptoss_engine *e = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_ERR_CAPACITY);
    assert_non_null(strstr(err.message, "needs 9"));
    o.n_sliding_kv_blocks++;
    assert_int_equal(gptoss_engine_create(&o, &e, &err), GPTOSS_OK);
    gptoss_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sliding_layers_and_windows),
        cmocka_unit_test(test_serve_cpu_budget),
        cmocka_unit_test(test_serve_cuda),
        cmocka_unit_test(test_context_and_mib),
        cmocka_unit_test(test_engine_minimum_sliding_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
