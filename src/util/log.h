/*
 * log.h - the program's one log: leveled lines on stderr.
 *
 * Every message the library, the server and the CLI print about what they are doing (start-up,
 * progress, warnings, per-request access lines, errors that are not returned to a caller) goes
 * through gptoss_log, so that one setting decides how much is printed and every line has the
 * same shape:
 *
 *     2026-11-25T18:59:46.123Z INFO  serve: listening on http://127.0.0.1:8000
 *
 * A command's own output (a table, generated text, JSON on stdout) is not a log line and is
 * printed directly. Thread-safe: a line is formatted whole, then written with one call.
 * The level comes from gptoss_log_set_level (the CLI's --log-level) or, before that is
 * called, from GPTOSS_LOG_LEVEL (error, warn, info, debug); the default is info.
 *
 * In the JSON format (`gptoss serve --log-format json`) every line is one JSON object instead:
 *
 *     {"time":"2026-11-25T18:59:46.123Z","level":"info","what":"serve","msg":"listening on ..."}
 *
 * and gptoss_log_fields adds its own members (the access log's method, status, ...).
 */
#ifndef GPTOSS_UTIL_LOG_H
#define GPTOSS_UTIL_LOG_H

#include "util/error.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gptoss_log_level {
    GPTOSS_LOG_ERROR = 0,
    GPTOSS_LOG_WARN = 1,
    GPTOSS_LOG_INFO = 2,
    GPTOSS_LOG_DEBUG = 3,
} gptoss_log_level;

/* Writes one line if level is enabled. what names the part of the program speaking
 * ("serve", "engine", "cuda", ...); fmt is printf-style, without a trailing newline. */
void gptoss_log(gptoss_log_level level, const char *what, const char *fmt, ...) GPTOSS_PRINTF(3, 4);

/* Whether a line of this level would be written (to skip work that only feeds a log line). */
bool gptoss_log_enabled(gptoss_log_level level);

void gptoss_log_set_level(gptoss_log_level level);
gptoss_log_level gptoss_log_get_level(void);

/* Parses "error", "warn", "info" or "debug"; false for anything else. */
bool gptoss_log_level_parse(const char *name, gptoss_log_level *out);

/* Where lines go (default stderr; tests point it at a file). NULL restores stderr. */
void gptoss_log_set_file(void *file /* FILE * */);

typedef enum gptoss_log_format {
    GPTOSS_LOG_FORMAT_TEXT = 0,
    GPTOSS_LOG_FORMAT_JSON = 1,
} gptoss_log_format;

void gptoss_log_set_format(gptoss_log_format format);
gptoss_log_format gptoss_log_get_format(void);

/* Parses "text" or "json"; false for anything else. */
bool gptoss_log_format_parse(const char *name, gptoss_log_format *out);

/* gptoss_log plus structured members: `fields` is the inside of a JSON object ("\"status\":200,
 * \"path\":\"/health\"", valid JSON, or NULL), added to the line in the JSON format and left out
 * of the text format (whose message should then say what matters). */
void gptoss_log_fields(gptoss_log_level level, const char *what, const char *fields,
                       const char *fmt, ...) GPTOSS_PRINTF(4, 5);

#define GPTOSS_LOG_E(what, ...) gptoss_log(GPTOSS_LOG_ERROR, what, __VA_ARGS__)
#define GPTOSS_LOG_W(what, ...) gptoss_log(GPTOSS_LOG_WARN, what, __VA_ARGS__)
#define GPTOSS_LOG_I(what, ...) gptoss_log(GPTOSS_LOG_INFO, what, __VA_ARGS__)
#define GPTOSS_LOG_D(what, ...) gptoss_log(GPTOSS_LOG_DEBUG, what, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
