/*
 * error.c - status names and formatted error messages (see error.h).
 */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *gptoss_status_name(gptoss_status status) {
    switch (status) {
    case GPTOSS_OK:
        return "ok";
    case GPTOSS_ERR_INVALID_ARGUMENT:
        return "invalid argument";
    case GPTOSS_ERR_IO:
        return "i/o error";
    case GPTOSS_ERR_FORMAT:
        return "format error";
    case GPTOSS_ERR_MODEL:
        return "invalid model";
    case GPTOSS_ERR_UNSUPPORTED:
        return "unsupported";
    case GPTOSS_ERR_OUT_OF_MEMORY:
        return "out of memory";
    case GPTOSS_ERR_BACKEND:
        return "backend error";
    case GPTOSS_ERR_CAPACITY:
        return "capacity exhausted";
    }
    return "unknown status";
}

gptoss_status gptoss_set_error(gptoss_error *error, gptoss_status status, const char *fmt, ...) {
    if (error) {
        va_list ap;
        va_start(ap, fmt);
        error->status = status;
        vsnprintf(error->message, sizeof error->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

gptoss_status gptoss_error_prefix(gptoss_error *error, const char *fmt, ...) {
    if (!error) return GPTOSS_ERR_INVALID_ARGUMENT;
    char prefix[GPTOSS_ERROR_MESSAGE_MAX];
    char old[GPTOSS_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error->message, sizeof old);
    snprintf(error->message, sizeof error->message, "%s%s", prefix, old);
    return error->status;
}

void gptoss_error_clear(gptoss_error *error) {
    if (!error) return;
    error->status = GPTOSS_OK;
    error->message[0] = '\0';
}
