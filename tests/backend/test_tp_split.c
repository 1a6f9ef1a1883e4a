/*
 * test_tp_split.c - tensor parallelism's split of a model (src/backend/tp_split.h): which
 * heads and experts each rank holds, the o-projection's column slice, and the checks of the
 * tensor_parallel_size option, against properties stated here from the model alone:
 *   - the ranks' query heads, KV heads and experts are disjoint ranges that cover the model;
 *   - every query head sits on the rank of the KV head it reads (head h uses KV head
 *     h / (NH / NKV), spec section 2), so attention needs nothing from another rank;
 *   - the column slice equals an element-by-element copy.
 */
#include "test_support.h"

#include "backend/tp_split.h"
#include "model/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static gptoss_config preset(const char *name) {
    gptoss_config c;
    gptoss_error e = {0};
    assert_int_equal(gptoss_config_preset(name, &c, &e), GPTOSS_OK);
    return c;
}

static void check_cover(const gptoss_config *c, int32_t n) {
    gptoss_error e = {0};
    assert_int_equal(gptoss_tp_check_config(c, n, 0, n, &e), GPTOSS_OK);
    int32_t *head_rank = malloc((size_t)c->n_heads * sizeof(int32_t));
    int32_t *kv_rank = malloc((size_t)c->n_kv_heads * sizeof(int32_t));
    int32_t *expert_rank = malloc((size_t)c->n_experts * sizeof(int32_t));
    for (int32_t i = 0; i < c->n_heads; i++)
        head_rank[i] = -1;
    for (int32_t i = 0; i < c->n_kv_heads; i++)
        kv_rank[i] = -1;
    for (int32_t i = 0; i < c->n_experts; i++)
        expert_rank[i] = -1;
    for (int32_t r = 0; r < n; r++) {
        gptoss_tp_slice s = gptoss_tp_rank_slice(c, n, r);
        assert_true(s.n_heads > 0 && s.n_kv_heads > 0 && s.n_experts > 0);
        /* the rank's own config keeps the model's grouping */
        assert_int_equal(s.n_heads / s.n_kv_heads, c->n_heads / c->n_kv_heads);
        for (int32_t i = s.head0; i < s.head0 + s.n_heads; i++) {
            assert_in_range(i, 0, c->n_heads - 1);
            assert_int_equal(head_rank[i], -1);
            head_rank[i] = r;
        }
        for (int32_t i = s.kv_head0; i < s.kv_head0 + s.n_kv_heads; i++) {
            assert_in_range(i, 0, c->n_kv_heads - 1);
            assert_int_equal(kv_rank[i], -1);
            kv_rank[i] = r;
        }
        for (int32_t i = s.expert0; i < s.expert0 + s.n_experts; i++) {
            assert_in_range(i, 0, c->n_experts - 1);
            assert_int_equal(expert_rank[i], -1);
            expert_rank[i] = r;
        }
    }
    const int32_t group = c->n_heads / c->n_kv_heads;
    for (int32_t h = 0; h < c->n_heads; h++) {
        assert_true(head_rank[h] >= 0);
        assert_int_equal(head_rank[h], kv_rank[h / group]);
    }
    for (int32_t i = 0; i < c->n_experts; i++)
        assert_true(expert_rank[i] >= 0);
    free(head_rank);
    free(kv_rank);
    free(expert_rank);
}

static void test_slices_cover_the_model(void **state) {
    (void)state;
    const char *names[] = {"tiny", "20b", "120b"};
    for (int i = 0; i < 3; i++) {
        gptoss_config c = preset(names[i]);
        for (int32_t n = 1; n <= GPTOSS_TP_MAX; n *= 2)
            if (c.n_kv_heads % n == 0 && c.n_experts % n == 0 && c.n_heads % n == 0)
                check_cover(&c, n);
    }
    /* the gpt-oss shapes take every size up to 8 */
    gptoss_config big = preset("120b");
    gptoss_error e = {0};
    for (int32_t n = 1; n <= 8; n *= 2)
        assert_int_equal(gptoss_tp_check_config(&big, n, 0, 8, &e), GPTOSS_OK);
    gptoss_config small = preset("20b");
    for (int32_t n = 1; n <= 8; n *= 2)
        assert_int_equal(gptoss_tp_check_config(&small, n, 0, 8, &e), GPTOSS_OK);
}

