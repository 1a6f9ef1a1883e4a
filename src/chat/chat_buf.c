/*
 * chat_buf.c - growable byte buffer used by the harmony renderer and parser (see chat_buf.h).
 */
#include "chat/chat_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(gptoss_chat_buf *buf, size_t extra) {
    if (buf->failed) return false;
    if (buf->len + extra + 1 <= buf->capacity) return true;
    size_t capacity = buf->capacity ? buf->capacity : 64;
    while (capacity < buf->len + extra + 1) {
        if (capacity > ((size_t)-1) / 2) {
            buf->failed = true;
            return false;
        }
        capacity *= 2;
    }
    char *data = realloc(buf->data, capacity);
    if (!data) {
        buf->failed = true;
        return false;
    }
    buf->data = data;
    buf->capacity = capacity;
    return true;
}

bool gptoss_chat_buf_append(gptoss_chat_buf *buf, const char *bytes, size_t n) {
    if (!reserve(buf, n)) return false;
    if (n) memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
    buf->data[buf->len] = '\0';
    return true;
}

bool gptoss_chat_buf_puts(gptoss_chat_buf *buf, const char *text) {
    return gptoss_chat_buf_append(buf, text, strlen(text));
}

bool gptoss_chat_buf_printf(gptoss_chat_buf *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(buf, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    buf->len += (size_t)n;
    return true;
}

bool gptoss_chat_buf_terminate(gptoss_chat_buf *buf) {
    if (!reserve(buf, 0)) return false;
    buf->data[buf->len] = '\0';
    return true;
}

char *gptoss_chat_buf_take(gptoss_chat_buf *buf, size_t *len) {
    if (!gptoss_chat_buf_terminate(buf)) {
        gptoss_chat_buf_free(buf);
        return NULL;
    }
    char *data = buf->data;
    if (len) *len = buf->len;
    buf->data = NULL;
    buf->len = buf->capacity = 0;
    return data;
}

void gptoss_chat_buf_free(gptoss_chat_buf *buf) {
    free(buf->data);
    buf->data = NULL;
    buf->len = buf->capacity = 0;
    buf->failed = false;
}

char *gptoss_chat_strndup(const char *text, size_t n) {
    char *copy = malloc(n + 1);
    if (!copy) return NULL;
    if (n) memcpy(copy, text, n);
    copy[n] = '\0';
    return copy;
}
