/*
 * cmd_bench.c - `gptoss bench`: prefill (pp) and decode (tg) throughput on this GPU, as a
 * llama-bench style markdown table (or JSON), with the decode memory-bandwidth floor.
 *
 * Parses arguments, loads a checkpoint or picks a shape for GPU-generated random weights,
 * and prints what gptoss_cuda_bench measured. Measures nothing itself.
 */
#include "cli.h"
#include "options.h"
#include "model/config.h"
#include "util/error.h"

#ifdef GPTOSS_WITH_CUDA
#include "backend/cuda/cuda_bench.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(
        out,
        "usage: gptoss bench (-m DIR | --random-weights 20b|120b|tiny|CONFIG.json) [options]\n\n"
        "Measures prefill (pp) and decode (tg) tokens/s of the CUDA backend: CUDA events, one "
        "warm-up,\n"
        "median of repeats. Decode rows also show the memory floor: the bytes a token must move\n"
        "(dense weights, lm_head, 4 experts per layer in MXFP4, KV reads) over the measured "
        "device\n"
        "copy bandwidth, and the %% of it reached.\n"
        "gptoss bench --engine measures decode through the engine instead, with speculative\n"
        "decoding next to none (gptoss bench --engine --help).\n\n"
        "options:\n");
    cli_print_options(out, groups, n_groups, 30);
}

/* A list option (-p, -n, -d, -b): 1..16 integers in [lo, hi]. */
typedef struct list_arg {
    int32_t *ids, n;
    int32_t lo, hi;
    const char *error;
} list_arg;

static int parse_list(const char *cmd, const char *text, void *target) {
    list_arg *l = target;
    free(l->ids);
    l->ids = NULL;
    bool ok = cli_parse_token_list(text, &l->ids, &l->n) && l->n > 0 && l->n <= 16;
    for (int32_t i = 0; ok && i < l->n; i++)
        ok = l->ids[i] >= l->lo && l->ids[i] <= l->hi;
    if (ok) return 0;
    free(l->ids);
    l->ids = NULL;
    return cli_usage_error(cmd, "%s", l->error);
}

