/*
 * test_malformed_outputs.c - the outputs of malformed_outputs.txt through the server's
 * generation layer (harmony parser -> chat pieces -> Chat Completions JSON), once streamed
 * event by event and once gathered into one response, as the engine would deliver them (it
 * stops at the first <|return|>, <|call|> or <|endoftext|>; otherwise the length limit ends
 * the choice after the last token).
 *
 * References: each case's expected outcome, written by hand in the data file (the tool call
 * and arguments, or the answer text, a reader recovers from that output); and, for every
 * case, that no harmony special-token text leaks into content, reasoning, tool names or
 * arguments, that tool names are well-formed, and that streaming and gathering agree.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "chat/chat.h"
#include "server/api_call.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gptoss_tokenizer *tok;
static int32_t vocab;

static int setup(void **state) {
    (void)state;
    tok = tm_load_tokenizer();
    if (!tok) return -1;
    vocab = gptoss_tokenizer_n_vocab(tok);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_tokenizer_free(tok);
    return 0;
}

typedef struct mcase {
    char name[96];
    char expect[96]; /* "text" or "tool NAME" */
    char *args;      /* or NULL */
    char *args2;     /* the second call's arguments, or NULL */
    char *calls;     /* every call's name, in order, one space between; or NULL */
    char *content;   /* or NULL */
    char *text;
} mcase;

static char *dup_range(const char *s, size_t n) {
    char *out = malloc(n + 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

/* Reads the cases of the data file. */
static mcase *load_cases(size_t *n_out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/chat/malformed_outputs.txt", ts_env("GPTOSS_SOURCE_DIR"));
    size_t len = 0;
    char *data = ts_read_file(path, &len);
    if (!data) fail_msg("cannot read %s", path);
    mcase *cases = calloc(256, sizeof *cases);
    size_t n = 0;
    const char *p = data;
    while ((p = strncmp(p, "== ", 3) == 0 ? p : strstr(p, "\n== "))) {
        if (*p == '\n') p++;
        assert_true(n < 256);
        mcase *c = &cases[n++];
        const char *eol = strchr(p, '\n');
        assert_non_null(eol);
        snprintf(c->name, sizeof c->name, "%.*s", (int)(eol - p - 3), p + 3);
        p = eol + 1;
        while (strncmp(p, "--\n", 3) != 0) {
            eol = strchr(p, '\n');
            if (!eol) fail_msg("%s: no '--' line", c->name);
            if (!strncmp(p, "expect: ", 8))
                snprintf(c->expect, sizeof c->expect, "%.*s", (int)(eol - p - 8), p + 8);
            else if (!strncmp(p, "args: ", 6) || !strncmp(p, "args:\n", 6))
                c->args = dup_range(p + 6, eol > p + 6 ? (size_t)(eol - p - 6) : 0);
            else if (!strncmp(p, "args2: ", 7) || !strncmp(p, "args2:\n", 7))
                c->args2 = dup_range(p + 7, eol > p + 7 ? (size_t)(eol - p - 7) : 0);
            else if (!strncmp(p, "calls: ", 7))
                c->calls = dup_range(p + 7, (size_t)(eol - p - 7));
            else if (!strncmp(p, "content: ", 9) || !strncmp(p, "content:\n", 9))
                c->content = dup_range(p + 9, eol > p + 9 ? (size_t)(eol - p - 9) : 0);
            else
                fail_msg("%s: unknown line '%.*s'", c->name, (int)(eol - p), p);
            p = eol + 1;
        }
        p += 3;
        const char *next = strstr(p, "\n== ");
        size_t body = next ? (size_t)(next - p) : strlen(p);
        while (body > 0 && p[body - 1] == '\n')
            body--;
        c->text = dup_range(p, body);
        if (!c->expect[0]) fail_msg("%s: no expect line", c->name);
    }
    free(data);
    *n_out = n;
    return cases;
}

static void free_cases(mcase *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(cases[i].args);
        free(cases[i].args2);
        free(cases[i].calls);
        free(cases[i].content);
        free(cases[i].text);
    }
    free(cases);
}

static api_call *make_call(bool stream) {
    json_t *req = json_loads(stream ? "{\"stream\": true}" : "{}", 0, NULL);
    request_params p;
    field_error fe = {0};
    if (!request_params_parse(req, vocab, 8, &p, &fe)) fail_msg("%s", fe.message);
    assert_true(request_params_finish(&p, vocab, &fe));
    json_decref(req);
    api_call *c = NULL;
    gptoss_error err = {0};
    assert_int_equal(
        api_call_create(&api_chat_encoder, "tiny", tok, &p, 7, 0xabc, 42, NULL, &c, &err),
        GPTOSS_OK);
    return c;
}

static bool is_stop(int32_t id) {
    return id == GPTOSS_TOKEN_RETURN || id == GPTOSS_TOKEN_CALL || id == GPTOSS_TOKEN_ENDOFTEXT;
}

/* Feeds the tokens the way the engine delivers them. */
static void feed(api_call *c, const gptoss_tokens *t) {
    size_t n = 0;
    while (n < t->n && !is_stop(t->ids[n]))
        n++;
    const bool stopped = n < t->n;
    if (stopped) n++;
    if (n == 0) {
        gptoss_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.token_id = -1, ev.stop_token_id = -1, ev.finish = GPTOSS_FINISH_LENGTH;
        generation_push(c->gen, &ev);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        gptoss_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.token_id = t->ids[i], ev.stop_token_id = -1;
        if (i + 1 == n) {
            ev.finish = stopped ? GPTOSS_FINISH_STOP : GPTOSS_FINISH_LENGTH;
            if (stopped) ev.stop_token_id = t->ids[i];
        }
        generation_push(c->gen, &ev);
    }
}

/* The outcome of one choice, in one shape for both ways of delivery. */
typedef struct outcome {
    json_t *content;   /* string */
    json_t *reasoning; /* string */
    json_t *calls;     /* [[name, arguments], ...] */
    json_t *finish;
} outcome;

static const char *str_or_empty(const json_t *v) {
    return json_is_string(v) ? json_string_value(v) : "";
}

static void append_string(json_t *holder, const char *key, const char *text) {
    json_t *old = json_object_get(holder, key);
    size_t a = strlen(json_string_value(old)), b = strlen(text);
    char *joined = malloc(a + b + 1);
    memcpy(joined, json_string_value(old), a);
    memcpy(joined + a, text, b + 1);
    json_object_set_new(holder, key, json_string(joined));
    free(joined);
}

static outcome gathered(const gptoss_tokens *t) {
    api_call *c = make_call(false);
    feed(c, t);
    json_t *r = c->encoder->response(c, c->state);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    outcome o;
    o.content = json_string(str_or_empty(json_object_get(msg, "content")));
    o.reasoning = json_string(str_or_empty(json_object_get(msg, "reasoning_content")));
    o.calls = json_array();
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, call) {
        json_t *fn = json_object_get(call, "function");
        json_array_append_new(o.calls, json_pack("[ss]", str_or_empty(json_object_get(fn, "name")),
                                                 str_or_empty(json_object_get(fn, "arguments"))));
    }
    o.finish = json_incref(json_object_get(c0, "finish_reason"));
    json_decref(r);
    api_call_free(c);
    return o;
}

