/*
 * cmd_chat.c - `gptoss chat` (an interactive terminal chat) and the text-prompt half of
 * `gptoss run` (`run -p TEXT`), which share one generation loop.
 *
 * Owns: a single-sequence generation session on top of the public API (model, backend, a
 * contiguous KV block table, the ids already in the KV cache), a small host-side sampler
 * (greedy, or temperature + top-p with a seeded generator), the terminal output of a reply
 * (reasoning dimmed on a TTY, prefixed otherwise; control characters from the model never
 * reach the terminal raw), and the chat loop with its slash commands and Ctrl-C handling.
 * Must not know harmony's rules: prompts come from chat/chat.h, replies are parsed there.
 */
#include "chat/chat.h"
#include "chat/chat_buf.h"
#include "cli.h"
#include "util/error.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- generation session ------------------------------------------------------------------ */

typedef struct session {
    gptoss_model *model;
    gptoss_backend *backend;
    gptoss_tokenizer *tokenizer;
    int32_t vocab;            /* rows of the model's logits */
    int32_t n_sample;         /* ids the sampler may pick: the tokenizer's ids (<= vocab) */
    float *logits;            /* [vocab] logits after the last fed token */
    int32_t *block_table;     /* [n_blocks] identity map: position p lives in block p / block size */
    int32_t n_blocks;
    int32_t capacity;         /* tokens the KV cache holds */
    int32_t *cached;          /* [capacity] ids whose K/V are in the cache, in order */
    int32_t n_cached;
} session;

typedef struct sampling {
    double temperature; /* 0: greedy */
    double top_p;       /* nucleus mass in (0, 1] */
    uint64_t rng;       /* xorshift64* state, from --seed */
} sampling;

static void session_close(session *s) {
    free(s->logits), free(s->block_table), free(s->cached);
    gptoss_backend_free(s->backend);
    gptoss_model_free(s->model);
    gptoss_tokenizer_free(s->tokenizer);
    memset(s, 0, sizeof *s);
}

static gptoss_status session_open(session *s, const char *dir, const char *backend_name, int64_t threads,
                                  int64_t context, uint32_t fp8_layers, gptoss_kv_cache_dtype kv_cache_dtype,
                                  gptoss_error *err) {
    memset(s, 0, sizeof *s);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    gptoss_status st = gptoss_tokenizer_load(path, &s->tokenizer, err);
    if (st) return st;
    if ((st = gptoss_model_load(dir, &s->model, err))) return st;
    const gptoss_config *c = gptoss_model_config(s->model);
    int32_t n_tok = gptoss_tokenizer_n_vocab(s->tokenizer);
    if (c->vocab_size <= GPTOSS_TOKEN_CALL)
        return gptoss_set_error(err, GPTOSS_ERR_UNSUPPORTED,
                                "%s: the model's vocab_size is %d but text prompts need the o200k_harmony ids "
                                "(up to %d, <|call|> is %d); use a model with the real vocabulary, e.g. "
                                "gptoss make-model --preset tiny -o DIR, or give ids with --tokens",
                                dir, c->vocab_size, n_tok - 1, (int)GPTOSS_TOKEN_CALL);
    s->vocab = c->vocab_size;
    s->n_sample = n_tok < s->vocab ? n_tok : s->vocab; /* padding rows are never sampled */
    gptoss_backend_options options = gptoss_backend_options_default();
    options.kind = gptoss_has_cuda() ? GPTOSS_BACKEND_CUDA : GPTOSS_BACKEND_CPU;
    if (backend_name && !strcmp(backend_name, "cpu")) options.kind = GPTOSS_BACKEND_CPU;
    else if (backend_name && !strcmp(backend_name, "cuda")) options.kind = GPTOSS_BACKEND_CUDA;
    else if (backend_name)
        return gptoss_set_error(err, GPTOSS_ERR_INVALID_ARGUMENT, "--backend must be cpu or cuda, not '%s'",
                                backend_name);
    options.n_threads = (int32_t)threads;
    options.fp8_layers = fp8_layers;
    options.kv_cache_dtype = kv_cache_dtype;
    options.n_kv_blocks = (int32_t)((context + options.kv_block_size - 1) / options.kv_block_size);
    if (cli_stderr_is_tty()) options.progress = cli_progress;
    if ((st = gptoss_backend_create(s->model, &options, &s->backend, err))) return st;
    s->n_blocks = options.n_kv_blocks;
    s->capacity = s->n_blocks * options.kv_block_size;
    s->logits = malloc((size_t)s->vocab * sizeof *s->logits);
    s->block_table = malloc((size_t)s->n_blocks * sizeof *s->block_table);
    s->cached = malloc((size_t)s->capacity * sizeof *s->cached);
    if (!s->logits || !s->block_table || !s->cached) return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t b = 0; b < s->n_blocks; b++) s->block_table[b] = b;
    return GPTOSS_OK;
}