#ifdef GPTOSS_WITH_CUDA
static void print_table(const char *label, const gptoss_bench_report *r, uint32_t fp8_layers,
                        gptoss_kv_cache_dtype kv_cache_dtype, bool profile) {
    char fp8[64];
    printf("device: %s, measured copy bandwidth %.0f GB/s (read + write)\n", r->device_name,
           r->copy_gb_per_s);
    printf("dense layers in FP8: %s; KV cache: %s; kernel profile: %s\n",
           cli_fp8_layers_name(fp8_layers, fp8, sizeof fp8),
           gptoss_kv_cache_dtype_name(kv_cache_dtype), r->cuda_profile);
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
        "\"kv_cache_dtype\": \"%s\", \"cuda_profile\": \"%s\", \"weight_bytes\": %.0f, "
        "\"workspace_bytes\": %.0f, \"kv_bytes\": %.0f, "
        "\"results\": [",
        label, r->device_name, r->copy_gb_per_s, cli_fp8_layers_name(fp8_layers, fp8, sizeof fp8),
        gptoss_kv_cache_dtype_name(kv_cache_dtype), r->cuda_profile, r->weight_bytes,
        r->workspace_bytes, r->kv_bytes);
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
    /* --engine: the decode measurement through the engine, with speculative decoding
     * (cmd_bench_engine.c); it takes its own options. */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--engine") == 0) return cli_bench_engine(argc, argv);
    const char *shape = NULL;
    list_arg
        pp = {.lo = 1, .hi = 65536, .error = "-p needs 1..16 lengths in 1..65536, e.g. 512,2048"},
        tg = {.lo = 1, .hi = 65536, .error = "-n needs 1..16 lengths in 1..65536, e.g. 32,128"},
        depth = {.lo = 0, .hi = 131072, .error = "-d needs 1..16 depths in 0..131072, e.g. 0,4096"},
        batch = {.lo = 1, .hi = 1024, .error = "-b needs 1..16 batch sizes in 1..1024, e.g. 1,64"};
    int64_t repeats = 5;
    bool json = false, profile = false, no_graphs = false;
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    shared[0].help = "a gpt-oss checkpoint folder";
    const cli_option own[] = {
        {.name = "random-weights",
         .kind = CLI_STRING,
         .target = &shape,
         .value = "SHAPE",
         .help = "weights generated on the GPU: 20b, 120b, tiny or a config.json"},
        {.name = "prompt",
         .short_name = 'p',
         .kind = CLI_CUSTOM,
         .target = &pp,
         .parse = parse_list,
         .value = "LIST",
         .help = "prompt lengths, e.g. 512,2048 (default 512)"},
        {.name = "gen",
         .short_name = 'n',
         .kind = CLI_CUSTOM,
         .target = &tg,
         .parse = parse_list,
         .value = "LIST",
         .help = "decode lengths, e.g. 32,128 (default 128)"},
        {.name = "depth",
         .short_name = 'd',
         .kind = CLI_CUSTOM,
         .target = &depth,
         .parse = parse_list,
         .value = "LIST",
         .help = "KV depths, e.g. 0,4096,8192 (default 0)"},
        {.name = "batch",
         .short_name = 'b',
         .kind = CLI_CUSTOM,
         .target = &batch,
         .parse = parse_list,
         .value = "LIST",
         .help = "decode batch sizes, e.g. 1,64,128 (default 1): B sequences at the\n"
                 "depth, one token and one logit row each per step, as a loaded\n"
                 "server runs them; t/s counts all B (KV for B x (depth + n))"},
        {.name = "repeats",
         .short_name = 'r',
         .kind = CLI_INT,
         .target = &repeats,
         .value = "N",
         .lo = 1,
         .hi = 1000,
         .help = "timed repeats per case (default 5)",
         .error = "-r needs a count in 1..1000"},
        {.name = "json", .kind = CLI_FLAG, .target = &json, .help = "JSON instead of a table"},
        {.name = "profile",
         .kind = CLI_FLAG,
         .target = &profile,
         .help = "per-component time split (MoE, attention, GEMMs, ...)"},
        {.name = "no-graphs",
         .kind = CLI_FLAG,
         .target = &no_graphs,
         .help = "decode without CUDA graphs"},
    };
    /* The model group less --backend and --threads: bench measures the CUDA backend only. */
    size_t n_own = sizeof own / sizeof own[0]; /* the last 2: for studying the backend */
    const cli_option_group groups[] = {{shared, 1, NULL},
                                       {own, n_own - 2, NULL},
                                       {shared + 3, CLI_MODEL_N_OPTIONS - 3, NULL},
                                       {own + n_own - 2, 2, "\ntesting and measurement:\n"}};
    size_t n_groups = sizeof groups / sizeof groups[0];
    bool want_help;
    int rc = cli_parse_options("bench", argc, argv, groups, n_groups, &want_help);
    if (rc == 0 && want_help) {
        help(stdout, groups, n_groups);
        free(pp.ids), free(tg.ids), free(depth.ids), free(batch.ids);
        return 0;
    }
    const char *model_dir = mo.model_dir;
    if (rc == 0 && !model_dir && !shape)
        rc = cli_usage_error("bench", "missing -m DIR or --random-weights SHAPE (20b, 120b, tiny "
                                      "or a config.json)");
    if (rc == 0 && model_dir && shape)
        rc = cli_usage_error("bench", "give -m DIR or --random-weights SHAPE, not both");
    if (rc == 0 && cli_model_options_resolve(&mo)) rc = 1;
    model_dir = mo.model_dir;
    if (rc) {
        free(pp.ids), free(tg.ids), free(depth.ids), free(batch.ids);
        return rc;
    }
