/*
 * cmd_make_model.c - `gptoss make-model`: write a random-weight checkpoint, or a random EAGLE3
 * draft head (--preset eagle3-*).
 */
#include "cli.h"
#include "options.h"
#include "model/config.h"
#include "tools/checkpoint_writer.h"
#include "tools/eagle3_writer.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(
        out,
        "usage: gptoss make-model (--preset tiny|20b|120b | --config FILE) -o DIR [options]\n"
        "       gptoss make-model --preset eagle3-tiny|eagle3-20b|eagle3-120b -o DIR\n\n"
        "Writes a checkpoint with random weights in the published Hugging Face gpt-oss layout:\n"
        "config.json, generation_config.json, sharded safetensors with an index (MXFP4 experts as\n"
        "U8 blocks/scales, BF16 elsewhere) and the real tokenizer files. The eagle3 presets\n"
        "write a random EAGLE3 draft head for the tiny, 20b or 120b target instead (config.json\n"
        "and model.safetensors, as published heads are laid out; docs/speculative.md).\n\n"
        "options:\n");
    cli_print_options(out, groups, n_groups, 24);
}

/* Whether dir exists and holds anything; the first entry's name in first. */
static bool folder_entry(const char *dir, char *first, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(first, size, "%s", e->d_name);
            found = true;
        }
    closedir(d);
    return found;
}

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            if (cap > (16u << 20)) break;
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

