/*
 * cmd_tokenize.c - `gptoss tokenize` (text on stdin -> token ids) and `gptoss detokenize`
 * (token ids on stdin -> bytes on stdout), plus `tokenize --bench` for encoder throughput.
 *
 * Owns: argument parsing, reading stdin, and the output formats of these two commands.
 * Must not: tokenize by itself; everything goes through tokenizer/tokenizer.h.
 */
#include "cli.h"
#include "options.h"

#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tokenize_usage[] =
    "usage: gptoss tokenize [-m DIR | --tokenizer FILE] [--special] [--json] [--bench]\n"
    "\n"
    "Reads text (UTF-8; any bytes are accepted) from stdin and prints its o200k_harmony token\n"
    "ids, space-separated on one line.\n"
    "\n"
    "options:\n";

static const char tokenize_examples[] =
    "  -h, --help             this text\n"
    "\n"
    "examples:\n"
    "  echo -n 'hello world' | gptoss tokenize -m ~/models/gpt-oss-20b     -> 24912 2375\n"
    "  printf '<|start|>user' | gptoss tokenize -t tokenizer.json --special  -> 200006 1428\n";

static const char detokenize_usage[] =
    "usage: gptoss detokenize [-m DIR | --tokenizer FILE] [--json]\n"
    "\n"
    "Reads token ids from stdin, either separated by whitespace and/or commas or as a JSON\n"
    "array, and writes the bytes they decode to to stdout (special tokens as their text).\n"
    "An unknown id or anything that is not an id is an error; nothing is written then.\n"
    "\n"
    "options:\n";

static const char detokenize_example[] =
    "  -h, --help             this text\n"
    "\n"
    "example:\n"
    "  echo '24912 2375' | gptoss detokenize -m ~/models/gpt-oss-20b   -> hello world\n";

typedef struct tok_options {
    const char *model_dir; /* -m, resolved (model_buf) */
    char model_buf[4096];
    const char *tokenizer_path; /* --tokenizer */
    bool special;               /* --special */
    bool json;                  /* --json */
    bool bench;                 /* --bench */
} tok_options;

/* Returns -1 to continue, or the exit status to return now. Here -t is --tokenizer: these
 * commands load no model, so they do not take the model group's -t, --threads. */
static int parse_options(const char *cmd, int argc, char **argv, bool is_tokenize,
                         tok_options *opt) {
    memset(opt, 0, sizeof *opt);
    cli_model_options mo = cli_model_options_default();
    cli_option shared[CLI_MODEL_N_OPTIONS];
    cli_model_option_table(&mo, shared);
    shared[0].help = "model folder; its tokenizer.json is used";
    shared[0].needs = "a model folder";
    const cli_option own[] = {
        {.name = "tokenizer",
         .short_name = 't',
         .kind = CLI_STRING,
         .target = &opt->tokenizer_path,
         .value = "FILE",
         .help = "a tokenizer.json file",
         .needs = "a tokenizer.json path"},
        {.name = "json",
         .short_name = 'j',
         .kind = CLI_FLAG,
         .target = &opt->json,
         .help = is_tokenize ? "print a JSON array instead"
                             : "print the text as a JSON string (bytes that are not valid UTF-8\n"
                               "become U+FFFD, since JSON text must be Unicode)"},
        {.name = "special",
         .short_name = 's',
         .kind = CLI_FLAG,
         .target = &opt->special,
         .help = "parse special tokens such as <|start|> into their ids\n"
                 "(default: they are ordinary text, as harmony renders user text)"},
        {.name = "bench",
         .kind = CLI_FLAG,
         .target = &opt->bench,
         .help = "do not print ids: encode the input repeatedly for about 2 s and\n"
                 "report load time, tokens and throughput in MB/s (one thread)"},
    };
    /* detokenize takes neither --special nor --bench. */
    const cli_option_group groups[] = {{shared, 1, NULL}, {own, is_tokenize ? 4u : 2u, NULL}};
    bool want_help;
    int rc = cli_parse_options(cmd, argc, argv, groups, 2, &want_help);
    if (rc) return rc;
    if (want_help) {
        fputs(is_tokenize ? tokenize_usage : detokenize_usage, stdout);
        cli_print_options(stdout, groups, 2, 25);
        fputs(is_tokenize ? tokenize_examples : detokenize_example, stdout);
        return 0;
    }
    if (mo.model_dir && opt->tokenizer_path)
        return cli_usage_error(cmd, "give either -m DIR or --tokenizer FILE, not both");
    if (!mo.model_dir && !opt->tokenizer_path)
        return cli_usage_error(cmd,
                               "which tokenizer? give -m DIR (a model folder) or --tokenizer FILE");
    if (cli_model_options_resolve(&mo)) return 1;
    if (mo.model_dir) {
        snprintf(opt->model_buf, sizeof opt->model_buf, "%s", mo.model_dir);
        opt->model_dir = opt->model_buf;
    }
    return -1;
}

