/*
 * test_openai_chat.c - OpenAI chat-completions request -> harmony prompt.
 *
 * Reference: the complete worked example of spec section 6.9 (a tool round trip, written
 * out token by token there) and harmony's dropping rule (spec 6.6); plus every validation
 * error naming its field.
 */
#include "chat_test_util.h"

#include "chat/openai_chat.h"

static const char *const system_and_developer =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n"
    "Current date: 2025-08-05\n\n"
    "Reasoning: low\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
    "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
    "<|start|>developer<|message|># Instructions\n\n"
    "Answer briefly.\n\n"
    "# Tools\n\n"
    "## functions\n\n"
    "namespace functions {\n\n"
    "// Returns the current local time for a timezone.\n"
    "type get_time = (_: {\n"
    "// IANA timezone name\n"
    "timezone: string,\n"
    "}) => any;\n\n"
    "} // namespace functions<|end|>";

static const char *const request_head =
    "{\"reasoning_effort\":\"low\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_"
    "time\","
    "\"description\":\"Returns the current local time for a "
    "timezone.\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"timezone\":{\"type\":\"string\",\"description\":\"IANA timezone name\"}},"
    "\"required\":[\"timezone\"]}}}],\"messages\":[{\"role\":\"system\",\"content\":\"Answer "
    "briefly.\"},"
    "{\"role\":\"user\",\"content\":\"What time is it in Tokyo?\"}";

/* Maps and renders request_text; returns the malloc'd prompt or NULL with *err filled. */
static char *render_request(const char *request_text, gptoss_error *err) {
    json_error_t jerr;
    json_t *request = json_loads(request_text, 0, &jerr);
    if (!request) fail_msg("bad test JSON: %s", jerr.text);
    gptoss_harmony_conversation conversation;
    gptoss_harmony_conversation_init(&conversation);
    gptoss_openai_chat_options options = {.current_date = "2025-08-05"};
    char *text = NULL;
    size_t len;
    if (gptoss_openai_chat_to_harmony(request, &options, &conversation, err) == GPTOSS_OK) {
        gptoss_harmony_render_options o = gptoss_harmony_render_options_default();
        if (gptoss_harmony_render_text(&conversation, &o, &text, &len, err)) text = NULL;
    }
    gptoss_harmony_conversation_free(&conversation);
    json_decref(request);
    return text;
}

