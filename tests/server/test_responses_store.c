/*
 * test_responses_store.c - the two pieces of /v1/responses that need no engine:
 * responses_input.c (input items -> normalized items -> Chat Completions messages, and the
 * field each bad item is reported under) and response_store.c (byte budget, least recently
 * used eviction, delete, the background job limit, cancel of a foreground response, the event
 * logs of background responses and their readers).
 *
 * References: the expected messages are written out by hand from the grouping rule (one
 * assistant message per turn: reasoning_content, content, tool_calls) and compared with
 * json_equal; record sizes are computed from the texts put in.
 */
#include "test_support.h"

#include "server/response_store.h"
#include "server/responses_input.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *parse(const char *text) {
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
    if (!j) fail_msg("bad JSON in the test: %s: %s", err.text, text);
    return j;
}

/* Reads `input` (after `prior` items) and compares the messages with `expected`. */
static void expect_messages(const char *prior_text, const char *input_text,
                            const char *instructions, const char *expected_text) {
    json_t *prior = prior_text ? parse(prior_text) : NULL;
    json_t *input = parse(input_text);
    json_t *items = json_array();
    if (prior) json_array_extend(items, prior);
    field_error e = {0};
    if (!responses_input_read(input, prior, items, &e)) fail_msg("rejected: %s", e.message);
    json_t *messages = responses_items_to_messages(instructions, items);
    json_t *expected = parse(expected_text);
    if (!json_equal(messages, expected)) {
        char *got = json_dumps(messages, JSON_COMPACT);
        fail_msg("messages\n got %s\nwant %s", got, expected_text);
    }
    json_decref(expected);
    json_decref(messages);
    json_decref(items);
    json_decref(input);
    json_decref(prior);
}

static void expect_rejected(const char *prior_text, const char *input_text, const char *param) {
    json_t *prior = prior_text ? parse(prior_text) : NULL;
    json_t *input = parse(input_text);
    json_t *items = json_array();
    field_error e = {0};
    bool ok = responses_input_read(input, prior, items, &e);
    if (ok) fail_msg("accepted %s", input_text);
    if (strcmp(e.param, param) != 0)
        fail_msg("param '%s' (%s), want '%s'", e.param, e.message, param);
    assert_true(strncmp(e.message, param, strlen(param)) == 0); /* the message names it first */
    json_decref(items);
    json_decref(input);
    json_decref(prior);
}

static void test_input_string_and_messages(void **state) {
    (void)state;
    expect_messages(NULL, "\"hi\"", NULL, "[{\"role\":\"user\",\"content\":\"hi\"}]");
    expect_messages(
        NULL,
        "[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
        "\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]}]",
        "Be brief.",
        "[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
        "{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"ab\"}]");
}

/* reasoning, a preamble and two calls of one turn: one assistant message; the outputs
 * follow as tool messages; the answer after them is a new turn with its own reasoning */
static void test_turn_grouping(void **state) {
    (void)state;
    expect_messages(
        NULL,
        "[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"think\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
        "\"text\":\"Checking.\",\"annotations\":[]}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"[1]\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"one\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":"
        "\"input_text\",\"text\":\"two\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\","
        "\"text\":\"done\"}]},"
        "{\"role\":\"assistant\",\"content\":\"Answer.\"}]",
        NULL,
        "[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"reasoning_content\":\"think\",\"content\":\"Checking.\","
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\","
        "\"arguments\":\"[1]\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"one\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"two\"},"
        "{\"role\":\"assistant\",\"reasoning_content\":\"done\",\"content\":\"Answer.\"}]");
    /* a reasoning item with no content (only a summary) renders nothing */
    expect_messages(NULL,
                    "[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\",\"summary\":"
                    "[{\"type\":\"summary_text\",\"text\":\"s\"}]},{\"role\":\"assistant\","
                    "\"content\":\"a\"}]",
                    NULL,
                    "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
                    "\"a\"}]");
}

/* call ids and item references are answered by the previous chain too */
static void test_prior_chain(void **state) {
    (void)state;
    const char *prior = "[{\"type\":\"message\",\"role\":\"user\",\"content\":\"q\"},"
                        "{\"type\":\"function_call\",\"id\":\"fc_9\",\"call_id\":\"c9\","
                        "\"name\":\"f\",\"arguments\":\"{}\"}]";
    expect_messages(
        prior, "[{\"type\":\"function_call_output\",\"call_id\":\"c9\",\"output\":\"r\"}]", NULL,
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":"
        "[{\"id\":\"c9\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c9\","
        "\"content\":\"r\"}]");
    expect_messages(prior, "[{\"type\":\"item_reference\",\"id\":\"fc_9\"}]", NULL,
                    "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":"
                    "[{\"id\":\"c9\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                    "\"arguments\":\"{}\"}},{\"id\":\"c9\",\"type\":\"function\",\"function\":{"
                    "\"name\":\"f\",\"arguments\":\"{}\"}}]}]");
    expect_rejected(prior, "[{\"type\":\"item_reference\",\"id\":\"fc_8\"}]", "input[0].id");
}