static gptoss_status load_tokenizer(const tok_options *opt, gptoss_tokenizer **tok,
                                    gptoss_error *err) {
    if (opt->tokenizer_path) return gptoss_tokenizer_load(opt->tokenizer_path, tok, err);
    size_t n = strlen(opt->model_dir) + sizeof "/tokenizer.json";
    char *path = malloc(n);
    if (!path) return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    gptoss_tokenizer_path_for_model(opt->model_dir, path, n);
    gptoss_status st = gptoss_tokenizer_load(path, tok, err);
    free(path);
    return st;
}

/* Reads all of stdin into a malloc'd buffer (NUL-terminated; *len excludes the NUL). */
static gptoss_status read_stdin(char **data, size_t *len, gptoss_error *err) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory reading stdin");
    for (;;) {
        if (cap - n < 2) {
            cap *= 2;
            char *grown = realloc(buf, cap);
            if (!grown) {
                free(buf);
                return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY,
                                        "out of memory reading stdin (%zu bytes so far)", n);
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return gptoss_set_error(err, GPTOSS_ERR_IO, "cannot read stdin: %s", strerror(errno));
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return GPTOSS_OK;
}

static int run_bench(const gptoss_tokenizer *tok, const char *text, size_t len, bool special,
                     double load_s) {
    gptoss_tokens ids = {0};
    gptoss_error err = {0};
    double best = 1e30, start = gptoss_now_seconds();
    int runs = 0;
    size_t n_tokens = 0;
    /* At least 3 runs and about 2 s; the best run is reported (least disturbed by others). */
    while (runs < 3 || gptoss_now_seconds() - start < 2.0) {
        ids.n = 0;
        double t0 = gptoss_now_seconds();
        if (gptoss_tokenizer_encode(tok, text, len, special, &ids, &err)) {
            gptoss_tokens_free(&ids);
            return cli_fail(&err);
        }
        double dt = gptoss_now_seconds() - t0;
        if (dt < best) best = dt;
        n_tokens = ids.n;
        runs++;
    }
    gptoss_tokens_free(&ids);
    printf("tokenizer load: %.3f s\n", load_s);
    printf("input: %zu bytes, %zu tokens (%.2f bytes/token)\n", len, n_tokens,
           n_tokens ? (double)len / (double)n_tokens : 0.0);
    printf("encode: best of %d runs %.4f s = %.2f MB/s, %.2f M tokens/s\n", runs, best,
           (double)len / best / 1e6, (double)n_tokens / best / 1e6);
    return 0;
}

int gptoss_cmd_tokenize(int argc, char **argv) {
    tok_options opt;
    int rc = parse_options("tokenize", argc, argv, true, &opt);
    if (rc >= 0) return rc;
    gptoss_error err = {0};
    gptoss_tokenizer *tok = NULL;
    double t0 = gptoss_now_seconds();
    if (load_tokenizer(&opt, &tok, &err)) return cli_fail(&err);
    double load_s = gptoss_now_seconds() - t0;
    char *text = NULL;
    size_t len = 0;
    if (read_stdin(&text, &len, &err)) {
        gptoss_tokenizer_free(tok);
        return cli_fail(&err);
    }
    if (opt.bench) {
        rc = run_bench(tok, text, len, opt.special, load_s);
        free(text);
        gptoss_tokenizer_free(tok);
        return rc;
    }
    gptoss_tokens ids = {0};
    if (gptoss_tokenizer_encode(tok, text, len, opt.special, &ids, &err)) {
        free(text);
        gptoss_tokenizer_free(tok);
        return cli_fail(&err);
    }
    if (opt.json) putchar('[');
    for (size_t i = 0; i < ids.n; i++)
        printf(i ? (opt.json ? ",%d" : " %d") : "%d", ids.ids[i]);
    if (opt.json) putchar(']');
    putchar('\n');
    gptoss_tokens_free(&ids);
    free(text);
    gptoss_tokenizer_free(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "gptoss tokenize: cannot write stdout: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Parses ids: "1 2,3" or "[1, 2, 3]". On failure prints what and where, returns false. */
static bool parse_ids(const char *text, size_t len, gptoss_tokens *ids) {
    size_t i = 0;
    while (i < len && is_space(text[i]))
        i++;
    bool array = i < len && text[i] == '[';
    if (array) i++;
    bool need_separator = false, closed = false;
    gptoss_error err = {0};
    while (i < len) {
        char c = text[i];
        if (is_space(c)) {
            i++;
            continue;
        }
        if (c == ',') {
            if (!need_separator) {
                fprintf(
                    stderr,
                    "gptoss detokenize: unexpected ',' at byte %zu of the input (empty entry)\n",
                    i);
                return false;
            }
            need_separator = false;
            i++;
            continue;
        }
        if (array && c == ']') {
            closed = true;
            i++;
            while (i < len && is_space(text[i]))
                i++;
            if (i < len) {
                fprintf(stderr,
                        "gptoss detokenize: unexpected data after ']' at byte %zu of the input\n",
                        i);
                return false;
            }
            break;
        }
        if (array && need_separator) {
            fprintf(stderr, "gptoss detokenize: expected ',' or ']' at byte %zu of the input\n", i);
            return false;
        }
        size_t start = i;
        while (i < len && !is_space(text[i]) && text[i] != ',' && text[i] != ']' && text[i] != '[')
            i++;
        if (i == start) i++; /* a lone '[' or ']' out of place */
        int64_t v;
        char word[32];
        size_t wlen = i - start;
        bool ok = wlen < sizeof word;
        if (ok) {
            memcpy(word, text + start, wlen);
            word[wlen] = '\0';
            ok = cli_parse_i64(word, 0, INT32_MAX, &v);
        }
        if (!ok) {
            fprintf(stderr,
                    "gptoss detokenize: '%.*s' at byte %zu of the input is not a token id "
                    "(expected a non-negative integer)\n",
                    (int)(wlen > 40 ? 40 : wlen), text + start, start);
            return false;
        }
        if (gptoss_tokens_push(ids, (int32_t)v, &err)) {
            fprintf(stderr, "gptoss detokenize: %s\n", err.message);
            return false;
        }
        need_separator = true;
    }
    if (array && !closed) {
        fprintf(stderr, "gptoss detokenize: the JSON array is not closed with ']'\n");
        return false;
    }
    return true;
}

/* Writes bytes as a JSON string, replacing invalid UTF-8 with U+FFFD. */
static void print_json_string(const gptoss_tokenizer *tok, const int32_t *ids, size_t n) {
    gptoss_stream_decoder dec;
    gptoss_stream_decoder_init(&dec, tok);
    size_t cap = gptoss_stream_decoder_out_capacity(tok);
    char *buf = malloc(cap);
    if (!buf) return;
    putchar('"');
    for (size_t i = 0; i <= n; i++) {
        size_t len = 0;
        if (i < n) {
            gptoss_error err = {0};
            if (gptoss_stream_decoder_push(&dec, ids[i], buf, cap, &len, &err))
                len = 0; /* ids were checked */
        } else {
            gptoss_stream_decoder_flush(&dec, buf, cap, &len);
        }
        for (size_t j = 0; j < len; j++) {
            unsigned char c = (unsigned char)buf[j];
            if (c == '"' || c == '\\')
                printf("\\%c", c);
            else if (c == '\n')
                fputs("\\n", stdout);
            else if (c == '\r')
                fputs("\\r", stdout);
            else if (c == '\t')
                fputs("\\t", stdout);
            else if (c < 0x20 || c == 0x7f)
                printf("\\u%04x", c);
            else
                putchar(c);
        }
    }
    fputs("\"\n", stdout);
    free(buf);
}

int gptoss_cmd_detokenize(int argc, char **argv) {
    tok_options opt;
    int rc = parse_options("detokenize", argc, argv, false, &opt);
    if (rc >= 0) return rc;
    gptoss_error err = {0};
    gptoss_tokenizer *tok = NULL;
    if (load_tokenizer(&opt, &tok, &err)) return cli_fail(&err);
    char *input = NULL;
    size_t input_len = 0;
    if (read_stdin(&input, &input_len, &err)) {
        gptoss_tokenizer_free(tok);
        return cli_fail(&err);
    }
    gptoss_tokens ids = {0};
    rc = 0;
    if (!parse_ids(input, input_len, &ids)) {
        rc = 1;
    } else {
        char *text = NULL;
        size_t len = 0;
        if (gptoss_tokenizer_decode(tok, ids.ids, ids.n, &text, &len, &err)) {
            rc = cli_fail(&err);
        } else if (opt.json) {
            print_json_string(tok, ids.ids, ids.n);
        } else if (len && fwrite(text, 1, len, stdout) != len) {
            fprintf(stderr, "gptoss detokenize: cannot write stdout: %s\n", strerror(errno));
            rc = 1;
        }
        free(text);
    }
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "gptoss detokenize: cannot write stdout: %s\n", strerror(errno));
        rc = 1;
    }
    gptoss_tokens_free(&ids);
    free(input);
    gptoss_tokenizer_free(tok);
    return rc;
}
