/*
 * test_log_clock.c - the log's levels, line shape and file redirection; the clock's
 * monotonicity against nanosleep.
 */
#define _POSIX_C_SOURCE 200809L
#include "test_support.h"

#include "util/clock.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *read_all(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc((size_t)n + 1, 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    return buf;
}

static void test_levels_and_shape(void **state) {
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    gptoss_log_set_file(f);
    gptoss_log_set_level(GPTOSS_LOG_WARN);
    assert_true(gptoss_log_enabled(GPTOSS_LOG_ERROR));
    assert_true(gptoss_log_enabled(GPTOSS_LOG_WARN));
    assert_false(gptoss_log_enabled(GPTOSS_LOG_INFO));
    GPTOSS_LOG_I("test", "hidden %d", 1);
    GPTOSS_LOG_W("test", "shown %d", 2);
    GPTOSS_LOG_E("serve", "also shown");
    char *text = read_all(f);
    assert_null(strstr(text, "hidden"));
    /* Two lines, each "YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL what: message\n". */
    char *second = strchr(text, '\n');
    assert_non_null(second);
    assert_int_equal(second[1] != '\0', 1);
    assert_int_equal(text[4], '-');
    assert_int_equal(text[10], 'T');
    assert_int_equal(text[23], 'Z');
    assert_non_null(strstr(text, " WARN  test: shown 2\n"));
    assert_non_null(strstr(second + 1, " ERROR serve: also shown\n"));
    free(text);
    gptoss_log_set_file(NULL);
    gptoss_log_set_level(GPTOSS_LOG_INFO);
    fclose(f);
}

static void test_long_line_is_cut_not_overrun(void **state) {
    (void)state;
    FILE *f = tmpfile();
    gptoss_log_set_file(f);
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    GPTOSS_LOG_I("test", "%s", big);
    char *text = read_all(f);
    size_t len = strlen(text);
    assert_true(len > 1000 && len <= 2047);
    assert_int_equal(text[len - 1], '\n');
    free(text);
    gptoss_log_set_file(NULL);
    fclose(f);
}

/* The JSON format: one object per line, strings escaped, invalid UTF-8 replaced, the extra
 * fields of gptoss_log_fields appended (and absent from the text format). */
static void test_json_format(void **state) {
    (void)state;
    FILE *f = tmpfile();
    gptoss_log_set_file(f);
    gptoss_log_set_format(GPTOSS_LOG_FORMAT_JSON);
    GPTOSS_LOG_W("serve", "quote \" back \\ tab \t bad \xff end");
    gptoss_log_fields(GPTOSS_LOG_INFO, "serve", "\"status\":200", "GET %s", "/health");
    gptoss_log_set_format(GPTOSS_LOG_FORMAT_TEXT);
    gptoss_log_fields(GPTOSS_LOG_INFO, "serve", "\"status\":200", "plain");
    char *text = read_all(f);
    char *second = strchr(text, '\n');
    assert_non_null(second);
    assert_memory_equal(text, "{\"time\":\"", 9);
    assert_non_null(strstr(text, "\",\"level\":\"warn\",\"what\":\"serve\",\"msg\":\"quote \\\" "
                                 "back \\\\ tab \\u0009 bad \\ufffd end\"}\n"));
    assert_non_null(strstr(second + 1, "\"level\":\"info\",\"what\":\"serve\",\"msg\":\"GET "
                                       "/health\",\"status\":200}\n"));
    assert_non_null(strstr(second + 1, " INFO  serve: plain\n"));
    assert_null(strstr(strstr(second + 1, "plain"), "status"));
    gptoss_log_format fmt;
    assert_true(gptoss_log_format_parse("json", &fmt));
    assert_int_equal(fmt, GPTOSS_LOG_FORMAT_JSON);
    assert_false(gptoss_log_format_parse("xml", &fmt));
    free(text);
    gptoss_log_set_file(NULL);
    fclose(f);
}

static void test_parse(void **state) {
    (void)state;
    gptoss_log_level l;
    assert_true(gptoss_log_level_parse("debug", &l));
    assert_int_equal(l, GPTOSS_LOG_DEBUG);
    assert_true(gptoss_log_level_parse("error", &l));
    assert_int_equal(l, GPTOSS_LOG_ERROR);
    assert_false(gptoss_log_level_parse("verbose", &l));
    assert_false(gptoss_log_level_parse(NULL, &l));
}

static void test_clock_monotonic(void **state) {
    (void)state;
    double a = gptoss_now_seconds();
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double b = gptoss_now_seconds();
    assert_true(b - a >= 0.019);
    assert_true(b - a < 5.0);
    double ms = gptoss_now_ms();
    assert_true(ms >= b * 1e3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_and_shape),
        cmocka_unit_test(test_long_line_is_cut_not_overrun),
        cmocka_unit_test(test_json_format),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_clock_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
