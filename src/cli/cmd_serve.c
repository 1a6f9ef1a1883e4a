/*
 * cmd_serve.c - `gptoss serve`: the OpenAI-compatible HTTP server.
 *
 * Owns: the serve command line, the order of start-up (listen first so /health can say 503
 * while weights load, then model, tokenizer, backend, engine, ready) and the SIGTERM drain.
 * KV sizing is engine/kv_plan.c's; the HTTP work itself is src/server. This file must stay a
 * thin driver.
 */
#include "cli.h"
#include "options.h"

#include "chat/chat.h"
#include "gptoss_engine.h"
#include "engine/kv_plan.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) {
    stop_signal = sig;
}

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out, "usage: gptoss serve (-m DIR | --random-weights SHAPE) [options]\n\n"
                 "Serves the model over an OpenAI-compatible HTTP API: POST /v1/chat/completions,\n"
                 "POST /v1/responses, POST /v1/completions, GET /v1/models, GET /health,\n"
                 "GET /metrics (Prometheus).\n\n"
                 "options:\n");
    cli_print_options(out, groups, n_groups, 33);
}

static void print_progress(void *user, const char *what, double fraction) {
    cli_progress(user, what, fraction);
}

/* What the pages hold, for the start-up line (no commas: scripts cut the line at the first). */
static const char *kv_format(const gptoss_backend_options *bo) {
    bool fp8 = bo->kv_cache_dtype == GPTOSS_KV_CACHE_FP8;
    if (bo->kind == GPTOSS_BACKEND_CPU) return fp8 ? "fp8 emulated in fp32 pages" : "fp32";
    return fp8 ? "fp8 e4m3 + scales" : "bf16";
}

