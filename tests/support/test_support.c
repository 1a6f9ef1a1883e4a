/*
 * test_support.c - see test_support.h.
 */
#include "test_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

const char *ts_env(const char *name) {
    const char *value = getenv(name);
    if (!value || !*value) fail_msg("environment variable %s is not set (run through ctest)", name);
    return value;
}

char *ts_mkdtemp(void) {
    const char *base = getenv("TMPDIR");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/gptoss-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(buf)) fail_msg("mkdtemp failed");
    return strdup(buf);
}

void ts_rmtree(const char *path) {
    if (!path || !*path || strcmp(path, "/") == 0) return;
    char *out = NULL;
    ts_run(&out, "rm -rf '%s'", path);
    free(out);
}

int ts_run(char **output, const char *fmt, ...) {
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[16500];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) fail_msg("popen failed for %s", cmd);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2048) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[len] = '\0';
    int status = pclose(p);
    if (output)
        *output = buf;
    else
        free(buf);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return -1;
}

char *ts_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    if (size > 0 && fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[size] = '\0';
    if (len) *len = (size_t)size;
    return buf;
}

void ts_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot write %s", path);
    if (len && fwrite(data, 1, len, f) != len) fail_msg("short write %s", path);
    fclose(f);
}

char *ts_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}