static outcome streamed(const gptoss_tokens *t) {
    api_call *c = make_call(true);
    feed(c, t);
    c->encoder->stream_end(c, c->state);
    outcome o;
    o.content = json_string("");
    o.reasoning = json_string("");
    o.calls = json_array();
    o.finish = json_null();
    json_t *acc = json_pack("{s:s,s:s}", "content", "", "reasoning", "");
    const char *p = c->out.data ? c->out.data : "";
    const char *end = p + c->out.len;
    while (p < end) {
        assert_memory_equal(p, "data: ", 6);
        const char *stop = strstr(p, "\n\n");
        assert_non_null(stop);
        if (strncmp(p + 6, "[DONE]", 6) != 0) {
            json_error_t jerr;
            json_t *chunk = json_loadb(p + 6, (size_t)(stop - p - 6), 0, &jerr);
            if (!chunk) fail_msg("bad chunk: %s", jerr.text);
            json_t *c0 = json_array_get(json_object_get(chunk, "choices"), 0);
            json_t *delta = json_object_get(c0, "delta");
            if (json_is_string(json_object_get(delta, "content")))
                append_string(acc, "content", json_string_value(json_object_get(delta, "content")));
            if (json_is_string(json_object_get(delta, "reasoning_content")))
                append_string(acc, "reasoning",
                              json_string_value(json_object_get(delta, "reasoning_content")));
            size_t i;
            json_t *tc;
            json_array_foreach(json_object_get(delta, "tool_calls"), i, tc) {
                size_t index = (size_t)json_integer_value(json_object_get(tc, "index"));
                json_t *fn = json_object_get(tc, "function");
                while (json_array_size(o.calls) <= index)
                    json_array_append_new(o.calls, json_pack("[ss]", "", ""));
                json_t *pair = json_array_get(o.calls, index);
                if (json_is_string(json_object_get(fn, "name"))) {
                    char joined[512];
                    snprintf(joined, sizeof joined, "%s%s",
                             json_string_value(json_array_get(pair, 0)),
                             json_string_value(json_object_get(fn, "name")));
                    json_array_set_new(pair, 0, json_string(joined));
                }
                if (json_is_string(json_object_get(fn, "arguments"))) {
                    json_t *holder = json_pack("{s:O}", "a", json_array_get(pair, 1));
                    append_string(holder, "a", json_string_value(json_object_get(fn, "arguments")));
                    json_array_set(pair, 1, json_object_get(holder, "a"));
                    json_decref(holder);
                }
            }
            json_t *finish = json_object_get(c0, "finish_reason");
            if (json_is_string(finish)) {
                json_decref(o.finish);
                o.finish = json_incref(finish);
            }
            json_decref(chunk);
        }
        p = stop + 2;
    }
    json_decref(o.content);
    json_decref(o.reasoning);
    o.content = json_incref(json_object_get(acc, "content"));
    o.reasoning = json_incref(json_object_get(acc, "reasoning"));
    json_decref(acc);
    api_call_free(c);
    return o;
}

