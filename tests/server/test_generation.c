/*
 * test_generation.c - the layer between engine events and OpenAI JSON: request_params.c
 * (sampling fields, logit_bias), generation.c (harmony parsing, stop-string holdback, usage)
 * and the two encoders (api_chat.c, api_completions.c), driven by hand-made engine events
 * without an engine or HTTP.
 *
 * References: token ids come from the real tokenizer encoding a text written here; the
 * expected outputs are that text cut by hand (the answer before the stop string, the
 * reasoning and tool arguments of a harmony message as written in it), the logprob values
 * fed in, and the OpenAI reference layouts of logprobs and usage.
 */
#include "model_fixture.h"
#include "test_support.h"

#include "server/api_call.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
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

/* ---- helpers ------------------------------------------------------------------------------- */

static gptoss_tokens encode(const char *text, bool special) {
    gptoss_tokens t = {0};
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_encode(tok, text, strlen(text), special, &t, &err),
                     GPTOSS_OK);
    return t;
}

/* A call over `fields` (a JSON object of request fields). */
static api_call *make_call(const api_encoder *enc, const char *fields, bool logprobs,
                           int32_t top_logprobs) {
    json_t *req = json_loads(fields, 0, NULL);
    assert_non_null(req);
    request_params p;
    field_error fe = {0};
    if (!request_params_parse(req, vocab, 8, &p, &fe)) fail_msg("%s", fe.message);
    p.sampling.logprobs = logprobs, p.sampling.top_logprobs = top_logprobs;
    assert_true(request_params_finish(&p, vocab, &fe));
    json_decref(req);
    api_call *c = NULL;
    gptoss_error err = {0};
    assert_int_equal(api_call_create(enc, "tiny", tok, &p, 7, 0xabc, 42, NULL, &c, &err),
                     GPTOSS_OK);
    return c;
}

static gptoss_engine_event token_event(int32_t choice, int32_t id, float logprob) {
    gptoss_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.index = choice, ev.token_id = id, ev.logprob = logprob, ev.stop_token_id = -1;
    return ev;
}

static void push_finish(api_call *c, int32_t choice, gptoss_finish_reason why) {
    gptoss_engine_event ev = token_event(choice, -1, 0);
    ev.finish = why;
    generation_push(c->gen, &ev);
}

/* The streamed chunks so far (a JSON array; "[DONE]" as a string). Consumes c->out. */
static json_t *take_chunks(api_call *c) {
    json_t *all = json_array();
    const char *p = c->out.data ? c->out.data : "";
    const char *end = p + c->out.len;
    while (p < end) {
        assert_memory_equal(p, "data: ", 6);
        const char *stop = strstr(p, "\n\n");
        assert_non_null(stop);
        if (!strncmp(p + 6, "[DONE]", 6)) {
            json_array_append_new(all, json_string("[DONE]"));
        } else {
            json_error_t jerr;
            json_t *j = json_loadb(p + 6, (size_t)(stop - p - 6), 0, &jerr);
            if (!j) fail_msg("bad chunk: %s", jerr.text);
            json_array_append_new(all, j);
        }
        p = stop + 2;
    }
    c->out.len = 0;
    return all;
}

/* Concatenates choices[0].<field> (or choices[0].delta.<field> for chat) over chunks. */
static char *join_field(const json_t *chunks, bool chat, const char *field) {
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(cap, 1);
    size_t i;
    json_t *ch;
    json_array_foreach(chunks, i, ch) {
        json_t *c0 = json_array_get(json_object_get(ch, "choices"), 0);
        json_t *v = chat ? json_object_get(json_object_get(c0, "delta"), field)
                         : json_object_get(c0, field);
        if (json_is_string(v)) {
            memcpy(out + len, json_string_value(v), json_string_length(v));
            len += json_string_length(v);
        }
    }
    return out;
}

static const char *finish_of(const json_t *chunk) {
    json_t *f =
        json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "finish_reason");
    return json_is_string(f) ? json_string_value(f) : NULL;
}

/* ---- stop strings -------------------------------------------------------------------------- */

/* The stop string spans three tokens; every byte streamed before the match is answer text,
 * no byte of the stop string or after it is ever sent, and tokens after the match are not
 * counted. */