/* Makes the cache hold exactly ids[0..n) and leaves the logits after the last one. Reuses the
 * longest prefix already cached (earlier turns of a chat) and recomputes only the rest. */
static gptoss_status session_set_prompt(session *s, const int32_t *ids, int32_t n, gptoss_error *err) {
    if (n <= 0) return gptoss_set_error(err, GPTOSS_ERR_INVALID_ARGUMENT, "empty prompt");
    if (n >= s->capacity)
        return gptoss_set_error(err, GPTOSS_ERR_CAPACITY,
                                "the prompt has %d tokens but the context holds %d; use /reset or a larger --context",
                                n, s->capacity);
    int32_t keep = 0;
    while (keep < s->n_cached && keep < n - 1 && s->cached[keep] == ids[keep]) keep++;
    int32_t len = n - keep;
    int32_t *positions = malloc((size_t)len * sizeof *positions);
    if (!positions) return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < len; i++) positions[i] = keep + i;
    int32_t starts[2] = {0, len}, last = len - 1;
    memcpy(s->cached + keep, ids + keep, (size_t)len * sizeof *ids);
    gptoss_batch_plan plan = {.n_tokens = len, .token_ids = s->cached + keep, .positions = positions, .n_seqs = 1,
                              .seq_token_start = starts, .seq_n_cached = &keep, .max_blocks_per_seq = s->n_blocks,
                              .block_tables = s->block_table, .n_logits = 1, .logit_token_index = &last};
    gptoss_status st = gptoss_backend_forward(s->backend, &plan, s->logits, err);
    free(positions);
    s->n_cached = st ? keep : n;
    return st;
}

/* Appends one generated id to the cache; false (no error) when the context is full. */
static gptoss_status session_feed(session *s, int32_t id, bool *full, gptoss_error *err) {
    *full = s->n_cached + 1 >= s->capacity;
    if (*full) return GPTOSS_OK;
    int32_t pos = s->n_cached, starts[2] = {0, 1}, zero = 0;
    s->cached[pos] = id;
    gptoss_batch_plan plan = {.n_tokens = 1, .token_ids = &s->cached[pos], .positions = &pos, .n_seqs = 1,
                              .seq_token_start = starts, .seq_n_cached = &pos, .max_blocks_per_seq = s->n_blocks,
                              .block_tables = s->block_table, .n_logits = 1, .logit_token_index = &zero};
    gptoss_status st = gptoss_backend_forward(s->backend, &plan, s->logits, err);
    if (!st) s->n_cached++;
    return st;
}

