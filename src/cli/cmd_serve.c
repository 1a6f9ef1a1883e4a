/*
 * cmd_serve.c - `gptoss serve`: the OpenAI-compatible HTTP server.
 *
 * Owns: the serve command line, the order of start-up (listen first so /health can say 503
 * while weights load, then model, tokenizer, backends, engines, ready) and the SIGTERM drain.
 * With --data-parallel-size N it creates N backends over the one loaded model (the host
 * mapping is shared; each GPU, or each group of --tensor-parallel-size GPUs, gets its own copy
 * of the weights) and N engines, which the server routes between (src/server/router.h). In a
 * tensor-parallel job of several processes (one per node: --nnodes, Slurm or Open MPI) process 0
 * serves as usual over the GPUs of every process, and the others only follow its steps
 * (serve_follower). KV sizing is engine/kv_plan.c's; the HTTP work itself is src/server. This file
 * must stay a thin driver.
 */
#include "cli.h"
#include "options.h"
#include "draft_options.h"

#include "backend/tp_net.h"
#include "backend/tp_split.h"
#include "chat/chat.h"
#include "gptoss_engine.h"
#include "engine/kv_plan.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/dist.h"
#include "util/error.h"
#include "util/log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DATA_PARALLEL 64 /* SERVER_ROUTER_MAX_ENGINES */

static volatile sig_atomic_t stop_signal = 0;

/* The first SIGTERM or SIGINT starts the drain; the handler then steps aside, so that a
 * second one ends the process at once (sigaction is async-signal-safe). */
static void on_signal(int sig) {
    stop_signal = sig;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
}

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out, "usage: gptoss serve (-m DIR | --random-weights SHAPE) [options]\n\n"
                 "Serves the model over an OpenAI-compatible HTTP API: POST /v1/chat/completions,\n"
                 "POST /v1/responses, POST /v1/completions, GET /v1/models, GET /health,\n"
                 "GET /metrics (Prometheus), and a chat page at GET / (open http://HOST:PORT/ in\n"
                 "a browser).\n\n"
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

/* The backend broke (tensor parallelism across processes: a follower was lost): /health
 * answers 503 and new requests are refused until the process ends. */
static void on_backend_broken(void *user) {
    gptoss_server_set_draining((gptoss_server *)user);
}

/* Process 1.. of a tensor-parallel job: the same model and KV sizing as process 0, its share
 * of the GPU ranks, then the steps process 0 sends, until it shuts down (0) or is lost (1).
 * No HTTP: a signal does not stop it (process 0 drains, then says QUIT; a second signal ends
 * it at once). */
static int serve_follower(const gptoss_dist_info *where, const char *model_dir, const char *shape,
                          gptoss_backend_options bo, const gptoss_kv_plan_options *kv_plan) {
    gptoss_error err = {0};
    gptoss_model *model = NULL;
    gptoss_backend *backend = NULL;
    gptoss_config shape_config;
    const gptoss_config *c = NULL;
    int rc = 1;
    GPTOSS_LOG_I("serve",
                 "process %d of %d (%s): follows process 0 at %s:%d, runs its steps on %d GPU%s "
                 "from %d; no HTTP here",
                 where->rank, where->world_size, gptoss_dist_source_name(where->source),
                 where->master_addr, where->master_port,
                 bo.tensor_parallel_size / where->world_size,
                 bo.tensor_parallel_size / where->world_size == 1 ? "" : "s", bo.device);
    if (model_dir) {
        if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) goto done;
        c = gptoss_model_config(model);
    } else {
        if (cli_load_shape(shape, &shape_config, &err) != GPTOSS_OK) goto done;
        c = &shape_config;
    }
    gptoss_kv_plan_options plan = *kv_plan;
    if (gptoss_kv_plan_serve(c, &plan, &bo, &err) != GPTOSS_OK) goto done;
    bo.progress = print_progress;
    gptoss_status st = model ? gptoss_backend_create(model, &bo, &backend, &err)
                             : gptoss_backend_create_random(c, &bo, 1, &backend, &err);
    if (cli_stderr_is_tty()) fprintf(stderr, "\n");
    if (st != GPTOSS_OK) goto done;
    if (gptoss_tp_job_follow(&err) != GPTOSS_OK) goto done;
    GPTOSS_LOG_I("serve", "process 0 shut down; this process ends too");
    rc = 0;
