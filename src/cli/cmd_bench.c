/*
 * cmd_bench.c - `gptoss bench`: prefill (pp) and decode (tg) throughput on this GPU, as a
 * llama-bench style markdown table (or JSON), with the decode memory-bandwidth floor.
 *
 * Parses arguments, loads a checkpoint or picks a shape for GPU-generated random weights,
 * and prints what gptoss_cuda_bench measured. Measures nothing itself.
 */
#include "cli.h"
#include "model/config.h"
#include "util/error.h"

#ifdef GPTOSS_WITH_CUDA
#include "backend/cuda/cuda_bench.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out) {
    fprintf(
        out,
        "usage: gptoss bench (-m DIR | --random-weights 20b|120b|tiny|CONFIG.json) [options]\n\n"
        "Measures prefill (pp) and decode (tg) tokens/s of the CUDA backend: CUDA events, one "
        "warm-up,\n"
        "median of repeats. Decode rows also show the memory floor: the bytes a token must move\n"
        "(dense weights, lm_head, 4 experts per layer in MXFP4, KV reads) over the measured "
        "device\n"
        "copy bandwidth, and the %% of it reached.\n\n"
        "options:\n"
        "  -m, --model DIR             a gpt-oss checkpoint folder\n"
        "  --random-weights SHAPE      weights generated on the GPU: 20b, 120b, tiny or a "
        "config.json\n"
        "  -p, --prompt LIST           prompt lengths, e.g. 512,2048 (default 512)\n"
        "  -n, --gen LIST              decode lengths, e.g. 32,128 (default 128)\n"
        "  -d, --depth LIST            KV depths, e.g. 0,4096,8192 (default 0)\n"
        "  -b, --batch LIST            decode batch sizes, e.g. 1,64,128 (default 1): B sequences "
        "at the\n"
        "                              depth, one token and one logit row each per step, as a "
        "loaded\n"
        "                              server runs them; t/s counts all B (KV for B x (depth + "
        "n))\n"
        "  -r, --repeats N             timed repeats per case (default 5)\n"
        "  --json                      JSON instead of a table\n"
        "  --profile                   per-component time split (MoE, attention, GEMMs, ...)\n"
        "  --no-graphs                 decode without CUDA graphs\n"
        "  --device N                  CUDA device (default 0)\n");
    cli_print_fp8_layers_help(out, 30);
    cli_print_kv_cache_dtype_help(out, 30);
}

static bool parse_list(const char *text, int32_t **out, int32_t *n, int32_t lo, int32_t hi) {
    if (!cli_parse_token_list(text, out, n) || *n == 0 || *n > 16) return false;
    for (int32_t i = 0; i < *n; i++)
        if ((*out)[i] < lo || (*out)[i] > hi) return false;
    return true;
}

#ifdef GPTOSS_WITH_CUDA
static void print_table(const char *label, const gptoss_bench_report *r, uint32_t fp8_layers,
                        gptoss_kv_cache_dtype kv_cache_dtype, bool profile) {
    char fp8[64];
    printf("device: %s, measured copy bandwidth %.0f GB/s (read + write)\n", r->device_name,
           r->copy_gb_per_s);
    printf("dense layers in FP8: %s; KV cache: %s\n",
           cli_fp8_layers_name(fp8_layers, fp8, sizeof fp8),
           gptoss_kv_cache_dtype_name(kv_cache_dtype));
    printf("device memory: weights %.2f GiB, workspace %.2f GiB, KV cache %.2f GiB\n\n",
           r->weight_bytes / 1073741824.0, r->workspace_bytes / 1073741824.0,
           r->kv_bytes / 1073741824.0);
    printf("| model | backend | test | t/s | median ms | floor t/s | %% of floor |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < r->n_cases; i++) {
        const gptoss_bench_case *c = &r->cases[i];
        char test[64];
        snprintf(test, sizeof test, "%s%d%s", c->decode ? "tg" : "pp", c->n_tokens, "");
        if (c->decode && c->batch > 1)
            snprintf(test + strlen(test), sizeof test - strlen(test), " x%d", c->batch);
        if (c->depth) snprintf(test + strlen(test), sizeof test - strlen(test), " @ d%d", c->depth);
        if (c->decode)
            printf("| %s | cuda | %s | %.1f | %.2f | %.1f | %.0f%% |\n", label, test,
                   c->tokens_per_s, c->median_ms,
                   (double)c->n_tokens * c->batch / (c->floor_ms * 1e-3),
                   100.0 * c->floor_ms / c->median_ms);
        else
            printf("| %s | cuda | %s | %.1f | %.2f | - | - |\n", label, test, c->tokens_per_s,
                   c->median_ms);
    }
    if (!profile) return;
    printf("\nper-step split in ms (pp: one prefill step; tg: one decode step, of B tokens for "
           "xB):\n\n| test |");
    for (int p = 0; p < GPTOSS_BENCH_N_PARTS; p++)
        printf(" %s |", gptoss_bench_part_names[p]);
    printf("\n| --- |");
    for (int p = 0; p < GPTOSS_BENCH_N_PARTS; p++)
        printf(" ---: |");
    printf("\n");
    for (int i = 0; i < r->n_cases; i++) {
        const gptoss_bench_case *c = &r->cases[i];
        printf("| %s%d%s @ d%d |", c->decode ? "tg" : "pp", c->n_tokens,
               c->decode && c->batch > 1 ? " xB" : "", c->depth);
        for (int p = 0; p < GPTOSS_BENCH_N_PARTS; p++)
            printf(" %.3f |", c->part_ms[p]);
        printf("\n");
    }
}

