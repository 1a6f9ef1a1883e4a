/*
 * cmd_info.c - `gptoss info`: what a checkpoint holds (shape, tensors, dtypes, parameter
 * counts, bytes) and what its KV cache costs per token.
 */
#include "cli.h"
#include "options.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/error.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(out, "usage: gptoss info -m DIR|FILE.gguf [--tensors]\n\n"
                 "Validates a gpt-oss checkpoint (a folder or a GGUF file) and prints its\n"
                 "configuration, parameter counts, bytes, and the KV cache cost per token.\n\n"
                 "options:\n");
    cli_print_options(out, groups, n_groups, 20);
}

static void print_tensor(const gptoss_tensor *t) {
    char shape[96];
    size_t used = (size_t)snprintf(shape, sizeof shape, "[");
    for (int32_t d = 0; d < t->n_dims && used < sizeof shape; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (used < sizeof shape) snprintf(shape + used, sizeof shape - used, "]");
    printf("  %-52s %-5s %-24s %14zu\n", t->name, gptoss_dtype_name(t->dtype), shape, t->n_bytes);
}

int gptoss_cmd_info(int argc, char **argv) {
    bool tensors = false;
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    shared[0].help = "the model folder, a GGUF file, or a repo id in the local Hugging\nFace cache";
    const cli_option own[] = {{.name = "tensors",
                               .kind = CLI_FLAG,
                               .target = &tensors,
                               .help = "also list every tensor with dtype, shape and bytes"}};
    const cli_option_group groups[] = {{shared, 1, NULL}, {own, 1, NULL}};
    bool want_help;
    int usage = cli_parse_options("info", argc, argv, groups, 2, &want_help);
    if (usage) return usage;
    if (want_help) {
        help(stdout, groups, 2);
        return 0;
    }
    if (!mo.model_dir) return cli_usage_error("info", "missing -m DIR");
    if (cli_model_options_resolve(&mo)) return 1;
    const char *model_dir = mo.model_dir;
    gptoss_error err = {0};
    gptoss_model *model = NULL;
    if (gptoss_model_load(model_dir, &model, &err) != GPTOSS_OK) return cli_fail(&err);
    const gptoss_config *c = gptoss_model_config(model);
    const gptoss_weights *w = gptoss_model_weights(model);

    int32_t n_sliding = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        n_sliding += c->layer_is_sliding[l];
    struct stat sb;
    bool is_file = stat(model_dir, &sb) == 0 && S_ISREG(sb.st_mode);
    printf("model: %s (%s)\n", model_dir, is_file ? "GGUF file" : "Hugging Face folder");
    printf("  layers %d (%d sliding window %d, %d full), hidden %d, expert width %d\n", c->n_layers,
           n_sliding, c->sliding_window, c->n_layers - n_sliding, c->hidden_size,
           c->intermediate_size);
    printf("  attention: %d query heads, %d KV heads, head_dim %d, sinks; RoPE YaRN theta %g "
           "factor %g (L0 %d)\n",
           c->n_heads, c->n_kv_heads, c->head_dim, c->rope_theta, c->rope_scaling_factor,
           c->rope_original_max_position_embeddings);
    printf("  experts: %d, top-%d; vocab %d; context %d\n", c->n_experts, c->n_experts_per_token,
           c->vocab_size, c->max_position_embeddings);

    int64_t n_tensors = 0, bytes = 0, mx_bytes = 0;
    const gptoss_tensor *globals[] = {&w->embedding, &w->final_norm, &w->lm_head};
    for (size_t i = 0; i < 3; i++)
        n_tensors++, bytes += (int64_t)globals[i]->n_bytes;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const gptoss_tensor *lt = &w->layers[l].attn_norm;
        for (int32_t k = 0; k < 19; k++) {
            n_tensors++;
            bytes += (int64_t)lt[k].n_bytes;
            if (lt[k].dtype == GPTOSS_DTYPE_U8) mx_bytes += (int64_t)lt[k].n_bytes;
        }
    }
    printf("tensors: %lld, %.3f GB (%.3f GB MXFP4 expert blocks+scales, %.3f GB BF16/F32)\n",
           (long long)n_tensors, bytes / 1e9, mx_bytes / 1e9, (bytes - mx_bytes) / 1e9);
    printf("parameters: %lld total (%.2f B); %lld active per token excluding the embedding table "
           "(%.2f B)\n",
           (long long)gptoss_config_n_params(c), gptoss_config_n_params(c) / 1e9,
           (long long)gptoss_config_n_active_params(c), gptoss_config_n_active_params(c) / 1e9);
    for (int dtype = GPTOSS_KV_CACHE_BF16; dtype <= GPTOSS_KV_CACHE_FP8; dtype++) {
        /* K and V of a token in one layer, as the CUDA backend stores them */
        gptoss_kv_cache_dtype kv = (gptoss_kv_cache_dtype)dtype;
        int64_t layer_token = (int64_t)gptoss_kv_cache_token_bytes(c, GPTOSS_BACKEND_CUDA, kv);
        int64_t per_token_full = (c->n_layers - n_sliding) * layer_token;
        int64_t sliding_total = (int64_t)n_sliding * layer_token * c->sliding_window;
        printf("kv cache (%s): %lld bytes per token on full layers + %lld bytes per sequence for "
               "sliding layers "
               "(window %d); 128k tokens = %.2f GB\n",
               dtype == GPTOSS_KV_CACHE_FP8 ? "fp8, --kv-cache-dtype fp8" : "bf16",
               (long long)per_token_full, (long long)sliding_total, c->sliding_window,
               (131072.0 * per_token_full + sliding_total) / 1e9);
    }
    if (tensors) {
        printf("\n");
        for (size_t i = 0; i < 3; i++)
            print_tensor(globals[i]);
        for (int32_t l = 0; l < c->n_layers; l++) {
            const gptoss_tensor *lt = &w->layers[l].attn_norm;
            for (int32_t k = 0; k < 19; k++)
                print_tensor(&lt[k]);
        }
    }
    gptoss_model_free(model);
    return 0;
}
