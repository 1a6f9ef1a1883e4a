/*
 * options.c - the table-driven option parser and the shared model and backend group (see
 * options.h).
 */
#include "options.h"

#include "cli.h"
#include "backend/tp_split.h"
#include "loader/hf_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char cli_fp8_layers_help[] = "CUDA: hold these dense layers in FP8 (e4m3 weights,\n"
                                   "one fp32 scale per output row): qkv, o, lm_head\n"
                                   "(comma-separated), all or none (default none). Decode\n"
                                   "reads half their bytes; logits move by a few percent;\n"
                                   "steps of over 16 tokens decode the rows to bf16 first\n"
                                   "(slower prefill). Refused with the CPU backend.";

const char cli_kv_cache_dtype_help[] = "KV cache format: bf16 (default) or fp8 (e4m3 values\n"
                                       "with one fp32 scale per token and KV head): about\n"
                                       "twice the tokens in the same memory; each K and V\n"
                                       "value moves by up to 2^-4 of itself. The CPU backend\n"
                                       "emulates fp8 (same values, fp32 pages).";

const char cli_cuda_profile_help[] = "CUDA: the kernel paths of this GPU (auto, the default)\n"
                                     "or of an older one on a newer GPU: ampere (A100:\n"
                                     "no FP8, TMA, wgmma or PDL; 163 KB shared memory per\n"
                                     "block), ada (RTX 4090: FP8 but no TMA, wgmma or PDL;\n"
                                     "99 KB), hopper (H100: everything). A profile above\n"
                                     "the GPU is refused. Start-up logs the paths chosen.";

static const cli_option *find_long(const cli_option_group *groups, size_t n_groups,
                                   const char *name) {
    for (size_t g = 0; g < n_groups; g++)
        for (size_t i = 0; i < groups[g].n_options; i++)
            if (!strcmp(groups[g].options[i].name, name)) return &groups[g].options[i];
    return NULL;
}

static const cli_option *find_short(const cli_option_group *groups, size_t n_groups, char c) {
    for (size_t g = 0; g < n_groups; g++)
        for (size_t i = 0; i < groups[g].n_options; i++)
            if (groups[g].options[i].short_name == c) return &groups[g].options[i];
    return NULL;
}

static bool parse_double(const char *text, double *out) {
    if (!*text) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end) return false;
    *out = v;
    return true;
}

/* The usage error of a bad value: the option's own message, else one from its bounds. */
static int bad_value(const char *cmd, const cli_option *o, const char *value) {
    if (o->error) return cli_usage_error(cmd, "%s", o->error);
    switch (o->kind) {
    case CLI_INT:
        return cli_usage_error(cmd, "--%s needs an integer in [%lld, %lld], not '%s'", o->name,
                               (long long)o->lo, (long long)o->hi, value);
    case CLI_DOUBLE:
        return cli_usage_error(cmd, "--%s needs a number in %c%g, %g], not '%s'", o->name,
                               o->lo_open ? '(' : '[', o->dlo, o->dhi, value);
    default: {
        char list[256] = "";
        size_t used = 0;
        for (size_t i = 0; o->choices && o->choices[i] && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                     i == 0              ? ""
                                     : o->choices[i + 1] ? ", "
                                                         : " or ",
                                     o->choices[i]);
        return cli_usage_error(cmd, "--%s must be %s, not '%s'", o->name, list, value);
    }
    }
}

static int set_value(const char *cmd, const cli_option *o, const char *value) {
    switch (o->kind) {
    case CLI_FLAG:
        *(bool *)o->target = true;
        return 0;
    case CLI_STRING:
        *(const char **)o->target = value;
        return 0;
    case CLI_INT: {
        int64_t v;
        if (!cli_parse_i64(value, o->lo, o->hi, &v)) return bad_value(cmd, o, value);
        *(int64_t *)o->target = v;
        return 0;
    }
    case CLI_DOUBLE: {
        double v;
        /* NaN fails both comparisons, so it is refused with the out-of-range values. */
        if (!parse_double(value, &v) || !(o->lo_open ? v > o->dlo : v >= o->dlo) || !(v <= o->dhi))
            return bad_value(cmd, o, value);
        *(double *)o->target = v;
        return 0;
    }
    case CLI_ENUM:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(o->choices[i], value)) {
                *(int *)o->target = i;
                return 0;
            }
        return bad_value(cmd, o, value);
    case CLI_CUSTOM:
        return o->parse(cmd, value, o->target);
    }
    return bad_value(cmd, o, value);
}

