/*
 * cmd_run.c - `gptoss run`: greedy generation for one prompt of token ids, with an optional
 * dump of every prompt position's logits so others can check the model independently.
 * A text prompt (-p TEXT) is handed to cli_run_text (cmd_chat.c), which renders it as a chat
 * and streams decoded text; this file keeps the ids-in, ids-out path.
 */
#include "cli.h"
#include "model/config.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out) {
    fprintf(out,
            "usage: gptoss run -m DIR --tokens \"ID ID ...\" [-n N] [options]\n"
            "       gptoss run -m DIR -p TEXT [options]   (a chat prompt; see gptoss run -p x --help)\n\n"
            "Runs the prompt through the model and generates greedily, printing generated token ids.\n\n"
            "options:\n"
            "  -m, --model DIR       Hugging Face gpt-oss folder (config.json, tokenizer.json, safetensors)\n"
            "  --tokens IDS          prompt token ids, separated by spaces or commas\n"
            "  -n, --max-tokens N    tokens to generate (default 16; 0 = prompt only)\n"
            "  --logits FILE         write the logits of every prompt position: one JSON header line\n"
            "                        {\"shape\":[n_tokens,vocab],\"dtype\":\"float32\",...} then float32\n"
            "                        little-endian, row-major\n"
            "  --ignore-eos          do not stop at <|return|>, <|call|> or the config's eos id\n"
            "  --backend cpu|cuda    compute backend (default: cuda when built with it, else cpu)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  --chunk N             prefill the prompt in chunks of N tokens (default: all at once)\n"
            "  --stats               print each layer's residual statistics and the logit spread\n"
            "                        (CPU backend), to check a model is numerically healthy\n");
    cli_print_fp8_layers_help(out, 24);
    cli_print_kv_cache_dtype_help(out, 24);
}

static gptoss_status write_logits_header(FILE *f, int32_t rows, int32_t vocab) {
    fprintf(f, "{\"shape\":[%d,%d],\"dtype\":\"float32\",\"order\":\"row-major\",\"endian\":\"little\"}\n", rows, vocab);
    return GPTOSS_OK;
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
    for (int32_t v = 0; v < vocab; v++) z += exp(row[v] - max);
    for (int32_t v = 0; v < vocab; v++) {
        double p = exp(row[v] - max) / z;
        if (p > 0) entropy -= p * log(p);
    }
    fprintf(stderr, "last position logits: mean %.4g, std %.4g, max %.4g, softmax entropy %.3f nats (uniform: %.3f), "
                    "%d non-finite\n",
            mean, sqrt(sq / vocab - mean * mean), max, entropy, log((double)vocab), n_bad);
}

static bool is_stop(const gptoss_config *c, int32_t id) {
    return id == c->eos_token_id || (c->vocab_size > 200012 && (id == 200002 || id == 200012));
}

