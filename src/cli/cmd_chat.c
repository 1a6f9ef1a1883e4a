/*
 * cmd_chat.c - `gptoss chat` (an interactive terminal chat) and the text-prompt half of
 * `gptoss run` (`run -p TEXT`), which share one generation path.
 *
 * Owns: a session on top of the engine (model, backend, tokenizer, and an engine of one
 * sequence whose prefix cache keeps the conversation's KV between turns), the terminal
 * output of a reply (reasoning dimmed on a TTY, prefixed otherwise; control characters from
 * the model never reach the terminal raw), and the chat loop with its slash commands and
 * Ctrl-C handling. Sampling, stop tokens and KV pages are the engine's, as for the server.
 * Must not know harmony's rules: prompts come from chat/chat.h, replies are parsed there.
 */
#include "chat/chat.h"
#include "chat/chat_buf.h"
#include "cli.h"
#include "options.h"
#include "draft_options.h"
#include "gptoss_engine.h"
#include "engine/kv_plan.h"
#include "util/error.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef GPTOSS_WITH_LIBEDIT
#include <histedit.h>
#endif

/* ---- generation session ------------------------------------------------------------------ */

typedef struct session {
    gptoss_model *model;
    gptoss_backend *backend;
    gptoss_tokenizer *tokenizer;
    gptoss_engine *engine;
    int32_t vocab;    /* rows of the model's logits */
    int32_t n_sample; /* ids that may be drawn: the tokenizer's ids (<= vocab) */
    int32_t capacity; /* tokens the KV cache holds: prompt + reply of one turn */
} session;

static void session_close(session *s) {
    gptoss_engine_free(s->engine);
    gptoss_backend_free(s->backend);
    gptoss_model_free(s->model);
    gptoss_tokenizer_free(s->tokenizer);
    memset(s, 0, sizeof *s);
}

/* The ids a draw may pick: those the tokenizer can decode, so the padding rows of the
 * unembedding are never drawn (the engine's allowed-token hook). */
static bool text_ids_allowed(void *user, int32_t choice, const int32_t *generated,
                             int32_t n_generated, uint32_t *mask, int32_t vocab_size) {
    (void)choice, (void)generated, (void)n_generated;
    const session *s = user;
    const int32_t n_words = (vocab_size + 31) / 32;
    for (int32_t w = 0; w < n_words; w++) {
        const int32_t first = w * 32;
        uint32_t bits = 0;
        if (first + 32 <= s->n_sample)
            bits = 0xffffffffu;
        else if (first < s->n_sample)
            bits = (1u << (s->n_sample - first)) - 1u;
        mask[w] = bits;
    }
    return s->n_sample > 0;
}

static gptoss_status session_open(session *s, const char *dir, gptoss_backend_options options,
                                  int64_t context, const cli_draft_options *draft,
                                  gptoss_error *err) {
    memset(s, 0, sizeof *s);
    char path[4096];
    gptoss_tokenizer_path_for_model(dir, path, sizeof path);
    gptoss_status st = gptoss_tokenizer_load(path, &s->tokenizer, err);
    if (st) return st;
    if ((st = gptoss_model_load(dir, &s->model, err))) return st;
    const gptoss_config *c = gptoss_model_config(s->model);
    int32_t n_tok = gptoss_tokenizer_n_vocab(s->tokenizer);
    if (c->vocab_size <= GPTOSS_TOKEN_CALL)
        return gptoss_set_error(
            err, GPTOSS_ERR_UNSUPPORTED,
            "%s: the model's vocab_size is %d but text prompts need the o200k_harmony ids "
            "(up to %d, <|call|> is %d); use a model with the real vocabulary, e.g. "
            "gptoss make-model --preset tiny -o DIR, or give ids with --tokens",
            dir, c->vocab_size, n_tok - 1, (int)GPTOSS_TOKEN_CALL);
    s->vocab = c->vocab_size;
    s->n_sample = n_tok < s->vocab ? n_tok : s->vocab;
    gptoss_kv_plan_context(c, context, &options);
    if (cli_stderr_is_tty()) options.progress = cli_progress;
    if ((st = gptoss_backend_create(s->model, &options, &s->backend, err))) return st;
    options = gptoss_backend_get_options(s->backend);
    s->capacity = options.n_kv_blocks * options.kv_block_size;

    gptoss_engine_options eo = gptoss_engine_options_default();
    eo.max_model_len = s->capacity;
    gptoss_engine_options_for_backend(&eo, c, s->backend, &options);
    if (eo.max_model_len < s->capacity) s->capacity = eo.max_model_len;
    int32_t stop_ids[GPTOSS_CHAT_MAX_STOP_IDS];
    gptoss_engine_options_set_eos(&eo, stop_ids, gptoss_chat_stop_ids(stop_ids));
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = s->capacity; /* a prompt in one step */
    cli_draft_options_apply(draft, &eo);
    if ((st = gptoss_engine_create(&eo, &s->engine, err))) return st;
    /* The engine thread (and the backend's workers it starts) never takes Ctrl-C: the
     * signal must interrupt this thread's read at the prompt. */
    sigset_t block, previous;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &previous);
    st = gptoss_engine_start(s->engine, err);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return st;
}