static void outcome_free(outcome *o) {
    json_decref(o->content);
    json_decref(o->reasoning);
    json_decref(o->calls);
    json_decref(o->finish);
}

static const char *const special_texts[] = {
    "<|start|>",  "<|end|>",  "<|message|>",   "<|channel|>",     "<|constrain|>",
    "<|return|>", "<|call|>", "<|endoftext|>", "<|startoftext|>", "<|reserved_"};

/* Failures are gathered so that one run names every case that breaks. */
static int n_failed;

static void check(const mcase *k, bool ok, const char *what, const char *got) {
    if (ok) return;
    n_failed++;
    fprintf(stderr, "  case %s: %s (got '%s')\n", k->name, what, got);
}

static void check_clean(const mcase *k, const char *field, const char *text) {
    for (size_t i = 0; i < sizeof special_texts / sizeof special_texts[0]; i++)
        if (strstr(text, special_texts[i])) {
            char what[128];
            snprintf(what, sizeof what, "%s holds special-token text %s", field, special_texts[i]);
            check(k, false, what, text);
        }
}

static bool valid_tool_name(const char *name) {
    if (!name[0]) return false;
    for (const char *p = name; *p; p++)
        if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '<' || *p == '>' || *p == '"')
            return false;
    return true;
}

static void test_malformed_outputs(void **state) {
    (void)state;
    size_t n = 0;
    mcase *cases = load_cases(&n);
    assert_true(n >= 50);
    for (size_t i = 0; i < n; i++) {
        const mcase *k = &cases[i];
        gptoss_tokens t = {0};
        gptoss_error err = {0};
        assert_int_equal(gptoss_tokenizer_encode(tok, k->text, strlen(k->text), true, &t, &err),
                         GPTOSS_OK);
        outcome all = gathered(&t), live = streamed(&t);
        const char *content = json_string_value(all.content);
        check(k, json_equal(all.content, live.content), "streamed content differs",
              json_string_value(live.content));
        check(k, json_equal(all.reasoning, live.reasoning), "streamed reasoning differs",
              json_string_value(live.reasoning));
        check(k, json_equal(all.calls, live.calls), "streamed tool calls differ", "");
        check(k, json_equal(all.finish, live.finish), "streamed finish_reason differs",
              str_or_empty(live.finish));
        check_clean(k, "content", content);
        check_clean(k, "reasoning", json_string_value(all.reasoning));
        size_t j;
        json_t *call;
        json_array_foreach(all.calls, j, call) {
            const char *name = json_string_value(json_array_get(call, 0));
            check(k, valid_tool_name(name), "bad tool name", name);
            check_clean(k, "tool name", name);
            check_clean(k, "arguments", json_string_value(json_array_get(call, 1)));
        }
        const size_t n_calls = json_array_size(all.calls);
        if (!strncmp(k->expect, "tool ", 5)) {
            check(k, n_calls >= 1, "no tool call", content);
            if (n_calls >= 1) {
                const char *name =
                    json_string_value(json_array_get(json_array_get(all.calls, 0), 0));
                check(k, strcmp(name, k->expect + 5) == 0, "wrong tool name", name);
                const char *args =
                    json_string_value(json_array_get(json_array_get(all.calls, 0), 1));
                if (k->args) check(k, strcmp(args, k->args) == 0, "wrong arguments", args);
            }
            if (k->calls) {
                char names[512] = "";
                json_array_foreach(all.calls, j, call) {
                    const size_t used = strlen(names);
                    snprintf(names + used, sizeof names - used, "%s%s", used ? " " : "",
                             json_string_value(json_array_get(call, 0)));
                }
                check(k, strcmp(names, k->calls) == 0, "wrong calls", names);
            }
            if (k->args2) {
                const char *args2 =
                    n_calls >= 2
                        ? json_string_value(json_array_get(json_array_get(all.calls, 1), 1))
                        : "(no second call)";
                check(k, strcmp(args2, k->args2) == 0, "wrong arguments of the second call", args2);
            }
            check(k, strcmp(str_or_empty(all.finish), "tool_calls") == 0,
                  "finish_reason is not tool_calls", str_or_empty(all.finish));
        } else {
            check(k, strcmp(k->expect, "text") == 0, "unknown expectation", k->expect);
            check(k, n_calls == 0, "unexpected tool call",
                  n_calls ? json_string_value(json_array_get(json_array_get(all.calls, 0), 0))
                          : "");
        }
        if (k->content) check(k, strcmp(content, k->content) == 0, "wrong content", content);
        outcome_free(&all);
        outcome_free(&live);
        gptoss_tokens_free(&t);
    }
    free_cases(cases, n);
    if (n_failed) fail_msg("%d checks failed", n_failed);
}