static void print_json(const char *label, const gptoss_bench_report *r, uint32_t fp8_layers,
                       gptoss_kv_cache_dtype kv_cache_dtype) {
    char fp8[64];
    printf(
        "{\"model\": \"%s\", \"device\": \"%s\", \"copy_gb_per_s\": %.1f, \"fp8_layers\": \"%s\", "
        "\"kv_cache_dtype\": \"%s\", \"weight_bytes\": %.0f, \"workspace_bytes\": %.0f, "
        "\"kv_bytes\": %.0f, "
        "\"results\": [",
        label, r->device_name, r->copy_gb_per_s, cli_fp8_layers_name(fp8_layers, fp8, sizeof fp8),
        gptoss_kv_cache_dtype_name(kv_cache_dtype), r->weight_bytes, r->workspace_bytes,
        r->kv_bytes);
    for (int i = 0; i < r->n_cases; i++) {
        const gptoss_bench_case *c = &r->cases[i];
        printf("%s\n  {\"test\": \"%s\", \"n_tokens\": %d, \"depth\": %d, \"batch\": %d, "
               "\"tokens_per_s\": %.2f, "
               "\"median_ms\": %.4f",
               i ? "," : "", c->decode ? "tg" : "pp", c->n_tokens, c->depth,
               c->decode ? c->batch : 1, c->tokens_per_s, c->median_ms);
        if (c->decode)
            printf(", \"floor_tokens_per_s\": %.2f, \"floor_bytes_per_step\": %.0f",
                   (double)c->n_tokens * c->batch / (c->floor_ms * 1e-3), c->floor_bytes_per_step);
        printf(", \"profile_ms\": {");
        for (int p = 0; p < GPTOSS_BENCH_N_PARTS; p++)
            printf("%s\"%s\": %.4f", p ? ", " : "", gptoss_bench_part_names[p], c->part_ms[p]);
        printf("}}");
    }
    printf("\n]}\n");
}
#endif