/* ---- terminal output -------------------------------------------------------------------- */

static volatile sig_atomic_t interrupts; /* Ctrl-C presses not yet handled */

static void on_sigint(int signo) {
    (void)signo;
    interrupts++;
}

typedef struct printer {
    bool tty;    /* stdout is a terminal: dim reasoning, no prefixes */
    int section; /* 0 none, 1 reasoning, 2 answer, 3 tool call */
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
    if (section == 1)
        fputs(p->tty ? "\033[2m" : "[reasoning] ", stdout);
    else if (section == 2 && !p->tty)
        fputs("[answer] ", stdout);
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
    double decode_seconds; /* from the first token to the last */
    const char *finish;    /* "stop", "tool_calls", "length", "interrupted", "context full" */
} reply_stats;

static bool interrupted(void *user) {
    (void)user;
    return interrupts != 0;
}

/* What a reply's tokens go through on their way to the terminal. */
typedef struct reply_sink {
    gptoss_chat_stream *stream; /* a chat reply: harmony parsed into pieces */
    printer *pr;
    gptoss_chat_buf *answer;        /* the answer text (not reasoning), when wanted */
    gptoss_stream_decoder *decoder; /* a raw continuation: text as it is */
    char *text;
    size_t text_capacity;
    gptoss_status st; /* the first failure (out of memory) */
    gptoss_error err;
} reply_sink;

static bool on_reply_token(void *user, const gptoss_engine_event *event) {
    reply_sink *r = user;
    if (r->stream) {
        if ((r->st = gptoss_chat_stream_push(r->stream, event->token_id, &r->err))) return false;
        print_pieces(r->pr, r->stream, r->answer);
        return true;
    }
    size_t len = 0;
    if ((r->st = gptoss_stream_decoder_push(r->decoder, event->token_id, r->text, r->text_capacity,
                                            &len, &r->err)))
        return false;
    print_text(r->text, len);
    fflush(stdout);
    return true;
}

/* Generates after ids[0..n) through the engine, at most max_tokens tokens, handing them to
 * sink; Ctrl-C stops the reply. */
