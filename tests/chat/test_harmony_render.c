/*
 * test_harmony_render.c - the harmony renderer against OpenAI's harmony reference cases.
 *
 * Every render case of ../shared/reference/harmony/cases.json (19) and extra_cases.json
 * (render, render_for_training, and the render checks of parse cases) must produce text
 * byte-identical to harmony's expected output. Each failing case is reported by name; the
 * test fails if any does. Also checks the schema renderer on shapes no case covers (nested
 * objects, integer, Array<any>) against the layout rules of spec 6.3, and error paths.
 */
#include "chat_test_util.h"

#include "chat/chat_buf.h"
#include "chat/harmony.h"

static gptoss_harmony_render_options options_from_json(const json_t *options, const char *kind) {
    gptoss_harmony_render_options o = gptoss_harmony_render_options_default();
    o.mode = GPTOSS_RENDER_PLAIN;
    if (strcmp(kind, "render_for_completion") == 0) o.mode = GPTOSS_RENDER_COMPLETION;
    if (strcmp(kind, "render_for_training") == 0) o.mode = GPTOSS_RENDER_TRAINING;
    const char *next = json_string_value(json_object_get(options, "next_turn_role"));
    if (next) assert_true(gptoss_harmony_role_parse(next, strlen(next), &o.next_turn_role));
    o.auto_drop_analysis = json_is_true(json_object_get(options, "auto_drop_analysis"));
    return o;
}

/* Renders conversation with options; compares with want; returns 1 on mismatch. */
static int check_render(const char *name, const json_t *conversation_json,
                        const gptoss_harmony_render_options *options, const char *want,
                        size_t want_len) {
    gptoss_harmony_conversation conversation;
    gptoss_harmony_conversation_init(&conversation);
    gptoss_error err = {0};
    int failed = 0;
    if (gptoss_harmony_conversation_from_json(conversation_json, &conversation, &err)) {
        fprintf(stderr, "  %s: cannot read conversation: %s\n", name, err.message);
        failed = 1;
    } else {
        char *text = NULL;
        size_t len = 0;
        if (gptoss_harmony_render_text(&conversation, options, &text, &len, &err)) {
            fprintf(stderr, "  %s: render failed: %s\n", name, err.message);
            failed = 1;
        } else if (len != want_len || memcmp(text, want, len) != 0) {
            ct_print_first_difference(name, text, len, want, want_len);
            failed = 1;
        }
        free(text);
    }
    gptoss_harmony_conversation_free(&conversation);
    return failed;
}

static void test_cases_json(void **state) {
    (void)state;
    json_t *root = ct_load_reference_json("cases.json");
    size_t i;
    json_t *c;
    int n_render = 0, n_failed = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *kind = json_string_value(json_object_get(c, "kind"));
        if (strcmp(kind, "parse") == 0) {
            const json_t *check = json_object_get(json_object_get(c, "parse"), "render_check");
            if (!check) check = json_object_get(c, "render_check");
            if (check) {
                const json_t *want = json_object_get(check, "expected_text");
                gptoss_harmony_render_options o =
                    options_from_json(json_object_get(check, "options"), "render");
                char label[256];
                snprintf(label, sizeof label, "%s (render_check)", name);
                n_render++;
                n_failed += check_render(label, json_object_get(check, "conversation"), &o,
                                         json_string_value(want), json_string_length(want));
            }
            continue;
        }
        size_t want_len;
        char *want =
            ct_read_expected(json_string_value(json_object_get(c, "expected_file")), &want_len);
        gptoss_harmony_render_options o = options_from_json(json_object_get(c, "options"), kind);
        n_render++;
        n_failed += check_render(name, json_object_get(c, "conversation"), &o, want, want_len);
        /* Cases whose output does not depend on the drop flag must render the same with the
         * flag flipped. */
        if (!json_is_true(json_object_get(json_object_get(c, "options"),
                                          "auto_drop_analysis_affects_output"))) {
            o.auto_drop_analysis = !o.auto_drop_analysis;
            char label[256];
            snprintf(label, sizeof label, "%s (drop flag flipped)", name);
            n_failed += check_render(label, json_object_get(c, "conversation"), &o, want, want_len);
        }
        free(want);
    }
    fprintf(stderr, "cases.json: %d render checks, %d failed\n", n_render, n_failed);
    assert_int_equal(n_render, 20);
    assert_int_equal(n_failed, 0);
    json_decref(root);
}

