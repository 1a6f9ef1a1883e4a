/*
 * main.c - the gptoss binary: global options (--log-level), then one subcommand (see cli.h).
 */
#include "cli.h"
#include "util/dist.h"
#include "util/log.h"

#include <stdio.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    gptoss_cli_fn fn;
    const char *summary;
} cli_command;

static const cli_command commands[] = {
    {"run", gptoss_cmd_run, "generate from a prompt (token ids or text)"},
    {"info", gptoss_cmd_info, "what a checkpoint holds and what its KV cache costs"},
    {"make-model", gptoss_cmd_make_model,
     "write a random-weight checkpoint (tiny, 20b, 120b, config)"},
    {"convert", gptoss_cmd_convert, "write a model folder as one GGUF file (--to gguf)"},
    {"tokenize", gptoss_cmd_tokenize, "text on stdin -> o200k_harmony token ids"},
    {"detokenize", gptoss_cmd_detokenize, "token ids on stdin -> text"},
    {"chat", gptoss_cmd_chat, "interactive chat in the terminal (streams reasoning and answer)"},
    {"bench", gptoss_cmd_bench, "prefill/decode tokens/s on this GPU (llama-bench style table)"},
    {"serve", gptoss_cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench-serve", gptoss_cmd_bench_serve, "load generator for any OpenAI-compatible server"},
    /* more subcommands register here */
};

static void usage(FILE *out) {
    fprintf(out, "gptoss %s - inference for OpenAI's gpt-oss models\n\n", GPTOSS_VERSION_STRING);
    fprintf(out, "usage: gptoss [--log-level LEVEL] <command> [options]   (gptoss help <command> "
                 "for details)\n"
                 "       gptoss -V | --version\n\n");
    fprintf(out, "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nglobal options (before the command):\n");
    fprintf(out, "  --log-level LEVEL  error, warn, info (default) or debug: how much goes to the "
                 "log on stderr\n");
    fprintf(out,
            "                     (GPTOSS_LOG_LEVEL sets the same when the option is absent)\n");
    fprintf(out, "\nbackends: cpu%s\n", gptoss_has_cuda() ? ", cuda" : " (built without CUDA)");
}

/* Consumes the global options at argv[1..]; returns how many arguments they took, or -1 after
 * printing a usage error. */
static int parse_global_options(int argc, char **argv) {
    int used = 0;
    while (1 + used < argc) {
        const char *arg = argv[1 + used];
        const char *value = NULL;
        int n = 0;
        if (strcmp(arg, "--log-level") == 0) {
            if (2 + used >= argc) {
                fprintf(stderr, "gptoss: --log-level needs a value (error, warn, info or debug)\n");
                return -1;
            }
            value = argv[2 + used];
            n = 2;
        } else if (strncmp(arg, "--log-level=", 12) == 0) {
            value = arg + 12;
            n = 1;
        } else {
            break;
        }
        gptoss_log_level level;
        if (!gptoss_log_level_parse(value, &level)) {
            fprintf(stderr, "gptoss: --log-level '%s': expected error, warn, info or debug\n",
                    value);
            return -1;
        }
        gptoss_log_set_level(level);
        used += n;
    }
    return used;
}

int main(int argc, char **argv) {
    gptoss_dist_env_defaults(); /* before anything can initialize CUDA or NCCL */
    int global = parse_global_options(argc, argv);
    if (global < 0) return 2;
    argc -= global;
    argv += global;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "help") == 0 && argc >= 3) { /* gptoss help CMD: gptoss CMD --help */
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (strcmp(commands[i].name, argv[2]) == 0) {
                char *help_argv[] = {argv[2], "--help", NULL};
                return commands[i].fn(2, help_argv);
            }
        fprintf(stderr, "gptoss help: unknown command '%s'\n\n", argv[2]);
        usage(stderr);
        return 2;
    }
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(name, "-V") == 0 || strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) {
        printf("gptoss %s\n", GPTOSS_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "gptoss: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