static double next_uniform(uint64_t *state) {
    uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *state = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

typedef struct candidate {
    int32_t id;
    double p;
} candidate;

static int by_probability(const void *a, const void *b) {
    double pa = ((const candidate *)a)->p, pb = ((const candidate *)b)->p;
    return pa < pb ? 1 : pa > pb ? -1 : 0;
}

/* Greedy at temperature 0; otherwise softmax(logits / T), the smallest set of most likely ids
 * whose mass reaches top_p, and one draw from it. */
static int32_t sample(const session *s, sampling *params, candidate *scratch) {
    const float *logits = s->logits;
    int32_t best = 0;
    for (int32_t v = 1; v < s->n_sample; v++)
        if (logits[v] > logits[best]) best = v;
    if (params->temperature <= 0) return best;
    double total = 0;
    for (int32_t v = 0; v < s->n_sample; v++) {
        scratch[v].id = v;
        scratch[v].p = exp(((double)logits[v] - logits[best]) / params->temperature);
        total += scratch[v].p;
    }
    qsort(scratch, (size_t)s->n_sample, sizeof *scratch, by_probability);
    int32_t n = 0;
    double mass = 0;
    while (n < s->n_sample && (n == 0 || mass < params->top_p * total)) mass += scratch[n++].p;
    double r = next_uniform(&params->rng) * mass;
    for (int32_t i = 0; i < n; i++) {
        r -= scratch[i].p;
        if (r <= 0) return scratch[i].id;
    }
    return scratch[n - 1].id;
}

/* ---- terminal output -------------------------------------------------------------------- */

static volatile sig_atomic_t interrupts; /* Ctrl-C presses not yet handled */

static void on_sigint(int signo) {
    (void)signo;
    interrupts++;
}

typedef struct printer {
    bool tty;          /* stdout is a terminal: dim reasoning, no prefixes */
    int section;       /* 0 none, 1 reasoning, 2 answer, 3 tool call */
} printer;

/* Writes model text; control characters other than newline and tab become '?', so a model
 * cannot move the cursor or change the terminal. */
static void print_text(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        fputc(c < 0x20 && c != '\n' && c != '\t' ? '?' : c == 0x7f ? '?' : c, stdout);
    }
}

static void enter_section(printer *p, int section) {
    if (p->section == section) return;
    if (p->tty && p->section == 1) fputs("\033[0m", stdout);
    if (p->section != 0) fputc('\n', stdout);
    p->section = section;
    if (section == 1) fputs(p->tty ? "\033[2m" : "[reasoning] ", stdout);
    else if (section == 2 && !p->tty) fputs("[answer] ", stdout);
}

static void end_sections(printer *p) {
    if (p->tty && p->section == 1) fputs("\033[0m", stdout);
    if (p->section != 0) fputc('\n', stdout);
    p->section = 0;
    fflush(stdout);
}