int gptoss_cmd_serve(int argc, char **argv) {
    const char *served_name = NULL, *shape = NULL, *tokenizer_path = NULL;
    gptoss_server_options so = gptoss_server_options_default();
    int64_t max_num_seqs = 0, max_batched = 2048, kv_blocks = 0, max_queue = 1024,
            max_body = (int64_t)so.max_body_bytes, port = so.port, drain_s = 60, max_model_len = 0,
            idle_s = so.connection_timeout_s, admit_headroom = -1,
            store_bytes = (int64_t)so.responses_store_bytes;
    double memory_fraction = 0;
    bool no_prefix_cache = false;
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    shared[0].help = "Hugging Face gpt-oss folder (make a tiny one with\n"
                     "`gptoss make-model --preset tiny -o DIR`)";
    const cli_option own[] = {
        {.name = "tokenizer",
         .kind = CLI_STRING,
         .target = &tokenizer_path,
         .value = "PATH",
         .help = "tokenizer.json or its folder (default: the model's;\n"
                 "with --random-weights: the installed gpt-oss one)"},
        {.name = "host",
         .kind = CLI_STRING,
         .target = &so.host,
         .value = "ADDR",
         .help = "listen address (default 127.0.0.1)"},
        {.name = "port",
         .kind = CLI_INT,
         .target = &port,
         .value = "N",
         .lo = 0,
         .hi = 65535,
         .help = "listen port (default 8000; 0 = any free port)",
         .error = "--port needs an integer in [0, 65535]"},
        {.name = "api-key",
         .kind = CLI_STRING,
         .target = &so.api_key,
         .value = "KEY",
         .help = "require 'Authorization: Bearer KEY' on /v1/*"},
        {.name = "served-model-name",
         .kind = CLI_STRING,
         .target = &served_name,
         .value = "NAME",
         .help = "model id clients use (default: the folder's name)"},
        {.name = "max-num-seqs",
         .kind = CLI_INT,
         .target = &max_num_seqs,
         .value = "N",
         .lo = 1,
         .hi = 4096,
         .help = "sequences per engine step (default 1024 on CUDA, 64 on CPU)",
         .error = "--max-num-seqs needs an integer in [1, 4096]"},
        {.name = "max-num-batched-tokens",
         .kind = CLI_INT,
         .target = &max_batched,
         .value = "N",
         .lo = 1,
         .hi = 1 << 20,
         .help = "new tokens per engine step (default 2048)",
         .error = "--max-num-batched-tokens needs an integer in [1, 1048576]"},
        {.name = "max-model-len",
         .kind = CLI_INT,
         .target = &max_model_len,
         .value = "N",
         .lo = 2,
         .hi = 1 << 24,
         .help = "prompt + generated tokens per sequence (default: model's)",
         .error = "--max-model-len needs an integer >= 2"},
        {.name = "kv-blocks",
         .kind = CLI_INT,
         .target = &kv_blocks,
         .value = "N",
         .lo = 1,
         .hi = 1 << 24,
         .help = "KV pages of 16 tokens (default: CUDA fills the memory\n"
                 "fraction below; CPU takes as many as fit 4 GiB)",
         .error = "--kv-blocks needs a positive integer"},
        {.name = "gpu-memory-utilization",
         .kind = CLI_DOUBLE,
         .target = &memory_fraction,
         .value = "F",
         .dlo = 0,
         .dhi = 1,
         .lo_open = true,
         .help = "size the KV cache so F (0-1] of the GPU's memory is in\n"
                 "use, other processes included (default 0.95; CPU\n"
                 "backend: half of F of RAM)",
         .error = "--gpu-memory-utilization needs a fraction in (0, 1]"},
        {.name = "no-prefix-cache",
         .kind = CLI_FLAG,
         .target = &no_prefix_cache,
         .help = "do not reuse KV blocks across requests"},
        {.name = "max-queue",
         .kind = CLI_INT,
         .target = &max_queue,
         .value = "N",
         .lo = 1,
         .hi = 1 << 20,
         .help = "waiting requests before 429 (default 1024)",
         .error = "--max-queue needs an integer in [1, 1048576]"},
        {.name = "max-body-bytes",
         .kind = CLI_INT,
         .target = &max_body,
         .value = "N",
         .lo = 64,
         .hi = (int64_t)1 << 32,
         .help = "larger request bodies get 413 (default 8388608)",
         .error = "--max-body-bytes needs an integer in [64, 4294967296]"},
        {.name = "drain-timeout",
         .kind = CLI_INT,
         .target = &drain_s,
         .value = "S",
         .lo = 0,
         .hi = 86400,
         .help = "on SIGTERM, wait this long for requests (default 60)",
         .error = "--drain-timeout needs seconds in [0, 86400]"},
        {.name = "idle-timeout",
         .kind = CLI_INT,
         .target = &idle_s,
         .value = "S",
         .lo = 1,
         .hi = 86400,
         .help = "close a connection that sends nothing for S seconds\n"
                 "while its request is read (default 120); a request\n"
                 "that is queued or generating is never timed out",
         .error = "--idle-timeout needs seconds in [1, 86400]"},
        {.name = "responses-store-bytes",
         .kind = CLI_INT,
         .target = &store_bytes,
         .value = "N",
         .lo = 0,
         .hi = (int64_t)1 << 40,
         .help = "memory for /v1/responses kept for GET and\n"
                 "previous_response_id, least recently used dropped\n"
                 "first (default 67108864; 0 keeps none)",
         .error = "--responses-store-bytes needs an integer in [0, 2^40]"},
        {.name = "random-weights",
         .kind = CLI_STRING,
         .target = &shape,
         .value = "SHAPE",
         .help = "CUDA: serve random weights of a shape (20b, 120b, tiny\n"
                 "or a config.json) generated on the GPU, for load tests"},
        {.name = "admit-headroom",
         .kind = CLI_INT,
         .target = &admit_headroom,
         .value = "N",
         .lo = 0,
         .hi = 4096,
         .error = "--admit-headroom needs an integer in [0, 4096]",
         .hidden = true},
    };
    size_t n_own = sizeof own / sizeof own[0]; /* the last 2: load tests and measurements */
    const cli_option_group groups[] = {{shared, 1, NULL},
                                       {own, n_own - 2, NULL},
                                       {shared + 1, CLI_MODEL_N_OPTIONS - 1, NULL},
                                       {own + n_own - 2, 2, "\ntesting and measurement:\n"}};
    size_t n_groups = sizeof groups / sizeof groups[0];
    bool want_help;
    int usage = cli_parse_options("serve", argc, argv, groups, n_groups, &want_help);
    if (usage) return usage;
    if (want_help) {
        help(stdout, groups, n_groups);
        return 0;
    }
    const char *model_dir = mo.model_dir;
    bool prefix_cache = !no_prefix_cache;
    if (!model_dir == !shape)
        return cli_usage_error(
            "serve",
            "give -m DIR (a Hugging Face gpt-oss folder; make a tiny random one to try the server "
            "with: gptoss make-model --preset tiny -o /tmp/tiny && gptoss serve -m /tmp/tiny) or "
            "--random-weights SHAPE, not both");
    if (kv_blocks && memory_fraction > 0)
        return cli_usage_error("serve", "give --kv-blocks or --gpu-memory-utilization, not both");
    /* GPTOSS_ADMIT_HEADROOM=N stands for --admit-headroom N (for measurement scripts). */
    const char *headroom_env = getenv("GPTOSS_ADMIT_HEADROOM");
    if (admit_headroom < 0 && headroom_env && *headroom_env &&
        !cli_parse_i64(headroom_env, 0, 4096, &admit_headroom))
        return cli_usage_error(
            "serve", "GPTOSS_ADMIT_HEADROOM needs an integer in [0, 4096], not '%s'", headroom_env);
    gptoss_backend_options bo = gptoss_backend_options_default();
    if (cli_model_options_apply("serve", &mo, &bo)) return 2;
    if (shape && bo.kind != GPTOSS_BACKEND_CUDA)
        return cli_usage_error("serve",
                               "--random-weights needs the CUDA backend; on the CPU, write "
                               "a checkpoint with `gptoss make-model` and pass -m DIR");
    if (max_num_seqs == 0) max_num_seqs = bo.kind == GPTOSS_BACKEND_CUDA ? 1024 : 64;

    /* The served name defaults to the folder's last component, as vLLM does with paths. */
    char name_buf[256];
    if (!served_name) {
        const char *path = model_dir ? model_dir : shape;
        size_t len = strlen(path);
        while (len > 1 && path[len - 1] == '/')
            len--;
        size_t start = len;
        while (start > 0 && path[start - 1] != '/')
            start--;
        snprintf(name_buf, sizeof name_buf, "%s%.*s", model_dir ? "" : "random-",
                 (int)(len - start), path + start);
        served_name = name_buf;
    }
    so.served_model_name = served_name;
    so.port = (int)port;
    so.max_body_bytes = (size_t)max_body;
    so.connection_timeout_s = (unsigned)idle_s;
    so.responses_store_bytes = (size_t)store_bytes;

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    gptoss_error err = {0};
    gptoss_server *server = NULL;
    gptoss_model *model = NULL;
    gptoss_backend *backend = NULL;
    gptoss_tokenizer *tokenizer = NULL;
    gptoss_engine *engine = NULL;
    int rc = 1;
    if (gptoss_server_start(&so, &server, &err) != GPTOSS_OK) goto fail;
    GPTOSS_LOG_I("serve",
                 "listening on http://%s:%d (GET /health answers 503 until the model is loaded)",
                 so.host, gptoss_server_port(server));
    double t0 = gptoss_now_seconds();
    gptoss_config shape_config;
    const gptoss_config *c = NULL;
    if (model_dir) {
        GPTOSS_LOG_I("serve", "loading %s ...", model_dir);
        if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) goto fail;
        c = gptoss_model_config(model);
    } else {
        if (cli_load_shape(shape, &shape_config, &err) != GPTOSS_OK) goto fail;
        c = &shape_config;
    }
    char tok_path[4200];
    if (tokenizer_path) {
        size_t n = strlen(tokenizer_path);
        bool is_file = n >= 5 && !strcmp(tokenizer_path + n - 5, ".json");
        snprintf(tok_path, sizeof tok_path, is_file ? "%s" : "%s/tokenizer.json", tokenizer_path);
    } else if (model_dir) {
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model_dir);
    } else {
        char dir[4096];
        if (!cli_find_tokenizer_dir(dir, sizeof dir)) {
            gptoss_set_error(&err, GPTOSS_ERR_IO,
                             "cannot find the gpt-oss tokenizer (run scripts/setup, set "
                             "GPTOSS_TOKENIZER_DIR, or pass --tokenizer PATH)");
            goto fail;
        }
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    }
    if (gptoss_tokenizer_load(tok_path, &tokenizer, &err) != GPTOSS_OK) goto fail;
    GPTOSS_LOG_I("serve",
                 "model: %d layers, hidden %d, %d experts (top %d), %d heads / %d KV heads x %d, "
                 "vocab %d, context %d%s",
                 c->n_layers, c->hidden_size, c->n_experts, c->n_experts_per_token, c->n_heads,
                 c->n_kv_heads, c->head_dim, c->vocab_size, c->max_position_embeddings,
                 model ? "" : " (random weights)");

    gptoss_kv_plan_options kv_plan = {.n_kv_blocks = kv_blocks,
                                      .memory_fraction = memory_fraction,
                                      .max_num_seqs = (int32_t)max_num_seqs,
                                      .max_num_batched_tokens = (int32_t)max_batched};
    if (gptoss_kv_plan_serve(c, &kv_plan, &bo, &err) != GPTOSS_OK) goto fail;
    bo.progress = print_progress;
    if (model) {
        if (gptoss_backend_create(model, &bo, &backend, &err) != GPTOSS_OK) goto fail;
    } else if (gptoss_backend_create_random(c, &bo, 1, &backend, &err) != GPTOSS_OK) {
        goto fail;
    }
    if (cli_stderr_is_tty()) fprintf(stderr, "\n");
    bo = gptoss_backend_get_options(backend);
    kv_blocks = bo.n_kv_blocks;

    gptoss_engine_options eo = gptoss_engine_options_default();
    if (max_model_len) eo.max_model_len = (int32_t)max_model_len;
    gptoss_engine_options_for_backend(&eo, c, backend, &bo);
    eo.max_num_seqs = (int32_t)max_num_seqs;
    eo.max_num_batched_tokens = (int32_t)max_batched;
    eo.max_queue_len = (int32_t)max_queue;
    eo.enable_prefix_cache = prefix_cache;
    if (admit_headroom >= 0) eo.admit_headroom = (int32_t)admit_headroom;
    int32_t stop_ids[GPTOSS_CHAT_MAX_STOP_IDS];
    gptoss_engine_options_set_eos(&eo, stop_ids, gptoss_chat_stop_ids(stop_ids));
    if (gptoss_engine_create(&eo, &engine, &err) != GPTOSS_OK) goto fail;
    if (gptoss_engine_start(engine, &err) != GPTOSS_OK) goto fail;
    gptoss_server_set_ready(server, engine, tokenizer, eo.max_model_len, eo.max_num_seqs);
    GPTOSS_LOG_I(
        "serve",
        "backend %s: KV cache (%s) %lld blocks x %d tokens = %lld tokens (%.1f MiB), max %d "
        "sequences, prefix cache %s, context %d",
        gptoss_backend_name(backend), kv_format(&bo), (long long)kv_blocks, bo.kv_block_size,
        (long long)kv_blocks * bo.kv_block_size, gptoss_kv_plan_mib(c, &bo), eo.max_num_seqs,
        prefix_cache ? "on" : "off", eo.max_model_len);
    if (bo.kv_shared_pages)
        GPTOSS_LOG_I("serve", "KV pages shared by the full and sliding layers: a sequence's window "
                              "takes pages from the same pool as its context");
    if (mo.fp8_layers) {
        char names[64];
        GPTOSS_LOG_I("serve", "dense layers in FP8 (e4m3, row scales): %s",
                     cli_fp8_layers_name(mo.fp8_layers, names, sizeof names));
    }
    GPTOSS_LOG_I("serve", "ready in %.1f s: model '%s' at http://%s:%d/v1",
                 gptoss_now_seconds() - t0, served_name, so.host, gptoss_server_port(server));

    while (!stop_signal) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    GPTOSS_LOG_I("serve", "%s received, draining in-flight requests (up to %lld s)",
                 stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)drain_s);
    gptoss_server_set_draining(server);
    bool drained = gptoss_engine_drain(engine, drain_s * 1000);
    /* Let connection threads finish writing the last bytes of their responses. */
    for (int i = 0; i < 200 && gptoss_server_active_requests(server) > 0; i++) {
        struct timespec ts = {0, 25 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    GPTOSS_LOG_I("serve", "%s, shutting down",
                 drained ? "drained" : "drain timed out, cancelling the rest");
    if (!drained) { /* cancel what is left so connection threads finish before the daemon stops */
        gptoss_engine_free(engine);
        engine = NULL;
    }
    rc = 0;
    goto done;
fail:
    rc = cli_fail(&err);
done:
    gptoss_server_stop(server);
    gptoss_engine_free(engine);
    gptoss_backend_free(backend);
    gptoss_tokenizer_free(tokenizer);
    gptoss_model_free(model);
    return rc;
}