done:
    if (rc) {
        if (gptoss_log_get_format() == GPTOSS_LOG_FORMAT_JSON)
            GPTOSS_LOG_E("serve", "%s",
                         err.message[0] ? err.message : gptoss_status_name(err.status));
        else
            rc = cli_fail(&err);
    }
    gptoss_backend_free(backend);
    gptoss_model_free(model);
    return rc;
}

int gptoss_cmd_serve(int argc, char **argv) {
    const char *served_name = NULL, *shape = NULL, *tokenizer_path = NULL;
    gptoss_server_options so = gptoss_server_options_default();
    int64_t max_num_seqs = 0, max_batched = 2048, kv_blocks = 0, max_queue = 4096,
            max_body = (int64_t)so.max_body_bytes, port = so.port, drain_s = 60, max_model_len = 0,
            idle_s = so.connection_timeout_s, admit_headroom = -1, data_parallel = 1,
            max_connections = so.max_connections, max_connections_per_ip = 0,
            store_bytes = (int64_t)so.responses_store_bytes;
    gptoss_dist_flags dist = gptoss_dist_flags_default();
    int log_format = GPTOSS_LOG_FORMAT_TEXT;
    static const char *const log_format_names[] = {"text", "json", NULL};
    double memory_fraction = 0;
    bool no_prefix_cache = false, no_webui = false;
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_draft_options draft = cli_draft_options_default();
    cli_option draft_table[CLI_DRAFT_N_OPTIONS];
    cli_draft_option_table(&draft, false, draft_table);
    cli_model_option_table(&mo, shared);
    shared[0].help = "Hugging Face gpt-oss folder, or a repo id in the local\n"
                     "Hugging Face cache (openai/gpt-oss-20b); make a tiny one\n"
                     "with `gptoss make-model --preset tiny -o DIR`";
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
         .help = "model id clients use (default: the repo id for a model\n"
                 "from the Hugging Face cache, else the folder's name)"},
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
         .help = "prompt + generated tokens per sequence (default: the\n"
                 "model's context, 131072 for gpt-oss, or what the KV cache\n"
                 "holds when that is less)",
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
        {.name = "no-webui",
         .kind = CLI_FLAG,
         .target = &no_webui,
         .help = "do not serve the chat page at GET / (404 instead)"},
        {.name = "max-queue",
         .kind = CLI_INT,
         .target = &max_queue,
         .value = "N",
         .lo = 1,
         .hi = 1 << 20,
         .help = "waiting requests before 429 (default 4096)",
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
         .help = "on SIGTERM or SIGINT, let requests run this long, then\n"
                 "cut them (finish_reason length) and exit (default 60)",
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
        {.name = "data-parallel-size",
         .kind = CLI_INT,
         .target = &data_parallel,
         .value = "N",
         .lo = 1,
         .hi = MAX_DATA_PARALLEL,
         .help = "N engines, each with its own copy of the model: CUDA\n"
                 "on devices --device..--device+N-1 (with\n"
                 "--tensor-parallel-size T each engine a group of T:\n"
                 "N x T GPUs), CPU with -t/N threads each; requests go\n"
                 "to the engine that holds their prefix, else the\n"
                 "least loaded (default 1)",
         .error = "--data-parallel-size needs an integer in [1, 64]"},
        {.name = "nnodes",
         .kind = CLI_INT,
         .target = &dist.nnodes,
         .value = "N",
         .lo = 1,
         .hi = GPTOSS_DIST_MAX_WORLD,
         .help = "nodes of a multi-node job, one process each (Slurm and\n"
                 "Open MPI launches are read from the environment): one\n"
                 "model split over the GPUs of all of them, where\n"
                 "--tensor-parallel-size counts every node's GPUs",
         .error = "--nnodes needs an integer in [1, 65536]"},
        {.name = "node-rank",
         .kind = CLI_INT,
         .target = &dist.node_rank,
         .value = "R",
         .lo = 0,
         .hi = GPTOSS_DIST_MAX_WORLD - 1,
         .help = "this node's index in the job (0: the master)",
         .error = "--node-rank needs an integer in [0, 65535]"},
        {.name = "master-addr",
         .kind = CLI_STRING,
         .target = &dist.master_addr,
         .value = "HOST",
         .help = "address of node 0 (default: MASTER_ADDR)"},
        {.name = "master-port",
         .kind = CLI_INT,
         .target = &dist.master_port,
         .value = "P",
         .lo = 1,
         .hi = 65535,
         .help = "rendezvous port on node 0 (default: MASTER_PORT or\n"
                 "29500)",
         .error = "--master-port needs an integer in [1, 65535]"},
        {.name = "max-connections",
         .kind = CLI_INT,
         .target = &max_connections,
         .value = "N",
         .lo = 1,
         .hi = 65536,
         .help = "open connections (one thread each) at most; more are\n"
                 "closed at once (default 2048)",
         .error = "--max-connections needs an integer in [1, 65536]"},
        {.name = "max-connections-per-ip",
         .kind = CLI_INT,
         .target = &max_connections_per_ip,
         .value = "N",
         .lo = 0,
         .hi = 65536,
         .help = "open connections per client address (default 0: only\n"
                 "--max-connections applies)",
         .error = "--max-connections-per-ip needs an integer in [0, 65536]"},
        {.name = "allowed-origins",
         .kind = CLI_STRING,
         .target = &so.allowed_origins,
         .value = "LIST",
         .help = "CORS: browser origins allowed to call the API, comma-\n"
                 "separated (https://app.example.com), or * (default:\n"
                 "none)"},
        {.name = "log-format",
         .kind = CLI_ENUM,
         .target = &log_format,
         .choices = log_format_names,
         .help = "log lines as text (default) or one JSON object each"},
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
                                       {draft_table, CLI_DRAFT_N_OPTIONS, NULL},
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
    if (!model_dir && !shape)
        return cli_usage_error(
            "serve",
            "missing -m DIR (a Hugging Face gpt-oss folder, or a repo id in the local Hugging Face "
            "cache such as openai/gpt-oss-20b; make a tiny random one to try the server with: "
            "gptoss make-model --preset tiny -o /tmp/tiny && gptoss serve -m /tmp/tiny)");
    if (model_dir && shape)
        return cli_usage_error("serve", "give -m DIR or --random-weights SHAPE, not both");
    if (kv_blocks && memory_fraction > 0)
        return cli_usage_error("serve", "give --kv-blocks or --gpu-memory-utilization, not both");
    /* GPTOSS_ADMIT_HEADROOM=N stands for --admit-headroom N (for measurement scripts). */
    const char *headroom_env = getenv("GPTOSS_ADMIT_HEADROOM");
    if (admit_headroom < 0 && headroom_env && *headroom_env &&
        !cli_parse_i64(headroom_env, 0, 4096, &admit_headroom))
        return cli_usage_error(
            "serve", "GPTOSS_ADMIT_HEADROOM needs an integer in [0, 4096], not '%s'", headroom_env);
    gptoss_backend_options bo = gptoss_backend_options_default();
    int apply_rc = cli_model_options_apply("serve", &mo, &bo);
    if (apply_rc) return apply_rc;
    if (cli_model_options_resolve(&mo)) return 1;
    model_dir = mo.model_dir;
    if (shape && bo.kind != GPTOSS_BACKEND_CUDA)
        return cli_usage_error("serve",
                               "--random-weights needs the CUDA backend; on the CPU, write "
                               "a checkpoint with `gptoss make-model` and pass -m DIR");
    if (max_num_seqs == 0) max_num_seqs = bo.kind == GPTOSS_BACKEND_CUDA ? 1024 : 64;
    int32_t n_dp = (int32_t)data_parallel;
    gptoss_dist_info place; /* this process in a job of several */
    {
        gptoss_error derr = {0};
        if (gptoss_dist_resolve(&dist, NULL, NULL, &place, &derr) != GPTOSS_OK)
            return cli_usage_error("serve", "%s", derr.message);
    }
    if (place.world_size > 1) {
        /* One tensor-parallel model over every process's GPUs (backend/tp_net.h). */
        const int32_t procs = place.world_size, tp = bo.tensor_parallel_size;
        if (bo.kind != GPTOSS_BACKEND_CUDA)
            return cli_usage_error("serve",
                                   "this is process %d of %d (%s): serving across processes "
                                   "splits the model over their GPUs (--tensor-parallel-size "
                                   "counts them all) and needs the CUDA backend",
                                   place.rank, procs, gptoss_dist_source_name(place.source));
        if (procs > GPTOSS_TP_NET_MAX_PROCS || tp < procs || tp % procs)
            return cli_usage_error(
                "serve",
                "this is process %d of %d (%s): --tensor-parallel-size counts the GPUs of all "
                "processes together (2, 4 or 8, a multiple of the %d processes: each takes "
                "--tensor-parallel-size / %d GPUs from --device), not %d",
                place.rank, procs, gptoss_dist_source_name(place.source), procs, procs, tp);
        if (n_dp > 1)
            return cli_usage_error("serve", "--data-parallel-size cannot be combined with a job "
                                            "of several processes");
        gptoss_tp_job_set(&place);
        if (place.local_world_size > 1)
            GPTOSS_LOG_W("serve",
                         "%d processes of the job run on this node: each uses GPUs from --device "
                         "(%d) of those it sees, so give each its own (CUDA_VISIBLE_DEVICES)",
                         place.local_world_size, bo.device);
    }
    /* engine i's devices: one GPU, or with tensor parallelism a group of them
     * (gptoss_dp_engine_devices) */
    int32_t engine_device[MAX_DATA_PARALLEL];
    for (int32_t i = 0; i < n_dp; i++)
        engine_device[i] = bo.device;
    if (bo.kind == GPTOSS_BACKEND_CUDA && n_dp > 1) {
        gptoss_error derr = {0};
        if (gptoss_dp_engine_devices(n_dp, bo.tensor_parallel_size, bo.device,
                                     gptoss_cuda_device_count(), engine_device, &derr) != GPTOSS_OK)
            return cli_usage_error("serve", "%s (CUDA_VISIBLE_DEVICES applies)", derr.message);
    }
    if (bo.kind == GPTOSS_BACKEND_CPU && n_dp > 1) { /* -t is the total over the engines */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int64_t total = bo.n_threads > 0 ? bo.n_threads : cores > 0 ? cores : 1;
        bo.n_threads = total >= n_dp ? (int32_t)(total / n_dp) : 1;
    }

    /* The served name defaults to the repo id (openai/gpt-oss-20b) for a model from the
     * Hugging Face cache, else to the folder's (or GGUF file's) last component, as vLLM does
     * with paths. */
    char name_buf[256];
    if (!served_name && model_dir) served_name = mo.model_id;
    if (!served_name) {
        const char *path = model_dir ? model_dir : shape;
        size_t len = strlen(path);
        while (len > 1 && path[len - 1] == '/')
            len--;
        size_t start = len;
        while (start > 0 && path[start - 1] != '/')
            start--;
        if (len - start > 5 && strncmp(path + len - 5, ".gguf", 5) == 0) len -= 5; /* a file */
        snprintf(name_buf, sizeof name_buf, "%s%.*s", model_dir ? "" : "random-",
                 (int)(len - start), path + start);
        served_name = name_buf;
    }
    so.served_model_name = served_name;
    so.port = (int)port;
    so.max_body_bytes = (size_t)max_body;
    so.connection_timeout_s = (unsigned)idle_s;
    so.webui = !no_webui;
    so.max_connections = (unsigned)max_connections;
    so.max_connections_per_ip = (unsigned)max_connections_per_ip;
    gptoss_log_set_format((gptoss_log_format)log_format);
    so.responses_store_bytes = (size_t)store_bytes;

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    /* the same sizing as process 0's below, so that both ask for the same pool */
    gptoss_kv_plan_options kv_plan = {.n_kv_blocks = kv_blocks,
                                      .memory_fraction = memory_fraction,
                                      .max_num_seqs = (int32_t)max_num_seqs,
                                      .max_num_batched_tokens = (int32_t)max_batched};
    if (place.world_size > 1 && place.rank > 0)
        return serve_follower(&place, model_dir, shape, bo, &kv_plan);

    gptoss_error err = {0};
    gptoss_server *server = NULL;
    gptoss_model *model = NULL;
    gptoss_backend *backends[MAX_DATA_PARALLEL] = {0};
    gptoss_tokenizer *tokenizer = NULL;
    gptoss_engine *engines[MAX_DATA_PARALLEL] = {0};
    int rc = 1;
    if (gptoss_server_start(&so, &server, &err) != GPTOSS_OK) goto fail;
    GPTOSS_LOG_I("serve",
                 "listening on http://%s:%d (GET /health answers 503 until the model is loaded)",
                 so.host, gptoss_server_port(server));
    if (place.world_size > 1) {
        gptoss_tp_job_on_broken(on_backend_broken, server);
        GPTOSS_LOG_I("serve",
                     "process 0 of %d (%s): the model is split over %d GPUs, %d in each process; "
                     "the others follow this one's steps",
                     place.world_size, gptoss_dist_source_name(place.source),
                     bo.tensor_parallel_size, bo.tensor_parallel_size / place.world_size);
    }
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
        gptoss_tokenizer_path_for_model(model_dir, tok_path, sizeof tok_path);
    } else {
        char dir[4096];
        if (!cli_find_tokenizer_dir(dir, sizeof dir)) {
            char places[4096];
            gptoss_set_error(&err, GPTOSS_ERR_IO,
                             "cannot find the gpt-oss tokenizer.json; looked in:\n%sset "
                             "GPTOSS_TOKENIZER_DIR or pass --tokenizer PATH",
                             cli_tokenizer_search_places(places, sizeof places));
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

    if (gptoss_kv_plan_serve(c, &kv_plan, &bo, &err) != GPTOSS_OK) goto fail;
    if (bo.kind == GPTOSS_BACKEND_CPU && n_dp > 1 && !kv_blocks) {
        /* The CPU engines share one machine's memory: the default budget is split. */
        bo.n_kv_blocks = bo.n_kv_blocks / n_dp > 0 ? bo.n_kv_blocks / n_dp : 1;
        if (bo.n_sliding_kv_blocks > bo.n_kv_blocks) bo.n_sliding_kv_blocks = bo.n_kv_blocks;
    }
    bo.progress = print_progress;
    gptoss_engine_options eo = gptoss_engine_options_default();
    bool kv_capped = false;
    for (int32_t i = 0; i < n_dp; i++) {
        /* One model load (the host mapping), one backend per device: each uploads its own
         * copy of the weights (random weights from the same seed, so every engine serves the
         * same model) and sizes its own KV pool. */
        gptoss_backend_options bo_i = bo;
        bo_i.device = engine_device[i];
        gptoss_status st = model ? gptoss_backend_create(model, &bo_i, &backends[i], &err)
                                 : gptoss_backend_create_random(c, &bo_i, 1, &backends[i], &err);
        if (cli_stderr_is_tty()) fprintf(stderr, "\n");
        if (st != GPTOSS_OK) {
            if (n_dp > 1) gptoss_error_prefix(&err, "engine %d: ", i);
            goto fail;
        }
        bo_i = gptoss_backend_get_options(backends[i]);
        gptoss_engine_options eo_i = gptoss_engine_options_default();
        bool capped_i = false;
        eo_i.max_model_len = gptoss_kv_plan_max_model_len(c, max_model_len, &bo_i, &capped_i);
        kv_capped = kv_capped || capped_i;
        gptoss_engine_options_for_backend(&eo_i, c, backends[i], &bo_i);
        eo_i.max_num_seqs = (int32_t)max_num_seqs;
        eo_i.max_num_batched_tokens = (int32_t)max_batched;
        eo_i.max_queue_len = (int32_t)max_queue;
        eo_i.enable_prefix_cache = prefix_cache;
        if (admit_headroom >= 0) eo_i.admit_headroom = (int32_t)admit_headroom;
        cli_draft_options_apply(&draft, &eo_i);
        int32_t stop_ids[GPTOSS_CHAT_MAX_STOP_IDS];
        gptoss_engine_options_set_eos(&eo_i, stop_ids, gptoss_chat_stop_ids(stop_ids));
        if (gptoss_engine_create(&eo_i, &engines[i], &err) != GPTOSS_OK ||
            gptoss_engine_start(engines[i], &err) != GPTOSS_OK) {
            if (n_dp > 1) gptoss_error_prefix(&err, "engine %d: ", i);
            goto fail;
        }
        /* Every engine must take the same requests: the smallest context bounds them all. */
        if (i == 0 || eo_i.max_model_len < eo.max_model_len) eo = eo_i;
        char where[80] = "";
        if (bo_i.tensor_parallel_size > 1 && place.world_size > 1) /* all processes' GPUs */
            snprintf(where, sizeof where,
                     "tensor parallel over %d GPUs in %d processes: ", bo_i.tensor_parallel_size,
                     place.world_size);
        else if (bo_i.tensor_parallel_size > 1 && n_dp > 1) /* the KV MiB: the group's GPUs */
            snprintf(where, sizeof where, "engine %d, tensor parallel over GPUs %d..%d: ", i,
                     bo_i.device, bo_i.device + bo_i.tensor_parallel_size - 1);
        else if (bo_i.tensor_parallel_size > 1) /* the KV MiB below: all the GPUs together */
            snprintf(where, sizeof where, "tensor parallel over GPUs %d..%d: ", bo_i.device,
                     bo_i.device + bo_i.tensor_parallel_size - 1);
        else if (n_dp > 1 && bo_i.kind == GPTOSS_BACKEND_CUDA)
            snprintf(where, sizeof where, "engine %d on GPU %d: ", i, bo_i.device);
        else if (n_dp > 1)
            snprintf(where, sizeof where, "engine %d (%d thread%s): ", i, bo_i.n_threads,
                     bo_i.n_threads == 1 ? "" : "s");
        GPTOSS_LOG_I(
            "serve",
            "%sbackend %s: KV cache (%s) %lld blocks x %d tokens = %lld tokens (%.1f MiB), max "
            "%d sequences, prefix cache %s, context %d",
            where, gptoss_backend_name(backends[i]), kv_format(&bo_i), (long long)bo_i.n_kv_blocks,
            bo_i.kv_block_size, (long long)bo_i.n_kv_blocks * bo_i.kv_block_size,
            gptoss_kv_plan_mib(c, &bo_i), eo_i.max_num_seqs, prefix_cache ? "on" : "off",
            eo_i.max_model_len);
        if (i == 0) bo = bo_i;
    }
    if (max_model_len > c->max_position_embeddings)
        GPTOSS_LOG_W("serve", "--max-model-len %lld is beyond the model's context; using %d",
                     (long long)max_model_len, c->max_position_embeddings);
    if (kv_capped)
        gptoss_log(
            max_model_len ? GPTOSS_LOG_WARN : GPTOSS_LOG_INFO, "serve",
            "max model length %d, not %lld: that is all the KV cache holds (more "
            "with a larger --gpu-memory-utilization or --kv-blocks, or --kv-cache-dtype fp8)",
            eo.max_model_len,
            (long long)(max_model_len && max_model_len < c->max_position_embeddings
                            ? max_model_len
                            : c->max_position_embeddings));
    if (gptoss_server_set_ready(server, engines, n_dp, tokenizer, eo.max_model_len, eo.max_num_seqs,
                                eo.kv_block_size, &err) != GPTOSS_OK)
        goto fail;
    if (n_dp > 1)
        GPTOSS_LOG_I("serve",
                     "data parallel: %d engines; a request goes to the engine that holds its "
                     "prefix, else to the least loaded",
                     n_dp);
    if (bo.kv_shared_pages)
        GPTOSS_LOG_I("serve", "KV pages shared by the full and sliding layers: a sequence's window "
                              "takes pages from the same pool as its context");
    if (mo.fp8_layers) {
        char names[64];
        GPTOSS_LOG_I("serve", "dense layers in FP8 (e4m3, row scales): %s",
                     cli_fp8_layers_name(mo.fp8_layers, names, sizeof names));
    }
    if (bo.batch_invariant)
        GPTOSS_LOG_I("serve", "batch-invariant: a request's logits do not depend on what else "
                              "shares its steps (docs/batch-invariance.md)");
    GPTOSS_LOG_I("serve", "ready in %.1f s: model '%s' at http://%s:%d/v1",
                 gptoss_now_seconds() - t0, served_name, so.host, gptoss_server_port(server));

    while (!stop_signal) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* The drain ends within drain_s: requests may run until the last quarter (at most a
     * second) of it; then whatever still generates is cut (finish_reason "length") and the
     * rest of the time lets the connections send their last chunk and [DONE]. */
    double drain_start = gptoss_now_seconds(), drain_end = drain_start + (double)drain_s;
    double reserve = drain_s >= 4 ? 1.0 : (double)drain_s / 4.0;
    GPTOSS_LOG_I("serve",
                 "%s received, draining in-flight requests (up to %lld s; a second signal exits "
                 "at once)",
                 stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)drain_s);
    gptoss_server_set_draining(server);
    /* The engines drain together, each within what is left of the one budget. */
    bool drained = true;
    double drain_engines_end = drain_end - reserve;
    for (int32_t i = 0; i < n_dp; i++) {
        double left_s = drain_engines_end - gptoss_now_seconds();
        drained =
            gptoss_engine_drain(engines[i], left_s > 0 ? (int64_t)(left_s * 1000) : 0) && drained;
    }
    if (!drained) {
        GPTOSS_LOG_W("serve", "drain timed out, cutting the requests still generating");
        gptoss_server_cut(server);
        /* Cut streams need a moment to end even when drain_s leaves none (0). */
        if (drain_end < gptoss_now_seconds() + 0.25) drain_end = gptoss_now_seconds() + 0.25;
    }
    bool idle = gptoss_server_wait_idle(server, drain_end);
    GPTOSS_LOG_I("serve", "%s in %.1f s, shutting down",
                 drained && idle ? "drained"
                 : idle          ? "cut the rest"
                                 : "connections still open closed",
                 gptoss_now_seconds() - drain_start);
    rc = 0;
    goto done;
fail:
    if (gptoss_log_get_format() == GPTOSS_LOG_FORMAT_JSON) { /* keep the log parseable */
        GPTOSS_LOG_E("serve", "%s", err.message[0] ? err.message : gptoss_status_name(err.status));
        rc = 1;
    } else {
        rc = cli_fail(&err);
    }
done:
    gptoss_tp_job_on_broken(NULL, NULL); /* the server goes first */
    gptoss_server_stop(server);
    for (int32_t i = 0; i < MAX_DATA_PARALLEL; i++) {
        gptoss_engine_free(engines[i]);
        gptoss_backend_free(backends[i]);
    }
    gptoss_tokenizer_free(tokenizer);
    gptoss_model_free(model);
    return rc;
}