int gptoss_cmd_make_model(int argc, char **argv) {
    const char *preset = NULL, *config_path = NULL, *out_dir = NULL, *tokenizer_dir = NULL;
    bool no_tokenizer = false, force = false;
    gptoss_checkpoint_options options = {0};
    int64_t seed = 0, max_shard_bytes = 0;
    const cli_option table[] = {
        {.name = "preset",
         .kind = CLI_STRING,
         .target = &preset,
         .value = "NAME",
         .help = "tiny (CI-sized, real vocabulary), 20b or 120b (real shapes);\n"
                 "eagle3-tiny, eagle3-20b, eagle3-120b: a draft head"},
        {.name = "config",
         .kind = CLI_STRING,
         .target = &config_path,
         .value = "FILE",
         .help = "a config.json to take the shape from"},
        {.name = "output",
         .short_name = 'o',
         .kind = CLI_STRING,
         .target = &out_dir,
         .value = "DIR",
         .help = "folder to write (created if needed)"},
        {.name = "seed",
         .kind = CLI_INT,
         .target = &seed,
         .value = "N",
         .lo = 0,
         .hi = INT64_MAX,
         .help = "random seed (default 0); the same seed gives identical bytes",
         .error = "--seed needs a non-negative integer"},
        {.name = "max-shard-bytes",
         .kind = CLI_INT,
         .target = &max_shard_bytes,
         .value = "N",
         .lo = 1,
         .hi = INT64_MAX,
         .help = "pack shards up to N bytes (default: the published layout, 4.6 GB\n"
                 "shards and at least 3: 3 for 20b, 15 for 120b)",
         .error = "--max-shard-bytes needs a positive integer"},
        {.name = "single-file",
         .kind = CLI_FLAG,
         .target = &options.single_file,
         .help = "write model.safetensors without an index"},
        {.name = "tokenizer-dir",
         .kind = CLI_STRING,
         .target = &tokenizer_dir,
         .value = "DIR",
         .help = "where tokenizer.json comes from (default: $GPTOSS_TOKENIZER_DIR,\n"
                 "else PREFIX/share/gptoss of an installed gptoss, else the npm\n"
                 "package scripts/setup installs in a checkout)"},
        {.name = "no-tokenizer",
         .kind = CLI_FLAG,
         .target = &no_tokenizer,
         .help = "do not copy tokenizer files"},
        {.name = "force",
         .kind = CLI_FLAG,
         .target = &force,
         .help = "write into a folder that is not empty (its model files\nare replaced)"},
    };
    const cli_option_group group = {table, sizeof table / sizeof table[0], NULL};
    bool want_help;
    int usage = cli_parse_options("make-model", argc, argv, &group, 1, &want_help);
    if (usage) return usage;
    if (want_help) {
        help(stdout, &group, 1);
        return 0;
    }
    options.seed = (uint64_t)seed;
    options.max_shard_bytes = (uint64_t)max_shard_bytes;
    if (!!preset + !!config_path != 1)
        return cli_usage_error("make-model", "give exactly one of --preset or --config");
    if (!out_dir) return cli_usage_error("make-model", "missing -o DIR");
    char first[256];
    if (!force && folder_entry(out_dir, first, sizeof first)) {
        fprintf(stderr,
                "gptoss make-model: error: %s is not empty (it holds %s); give a new or empty "
                "folder, or --force to write the checkpoint over its files\n",
                out_dir, first);
        return 1;
    }

    gptoss_error err = {0};
    if (preset && strncmp(preset, "eagle3-", 7) == 0) {
        gptoss_eagle3_config head;
        double start = gptoss_now_seconds();
        if (gptoss_eagle3_preset(preset, &head, &err) != GPTOSS_OK ||
            gptoss_eagle3_write_random(&head, out_dir, (uint64_t)seed, false, &err) != GPTOSS_OK)
            return cli_fail(&err);
        printf("wrote %s: EAGLE3 head, hidden %d, draft vocabulary %d, layer ids %d %d %d in "
               "%.1f s\n",
               out_dir, head.hidden_size, head.draft_vocab_size, head.aux_layer_ids[0],
               head.aux_layer_ids[1], head.aux_layer_ids[2], gptoss_now_seconds() - start);
        return 0;
    }
    gptoss_config config;
    if (preset) {
        if (gptoss_config_preset(preset, &config, &err) != GPTOSS_OK) return cli_fail(&err);
    } else {
        size_t len = 0;
        char *text = read_text_file(config_path, &len);
        if (!text) {
            fprintf(stderr, "gptoss: error: cannot read %s\n", config_path);
            return 1;
        }
        gptoss_status st = gptoss_config_parse(text, len, &config, &err);
        free(text);
        if (st != GPTOSS_OK) {
            gptoss_error_prefix(&err, "%s: ", config_path);
            return cli_fail(&err);
        }
    }
    char found_dir[4096];
    if (!no_tokenizer && !tokenizer_dir) {
        if (!cli_find_tokenizer_dir(found_dir, sizeof found_dir)) {
            char places[4096];
            fprintf(stderr,
                    "gptoss make-model: error: cannot find the gpt-oss tokenizer.json; looked "
                    "in:\n%s"
                    "Install gptoss with `cmake --install BUILD --prefix PREFIX` (it puts the "
                    "tokenizer in PREFIX/share/gptoss), set GPTOSS_TOKENIZER_DIR, or pass "
                    "--tokenizer-dir DIR or --no-tokenizer.\n",
                    cli_tokenizer_search_places(places, sizeof places));
            return 1;
        }
        tokenizer_dir = found_dir;
    }
    options.tokenizer_dir = no_tokenizer ? NULL : tokenizer_dir;
    int64_t bytes = gptoss_config_n_bytes(&config);
    if (bytes > (256ll << 20)) {
        options.progress = cli_progress;
        GPTOSS_LOG_I("make-model", "writing %.2f GB of weights to %s", (double)bytes / 1e9,
                     out_dir);
    }
    double start = gptoss_now_seconds();
    if (gptoss_checkpoint_write_random(&config, out_dir, &options, &err) != GPTOSS_OK)
        return cli_fail(&err);
    double seconds = gptoss_now_seconds() - start;
    printf("wrote %s: %d layers, %d experts, %.3f B parameters, %.3f GB in %.1f s\n", out_dir,
           config.n_layers, config.n_experts, (double)gptoss_config_n_params(&config) / 1e9,
           (double)bytes / 1e9, seconds);
    return 0;
}