int cli_parse_options(const char *cmd, int argc, char **argv, const cli_option_group *groups,
                      size_t n_groups, bool *help) {
    *help = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            *help = true;
            return 0;
        }
        const cli_option *o = NULL;
        if (a[0] == '-' && a[1] == '-' && a[2])
            o = find_long(groups, n_groups, a + 2);
        else if (a[0] == '-' && a[1] && !a[2])
            o = find_short(groups, n_groups, a[1]);
        if (!o && a[0] != '-' && find_long(groups, n_groups, "model"))
            return cli_usage_error(cmd, "unexpected argument '%s' (to use it as the model: -m %s)",
                                   a, a);
        if (!o && a[0] != '-') return cli_usage_error(cmd, "unexpected argument '%s'", a);
        if (!o) return cli_usage_error(cmd, "unknown option '%s'", a);
        const char *value = NULL;
        if (o->kind != CLI_FLAG) {
            if (i + 1 >= argc)
                return cli_usage_error(cmd, "%s needs %s", a, o->needs ? o->needs : "a value");
            value = argv[++i];
        }
        int rc = set_value(cmd, o, value);
        if (rc) return rc;
    }
    return 0;
}

void cli_print_option_help(FILE *out, int column, const char *label, const char *text) {
    bool first = (int)strlen(label) + 3 <= column;
    if (!first) fprintf(out, "  %s\n", label);
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        if (first)
            fprintf(out, "  %-*s%.*s\n", column - 2, label, (int)len, p);
        else
            fprintf(out, "%*s%.*s\n", column, "", (int)len, p);
        first = false;
        p += len;
        if (*p) p++;
    }
    if (first) fprintf(out, "  %s\n", label); /* no text */
}

void cli_print_options(FILE *out, const cli_option_group *groups, size_t n_groups, int column) {
    for (size_t g = 0; g < n_groups; g++) {
        if (groups[g].heading) fputs(groups[g].heading, out);
        for (size_t i = 0; i < groups[g].n_options; i++) {
            const cli_option *o = &groups[g].options[i];
            if (o->hidden) continue;
            char label[160], value[96] = "";
            if (o->kind == CLI_ENUM) {
                size_t used = 0;
                for (size_t c = 0; o->choices[c] && used < sizeof value; c++)
                    used += (size_t)snprintf(value + used, sizeof value - used, "%s%s",
                                             c ? "|" : "", o->choices[c]);
            } else if (o->kind != CLI_FLAG)
                snprintf(value, sizeof value, "%s", o->value ? o->value : "VALUE");
            if (o->short_name)
                snprintf(label, sizeof label, "-%c, --%s%s%s", o->short_name, o->name,
                         *value ? " " : "", value);
            else
                snprintf(label, sizeof label, "--%s%s%s", o->name, *value ? " " : "", value);
            cli_print_option_help(out, column, label, o->help ? o->help : "");
        }
    }
}

static int parse_fp8_layers(const char *cmd, const char *value, void *target) {
    return cli_parse_fp8_layers(value, target) ? 0 : cli_fp8_layers_usage_error(cmd, value);
}

static int parse_kv_cache_dtype(const char *cmd, const char *value, void *target) {
    return cli_parse_kv_cache_dtype(value, target) ? 0 : cli_kv_cache_dtype_usage_error(cmd, value);
}

