/*
 * log.c - leveled log lines (see log.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static volatile int current_level = GPTOSS_LOG_INFO;
static volatile int level_set_explicitly = 0;
static FILE *volatile log_file = NULL;

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};

bool gptoss_log_level_parse(const char *name, gptoss_log_level *out) {
    if (!name) return false;
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (gptoss_log_level)i;
            return true;
        }
    }
    return false;
}

static void level_from_env(void) {
    gptoss_log_level level;
    const char *v = getenv("GPTOSS_LOG_LEVEL");
    if (!level_set_explicitly && v && gptoss_log_level_parse(v, &level)) current_level = (int)level;
}

void gptoss_log_set_level(gptoss_log_level level) {
    pthread_once(&level_once, level_from_env);
    level_set_explicitly = 1;
    current_level = (int)level;
}

gptoss_log_level gptoss_log_get_level(void) {
    pthread_once(&level_once, level_from_env);
    return (gptoss_log_level)current_level;
}

bool gptoss_log_enabled(gptoss_log_level level) {
    return (int)level <= (int)gptoss_log_get_level();
}

void gptoss_log_set_file(void *file) {
    log_file = (FILE *)file;
}

void gptoss_log(gptoss_log_level level, const char *what, const char *fmt, ...) {
    if (!gptoss_log_enabled(level)) return;
    char line[2048];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(
        line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s %s: ", tm.tm_year + 1900,
        tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
        level_tags[level < 0 || level > 3 ? 0 : level], what ? what : "gptoss");
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 2) n = (int)sizeof line - 2;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - 1 - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    FILE *f = log_file ? log_file : stderr;
    fwrite(line, 1, len, f);
    fflush(f);
}
