/*
 * cmd_convert.c - `gptoss convert --to gguf -m DIR -o FILE.gguf`: a Hugging Face gpt-oss
 * folder written as one GGUF file that llama.cpp, Ollama and gptoss itself load
 * (loader/gguf_model.h says what is written).
 */
#include "cli.h"
#include "loader/gguf_model.h"
#include "options.h"
#include "util/clock.h"

#include <stdio.h>
#include <string.h>

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out, "usage: gptoss convert --to gguf -m DIR -o FILE.gguf\n\n"
                 "Writes a Hugging Face gpt-oss folder as one GGUF file with llama.cpp's gpt-oss\n"
                 "tensor names and metadata: MXFP4 experts, BF16 matrices, F32 vectors and the\n"
                 "tokenizer, so the file alone is a complete model (lossless: gptoss computes the\n"
                 "same logits from it as from the folder).\n\n"
                 "options:\n");
    cli_print_options(out, groups, n_groups, 20);
}

int gptoss_cmd_convert(int argc, char **argv) {
    static const char *const formats[] = {"gguf", NULL};
    int to = -1;
    const char *model_dir = NULL, *out_path = NULL;
    const cli_option own[] = {
        {.name = "to",
         .kind = CLI_ENUM,
         .target = &to,
         .choices = formats,
         .help = "output format (gguf)"},
        {.name = "model",
         .short_name = 'm',
         .kind = CLI_STRING,
         .target = &model_dir,
         .value = "DIR",
         .help = "Hugging Face gpt-oss folder",
         .needs = "a model folder"},
        {.name = "output",
         .short_name = 'o',
         .kind = CLI_STRING,
         .target = &out_path,
         .value = "FILE",
         .help = "the file to write",
         .needs = "a file name"},
    };
    const cli_option_group groups[] = {{own, 3, NULL}};
    bool want_help;
    int usage = cli_parse_options("convert", argc, argv, groups, 1, &want_help);
    if (usage) return usage;
    if (want_help) {
        help(stdout, groups, 1);
        return 0;
    }
    if (to < 0) return cli_usage_error("convert", "missing --to gguf");
    if (!model_dir) return cli_usage_error("convert", "missing -m DIR");
    if (!out_path) return cli_usage_error("convert", "missing -o FILE");
    double t0 = gptoss_now_seconds();
    gptoss_error err = {0};
    if (gptoss_gguf_convert(model_dir, out_path, &err) != GPTOSS_OK) return cli_fail(&err);
    fprintf(stderr, "gptoss convert: wrote %s in %.1f s\n", out_path, gptoss_now_seconds() - t0);
    return 0;
}
