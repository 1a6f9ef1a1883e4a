/*
 * test_responses_encoder.c - the /v1/responses encoder (api_responses.c) driven by hand-made
 * engine events, without an engine or HTTP: a harmony turn with reasoning and a tool call
 * becomes a reasoning item and a function_call item (with include: logprobs of the answer's
 * tokens, the reasoning handed out as encrypted_content and read back), streamed as the typed event
 * sequence OpenAI documents (every event named in its "event:" line and its "type", sequence
 * numbers 0, 1, 2, ...), and the stored conversation lets a later input answer the call.
 *
 * References: the token ids come from the real tokenizer encoding a harmony text written
 * here; the expected reasoning and arguments are that text cut by hand; the expected event
 * order is the one in OpenAI's API reference (and the openai npm types).
 */
#include "model_fixture.h"
#include "test_support.h"

#include "server/api_responses.h"
#include "server/responses_input.h"
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

static const char *tool_turn =
    "<|channel|>analysis<|message|>Need the weather in Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\"}<|call|>";

static api_call *make_call_with(bool stream, response_store *store, bool store_it, bool include,
                                const char *stop) {
    json_t *req = json_pack("{s:b}", "stream", stream);
    if (stop) json_object_set_new(req, "stop", json_string(stop));
    request_params p;
    field_error fe = {0};
    if (!request_params_parse(req, vocab, 1, &p, &fe)) fail_msg("%s", fe.message);
    p.sampling.logprobs = include;
    assert_true(request_params_finish(&p, vocab, &fe));
    json_decref(req);
    json_t *echo = json_pack("{s:s, s:n}", "model", "tiny", "instructions");
    json_t *items = json_pack("[{s:s, s:s, s:s}]", "type", "message", "role", "user", "content",
                              "Weather in Paris?");
    assert_true(api_responses_prepare(echo, items, store, store_it, false, include, include));
    json_decref(echo);
    json_decref(items);
    api_call *c = NULL;
    gptoss_error err = {0};
    assert_int_equal(
        api_call_create(&api_responses_encoder, "tiny", tok, &p, 9, 0xabc, 42, NULL, &c, &err),
        GPTOSS_OK);
    return c;
}

static api_call *make_call(bool stream, response_store *store, bool store_it) {
    return make_call_with(stream, store, store_it, false, NULL);
}

static void push_turn(api_call *c, const char *text) {
    gptoss_tokens t = {0};
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_encode(tok, text, strlen(text), true, &t, &err), GPTOSS_OK);
    for (size_t i = 0; i < t.n; i++) {
        gptoss_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.token_id = t.ids[i], ev.stop_token_id = -1;
        if (i + 1 == t.n) ev.finish = GPTOSS_FINISH_STOP, ev.stop_token_id = t.ids[i];
        generation_push(c->gen, &ev);
    }
    gptoss_tokens_free(&t);
}

/* The "event: T\ndata: {...}\n\n" records so far, as an array of the data objects. */
static json_t *take_events(api_call *c) {
    json_t *all = json_array();
    const char *p = c->out.data ? c->out.data : "";
    const char *end = p + c->out.len;
    while (p < end) {
        assert_memory_equal(p, "event: ", 7);
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        char type[96];
        snprintf(type, sizeof type, "%.*s", (int)(nl - p - 7), p + 7);
        assert_memory_equal(nl + 1, "data: ", 6);
        const char *stop = strstr(nl, "\n\n");
        assert_non_null(stop);
        json_error_t jerr;
        json_t *j = json_loadb(nl + 7, (size_t)(stop - nl - 7), 0, &jerr);
        if (!j) fail_msg("bad event data: %s", jerr.text);
        assert_string_equal(json_string_value(json_object_get(j, "type")), type);
        json_array_append_new(all, j);
        p = stop + 2;
    }
    c->out.len = 0;
    return all;
}

static const char *str(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s) fail_msg("no string '%s'", key);
    return s;
}

/* Joins `field` of the events of one type. */
static char *join(const json_t *events, const char *type, const char *field) {
    size_t cap = 4096, len = 0;
    char *out = calloc(cap, 1);
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(str(e, "type"), type) != 0) continue;
        const char *d = str(e, field);
        size_t n = strlen(d);
        assert_true(len + n < cap);
        memcpy(out + len, d, n);
        len += n;
    }
    return out;
}