static void test_stop_string_holdback_across_tokens(void **state) {
    (void)state;
    const char *text = "The quick brown fox jumps over the lazy dog and keeps running";
    const char *stop = "over the lazy";
    size_t want_len = (size_t)(strstr(text, stop) - text);
    gptoss_tokens t = encode(text, false);
    api_call *c = make_call(&api_completions_encoder,
                            "{\"stream\": true, \"stop\": [\"zzz\", \"over the lazy\"]}", false, 0);
    char streamed[256] = "";
    size_t n_streamed = 0;
    for (size_t i = 0; i < t.n; i++) {
        gptoss_engine_event ev = token_event(0, t.ids[i], -1);
        generation_push(c->gen, &ev);
        json_t *chunks = take_chunks(c);
        char *got = join_field(chunks, false, "text");
        memcpy(streamed + n_streamed, got, strlen(got));
        n_streamed += strlen(got);
        free(got);
        /* What was sent is always a prefix of the answer before the stop string. */
        assert_true(n_streamed <= want_len);
        assert_memory_equal(streamed, text, n_streamed);
        if (json_array_size(chunks) &&
            finish_of(json_array_get(chunks, json_array_size(chunks) - 1)))
            fail_msg("finished before the engine said so");
        json_decref(chunks);
    }
    assert_int_equal(n_streamed, want_len);
    /* The engine was told (here: no engine); its finish event follows. */
    push_finish(c, 0, GPTOSS_FINISH_STOP);
    json_t *chunks = take_chunks(c);
    assert_string_equal(finish_of(json_array_get(chunks, json_array_size(chunks) - 1)), "stop");
    json_decref(chunks);
    /* Counted: the tokens up to the one that completed the stop string. */
    size_t n_upto = 0, bytes = 0;
    while (bytes < want_len + strlen(stop)) {
        size_t l = 0;
        gptoss_tokenizer_token_bytes(tok, t.ids[n_upto++], &l);
        bytes += l;
    }
    assert_int_equal(generation_usage(c->gen).completion_tokens, (int32_t)n_upto);
    gptoss_tokens_free(&t);
    api_call_free(c);
}

/* Text that starts like a stop string but is not one is held back, then sent in full. */
static void test_stop_string_false_start_released(void **state) {
    (void)state;
    const char *text = "Hello world? Hello worlds!";
    gptoss_tokens t = encode(text, false);
    api_call *c = make_call(&api_completions_encoder, "{\"stop\": \"world!\"}", false, 0);
    for (size_t i = 0; i < t.n; i++) {
        gptoss_engine_event ev = token_event(0, t.ids[i], -1);
        if (i + 1 == t.n) ev.finish = GPTOSS_FINISH_LENGTH;
        generation_push(c->gen, &ev);
    }
    json_t *r = c->encoder->response(c, c->state);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), text);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    json_decref(r);
    gptoss_tokens_free(&t);
    api_call_free(c);
}

/* ---- chat: reasoning, tool calls, usage ------------------------------------------------------ */

static const char *tool_turn =
    "<|channel|>analysis<|message|>Need the weather in Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>";

static void push_all(api_call *c, const gptoss_tokens *t, gptoss_finish_reason last,
                     int32_t stop_id) {
    for (size_t i = 0; i < t->n; i++) {
        gptoss_engine_event ev = token_event(0, t->ids[i], -1);
        if (i + 1 == t->n) ev.finish = last, ev.stop_token_id = stop_id;
        generation_push(c->gen, &ev);
    }
}

