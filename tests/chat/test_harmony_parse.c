/*
 * test_harmony_parse.c - the harmony output parser against harmony's reference parse cases.
 *
 * Every parse case of cases.json (4, plus the alternate input) and extra_cases.json (22,
 * plus alternates) is fed token by token to gptoss_harmony_parser with the case's initial
 * role, strictness and mode; the messages (every field), errors, in-progress content and
 * per-token deltas must be what harmony gives. Token ids come from the case itself or from
 * derived_tokens.json (computed with an independent BPE). Failing cases are listed by name.
 * Also: the token-id rendering of every render case equals derived_tokens.json.
 */
#include "chat_test_util.h"

#include "chat/chat_buf.h"
#include "chat/harmony_parser.h"

static gptoss_tokenizer *tokenizer;
static json_t *derived;

static int setup(void **state) {
    (void)state;
    tokenizer = ct_load_tokenizer();
    derived = ct_load_reference_json("derived_tokens.json");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    gptoss_tokenizer_free(tokenizer);
    json_decref(derived);
    return 0;
}

static bool same_opt(const char *got, const json_t *want) {
    if (!want || json_is_null(want)) return got == NULL;
    return got && strcmp(got, json_string_value(want)) == 0;
}

/* Compares one parsed message with a reference MESSAGE; prints what differs. */
static int compare_message(const char *name, size_t index, const gptoss_harmony_parsed_message *got,
                           const json_t *want) {
    const char *role = json_string_value(json_object_get(want, "role"));
    const json_t *text =
        json_object_get(json_array_get(json_object_get(want, "content"), 0), "text");
    int bad = 0;
    if (strcmp(gptoss_harmony_role_name(got->role), role) != 0) bad = 1;
    if (!same_opt(got->name, json_object_get(want, "name"))) bad = 1;
    if (!same_opt(got->recipient, json_object_get(want, "recipient"))) bad = 1;
    if (!same_opt(got->channel, json_object_get(want, "channel"))) bad = 1;
    if (!same_opt(got->content_type, json_object_get(want, "content_type"))) bad = 1;
    if (got->content_len != json_string_length(text) ||
        memcmp(got->content, json_string_value(text), got->content_len) != 0)
        bad = 1;
    if (bad)
        fprintf(stderr,
                "  %s: message %zu: got role=%s name=%s recipient=%s channel=%s content_type=%s "
                "content=\"%s\"; want role=%s name=%s recipient=%s channel=%s content_type=%s "
                "content=\"%s\"\n",
                name, index, gptoss_harmony_role_name(got->role), got->name ? got->name : "null",
                got->recipient ? got->recipient : "null", got->channel ? got->channel : "null",
                got->content_type ? got->content_type : "null", got->content, role,
                json_string_value(json_object_get(want, "name")) ?: "null",
                json_string_value(json_object_get(want, "recipient")) ?: "null",
                json_string_value(json_object_get(want, "channel")) ?: "null",
                json_string_value(json_object_get(want, "content_type")) ?: "null",
                json_string_value(text));
    return bad;
}

static int check_text(const char *name, const char *what, const char *got, size_t got_len,
                      const json_t *want) {
    if (json_is_null(want) || !want) {
        if (got == NULL) return 0;
        fprintf(stderr, "  %s: %s: got \"%.*s\", want null\n", name, what, (int)got_len, got);
        return 1;
    }
    if (got && got_len == json_string_length(want) &&
        memcmp(got, json_string_value(want), got_len) == 0)
        return 0;
    fprintf(stderr, "  %s: %s: got \"%.*s\", want \"%s\"\n", name, what, (int)got_len,
            got ? got : "(null)", json_string_value(want));
    return 1;
}