static void test_stream_tool_turn(void **state) {
    (void)state;
    response_store *store = response_store_create(1 << 20, 4);
    api_call *c = make_call(true, store, true);
    assert_string_equal(c->id, "resp_0000000000000abc0000002a");
    push_turn(c, tool_turn);
    assert_true(generation_done(c->gen));
    c->encoder->stream_end(c, c->state);
    json_t *events = take_events(c);
    /* the order, with the deltas of a run collapsed into one entry */
    static const char *const want[] = {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    };
    size_t k = 0, i;
    json_t *e;
    json_array_foreach(events, i, e) {
        assert_int_equal(json_integer_value(json_object_get(e, "sequence_number")), (json_int_t)i);
        const char *type = str(e, "type");
        if (k > 0 && strstr(type, ".delta") && !strcmp(type, want[k - 1])) continue;
        if (k >= sizeof want / sizeof want[0] || strcmp(type, want[k]) != 0)
            fail_msg("event %zu is %s, want %s", i, type,
                     k < sizeof want / sizeof want[0] ? want[k] : "(none)");
        k++;
    }
    assert_int_equal(k, sizeof want / sizeof want[0]);
    char *reasoning = join(events, "response.reasoning_text.delta", "delta");
    char *arguments = join(events, "response.function_call_arguments.delta", "delta");
    assert_string_equal(reasoning, "Need the weather in Paris.");
    assert_string_equal(arguments, "{\"city\": \"Paris\"}");
    free(reasoning);
    free(arguments);
    /* the item the function call was added as names it before its arguments arrive */
    json_t *added = json_object_get(json_array_get(events, 0), "response");
    assert_string_equal(str(added, "status"), "in_progress");
    json_t *last = json_object_get(json_array_get(events, json_array_size(events) - 1), "response");
    assert_string_equal(str(last, "status"), "completed");
    json_t *output = json_object_get(last, "output");
    assert_int_equal(json_array_size(output), 2);
    json_t *rs = json_array_get(output, 0), *fc = json_array_get(output, 1);
    assert_string_equal(str(rs, "type"), "reasoning");
    assert_string_equal(str(json_array_get(json_object_get(rs, "content"), 0), "text"),
                        "Need the weather in Paris.");
    assert_string_equal(str(fc, "type"), "function_call");
    assert_string_equal(str(fc, "name"), "get_weather");
    assert_string_equal(str(fc, "arguments"), "{\"city\": \"Paris\"}");
    assert_string_equal(str(fc, "status"), "completed");
    const char *call_id = str(fc, "call_id");
    json_t *usage = json_object_get(last, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "input_tokens")), 9);
    assert_true(json_integer_value(json_object_get(json_object_get(usage, "output_tokens_details"),
                                                   "reasoning_tokens")) > 0);

    /* the stored conversation: the user message, then the two output items; a new input
     * may answer the call by its id */
    char *items_text = NULL, *response_text = NULL;
    assert_true(response_store_get(store, c->id, &response_text, &items_text, NULL));
    json_t *stored = json_loads(response_text, 0, NULL);
    assert_true(json_equal(stored, last));
    json_t *items = json_loads(items_text, 0, NULL);
    assert_int_equal(json_array_size(items), 3);
    json_t *input = json_pack("[{s:s, s:s, s:s}]", "type", "function_call_output", "call_id",
                              call_id, "output", "sunny");
    field_error fe = {0};
    json_t *chain = json_copy(items);
    if (!responses_input_read(input, items, chain, &fe)) fail_msg("%s", fe.message);
    json_t *messages = responses_items_to_messages(NULL, chain);
    json_t *assistant = json_array_get(messages, 1);
    assert_string_equal(str(assistant, "reasoning_content"), "Need the weather in Paris.");
    assert_string_equal(str(json_array_get(messages, 2), "tool_call_id"), call_id);
    json_decref(messages);
    json_decref(chain);
    json_decref(input);
    json_decref(items);
    json_decref(stored);
    free(items_text);
    free(response_text);
    json_decref(events);
    api_call_free(c);
    response_store_free(store);
}

/* Not streaming: the same items, the length limit makes the response and its last item
 * incomplete, and store: false keeps nothing. */
static void test_plain_incomplete(void **state) {
    (void)state;
    response_store *store = response_store_create(1 << 20, 4);
    api_call *c = make_call(false, store, false);
    const char *partial = "<|channel|>analysis<|message|>Think<|end|><|start|>assistant"
                          "<|channel|>final<|message|>Hello there";
    gptoss_tokens t = {0};
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_encode(tok, partial, strlen(partial), true, &t, &err),
                     GPTOSS_OK);
    for (size_t i = 0; i < t.n; i++) {
        gptoss_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.token_id = t.ids[i], ev.stop_token_id = -1;
        if (i + 1 == t.n) ev.finish = GPTOSS_FINISH_LENGTH;
        generation_push(c->gen, &ev);
    }
    assert_int_equal(c->out.len, 0); /* nothing streamed */
    json_t *r = c->encoder->response(c, c->state);
    assert_string_equal(str(r, "status"), "incomplete");
    assert_string_equal(str(json_object_get(r, "incomplete_details"), "reason"),
                        "max_output_tokens");
    json_t *output = json_object_get(r, "output");
    assert_int_equal(json_array_size(output), 2);
    json_t *msg = json_array_get(output, 1);
    assert_string_equal(str(json_array_get(output, 0), "status"), "completed");
    assert_string_equal(str(msg, "status"), "incomplete");
    assert_string_equal(str(json_array_get(json_object_get(msg, "content"), 0), "text"),
                        "Hello there");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r, "usage"), "output_tokens")),
        (json_int_t)t.n);
    assert_false(response_store_get(store, c->id, NULL, NULL, NULL));
    json_decref(r);
    gptoss_tokens_free(&t);
    api_call_free(c);
    response_store_free(store);
}

