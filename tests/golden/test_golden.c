/*
 * test_golden.c - the CPU backend against logits computed by Hugging Face transformers.
 *
 * Each fixture in tests/golden/fixtures/ was produced by make_golden.py from a checkpoint that
 * `gptoss make-model` writes deterministically. The test regenerates that checkpoint, proves
 * it is byte-identical (SHA-256 of the safetensors files, as recorded by the generator), runs
 * every prompt through the CPU backend, and requires at every position:
 *   - the same top-1 token as transformers, and
 *   - max |our logit - their logit| <= 1e-3 * max |logit| over the recorded top-k and probe ids.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "format/safetensors.h"
#include "util/sha256.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SHA-256 over every tensor in name order (name, NUL, dtype, NUL, shape "d0,d1,...", NUL,
 * bytes): the definition make_golden.py uses, independent of sharding. */
typedef struct named_tensor {
    const gptoss_st_tensor *tensor;
} named_tensor;

static int by_name(const void *a, const void *b) {
    return strcmp(((const named_tensor *)a)->tensor->name, ((const named_tensor *)b)->tensor->name);
}

static void checkpoint_sha256(const char *dir, char hex[65]) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    assert_true(n > 0);
    gptoss_st_file *files[64];
    int n_files = 0;
    size_t n_tensors = 0;
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        size_t len = strlen(name);
        if (len > 12 && strcmp(name + len - 12, ".safetensors") == 0 && n_files < 64) {
            char *path = ts_path(dir, name);
            gptoss_error err = {0};
            if (gptoss_st_open(path, &files[n_files], &err) != GPTOSS_OK)
                fail_msg("%s", err.message);
            n_tensors += files[n_files++]->n_tensors;
            free(path);
        }
        free(names[i]);
    }
    free(names);
    named_tensor *all = malloc(n_tensors * sizeof *all);
    size_t k = 0;
    for (int f = 0; f < n_files; f++)
        for (size_t t = 0; t < files[f]->n_tensors; t++)
            all[k++].tensor = &files[f]->tensors[t];
    qsort(all, n_tensors, sizeof *all, by_name);
    gptoss_sha256 h;
    gptoss_sha256_init(&h);
    for (size_t i = 0; i < n_tensors; i++) {
        const gptoss_st_tensor *t = all[i].tensor;
        char meta[512];
        int len =
            snprintf(meta, sizeof meta, "%s%c%s%c", t->name, 0, gptoss_dtype_name(t->dtype), 0);
        for (int32_t d = 0; d < t->n_dims; d++)
            len += snprintf(meta + len, sizeof meta - (size_t)len, "%s%lld", d ? "," : "",
                            (long long)t->shape[d]);
        meta[len++] = 0;
        gptoss_sha256_update(&h, meta, (size_t)len);
        gptoss_sha256_update(&h, t->data, (size_t)(t->end - t->begin));
    }
    uint8_t digest[32];
    gptoss_sha256_final(&h, digest);
    gptoss_sha256_hex(digest, hex);
    free(all);
    for (int f = 0; f < n_files; f++)
        gptoss_st_close(files[f]);
}

static void check_fixture(const char *name) {
    char *dir = NULL;
    uint64_t seed = 0;
    json_t *fx = tm_golden_fixture(name, &dir, &seed);

    char hex[65];
    checkpoint_sha256(dir, hex);
    const char *want = json_string_value(json_object_get(fx, "checkpoint_sha256"));
    if (strcmp(hex, want) != 0)
        fail_msg("%s: regenerated checkpoint differs from the one transformers saw (sha256 %s, "
                 "fixture %s)",
                 name, hex, want);

    gptoss_model *model = NULL;
    gptoss_error err = {0};
    if (gptoss_model_load(dir, &model, &err) != GPTOSS_OK) fail_msg("%s", err.message);
    int32_t vocab = gptoss_model_config(model)->vocab_size;
    json_t *probes = json_object_get(fx, "probe_ids");
    json_t *prompts = json_object_get(fx, "prompts");
    size_t p_index;
    json_t *prompt;
    double worst = 0;
    int positions = 0;
    json_array_foreach(prompts, p_index, prompt) {
        json_t *ids_json = json_object_get(prompt, "ids");
        int32_t n = (int32_t)json_array_size(ids_json);
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        for (int32_t i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(ids_json, (size_t)i));
        tm_sequence seq = {ids, n};
        float *logits = tm_run_all_logits(model, GPTOSS_BACKEND_CPU, &seq, 1, 0, 16);
        for (int32_t i = 0; i < n; i++) {
            const float *row = logits + (size_t)i * vocab;
            json_t *top_ids = json_array_get(json_object_get(prompt, "top_ids"), (size_t)i);
            json_t *top_vals = json_array_get(json_object_get(prompt, "top_logits"), (size_t)i);
            json_t *probe_vals = json_array_get(json_object_get(prompt, "probe_logits"), (size_t)i);
            double max_abs = 0;
            for (size_t k = 0; k < json_array_size(top_vals); k++)
                max_abs = fmax(max_abs, fabs(json_number_value(json_array_get(top_vals, k))));
            for (size_t k = 0; k < json_array_size(probe_vals); k++)
                max_abs = fmax(max_abs, fabs(json_number_value(json_array_get(probe_vals, k))));
            int32_t argmax = 0;
            for (int32_t v = 1; v < vocab; v++)
                if (row[v] > row[argmax]) argmax = v;
            int32_t want_top = (int32_t)json_integer_value(json_array_get(top_ids, 0));
            if (argmax != want_top)
                fail_msg("%s prompt %zu position %d: top-1 %d (%.6f), transformers %d (%.6f)", name,
                         p_index, i, argmax, row[argmax], want_top, row[want_top]);
            double err_max = 0;
            for (size_t k = 0; k < json_array_size(top_ids); k++) {
                int32_t id = (int32_t)json_integer_value(json_array_get(top_ids, k));
                err_max =
                    fmax(err_max, fabs(row[id] - json_number_value(json_array_get(top_vals, k))));
            }
            for (size_t k = 0; k < json_array_size(probes); k++) {
                int32_t id = (int32_t)json_integer_value(json_array_get(probes, k));
                err_max =
                    fmax(err_max, fabs(row[id] - json_number_value(json_array_get(probe_vals, k))));
            }
            double rel = err_max / max_abs;
            if (rel > worst) worst = rel;
            if (rel > 1e-3)
                fail_msg("%s prompt %zu position %d: max |dlogit| = %.3g = %.3g x max|logit| "
                         "(bound 1e-3)",
                         name, p_index, i, err_max, rel);
            positions++;
        }
        free(logits);
        free(ids);
    }
    printf(
        "golden %s: %d positions, same top-1 everywhere, worst |dlogit| / max|logit| = %.2e (%s)\n",
        name, positions, worst, json_string_value(json_object_get(fx, "generator")));
    gptoss_model_free(model);
    ts_rmtree(dir);
    free(dir);
    json_decref(fx);
}

static void test_sliding_window(void **state) {
    (void)state;
    check_fixture("swa");
}

static void test_yarn(void **state) {
    (void)state;
    check_fixture("yarn");
}

static void test_many_experts_gqa(void **state) {
    (void)state;
    check_fixture("moe");
}

static void test_tiny_preset(void **state) {
    (void)state;
    check_fixture("tiny");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_many_experts_gqa),
        cmocka_unit_test(test_tiny_preset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