static void print_pieces(printer *pr, gptoss_chat_stream *stream, gptoss_chat_buf *answer) {
    size_t n = 0;
    const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(stream, &n);
    for (size_t i = 0; i < n; i++) {
        const gptoss_chat_piece *p = &pieces[i];
        switch (p->kind) {
        case GPTOSS_CHAT_PIECE_REASONING:
            enter_section(pr, 1);
            print_text(p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_CONTENT:
            enter_section(pr, 2);
            print_text(p->text, p->len);
            if (answer && !p->preamble) gptoss_chat_buf_append(answer, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_TOOL_CALL:
            enter_section(pr, 3);
            fputs("[tool call ", stdout);
            print_text(p->name, strlen(p->name));
            fputs("] ", stdout);
            break;
        case GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS:
            print_text(p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_FINISH:
            break;
        }
    }
    fflush(stdout);
}

typedef struct reply_stats {
    int32_t n_generated;
    const char *finish;  /* "stop", "tool_calls", "length", "interrupted", "context full" */
} reply_stats;

/* Generates after the prompt now in the session, printing as it goes. The answer text (not
 * reasoning) is appended to *answer when given. */
static gptoss_status generate_reply(session *s, sampling *params, int64_t max_tokens, printer *pr,
                                    gptoss_chat_buf *answer, reply_stats *stats, gptoss_error *err) {
    memset(stats, 0, sizeof *stats);
    gptoss_chat_stream *stream = NULL;
    candidate *scratch = NULL;
    gptoss_status st = gptoss_chat_stream_create(s->tokenizer, NULL, &stream, err);
    if (st) return st;
    if (params->temperature > 0 && !(scratch = malloc((size_t)s->n_sample * sizeof *scratch))) {
        gptoss_chat_stream_free(stream);
        return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    const char *finish = NULL;
    for (int64_t g = 0; g < max_tokens; g++) {
        if (interrupts) {
            finish = "interrupted";
            break;
        }
        int32_t id = sample(s, params, scratch);
        stats->n_generated++;
        if ((st = gptoss_chat_stream_push(stream, id, err))) break;
        print_pieces(pr, stream, answer);
        if (gptoss_chat_stream_done(stream)) break;
        if (g + 1 == max_tokens) break;
        bool full = false;
        if ((st = session_feed(s, id, &full, err))) break;
        if (full) {
            finish = "context full";
            break;
        }
    }
    if (!st && !(st = gptoss_chat_stream_finish(stream, err))) {
        print_pieces(pr, stream, answer);
        size_t n = 0;
        const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(stream, &n);
        stats->finish = finish ? finish : pieces[n - 1].finish_reason;
    }
    end_sections(pr);
    free(scratch);
    gptoss_chat_stream_free(stream);
    return st;
}

/* ---- shared options ---------------------------------------------------------------------- */

typedef struct common_options {
    const char *model_dir, *backend, *date;
    int64_t threads, max_tokens, context;
    uint32_t fp8_layers; /* gptoss_fp8_layer bits */
    gptoss_kv_cache_dtype kv_cache_dtype;
    gptoss_reasoning_effort effort;
    sampling sampling;
} common_options;

/* Parses an option both commands share; returns 1 if consumed (advancing *i), 0 if not
 * ours, 2 after printing a usage error (the caller returns 2). */
static int parse_common(const char *cmd, int argc, char **argv, int *i, common_options *o) {
    const char *a = argv[*i];
    bool has_value = *i + 1 < argc;
    const char *v = has_value ? argv[*i + 1] : NULL;
    if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) o->model_dir = v;
    else if (!strcmp(a, "--backend") && has_value) o->backend = v;
    else if (!strcmp(a, "--date") && has_value) {
        int y, mo, d;
        char extra;
        if (strlen(v) != 10 || sscanf(v, "%4d-%2d-%2d%c", &y, &mo, &d, &extra) != 3 || mo < 1 || mo > 12 || d < 1 ||
            d > 31)
            return cli_usage_error(cmd, "--date needs YYYY-MM-DD, got '%s'", v);
        o->date = v;
    } else if (!strcmp(a, "--fp8-layers") && has_value) {
        if (!cli_parse_fp8_layers(v, &o->fp8_layers)) return cli_fp8_layers_usage_error(cmd, v);
    } else if (!strcmp(a, "--kv-cache-dtype") && has_value) {
        if (!cli_parse_kv_cache_dtype(v, &o->kv_cache_dtype)) return cli_kv_cache_dtype_usage_error(cmd, v);
    } else if (!strcmp(a, "--effort") && has_value) {
        if (!gptoss_reasoning_effort_parse(v, &o->effort))
            return cli_usage_error(cmd, "--effort must be low, medium or high, not '%s'", v);
    } else if ((!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) && has_value) {
        if (!cli_parse_i64(v, 1, 1 << 20, &o->max_tokens)) return cli_usage_error(cmd, "--max-tokens needs an integer in [1, 1048576]");
    } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && has_value) {
        if (!cli_parse_i64(v, 1, 4096, &o->threads)) return cli_usage_error(cmd, "--threads needs a positive integer");
    } else if (!strcmp(a, "--context") && has_value) {
        if (!cli_parse_i64(v, 64, 1 << 20, &o->context)) return cli_usage_error(cmd, "--context needs an integer in [64, 1048576]");
    } else if (!strcmp(a, "--temperature") && has_value) {
        char *end;
        o->sampling.temperature = strtod(v, &end);
        if (*end || end == v || !(o->sampling.temperature >= 0 && o->sampling.temperature <= 10))
            return cli_usage_error(cmd, "--temperature needs a number in [0, 10]");
    } else if (!strcmp(a, "--top-p") && has_value) {
        char *end;
        o->sampling.top_p = strtod(v, &end);
        if (*end || end == v || !(o->sampling.top_p > 0 && o->sampling.top_p <= 1))
            return cli_usage_error(cmd, "--top-p needs a number in (0, 1]");
    } else if (!strcmp(a, "--seed") && has_value) {
        int64_t seed;
        if (!cli_parse_i64(v, 0, INT64_MAX, &seed)) return cli_usage_error(cmd, "--seed needs a non-negative integer");
        o->sampling.rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    } else
        return 0;
    (*i)++;
    return 1;
}

/* Checks what the options ask of the backend before anything loads (2: usage error printed).
 * A --backend name other than cpu and cuda is left to session_open to refuse. */
static int check_common(const char *cmd, const common_options *o) {
    bool cpu = o->backend ? !strcmp(o->backend, "cpu") : !gptoss_has_cuda();
    return cli_check_fp8_layers(cmd, o->fp8_layers, cpu ? GPTOSS_BACKEND_CPU : GPTOSS_BACKEND_CUDA) ? 2 : 0;
}

static void common_defaults(common_options *o, int64_t max_tokens) {
    memset(o, 0, sizeof *o);
    o->max_tokens = max_tokens;
    o->context = 4096;
    o->effort = GPTOSS_EFFORT_MEDIUM;
    o->sampling.top_p = 1.0;
    o->sampling.rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + 1;
}

static const char *today(char *buf, size_t size) {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(buf, size, "%Y-%m-%d", &tm);
    return buf;
}

static const char *const common_help =
    "  -m, --model DIR       Hugging Face gpt-oss folder (config.json, tokenizer.json, safetensors)\n"
    "  --effort LEVEL        reasoning effort: low, medium (default) or high\n"
    "  --date YYYY-MM-DD     date for the system message (default: today)\n"
    "  --temperature T       sampling temperature (default 0: greedy)\n"
    "  --top-p P             nucleus sampling mass (default 1)\n"
    "  --seed S              seed of the sampler (default: from the clock)\n"
    "  --context N           tokens the KV cache holds (default 4096)\n"
    "  --backend cpu|cuda    compute backend (default: cuda when built with it, else cpu)\n"
    "  -t, --threads N       CPU threads (default: all cores)\n";

/* Renders a chat-completions request in the session, or explains why it cannot. */
static gptoss_status set_chat_prompt(session *s, const json_t *request, const char *date, gptoss_error *err) {
    gptoss_openai_chat_options options = {.current_date = date};
    gptoss_chat_prompt prompt;
    gptoss_status st = gptoss_chat_prompt_from_request(s->tokenizer, request, &options, &prompt, err);
    if (st) return st;
    st = session_set_prompt(s, prompt.tokens.ids, (int32_t)prompt.tokens.n, err);
    gptoss_chat_prompt_free(&prompt);
    return st;
}

/* ---- gptoss run -p TEXT ------------------------------------------------------------------ */

static gptoss_status run_raw(session *s, const char *text, bool special, common_options *o, gptoss_error *err) {
    gptoss_tokens ids = {0};
    gptoss_status st = gptoss_tokenizer_encode(s->tokenizer, text, strlen(text), special, &ids, err);
    if (!st && ids.n == 0) st = gptoss_set_error(err, GPTOSS_ERR_INVALID_ARGUMENT, "the prompt is empty");
    if (!st) st = session_set_prompt(s, ids.ids, (int32_t)ids.n, err);
    gptoss_tokens_free(&ids);
    if (st) return st;
    gptoss_stream_decoder decoder;
    gptoss_stream_decoder_init(&decoder, s->tokenizer);
    size_t capacity = gptoss_stream_decoder_out_capacity(s->tokenizer);
    char *out = malloc(capacity);
    candidate *scratch = o->sampling.temperature > 0 ? malloc((size_t)s->n_sample * sizeof *scratch) : NULL;
    if (!out || (o->sampling.temperature > 0 && !scratch)) {
        free(out), free(scratch);
        return gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int64_t g = 0; g < o->max_tokens && !st; g++) {
        int32_t id = sample(s, &o->sampling, scratch);
        size_t len = 0;
        if ((st = gptoss_stream_decoder_push(&decoder, id, out, capacity, &len, err))) break;
        print_text(out, len);
        fflush(stdout);
        if (id == GPTOSS_TOKEN_RETURN || id == GPTOSS_TOKEN_CALL || id == GPTOSS_TOKEN_ENDOFTEXT) break;
        bool full = false;
        if (g + 1 < o->max_tokens && !(st = session_feed(s, id, &full, err)) && full) break;
    }
    size_t len = 0;
    gptoss_stream_decoder_flush(&decoder, out, capacity, &len);
    print_text(out, len);
    fputc('\n', stdout);
    free(out), free(scratch);
    return st;
}

static void run_help(FILE *out) {
    fprintf(out,
            "usage: gptoss run -m DIR -p TEXT [options]\n"
            "       gptoss run -m DIR --tokens \"ID ID ...\" [options]   (see gptoss run --tokens --help)\n\n"
            "Renders TEXT as a one-turn chat (harmony: default system message, your text as the user\n"
            "message) and prints the reply as it is generated: the reasoning (dimmed on a terminal,\n"
            "prefixed [reasoning] otherwise), then the answer ([answer]). Stops at <|return|> or <|call|>.\n\n"
            "options:\n"
            "  -p, --prompt TEXT     the user message\n"
            "  --raw                 no chat rendering: TEXT is tokenized as is and continued\n"
            "  --special             with --raw: special-token text such as <|start|> becomes its id\n"
            "  -n, --max-tokens N    tokens to generate (default 256)\n"
            "%s",
            common_help);
    cli_print_fp8_layers_help(out, 24);
    cli_print_kv_cache_dtype_help(out, 24);
}

int cli_run_text(int argc, char **argv) {
    common_options o;
    common_defaults(&o, 256);
    const char *prompt = NULL;
    bool raw = false, special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_help(stdout);
            return 0;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(a, "--raw")) raw = true;
        else if (!strcmp(a, "--special")) special = true;
        else {
            int r = parse_common("run", argc, argv, &i, &o);
            if (r == 2) return 2;
            if (r == 0) return cli_usage_error("run", "unknown or incomplete option '%s'", a);
        }
    }
    if (!o.model_dir) return cli_usage_error("run", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    if (!prompt) return cli_usage_error("run", "missing -p TEXT");
    if (special && !raw) return cli_usage_error("run", "--special only applies with --raw (chat prompts never parse special tokens in user text)");
    if (check_common("run", &o)) return 2;
    gptoss_error err = {0};
    session s;
    gptoss_status st =
        session_open(&s, o.model_dir, o.backend, o.threads, o.context, o.fp8_layers, o.kv_cache_dtype, &err);
    if (!st && raw) st = run_raw(&s, prompt, special, &o, &err);
    if (!st && !raw) {
        char date[16];
        json_t *request = json_pack("{s:s, s:[{s:s, s:s}]}", "reasoning_effort", gptoss_reasoning_effort_name(o.effort),
                                    "messages", "role", "user", "content", prompt);
        if (!request) st = gptoss_set_error(&err, GPTOSS_ERR_INVALID_ARGUMENT, "the prompt is not valid UTF-8");
        if (!st) st = set_chat_prompt(&s, request, o.date ? o.date : today(date, sizeof date), &err);
        json_decref(request);
        printer pr = {.tty = isatty(STDOUT_FILENO) != 0};
        reply_stats stats;
        double t0 = cli_now_seconds();
        if (!st) st = generate_reply(&s, &o.sampling, o.max_tokens, &pr, NULL, &stats, &err);
        double t1 = cli_now_seconds();
        if (!st)
            fprintf(stderr, "finish: %s; %d tokens in %.2f s (%.1f tok/s)\n", stats.finish, stats.n_generated, t1 - t0,
                    stats.n_generated / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    }
    session_close(&s);
    return st ? cli_fail(&err) : 0;
}

/* ---- gptoss chat -------------------------------------------------------------------------- */

static void chat_help(FILE *out) {
    fprintf(out,
            "usage: gptoss chat -m DIR [options]\n\n"
            "An interactive chat in the terminal. Earlier turns stay in the conversation (their\n"
            "reasoning is dropped, as harmony prescribes); replies stream as they are generated, the\n"
            "reasoning dimmed.\n\n"
            "commands at the prompt:\n"
            "  /effort low|medium|high   change the reasoning effort\n"
            "  /reset                    forget the conversation\n"
            "  /quit                     leave (so do end-of-file and Ctrl-C twice at the prompt)\n"
            "  Ctrl-C while a reply streams stops that reply.\n\n"
            "options:\n"
            "  -n, --max-tokens N    tokens per reply (default 512)\n"
            "%s",
            common_help);
    cli_print_fp8_layers_help(out, 24);
    cli_print_kv_cache_dtype_help(out, 24);
}

/* Reads one line from stdin into buf (newline stripped). Returns 1 for a line, 0 for end of
 * input, -1 when Ctrl-C interrupted the read. */
static int read_line(char *buf, size_t size) {
    clearerr(stdin);
    if (fgets(buf, (int)size, stdin)) {
        size_t n = strlen(buf);
        if (n > 0 && buf[n - 1] == '\n') buf[--n] = '\0';
        else if (n + 1 == size) { /* a very long line: drop its rest */
            int c;
            while ((c = getchar()) != EOF && c != '\n') {}
        }
        return 1;
    }
    if (ferror(stdin) && errno == EINTR) return -1;
    return 0;
}

static bool add_message(json_t *messages, const char *role, const char *content) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m && json_array_append_new(messages, m) == 0;
}

int gptoss_cmd_chat(int argc, char **argv) {
    common_options o;
    common_defaults(&o, 512);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            chat_help(stdout);
            return 0;
        }
        int r = parse_common("chat", argc, argv, &i, &o);
        if (r == 2) return 2;
        if (r == 0) return cli_usage_error("chat", "unknown or incomplete option '%s'", a);
    }
    if (!o.model_dir) return cli_usage_error("chat", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    if (check_common("chat", &o)) return 2;

    gptoss_error err = {0};
    session s;
    if (session_open(&s, o.model_dir, o.backend, o.threads, o.context, o.fp8_layers, o.kv_cache_dtype, &err)) {
        session_close(&s);
        return cli_fail(&err);
    }
    /* No SA_RESTART: Ctrl-C must interrupt a blocked read at the prompt. */
    struct sigaction action = {0}, previous;
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous);

    char date_buf[16];
    const char *date = o.date ? o.date : today(date_buf, sizeof date_buf);
    json_t *messages = json_array();
    printer pr = {.tty = isatty(STDOUT_FILENO) != 0};
    printf("gptoss chat: %s (effort %s). /effort low|medium|high, /reset, /quit; Ctrl-C stops a reply.\n",
           o.model_dir, gptoss_reasoning_effort_name(o.effort));
    char line[16384];
    bool armed = false; /* the last prompt ended in Ctrl-C */
    int rc = 0;
    for (;;) {
        fputs("> ", stdout);
        fflush(stdout);
        int got = read_line(line, sizeof line);
        if (got < 0 || (got > 0 && interrupts)) {
            /* Ctrl-C at the prompt: the first one explains, a second one in a row exits. */
            interrupts = 0;
            if (armed) break;
            armed = true;
            printf("\n(Ctrl-C again or /quit to leave)\n");
            continue;
        }
        armed = false;
        if (got == 0) {
            fputc('\n', stdout);
            break;
        }
        if (line[0] == '\0') continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(messages);
            printf("[conversation reset]\n");
            continue;
        }
        if (!strncmp(line, "/effort", 7)) {
            const char *word = line + 7;
            while (*word == ' ') word++;
            if (gptoss_reasoning_effort_parse(word, &o.effort)) printf("[effort: %s]\n", word);
            else printf("[usage: /effort low|medium|high]\n");
            continue;
        }
        if (line[0] == '/') {
            printf("[unknown command %s: /effort low|medium|high, /reset, /quit]\n", line);
            continue;
        }
        if (!add_message(messages, "user", line)) {
            printf("[the message is not valid UTF-8; not sent]\n");
            continue;
        }
        json_t *request = json_pack("{s:s, s:O}", "reasoning_effort", gptoss_reasoning_effort_name(o.effort),
                                    "messages", messages);
        gptoss_chat_buf answer = {0};
        reply_stats stats = {0};
        interrupts = 0;
        gptoss_status st = request ? set_chat_prompt(&s, request, date, &err)
                                   : gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        json_decref(request);
        if (!st) st = generate_reply(&s, &o.sampling, o.max_tokens, &pr, &answer, &stats, &err);
        if (st) {
            /* The turn failed (e.g. the context is full): say so and keep the session usable. */
            fprintf(stderr, "gptoss: %s\n", err.message);
            json_array_remove(messages, json_array_size(messages) - 1);
        } else {
            if (strcmp(stats.finish, "stop") != 0) printf("[%s after %d tokens]\n", stats.finish, stats.n_generated);
            gptoss_chat_buf_terminate(&answer);
            if (!add_message(messages, "assistant", answer.data ? answer.data : "")) {
                json_array_remove(messages, json_array_size(messages) - 1);
                printf("[the reply could not be kept in the history]\n");
            }
        }
        gptoss_chat_buf_free(&answer);
        interrupts = 0;
    }
    printf("bye\n");
    sigaction(SIGINT, &previous, NULL);
    json_decref(messages);
    session_close(&s);
    return rc;
}