static void test_chat_tool_call_deltas(void **state) {
    (void)state;
    gptoss_tokens t = encode(tool_turn, true);
    api_call *c =
        make_call(&api_chat_encoder,
                  "{\"stream\": true, \"stream_options\": {\"include_usage\": true}}", false, 0);
    push_all(c, &t, GPTOSS_FINISH_STOP, t.ids[t.n - 1]);
    c->encoder->stream_end(c, c->state);
    json_t *chunks = take_chunks(c);
    size_t n = json_array_size(chunks);
    assert_true(n >= 5);
    /* role first, [DONE] last, usage before it */
    json_t *d0 = json_object_get(
        json_array_get(json_object_get(json_array_get(chunks, 0), "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(d0, "role")), "assistant");
    assert_string_equal(json_string_value(json_array_get(chunks, n - 1)), "[DONE]");
    json_t *usage = json_object_get(json_array_get(chunks, n - 2), "usage");
    assert_int_equal(json_array_size(json_object_get(json_array_get(chunks, n - 2), "choices")), 0);
    assert_string_equal(finish_of(json_array_get(chunks, n - 3)), "tool_calls");
    char *reasoning = join_field(chunks, true, "reasoning_content");
    assert_string_equal(reasoning, "Need the weather in Paris.");
    free(reasoning);
    /* tool call deltas: the first names the call, the rest carry the arguments */
    size_t n_deltas = 0, i;
    json_t *ch;
    char args[256] = "";
    json_array_foreach(chunks, i, ch) {
        json_t *tc = json_object_get(
            json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "delta"),
            "tool_calls");
        size_t k;
        json_t *d;
        json_array_foreach(tc, k, d) {
            assert_int_equal(json_integer_value(json_object_get(d, "index")), 0);
            json_t *fn = json_object_get(d, "function");
            if (n_deltas++ == 0) {
                assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
                assert_string_equal(json_string_value(json_object_get(d, "type")), "function");
                assert_true(!strncmp(json_string_value(json_object_get(d, "id")), "call_", 5));
            } else {
                assert_null(json_object_get(d, "id"));
            }
            strcat(args, json_string_value(json_object_get(fn, "arguments")));
        }
    }
    assert_true(n_deltas >= 2);
    assert_string_equal(args, "{\"city\": \"Paris\", \"unit\": \"celsius\"}");
    /* usage: every generated token; reasoning = the tokens of the analysis text */
    gptoss_tokens analysis = encode("Need the weather in Paris.", false);
    assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")),
                     (json_int_t)t.n);
    assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 7);
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")),
                     (json_int_t)t.n + 7);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(usage, "completion_tokens_details"), "reasoning_tokens")),
                     (json_int_t)analysis.n);
    gptoss_tokens_free(&analysis);
    json_decref(chunks);
    gptoss_tokens_free(&t);
    api_call_free(c);
}

static void test_chat_tool_call_message(void **state) {
    (void)state;
    gptoss_tokens t = encode(tool_turn, true);
    api_call *c = make_call(&api_chat_encoder, "{}", false, 0);
    push_all(c, &t, GPTOSS_FINISH_STOP, t.ids[t.n - 1]);
    json_t *r = c->encoder->response(c, c->state);
    assert_string_equal(json_string_value(json_object_get(r, "object")), "chat.completion");
    assert_string_equal(json_string_value(json_object_get(r, "id")),
                        "chatcmpl-0000000000000abc0000002a");
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                        "Need the weather in Paris.");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(call, "function"), "name")),
        "get_weather");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(call, "function"), "arguments")),
        "{\"city\": \"Paris\", \"unit\": \"celsius\"}");
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls");
    json_decref(r);
    gptoss_tokens_free(&t);
    api_call_free(c);
}

/* ---- logprobs ------------------------------------------------------------------------------ */

static gptoss_engine_event logprob_event(int32_t id, float lp, int32_t alt1, float lp1,
                                         int32_t alt2, float lp2) {
    gptoss_engine_event ev = token_event(0, id, lp);
    ev.n_top_logprobs = 2;
    ev.top_logprobs[0] = (gptoss_token_logprob){alt1, lp1};
    ev.top_logprobs[1] = (gptoss_token_logprob){alt2, lp2};
    return ev;
}

static const char *bytes_of(int32_t id) {
    static char buf[4][64];
    static int k;
    size_t len = 0;
    const char *b = gptoss_tokenizer_token_bytes(tok, id, &len);
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%.*s", (int)len, b);
    return buf[k];
}

static void test_logprobs_completions_layout(void **state) {
    (void)state;
    gptoss_tokens t = encode("Hello world", false);
    assert_int_equal(t.n, 2);
    api_call *c = make_call(&api_completions_encoder, "{}", true, 2);
    gptoss_engine_event e1 = logprob_event(t.ids[0], -0.5f, t.ids[0], -0.5f, t.ids[1], -2.0f);
    gptoss_engine_event e2 =
        logprob_event(t.ids[1], -INFINITY, t.ids[0], -1.0f, t.ids[1], -INFINITY);
    e2.finish = GPTOSS_FINISH_LENGTH;
    generation_push(c->gen, &e1);
    generation_push(c->gen, &e2);
    json_t *r = c->encoder->response(c, c->state);
    json_t *lp = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs");
    json_t *want = json_pack("{s:[s,s], s:[f,f], s:[{s:f,s:f},{s:f,s:f}], s:[i,i]}", "tokens",
                             bytes_of(t.ids[0]), bytes_of(t.ids[1]), "token_logprobs", -0.5,
                             -9999.0, "top_logprobs", bytes_of(t.ids[0]), -0.5, bytes_of(t.ids[1]),
                             -2.0, bytes_of(t.ids[0]), -1.0, bytes_of(t.ids[1]), -9999.0,
                             "text_offset", 0, (int)strlen(bytes_of(t.ids[0])));
    if (!json_equal(lp, want)) {
        char *got = json_dumps(lp, 0), *w = json_dumps(want, 0);
        fail_msg("got %s\nwant %s", got, w);
    }
    json_decref(want);
    json_decref(r);
    gptoss_tokens_free(&t);
    api_call_free(c);
}