static const char *const backend_names[] = {"cpu", "cuda", NULL};
/* in the order of gptoss_cuda_profile */
static const char *const moe_parallel_names[] = {"ep", "tp", NULL};
static const char *const cuda_profile_names[] = {"auto", "ampere", "ada", "hopper", NULL};

cli_model_options cli_model_options_default(void) {
    return (cli_model_options){.backend = -1, .kv_cache_dtype = GPTOSS_KV_CACHE_BF16};
}

void cli_model_option_table(cli_model_options *m, cli_option table[CLI_MODEL_N_OPTIONS]) {
    table[0] = (cli_option){.name = "model",
                            .short_name = 'm',
                            .kind = CLI_STRING,
                            .target = &m->model_dir,
                            .value = "DIR",
                            .help = "the model: a Hugging Face gpt-oss folder (config.json,\n"
                                    "tokenizer.json, safetensors) or a repo id in the local\n"
                                    "Hugging Face cache (openai/gpt-oss-20b, ORG/NAME@REVISION)"};
    table[1] = (cli_option){.name = "backend",
                            .kind = CLI_ENUM,
                            .target = &m->backend,
                            .choices = backend_names,
                            .help = "compute backend (default: cuda when built with it, else cpu)",
                            .error = "--backend must be cpu or cuda"};
    table[2] = (cli_option){.name = "threads",
                            .short_name = 't',
                            .kind = CLI_INT,
                            .target = &m->threads,
                            .value = "N",
                            .lo = 1,
                            .hi = 4096,
                            .help = "CPU threads (default: all cores)",
                            .error = "--threads needs a positive integer"};
    table[3] = (cli_option){.name = "device",
                            .kind = CLI_INT,
                            .target = &m->device,
                            .value = "N",
                            .lo = 0,
                            .hi = 64,
                            .help = "CUDA device (default 0)",
                            .error = "--device needs an ordinal"};
    table[4] = (cli_option){.name = "fp8-layers",
                            .kind = CLI_CUSTOM,
                            .target = &m->fp8_layers,
                            .value = "LIST",
                            .parse = parse_fp8_layers,
                            .help = cli_fp8_layers_help};
    table[5] = (cli_option){.name = "kv-cache-dtype",
                            .kind = CLI_CUSTOM,
                            .target = &m->kv_cache_dtype,
                            .value = "bf16|fp8",
                            .parse = parse_kv_cache_dtype,
                            .help = cli_kv_cache_dtype_help};
    table[6] = (cli_option){.name = "cuda-profile",
                            .kind = CLI_ENUM,
                            .target = &m->cuda_profile,
                            .choices = cuda_profile_names,
                            .help = cli_cuda_profile_help,
                            .error = "--cuda-profile must be auto, ampere, ada or hopper"};
    table[7] = (cli_option){.name = "weights-in-host-memory",
                            .kind = CLI_FLAG,
                            .target = &m->weights_in_host_memory,
                            .help = "CUDA: use the weights in place in host memory (the\n"
                                    "mapped checkpoint, registered with the driver) instead\n"
                                    "of copying them to the GPU; the default on integrated\n"
                                    "GPUs (DGX Spark), slow over PCIe elsewhere"};
    table[8] = (cli_option){.name = "batch-invariant",
                            .kind = CLI_FLAG,
                            .target = &m->batch_invariant,
                            .help = "every request's logits bitwise the same whatever else\n"
                                    "shares its steps (one kernel per operation; slower on\n"
                                    "CUDA, see docs/batch-invariance.md)"};
    table[9] = (cli_option){.name = "tensor-parallel-size",
                            .kind = CLI_INT,
                            .target = &m->tensor_parallel,
                            .value = "N",
                            .lo = 1,
                            .hi = 8,
                            .help = "CUDA: split each layer over N GPUs (1, 2, 4 or 8;\n"
                                    "default 1; needs NCCL): this host's from --device on,\n"
                                    "or with serve --nnodes P, N / P on each of P hosts",
                            .error = "--tensor-parallel-size needs 1, 2, 4 or 8"};
    table[10] = (cli_option){.name = "moe-parallel",
                             .kind = CLI_ENUM,
                             .target = &m->moe_parallel,
                             .choices = moe_parallel_names,
                             .help = "with --tensor-parallel-size: the experts split by\n"
                                     "whole experts (ep, the default: each GPU runs its own\n"
                                     "experts of a token's top-k) or by their intermediate\n"
                                     "rows (tp: every GPU runs every chosen expert over 1/N\n"
                                     "of its rows; needs 2880 / N in whole 32-row groups)",
                             .error = "--moe-parallel must be ep or tp"};
}