static gptoss_status generate_reply(session *s, const int32_t *ids, size_t n,
                                    const gptoss_sampling_params *params, int64_t max_tokens,
                                    reply_sink *sink, reply_stats *stats, gptoss_error *err) {
    memset(stats, 0, sizeof *stats);
    if ((int64_t)n >= s->capacity)
        return gptoss_set_error(
            err, GPTOSS_ERR_CAPACITY,
            "the prompt has %zu tokens but the context holds %d; use /reset or a larger --context",
            n, s->capacity);
    /* max_tokens, or what is left of the context (then a reply cut short ran out of it) */
    bool limited = s->capacity - (int64_t)n < max_tokens;
    gptoss_sampling_params p = *params;
    p.max_tokens = (int32_t)(limited ? s->capacity - (int64_t)n : max_tokens);
    /* every id when the tokenizer decodes the whole vocabulary, else only those it decodes */
    gptoss_request_options ro = {.allowed_tokens = s->n_sample < s->vocab ? text_ids_allowed : NULL,
                                 .allowed_tokens_user = s,
                                 .allowed_tokens_stateless = true}; /* drafts may be asked */
    gptoss_generate_options go = {.on_token = on_reply_token,
                                  .should_stop = interrupted,
                                  .user = sink,
                                  .request_options = &ro};
    gptoss_generate_result result;
    gptoss_status st = gptoss_engine_generate(s->engine, ids, (int32_t)n, &p, &go, &result, err);
    if (st) return st;
    if (sink->st) {
        *err = sink->err;
        return sink->st;
    }
    stats->n_generated = result.n_generated;
    stats->decode_seconds = result.seconds - result.first_token_seconds;
    if (result.finish == GPTOSS_FINISH_CANCELLED)
        stats->finish = "interrupted";
    else if (result.finish == GPTOSS_FINISH_LENGTH && limited)
        stats->finish = "context full";
    return GPTOSS_OK;
}

/* A chat reply to the rendered prompt, printed as it streams. The answer text (not
 * reasoning) is appended to *answer when given. */
static gptoss_status chat_reply(session *s, const gptoss_chat_prompt *prompt,
                                const gptoss_sampling_params *params, int64_t max_tokens,
                                printer *pr, gptoss_chat_buf *answer, reply_stats *stats,
                                gptoss_error *err) {
    reply_sink sink = {.pr = pr, .answer = answer};
    gptoss_status st = gptoss_chat_stream_create(s->tokenizer, NULL, &sink.stream, err);
    if (st) return st;
    st = generate_reply(s, prompt->tokens.ids, prompt->tokens.n, params, max_tokens, &sink, stats,
                        err);
    if (!st && !(st = gptoss_chat_stream_finish(sink.stream, err))) {
        print_pieces(pr, sink.stream, answer);
        size_t n = 0;
        const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(sink.stream, &n);
        if (!stats->finish) stats->finish = pieces[n - 1].finish_reason;
    }
    end_sections(pr);
    gptoss_chat_stream_free(sink.stream);
    return st;
}

/* ---- shared options ---------------------------------------------------------------------- */

typedef struct common_options {
    cli_model_options model;
    cli_draft_options draft;
    const char *date;
    int64_t max_tokens, context, seed;
    double temperature, top_p;
    gptoss_reasoning_effort effort;
    gptoss_sampling_params sampling; /* from the fields above, by finish_common */
} common_options;

static int parse_date(const char *cmd, const char *v, void *target) {
    int y, mo, d;
    char extra;
    if (strlen(v) != 10 || sscanf(v, "%4d-%2d-%2d%c", &y, &mo, &d, &extra) != 3 || mo < 1 ||
        mo > 12 || d < 1 || d > 31)
        return cli_usage_error(cmd, "--date needs YYYY-MM-DD, got '%s'", v);
    *(const char **)target = v;
    return 0;
}

static int parse_effort(const char *cmd, const char *v, void *target) {
    if (gptoss_reasoning_effort_parse(v, target)) return 0;
    return cli_usage_error(cmd, "--effort must be low, medium or high, not '%s'", v);
}

enum { N_COMMON = 6 };

