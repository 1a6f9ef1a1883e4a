/*
 * chat_buf.h - a growable byte buffer for the chat layer (renderings, parsed text).
 *
 * Owns: its heap block. Always NUL-terminated after the first successful append so the
 * contents can be used as a C string. Must not be used for binary data that needs a length
 * other than `len`.
 */
#ifndef GPTOSS_CHAT_BUF_H
#define GPTOSS_CHAT_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gptoss_chat_buf {
    char *data;      /* [capacity] bytes, NUL-terminated at data[len] once allocated */
    size_t len;      /* bytes in use, excluding the NUL */
    size_t capacity; /* bytes allocated */
    bool failed;     /* an allocation failed; later appends are ignored */
} gptoss_chat_buf;

/* Appends bytes; returns false (and sets failed) when memory runs out. */
bool gptoss_chat_buf_append(gptoss_chat_buf *buf, const char *bytes, size_t n);
bool gptoss_chat_buf_puts(gptoss_chat_buf *buf, const char *text);
bool gptoss_chat_buf_printf(gptoss_chat_buf *buf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Makes sure data is allocated and NUL-terminated even when empty. */
bool gptoss_chat_buf_terminate(gptoss_chat_buf *buf);
/* Hands the block to the caller (who frees it) and resets the buffer. */
char *gptoss_chat_buf_take(gptoss_chat_buf *buf, size_t *len);
void gptoss_chat_buf_free(gptoss_chat_buf *buf);

/* strdup of n bytes (NUL-terminated copy); NULL on allocation failure. */
char *gptoss_chat_strndup(const char *text, size_t n);

#endif
