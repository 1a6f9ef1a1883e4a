/*
 * cmd_bench_engine.c - `gptoss bench --engine`: decode tokens/s through the engine (the
 * serving path: scheduler, sampler, events), with and without speculative decoding.
 *
 * For each batch size B: B random prompts of -p tokens decode -n tokens greedily. A first run
 * without drafting records each request's output; with --draft replay (the default) that
 * output is the draft table, each drafted token replaced by a wrong one with probability
 * 1 - P, so the acceptance rate is set by P rather than by the text, and the speedup a draft
 * source with acceptance P would give can be read off for k = 1..7. Then every (k, P) and a
 * run without drafting are timed: decode t/s counts the tokens after each request's first
 * one, from the moment every request had its first token (the prompts, prefilled in one
 * step, are not timed) to the last finish; median of -r repeats after one warm-up run. The
 * automatic switch (batch limit, acceptance cooldown, step-cost rule) stays on, as in serving,
 * unless --no-switch.
 */
#include "cli.h"
#include "engine/draft.h"
#include "options.h"
#include "gptoss_engine.h"
#include "util/clock.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIST 16

typedef struct int_list {
    int32_t *ids, n;
} int_list;

typedef struct double_list {
    double v[MAX_LIST];
    int n;
} double_list;

static int parse_ints(const char *cmd, const char *text, void *target, int32_t lo, int32_t hi,
                      const char *error) {
    int_list *l = target;
    free(l->ids);
    l->ids = NULL;
    bool ok = cli_parse_token_list(text, &l->ids, &l->n) && l->n > 0 && l->n <= MAX_LIST;
    for (int32_t i = 0; ok && i < l->n; i++)
        ok = l->ids[i] >= lo && l->ids[i] <= hi;
    if (ok) return 0;
    free(l->ids);
    l->ids = NULL;
    return cli_usage_error(cmd, "%s", error);
}

static int parse_batch(const char *cmd, const char *text, void *target) {
    return parse_ints(cmd, text, target, 1, 1024, "-b needs 1..16 batch sizes in 1..1024");
}

static int parse_k(const char *cmd, const char *text, void *target) {
    return parse_ints(cmd, text, target, 1, GPTOSS_MAX_SPECULATIVE_TOKENS,
                      "-k needs 1..16 draft lengths in 1..7, e.g. 1,3,7");
}

static int parse_accept(const char *cmd, const char *text, void *target) {
    double_list *l = target;
    l->n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v >= 0.0 && v <= 1.0) || l->n == MAX_LIST) break;
        l->v[l->n++] = v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            break;
    }
    if (l->n > 0 && !*p) return 0;
    return cli_usage_error(cmd, "--accept needs 1..16 probabilities in [0, 1], e.g. 0,0.5,1");
}

typedef struct run_result {
    double tokens_per_s;
    uint64_t drafted, accepted;
    double draft_seconds; /* in the draft source */
    int32_t differ;       /* requests whose tokens are not the recorded ones */
} run_result;

/* One timed run of B requests; replays[b] receives request b's tokens when record is set,
 * else they are compared with it (result->differ). */
