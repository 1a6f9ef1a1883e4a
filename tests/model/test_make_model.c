/*
 * test_make_model.c - `make-model` is deterministic (two runs with one seed are byte-identical,
 * another seed differs), writes the published layout, and its values have the distributions
 * random_init.h documents (checked against the MXFP4 and bf16 definitions, not our reader).
 * Also the config.json it writes: a config read from a file without token ids writes itself
 * back as one that reads as the same config.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "model/config.h"
#include "model/weights.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_same_seed_same_bytes(void **state) {
    (void)state;
    char *out = NULL;
    const char *bin = ts_env("GPTOSS_BIN");
    char *a = ts_mkdtemp(), *b = ts_mkdtemp(), *c = ts_mkdtemp();
    char config[4096];
    snprintf(config, sizeof config, "%s/tests/golden/configs/moe.json",
             ts_env("GPTOSS_SOURCE_DIR"));
    assert_int_equal(ts_run(&out, "'%s' make-model --config '%s' -o '%s' --seed 7", bin, config, a),
                     0);
    free(out);
    assert_int_equal(ts_run(&out,
                            "OMP_NUM_THREADS=1 '%s' make-model --config '%s' -o '%s' --seed 7", bin,
                            config, b),
                     0);
    free(out);
    assert_int_equal(ts_run(&out, "'%s' make-model --config '%s' -o '%s' --seed 8", bin, config, c),
                     0);
    free(out);
    /* Every file, byte for byte (different thread counts too). */
    int rc = ts_run(&out, "diff -r '%s' '%s'", a, b);
    if (rc != 0) fail_msg("same seed, different bytes: %s", out);
    free(out);
    rc = ts_run(
        &out, "cmp -s '%s/model-00000-of-00002.safetensors' '%s/model-00000-of-00002.safetensors'",
        a, c);
    free(out);
    assert_int_not_equal(rc, 0);
    /* The published layout: index, shards named with the last index, configs, tokenizer. */
    const char *files[] = {"config.json",
                           "generation_config.json",
                           "model.safetensors.index.json",
                           "model-00000-of-00002.safetensors",
                           "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors",
                           "tokenizer.json",
                           "tokenizer_config.json",
                           "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = ts_path(a, files[i]);
        size_t len = 0;
        char *text = ts_read_file(p, &len);
        if (!text) fail_msg("make-model did not write %s", files[i]);
        free(text);
        free(p);
    }
    ts_rmtree(a), ts_rmtree(b), ts_rmtree(c);
    free(a), free(b), free(c);
}

/* Statistics of the bytes as the format defines them: bf16 bits -> float, MXFP4 codes via the
 * E2M1 table and scale bytes as 2^(s-127). */
static void test_distributions(void **state) {
    (void)state;
    char config[4096];
    snprintf(config, sizeof config, "%s/tests/golden/configs/moe.json",
             ts_env("GPTOSS_SOURCE_DIR"));
    char *dir = tm_make_model(NULL, config, 3);
    gptoss_model *model = NULL;
    gptoss_error err = {0};
    assert_int_equal(gptoss_model_load(dir, &model, &err), GPTOSS_OK);
    const gptoss_config *c = gptoss_model_config(model);
    const gptoss_layer_weights *l = &gptoss_model_weights(model)->layers[1];
    /* q_proj ~ N(0, 1/sqrt(H)) */
    const uint16_t *q = l->q_weight.data;
    size_t n = l->q_weight.n_bytes / 2;
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, &q[i], 2);
        union {
            uint32_t u;
            float f;
        } v = {(uint32_t)h << 16};
        sum += v.f, sq += (double)v.f * v.f;
    }
    double mean = sum / n, std = sqrt(sq / n - mean * mean), want = 1.0 / sqrt(c->hidden_size);
    printf("q_proj: mean %.4f std %.4f (want 0, %.4f)\n", mean, std, want);
    assert_true(fabs(mean) < 0.1 * want);
    assert_true(fabs(std - want) < 0.05 * want);
    /* MXFP4: all 16 codes appear about equally often; element std near 1/sqrt(in). */
    static const float e2m1[16] = {0,    .5f,  1,  1.5f,  2,  3,  4,  6,
                                   -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    const uint8_t *blocks = l->gate_up_blocks.data, *scales = l->gate_up_scales.data;
    size_t count[16] = {0};
    sq = 0;
    size_t n_values = 0;
    for (size_t g = 0; g < l->gate_up_scales.n_bytes; g++) {
        double scale = ldexp(1.0, scales[g] - 127);
        for (int b = 0; b < 16; b++) {
            uint8_t byte = blocks[g * 16 + (size_t)b];
            count[byte & 15]++, count[byte >> 4]++;
            double lo = e2m1[byte & 15] * scale, hi = e2m1[byte >> 4] * scale;
            sq += lo * lo + hi * hi;
            n_values += 2;
        }
    }
    for (int k = 0; k < 16; k++)
        assert_true(fabs((double)count[k] / n_values - 1.0 / 16) < 0.01);
    std = sqrt(sq / n_values);
    printf("gate_up: std %.4f (want about %.4f)\n", std, want);
    assert_true(std > 0.5 * want && std < 2.0 * want);
    gptoss_model_free(model);
    ts_rmtree(dir);
    free(dir);
}

/* eos_token_id and pad_token_id are optional; written back, absent ids must stay readable
 * (they were written as -1, which the reader refuses). */
static void test_config_without_token_ids(void **state) {
    (void)state;
    gptoss_config c, back;
    gptoss_error err = {0};
    assert_int_equal(gptoss_config_preset("tiny", &c, &err), GPTOSS_OK);
    c.eos_token_id = -1;
    c.pad_token_id = -1;
    char *json = gptoss_config_to_json(&c);
    assert_non_null(json);
    json_error_t jerr;
    json_t *root = json_loads(json, 0, &jerr);
    assert_non_null(root);
    assert_true(json_is_null(json_object_get(root, "eos_token_id")));
    assert_true(json_is_null(json_object_get(root, "pad_token_id")));
    json_decref(root);
    if (gptoss_config_parse(json, strlen(json), &back, &err) != GPTOSS_OK)
        fail_msg("%s", err.message);
    assert_int_equal(back.eos_token_id, -1);
    assert_int_equal(back.pad_token_id, -1);
    assert_int_equal(back.n_layers, c.n_layers);
    assert_int_equal(back.vocab_size, c.vocab_size);
    free(json);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_bytes),
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_config_without_token_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
