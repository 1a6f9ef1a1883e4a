/*
 * test_harmony_events.c - the parser's event stream (the server's view of generation).
 *
 *   - generated streams: a conversation's assistant part is rendered to ids by the renderer,
 *     fed token by token, and the events must rebuild each message's text, tool name and end
 *     reason (the reference is the conversation we rendered);
 *   - truncation at every token position: no error, deltas are a prefix of the full texts,
 *     exactly one TURN_END;
 *   - random garbage streams (fixed seed): never an error in non-strict mode, and every
 *     ordinary token's text shows up in some event or parsed header field.
 */
#include "chat_test_util.h"

#include "chat/chat_buf.h"
#include "chat/harmony_parser.h"

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

static const char *const reasoning_text = "User wants Tokyo time: naïve? no — call get_time 🕑.";
static const char *const preamble_text = "Checking the clock…";
static const char *const args_text = "{\"timezone\":\"Asia/Tokyo\"}";
static const char *const answer_text = "It is 14:05 in Tokyo. 東京は午後2時5分です。";

/* Assistant output after "<|start|>assistant": analysis, preamble, tool call (model's own
 * header order: channel first, then recipient, then <|constrain|>json). */
static void generated_ids(gptoss_tokens *ids, bool with_final) {
    char text[1024];
    if (with_final)
        snprintf(text, sizeof text,
                 "<|channel|>analysis<|message|>%s<|end|><|start|>assistant<|channel|>final<|"
                 "message|>%s<|return|>",
                 reasoning_text, answer_text);
    else
        snprintf(
            text, sizeof text,
            "<|channel|>analysis<|message|>%s<|end|><|start|>assistant<|channel|>commentary<|"
            "message|>%s"
            "<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
            "<|message|>%s<|call|>",
            reasoning_text, preamble_text, args_text);
    gptoss_error err = {0};
    /* Specials recognised for the markup; the texts contain none. */
    assert_int_equal(gptoss_tokenizer_encode(tokenizer, text, strlen(text), true, ids, &err),
                     GPTOSS_OK);
}

typedef struct collected {
    gptoss_chat_buf by_kind[7];   /* concatenated delta text per event kind */
    gptoss_chat_buf tool_names;   /* TOOL_CALL_START texts, ';'-separated */
    gptoss_chat_buf header_words; /* channels/recipients/content types seen */
    gptoss_chat_end_reason message_ends[16];
    size_t n_message_ends;
    int n_turn_ends;
    gptoss_chat_end_reason turn_end;
} collected;

static void collect(gptoss_harmony_parser *p, collected *c) {
    size_t n;
    const gptoss_chat_event *ev = gptoss_harmony_parser_events(p, &n);
    for (size_t i = 0; i < n; i++) {
        switch (ev[i].kind) {
        case GPTOSS_CHAT_EVENT_TOOL_CALL_START:
            gptoss_chat_buf_append(&c->tool_names, ev[i].text, ev[i].len);
            gptoss_chat_buf_puts(&c->tool_names, ";");
            break;
        case GPTOSS_CHAT_EVENT_MESSAGE_END:
            if (c->n_message_ends < 16) c->message_ends[c->n_message_ends++] = ev[i].reason;
            break;
        case GPTOSS_CHAT_EVENT_TURN_END:
            c->n_turn_ends++;
            c->turn_end = ev[i].reason;
            break;
        default:
            assert_true(ev[i].len > 0);
            gptoss_chat_buf_append(&c->by_kind[ev[i].kind], ev[i].text, ev[i].len);
        }
        const char *fields[3] = {ev[i].channel, ev[i].recipient, ev[i].content_type};
        for (int f = 0; f < 3; f++)
            if (fields[f]) {
                gptoss_chat_buf_puts(&c->header_words, fields[f]);
                gptoss_chat_buf_puts(&c->header_words, " ");
            }
    }
    for (int k = 0; k < 7; k++)
        gptoss_chat_buf_terminate(&c->by_kind[k]);
    gptoss_chat_buf_terminate(&c->tool_names);
    gptoss_chat_buf_terminate(&c->header_words);
}

static void collected_free(collected *c) {
    for (int k = 0; k < 7; k++)
        gptoss_chat_buf_free(&c->by_kind[k]);
    gptoss_chat_buf_free(&c->tool_names);
    gptoss_chat_buf_free(&c->header_words);
}

