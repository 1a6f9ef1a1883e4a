/*
 * test_support.h - helpers shared by the cmocka tests: environment paths, temporary
 * folders, running the gptoss binary, reading files.
 */
#ifndef GPTOSS_TEST_SUPPORT_H
#define GPTOSS_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gptoss.h"

/* Value of an environment variable the test runner sets (GPTOSS_BIN, GPTOSS_SOURCE_DIR,
 * GPTOSS_SHARED_DIR, GPTOSS_BUILD_DIR); fails the test when unset. */
const char *ts_env(const char *name);

/* Creates a fresh temporary folder; returns a malloc'd path. */
char *ts_mkdtemp(void);

/* Removes a folder tree (rm -rf). */
void ts_rmtree(const char *path);

/* Runs a shell command, capturing stdout+stderr into a malloc'd string; returns the exit
 * status (or -1 when killed by a signal, with *output saying which). */
int ts_run(char **output, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reads a whole file (malloc'd, NUL-terminated); NULL if it cannot be read. */
char *ts_read_file(const char *path, size_t *len);

/* Writes bytes to a file; fails the test on error. */
void ts_write_file(const char *path, const void *data, size_t len);

/* Path join into a malloc'd string. */
char *ts_path(const char *dir, const char *name);

#endif