/* Runs one parse case on ids; returns the number of failed checks. */
static int run_case(const char *name, const json_t *c, const int32_t *ids, size_t n) {
    const char *role = json_string_value(json_object_get(c, "initial_role"));
    const char *mode = json_string_value(json_object_get(c, "mode"));
    gptoss_harmony_parser_options options = {0};
    options.strict = !json_is_false(json_object_get(c, "strict"));
    if (role) {
        options.has_initial_role = true;
        assert_true(gptoss_harmony_role_parse(role, strlen(role), &options.initial_role));
    }
    gptoss_harmony_parser *parser;
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_parser_create(tokenizer, &options, &parser, &err), GPTOSS_OK);

    gptoss_chat_buf joined = {0};
    const json_t *steps = json_object_get(c, "expected_steps");
    int failed = 0;
    gptoss_status st = GPTOSS_OK;
    for (size_t i = 0; i < n && !st; i++) {
        st = gptoss_harmony_parser_push(parser, ids[i], &err);
        size_t len;
        const char *delta = gptoss_harmony_parser_last_delta(parser, &len);
        if (delta) gptoss_chat_buf_append(&joined, delta, len);
        /* expected_steps: only stream_waits_for_multi_token_character has them; they follow
         * the 3 tokens of "<|start|>assistant<|message|>". */
        if (steps && i >= 3 && i - 3 < json_array_size(steps)) {
            const json_t *step = json_array_get(steps, i - 3);
            char what[64];
            snprintf(what, sizeof what, "step %zu last delta", i - 3);
            failed +=
                check_text(name, what, delta, len, json_object_get(step, "last_content_delta"));
            const char *cur = gptoss_harmony_parser_current_content(parser, &len);
            snprintf(what, sizeof what, "step %zu current content", i - 3);
            failed += check_text(name, what, cur, len, json_object_get(step, "current_content"));
        }
    }
    if (!st && (strcmp(mode, "complete") == 0 || strcmp(mode, "stream_then_eos") == 0))
        st = gptoss_harmony_parser_finish(parser, &err);

    const json_t *want_error = json_object_get(c, "expected_error_contains");
    if (json_object_get(c, "expected_error_contains")) {
        if (!st) {
            fprintf(stderr, "  %s: expected an error, parsed fine\n", name);
            failed++;
        } else if (json_is_string(want_error) &&
                   !strstr(err.message, json_string_value(want_error))) {
            fprintf(stderr, "  %s: error \"%s\" lacks \"%s\"\n", name, err.message,
                    json_string_value(want_error));
            failed++;
        }
    } else if (st) {
        fprintf(stderr, "  %s: unexpected error: %s\n", name, err.message);
        failed++;
    }

    const json_t *want_messages = json_object_get(c, "expected_messages");
    if (want_messages) {
        size_t got_n = gptoss_harmony_parser_n_messages(parser);
        if (got_n != json_array_size(want_messages)) {
            fprintf(stderr, "  %s: %zu messages, want %zu\n", name, got_n,
                    json_array_size(want_messages));
            failed++;
        } else {
            for (size_t i = 0; i < got_n; i++)
                failed += compare_message(name, i, gptoss_harmony_parser_message(parser, i),
                                          json_array_get(want_messages, i));
        }
    }
    const json_t *count = json_object_get(c, "expected_message_count");
    if (count && gptoss_harmony_parser_n_messages(parser) != (size_t)json_integer_value(count)) {
        fprintf(stderr, "  %s: %zu messages, want %lld\n", name,
                gptoss_harmony_parser_n_messages(parser), json_integer_value(count));
        failed++;
    }
    const char *key;
    const json_t *want;
    json_object_foreach(json_object_get(c, "expected_messages_by_index"), key, want) {
        const gptoss_harmony_parsed_message *m =
            gptoss_harmony_parser_message(parser, (size_t)atoi(key));
        if (!m) {
            fprintf(stderr, "  %s: no message %s\n", name, key);
            failed++;
        } else {
            failed += compare_message(name, (size_t)atoi(key), m, want);
        }
    }
    gptoss_chat_buf_terminate(&joined);
    const json_t *joined_want = json_object_get(c, "expected_joined_content_deltas");
    if (joined_want)
        failed += check_text(name, "joined deltas", joined.data, joined.len, joined_want);
    const json_t *after = json_object_get(c, "expected_after_input");
    if (after) {
        size_t len;
        const char *cur = gptoss_harmony_parser_current_content(parser, &len);
        failed += check_text(name, "current content", cur, len,
                             json_object_get(after, "current_content"));
        failed += check_text(name, "joined deltas", joined.data, joined.len,
                             json_object_get(after, "joined_content_deltas"));
    }
    const json_t *then = json_object_get(c, "then");
    if (then) {
        gptoss_tokens more = {0};
        const char *text =
            json_string_value(json_object_get(then, "feed_text_ordinary_first_token"));
        assert_int_equal(gptoss_tokenizer_encode(tokenizer, text, strlen(text), false, &more, &err),
                         GPTOSS_OK);
        assert_int_equal(gptoss_harmony_parser_push(parser, more.ids[0], &err), GPTOSS_OK);
        size_t len;
        const char *delta = gptoss_harmony_parser_last_delta(parser, &len);
        failed += check_text(name, "then: last delta", delta, len,
                             json_object_get(then, "last_content_delta"));
        const char *cur = gptoss_harmony_parser_current_content(parser, &len);
        failed += check_text(name, "then: current content", cur, len,
                             json_object_get(then, "current_content"));
        gptoss_tokens_free(&more);
    }
    const json_t *after_eos = json_object_get(c, "expected_after_eos");
    if (after_eos) {
        size_t len;
        const char *delta = gptoss_harmony_parser_last_delta(parser, &len);
        failed += check_text(name, "after eos: last delta", delta, len,
                             json_object_get(after_eos, "last_content_delta"));
        const char *cur = gptoss_harmony_parser_current_content(parser, &len);
        failed += check_text(name, "after eos: current content", cur, len,
                             json_object_get(after_eos, "current_content"));
    }
    gptoss_chat_buf_free(&joined);
    gptoss_harmony_parser_free(parser);
    return failed ? 1 : 0;
}