static void test_logprobs_chat_layout(void **state) {
    (void)state;
    gptoss_tokens t = encode("<|channel|>final<|message|>Hi", true);
    api_call *c = make_call(&api_chat_encoder, "{\"stream\": true}", true, 2);
    for (size_t i = 0; i < t.n; i++) {
        gptoss_engine_event ev = logprob_event(t.ids[i], -0.25f * (float)(i + 1), t.ids[i],
                                               -0.25f * (float)(i + 1), 7, -3.0f);
        generation_push(c->gen, &ev);
    }
    json_t *chunks = take_chunks(c);
    /* every token's entry, in order, across the chunks' logprobs.content */
    size_t seen = 0, i;
    json_t *ch;
    json_array_foreach(chunks, i, ch) {
        json_t *content = json_object_get(
            json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "logprobs"),
            "content");
        size_t k;
        json_t *e;
        json_array_foreach(content, k, e) {
            int32_t id = t.ids[seen];
            assert_string_equal(json_string_value(json_object_get(e, "token")), bytes_of(id));
            assert_true(fabs(json_real_value(json_object_get(e, "logprob")) -
                             (-0.25 * (double)(seen + 1))) < 1e-6);
            json_t *bytes = json_object_get(e, "bytes");
            assert_int_equal(json_array_size(bytes), strlen(bytes_of(id)));
            assert_int_equal(json_integer_value(json_array_get(bytes, 0)),
                             (unsigned char)bytes_of(id)[0]);
            json_t *top = json_object_get(e, "top_logprobs");
            assert_int_equal(json_array_size(top), 2);
            assert_string_equal(json_string_value(json_object_get(json_array_get(top, 1), "token")),
                                bytes_of(7));
            assert_true(json_real_value(json_object_get(json_array_get(top, 1), "logprob")) ==
                        -3.0);
            seen++;
        }
    }
    assert_int_equal(seen, t.n);
    json_decref(chunks);
    gptoss_tokens_free(&t);
    api_call_free(c);
}

/* ---- several choices ------------------------------------------------------------------------ */

static void test_n_choices(void **state) {
    (void)state;
    gptoss_tokens a = encode("<|channel|>final<|message|>First answer", true);
    gptoss_tokens b = encode("<|channel|>final<|message|>Second one<|return|>", true);
    api_call *c = make_call(&api_chat_encoder, "{\"n\": 2}", false, 0);
    size_t n = a.n > b.n ? a.n : b.n;
    for (size_t i = 0; i < n; i++) { /* interleaved, as the engine delivers them */
        if (i < a.n) {
            gptoss_engine_event ev = token_event(0, a.ids[i], 0);
            if (i + 1 == a.n) ev.finish = GPTOSS_FINISH_LENGTH;
            generation_push(c->gen, &ev);
        }
        if (i < b.n) {
            gptoss_engine_event ev = token_event(1, b.ids[i], 0);
            if (i + 1 == b.n) ev.finish = GPTOSS_FINISH_STOP, ev.stop_token_id = b.ids[i];
            generation_push(c->gen, &ev);
        }
    }
    assert_true(generation_done(c->gen));
    json_t *r = c->encoder->response(c, c->state);
    json_t *choices = json_object_get(r, "choices");
    assert_int_equal(json_array_size(choices), 2);
    json_t *c0 = json_array_get(choices, 0), *c1 = json_array_get(choices, 1);
    assert_int_equal(json_integer_value(json_object_get(c1, "index")), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c0, "message"), "content")),
        "First answer");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c1, "message"), "content")),
        "Second one");
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    assert_string_equal(json_string_value(json_object_get(c1, "finish_reason")), "stop");
    json_t *u = json_object_get(r, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")),
                     (json_int_t)(a.n + b.n));
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(u, "completion_tokens_details"), "reasoning_tokens")),
                     0);
    json_decref(r);
    gptoss_tokens_free(&a);
    gptoss_tokens_free(&b);
    api_call_free(c);
}