static void test_extra_cases_json(void **state) {
    (void)state;
    json_t *root = ct_load_reference_json("extra_cases.json");
    size_t i;
    json_t *c;
    int n_render = 0, n_failed = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *kind = json_string_value(json_object_get(c, "kind"));
        const json_t *options = json_object_get(c, "options");
        char label[256];
        if (strcmp(kind, "render") == 0 || strcmp(kind, "render_for_training") == 0) {
            const json_t *want = json_object_get(c, "expected_text");
            gptoss_harmony_render_options o = options_from_json(options, kind);
            n_render++;
            n_failed += check_render(name, json_object_get(c, "conversation"), &o,
                                     json_string_value(want), json_string_length(want));
            const json_t *completion = json_object_get(c, "expected_text_for_completion");
            if (completion) {
                o.mode = GPTOSS_RENDER_COMPLETION;
                o.next_turn_role = GPTOSS_ROLE_ASSISTANT;
                snprintf(label, sizeof label, "%s (for completion)", name);
                n_render++;
                n_failed +=
                    check_render(label, json_object_get(c, "conversation"), &o,
                                 json_string_value(completion), json_string_length(completion));
            }
            const json_t *plain = json_object_get(c, "expected_text_plain_render");
            if (plain) {
                o.mode = GPTOSS_RENDER_PLAIN;
                snprintf(label, sizeof label, "%s (plain)", name);
                n_render++;
                n_failed += check_render(label, json_object_get(c, "conversation"), &o,
                                         json_string_value(plain), json_string_length(plain));
            }
        }
        const json_t *check = json_object_get(c, "render_check");
        if (check) {
            const json_t *want = json_object_get(check, "expected_text");
            gptoss_harmony_render_options o =
                options_from_json(json_object_get(check, "options"), "render");
            snprintf(label, sizeof label, "%s (render_check)", name);
            n_render++;
            n_failed += check_render(label, json_object_get(check, "conversation"), &o,
                                     json_string_value(want), json_string_length(want));
        }
    }
    fprintf(stderr, "extra_cases.json: %d render checks, %d failed\n", n_render, n_failed);
    assert_true(n_render >= 5);
    assert_int_equal(n_failed, 0);
    json_decref(root);
}

/* The built-in namespaces the library ships must equal the ones harmony's cases write out. */
static void test_builtin_tools_match_reference(void **state) {
    (void)state;
    json_t *root = ct_load_reference_json("cases.json");
    json_t *found = NULL;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "name")), "test_browser_and_python_tool") ==
            0)
            found = json_array_get(json_object_get(c, "conversation"), 0);
    }
    assert_non_null(found);
    gptoss_harmony_conversation reference, ours;
    gptoss_harmony_conversation_init(&reference);
    gptoss_harmony_conversation_init(&ours);
    json_t *list = json_array();
    json_array_append(list, found);
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_conversation_from_json(list, &reference, &err), GPTOSS_OK);

    /* Same system message, but with our built-in namespaces (python first, to show that
     * rendering sorts them by name as harmony does). */
    json_t *copy = json_deep_copy(list);
    json_object_set_new(json_array_get(json_object_get(json_array_get(copy, 0), "content"), 0),
                        "tool_namespaces", json_array());
    assert_int_equal(gptoss_harmony_conversation_from_json(copy, &ours, &err), GPTOSS_OK);
    gptoss_harmony_tools *tools = &ours.messages[0].content[0].system.tools;
    assert_int_equal(gptoss_harmony_tools_add_builtin(tools, "python", &err), GPTOSS_OK);
    assert_int_equal(gptoss_harmony_tools_add_builtin(tools, "browser", &err), GPTOSS_OK);
    assert_int_not_equal(gptoss_harmony_tools_add_builtin(tools, "shell", &err), GPTOSS_OK);
    assert_non_null(strstr(err.message, "shell"));

    gptoss_harmony_render_options o = gptoss_harmony_render_options_default();
    char *a, *b;
    size_t alen, blen;
    assert_int_equal(gptoss_harmony_render_text(&reference, &o, &a, &alen, &err), GPTOSS_OK);
    assert_int_equal(gptoss_harmony_render_text(&ours, &o, &b, &blen, &err), GPTOSS_OK);
    assert_true(alen > 1000);
    assert_int_equal(alen, blen);
    assert_memory_equal(a, b, alen);
    free(a);
    free(b);
    json_decref(copy);
    json_decref(list);
    gptoss_harmony_conversation_free(&reference);
    gptoss_harmony_conversation_free(&ours);
    json_decref(root);
}