static void test_cases_json_parse(void **state) {
    (void)state;
    json_t *root = ct_load_reference_json("cases.json");
    const json_t *inputs = json_object_get(derived, "parse_input_tokens");
    size_t i;
    json_t *c;
    int n_run = 0, n_failed = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "kind")), "parse") != 0) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *p = json_deep_copy(json_object_get(c, "parse"));
        json_object_set(p, "expected_messages", json_object_get(c, "expected_messages"));
        const json_t *list = json_object_get(p, "input_tokens");
        if (!list) list = json_object_get(inputs, name);
        assert_non_null(list);
        size_t n;
        int32_t *ids = ct_ids(list, &n);
        n_run++;
        n_failed += run_case(name, p, ids, n);
        free(ids);
        size_t j;
        const json_t *alt;
        json_array_foreach(json_object_get(c, "alternate_inputs"), j, alt) {
            char label[256];
            snprintf(label, sizeof label, "%s (alternate %zu)", name, j);
            ids = ct_ids(json_object_get(alt, "input_tokens"), &n);
            n_run++;
            n_failed += run_case(label, p, ids, n);
            free(ids);
        }
        json_decref(p);
    }
    fprintf(stderr, "cases.json: %d parse runs, %d failed\n", n_run, n_failed);
    assert_int_equal(n_run, 5);
    assert_int_equal(n_failed, 0);
    json_decref(root);
}

static void test_extra_cases_parse(void **state) {
    (void)state;
    json_t *root = ct_load_reference_json("extra_cases.json");
    const json_t *inputs = json_object_get(derived, "parse_input_tokens");
    size_t i;
    json_t *c;
    int n_run = 0, n_failed = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        if (strcmp(json_string_value(json_object_get(c, "kind")), "parse") != 0) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        char key[256];
        snprintf(key, sizeof key, "extra:%s", name);
        size_t n;
        int32_t *ids = ct_ids(json_object_get(inputs, key), &n);
        if (n == 0) {
            fprintf(stderr, "  %s: no input tokens in derived_tokens.json\n", name);
            n_failed++;
            continue;
        }
        n_run++;
        n_failed += run_case(name, c, ids, n);
        free(ids);
        for (size_t j = 0; j < json_array_size(json_object_get(c, "alternate_inputs")); j++) {
            snprintf(key, sizeof key, "extra:%s:alternate_inputs[%zu]", name, j);
            ids = ct_ids(json_object_get(inputs, key), &n);
            char label[300];
            snprintf(label, sizeof label, "%s (alternate %zu)", name, j);
            n_run++;
            n_failed += n ? run_case(label, c, ids, n) : 1;
            free(ids);
        }
    }
    fprintf(stderr, "extra_cases.json: %d parse runs, %d failed\n", n_run, n_failed);
    assert_true(n_run >= 22);
    assert_int_equal(n_failed, 0);
    json_decref(root);
}

/* Token ids of every render case equal derived_tokens.json's render_expected_tokens. */
static void test_render_tokens(void **state) {
    (void)state;
    json_t *root = ct_load_reference_json("cases.json");
    const json_t *expected = json_object_get(derived, "render_expected_tokens");
    size_t i;
    json_t *c;
    int n_run = 0, n_failed = 0;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *kind = json_string_value(json_object_get(c, "kind"));
        if (strcmp(kind, "parse") == 0) continue;
        const json_t *options = json_object_get(c, "options");
        gptoss_harmony_render_options o = gptoss_harmony_render_options_default();
        o.mode = strcmp(kind, "render") == 0 ? GPTOSS_RENDER_PLAIN : GPTOSS_RENDER_COMPLETION;
        o.auto_drop_analysis = json_is_true(json_object_get(options, "auto_drop_analysis"));
        gptoss_harmony_conversation conversation;
        gptoss_harmony_conversation_init(&conversation);
        gptoss_error err = {0};
        assert_int_equal(gptoss_harmony_conversation_from_json(json_object_get(c, "conversation"),
                                                               &conversation, &err),
                         GPTOSS_OK);
        gptoss_tokens got = {0};
        assert_int_equal(gptoss_harmony_render_tokens(&conversation, &o, tokenizer, &got, &err),
                         GPTOSS_OK);
        size_t n;
        int32_t *want = ct_ids(json_object_get(expected, name), &n);
        n_run++;
        size_t k = 0;
        while (k < n && k < got.n && got.ids[k] == want[k])
            k++;
        if (n == 0 || got.n != n || k != n) {
            fprintf(stderr, "  %s: token ids differ at %zu (got %zu ids, want %zu)\n", name, k,
                    got.n, n);
            n_failed++;
        }
        free(want);
        gptoss_tokens_free(&got);
        gptoss_harmony_conversation_free(&conversation);
    }
    fprintf(stderr, "render token checks: %d, %d failed\n", n_run, n_failed);
    assert_int_equal(n_run, 19);
    assert_int_equal(n_failed, 0);
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_json_parse),
        cmocka_unit_test(test_extra_cases_parse),
        cmocka_unit_test(test_render_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