/* ---- logit_bias ---------------------------------------------------------------------------- */

static void expect_field_error(const char *fields, const char *param, const char *needle) {
    json_t *req = json_loads(fields, 0, NULL);
    assert_non_null(req);
    request_params p;
    field_error fe = {0};
    bool ok = request_params_parse(req, vocab, 8, &p, &fe);
    request_params_free(&p);
    json_decref(req);
    if (ok) fail_msg("accepted %s", fields);
    assert_string_equal(fe.param, param);
    if (!strstr(fe.message, needle))
        fail_msg("%s: message \"%s\" lacks \"%s\"", fields, fe.message, needle);
}

static void test_logit_bias(void **state) {
    (void)state;
    json_t *req =
        json_loads("{\"logit_bias\": {\"7\": 5, \"200000\": -100, \"12\": 0.5}}", 0, NULL);
    request_params p;
    field_error fe = {0};
    assert_true(request_params_parse(req, vocab, 8, &p, &fe));
    assert_int_equal(p.sampling.n_logit_bias, 3);
    float sum = 0;
    for (int32_t i = 0; i < 3; i++) {
        int32_t id = p.sampling.logit_bias_tokens[i];
        float v = p.sampling.logit_bias_values[i];
        assert_true((id == 7 && v == 5.0f) || (id == 200000 && v == -100.0f) ||
                    (id == 12 && v == 0.5f));
        sum += (float)id;
    }
    assert_true(sum == 200019.0f);
    request_params_free(&p);
    json_decref(req);

    expect_field_error("{\"logit_bias\": [1, 2]}", "logit_bias", "expected an object");
    expect_field_error("{\"logit_bias\": {\"abc\": 1}}", "logit_bias", "not a token id");
    expect_field_error("{\"logit_bias\": {\"-1\": 1}}", "logit_bias", "not a token id");
    expect_field_error("{\"logit_bias\": {\"1.5\": 1}}", "logit_bias", "not a token id");
    expect_field_error("{\"logit_bias\": {\" 1\": 1}}", "logit_bias", "not a token id");
    expect_field_error("{\"logit_bias\": {\"\": 1}}", "logit_bias", "not a token id");
    expect_field_error("{\"logit_bias\": {\"99999999999999999999\": 1}}", "logit_bias",
                       "not a token id");
    char big[64];
    snprintf(big, sizeof big, "{\"logit_bias\": {\"%d\": 1}}", vocab);
    expect_field_error(big, "logit_bias", "out of range");
    expect_field_error("{\"logit_bias\": {\"5\": 100.5}}", "logit_bias",
                       "out of range [-100, 100]");
    expect_field_error("{\"logit_bias\": {\"5\": -101}}", "logit_bias", "out of range [-100, 100]");
    expect_field_error("{\"logit_bias\": {\"5\": \"1\"}}", "logit_bias", "expected a number");
    expect_field_error("{\"logit_bias\": {\"7\": 1, \"07\": 2}}", "logit_bias", "given twice");
    /* at most GPTOSS_MAX_LOGIT_BIAS entries */
    json_t *many = json_object();
    for (int i = 0; i <= GPTOSS_MAX_LOGIT_BIAS; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", i);
        json_object_set_new(many, k, json_integer(1));
    }
    json_t *wrap = json_pack("{s:o}", "logit_bias", many);
    char *text = json_dumps(wrap, JSON_COMPACT);
    expect_field_error(text, "logit_bias", "at most 1024 entries");
    free(text);
    json_object_del(many, "0");
    text = json_dumps(wrap, JSON_COMPACT);
    req = json_loads(text, 0, NULL);
    assert_true(request_params_parse(req, vocab, 8, &p, &fe));
    assert_int_equal(p.sampling.n_logit_bias, GPTOSS_MAX_LOGIT_BIAS);
    request_params_free(&p);
    json_decref(req);
    free(text);
    json_decref(wrap);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_string_holdback_across_tokens),
        cmocka_unit_test(test_stop_string_false_start_released),
        cmocka_unit_test(test_chat_tool_call_deltas),
        cmocka_unit_test(test_chat_tool_call_message),
        cmocka_unit_test(test_logprobs_completions_layout),
        cmocka_unit_test(test_logprobs_chat_layout),
        cmocka_unit_test(test_n_choices),
        cmocka_unit_test(test_logit_bias),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
