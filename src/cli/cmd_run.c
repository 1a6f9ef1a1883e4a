/*
 * cmd_run.c - `gptoss run`: generation for one prompt of token ids, through the engine (the
 * server's sampler and stop tokens), with an optional dump of every prompt position's logits
 * so others can check the model independently. A text prompt (-p TEXT) is handed to
 * cli_run_text (cmd_chat.c), which renders it as a chat and streams decoded text; this file
 * keeps the ids-in, ids-out path.
 */
#include "chat/chat.h"
#include "cli.h"
#include "gptoss_engine.h"
#include "engine/kv_plan.h"
#include "util/clock.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out) {
    fprintf(
        out,
        "usage: gptoss run -m DIR --tokens \"ID ID ...\" [-n N] [options]\n"
        "       gptoss run -m DIR -p TEXT [options]   (a chat prompt; see gptoss run -p x "
        "--help)\n\n"
        "Runs the prompt through the model and generates (greedily unless --temperature),\n"
        "printing generated token ids.\n\n"
        "options:\n"
        "  -m, --model DIR       Hugging Face gpt-oss folder (config.json, tokenizer.json, "
        "safetensors)\n"
        "  --tokens IDS          prompt token ids, separated by spaces or commas\n"
        "  -n, --max-tokens N    tokens to generate (default 16; 0 = prompt only)\n"
        "  --logits FILE         write the logits of every prompt position: one JSON header line\n"
        "                        {\"shape\":[n_tokens,vocab],\"dtype\":\"float32\",...} then "
        "float32\n"
        "                        little-endian, row-major\n"
        "  --ignore-eos          do not stop at <|return|>, <|call|> or <|endoftext|> (a model\n"
        "                        without them: its config's eos id)\n"
        "  --temperature T       sampling temperature (default 0: greedy)\n"
        "  --top-p P             nucleus sampling mass (default 1)\n"
        "  --seed S              seed of the sampler (default: a fresh one each run)\n"
        "  --backend cpu|cuda    compute backend (default: cuda when built with it, else cpu)\n"
        "  -t, --threads N       CPU threads (default: all cores)\n"
        "  --chunk N             prefill the prompt in chunks of N tokens (default: all at once)\n"
        "  --stats               print each layer's residual statistics and the logit spread\n"
        "                        (CPU backend), to check a model is numerically healthy\n");
    cli_print_fp8_layers_help(out, 24);
    cli_print_kv_cache_dtype_help(out, 24);
}

/* Spread of one logits row: a model whose logits are flat (all equal) is broken even if finite. */
static void print_logit_stats(const float *row, int32_t vocab) {
    double mean = 0, sq = 0, max = -INFINITY, z = 0, entropy = 0;
    int32_t n_bad = 0;
    for (int32_t v = 0; v < vocab; v++) {
        if (!isfinite(row[v])) n_bad++;
        mean += row[v], sq += (double)row[v] * row[v];
        if (row[v] > max) max = row[v];
    }
    mean /= vocab;
    for (int32_t v = 0; v < vocab; v++)
        z += exp(row[v] - max);
    for (int32_t v = 0; v < vocab; v++) {
        double p = exp(row[v] - max) / z;
        if (p > 0) entropy -= p * log(p);
    }
    fprintf(stderr,
            "last position logits: mean %.4g, std %.4g, max %.4g, softmax entropy %.3f nats "
            "(uniform: %.3f), "
            "%d non-finite\n",
            mean, sqrt(sq / vocab - mean * mean), max, entropy, log((double)vocab), n_bad);
}

/* Runs the prompt through the backend directly, in chunks of `chunk` tokens, for what only a
 * whole-prompt forward gives: every position's logits (written to logits_file) and the last
 * row (left in last, for --stats). The engine recomputes the prompt when it generates. */