/* The options both commands share (after the command's own), bound to *o. */
static void common_table(common_options *o, const char *seed_help, cli_option t[N_COMMON]) {
    t[0] = (cli_option){.name = "effort",
                        .kind = CLI_CUSTOM,
                        .target = &o->effort,
                        .value = "LEVEL",
                        .parse = parse_effort,
                        .help = "reasoning effort: low, medium (default) or high"};
    t[1] = (cli_option){.name = "date",
                        .kind = CLI_CUSTOM,
                        .target = &o->date,
                        .value = "YYYY-MM-DD",
                        .parse = parse_date,
                        .help = "date for the system message (default: today)"};
    t[2] = (cli_option){.name = "temperature",
                        .kind = CLI_DOUBLE,
                        .target = &o->temperature,
                        .value = "T",
                        .dlo = 0,
                        .dhi = 10,
                        .help = "sampling temperature (default 0: greedy)",
                        .error = "--temperature needs a number in [0, 10]"};
    t[3] = (cli_option){.name = "top-p",
                        .kind = CLI_DOUBLE,
                        .target = &o->top_p,
                        .value = "P",
                        .dlo = 0,
                        .dhi = 1,
                        .lo_open = true,
                        .help = "nucleus sampling mass (default 1)",
                        .error = "--top-p needs a number in (0, 1]"};
    t[4] = (cli_option){.name = "seed",
                        .kind = CLI_INT,
                        .target = &o->seed,
                        .value = "S",
                        .lo = 0,
                        .hi = INT64_MAX,
                        .help = seed_help,
                        .error = "--seed needs a non-negative integer"};
    t[5] = (cli_option){.name = "context",
                        .kind = CLI_INT,
                        .target = &o->context,
                        .value = "N",
                        .lo = 64,
                        .hi = 1 << 20,
                        .help = "tokens the KV cache holds (default 4096)",
                        .error = "--context needs an integer in [64, 1048576]"};
}

/* -n, --max-tokens, whose default differs between the commands. */
static cli_option max_tokens_option(common_options *o, const char *help) {
    return (cli_option){.name = "max-tokens",
                        .short_name = 'n',
                        .kind = CLI_INT,
                        .target = &o->max_tokens,
                        .value = "N",
                        .lo = 1,
                        .hi = 1 << 20,
                        .help = help,
                        .error = "--max-tokens needs an integer in [1, 1048576]"};
}

static void common_defaults(common_options *o, int64_t max_tokens) {
    memset(o, 0, sizeof *o);
    o->model = cli_model_options_default();
    o->draft = cli_draft_options_default();
    o->max_tokens = max_tokens;
    o->context = 4096;
    o->seed = -1;
    o->temperature = 0; /* greedy unless asked */
    o->top_p = 1;
    o->effort = GPTOSS_EFFORT_MEDIUM;
}

/* After parsing: the sampling parameters, the backend options and the model folder (0, or
 * the exit status after an error was printed). */
static int finish_common(const char *cmd, common_options *o, gptoss_backend_options *bo) {
    o->sampling = gptoss_sampling_params_default();
    o->sampling.temperature = (float)o->temperature;
    o->sampling.top_p = (float)o->top_p;
    o->sampling.has_seed = o->seed >= 0;
    o->sampling.seed = o->seed >= 0 ? (uint64_t)o->seed : 0;
    *bo = gptoss_backend_options_default();
    int rc = cli_model_options_apply(cmd, &o->model, bo);
    return rc ? rc : cli_model_options_resolve(&o->model);
}

static const char *today(char *buf, size_t size) {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(buf, size, "%Y-%m-%d", &tm);
    return buf;
}

/* Renders a chat-completions request and replies to it. */
static gptoss_status reply_to_request(session *s, const json_t *request, const char *date,
                                      const gptoss_sampling_params *params, int64_t max_tokens,
                                      printer *pr, gptoss_chat_buf *answer, reply_stats *stats,
                                      gptoss_error *err) {
    gptoss_openai_chat_options options = {.current_date = date};
    gptoss_chat_prompt prompt;
    gptoss_status st =
        gptoss_chat_prompt_from_request(s->tokenizer, request, &options, &prompt, err);
    if (st) return st;
    st = chat_reply(s, &prompt, params, max_tokens, pr, answer, stats, err);
    gptoss_chat_prompt_free(&prompt);
    return st;
}

/* ---- gptoss run -p TEXT ------------------------------------------------------------------ */

