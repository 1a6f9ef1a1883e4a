/*
 * test_chat.c - the chat API (chat.h): request -> prompt ids and stop ids; generated ids ->
 * OpenAI pieces (reasoning_content, content, tool_calls, finish_reason).
 *
 * References: the prompt ids come from ../shared/reference/harmony/derived_tokens.json (an
 * independent o200k BPE over harmony's test_no_tools rendering, plus the user message ids
 * "user" = 1428 and "hello world" = [24912, 2375] given there); generated sequences are
 * written as harmony text and the expected pieces by hand from the format.
 */
#include "chat_test_util.h"

#include "chat/chat.h"

static gptoss_tokenizer *tokenizer;

static int setup(void **state) {
    (void)state;
    tokenizer = ct_load_tokenizer();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_tokenizer_free(tokenizer);
    return 0;
}

static void test_prompt_ids_match_reference(void **state) {
    (void)state;
    json_t *derived = ct_load_reference_json("derived_tokens.json");
    const json_t *no_tools =
        json_object_get(json_object_get(derived, "render_expected_tokens"), "test_no_tools");
    size_t n_ref = 0;
    int32_t *ref = ct_ids(no_tools, &n_ref);
    assert_true(n_ref > 2);
    /* test_no_tools is the default system message (date 2025-06-28) + "<|start|>assistant";
     * a user message "hello world" goes between the two. */
    int32_t want[200];
    size_t n_want = 0;
    for (size_t i = 0; i + 2 < n_ref; i++)
        want[n_want++] = ref[i];
    const int32_t user_turn[] = {200006, 1428, 200008, 24912, 2375, 200007, 200006, 173781};
    for (size_t i = 0; i < sizeof user_turn / sizeof *user_turn; i++)
        want[n_want++] = user_turn[i];

    json_t *request =
        json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}]}", 0, NULL);
    gptoss_openai_chat_options options = {.current_date = "2025-06-28"};
    gptoss_chat_prompt prompt;
    gptoss_error err = {0};
    assert_int_equal(gptoss_chat_prompt_from_request(tokenizer, request, &options, &prompt, &err),
                     GPTOSS_OK);
    assert_int_equal(prompt.tokens.n, n_want);
    assert_memory_equal(prompt.tokens.ids, want, n_want * sizeof *want);
    assert_true(gptoss_chat_prompt_is_stop(&prompt, 200002));
    assert_true(gptoss_chat_prompt_is_stop(&prompt, 200012));
    assert_true(gptoss_chat_prompt_is_stop(&prompt, 199999));
    assert_false(
        gptoss_chat_prompt_is_stop(&prompt, 200007)); /* <|end|> ends a message, not a turn */
    assert_false(gptoss_chat_prompt_is_stop(&prompt, 24912));
    gptoss_chat_prompt_free(&prompt);
    json_decref(request);
    free(ref);
    json_decref(derived);
}

static void test_bad_request_names_the_field(void **state) {
    (void)state;
    json_t *request =
        json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"nope\",\"content\":\"x\"}]}",
                   0, NULL);
    gptoss_chat_prompt prompt;
    gptoss_error err = {0};
    assert_int_equal(gptoss_chat_prompt_from_request(tokenizer, request, NULL, &prompt, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "messages[1].tool_call_id"));
    assert_int_equal(prompt.tokens.n, 0);
    assert_null(prompt.tokens.ids);
    json_decref(request);
}

/* What a stream produced, pieces concatenated by kind. */
typedef struct collected {
    char reasoning[512], content[512], preamble[512], arguments[4][256];
    char call_ids[4][64], names[4][64];
    int n_calls;
    char finish[32];
    int n_finish;
    bool done_before_finish;
    int pieces_after_done; /* pieces produced by ids pushed after the stop */
} collected;

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] >> 6) != 2) return false;
        i += len;
    }
    return true;
}

