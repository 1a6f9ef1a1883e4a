/*
 * cuda_bench.h - throughput measurement of the CUDA backend (used by `gptoss bench`).
 *
 * C interface, so the CLI (C11) can call it; implemented in cuda_bench.cu. Measures prefill
 * (pp) and decode (tg at a KV depth) with CUDA events after a warm-up, the median of
 * repeats, and the decode memory floor from a measured device copy bandwidth. Owns nothing
 * after it returns; prints nothing (progress goes through the callback).
 */
#ifndef GPTOSS_CUDA_BENCH_H
#define GPTOSS_CUDA_BENCH_H

#include "gptoss.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPTOSS_BENCH_MAX_CASES 64
#define GPTOSS_BENCH_N_PARTS 7

/* Components of a step in --profile tables. */
extern const char *const gptoss_bench_part_names[GPTOSS_BENCH_N_PARTS];

typedef struct gptoss_bench_case {
    bool decode;                 /* tg (decode) or pp (prefill) */
    int32_t n_tokens;            /* prompt length (pp) or generated tokens (tg) */
    int32_t depth;               /* tokens already in the KV cache */
    int32_t batch;               /* tg: sequences decoding together (one token each per step) */
    double median_ms;            /* median over repeats of the whole case */
    double tokens_per_s;         /* n_tokens * batch / median */
    double floor_ms;             /* decode: bytes that must move / copy bandwidth, whole case */
    double floor_bytes_per_step; /* decode: the bytes counted in floor_ms, per step */
    double part_ms[GPTOSS_BENCH_N_PARTS]; /* --profile: per-token (tg) or per-step (pp) split */
} gptoss_bench_case;

typedef struct gptoss_bench_request {
    const gptoss_config *config; /* shape (random weights), or the model's config */
    const gptoss_model *model;   /* NULL: weights generated on the GPU */
    const int32_t *pp;           /* prompt lengths */
    int32_t n_pp;
    const int32_t *tg; /* decode lengths */
    int32_t n_tg;
    const int32_t *depth; /* KV depths for decode (and prefill after d cached tokens) */
    int32_t n_depth;
    const int32_t *batch; /* decode batch sizes (sequences per step); NULL: 1 */
    int32_t n_batch;
    int32_t repeats; /* timed repeats per case (after one warm-up) */
    bool profile;    /* fill part_ms (adds events between kernels) */
    bool use_graphs; /* decode through CUDA graphs */
    int32_t device;
    uint32_t fp8_layers;                  /* gptoss_fp8_layer bits: dense layers held in FP8 */
    int32_t tensor_parallel_size;         /* GPUs from `device` the model is split over */
    int32_t moe_parallel;                 /* gptoss_moe_parallel of the split */
    gptoss_kv_cache_dtype kv_cache_dtype; /* what the KV pages hold */
    gptoss_cuda_profile cuda_profile;     /* the kernel paths' profile (gptoss.h) */
    bool weights_in_host_memory;          /* weights in pinned host memory (gptoss.h) */
    bool batch_invariant;                 /* gptoss_backend_options.batch_invariant */
    gptoss_progress_fn progress;
    void *progress_user;
} gptoss_bench_request;

typedef struct gptoss_bench_report {
    char device_name[256];
    char cuda_profile[16];  /* the kernel paths' profile in effect ("auto", "ampere", ...) */
    double copy_gb_per_s;   /* device-to-device copy, (read + write) bytes / s */
    double weight_bytes;    /* device memory of weights */
    double workspace_bytes; /* step workspace at the largest case (and FP8 layers' scratch) */
    double kv_bytes;        /* both KV pools */
    int32_t n_cases;
    gptoss_bench_case cases[GPTOSS_BENCH_MAX_CASES];
} gptoss_bench_report;

gptoss_status gptoss_cuda_bench(const gptoss_bench_request *request, gptoss_bench_report *report,
                                gptoss_error *error);

#ifdef __cplusplus
}
#endif

#endif