/* include: message.output_text.logprobs gives the answer's tokens (not the reasoning's, not
 * the header's) an entry each, in the deltas and in the final part, also when a stop string
 * holds text back; reasoning.encrypted_content carries the reasoning text, marked, and reads
 * back as that reasoning. Reference: the answer's tokens are the tokenizer's encoding of the
 * answer text alone; each event's logprob is made from its position. */
static void test_include(void **state) {
    (void)state;
    api_call *c = make_call_with(true, NULL, false, true, "zzz");
    const char *head = "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant"
                       "<|channel|>final<|message|>";
    const char *answer = "Hello there, friend";
    gptoss_tokens h = {0}, a = {0};
    gptoss_error err = {0};
    assert_int_equal(gptoss_tokenizer_encode(tok, head, strlen(head), true, &h, &err), GPTOSS_OK);
    assert_int_equal(gptoss_tokenizer_encode(tok, answer, strlen(answer), true, &a, &err),
                     GPTOSS_OK);
    int32_t ret = gptoss_tokenizer_special_id(tok, "<|return|>");
    int32_t n = (int32_t)(h.n + a.n + 1);
    for (int32_t i = 0; i < n; i++) {
        gptoss_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.token_id = i < (int32_t)h.n ? h.ids[i] : i < n - 1 ? a.ids[i - h.n] : ret;
        ev.stop_token_id = -1;
        ev.logprob = -0.25f * (float)i;
        ev.n_top_logprobs = 1;
        ev.top_logprobs[0] = (gptoss_token_logprob){ev.token_id, ev.logprob};
        if (i == n - 1) ev.finish = GPTOSS_FINISH_STOP, ev.stop_token_id = ret;
        generation_push(c->gen, &ev);
    }
    c->encoder->stream_end(c, c->state);
    json_t *events = take_events(c);
    json_t *delta_lp = json_array(), *done = NULL, *reasoning = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *type = str(e, "type");
        if (!strcmp(type, "response.output_text.delta"))
            json_array_extend(delta_lp, json_object_get(e, "logprobs"));
        if (!strcmp(type, "response.output_text.done")) done = json_object_get(e, "logprobs");
        if (!strcmp(type, "response.output_item.done") &&
            !strcmp(str(json_object_get(e, "item"), "type"), "reasoning"))
            reasoning = json_object_get(e, "item");
    }
    assert_int_equal(json_array_size(delta_lp), a.n);
    assert_true(json_equal(delta_lp, done));
    json_array_foreach(delta_lp, i, e) {
        size_t len = 0;
        const char *bytes = gptoss_tokenizer_token_bytes(tok, a.ids[i], &len);
        assert_int_equal(strlen(str(e, "token")), len);
        assert_memory_equal(str(e, "token"), bytes, len);
        double want = -0.25 * (double)(h.n + i);
        assert_true(json_real_value(json_object_get(e, "logprob")) == want);
        json_t *top = json_object_get(e, "top_logprobs");
        assert_int_equal(json_array_size(top), 1);
        assert_string_equal(str(json_array_get(top, 0), "token"), str(e, "token"));
    }
    assert_non_null(reasoning);
    assert_string_equal(str(reasoning, "encrypted_content"),
                        RESPONSES_REASONING_MARK "Think first.");
    /* handed back without content, it is the reasoning text again */
    json_t *input = json_pack("[{s:s, s:s, s:[], s:s}]", "type", "reasoning", "id", "rs_x",
                              "summary", "encrypted_content", str(reasoning, "encrypted_content"));
    json_t *items = json_array();
    field_error fe = {0};
    assert_true(responses_input_read(input, NULL, items, &fe));
    assert_string_equal(str(json_array_get(items, 0), "text"), "Think first.");
    /* another server's encrypted_content means nothing here */
    json_object_set_new(json_array_get(input, 0), "encrypted_content", json_string("gAAAAB..."));
    json_array_clear(items);
    assert_true(responses_input_read(input, NULL, items, &fe));
    assert_string_equal(str(json_array_get(items, 0), "text"), "");
    json_decref(items);
    json_decref(input);
    json_decref(delta_lp);
    json_decref(events);
    gptoss_tokens_free(&h);
    gptoss_tokens_free(&a);
    api_call_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_tool_turn),
        cmocka_unit_test(test_plain_incomplete),
        cmocka_unit_test(test_include),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