static void take(collected *c, gptoss_chat_stream *stream, bool after_done) {
    size_t n = 0;
    const gptoss_chat_piece *pieces = gptoss_chat_stream_pieces(stream, &n);
    if (after_done) c->pieces_after_done += (int)n;
    for (size_t i = 0; i < n; i++) {
        const gptoss_chat_piece *p = &pieces[i];
        if (p->text) assert_true(valid_utf8(p->text, p->len)); /* never a broken character */
        switch (p->kind) {
        case GPTOSS_CHAT_PIECE_REASONING:
            strncat(c->reasoning, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_CONTENT:
            strncat(p->preamble ? c->preamble : c->content, p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_TOOL_CALL:
            assert_int_equal(p->tool_index, c->n_calls);
            snprintf(c->call_ids[c->n_calls], sizeof c->call_ids[0], "%s", p->call_id);
            snprintf(c->names[c->n_calls], sizeof c->names[0], "%s", p->name);
            c->n_calls++;
            break;
        case GPTOSS_CHAT_PIECE_TOOL_ARGUMENTS:
            assert_true(p->tool_index >= 0 && p->tool_index < c->n_calls);
            strncat(c->arguments[p->tool_index], p->text, p->len);
            break;
        case GPTOSS_CHAT_PIECE_FINISH:
            snprintf(c->finish, sizeof c->finish, "%s", p->finish_reason);
            c->n_finish++;
            break;
        }
    }
}

/* Streams `generated` (harmony text, special tokens recognised) plus the ids of `trailing`
 * (ordinary text pushed after it, e.g. after a stop) through a chat stream. */
static void run_stream(const char *generated, const char *trailing, const char *prefix,
                       collected *c) {
    memset(c, 0, sizeof *c);
    gptoss_tokens ids = {0};
    gptoss_error err = {0};
    assert_int_equal(
        gptoss_tokenizer_encode(tokenizer, generated, strlen(generated), true, &ids, &err),
        GPTOSS_OK);
    size_t n_generated = ids.n;
    if (trailing)
        assert_int_equal(
            gptoss_tokenizer_encode(tokenizer, trailing, strlen(trailing), false, &ids, &err),
            GPTOSS_OK);
    gptoss_chat_stream *stream = NULL;
    assert_int_equal(gptoss_chat_stream_create(tokenizer, prefix, &stream, &err), GPTOSS_OK);
    for (size_t i = 0; i < ids.n; i++) {
        bool after_done = gptoss_chat_stream_done(stream);
        assert_int_equal(gptoss_chat_stream_push(stream, ids.ids[i], &err), GPTOSS_OK);
        take(c, stream, after_done);
        if (i + 1 == n_generated) c->done_before_finish = gptoss_chat_stream_done(stream);
    }
    assert_int_equal(gptoss_chat_stream_finish(stream, &err), GPTOSS_OK);
    take(c, stream, false);
    assert_int_not_equal(gptoss_chat_stream_finish(stream, &err), GPTOSS_OK); /* only once */
    gptoss_chat_stream_free(stream);
    gptoss_tokens_free(&ids);
}

static void test_reasoning_then_answer(void **state) {
    (void)state;
    collected c;
    run_stream("<|channel|>analysis<|message|>The user greets me.<|end|>"
               "<|start|>assistant<|channel|>final<|message|>Hello! Grüße, 世界 💖<|return|>",
               "ignored after the stop", NULL, &c);
    assert_string_equal(c.reasoning, "The user greets me.");
    assert_string_equal(c.content, "Hello! Grüße, 世界 💖");
    assert_int_equal(c.n_calls, 0);
    assert_true(c.done_before_finish);
    assert_int_equal(c.pieces_after_done, 0);
    assert_string_equal(c.finish, "stop");
    assert_int_equal(c.n_finish, 1);
}

static void test_tool_call(void **state) {
    (void)state;
    collected c;
    run_stream("<|channel|>analysis<|message|>Need the weather.<|end|>"
               "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
               "<|message|>{\"location\":\"Paris, France\"}<|call|>",
               NULL, NULL, &c);
    assert_string_equal(c.reasoning, "Need the weather.");
    assert_string_equal(c.content, "");
    assert_int_equal(c.n_calls, 1);
    assert_string_equal(c.names[0], "get_weather");
    assert_string_equal(c.call_ids[0], "call_0");
    assert_string_equal(c.arguments[0], "{\"location\":\"Paris, France\"}");
    assert_true(c.done_before_finish);
    assert_string_equal(c.finish, "tool_calls");
}

static void test_preamble_and_call_id_prefix(void **state) {
    (void)state;
    collected c;
    run_stream("<|channel|>commentary<|message|>Let me check.<|end|>"
               "<|start|>assistant "
               "to=browser.search<|channel|>analysis<|message|>{\"query\":\"x\"}<|call|>",
               NULL, "call_req7_", &c);
    assert_string_equal(c.preamble, "Let me check.");
    assert_string_equal(c.content, "");
    assert_int_equal(c.n_calls, 1);
    assert_string_equal(c.names[0], "browser.search"); /* not a function: the whole recipient */
    assert_string_equal(c.call_ids[0], "call_req7_0");
    assert_string_equal(c.arguments[0], "{\"query\":\"x\"}");
    assert_string_equal(c.finish, "tool_calls");
}

static void test_length_when_no_stop(void **state) {
    (void)state;
    collected c;
    /* Cut off in the middle of the answer. */
    run_stream("<|channel|>final<|message|>Partial answ", NULL, NULL, &c);
    assert_string_equal(c.content, "Partial answ");
    assert_false(c.done_before_finish);
    assert_string_equal(c.finish, "length");
    /* An <|end|> is not a stop: the model may go on with another message. */
    run_stream("<|channel|>analysis<|message|>thinking<|end|>", NULL, NULL, &c);
    assert_string_equal(c.reasoning, "thinking");
    assert_false(c.done_before_finish);
    assert_string_equal(c.finish, "length");
}

static void test_endoftext_stops(void **state) {
    (void)state;
    collected c;
    run_stream("<|channel|>final<|message|>Done<|endoftext|>", "more", NULL, &c);
    assert_string_equal(c.content, "Done");
    assert_true(c.done_before_finish);
    assert_int_equal(c.pieces_after_done, 0);
    assert_string_equal(c.finish, "stop");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_ids_match_reference),
        cmocka_unit_test(test_bad_request_names_the_field),
        cmocka_unit_test(test_reasoning_then_answer),
        cmocka_unit_test(test_tool_call),
        cmocka_unit_test(test_preamble_and_call_id_prefix),
        cmocka_unit_test(test_length_when_no_stop),
        cmocka_unit_test(test_endoftext_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