int gptoss_cmd_run(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_text = NULL, *logits_path = NULL, *backend_name = NULL;
    int64_t max_tokens = 16, threads = 0, chunk = 0;
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
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) model_dir = argv[++i];
        else if (!strcmp(a, "--tokens") && has_value) tokens_text = argv[++i];
        else if (!strcmp(a, "--logits") && has_value) logits_path = argv[++i];
        else if (!strcmp(a, "--backend") && has_value) backend_name = argv[++i];
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--stats")) stats = true;
        else if ((!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) && has_value) {
            if (!cli_parse_i64(argv[++i], 0, 1 << 20, &max_tokens)) return cli_usage_error("run", "-n needs an integer in [0, 1048576]");
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has_value) {
            if (!cli_parse_i64(argv[++i], 1, 4096, &threads)) return cli_usage_error("run", "--threads needs a positive integer");
        } else if (!strcmp(a, "--chunk") && has_value) {
            if (!cli_parse_i64(argv[++i], 1, 1 << 20, &chunk)) return cli_usage_error("run", "--chunk needs a positive integer");
        } else if (!strcmp(a, "--fp8-layers") && has_value) {
            if (!cli_parse_fp8_layers(argv[++i], &fp8_layers)) return cli_fp8_layers_usage_error("run", argv[i]);
        } else if (!strcmp(a, "--kv-cache-dtype") && has_value) {
            if (!cli_parse_kv_cache_dtype(argv[++i], &kv_cache_dtype))
                return cli_kv_cache_dtype_usage_error("run", argv[i]);
        } else
            return cli_usage_error("run", "unknown or incomplete option '%s'", a);
    }
    if (!model_dir) return cli_usage_error("run", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    if (!tokens_text) return cli_usage_error("run", "missing --tokens");
    int32_t *prompt = NULL, n_prompt = 0;
    if (!cli_parse_token_list(tokens_text, &prompt, &n_prompt) || n_prompt == 0) {
        free(prompt);
        return cli_usage_error("run", "--tokens must be a non-empty list of non-negative integers");
    }

    gptoss_error err = {0};
    gptoss_model *model = NULL;
    gptoss_backend *backend = NULL;
    float *logits = NULL;
    int32_t *block_table = NULL, *positions = NULL, *logit_index = NULL, *ids = NULL;
    FILE *logits_file = NULL;
    int rc = 1;
    if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) goto fail;
    const gptoss_config *c = gptoss_model_config(model);

    gptoss_backend_options options = gptoss_backend_options_default();
    options.kind = gptoss_has_cuda() ? GPTOSS_BACKEND_CUDA : GPTOSS_BACKEND_CPU;
    if (backend_name) {
        if (!strcmp(backend_name, "cpu")) options.kind = GPTOSS_BACKEND_CPU;
        else if (!strcmp(backend_name, "cuda")) options.kind = GPTOSS_BACKEND_CUDA;
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
    options.layer_stats = stats;
    options.progress = cli_progress;
    int64_t total = n_prompt + max_tokens;
    int32_t block_size = options.kv_block_size;
    options.n_kv_blocks = (int32_t)((total + block_size - 1) / block_size);
    if (gptoss_backend_create(model, &options, &backend, &err) != GPTOSS_OK) goto fail;

    int32_t vocab = c->vocab_size;
    int32_t max_rows = logits_path ? n_prompt : 1;
    logits = malloc((size_t)max_rows * vocab * sizeof *logits);
    block_table = malloc((size_t)options.n_kv_blocks * sizeof *block_table);
    positions = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *positions);
    logit_index = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *logit_index);
    ids = malloc((size_t)total * sizeof *ids);
    if (!logits || !block_table || !positions || !logit_index || !ids) {
        gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (int32_t b = 0; b < options.n_kv_blocks; b++) block_table[b] = b;
    memcpy(ids, prompt, (size_t)n_prompt * sizeof *ids);
    if (logits_path) {
        logits_file = fopen(logits_path, "wb");
        if (!logits_file) {
            gptoss_set_error(&err, GPTOSS_ERR_IO, "%s: cannot create", logits_path);
            goto fail;
        }
        write_logits_header(logits_file, n_prompt, vocab);
    }

    /* Prefill, in chunks if asked. Logits: every position with --logits, else the last. */
    double t0 = cli_now_seconds();
    int32_t step = chunk > 0 ? (int32_t)chunk : n_prompt;
    for (int32_t begin = 0; begin < n_prompt; begin += step) {
        int32_t len = n_prompt - begin < step ? n_prompt - begin : step;
        int32_t n_logits = 0;
        for (int32_t i = 0; i < len; i++) {
            positions[i] = begin + i;
            if (logits_path || begin + i == n_prompt - 1) logit_index[n_logits++] = i;
        }
        int32_t starts[2] = {0, len}, cached = begin;
        gptoss_batch_plan plan = {.n_tokens = len, .token_ids = ids + begin, .positions = positions, .n_seqs = 1,
                                  .seq_token_start = starts, .seq_n_cached = &cached,
                                  .max_blocks_per_seq = options.n_kv_blocks, .block_tables = block_table,
                                  .n_logits = n_logits, .logit_token_index = logit_index};
        if (gptoss_backend_forward(backend, &plan, logits, &err) != GPTOSS_OK) goto fail;
        if (logits_file && fwrite(logits, sizeof *logits, (size_t)n_logits * vocab, logits_file) != (size_t)n_logits * vocab) {
            gptoss_set_error(&err, GPTOSS_ERR_IO, "%s: write failed", logits_path);
            goto fail;
        }
        if (logits_path && begin + len == n_prompt) /* keep the last row where decoding expects it */
            memmove(logits, logits + (size_t)(n_logits - 1) * vocab, (size_t)vocab * sizeof *logits);
    }
    double t1 = cli_now_seconds();
    if (logits_file) {
        if (fclose(logits_file) != 0) {
            logits_file = NULL;
            gptoss_set_error(&err, GPTOSS_ERR_IO, "%s: write failed", logits_path);
            goto fail;
        }
        logits_file = NULL;
    }

    if (stats) print_logit_stats(logits, vocab);

    /* Greedy decode. */
    int32_t n_generated = 0;
    for (int64_t g = 0; g < max_tokens; g++) {
        int32_t best = 0;
        for (int32_t v = 1; v < vocab; v++)
            if (logits[v] > logits[best]) best = v;
        ids[n_prompt + n_generated++] = best;
        printf("%s%d", g ? " " : "", best);
        fflush(stdout);
        if (!ignore_eos && is_stop(c, best)) break;
        if (g + 1 == max_tokens) break;
        int32_t pos = n_prompt + n_generated - 1, starts[2] = {0, 1}, zero = 0;
        gptoss_batch_plan plan = {.n_tokens = 1, .token_ids = &ids[pos], .positions = &pos, .n_seqs = 1,
                                  .seq_token_start = starts, .seq_n_cached = &pos,
                                  .max_blocks_per_seq = options.n_kv_blocks, .block_tables = block_table,
                                  .n_logits = 1, .logit_token_index = &zero};
        if (gptoss_backend_forward(backend, &plan, logits, &err) != GPTOSS_OK) goto fail;
    }
    if (max_tokens > 0) printf("\n");
    double t2 = cli_now_seconds();
    fprintf(stderr, "backend %s: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.2f tok/s)\n",
            gptoss_backend_name(backend), n_prompt, t1 - t0, n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_generated,
            t2 - t1, n_generated > 1 ? (n_generated - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
    rc = 0;
    goto done;
fail:
    rc = cli_fail(&err);
done:
    if (logits_file) fclose(logits_file);
    free(ids), free(logit_index), free(positions), free(block_table), free(logits), free(prompt);
    gptoss_backend_free(backend);
    gptoss_model_free(model);
    return rc;
}