static void test_config_refusals(void **state) {
    (void)state;
    gptoss_config c = preset("120b");
    gptoss_error e = {0};
    /* more GPUs than visible, or past the last one */
    assert_int_equal(gptoss_tp_check_config(&c, 2, 0, 1, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "GPUs 0..1"));
    assert_int_equal(gptoss_tp_check_config(&c, 2, 1, 2, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_int_equal(gptoss_tp_check_config(&c, 2, 2, 4, &e), GPTOSS_OK);
    /* a count that does not divide the KV heads */
    c.n_kv_heads = 6;
    c.n_heads = 48;
    assert_int_equal(gptoss_tp_check_config(&c, 4, 0, 8, &e), GPTOSS_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "KV heads (6)"));
    c = preset("120b");
    c.n_experts = 6;
    assert_int_equal(gptoss_tp_check_config(&c, 4, 0, 8, &e), GPTOSS_ERR_UNSUPPORTED);
    /* one GPU needs no check at all */
    assert_int_equal(gptoss_tp_check_config(&c, 1, 0, 0, &e), GPTOSS_OK);
}

static void test_option_checks(void **state) {
    (void)state;
    gptoss_error e = {0};
    assert_int_equal(gptoss_tp_check_options(0, GPTOSS_BACKEND_CPU, &e), GPTOSS_OK);
    assert_int_equal(gptoss_tp_check_options(1, GPTOSS_BACKEND_CPU, &e), GPTOSS_OK);
    for (int32_t n = 2; n <= 8; n *= 2) {
        assert_int_equal(gptoss_tp_check_options(n, GPTOSS_BACKEND_CUDA, &e), GPTOSS_OK);
        assert_int_equal(gptoss_tp_check_options(n, GPTOSS_BACKEND_CPU, &e),
                         GPTOSS_ERR_UNSUPPORTED);
        assert_non_null(strstr(e.message, "CUDA backend"));
    }
    const int32_t bad[] = {-1, 3, 5, 6, 7, 9, 16};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(gptoss_tp_check_options(bad[i], GPTOSS_BACKEND_CUDA, &e),
                         GPTOSS_ERR_INVALID_ARGUMENT);
    /* the public entry refuses it before any backend is made */
    gptoss_config c = preset("tiny");
    gptoss_backend_options o = gptoss_backend_options_default();
    o.kind = GPTOSS_BACKEND_CPU;
    o.tensor_parallel_size = 2;
    gptoss_backend *b = NULL;
    assert_int_equal(gptoss_backend_create_random(&c, &o, 1, &b, &e), GPTOSS_ERR_UNSUPPORTED);
    assert_null(b);
    o.tensor_parallel_size = 3;
    assert_int_equal(gptoss_backend_create_random(&c, &o, 1, &b, &e), GPTOSS_ERR_INVALID_ARGUMENT);
}

/* A job of several processes: the size counts every GPU, each process checks its own share. */
static void test_job_checks(void **state) {
    (void)state;
    gptoss_error e = {0};
    gptoss_config c = preset("120b"); /* 64 query heads, 8 KV heads, 128 experts */
    assert_int_equal(gptoss_tp_check_job(&c, 8, 2, 0, 4, &e), GPTOSS_OK);
    assert_int_equal(gptoss_tp_check_job(&c, 2, 2, 0, 1, &e), GPTOSS_OK);
    assert_int_equal(gptoss_tp_check_job(&c, 8, 2, 0, 3, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "needs 4 GPUs in each (GPUs 0..3), but 3 are visible"));
    assert_int_equal(gptoss_tp_check_job(&c, 2, 4, 0, 8, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "multiple of the number of processes"));
    assert_int_equal(gptoss_tp_check_job(&c, 4, 3, 0, 8, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    c.n_kv_heads = 2;
    c.n_heads = 16;
    assert_int_equal(gptoss_tp_check_job(&c, 4, 2, 0, 2, &e), GPTOSS_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "KV heads (2)"));
    /* one process: the single-process check, its message unchanged */
    c = preset("120b");
    assert_int_equal(gptoss_tp_check_job(&c, 4, 1, 0, 2, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "needs GPUs 0..3, but 2 are visible"));
}

/* Data parallel engines of tensor-parallel groups: engine i's first GPU, and the GPUs the whole
 * set needs against those visible. */
static void test_dp_engine_devices(void **state) {
    (void)state;
    gptoss_error e = {0};
    int32_t first[4] = {-1, -1, -1, -1};
    assert_int_equal(gptoss_dp_engine_devices(2, 2, 0, 4, first, &e), GPTOSS_OK);
    assert_int_equal(first[0], 0);
    assert_int_equal(first[1], 2);
    assert_int_equal(gptoss_dp_engine_devices(4, 2, 0, 8, first, &e), GPTOSS_OK);
    assert_int_equal(first[3], 6);
    assert_int_equal(gptoss_dp_engine_devices(3, 1, 1, 4, first, &e), GPTOSS_OK);
    assert_int_equal(first[0], 1);
    assert_int_equal(first[2], 3);
    assert_int_equal(gptoss_dp_engine_devices(2, 0, 0, 2, first, &e), GPTOSS_OK); /* 0 reads 1 */
    assert_int_equal(first[1], 1);
    assert_int_equal(gptoss_dp_engine_devices(2, 2, 0, 3, first, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "of 2 GPUs each (tensor parallel) needs GPUs 0..3, but 3 "
                                      "are visible"));
    assert_int_equal(gptoss_dp_engine_devices(2, 4, 1, 8, NULL, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "needs GPUs 1..8, but 8 are visible"));
    assert_int_equal(gptoss_dp_engine_devices(2, 1, 0, 1, NULL, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.message, "data parallel size 2 needs GPUs 0..1, but 1 is visible"));
    assert_int_equal(gptoss_dp_engine_devices(0, 1, 0, 1, NULL, &e), GPTOSS_ERR_INVALID_ARGUMENT);
    assert_int_equal(gptoss_dp_engine_devices(1, 2, -1, 4, NULL, &e), GPTOSS_ERR_INVALID_ARGUMENT);
}

static void test_copy_columns(void **state) {
    (void)state;
    const size_t rows = 7, cols = 24;
    uint16_t src[7 * 24], dst[7 * 24];
    for (size_t i = 0; i < rows * cols; i++)
        src[i] = (uint16_t)(i * 2654435761u >> 7);
    const size_t parts[] = {2, 4, 8};
    for (size_t p = 0; p < 3; p++) {
        size_t w = cols / parts[p];
        for (size_t r0 = 0; r0 < parts[p]; r0++) {
            memset(dst, 0xab, sizeof dst);
            gptoss_tp_copy_columns16(src, rows, cols, r0 * w, w, dst);
            for (size_t r = 0; r < rows; r++)
                for (size_t j = 0; j < w; j++)
                    assert_int_equal(dst[r * w + j], src[r * cols + r0 * w + j]);
            assert_int_equal(dst[rows * w], 0xabab); /* nothing written past the slice */
        }
    }
}

/* The MoE split by rows: every rank holds all experts and a disjoint run of intermediate
 * rows, the runs cover the dimension, only rank 0 adds the down bias; a slice that is not whole
 * 32-row MXFP4 groups is refused; a bad mode is refused. */
static void test_moe_rows(void **state) {
    (void)state;
    gptoss_config c = preset("20b");
    gptoss_error e = {0};
    for (int32_t n = 2; n <= 8; n *= 2) {
        const bool whole = c.intermediate_size % (32 * n) == 0;
        assert_int_equal(gptoss_tp_check_moe(&c, n, GPTOSS_MOE_PARALLEL_TP, &e) == GPTOSS_OK,
                         whole);
        assert_int_equal(gptoss_tp_check_moe(&c, n, GPTOSS_MOE_PARALLEL_EP, &e), GPTOSS_OK);
        int32_t next = 0;
        for (int32_t r = 0; r < n; r++) {
            gptoss_tp_slice s = gptoss_tp_rank_slice_moe(&c, n, r, GPTOSS_MOE_PARALLEL_TP);
            assert_int_equal(s.expert0, 0);
            assert_int_equal(s.n_experts, c.n_experts);
            assert_int_equal(s.inter0, next);
            next += s.n_inter;
            assert_int_equal(s.down_bias, r == 0);
            gptoss_tp_slice x = gptoss_tp_rank_slice_moe(&c, n, r, GPTOSS_MOE_PARALLEL_EP);
            assert_int_equal(x.n_inter, c.intermediate_size);
            assert_true(x.down_bias);
        }
        assert_int_equal(next, c.intermediate_size);
    }
    /* 2880 / 4 = 720 = 22.5 groups: refused, with the way out named */
    assert_int_not_equal(gptoss_tp_check_moe(&c, 4, GPTOSS_MOE_PARALLEL_TP, &e), GPTOSS_OK);
    assert_non_null(strstr(e.message, "--moe-parallel ep"));
    assert_int_not_equal(gptoss_tp_check_moe(&c, 2, 7, &e), GPTOSS_OK);
}

/* Row slices equal a byte-by-byte copy. */
static void test_copy_row_slices(void **state) {
    (void)state;
    enum { ROWS = 5, ROW = 37, OFF = 9, N = 11 };
    uint8_t src[ROWS * ROW], dst[ROWS * N];
    for (int i = 0; i < ROWS * ROW; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    gptoss_tp_copy_row_slices(src, ROWS, ROW, OFF, N, dst);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < N; j++)
            assert_int_equal(dst[r * N + j], src[r * ROW + OFF + j]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_cover_the_model), cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_option_checks),          cmocka_unit_test(test_job_checks),
        cmocka_unit_test(test_copy_columns),           cmocka_unit_test(test_moe_rows),
        cmocka_unit_test(test_copy_row_slices),        cmocka_unit_test(test_dp_engine_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
