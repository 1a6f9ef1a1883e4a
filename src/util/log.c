/*
 * log.c - leveled log lines, as text or as one JSON object per line (see log.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "util/log.h"

#include "util/utf8.h"

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
static volatile int current_format = GPTOSS_LOG_FORMAT_TEXT;
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

void gptoss_log_set_format(gptoss_log_format format) {
    current_format = (int)format;
}

gptoss_log_format gptoss_log_get_format(void) {
    return (gptoss_log_format)current_format;
}

bool gptoss_log_format_parse(const char *name, gptoss_log_format *out) {
    if (!name) return false;
    if (!strcmp(name, "text")) return *out = GPTOSS_LOG_FORMAT_TEXT, true;
    if (!strcmp(name, "json")) return *out = GPTOSS_LOG_FORMAT_JSON, true;
    return false;
}

/* Appends `text` as the inside of a JSON string: quotes, backslashes and control bytes
 * escaped, invalid UTF-8 (a message cut mid-character, bytes from a client) as U+FFFD. */
static size_t json_escape(char *out, size_t cap, const char *text) {
    size_t o = 0, len = strlen(text);
    for (size_t i = 0; i < len && o + 8 < cap;) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\') {
            out[o++] = '\\', out[o++] = (char)c, i++;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            out[o++] = (char)c, i++;
        } else {
            size_t n = gptoss_utf8_sequence_length((const unsigned char *)text + i, len - i);
            if (n == 0) {
                memcpy(out + o, "\\ufffd", 6), o += 6, i++;
            } else {
                memcpy(out + o, text + i, n), o += n, i += n;
            }
        }
    }
    return o;
}

static void log_line(gptoss_log_level level, const char *what, const char *fields, const char *fmt,
                     va_list ap) {
    if (!gptoss_log_enabled(level)) return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char time_text[40];
    snprintf(time_text, sizeof time_text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000));
    int l = level < 0 || level > 3 ? 0 : (int)level;
    char message[2048];
    if (vsnprintf(message, sizeof message, fmt, ap) < 0) message[0] = '\0';
    char line[8 * 2048];
    size_t len;
    if (current_format == GPTOSS_LOG_FORMAT_JSON) {
        int n = snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"what\":\"",
                         time_text, level_names[l]);
        len = (size_t)(n < 0 ? 0 : n);
        len += json_escape(line + len, sizeof line - len, what ? what : "gptoss");
        len += (size_t)snprintf(line + len, sizeof line - len, "\",\"msg\":\"");
        len += json_escape(line + len, sizeof line - len, message);
        size_t flen = fields ? strlen(fields) : 0;
        if (flen && len + flen + 8 < sizeof line) {
            memcpy(line + len, "\",", 2), len += 2;
            memcpy(line + len, fields, flen), len += flen;
            line[len++] = '}';
        } else {
            memcpy(line + len, "\"}", 2), len += 2;
        }
    } else {
        int n = snprintf(line, sizeof line, "%s %s %s: %s", time_text, level_tags[l],
                         what ? what : "gptoss", message);
        len = n < 0 ? 0 : (size_t)n;
        if (len > 2046) len = 2046; /* a text line stays under 2 KiB */
    }
    line[len++] = '\n';
    FILE *f = log_file ? log_file : stderr;
    fwrite(line, 1, len, f);
    fflush(f);
}

void gptoss_log(gptoss_log_level level, const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_line(level, what, NULL, fmt, ap);
    va_end(ap);
}

void gptoss_log_fields(gptoss_log_level level, const char *what, const char *fields,
                       const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_line(level, what, fields, fmt, ap);
    va_end(ap);
}