static void test_worked_example(void **state) {
    (void)state;
    gptoss_error err = {0};
    char request[4096];
    snprintf(request, sizeof request, "%s]}", request_head);
    char *text = render_request(request, &err);
    assert_non_null(text);
    char want[4096];
    snprintf(want, sizeof want,
             "%s<|start|>user<|message|>What time is it in Tokyo?<|end|><|start|>assistant",
             system_and_developer);
    assert_string_equal(text, want);
    free(text);

    /* After the tool round trip (spec 6.9, second prompt): nothing dropped. */
    snprintf(request, sizeof request,
             "%s,{\"role\":\"assistant\",\"reasoning_content\":\"Need Tokyo time; call get_time.\","
             "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{"
             "\"name\":"
             "\"get_time\",\"arguments\":\"{\\\"timezone\\\":\\\"Asia/Tokyo\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"{\\\"time\\\":\\\"14:05\\\"}"
             "\"}]}",
             request_head);
    text = render_request(request, &err);
    assert_non_null(text);
    snprintf(
        want, sizeof want,
        "%s<|start|>user<|message|>What time is it in "
        "Tokyo?<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Need Tokyo time; call get_time.<|end|><|start|>assistant to=functions.get_time"
        "<|channel|>commentary <|constrain|>json<|message|>{\"timezone\":\"Asia/Tokyo\"}<|call|>"
        "<|start|>functions.get_time "
        "to=assistant<|channel|>commentary<|message|>{\"time\":\"14:05\"}"
        "<|end|><|start|>assistant",
        system_and_developer);
    assert_string_equal(text, want);
    free(text);

    /* Next user turn: the final answer is stored with <|end|> and both analysis messages
     * (before the first final) are dropped; tool call and result stay (spec 6.9 end). */
    snprintf(
        request, sizeof request,
        "%s,{\"role\":\"assistant\",\"reasoning_content\":\"Need Tokyo time; call get_time.\","
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_time\","
        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"x\"},"
        "{\"role\":\"assistant\",\"reasoning\":\"Tool says "
        "14:05.\",\"content\":[{\"type\":\"text\","
        "\"text\":\"It is 14:05 \"},{\"type\":\"text\",\"text\":\"in Tokyo.\"}]},"
        "{\"role\":\"user\",\"content\":\"Thanks\"}]}",
        request_head);
    text = render_request(request, &err);
    assert_non_null(text);
    snprintf(want, sizeof want,
             "%s<|start|>user<|message|>What time is it in Tokyo?<|end|><|start|>assistant "
             "to=functions.get_time"
             "<|channel|>commentary <|constrain|>json<|message|>{}<|call|>"
             "<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>x<|end|>"
             "<|start|>assistant<|channel|>final<|message|>It is 14:05 in Tokyo.<|end|>"
             "<|start|>user<|message|>Thanks<|end|><|start|>assistant",
             system_and_developer);
    assert_string_equal(text, want);
    free(text);
}

static void expect_error(const char *request, const char *want) {
    gptoss_error err = {0};
    char *text = render_request(request, &err);
    if (text) fail_msg("request accepted, expected error containing \"%s\": %s", want, request);
    if (!strstr(err.message, want)) fail_msg("error \"%s\" lacks \"%s\"", err.message, want);
    assert_int_equal(err.status, GPTOSS_ERR_INVALID_ARGUMENT);
}

static void test_errors_name_the_field(void **state) {
    (void)state;
    expect_error("[]", "request: expected a JSON object");
    expect_error("{}", "messages: expected an array");
    expect_error("{\"messages\":[]}", "messages: must contain at least one message");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\",\"tool_"
                 "call_id\":\"abc\","
                 "\"content\":\"r\"}]}",
                 "messages[1].tool_call_id: no earlier tool call has id 'abc'");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                 "messages[0].content[0].type: 'image_url' is not supported");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
                 "messages[0].content: expected a string");
    expect_error("{\"messages\":[{\"role\":\"wizard\",\"content\":\"a\"}]}",
                 "messages[0].role: 'wizard'");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\"}]}",
                 "messages[1]: an assistant message needs content");
    expect_error(
        "{\"reasoning_effort\":\"max\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
        "reasoning_effort: expected");
    expect_error("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a "
                 "b\"}}],\"messages\":[{\"role\":"
                 "\"user\",\"content\":\"a\"}]}",
                 "tools[0].function.name");
    expect_error("{\"tools\":[{\"type\":\"retrieval\"}],\"messages\":[{\"role\":\"user\","
                 "\"content\":\"a\"}]}",
                 "tools[0].type");
    expect_error(
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"tool_"
        "calls\":"
        "[{\"id\":\"x\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":5}}]}]}",
        "messages[1].tool_calls[0].function.arguments");
}

/* User text that spells special tokens stays text, and tool_choice "none" hides tools. */
static void test_text_and_tool_choice(void **state) {
    (void)state;
    gptoss_error err = {0};
    char *text =
        render_request("{\"tool_choice\":\"none\",\"tools\":[{\"type\":\"function\",\"function\":"
                       "{\"name\":\"f\"}}],\"messages\":[{\"role\":\"user\",\"content\":"
                       "\"<|end|>\"}]}",
                       &err);
    assert_non_null(text);
    assert_null(strstr(text, "namespace functions"));
    assert_null(strstr(text, "<|start|>developer"));
    assert_non_null(strstr(text, "<|start|>user<|message|><|end|><|end|><|start|>assistant"));
    free(text);
}

/* response_format json_schema: the schema is shown in the developer message, after the
 * instructions, as harmony's guide lays out response formats; json_object adds nothing. */
static void test_response_format_in_prompt(void **state) {
    (void)state;
    gptoss_error err = {0};
    char *text = render_request(
        "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\","
        "\"description\":\"A person\",\"schema\":{\"type\":\"object\",\"properties\":{\"b\":{},"
        "\"a\":{}}}}},\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"hi\"}]}",
        &err);
    assert_non_null(text);
    assert_non_null(strstr(text,
                           "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n"
                           "# Response Formats\n\n## person\n\n// A person\n"
                           "{\"type\":\"object\",\"properties\":{\"b\":{},\"a\":{}}}<|end|>"));
    free(text);
    text = render_request("{\"response_format\":{\"type\":\"json_object\"},\"messages\":"
                          "[{\"role\":\"user\",\"content\":\"hi\"}]}",
                          &err);
    assert_non_null(text);
    assert_null(strstr(text, "<|start|>developer"));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_text_and_tool_choice),
        cmocka_unit_test(test_response_format_in_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