static void test_bad_items(void **state) {
    (void)state;
    expect_rejected(NULL, "5", "input");
    expect_rejected(NULL, "[\"x\"]", "input[0]");
    expect_rejected(NULL, "[{\"role\":\"user\",\"content\":\"a\"},{\"type\":\"web_search_call\"}]",
                    "input[1].type");
    expect_rejected(NULL,
                    "[{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x\"}]",
                    "input[0].call_id");
    /* an output before its call does not count: the call must come earlier */
    expect_rejected(NULL,
                    "[{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x\"},"
                    "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":"
                    "\"{}\"}]",
                    "input[0].call_id");
    expect_rejected(NULL, "[{\"role\":\"tool\",\"content\":\"a\"}]", "input[0].role");
    expect_rejected(NULL, "[{\"role\":\"user\",\"content\":7}]", "input[0].content");
    expect_rejected(
        NULL, "[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\",\"file_id\":\"f\"}]}]",
        "input[0].content[0].type");
    expect_rejected(
        NULL, "[{\"role\":\"assistant\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"}]}]",
        "input[0].content[0].type");
    expect_rejected(NULL,
                    "[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"a b\",\"arguments\":"
                    "\"{}\"}]",
                    "input[0].name");
    expect_rejected(
        NULL, "[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}}]",
        "input[0].arguments");
    expect_rejected(NULL, "[{\"type\":\"reasoning\",\"content\":\"x\"}]", "input[0].content");
}

/* ---- the store ------------------------------------------------------------------------------- */

/* What a record of these texts counts (mirrors record_bytes: the texts, their NULs, and the
 * record itself, which the test measures from a one-record store instead of assuming). */
static size_t measured_overhead(void) {
    response_store *s = response_store_create(1 << 20, 4);
    /* the smallest budget that still keeps {"a"} */
    size_t lo = 0, hi = 1 << 20;
    response_store_free(s);
    while (lo + 1 < hi) {
        size_t mid = (lo + hi) / 2;
        s = response_store_create(mid, 4);
        bool kept = response_store_put(s, "a", "b", "c");
        response_store_free(s);
        if (kept)
            hi = mid;
        else
            lo = mid;
    }
    return hi - 3; /* minus the three one-byte texts */
}

static void test_store_lru(void **state) {
    (void)state;
    size_t overhead = measured_overhead();
    char big[1001];
    memset(big, 'x', 1000);
    big[1000] = '\0';
    size_t one = overhead + 2 + 1000 + 0; /* id "rN" (2 bytes), response 1000, no items */
    response_store *s = response_store_create(2 * one + one / 2, 4); /* room for two */
    assert_true(response_store_put(s, "r1", big, NULL));
    assert_true(response_store_put(s, "r2", big, NULL));
    char *text = NULL, *items = NULL;
    bool running = true;
    assert_true(response_store_get(s, "r1", &text, &items, &running)); /* r1 now most recent */
    assert_string_equal(text, big);
    assert_null(items);
    assert_false(running);
    free(text);
    assert_true(response_store_put(s, "r3", big, NULL)); /* evicts r2, the least recent */
    assert_false(response_store_get(s, "r2", NULL, NULL, NULL));
    assert_true(response_store_get(s, "r1", NULL, NULL, NULL));
    assert_true(response_store_get(s, "r3", NULL, NULL, NULL));
    /* replacing a record keeps one copy */
    assert_true(response_store_put(s, "r3", "{}", "[]"));
    assert_true(response_store_get(s, "r3", &text, &items, NULL));
    assert_string_equal(text, "{}");
    assert_string_equal(items, "[]");
    free(text);
    free(items);
    /* a record larger than the whole budget is refused, and the others stay */
    char *huge = malloc(4 * one);
    memset(huge, 'y', 4 * one - 1);
    huge[4 * one - 1] = '\0';
    assert_false(response_store_put(s, "r4", huge, NULL));
    free(huge);
    assert_true(response_store_get(s, "r1", NULL, NULL, NULL));
    assert_true(response_store_delete(s, "r1"));
    assert_false(response_store_delete(s, "r1"));
    assert_false(response_store_get(s, "r1", NULL, NULL, NULL));
    /* a foreground response cannot be cancelled; an unknown one is not found */
    assert_int_equal(response_store_cancel(s, "r3", 0.1, NULL), RESPONSE_CANCEL_NOT_BACKGROUND);
    assert_int_equal(response_store_cancel(s, "zz", 0.1, NULL), RESPONSE_CANCEL_NOT_FOUND);
    response_store_free(s);
}