static gptoss_status prefill_logits(gptoss_backend *backend, const gptoss_backend_options *bo,
                                    const int32_t *prompt, int32_t n_prompt, int32_t chunk,
                                    int32_t vocab, FILE *logits_file, const char *logits_path,
                                    float *last, gptoss_error *err) {
    int32_t step = chunk > 0 ? chunk : n_prompt;
    int32_t max_rows = logits_file ? step : 1;
    float *logits = malloc((size_t)max_rows * vocab * sizeof *logits);
    int32_t *block_table = malloc((size_t)bo->n_kv_blocks * sizeof *block_table);
    int32_t *positions = malloc((size_t)step * sizeof *positions);
    int32_t *logit_index = malloc((size_t)step * sizeof *logit_index);
    gptoss_status st = GPTOSS_OK;
    if (!logits || !block_table || !positions || !logit_index)
        st = gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t b = 0; !st && b < bo->n_kv_blocks; b++)
        block_table[b] = b;
    for (int32_t begin = 0; !st && begin < n_prompt; begin += step) {
        int32_t len = n_prompt - begin < step ? n_prompt - begin : step;
        int32_t n_logits = 0;
        for (int32_t i = 0; i < len; i++) {
            positions[i] = begin + i;
            if (logits_file || begin + i == n_prompt - 1) logit_index[n_logits++] = i;
        }
        int32_t starts[2] = {0, len}, cached = begin;
        gptoss_batch_plan plan = {.n_tokens = len,
                                  .token_ids = prompt + begin,
                                  .positions = positions,
                                  .n_seqs = 1,
                                  .seq_token_start = starts,
                                  .seq_n_cached = &cached,
                                  .max_blocks_per_seq = bo->n_kv_blocks,
                                  .block_tables = block_table,
                                  .n_logits = n_logits,
                                  .logit_token_index = logit_index};
        if ((st = gptoss_backend_forward(backend, &plan, logits, err))) break;
        size_t n_values = (size_t)n_logits * vocab;
        if (logits_file && fwrite(logits, sizeof *logits, n_values, logits_file) != n_values)
            st = gptoss_set_error(err, GPTOSS_ERR_IO, "%s: write failed", logits_path);
        if (n_logits > 0 && begin + len == n_prompt)
            memcpy(last, logits + (size_t)(n_logits - 1) * vocab, (size_t)vocab * sizeof *last);
    }
    free(logit_index), free(positions), free(block_table), free(logits);
    return st;
}

static bool print_token(void *user, const gptoss_engine_event *event) {
    int32_t *n_printed = user;
    printf("%s%d", *n_printed ? " " : "", event->token_id);
    fflush(stdout);
    (*n_printed)++;
    return true;
}

/* Generates after the prompt through an engine of one sequence on `backend`. */
static gptoss_status generate_ids(const gptoss_config *c, gptoss_backend *backend,
                                  const gptoss_backend_options *bo, const int32_t *prompt,
                                  int32_t n_prompt, int32_t chunk,
                                  const gptoss_sampling_params *params,
                                  gptoss_generate_result *result, gptoss_error *err) {
    gptoss_engine_options eo = gptoss_engine_options_default();
    eo.max_model_len = n_prompt + params->max_tokens;
    gptoss_engine_options_for_backend(&eo, c, backend, bo);
    int32_t stop_ids[GPTOSS_CHAT_MAX_STOP_IDS];
    gptoss_engine_options_set_eos(&eo, stop_ids, gptoss_chat_stop_ids(stop_ids));
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = chunk > 0 ? chunk : n_prompt; /* the prompt in one step */
    eo.enable_prefix_cache = false;
    gptoss_engine *engine = NULL;
    gptoss_status st = gptoss_engine_create(&eo, &engine, err);
    if (!st) st = gptoss_engine_start(engine, err);
    int32_t n_printed = 0;
    gptoss_generate_options go = {.on_token = print_token, .user = &n_printed};
    if (!st) st = gptoss_engine_generate(engine, prompt, n_prompt, params, &go, result, err);
    gptoss_engine_free(engine);
    return st;
}

