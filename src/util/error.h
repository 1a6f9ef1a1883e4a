/*
 * error.h - errors as values.
 *
 * Functions that can fail return a gptoss_status and fill a gptoss_error (when the caller
 * gave one) with a message a user can act on. gptoss_set_error formats the message and
 * returns the status so a failure reads as one line: `return gptoss_set_error(err, ...);`.
 */
#ifndef GPTOSS_UTIL_ERROR_H
#define GPTOSS_UTIL_ERROR_H

#include "gptoss.h"

#if defined(__GNUC__)
#define GPTOSS_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define GPTOSS_PRINTF(fmt_index, first_arg)
#endif

/* Fills *error (if non-NULL) and returns status. */
gptoss_status gptoss_set_error(gptoss_error *error, gptoss_status status, const char *fmt, ...)
    GPTOSS_PRINTF(3, 4);

/* Prefixes an existing message with context ("loading /x: " + old message). */
gptoss_status gptoss_error_prefix(gptoss_error *error, const char *fmt, ...) GPTOSS_PRINTF(2, 3);

/* Resets *error to GPTOSS_OK with an empty message. */
void gptoss_error_clear(gptoss_error *error);

#endif
