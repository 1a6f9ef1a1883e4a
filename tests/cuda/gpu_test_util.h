/*
 * gpu_test_util.h - host helpers shared by the GPU test programs (tests/cuda/gpu_test_*.cu):
 * CUDA error checks, a xorshift generator of never-zero values, bf16 conversions, device
 * upload / poisoned buffers / download, the relative-L2 result bookkeeping and its report, and
 * the command line's choice of sections. Define GPU_TEST_SEED before including it to give a
 * program its own random stream.
 */
#ifndef GPTOSS_GPU_TEST_UTIL_H
#define GPTOSS_GPU_TEST_UTIL_H

#include "backend/cuda/cuda_kernels.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__,        \
                    __LINE__, cudaGetErrorString(e_));                                             \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#ifndef GPU_TEST_SEED
#define GPU_TEST_SEED 0x1234567887654321ull
#endif

static uint64_t rng_state = GPU_TEST_SEED;
static inline uint64_t rnd_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static inline double rnd_unit(void) {
    return (double)(rnd_u64() >> 11) * (1.0 / 9007199254740992.0);
}
/* uniform in +-[0.05, 1] * scale: never zero */
static inline float rnd_nz(float scale) {
    double u = 0.05 + 0.95 * rnd_unit();
    return (float)((rnd_u64() & 1) ? u : -u) * scale;
}
static inline int rnd_int(int n) {
    return (int)(rnd_u64() % (uint64_t)n);
}

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline double bfround(double x) {
    return bf2f(f2bf((float)x));
}

template <typename T> static T *dev_upload(const std::vector<T> &v) {
    T *d = NULL;
    CK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
/* n elements plus `guard` more, all NaN bytes (NaN in f32 and bf16) */
template <typename T> static T *dev_poisoned(size_t n, size_t guard = 0) {
    T *d = NULL;
    CK(cudaMalloc(&d, (n + guard) * sizeof(T) + 16));
    CK(cudaMemset(d, 0xff, (n + guard) * sizeof(T)));
    return d;
}
template <typename T> static std::vector<T> dev_download(const T *d, size_t n) {
    std::vector<T> v(n);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

/* Selects GPU 0 and says which it is; returns its properties. */
static inline cudaDeviceProp open_device(void) {
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    /* the kernels choose by these: the device's, or GPTOSS_CUDA_DEVICE_PROFILE's */
    char caps[160];
    gptoss_cuda_caps_describe(gptoss_cuda_caps_current(), caps, sizeof caps);
    const char *profile = getenv("GPTOSS_CUDA_DEVICE_PROFILE");
    printf("kernel profile: %s (%s)\n", profile ? profile : "auto", caps);
    return prop;
}

/* ---- result bookkeeping ----------------------------------------------------------------- */

typedef struct result {
    char name[192];
    double rel_l2;  /* ||out - ref|| / ||ref|| */
    double max_abs; /* max |out - ref| */
    double tol;     /* bound on rel_l2 */
    bool ok;
} result;
static std::vector<result> results;

/* Compares out against ref: relative L2 error under tol, and every element finite. */
static inline bool check(const char *name, const std::vector<double> &out,
                         const std::vector<double> &ref, double tol) {
    double num = 0, den = 0, mx = 0;
    bool finite = true;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!isfinite(out[i])) finite = false;
        double d = out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        mx = fmax(mx, fabs(d));
    }
    result r;
    snprintf(r.name, sizeof r.name, "%s", name);
    r.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    r.max_abs = mx;
    r.tol = tol;
    r.ok = finite && r.rel_l2 <= tol && ref.size() > 0;
    if (!finite) r.rel_l2 = NAN;
    printf("%-64s rel_l2 %.2e  max_abs %.2e  tol %.0e  %s\n", r.name, r.rel_l2, r.max_abs, tol,
           r.ok ? "ok" : "FAIL");
    results.push_back(r);
    return r.ok;
}
/* A pass/fail fact with no error measure (refusals, guard regions). */
static inline void check_true(const char *name, bool ok) {
    result r;
    snprintf(r.name, sizeof r.name, "%s", name);
    r.rel_l2 = 0, r.max_abs = 0, r.tol = 0, r.ok = ok;
    printf("%-64s %s\n", r.name, ok ? "ok" : "FAIL");
    results.push_back(r);
}

/* Every case as a table row, then "PROGRAM: N cases, F failed" as the last line (what
 * scripts/gpu-check records). Returns the exit status: 1 when a case failed. */
static inline int report_results(const char *program, const char *what) {
    int failed = 0;
    printf("\n| %s case | rel_l2 | tol | result |\n|---|---|---|---|\n", what);
    for (const result &r : results) {
        printf("| %s | %.2e | %.0e | %s |\n", r.name, r.rel_l2, r.tol, r.ok ? "ok" : "FAIL");
        failed += !r.ok;
    }
    printf("\n%s: %zu cases, %d failed\n", program, results.size(), failed);
    return failed ? 1 : 0;
}

/* ---- sections: a subset re-checks one kernel family in less time ---------------------- */

static const char *g_sections = NULL; /* comma-separated list from the command line, NULL = all */

/* Whether the command line asked for `section` (all of them when it named none). */
static inline bool want(const char *section) {
    if (!g_sections) return true;
    size_t n = strlen(section);
    for (const char *p = g_sections; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, section, n) == 0) return true;
        p += len + (end ? 1 : 0);
    }
    return false;
}

/* Reads `PROGRAM [SECTION,...]`: 0 to go on, 2 (the exit status) after help or an unknown
 * name, which must not pass by running nothing. */
static inline int select_sections(int argc, char **argv, const char *program,
                                  const char *const *names, int n_names) {
    if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
        fprintf(stderr, "usage: %s [SECTION,...]\nsections:", program);
        for (int i = 0; i < n_names; i++)
            fprintf(stderr, " %s", names[i]);
        fprintf(stderr, "\n");
        return 2;
    }
    if (argc < 2) return 0;
    for (const char *p = argv[1]; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        bool known = false;
        for (int i = 0; i < n_names; i++)
            known = known || (strlen(names[i]) == len && strncmp(p, names[i], len) == 0);
        if (!known) {
            fprintf(stderr, "%s: unknown section '%.*s' (see --help)\n", program, (int)len, p);
            return 2;
        }
        p += len + (end ? 1 : 0);
    }
    g_sections = argv[1];
    return 0;
}

#endif