int cli_model_options_apply(const char *cmd, const cli_model_options *m,
                            gptoss_backend_options *bo) {
    if (m->backend < 0)
        bo->kind = gptoss_has_cuda() ? GPTOSS_BACKEND_CUDA : GPTOSS_BACKEND_CPU;
    else
        bo->kind = m->backend == 1 ? GPTOSS_BACKEND_CUDA : GPTOSS_BACKEND_CPU;
    if (cli_check_fp8_layers(cmd, m->fp8_layers, bo->kind)) return 2;
    if (bo->kind == GPTOSS_BACKEND_CPU && (m->cuda_profile != 0 || m->weights_in_host_memory))
        return cli_usage_error(cmd,
                               "%s is a CUDA backend option (use --backend cuda, or leave it "
                               "out)",
                               m->cuda_profile != 0 ? "--cuda-profile"
                                                    : "--weights-in-host-memory");
    bo->cuda_profile = (gptoss_cuda_profile)m->cuda_profile;
    bo->weights_in_host_memory = m->weights_in_host_memory;
    bo->n_threads = (int32_t)m->threads;
    bo->device = (int32_t)m->device;
    bo->tensor_parallel_size = m->tensor_parallel > 0 ? (int32_t)m->tensor_parallel : 1;
    gptoss_error tp_error = {0};
    if (gptoss_tp_check_options(bo->tensor_parallel_size, bo->kind, &tp_error)) {
        fprintf(stderr, "gptoss %s: %s\n", cmd, tp_error.message);
        return 2;
    }
    bo->moe_parallel = m->moe_parallel;
    if (m->moe_parallel != 0 && bo->tensor_parallel_size <= 1)
        return cli_usage_error(cmd, "--moe-parallel needs --tensor-parallel-size 2, 4 or 8");
    bo->fp8_layers = m->fp8_layers;
    bo->kv_cache_dtype = m->kv_cache_dtype;
    bo->batch_invariant = m->batch_invariant;
    gptoss_error probe = {0};
    if (gptoss_backend_check_device(bo->kind, bo->device, &probe) != GPTOSS_OK)
        return cli_device_unusable(cmd, m->backend >= 0, &probe);
    return 0;
}

int cli_device_unusable(const char *cmd, bool chosen, const gptoss_error *probe) {
    fprintf(stderr, "gptoss %s: error: %s\n", cmd,
            probe->message[0] ? probe->message : gptoss_status_name(probe->status));
    fprintf(stderr,
            "%s To run on the CPU instead, add --backend cpu (the fp32 reference backend: right, "
            "but far too slow to serve gpt-oss-20b or gpt-oss-120b).\n",
            chosen ? "--backend cuda needs a CUDA build and a GPU of compute capability 8.0 or "
                     "newer."
                   : "This gptoss runs on the GPU (the CUDA backend) unless told otherwise.");
    return 1;
}

int cli_model_options_resolve(cli_model_options *m) {
    if (!m->model_dir) return 0;
    gptoss_model_location location;
    gptoss_error err = {0};
    if (gptoss_model_locate(m->model_dir, &location, &err) != GPTOSS_OK) return cli_fail(&err);
    snprintf(m->resolved_dir, sizeof m->resolved_dir, "%s", location.dir);
    snprintf(m->model_id, sizeof m->model_id, "%s", location.id);
    m->model_dir = m->resolved_dir;
    return 0;
}
