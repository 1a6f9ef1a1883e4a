/*
 * options.h - the table-driven option parser of the subcommands, and the "model and backend"
 * group (-m, --backend, -t, --device, --fp8-layers, --kv-cache-dtype) that run, chat, serve and
 * bench share.
 *
 * A command describes each option once (long name, short name, value kind and bounds, target,
 * help line); cli_parse_options fills the targets from argv and cli_print_options writes the
 * help from the same table, so the help and what is accepted cannot disagree.
 */
#ifndef GPTOSS_CLI_OPTIONS_H
#define GPTOSS_CLI_OPTIONS_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_option_kind {
    CLI_FLAG,   /* no value; sets *(bool *)target */
    CLI_INT,    /* base-10 integer in [lo, hi] into *(int64_t *)target */
    CLI_DOUBLE, /* number in [dlo, dhi] ((dlo, dhi] with lo_open) into *(double *)target */
    CLI_STRING, /* *(const char **)target points at the argument */
    CLI_ENUM,   /* one of choices (NULL-terminated); its index into *(int *)target */
    CLI_CUSTOM, /* parse(cmd, value, target) returns 0 or the exit status of a usage error */
} cli_option_kind;

typedef struct cli_option {
    const char *name; /* long name without the dashes */
    char short_name;  /* 0: none */
    cli_option_kind kind;
    void *target;
    const char *value; /* the value's name in the help ("N", "DIR"); enums list their choices */
    const char *help;  /* help text; '\n' starts another line */
    int64_t lo, hi;    /* CLI_INT bounds */
    double dlo, dhi;   /* CLI_DOUBLE bounds */
    bool lo_open;      /* CLI_DOUBLE: dlo itself is refused */
    const char *const *choices;
    int (*parse)(const char *cmd, const char *value, void *target);
    const char *error; /* the usage error for a bad value; NULL: one made from the bounds */
    const char *needs; /* what the value is, for the error when it is missing: "%s needs
                        * <needs>" ("a model folder"); NULL: "a value" */
    bool hidden;       /* accepted but left out of the help (measurement knobs) */
} cli_option;

typedef struct cli_option_group {
    const cli_option *options;
    size_t n_options;
    const char *heading; /* optional text printed before the group's help */
} cli_option_group;

/* Parses argv[1..argc) against the groups. Every argument must be a known option (with its
 * value where it takes one); -h or --help stops parsing and sets *help. Returns 0, or 2 after
 * printing a usage error naming the option ("gptoss CMD: ..."). */
int cli_parse_options(const char *cmd, int argc, char **argv, const cli_option_group *groups,
                      size_t n_groups, bool *help);

/* Writes the groups' help: "  -s, --name VALUE" then the text from `column`. */
void cli_print_options(FILE *out, const cli_option_group *groups, size_t n_groups, int column);

/* One option's help: the label, then the lines of text ('\n'-separated) from `column` (on the
 * label's line when the label fits before it, else on the lines below). */
void cli_print_option_help(FILE *out, int column, const char *label, const char *text);

/* The help of --fp8-layers, --kv-cache-dtype and --cuda-profile, the same in every command. */
extern const char cli_fp8_layers_help[];
extern const char cli_kv_cache_dtype_help[];
extern const char cli_cuda_profile_help[];

/* The shared model and backend options. */
typedef struct cli_model_options {
    const char *model_dir; /* -m as given; the folder after cli_model_options_resolve */
    char model_id[256];    /* after resolving: the id the model is served under */
    char resolved_dir[4096];
    int backend; /* -1: cuda when built with it, else cpu; else an index of "cpu", "cuda" */
    int64_t threads;
    int64_t device;
    int64_t tensor_parallel; /* --tensor-parallel-size (0: not given) */
    int moe_parallel;        /* --moe-parallel: an index of "ep", "tp" (gptoss_moe_parallel) */
    uint32_t fp8_layers;
    gptoss_kv_cache_dtype kv_cache_dtype;
    int cuda_profile;            /* gptoss_cuda_profile: an index of auto, ampere, ada, hopper */
    bool weights_in_host_memory; /* CUDA: weights used in place in host memory */
    bool batch_invariant;
} cli_model_options;

enum { CLI_MODEL_N_OPTIONS = 11 };

cli_model_options cli_model_options_default(void);

/* Fills `table` with the group's options bound to *m. */
void cli_model_option_table(cli_model_options *m, cli_option table[CLI_MODEL_N_OPTIONS]);

/* Resolves -m, a folder or a Hugging Face repo id in the local cache (loader/hf_cache.h):
 * model_dir then names the folder to load and model_id the id to serve it under. Returns 0
 * (also without -m), or 1 after printing why nothing was found. */
int cli_model_options_resolve(cli_model_options *m);

/* Copies the parsed options into *bo (kind, threads, device, fp8 layers, KV dtype, batch
 * invariance) and checks
 * that the backend can run here, before any model is loaded. Returns 0, 2 after a usage
 * error (FP8 layers asked of the CPU backend), or 1 when the CUDA backend has no usable GPU
 * (cli_device_unusable). */
int cli_model_options_apply(const char *cmd, const cli_model_options *m,
                            gptoss_backend_options *bo);

/* Prints why the CUDA backend cannot run (probe: the check's error) and how to run on the
 * CPU instead; `chosen`: --backend cuda was given rather than defaulted. Returns 1. */
int cli_device_unusable(const char *cmd, bool chosen, const gptoss_error *probe);

#endif
