/*
 * hf_cache.c - model arguments: folders and Hugging Face repo ids in the local cache (see
 * hf_cache.h).
 */
#include "loader/hf_cache.h"

#include "util/error.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

void gptoss_hf_cache_dir(char *out, size_t size) {
    const char *hub = getenv("HF_HUB_CACHE");
    const char *home = getenv("HF_HOME");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *user = getenv("HOME");
    if (hub && *hub)
        snprintf(out, size, "%s", hub);
    else if (home && *home)
        snprintf(out, size, "%s/hub", home);
    else if (xdg && *xdg)
        snprintf(out, size, "%s/huggingface/hub", xdg);
    else
        snprintf(out, size, "%s/.cache/huggingface/hub", user && *user ? user : "");
}

/* A repo name part: [A-Za-z0-9][A-Za-z0-9._-]*, without "--" or "..", at most 96 bytes. */
static bool is_name(const char *s, size_t len) {
    if (len == 0 || len > 96 || !isalnum((unsigned char)s[0])) return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '-' && c != '_' && c != '.') return false;
        if (i > 0 && (c == '-' || c == '.') && s[i - 1] == c) return false;
    }
    return true;
}

/* A revision: a branch, tag or commit hash; '/' allowed (refs/pr/1), ".." not. */
static bool is_revision(const char *s) {
    if (!*s || strlen(s) > 200 || strstr(s, "..") || s[0] == '/') return false;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-_./", *p)) return false;
    return true;
}

bool gptoss_hf_is_repo_id(const char *text) {
    const char *slash = strchr(text, '/');
    if (!slash) return false;
    const char *at = strchr(slash, '@');
    size_t name_len = at ? (size_t)(at - slash - 1) : strlen(slash + 1);
    if (!is_name(text, (size_t)(slash - text)) || !is_name(slash + 1, name_len)) return false;
    return !at || is_revision(at + 1);
}

static bool is_hex(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!isxdigit((unsigned char)*s)) return false;
    return true;
}

/* The commit hash a ref file holds, in hash (false when unreadable or not a hash). */
static bool read_ref(const char *path, char *hash, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t n = fread(hash, 1, size - 1, f);
    fclose(f);
    hash[n] = '\0';
    while (n > 0 && isspace((unsigned char)hash[n - 1]))
        hash[--n] = '\0';
    return n >= 7 && is_hex(hash);
}

/* ORG/NAME when path (resolved) is HUB/models--ORG--NAME/snapshots/HASH. */
static bool snapshot_repo_id(const char *path, char *id, size_t size) {
    char real[PATH_MAX];
    if (!realpath(path, real)) return false;
    char *hash = strrchr(real, '/');
    if (!hash || hash == real) return false;
    *hash = '\0';
    char *snapshots = strrchr(real, '/');
    if (!snapshots || strcmp(snapshots + 1, "snapshots") != 0) return false;
    *snapshots = '\0';
    char *repo = strrchr(real, '/');
    if (!repo || strncmp(repo + 1, "models--", 8) != 0) return false;
    const char *org = repo + 9;
    const char *sep = strstr(org, "--");
    if (!sep || !is_name(org, (size_t)(sep - org)) || !is_name(sep + 2, strlen(sep + 2)))
        return false;
    snprintf(id, size, "%.*s/%s", (int)(sep - org), org, sep + 2);
    return true;
}

/* The last component of path, without trailing slashes; the resolved folder's name for ".",
 * ".." and "/". */
static void folder_name(const char *path, char *out, size_t size) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    snprintf(out, size, "%.*s", (int)(len - start), path + start);
    if (!strcmp(out, ".") || !strcmp(out, "..") || !strcmp(out, "/") || !*out) {
        char real[PATH_MAX];
        if (realpath(path, real)) {
            const char *base = strrchr(real, '/');
            snprintf(out, size, "%s", base && base[1] ? base + 1 : real);
        }
    }
}

gptoss_status gptoss_model_locate(const char *arg, gptoss_model_location *out,
                                  gptoss_error *error) {
    memset(out, 0, sizeof *out);
    if (!arg || !*arg)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT, "no model given");
    struct stat sb;
    if (stat(arg, &sb) == 0 || !gptoss_hf_is_repo_id(arg)) {
        /* A path (the loader says what is wrong with one that does not exist). */
        snprintf(out->dir, sizeof out->dir, "%s", arg);
        if (!snapshot_repo_id(arg, out->id, sizeof out->id))
            folder_name(arg, out->id, sizeof out->id);
        return GPTOSS_OK;
    }
    const char *slash = strchr(arg, '/');
    const char *at = strchr(slash, '@');
    size_t repo_len = at ? (size_t)(at - arg) : strlen(arg);
    const char *revision = at ? at + 1 : "main";
    char hub[2048], repo_dir[3072];
    gptoss_hf_cache_dir(hub, sizeof hub);
    snprintf(repo_dir, sizeof repo_dir, "%s/models--%.*s--%.*s", hub, (int)(slash - arg), arg,
             (int)(repo_len - (size_t)(slash - arg) - 1), slash + 1);
    snprintf(out->id, sizeof out->id, "%.*s", (int)repo_len, arg);

    char ref[3400], hash[128];
    snprintf(ref, sizeof ref, "%s/refs/%s", repo_dir, revision);
    bool have_hash = read_ref(ref, hash, sizeof hash);
    if (!have_hash && is_hex(revision) && strlen(revision) < sizeof hash) {
        snprintf(hash, sizeof hash, "%s", revision); /* a commit hash given as the revision */
        have_hash = true;
    }
    if (have_hash) {
        snprintf(out->dir, sizeof out->dir, "%s/snapshots/%s", repo_dir, hash);
        if (is_dir(out->dir)) return GPTOSS_OK;
    }
    const char *looked = have_hash ? out->dir : ref; /* the snapshot, or the ref naming one */
    char repo[256], rev_arg[256];
    snprintf(repo, sizeof repo, "%.*s", (int)repo_len, arg);
    snprintf(rev_arg, sizeof rev_arg, "%s%s", at ? " --revision " : "", at ? revision : "");
    return gptoss_set_error(
        error, GPTOSS_ERR_IO,
        "%s: not a folder, and not in the Hugging Face cache (no %s; the cache is "
        "$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). Download it with:\n"
        "  hf download %s%s --exclude 'original/*' --exclude 'metal/*'\n"
        "or, with an older huggingface_hub:\n"
        "  huggingface-cli download %s%s --exclude 'original/*' 'metal/*'\n"
        "or give -m the folder that holds its config.json",
        arg, looked, repo, rev_arg, repo, rev_arg);
}