/* --raw: TEXT tokenized as is and continued, every token printed as text. */
static gptoss_status run_raw(session *s, const char *text, bool special, common_options *o,
                             gptoss_error *err) {
    gptoss_tokens ids = {0};
    gptoss_status st =
        gptoss_tokenizer_encode(s->tokenizer, text, strlen(text), special, &ids, err);
    if (!st && ids.n == 0)
        st = gptoss_set_error(err, GPTOSS_ERR_INVALID_ARGUMENT, "the prompt is empty");
    gptoss_stream_decoder decoder;
    gptoss_stream_decoder_init(&decoder, s->tokenizer);
    reply_sink sink = {.decoder = &decoder,
                       .text_capacity = gptoss_stream_decoder_out_capacity(s->tokenizer)};
    if (!st && !(sink.text = malloc(sink.text_capacity)))
        st = gptoss_set_error(err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
    reply_stats stats;
    if (!st)
        st = generate_reply(s, ids.ids, ids.n, &o->sampling, o->max_tokens, &sink, &stats, err);
    if (sink.text) {
        size_t len = 0;
        gptoss_stream_decoder_flush(&decoder, sink.text, sink.text_capacity, &len);
        print_text(sink.text, len);
        fputc('\n', stdout);
    }
    free(sink.text);
    gptoss_tokens_free(&ids);
    return st;
}

/* The options of `run -p TEXT` after -m, bound to *o and the other targets. */
enum { N_RUN_TEXT_OWN = 4 };
static void run_text_table(common_options *o, const char **prompt, bool *raw, bool *special,
                           cli_option own[N_RUN_TEXT_OWN], cli_option common[N_COMMON]) {
    common_table(o, "seed of the sampler (default: a fresh one each reply)", common);
    own[0] = (cli_option){.name = "prompt",
                          .short_name = 'p',
                          .kind = CLI_STRING,
                          .target = prompt,
                          .value = "TEXT",
                          .help = "the user message"};
    own[1] = (cli_option){.name = "raw",
                          .kind = CLI_FLAG,
                          .target = raw,
                          .help = "no chat rendering: TEXT is tokenized as is and continued"};
    own[2] =
        (cli_option){.name = "special",
                     .kind = CLI_FLAG,
                     .target = special,
                     .help = "with --raw: special-token text such as <|start|> becomes its id"};
    own[3] = max_tokens_option(o, "tokens to generate (default 256)");
}

void cli_run_text_print_options(FILE *out, int column) {
    common_options o;
    common_defaults(&o, 256);
    const char *prompt = NULL;
    bool raw = false, special = false;
    cli_option own[N_RUN_TEXT_OWN], common[N_COMMON], draft[CLI_DRAFT_N_OPTIONS];
    run_text_table(&o, &prompt, &raw, &special, own, common);
    cli_draft_option_table(&o.draft, false, draft);
    const cli_option_group groups[] = {
        {own, N_RUN_TEXT_OWN, NULL}, {common, N_COMMON, NULL}, {draft, CLI_DRAFT_N_OPTIONS, NULL}};
    cli_print_options(out, groups, 3, column);
}

int cli_run_text(int argc, char **argv) {
    common_options o;
    common_defaults(&o, 256);
    const char *prompt = NULL;
    bool raw = false, special = false;
    cli_option model[CLI_MODEL_N_OPTIONS], common[N_COMMON], own[N_RUN_TEXT_OWN],
        draft[CLI_DRAFT_N_OPTIONS];
    cli_model_option_table(&o.model, model);
    run_text_table(&o, &prompt, &raw, &special, own, common);
    cli_draft_option_table(&o.draft, false, draft);
    const cli_option_group groups[] = {{model, 1, NULL},
                                       {own, N_RUN_TEXT_OWN, NULL},
                                       {common, N_COMMON, NULL},
                                       {model + 1, CLI_MODEL_N_OPTIONS - 1, NULL},
                                       {draft, CLI_DRAFT_N_OPTIONS, NULL}};
    size_t n_groups = sizeof groups / sizeof groups[0];
    bool want_help;
    int usage = cli_parse_options("run", argc, argv, groups, n_groups, &want_help);
    if (usage) return usage;
    if (want_help) { /* one help for both modes: gptoss run --help */
        char *help_argv[] = {"run", "--help", NULL};
        return gptoss_cmd_run(2, help_argv);
    }
    if (!o.model.model_dir)
        return cli_usage_error(
            "run", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    if (!prompt) return cli_usage_error("run", "missing -p TEXT");
    if (special && !raw)
        return cli_usage_error("run", "--special only applies with --raw (chat prompts never parse "
                                      "special tokens in user text)");
    gptoss_backend_options bo;
    int finish_rc = finish_common("run", &o, &bo);
    if (finish_rc) return finish_rc;
    gptoss_error err = {0};
    session s;
    gptoss_status st = session_open(&s, o.model.model_dir, bo, o.context, &o.draft, &err);
    if (!st && raw) st = run_raw(&s, prompt, special, &o, &err);
    if (!st && !raw) {
        char date[16];
        json_t *request = json_pack("{s:s, s:[{s:s, s:s}]}", "reasoning_effort",
                                    gptoss_reasoning_effort_name(o.effort), "messages", "role",
                                    "user", "content", prompt);
        if (!request)
            st = gptoss_set_error(&err, GPTOSS_ERR_INVALID_ARGUMENT,
                                  "the prompt is not valid UTF-8");
        printer pr = {.tty = isatty(STDOUT_FILENO) != 0};
        reply_stats stats;
        if (!st)
            st = reply_to_request(&s, request, o.date ? o.date : today(date, sizeof date),
                                  &o.sampling, o.max_tokens, &pr, NULL, &stats, &err);
        json_decref(request);
        double t = stats.decode_seconds;
        if (!st)
            fprintf(stderr, "finish: %s; %d tokens in %.2f s (%.1f tok/s)\n", stats.finish,
                    stats.n_generated, t,
                    stats.n_generated > 1 ? (stats.n_generated - 1) / (t > 0 ? t : 1e-9) : 0.0);
    }
    session_close(&s);
    return st ? cli_fail(&err) : 0;
}

/* ---- gptoss chat -------------------------------------------------------------------------- */

static void chat_help(FILE *out, const cli_option_group *groups, size_t n_groups) {
    fprintf(
        out,
        "usage: gptoss chat -m DIR [options]\n\n"
        "An interactive chat in the terminal. Earlier turns stay in the conversation (their\n"
        "reasoning is dropped, as harmony prescribes); replies stream as they are generated, the\n"
        "reasoning dimmed.\n\n"
        "commands at the prompt:\n"
        "  /effort low|medium|high   change the reasoning effort\n"
        "  /reset                    forget the conversation\n"
        "  /quit                     leave (so do end-of-file and Ctrl-C twice at the prompt)\n"
        "  Ctrl-C while a reply streams stops that reply.\n\n"
        "%s\n\n"
        "options:\n",
#ifdef GPTOSS_WITH_LIBEDIT
        "line editing (libedit, emacs keys; ~/.editrc is read): left and right move in the\n"
        "line, up and down recall the lines typed earlier in the session.");
#else
        "line editing: not in this build (built without libedit, as the static-dependency\n"
        "builds are): the prompt reads plain lines.");
#endif
    cli_print_options(out, groups, n_groups, 24);
}

/* Reads one line from stdin into buf (newline stripped). Returns 1 for a line, 0 for end of
 * input, -1 when Ctrl-C interrupted the read. */
static int read_line(char *buf, size_t size) {
    clearerr(stdin);
    if (fgets(buf, (int)size, stdin)) {
        size_t n = strlen(buf);
        if (n > 0 && buf[n - 1] == '\n')
            buf[--n] = '\0';
        else if (n + 1 == size) { /* a very long line: drop its rest */
            int c;
            while ((c = getchar()) != EOF && c != '\n') {
            }
        }
        return 1;
    }
    if (ferror(stdin) && errno == EINTR) return -1;
    return 0;
}

/* ---- line editing (libedit) -------------------------------------------------------------- */

/* The prompt's line reader: libedit's line editing and history when stdin and stdout are a
 * terminal and the binary was built with it, else plain lines from stdin. */
typedef struct line_reader {
#ifdef GPTOSS_WITH_LIBEDIT
    EditLine *el;
    History *history;
    locale_t utf8; /* libedit's wide characters are UTF-8 on the terminal, whatever LC_ALL */
#endif
    bool editing;
} line_reader;

#ifdef GPTOSS_WITH_LIBEDIT
static char *prompt_text(EditLine *el) {
    (void)el;
    return "> ";
}

/* libedit's character reader. Its own retries a read that Ctrl-C interrupted; this one ends
 * the line instead (-1), so the prompt sees the interruption. Input is decoded as UTF-8. */
static int read_wide_char(EditLine *el, wchar_t *out) {
    (void)el;
    uint32_t code = 0;
    int more = 0;
    for (;;) {
        unsigned char c;
        ssize_t n = read(STDIN_FILENO, &c, 1);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR && !interrupts) continue;
            return -1;
        }
        if (more > 0 && (c & 0xc0) == 0x80) {
            code = code << 6 | (c & 0x3f);
            if (--more == 0) break;
            continue;
        }
        /* a lead byte (a stray continuation byte starts over) */
        if (c < 0x80)
            code = c, more = 0;
        else if ((c & 0xe0) == 0xc0)
            code = c & 0x1f, more = 1;
        else if ((c & 0xf0) == 0xe0)
            code = c & 0x0f, more = 2;
        else if ((c & 0xf8) == 0xf0)
            code = c & 0x07, more = 3;
        else
            continue;
        if (more == 0) break;
    }
    *out = (wchar_t)code;
    return 1;
}
#endif