int gptoss_cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL, *shape = NULL;
    int32_t *pp = NULL, *tg = NULL, *depth = NULL, *batch = NULL, n_pp = 0, n_tg = 0, n_depth = 0,
            n_batch = 0;
    int64_t repeats = 5, device = 0;
    uint32_t fp8_layers = 0;
    gptoss_kv_cache_dtype kv_cache_dtype = GPTOSS_KV_CACHE_BF16;
    bool json = false, profile = false, graphs = true;
    int rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value)
            model_dir = argv[++i];
        else if (!strcmp(a, "--random-weights") && has_value)
            shape = argv[++i];
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && has_value) {
            free(pp);
            if (!parse_list(argv[++i], &pp, &n_pp, 1, 65536))
                rc = cli_usage_error("bench", "-p needs 1..16 lengths in 1..65536, e.g. 512,2048");
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--gen")) && has_value) {
            free(tg);
            if (!parse_list(argv[++i], &tg, &n_tg, 1, 65536))
                rc = cli_usage_error("bench", "-n needs 1..16 lengths in 1..65536, e.g. 32,128");
        } else if ((!strcmp(a, "-d") || !strcmp(a, "--depth")) && has_value) {
            free(depth);
            if (!parse_list(argv[++i], &depth, &n_depth, 0, 131072))
                rc = cli_usage_error("bench", "-d needs 1..16 depths in 0..131072, e.g. 0,4096");
        } else if ((!strcmp(a, "-b") || !strcmp(a, "--batch")) && has_value) {
            free(batch);
            if (!parse_list(argv[++i], &batch, &n_batch, 1, 1024))
                rc = cli_usage_error("bench", "-b needs 1..16 batch sizes in 1..1024, e.g. 1,64");
        } else if ((!strcmp(a, "-r") || !strcmp(a, "--repeats")) && has_value) {
            if (!cli_parse_i64(argv[++i], 1, 1000, &repeats))
                rc = cli_usage_error("bench", "-r needs a count in 1..1000");
        } else if (!strcmp(a, "--device") && has_value) {
            if (!cli_parse_i64(argv[++i], 0, 64, &device))
                rc = cli_usage_error("bench", "--device needs an ordinal");
        } else if (!strcmp(a, "--fp8-layers") && has_value) {
            if (!cli_parse_fp8_layers(argv[++i], &fp8_layers))
                rc = cli_fp8_layers_usage_error("bench", argv[i]);
        } else if (!strcmp(a, "--kv-cache-dtype") && has_value) {
            if (!cli_parse_kv_cache_dtype(argv[++i], &kv_cache_dtype))
                rc = cli_kv_cache_dtype_usage_error("bench", argv[i]);
        } else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--profile"))
            profile = true;
        else if (!strcmp(a, "--no-graphs"))
            graphs = false;
        else
            rc = cli_usage_error("bench", "unknown or incomplete option '%s'", a);
    }
    if (rc == 0 && !model_dir == !shape)
        rc = cli_usage_error("bench", "give exactly one of -m DIR or --random-weights SHAPE");
    if (rc) {
        free(pp), free(tg), free(depth), free(batch);
        return rc;
    }
#ifndef GPTOSS_WITH_CUDA
    (void)json, (void)profile, (void)graphs, (void)repeats, (void)device, (void)fp8_layers;
    (void)kv_cache_dtype;
    free(pp), free(tg), free(depth), free(batch);
    fprintf(stderr, "gptoss bench: this build has no CUDA backend (configure with -DGPTOSS_CUDA=ON "
                    "on a machine with nvcc)\n");
    return 1;
#else
    static int32_t default_pp[] = {512}, default_tg[] = {128}, default_depth[] = {0};
    gptoss_error err = {0};
    gptoss_config config;
    gptoss_model *model = NULL;
    char label[64];
    if (model_dir) {
        if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) return cli_fail(&err);
        config = *gptoss_model_config(model);
        snprintf(label, sizeof label, "%s", "checkpoint");
    } else {
        if (cli_load_shape(shape, &config, &err) != GPTOSS_OK) {
            free(pp), free(tg), free(depth), free(batch);
            return cli_fail(&err);
        }
        snprintf(label, sizeof label, "%.40s random", shape);
    }
    gptoss_bench_request rq;
    memset(&rq, 0, sizeof rq);
    rq.config = &config;
    rq.model = model;
    rq.pp = pp ? pp : default_pp;
    rq.n_pp = pp ? n_pp : 1;
    rq.tg = tg ? tg : default_tg;
    rq.n_tg = tg ? n_tg : 1;
    rq.depth = depth ? depth : default_depth;
    rq.n_depth = depth ? n_depth : 1;
    rq.batch = batch;
    rq.n_batch = batch ? n_batch : 0;
    rq.repeats = (int32_t)repeats;
    rq.profile = profile;
    rq.use_graphs = graphs;
    rq.device = (int32_t)device;
    rq.fp8_layers = fp8_layers;
    rq.kv_cache_dtype = kv_cache_dtype;
    rq.progress = cli_stderr_is_tty() ? cli_progress : NULL;
    gptoss_bench_report *report = malloc(sizeof *report);
    gptoss_status st = report ? gptoss_cuda_bench(&rq, report, &err)
                              : gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    if (rq.progress) fprintf(stderr, "\n");
    if (st == GPTOSS_OK) {
        if (json)
            print_json(label, report, fp8_layers, kv_cache_dtype);
        else
            print_table(label, report, fp8_layers, kv_cache_dtype, profile);
    }
    free(report);
    free(pp), free(tg), free(depth), free(batch);
    gptoss_model_free(model);
    return st == GPTOSS_OK ? 0 : cli_fail(&err);
#endif
}