/* Enough records to grow the id table several times; each is found with its own text, the
 * deleted ones are not, and a replaced one keeps a single copy. */
static void test_store_many(void **state) {
    (void)state;
    response_store *s = response_store_create(64 << 20, 4);
    char id[32], text[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        snprintf(text, sizeof text, "{\"n\":%d}", i);
        assert_true(response_store_put(s, id, text, NULL));
    }
    for (int i = 0; i < 2000; i += 2) {
        snprintf(id, sizeof id, "resp_%d", i);
        assert_true(response_store_delete(s, id));
    }
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        snprintf(text, sizeof text, "{\"n\":%d}", i);
        char *got = NULL;
        bool found = response_store_get(s, id, &got, NULL, NULL);
        assert_int_equal(found, i % 2 == 1);
        if (found) assert_string_equal(got, text);
        free(got);
    }
    assert_true(response_store_put(s, "resp_1", "{}", NULL));
    assert_true(response_store_delete(s, "resp_1"));
    assert_false(response_store_get(s, "resp_1", NULL, NULL, NULL));
    response_store_free(s);
}

static void test_store_jobs(void **state) {
    (void)state;
    response_store *s = response_store_create(1 << 20, 2);
    assert_true(response_store_job_begin(s, "b1", "{\"status\":\"in_progress\"}", "[]", NULL));
    assert_true(response_store_job_begin(s, "b2", "{}", "[]", NULL));
    assert_false(response_store_job_begin(s, "b3", "{}", "[]", NULL)); /* two at most */
    assert_false(response_store_get(s, "b3", NULL, NULL, NULL));
    response_store_job_end(s, "b1", "{\"status\":\"completed\"}", "[1]");
    assert_true(response_store_job_begin(s, "b3", "{}", "[]", NULL)); /* a slot came free */
    char *text = NULL;
    /* a finished background response is cancelled as it is: its final record comes back */
    assert_int_equal(response_store_cancel(s, "b1", 0.1, &text), RESPONSE_CANCEL_DONE);
    assert_string_equal(text, "{\"status\":\"completed\"}");
    free(text);
    /* a job whose record was deleted ends without bringing it back */
    assert_true(response_store_delete(s, "b2"));
    response_store_job_end(s, "b2", "{}", "[]");
    assert_false(response_store_get(s, "b2", NULL, NULL, NULL));
    response_store_job_end(s, "b3", "{}", "[]");
    response_store_free(s); /* no job left: returns at once */

    /* a store of no bytes keeps a running job's record (polling must find it), not its end */
    s = response_store_create(0, 2);
    assert_false(response_store_put(s, "f1", "{}", "[]"));
    assert_true(response_store_job_begin(s, "j1", "{}", "[]", NULL));
    assert_true(response_store_get(s, "j1", NULL, NULL, NULL));
    response_store_job_end(s, "j1", "{\"status\":\"completed\"}", "[]");
    assert_false(response_store_get(s, "j1", NULL, NULL, NULL));
    response_store_free(s);
}

/* Reads everything a reader has now (NUL-ended); returns the last read result. */
static long read_all(response_store *s, response_reader *rd, char *buf, size_t cap) {
    size_t len = 0;
    long n;
    while ((n = response_store_reader_read(s, rd, buf + len, 7)) > 0) /* small reads */
        len += (size_t)n;
    assert_true(len < cap);
    buf[len] = '\0';
    return n;
}

#include <sys/eventfd.h>
#include <unistd.h>

/* Events go in as whole events or in pieces; readers start after any sequence number, follow
 * the log live (woken through their eventfd), get END once the job ended, and LOST when the
 * record goes or their events were trimmed for the budget. */