/* The chat stream alone, fed every token of every case (also those after a stop token, which
 * the engine would not deliver): it must ignore what follows the turn's end and never fail. */
static void test_chat_stream_ignores_after_turn_end(void **state) {
    (void)state;
    size_t n = 0;
    mcase *cases = load_cases(&n);
    for (size_t i = 0; i < n; i++) {
        gptoss_tokens t = {0};
        gptoss_error err = {0};
        assert_int_equal(
            gptoss_tokenizer_encode(tok, cases[i].text, strlen(cases[i].text), true, &t, &err),
            GPTOSS_OK);
        gptoss_chat_stream *s = NULL;
        assert_int_equal(gptoss_chat_stream_create(tok, NULL, &s, &err), GPTOSS_OK);
        for (size_t j = 0; j < t.n; j++)
            assert_int_equal(gptoss_chat_stream_push(s, t.ids[j], &err), GPTOSS_OK);
        assert_int_equal(gptoss_chat_stream_finish(s, &err), GPTOSS_OK);
        gptoss_chat_stream_free(s);
        gptoss_tokens_free(&t);
    }
    free_cases(cases, n);
}

/* Random streams of markup tokens and header-like words: whatever the order, streaming and
 * gathering agree and no special-token text reaches the client. */
static void test_random_markup_streams(void **state) {
    (void)state;
    static const char *const pieces[] = {"<|start|>",
                                         "<|end|>",
                                         "<|message|>",
                                         "<|channel|>",
                                         "<|constrain|>",
                                         "<|call|>",
                                         "<|return|>",
                                         "<|reserved_200013|>",
                                         "assistant",
                                         "user",
                                         " to=functions.f",
                                         "functions.g",
                                         "analysis",
                                         "final",
                                         "commentary",
                                         "json",
                                         " ",
                                         "{\"a\":1}",
                                         "word",
                                         "\n"};
    const size_t n_pieces = sizeof pieces / sizeof pieces[0];
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int stream = 0; stream < 400; stream++) {
        char text[2048] = "";
        size_t len = 0;
        int n = 1 + (int)(rng % 30);
        for (int i = 0; i < n; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            const char *piece = pieces[rng % n_pieces];
            size_t plen = strlen(piece);
            if (len + plen + 1 >= sizeof text) break;
            memcpy(text + len, piece, plen + 1);
            len += plen;
        }
        mcase k = {0};
        snprintf(k.name, sizeof k.name, "random %d: %.60s", stream, text);
        gptoss_tokens t = {0};
        gptoss_error err = {0};
        assert_int_equal(gptoss_tokenizer_encode(tok, text, len, true, &t, &err), GPTOSS_OK);
        outcome all = gathered(&t), live = streamed(&t);
        check(&k, json_equal(all.content, live.content), "streamed content differs",
              json_string_value(live.content));
        check(&k, json_equal(all.calls, live.calls), "streamed tool calls differ", "");
        check(&k, json_equal(all.finish, live.finish), "streamed finish_reason differs", "");
        check_clean(&k, "content", json_string_value(all.content));
        check_clean(&k, "reasoning", json_string_value(all.reasoning));
        size_t j;
        json_t *call;
        json_array_foreach(all.calls, j, call) {
            const char *name = json_string_value(json_array_get(call, 0));
            check(&k, valid_tool_name(name), "bad tool name", name);
            check_clean(&k, "arguments", json_string_value(json_array_get(call, 1)));
        }
        outcome_free(&all);
        outcome_free(&live);
        gptoss_tokens_free(&t);
    }
    if (n_failed) fail_msg("%d checks failed", n_failed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_outputs),
        cmocka_unit_test(test_chat_stream_ignores_after_turn_end),
        cmocka_unit_test(test_random_markup_streams),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
