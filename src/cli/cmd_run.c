/*
 * cmd_run.c - `gptoss run`: generation for one prompt of token ids, through the engine (the
 * server's sampler and stop tokens), with an optional dump of every prompt position's logits
 * so others can check the model independently. A text prompt (-p TEXT) is handed to
 * cli_run_text (cmd_chat.c), which renders it as a chat and streams decoded text; this file
 * keeps the ids-in, ids-out path.
 */
#include "chat/chat.h"
#include "cli.h"
#include "options.h"
#include "draft_options.h"
#include "gptoss_engine.h"
#include "engine/kv_plan.h"
#include "util/clock.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out,
            "usage: gptoss run -m DIR -p TEXT [options]              a chat prompt, reply as text\n"
            "       gptoss run -m DIR --tokens \"ID ID ...\" [options]  token ids in, ids out\n\n"
            "With -p, TEXT is rendered as a one-turn chat (harmony: the default system message,\n"
            "TEXT as the user message) and the reply is printed as it is generated: the\n"
            "reasoning (dimmed on a terminal, prefixed [reasoning] otherwise), then the answer\n"
            "([answer]). With --tokens, the ids run as they are and the generated ids are\n"
            "printed; --logits dumps every prompt position. Both decode greedily unless\n"
            "--temperature, and stop at <|return|>, <|call|> or <|endoftext|>, as the server\n"
            "does.\n\n"
            "model and backend (both modes):\n");
    cli_print_options(out, groups, 1, 24);
    cli_print_options(out, groups + 2, 1, 24);
    fprintf(out, "\ntext prompt (-p TEXT):\n");
    cli_run_text_print_options(out, 24);
    fprintf(out, "\ntoken ids (--tokens IDS):\n");
    cli_print_options(out, groups + 1, 1, 24);
    cli_print_options(out, groups + 3, n_groups - 3, 24);
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
                                  const cli_draft_options *draft, gptoss_generate_result *result,
                                  gptoss_error *err) {
    gptoss_engine_options eo = gptoss_engine_options_default();
    eo.max_model_len = n_prompt + params->max_tokens;
    gptoss_engine_options_for_backend(&eo, c, backend, bo);
    int32_t stop_ids[GPTOSS_CHAT_MAX_STOP_IDS];
    gptoss_engine_options_set_eos(&eo, stop_ids, gptoss_chat_stop_ids(stop_ids));
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = chunk > 0 ? chunk : n_prompt; /* the prompt in one step */
    if (eo.max_num_batched_tokens < 1 + GPTOSS_MAX_SPECULATIVE_TOKENS)
        eo.max_num_batched_tokens = 1 + GPTOSS_MAX_SPECULATIVE_TOKENS; /* room for drafts */
    eo.enable_prefix_cache = false;
    cli_draft_options_apply(draft, &eo);
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
    const char *tokens_text = NULL, *logits_path = NULL;
    int64_t max_tokens = 16, chunk = 0, seed = -1;
    double temperature = 0, top_p = 1;
    bool ignore_eos = false, stats = false;
    cli_model_options mo = cli_model_options_default();
    for (int i = 1; i < argc; i++) /* a text prompt: the chat path */
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) return cli_run_text(argc, argv);
    const cli_option own[] = {
        {.name = "tokens",
         .kind = CLI_STRING,
         .target = &tokens_text,
         .value = "IDS",
         .help = "prompt token ids, separated by spaces or commas"},
        {.name = "max-tokens",
         .short_name = 'n',
         .kind = CLI_INT,
         .target = &max_tokens,
         .value = "N",
         .lo = 0,
         .hi = 1 << 20,
         .help = "tokens to generate (default 16; 0 = prompt only)",
         .error = "-n needs an integer in [0, 1048576]"},
        {.name = "ignore-eos",
         .kind = CLI_FLAG,
         .target = &ignore_eos,
         .help = "do not stop at <|return|>, <|call|> or <|endoftext|> (a model\n"
                 "without them: its config's eos id)"},
        {.name = "temperature",
         .kind = CLI_DOUBLE,
         .target = &temperature,
         .value = "T",
         .dlo = 0,
         .dhi = 10,
         .help = "sampling temperature (default 0: greedy)",
         .error = "--temperature needs a number in [0, 10]"},
        {.name = "top-p",
         .kind = CLI_DOUBLE,
         .target = &top_p,
         .value = "P",
         .dlo = 0,
         .dhi = 1,
         .lo_open = true,
         .help = "nucleus sampling mass (default 1)",
         .error = "--top-p needs a number in (0, 1]"},
        {.name = "seed",
         .kind = CLI_INT,
         .target = &seed,
         .value = "S",
         .lo = 0,
         .hi = INT64_MAX,
         .help = "seed of the sampler (default: a fresh one each run)",
         .error = "--seed needs a non-negative integer"},
        {.name = "logits",
         .kind = CLI_STRING,
         .target = &logits_path,
         .value = "FILE",
         .help = "write the logits of every prompt position: one JSON header line\n"
                 "{\"shape\":[n_tokens,vocab],\"dtype\":\"float32\",...} then float32\n"
                 "little-endian, row-major"},
        {.name = "chunk",
         .kind = CLI_INT,
         .target = &chunk,
         .value = "N",
         .lo = 1,
         .hi = 1 << 20,
         .help = "prefill the prompt in chunks of N tokens (default: all at once)",
         .error = "--chunk needs a positive integer"},
        {.name = "stats",
         .kind = CLI_FLAG,
         .target = &stats,
         .help = "print each layer's residual statistics and the logit spread\n"
                 "(CPU backend), to check a model is numerically healthy"},
    };
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    cli_draft_options draft = cli_draft_options_default();
    cli_option draft_table[CLI_DRAFT_N_OPTIONS];
    cli_draft_option_table(&draft, false, draft_table);
    size_t n_own = sizeof own / sizeof own[0];            /* the last 3: for checking a model */
    const cli_option_group groups[] = {{shared, 1, NULL}, /* -m first */
                                       {own, n_own - 3, NULL},
                                       {shared + 1, CLI_MODEL_N_OPTIONS - 1, NULL},
                                       {draft_table, CLI_DRAFT_N_OPTIONS, NULL},
                                       {own + n_own - 3, 3, "\ntesting and measurement:\n"}};
    bool want_help = false;
    int usage = cli_parse_options("run", argc, argv, groups, 5, &want_help);
    if (usage) return usage;
    if (want_help) {
        help(stdout, groups, 5);
        return 0;
    }
    if (!mo.model_dir)
        return cli_usage_error(
            "run", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    if (!tokens_text) return cli_usage_error("run", "missing --tokens (or -p TEXT)");
    gptoss_backend_options options = gptoss_backend_options_default();
    int apply_rc = cli_model_options_apply("run", &mo, &options);
    if (apply_rc) return apply_rc;
    if (cli_model_options_resolve(&mo)) return 1;
    const char *model_dir = mo.model_dir;
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
        if (generate_ids(c, backend, &options, prompt, n_prompt, (int32_t)chunk, &params, &draft,
                         &result, &err) != GPTOSS_OK)
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