static void test_store_event_log(void **state) {
    (void)state;
    response_store *s = response_store_create(1 << 20, 2);
    int fd = eventfd(0, EFD_NONBLOCK);
    assert_true(fd >= 0);
    response_reader *rd = NULL;
    int64_t n = 0;
    assert_true(response_store_put(s, "fg", "{}", "[]"));
    assert_int_equal(response_store_reader_open(s, "fg", -1, fd, &rd, &n), RESPONSE_OPEN_NO_LOG);
    assert_int_equal(response_store_reader_open(s, "zz", -1, fd, &rd, &n), RESPONSE_OPEN_NOT_FOUND);
    assert_true(response_store_job_begin(s, "b", "{}", "[]", NULL));
    response_store_job_events(s, "b", "event: a\ndata: 0\n\nevent: b\ndata: 1\n\n", 36);
    response_store_job_events(s, "b", "event: c\nda", 11); /* a partial event stays unread */
    response_reader *live = NULL;
    assert_int_equal(response_store_reader_open(s, "b", 0, fd, &live, &n), RESPONSE_OPEN_OK);
    assert_int_equal(n, 3);
    char buf[256];
    assert_int_equal(read_all(s, live, buf, sizeof buf), 0);
    assert_string_equal(buf, "event: b\ndata: 1\n\n");
    uint64_t count = 0;
    assert_int_equal(read(fd, &count, sizeof count), -1); /* nothing new yet */
    response_store_job_events(s, "b", "ta: 2\n\n", 7);
    assert_int_equal(read(fd, &count, sizeof count), (ssize_t)sizeof count); /* woken */
    assert_int_equal(read_all(s, live, buf, sizeof buf), 0);
    assert_string_equal(buf, "event: c\ndata: 2\n\n");
    /* numbers: 3 events (0..2); after 2 is the (empty, live) end, after 3 is past it */
    assert_int_equal(response_store_reader_open(s, "b", 3, fd, &rd, &n), RESPONSE_OPEN_PAST_END);
    assert_int_equal(response_store_reader_open(s, "b", 2, fd, &rd, &n), RESPONSE_OPEN_OK);
    assert_int_equal(response_store_reader_read(s, rd, buf, sizeof buf), 0);
    response_store_job_end(s, "b", "{\"done\":1}", "[]");
    assert_int_equal(response_store_reader_read(s, rd, buf, sizeof buf), RESPONSE_READ_END);
    assert_int_equal(read_all(s, live, buf, sizeof buf), RESPONSE_READ_END);
    response_store_reader_close(s, rd);
    /* a replay from the start after the end: every event */
    assert_int_equal(response_store_reader_open(s, "b", -1, fd, &rd, &n), RESPONSE_OPEN_OK);
    assert_int_equal(read_all(s, rd, buf, sizeof buf), RESPONSE_READ_END);
    assert_string_equal(buf, "event: a\ndata: 0\n\nevent: b\ndata: 1\n\nevent: c\ndata: 2\n\n");
    response_store_reader_close(s, rd);
    /* the record goes: its reader is told */
    assert_true(response_store_delete(s, "b"));
    assert_int_equal(response_store_reader_read(s, live, buf, sizeof buf), RESPONSE_READ_LOST);
    response_store_reader_close(s, live);
    response_store_free(s);

    /* a small store: a long log keeps its newest events, a reader left behind loses */
    s = response_store_create(8192, 2);
    assert_true(response_store_job_begin(s, "c", "{}", "[]", NULL));
    assert_int_equal(response_store_reader_open(s, "c", -1, fd, &rd, &n), RESPONSE_OPEN_OK);
    char event[120];
    for (int i = 0; i < 400; i++) {
        int len = snprintf(event, sizeof event, "event: e\ndata: %d\n\n", i);
        response_store_job_events(s, "c", event, (size_t)len);
    }
    assert_int_equal(response_store_reader_read(s, rd, buf, sizeof buf), RESPONSE_READ_LOST);
    response_store_reader_close(s, rd);
    assert_int_equal(response_store_reader_open(s, "c", -1, fd, &rd, &n), RESPONSE_OPEN_TRIMMED);
    assert_int_equal(n, 400);
    assert_int_equal(response_store_reader_open(s, "c", 398, fd, &rd, &n), RESPONSE_OPEN_OK);
    assert_int_equal(read_all(s, rd, buf, sizeof buf), 0);
    assert_string_equal(buf, "event: e\ndata: 399\n\n");
    response_store_job_end(s, "c", "{}", "[]");
    assert_int_equal(response_store_reader_read(s, rd, buf, sizeof buf), RESPONSE_READ_END);
    response_store_reader_close(s, rd);
    response_store_free(s);
    close(fd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_input_string_and_messages),
        cmocka_unit_test(test_turn_grouping),
        cmocka_unit_test(test_prior_chain),
        cmocka_unit_test(test_bad_items),
        cmocka_unit_test(test_store_lru),
        cmocka_unit_test(test_store_many),
        cmocka_unit_test(test_store_jobs),
        cmocka_unit_test(test_store_event_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