static void check_schema(const char *schema_text, const char *want) {
    json_error_t jerr;
    json_t *schema = json_loads(schema_text, 0, &jerr);
    assert_non_null(schema);
    gptoss_chat_buf out = {0};
    assert_true(gptoss_harmony_schema_to_typescript(schema, "", &out));
    assert_true(gptoss_chat_buf_terminate(&out));
    assert_string_equal(out.data, want);
    gptoss_chat_buf_free(&out);
    json_decref(schema);
}

/* Shapes no reference case covers, against the rules written in spec 6.3. */
static void test_schema_shapes(void **state) {
    (void)state;
    check_schema("{\"type\":\"integer\"}", "number");
    check_schema("{\"type\":\"array\"}", "Array<any>");
    check_schema("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}", "boolean[]");
    check_schema("{\"type\":[\"integer\",\"null\"]}", "number | null");
    check_schema("{}", "any");
    check_schema("{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"number\",\"default\":0.5},"
                 "\"a\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\"}},"
                 "\"required\":[\"x\"]}},\"required\":[\"a\"]}",
                 "{\nb?: number, // default: 0.5\na: {\n    x: string,\n    },\n}");
    check_schema("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\",\"default\":2.0},"
                 "\"s\":{\"type\":\"string\",\"nullable\":true}}}",
                 "{\nn?: number, // default: 2.0\ns?: string | null,\n}");
}

static void test_render_errors(void **state) {
    (void)state;
    gptoss_harmony_conversation conversation;
    gptoss_harmony_conversation_init(&conversation);
    gptoss_error err = {0};
    gptoss_harmony_message *m;
    assert_int_equal(gptoss_harmony_conversation_push(&conversation, GPTOSS_ROLE_TOOL, &m, &err),
                     GPTOSS_OK);
    assert_int_equal(gptoss_harmony_message_add_text(m, "x", 1, &err), GPTOSS_OK);
    gptoss_harmony_render_options o = gptoss_harmony_render_options_default();
    char *text = NULL;
    size_t len;
    assert_int_equal(gptoss_harmony_render_text(&conversation, &o, &text, &len, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tool message needs"));
    gptoss_harmony_conversation_free(&conversation);

    json_error_t jerr;
    json_t *bad = json_loads("[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]", 0, &jerr);
    assert_int_equal(gptoss_harmony_conversation_from_json(bad, &conversation, &err),
                     GPTOSS_ERR_FORMAT);
    assert_non_null(strstr(err.message, "[0].content[0].type"));
    gptoss_harmony_conversation_free(&conversation);
    json_decref(bad);

    /* System content in a user message is refused, as harmony refuses it. */
    bad = json_loads(
        "[{\"role\":\"user\",\"content\":[{\"type\":\"system\",\"tool_namespaces\":[]}]}]", 0,
        &jerr);
    assert_int_equal(gptoss_harmony_conversation_from_json(bad, &conversation, &err), GPTOSS_OK);
    assert_int_equal(gptoss_harmony_render_text(&conversation, &o, &text, &len, &err),
                     GPTOSS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "system content"));
    gptoss_harmony_conversation_free(&conversation);
    json_decref(bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_json),
        cmocka_unit_test(test_extra_cases_json),
        cmocka_unit_test(test_builtin_tools_match_reference),
        cmocka_unit_test(test_schema_shapes),
        cmocka_unit_test(test_render_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
