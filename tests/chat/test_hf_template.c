/*
 * test_hf_template.c - our OpenAI -> harmony prompt against the Hugging Face chat template.
 *
 * Renders every conversation of hf_template_conversations.json with our mapping and renderer
 * (date fixed at 2025-06-28, or none where a conversation says "our_date": null), writes the
 * renderings to a temporary JSON file, and hands them to hf_template_compare.mjs, which
 * renders the same conversations with the official template through @huggingface/jinja and
 * checks that every difference, message by message, is one listed and explained in
 * hf_template_differences.json (and that every listed difference still occurs).
 */
#include "chat_test_util.h"

#include "chat/openai_chat.h"

#include <unistd.h>

static json_t *render_ours(const json_t *conversation) {
    const json_t *request = json_object_get(conversation, "request");
    const json_t *date = json_object_get(conversation, "our_date");
    gptoss_openai_chat_options options = {0};
    options.current_date = !date ? "2025-06-28" : json_string_value(date); /* null -> no date */
    gptoss_harmony_conversation harmony;
    gptoss_harmony_conversation_init(&harmony);
    gptoss_error err = {0};
    char *text = NULL;
    size_t len = 0;
    gptoss_harmony_render_options render = gptoss_harmony_render_options_default();
    json_t *out;
    if (gptoss_openai_chat_to_harmony(request, &options, &harmony, &err) == GPTOSS_OK &&
        gptoss_harmony_render_text(&harmony, &render, &text, &len, &err) == GPTOSS_OK)
        out = json_pack("{s:s%}", "text", text, len);
    else
        out = json_pack("{s:s}", "error", err.message);
    free(text);
    gptoss_harmony_conversation_free(&harmony);
    assert_non_null(out);
    return out;
}

static void test_every_difference_is_explained(void **state) {
    (void)state;
    const char *source = ts_env("GPTOSS_SOURCE_DIR");
    ts_env("GPTOSS_SHARED_DIR");
    char *conversations_path = ts_path(source, "tests/chat/hf_template_conversations.json");
    json_error_t jerr;
    json_t *conversations = json_load_file(conversations_path, 0, &jerr);
    if (!conversations) fail_msg("%s: %s (line %d)", conversations_path, jerr.text, jerr.line);
    assert_true(json_array_size(conversations) >= 40);

    json_t *ours = json_object();
    size_t i;
    json_t *conversation;
    json_array_foreach(conversations, i, conversation) {
        const char *name = json_string_value(json_object_get(conversation, "name"));
        assert_non_null(name);
        json_object_set_new(ours, name, render_ours(conversation));
    }
    char *dir = ts_mkdtemp();
    char *ours_path = ts_path(dir, "ours.json");
    assert_int_equal(json_dump_file(ours, ours_path, JSON_INDENT(1)), 0);

    char *output = NULL;
    /* GPTOSS_HF_SHOW=1 prints the kinds found for every conversation. */
    const char *show = getenv("GPTOSS_HF_SHOW");
    int rc =
        ts_run(&output, "cd '%s' && node tests/chat/hf_template_compare.mjs '%s' '%s' '%s'%s",
               source, conversations_path, ours_path, "tests/chat/hf_template_differences.json",
               show && *show == '1' ? " --show" : "");
    fprintf(stderr, "%s", output ? output : "");
    assert_int_equal(rc, 0);

    free(output);
    if (!(show && *show == '1')) ts_rmtree(dir); /* kept for inspection with GPTOSS_HF_SHOW=1 */
    free(ours_path), free(dir), free(conversations_path);
    json_decref(ours);
    json_decref(conversations);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_difference_is_explained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