static gptoss_harmony_parser *new_parser(bool strict) {
    gptoss_harmony_parser_options o = {
        .strict = strict, .has_initial_role = true, .initial_role = GPTOSS_ROLE_ASSISTANT};
    gptoss_harmony_parser *p;
    gptoss_error err = {0};
    assert_int_equal(gptoss_harmony_parser_create(tokenizer, &o, &p, &err), GPTOSS_OK);
    return p;
}

static void test_generated_tool_call_stream(void **state) {
    (void)state;
    for (int strict = 0; strict <= 1; strict++) {
        gptoss_tokens ids = {0};
        generated_ids(&ids, false);
        gptoss_harmony_parser *p = new_parser(strict);
        collected c = {0};
        gptoss_error err = {0};
        for (size_t i = 0; i < ids.n; i++) {
            assert_int_equal(gptoss_harmony_parser_push(p, ids.ids[i], &err), GPTOSS_OK);
            collect(p, &c);
        }
        assert_int_equal(gptoss_harmony_parser_finish(p, &err), GPTOSS_OK);
        collect(p, &c);
        assert_string_equal(c.by_kind[GPTOSS_CHAT_EVENT_REASONING_DELTA].data, reasoning_text);
        assert_string_equal(c.by_kind[GPTOSS_CHAT_EVENT_COMMENTARY_DELTA].data, preamble_text);
        assert_string_equal(c.by_kind[GPTOSS_CHAT_EVENT_TOOL_CALL_ARGS_DELTA].data, args_text);
        assert_null(c.by_kind[GPTOSS_CHAT_EVENT_ANSWER_DELTA].data &&
                            *c.by_kind[GPTOSS_CHAT_EVENT_ANSWER_DELTA].data
                        ? "answer text"
                        : NULL);
        assert_string_equal(c.tool_names.data, "functions.get_time;");
        assert_int_equal(c.n_message_ends, 3);
        assert_int_equal(c.message_ends[0], GPTOSS_CHAT_END_END);
        assert_int_equal(c.message_ends[2], GPTOSS_CHAT_END_CALL);
        assert_int_equal(c.n_turn_ends, 1); /* finish does not repeat the <|call|> turn end */
        assert_int_equal(c.turn_end, GPTOSS_CHAT_END_CALL);
        const gptoss_harmony_parsed_message *m = gptoss_harmony_parser_message(p, 2);
        assert_string_equal(m->content_type, "<|constrain|>json");
        assert_string_equal(m->recipient, "functions.get_time");
        collected_free(&c);
        gptoss_harmony_parser_free(p);
        gptoss_tokens_free(&ids);
    }
}