static gptoss_status run_once(gptoss_backend *backend, const gptoss_config *c,
                              const gptoss_backend_options *bo, const gptoss_draft_options *draft,
                              int32_t B, int32_t n_prompt, int32_t n_gen, const int32_t *prompts,
                              int32_t *replays, bool record, run_result *result,
                              gptoss_error *err) {
    gptoss_engine_options eo = gptoss_engine_options_default();
    eo.max_model_len = n_prompt + n_gen + 1;
    gptoss_engine_options_for_backend(&eo, c, backend, bo);
    eo.n_eos_token_ids = 0; /* every request decodes n_gen tokens */
    eo.max_num_seqs = B;
    eo.max_num_batched_tokens = B * n_prompt + B * (1 + GPTOSS_MAX_SPECULATIVE_TOKENS);
    eo.enable_prefix_cache = false;
    eo.draft = *draft;
    gptoss_engine *engine = NULL;
    gptoss_request **req = calloc((size_t)B, sizeof *req);
    int32_t *n_out = calloc((size_t)B, sizeof *n_out);
    double *first = calloc((size_t)B, sizeof *first);
    bool *done = calloc((size_t)B, sizeof *done), *differs = calloc((size_t)B, sizeof *differs);
    if (!req || !n_out || !first || !done || !differs) {
        free(req), free(n_out), free(first), free(done), free(differs);
        return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    gptoss_status st = gptoss_engine_create(&eo, &engine, err);
    gptoss_sampling_params p = gptoss_sampling_params_default();
    p.temperature = 0.0f;
    p.max_tokens = n_gen;
    p.ignore_eos = true;
    for (int32_t b = 0; !st && b < B; b++) {
        gptoss_request_options ro;
        memset(&ro, 0, sizeof ro);
        if (!record) {
            ro.draft_replay = replays + (size_t)b * n_gen;
            ro.n_draft_replay = n_gen;
        }
        p.seed = (uint64_t)b + 1;
        p.has_seed = true;
        st = gptoss_engine_submit(engine, prompts + (size_t)b * n_prompt, n_prompt, &p, &ro,
                                  &req[b], err);
    }
    if (!st) st = gptoss_engine_start(engine, err);
    int32_t n_done = 0;
    double last_finish = 0;
    while (!st && n_done < B) {
        bool any = false;
        for (int32_t b = 0; b < B; b++) {
            if (done[b]) continue;
            gptoss_engine_event ev;
            int rc;
            while ((rc = gptoss_request_next_event(req[b], &ev, 0)) == 1) {
                any = true;
                double now = gptoss_now_seconds();
                if (ev.token_id >= 0) {
                    if (n_out[b] == 0) first[b] = now;
                    if (record && n_out[b] < n_gen)
                        replays[(size_t)b * n_gen + n_out[b]] = ev.token_id;
                    else if (n_out[b] < n_gen &&
                             replays[(size_t)b * n_gen + n_out[b]] != ev.token_id)
                        differs[b] = true;
                    n_out[b]++;
                }
                if (ev.finish == GPTOSS_FINISH_ERROR)
                    st = gptoss_set_error(err, GPTOSS_ERR_BACKEND, "%s",
                                          gptoss_request_error(req[b]));
            }
            if (rc == -1) {
                done[b] = true;
                n_done++;
                last_finish = gptoss_now_seconds();
            }
        }
        if (!any) nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    if (!st) {
        double start = 0;
        uint64_t tokens = 0;
        for (int32_t b = 0; b < B; b++) {
            if (first[b] > start) start = first[b];
            tokens += n_out[b] > 0 ? (uint64_t)(n_out[b] - 1) : 0;
        }
        gptoss_engine_stats stats;
        gptoss_engine_get_stats(engine, &stats);
        result->tokens_per_s = last_finish > start ? (double)tokens / (last_finish - start) : 0;
        result->drafted = stats.draft_tokens;
        result->accepted = stats.draft_accepted_tokens;
        result->draft_seconds = stats.draft_seconds;
        result->differ = 0;
        for (int32_t b = 0; b < B; b++)
            result->differ += differs[b] || n_out[b] != n_gen;
    }
    for (int32_t b = 0; b < B; b++)
        gptoss_request_release(req[b]);
    gptoss_engine_free(engine);
    free(req), free(n_out), free(first), free(done), free(differs);
    return st;
}

/* "same" or how many requests' tokens differ from the run without drafting. */
static const char *outputs_text(const run_result *r, int32_t B) {
    static char text[48];
    if (r->differ == 0) return "same";
    snprintf(text, sizeof text, "%d of %d differ", (int)r->differ, (int)B);
    return text;
}

static const char *draft_cost_text(const run_result *r) {
    static char text[32];
    if (r->drafted == 0) return "-";
    snprintf(text, sizeof text, "%.3f", 1000.0 * r->draft_seconds / (double)r->drafted);
    return text;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Warm-up, then the median of `repeats` runs. */
static gptoss_status measure(gptoss_backend *backend, const gptoss_config *c,
                             const gptoss_backend_options *bo, const gptoss_draft_options *draft,
                             int32_t B, int32_t n_prompt, int32_t n_gen, const int32_t *prompts,
                             int32_t *replays, int32_t repeats, run_result *out,
                             gptoss_error *err) {
    double tps[64];
    run_result r;
    gptoss_status st =
        run_once(backend, c, bo, draft, B, n_prompt, n_gen, prompts, replays, false, &r, err);
    int32_t differ = r.differ; /* the most of any run, warm-up included */
    for (int32_t i = 0; !st && i < repeats; i++) {
        st = run_once(backend, c, bo, draft, B, n_prompt, n_gen, prompts, replays, false, &r, err);
        tps[i] = r.tokens_per_s;
        if (r.differ > differ) differ = r.differ;
    }
    if (st) return st;
    qsort(tps, (size_t)repeats, sizeof *tps, compare_double);
    *out = r;
    out->differ = differ;
    out->tokens_per_s = tps[repeats / 2];
    return GPTOSS_OK;
}

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out,
            "usage: gptoss bench --engine (-m DIR | --random-weights SHAPE) [options]\n\n"
            "Decode tokens/s through the engine, with speculative decoding next to none. With\n"
            "--draft replay (default) each request's own greedy output, recorded in a first run,\n"
            "is drafted back with each token made wrong with probability 1 - P: the rows show\n"
            "what a draft source accepting a fraction P would gain, for each k. Outputs are the\n"
            "same in every row (drafting is exact); only the time differs.\n\n"
            "options:\n");
    cli_print_options(out, groups, n_groups, 30);
}

int cli_bench_engine(int argc, char **argv) {
    const char *shape = NULL;
    bool engine_flag = false, json = false, no_switch = false;
    int64_t n_prompt = 128, n_gen = 128, repeats = 3, max_batch = -1;
    int draft_kind = GPTOSS_DRAFT_REPLAY;
    int_list batch = {0}, ks = {0};
    double_list accept = {.v = {0.0, 0.5, 0.7, 0.9, 1.0}, .n = 5};
    static const char *const kinds[] = {"none", "ngram", "replay", "eagle3", NULL};
    const char *draft_model = NULL;
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    const cli_option own[] = {
        {.name = "engine",
         .kind = CLI_FLAG,
         .target = &engine_flag,
         .help = "decode through the engine (this mode)"},
        {.name = "random-weights",
         .kind = CLI_STRING,
         .target = &shape,
         .value = "SHAPE",
         .help = "CUDA: weights generated on the GPU: 20b, 120b, tiny or a config.json"},
        {.name = "prompt",
         .short_name = 'p',
         .kind = CLI_INT,
         .target = &n_prompt,
         .value = "N",
         .lo = 1,
         .hi = 65536,
         .help = "prompt tokens per request (default 128)"},
        {.name = "gen",
         .short_name = 'n',
         .kind = CLI_INT,
         .target = &n_gen,
         .value = "N",
         .lo = 2,
         .hi = 65536,
         .help = "tokens generated per request (default 128)"},
        {.name = "batch",
         .short_name = 'b',
         .kind = CLI_CUSTOM,
         .target = &batch,
         .parse = parse_batch,
         .value = "LIST",
         .help = "concurrent requests, e.g. 1,8,64 (default 1)"},
        {.name = "draft",
         .kind = CLI_ENUM,
         .target = &draft_kind,
         .choices = kinds,
         .help = "draft source of the speculative rows (default replay)"},
        {.name = "draft-model",
         .kind = CLI_STRING,
         .target = &draft_model,
         .value = "DIR",
         .help = "eagle3: the EAGLE3 head folder"},
        {.name = "num-speculative-tokens",
         .short_name = 'k',
         .kind = CLI_CUSTOM,
         .target = &ks,
         .parse = parse_k,
         .value = "LIST",
         .help = "draft lengths, e.g. 1,3,7 (default 1..7)"},
        {.name = "accept",
         .kind = CLI_CUSTOM,
         .target = &accept,
         .parse = parse_accept,
         .value = "LIST",
         .help = "replay: probabilities P that a drafted token is right\n(default "
                 "0,0.5,0.7,0.9,1)"},
        {.name = "draft-max-batch",
         .kind = CLI_INT,
         .target = &max_batch,
         .value = "N",
         .lo = 0,
         .hi = 1 << 20,
         .help = "no drafting while more sequences decode (default 16;\n0 = no limit)"},
        {.name = "no-switch",
         .kind = CLI_FLAG,
         .target = &no_switch,
         .help = "verify every draft: no batch limit, no acceptance cooldown,\nno "
                 "step-cost rule (what drafting costs where the switch\nwould refuse it)"},
        {.name = "repeats",
         .short_name = 'r',
         .kind = CLI_INT,
         .target = &repeats,
         .value = "N",
         .lo = 1,
         .hi = 63,
         .help = "timed runs per row after one warm-up (default 3)"},
        {.name = "json", .kind = CLI_FLAG, .target = &json, .help = "JSON instead of a table"},
    };
    const cli_option_group groups[] = {{shared, 1, NULL},
                                       {own, sizeof own / sizeof own[0], NULL},
                                       {shared + 1, CLI_MODEL_N_OPTIONS - 1, NULL}};
    bool want_help = false;
    int rc = cli_parse_options("bench", argc, argv, groups, 3, &want_help);
    if (rc == 0 && want_help) help(stdout, groups, 3);
    if (rc == 0 && !want_help && !mo.model_dir == !shape)
        rc = cli_usage_error("bench", "give exactly one of -m DIR or --random-weights SHAPE");
    gptoss_backend_options bo = gptoss_backend_options_default();
    if (rc == 0 && !want_help && cli_model_options_apply("bench", &mo, &bo)) rc = 2;
    if (rc == 0 && !want_help && shape && bo.kind != GPTOSS_BACKEND_CUDA)
        rc = cli_usage_error("bench", "--random-weights needs the CUDA backend");
    if (rc || want_help) {
        free(batch.ids), free(ks.ids);
        return rc;
    }
    static int32_t default_batch[] = {1}, default_k[] = {1, 2, 3, 4, 5, 6, 7};
    const int32_t *batches = batch.ids ? batch.ids : default_batch;
    const int32_t n_batches = batch.ids ? batch.n : 1;
    const int32_t *k_list = ks.ids ? ks.ids : default_k;
    const int32_t n_k = ks.ids ? ks.n : 7;
    if (draft_kind != GPTOSS_DRAFT_REPLAY) accept.n = 1; /* P applies to replay only */
    int32_t max_b = 1;
    for (int32_t i = 0; i < n_batches; i++)
        if (batches[i] > max_b) max_b = batches[i];

    gptoss_error err = {0};
    gptoss_model *model = NULL;
    gptoss_backend *backend = NULL;
    gptoss_config config;
    gptoss_status st = GPTOSS_OK;
    if (mo.model_dir) {
        st = gptoss_model_load(mo.model_dir, &model, &err);
        if (!st) config = *gptoss_model_config(model);
    } else {
        st = cli_load_shape(shape, &config, &err);
    }
    const int32_t per_seq = (int32_t)(n_prompt + n_gen + GPTOSS_MAX_SPECULATIVE_TOKENS);
    bo.n_kv_blocks = max_b * ((per_seq + bo.kv_block_size - 1) / bo.kv_block_size + 1);
    bo.n_sliding_kv_blocks = bo.n_kv_blocks;
    bo.max_step_tokens = (int32_t)(max_b * (n_prompt + 1 + GPTOSS_MAX_SPECULATIVE_TOKENS));
    bo.max_step_logits = max_b * (1 + GPTOSS_MAX_SPECULATIVE_TOKENS);
    if (!st && cli_stderr_is_tty()) bo.progress = cli_progress;
    if (!st)
        st = model ? gptoss_backend_create(model, &bo, &backend, &err)
                   : gptoss_backend_create_random(&config, &bo, 1, &backend, &err);
    if (bo.progress) fprintf(stderr, "\n");
    if (!st) bo = gptoss_backend_get_options(backend);
    const gptoss_config *c = backend ? gptoss_backend_config(backend) : &config;
    int32_t *prompts = malloc((size_t)max_b * (size_t)n_prompt * sizeof *prompts);
    int32_t *replays = malloc((size_t)max_b * (size_t)n_gen * sizeof *replays);
    if (!st && (!prompts || !replays))
        st = gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    uint64_t lcg = 0x853c49e6748fea9bull;
    for (size_t i = 0; !st && i < (size_t)max_b * (size_t)n_prompt; i++) {
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        prompts[i] = (int32_t)((lcg >> 33) % (uint64_t)c->vocab_size);
    }
    if (!st && !json)
        printf("| batch | draft | k | P | decode t/s | vs none | acceptance | draft ms per "
               "drafted token | outputs |\n"
               "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    if (!st && json) printf("{\"backend\": \"%s\", \"results\": [", gptoss_backend_name(backend));
    bool first_row = true;
    for (int32_t bi = 0; !st && bi < n_batches; bi++) {
        const int32_t B = batches[bi];
        gptoss_draft_options none = gptoss_engine_options_default().draft;
        run_result base, r;
        /* The recording run (also a warm-up), then the baseline. */
        st = run_once(backend, c, &bo, &none, B, (int32_t)n_prompt, (int32_t)n_gen, prompts,
                      replays, true, &r, &err);
        if (!st)
            st = measure(backend, c, &bo, &none, B, (int32_t)n_prompt, (int32_t)n_gen, prompts,
                         replays, (int32_t)repeats, &base, &err);
        if (!st && !json)
            printf("| %d | none | - | - | %.1f | 1.00 | - | - | %s |\n", B, base.tokens_per_s,
                   outputs_text(&base, B));
        if (!st && json)
            printf("%s\n  {\"batch\": %d, \"draft\": \"none\", \"tokens_per_s\": %.2f}",
                   first_row ? "" : ",", B, base.tokens_per_s);
        first_row = false;
        fflush(stdout);
        for (int32_t ki = 0; !st && ki < n_k; ki++) {
            for (int ai = 0; !st && ai < accept.n; ai++) {
                gptoss_draft_options d = none;
                d.kind = (gptoss_draft_kind)draft_kind; /* kinds[] is in the enum's order */
                d.model_dir = draft_model;
                if (d.kind == GPTOSS_DRAFT_NONE) continue;
                d.num_speculative_tokens = k_list[ki];
                d.replay_accept = (float)accept.v[ai];
                d.replay_seed = 7;
                if (max_batch >= 0) d.max_batch = (int32_t)max_batch;
                if (no_switch) {
                    d.max_batch = 0;
                    d.min_acceptance = 0.0f;
                    d.ignore_step_cost = true;
                }
                st = measure(backend, c, &bo, &d, B, (int32_t)n_prompt, (int32_t)n_gen, prompts,
                             replays, (int32_t)repeats, &r, &err);
                if (st) break;
                double acceptance = r.drafted ? (double)r.accepted / (double)r.drafted : 0.0;
                char p_text[16] = "-";
                if (d.kind == GPTOSS_DRAFT_REPLAY)
                    snprintf(p_text, sizeof p_text, "%.2f", accept.v[ai]);
                if (!json)
                    printf("| %d | %s | %d | %s | %.1f | %.2f | %.0f%% | %s | %s |\n", B,
                           gptoss_draft_kind_name(d.kind), d.num_speculative_tokens, p_text,
                           r.tokens_per_s, r.tokens_per_s / base.tokens_per_s, 100.0 * acceptance,
                           draft_cost_text(&r), outputs_text(&r, B));
                else
                    printf(",\n  {\"batch\": %d, \"draft\": \"%s\", \"k\": %d, \"accept\": %s, "
                           "\"tokens_per_s\": %.2f, \"speedup\": %.4f, \"drafted\": %llu, "
                           "\"accepted\": %llu, \"draft_seconds\": %.4f, \"outputs_differ\": "
                           "%d}",
                           B, gptoss_draft_kind_name(d.kind), d.num_speculative_tokens,
                           d.kind == GPTOSS_DRAFT_REPLAY ? p_text : "null", r.tokens_per_s,
                           r.tokens_per_s / base.tokens_per_s, (unsigned long long)r.drafted,
                           (unsigned long long)r.accepted, r.draft_seconds, r.differ);
                fflush(stdout);
            }
        }
    }
    if (!st && json) printf("\n]}\n");
    free(prompts);
    free(replays);
    free(batch.ids), free(ks.ids);
    gptoss_backend_free(backend);
    gptoss_model_free(model);
    return st ? cli_fail(&err) : 0;
}