static void line_reader_open(line_reader *r) {
    memset(r, 0, sizeof *r);
#ifdef GPTOSS_WITH_LIBEDIT
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return;
    r->utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    locale_t previous = r->utf8 ? uselocale(r->utf8) : (locale_t)0;
    r->el = el_init("gptoss", stdin, stdout, stderr);
    r->history = history_init();
    if (r->el && r->history) {
        HistEvent event;
        history(r->history, &event, H_SETSIZE, 1000);
        history(r->history, &event, H_SETUNIQUE, 1);
        el_set(r->el, EL_EDITOR, "emacs");
        el_set(r->el, EL_SIGNAL, 0); /* Ctrl-C stays ours (on_sigint) */
        el_set(r->el, EL_PROMPT, prompt_text);
        el_set(r->el, EL_GETCFN, read_wide_char);
        el_set(r->el, EL_HIST, history, r->history);
        el_source(r->el, NULL); /* the user's ~/.editrc, as other libedit programs read it */
        r->editing = true;
    }
    if (r->utf8) uselocale(previous);
#endif
}

static void line_reader_close(line_reader *r) {
#ifdef GPTOSS_WITH_LIBEDIT
    if (r->el) el_end(r->el);
    if (r->history) history_end(r->history);
    if (r->utf8) freelocale(r->utf8);
#endif
    memset(r, 0, sizeof *r);
}