/* Every prefix of a final-answer stream, then finish. */
static void test_truncation_everywhere(void **state) {
    (void)state;
    gptoss_tokens ids = {0};
    generated_ids(&ids, true);
    for (size_t cut = 0; cut <= ids.n; cut++) {
        gptoss_harmony_parser *p = new_parser(false);
        collected c = {0};
        gptoss_error err = {0};
        for (size_t i = 0; i < cut; i++) {
            assert_int_equal(gptoss_harmony_parser_push(p, ids.ids[i], &err), GPTOSS_OK);
            collect(p, &c);
        }
        assert_int_equal(gptoss_harmony_parser_finish(p, &err), GPTOSS_OK);
        collect(p, &c);
        assert_int_equal(c.n_turn_ends, 1);
        gptoss_chat_end_reason want = GPTOSS_CHAT_END_LENGTH;
        if (cut == ids.n)
            want = GPTOSS_CHAT_END_RETURN;
        else if (cut > 0 && ids.ids[cut - 1] == GPTOSS_TOKEN_END)
            want = GPTOSS_CHAT_END_END;
        assert_int_equal(c.turn_end, want);
        /* Reasoning and answer are prefixes of the full texts, except that a character cut in
         * half ends as U+FFFD. */
        const char *full[2] = {reasoning_text, answer_text};
        int kinds[2] = {GPTOSS_CHAT_EVENT_REASONING_DELTA, GPTOSS_CHAT_EVENT_ANSWER_DELTA};
        for (int k = 0; k < 2; k++) {
            const gptoss_chat_buf *got = &c.by_kind[kinds[k]];
            size_t n = got->len;
            if (n >= 3 && memcmp(got->data + n - 3, "\xEF\xBF\xBD", 3) == 0 &&
                !strstr(full[k], "\xEF\xBF\xBD"))
                n -= 3;
            if (n > strlen(full[k]) || (n && memcmp(got->data, full[k], n) != 0))
                fail_msg("cut %zu: kind %d text \"%s\" is not a prefix of \"%s\"", cut, kinds[k],
                         got->data, full[k]);
        }
        if (cut == ids.n)
            assert_string_equal(c.by_kind[GPTOSS_CHAT_EVENT_ANSWER_DELTA].data, answer_text);
        collected_free(&c);
        gptoss_harmony_parser_free(p);
    }
    gptoss_tokens_free(&ids);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_random(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Random streams of markup tokens and short ASCII words: non-strict never fails, and each
 * word shows up in the event text or in a header field of some message. */
static void test_garbage_streams(void **state) {
    (void)state;
    static const int32_t specials[] = {GPTOSS_TOKEN_START,
                                       GPTOSS_TOKEN_MESSAGE,
                                       GPTOSS_TOKEN_CHANNEL,
                                       GPTOSS_TOKEN_END,
                                       GPTOSS_TOKEN_RETURN,
                                       GPTOSS_TOKEN_CALL,
                                       GPTOSS_TOKEN_CONSTRAIN,
                                       GPTOSS_TOKEN_ENDOFTEXT,
                                       200014,
                                       -1};
    static const char *const words[] = {
        "alpha", "final",     "analysis", "commentary", "to=functions.f",
        "json",  "assistant", "user",     "tool",       "zeta",
        " ",     "\n",        "é",        "😀"};
    for (int stream = 0; stream < 300; stream++) {
        bool has_role = stream % 2 == 0;
        gptoss_harmony_parser_options o = {
            .strict = false, .has_initial_role = has_role, .initial_role = GPTOSS_ROLE_ASSISTANT};
        gptoss_harmony_parser *p;
        gptoss_error err = {0};
        assert_int_equal(gptoss_harmony_parser_create(tokenizer, &o, &p, &err), GPTOSS_OK);
        collected c = {0};
        size_t n = 1 + next_random() % 40;
        const char *fed[64];
        size_t n_fed = 0;
        for (size_t i = 0; i < n; i++) {
            if (next_random() % 3 == 0) {
                assert_int_equal(gptoss_harmony_parser_push(p, specials[next_random() % 10], &err),
                                 GPTOSS_OK);
            } else {
                const char *w = words[next_random() % 14];
                gptoss_tokens ids = {0};
                assert_int_equal(
                    gptoss_tokenizer_encode(tokenizer, w, strlen(w), false, &ids, &err), GPTOSS_OK);
                for (size_t k = 0; k < ids.n; k++) {
                    assert_int_equal(gptoss_harmony_parser_push(p, ids.ids[k], &err), GPTOSS_OK);
                    collect(p, &c);
                }
                gptoss_tokens_free(&ids);
                if (strcmp(w, " ") != 0 && strcmp(w, "\n") != 0) fed[n_fed++] = w;
                continue;
            }
            collect(p, &c);
        }
        assert_int_equal(gptoss_harmony_parser_finish(p, &err), GPTOSS_OK);
        collect(p, &c);
        assert_int_equal(c.n_turn_ends >= 1, true);
        gptoss_chat_buf all = {0};
        for (int k = 0; k < 7; k++)
            gptoss_chat_buf_append(&all, c.by_kind[k].data ? c.by_kind[k].data : "",
                                   c.by_kind[k].len);
        gptoss_chat_buf_puts(&all, c.tool_names.data ? c.tool_names.data : "");
        gptoss_chat_buf_puts(&all, c.header_words.data ? c.header_words.data : "");
        for (size_t i = 0; i < gptoss_harmony_parser_n_messages(p); i++) {
            const gptoss_harmony_parsed_message *m = gptoss_harmony_parser_message(p, i);
            if (m->name) gptoss_chat_buf_puts(&all, m->name);
            gptoss_chat_buf_puts(&all, gptoss_harmony_role_name(m->role));
            if (m->recipient) gptoss_chat_buf_puts(&all, m->recipient);
        }
        gptoss_chat_buf_terminate(&all);
        for (size_t i = 0; i < n_fed; i++) {
            const char *w = fed[i];
            /* A role word, a recipient or a content type may be consumed by a header. */
            bool structural = !strcmp(w, "assistant") || !strcmp(w, "user") || !strcmp(w, "tool");
            if (!structural && !strstr(all.data, w) &&
                !strstr(all.data, w + (strncmp(w, "to=", 3) ? 0 : 3)))
                fail_msg("stream %d: word \"%s\" vanished; output: %s", stream, w, all.data);
        }
        gptoss_chat_buf_free(&all);
        collected_free(&c);
        gptoss_harmony_parser_free(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generated_tool_call_stream),
        cmocka_unit_test(test_truncation_everywhere),
        cmocka_unit_test(test_garbage_streams),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
