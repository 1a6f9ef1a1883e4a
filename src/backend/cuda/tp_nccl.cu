/*
 * tp_nccl.cu - NCCL opened at run time for tensor parallelism (tp_nccl.h).
 */
#include "backend/cuda/tp_nccl.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

nccl_api gptoss_tp_nccl;
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void *nccl_open(void) {
    const char *env = getenv("GPTOSS_NCCL_LIBRARY");
    if (env && *env) return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    /* next to the executable (a copied binary with its NCCL beside it) */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    strcpy(slash + 1, "libnccl.so.2");
    return dlopen(exe, RTLD_NOW | RTLD_LOCAL);
}

static void nccl_load_once(void) {
    void *h = nccl_open();
    if (!h) {
        const char *why = dlerror();
        snprintf(gptoss_tp_nccl.error, sizeof gptoss_tp_nccl.error,
                 "tensor parallelism needs NCCL: libnccl.so.2 was not found (%s); install "
                 "NCCL 2.18 or newer, put libnccl.so.2 next to the gptoss binary, or name it "
                 "in GPTOSS_NCCL_LIBRARY",
                 why ? why : "dlopen failed");
        return;
    }
#define NCCL_SYM(field, name)                                                                      \
    do {                                                                                           \
        *(void **)&gptoss_tp_nccl.field = dlsym(h, name);                                          \
        if (!gptoss_tp_nccl.field) {                                                               \
            snprintf(gptoss_tp_nccl.error, sizeof gptoss_tp_nccl.error, "NCCL library lacks %s",   \
                     name);                                                                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    NCCL_SYM(comm_init_all, "ncclCommInitAll");
    NCCL_SYM(all_reduce, "ncclAllReduce");
    NCCL_SYM(all_gather, "ncclAllGather");
    NCCL_SYM(comm_destroy, "ncclCommDestroy");
    NCCL_SYM(comm_abort, "ncclCommAbort");
    NCCL_SYM(error_string, "ncclGetErrorString");
    NCCL_SYM(get_version, "ncclGetVersion");
#undef NCCL_SYM
    *(void **)&gptoss_tp_nccl.get_unique_id = dlsym(h, "ncclGetUniqueId");
    *(void **)&gptoss_tp_nccl.comm_init_rank = dlsym(h, "ncclCommInitRank");
    *(void **)&gptoss_tp_nccl.group_start = dlsym(h, "ncclGroupStart");
    *(void **)&gptoss_tp_nccl.group_end = dlsym(h, "ncclGroupEnd");
    gptoss_tp_nccl.loaded = true;
}

gptoss_status gptoss_tp_nccl_load(gptoss_error *error) {
    pthread_once(&g_nccl_once, nccl_load_once);
    if (!gptoss_tp_nccl.loaded)
        return gptoss_set_error(error, GPTOSS_ERR_UNSUPPORTED, "%s", gptoss_tp_nccl.error);
    return GPTOSS_OK;
}

gptoss_status gptoss_tp_nccl_check(nccl_result_t r, const char *what, gptoss_error *error) {
    if (r == 0) return GPTOSS_OK;
    return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "NCCL: %s failed: %s (%d)", what,
                            gptoss_tp_nccl.error_string ? gptoss_tp_nccl.error_string(r) : "?",
                            (int)r);
}