int gptoss_cmd_run(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_text = NULL, *logits_path = NULL, *backend_name = NULL;
    int64_t max_tokens = 16, threads = 0, chunk = 0, seed = -1;
    double temperature = 0, top_p = 1;
    uint32_t fp8_layers = 0;
    gptoss_kv_cache_dtype kv_cache_dtype = GPTOSS_KV_CACHE_BF16;
    bool ignore_eos = false, stats = false;
    for (int i = 1; i < argc; i++) /* a text prompt: the chat path */
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) return cli_run_text(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value)
            model_dir = argv[++i];
        else if (!strcmp(a, "--tokens") && has_value)
            tokens_text = argv[++i];
        else if (!strcmp(a, "--logits") && has_value)
            logits_path = argv[++i];
        else if (!strcmp(a, "--backend") && has_value)
            backend_name = argv[++i];
        else if (!strcmp(a, "--ignore-eos"))
            ignore_eos = true;
        else if (!strcmp(a, "--stats"))
            stats = true;
        else if ((!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) && has_value) {
            if (!cli_parse_i64(argv[++i], 0, 1 << 20, &max_tokens))
                return cli_usage_error("run", "-n needs an integer in [0, 1048576]");
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has_value) {
            if (!cli_parse_i64(argv[++i], 1, 4096, &threads))
                return cli_usage_error("run", "--threads needs a positive integer");
        } else if (!strcmp(a, "--chunk") && has_value) {
            if (!cli_parse_i64(argv[++i], 1, 1 << 20, &chunk))
                return cli_usage_error("run", "--chunk needs a positive integer");
        } else if (!strcmp(a, "--temperature") && has_value) {
            char *end;
            temperature = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(temperature >= 0 && temperature <= 10))
                return cli_usage_error("run", "--temperature needs a number in [0, 10]");
        } else if (!strcmp(a, "--top-p") && has_value) {
            char *end;
            top_p = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(top_p > 0 && top_p <= 1))
                return cli_usage_error("run", "--top-p needs a number in (0, 1]");
        } else if (!strcmp(a, "--seed") && has_value) {
            if (!cli_parse_i64(argv[++i], 0, INT64_MAX, &seed))
                return cli_usage_error("run", "--seed needs a non-negative integer");
        } else if (!strcmp(a, "--fp8-layers") && has_value) {
            if (!cli_parse_fp8_layers(argv[++i], &fp8_layers))
                return cli_fp8_layers_usage_error("run", argv[i]);
        } else if (!strcmp(a, "--kv-cache-dtype") && has_value) {
            if (!cli_parse_kv_cache_dtype(argv[++i], &kv_cache_dtype))
                return cli_kv_cache_dtype_usage_error("run", argv[i]);
        } else
            return cli_usage_error("run", "unknown or incomplete option '%s'", a);
    }
    if (!model_dir)
        return cli_usage_error(
            "run", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    if (!tokens_text) return cli_usage_error("run", "missing --tokens");
    int32_t *prompt = NULL, n_prompt = 0;
    if (!cli_parse_token_list(tokens_text, &prompt, &n_prompt) || n_prompt == 0) {
        free(prompt);
        return cli_usage_error("run", "--tokens must be a non-empty list of non-negative integers");
    }

    gptoss_error err = {0};
    gptoss_model *model = NULL;
    gptoss_backend *backend = NULL;
    float *last = NULL;
    FILE *logits_file = NULL;
    int rc = 1;
    if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) goto fail;
    const gptoss_config *c = gptoss_model_config(model);

    gptoss_backend_options options = gptoss_backend_options_default();
    options.kind = gptoss_has_cuda() ? GPTOSS_BACKEND_CUDA : GPTOSS_BACKEND_CPU;
    if (backend_name) {
        if (!strcmp(backend_name, "cpu"))
            options.kind = GPTOSS_BACKEND_CPU;
        else if (!strcmp(backend_name, "cuda"))
            options.kind = GPTOSS_BACKEND_CUDA;
        else {
            rc = cli_usage_error("run", "--backend must be cpu or cuda");
            goto done;
        }
    }
    if (cli_check_fp8_layers("run", fp8_layers, options.kind)) {
        rc = 2;
        goto done;
    }
    options.fp8_layers = fp8_layers;
    options.kv_cache_dtype = kv_cache_dtype;
    options.n_threads = (int32_t)threads;
    options.testing.layer_stats = stats;
    options.progress = cli_progress;
    gptoss_kv_plan_context(c, n_prompt + max_tokens, &options);
    if (gptoss_backend_create(model, &options, &backend, &err) != GPTOSS_OK) goto fail;
    options = gptoss_backend_get_options(backend);

    int32_t vocab = c->vocab_size;
    if (logits_path) {
        logits_file = fopen(logits_path, "wb");
        if (!logits_file) {
            gptoss_set_error(&err, GPTOSS_ERR_IO, "%s: cannot create", logits_path);
            goto fail;
        }
        fprintf(logits_file,
                "{\"shape\":[%d,%d],\"dtype\":\"float32\",\"order\":\"row-major\",\"endian\":"
                "\"little\"}\n",
                n_prompt, vocab);
    }

    /* The prompt alone, when the engine cannot give what is asked of it: every position's
     * logits, the last position's spread, or no generation at all. */
    double t0 = gptoss_now_seconds(), prompt_seconds = -1;
    if (logits_path || stats || max_tokens == 0) {
        if (!(last = malloc((size_t)vocab * sizeof *last))) {
            gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        if (prefill_logits(backend, &options, prompt, n_prompt, (int32_t)chunk, vocab, logits_file,
                           logits_path, last, &err) != GPTOSS_OK)
            goto fail;
        prompt_seconds = gptoss_now_seconds() - t0;
    }
    if (logits_file) {
        int closed = fclose(logits_file);
        logits_file = NULL;
        if (closed != 0) {
            gptoss_set_error(&err, GPTOSS_ERR_IO, "%s: write failed", logits_path);
            goto fail;
        }
    }
    if (stats) print_logit_stats(last, vocab);

    gptoss_generate_result result = {0};
    if (max_tokens > 0) {
        gptoss_sampling_params params = gptoss_sampling_params_default();
        params.temperature = (float)temperature;
        params.top_p = (float)top_p;
        params.has_seed = seed >= 0;
        params.seed = seed >= 0 ? (uint64_t)seed : 0;
        params.max_tokens = (int32_t)max_tokens;
        params.ignore_eos = ignore_eos;
        if (generate_ids(c, backend, &options, prompt, n_prompt, (int32_t)chunk, &params, &result,
                         &err) != GPTOSS_OK)
            goto fail;
        printf("\n");
    }
    /* Without a prompt pass of its own, the prompt's time is the engine's time to the first
     * token; generation is the rest. */
    double gen_seconds = result.seconds - result.first_token_seconds;
    if (prompt_seconds < 0) prompt_seconds = result.first_token_seconds;
    int32_t n_generated = result.n_generated;
    fprintf(stderr,
            "backend %s: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s "
            "(%.2f tok/s)\n",
            gptoss_backend_name(backend), n_prompt, prompt_seconds,
            n_prompt / (prompt_seconds > 0 ? prompt_seconds : 1e-9), n_generated, gen_seconds,
            n_generated > 1 ? (n_generated - 1) / (gen_seconds > 0 ? gen_seconds : 1e-9) : 0.0);
    rc = 0;
    goto done;
fail:
    rc = cli_fail(&err);
done:
    if (logits_file) fclose(logits_file);
    free(last), free(prompt);
    gptoss_backend_free(backend);
    gptoss_model_free(model);
    return rc;
}