#ifndef GPTOSS_WITH_CUDA
    (void)json, (void)profile, (void)no_graphs, (void)repeats;
    free(pp.ids), free(tg.ids), free(depth.ids), free(batch.ids);
    fprintf(stderr, "gptoss bench: this build has no CUDA backend (configure with -DGPTOSS_CUDA=ON "
                    "on a machine with nvcc)\n");
    return 1;
#else
    static int32_t default_pp[] = {512}, default_tg[] = {128}, default_depth[] = {0};
    gptoss_error err = {0};
    gptoss_config config;
    gptoss_model *model = NULL;
    if (mo.moe_parallel && mo.tensor_parallel <= 1) {
        free(pp.ids), free(tg.ids), free(depth.ids), free(batch.ids);
        return cli_usage_error("bench", "--moe-parallel needs --tensor-parallel-size 2, 4 or 8");
    }
    char label[96];
    if (model_dir) {
        if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) return cli_fail(&err);
        config = *gptoss_model_config(model);
        snprintf(label, sizeof label, "%s", "checkpoint");
    } else {
        if (cli_load_shape(shape, &config, &err) != GPTOSS_OK) {
            free(pp.ids), free(tg.ids), free(depth.ids), free(batch.ids);
            return cli_fail(&err);
        }
        snprintf(label, sizeof label, "%.40s random", shape);
    }
    if (mo.batch_invariant) /* the model column says which mode ran */
        snprintf(label + strlen(label), sizeof label - strlen(label), " batch-invariant");
    gptoss_bench_request rq;
    memset(&rq, 0, sizeof rq);
    rq.config = &config;
    rq.model = model;
    rq.pp = pp.ids ? pp.ids : default_pp;
    rq.n_pp = pp.ids ? pp.n : 1;
    rq.tg = tg.ids ? tg.ids : default_tg;
    rq.n_tg = tg.ids ? tg.n : 1;
    rq.depth = depth.ids ? depth.ids : default_depth;
    rq.n_depth = depth.ids ? depth.n : 1;
    rq.batch = batch.ids;
    rq.n_batch = batch.ids ? batch.n : 0;
    rq.repeats = (int32_t)repeats;
    rq.profile = profile;
    rq.use_graphs = !no_graphs;
    rq.device = (int32_t)mo.device;
    rq.fp8_layers = mo.fp8_layers;
    rq.kv_cache_dtype = mo.kv_cache_dtype;
    rq.cuda_profile = (gptoss_cuda_profile)mo.cuda_profile;
    rq.weights_in_host_memory = mo.weights_in_host_memory;
    rq.batch_invariant = mo.batch_invariant;
    rq.tensor_parallel_size = mo.tensor_parallel > 1 ? (int32_t)mo.tensor_parallel : 1;
    rq.moe_parallel = mo.moe_parallel;
    if (rq.tensor_parallel_size > 1) {
        size_t used = strlen(label);
        snprintf(label + used, sizeof label - used, ", tensor parallel %d%s",
                 (int)rq.tensor_parallel_size, rq.moe_parallel ? ", experts by rows" : "");
    }
    rq.progress = cli_stderr_is_tty() ? cli_progress : NULL;
    gptoss_bench_report *report = malloc(sizeof *report);
    gptoss_status st = report ? gptoss_cuda_bench(&rq, report, &err)
                              : gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    if (rq.progress) fprintf(stderr, "\n");
    if (st == GPTOSS_OK) {
        if (json)
            print_json(label, report, mo.fp8_layers, mo.kv_cache_dtype);
        else
            print_table(label, report, mo.fp8_layers, mo.kv_cache_dtype, profile);
    }
    free(report);
    free(pp.ids), free(tg.ids), free(depth.ids), free(batch.ids);
    gptoss_model_free(model);
    return st == GPTOSS_OK ? 0 : cli_fail(&err);
#endif
}