/* One line at the prompt, as read_line: 1 a line, 0 end of input, -1 Ctrl-C. */
static int line_reader_get(line_reader *r, char *buf, size_t size) {
    if (!r->editing) {
        fputs("> ", stdout);
        fflush(stdout);
        return read_line(buf, size);
    }
#ifdef GPTOSS_WITH_LIBEDIT
    locale_t previous = r->utf8 ? uselocale(r->utf8) : (locale_t)0;
    int count = 0;
    const char *line = el_gets(r->el, &count);
    int got = 1;
    if (!line) {
        got = count < 0 && (interrupts || errno == EINTR) ? -1 : 0;
    } else {
        size_t n = strcspn(line, "\n");
        if (n >= size) n = size - 1;
        memcpy(buf, line, n);
        buf[n] = '\0';
        HistEvent event;
        if (n > 0) history(r->history, &event, H_ENTER, buf);
    }
    if (r->utf8) uselocale(previous);
    return got;
#else
    return 0;
#endif
}

static bool add_message(json_t *messages, const char *role, const char *content) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m && json_array_append_new(messages, m) == 0;
}

int gptoss_cmd_chat(int argc, char **argv) {
    common_options o;
    common_defaults(&o, 512);
    cli_option model[CLI_MODEL_N_OPTIONS], common[N_COMMON], draft[CLI_DRAFT_N_OPTIONS];
    cli_model_option_table(&o.model, model);
    cli_draft_option_table(&o.draft, false, draft);
    common_table(&o, "seed of the sampler (default: a fresh one each reply)", common);
    const cli_option own[] = {max_tokens_option(&o, "tokens per reply (default 512)")};
    const cli_option_group groups[] = {{model, 1, NULL},
                                       {own, 1, NULL},
                                       {common, N_COMMON, NULL},
                                       {model + 1, CLI_MODEL_N_OPTIONS - 1, NULL},
                                       {draft, CLI_DRAFT_N_OPTIONS, NULL}};
    size_t n_groups = sizeof groups / sizeof groups[0];
    bool want_help;
    int usage = cli_parse_options("chat", argc, argv, groups, n_groups, &want_help);
    if (usage) return usage;
    if (want_help) {
        chat_help(stdout, groups, n_groups);
        return 0;
    }
    if (!o.model.model_dir)
        return cli_usage_error(
            "chat", "missing -m DIR (make one with: gptoss make-model --preset tiny -o DIR)");
    gptoss_backend_options bo;
    int finish_rc = finish_common("chat", &o, &bo);
    if (finish_rc) return finish_rc;

    gptoss_error err = {0};
    session s;
    if (session_open(&s, o.model.model_dir, bo, o.context, &o.draft, &err)) {
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
    printf("gptoss chat: %s (effort %s). /effort low|medium|high, /reset, /quit; Ctrl-C stops a "
           "reply.\n",
           o.model.model_id, gptoss_reasoning_effort_name(o.effort));
    char line[16384];
    bool armed = false; /* the last prompt ended in Ctrl-C */
    int rc = 0;
    line_reader reader;
    line_reader_open(&reader);
    for (;;) {
        int got = line_reader_get(&reader, line, sizeof line);
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
            while (*word == ' ')
                word++;
            if (gptoss_reasoning_effort_parse(word, &o.effort))
                printf("[effort: %s]\n", word);
            else
                printf("[usage: /effort low|medium|high]\n");
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
        json_t *request = json_pack("{s:s, s:O}", "reasoning_effort",
                                    gptoss_reasoning_effort_name(o.effort), "messages", messages);
        gptoss_chat_buf answer = {0};
        reply_stats stats = {0};
        interrupts = 0;
        gptoss_status st = request
                               ? reply_to_request(&s, request, date, &o.sampling, o.max_tokens, &pr,
                                                  &answer, &stats, &err)
                               : gptoss_set_error(&err, GPTOSS_ERR_OUT_OF_MEMORY, "out of memory");
        json_decref(request);
        if (st) {
            /* The turn failed (e.g. the context is full): say so and keep the session usable. */
            fprintf(stderr, "gptoss: %s\n", err.message);
            json_array_remove(messages, json_array_size(messages) - 1);
        } else {
            if (strcmp(stats.finish, "stop") != 0)
                printf("[%s after %d tokens]\n", stats.finish, stats.n_generated);
            gptoss_chat_buf_terminate(&answer);
            if (!add_message(messages, "assistant", answer.data ? answer.data : "")) {
                json_array_remove(messages, json_array_size(messages) - 1);
                printf("[the reply could not be kept in the history]\n");
            }
        }
        gptoss_chat_buf_free(&answer);
        interrupts = 0;
    }
    line_reader_close(&reader);
    printf("bye\n");
    sigaction(SIGINT, &previous, NULL);
    json_decref(messages);
    session_close(&s);
    return rc;
}
