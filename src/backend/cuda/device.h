/*
 * device.h - one GPU as the backend sees it (CUDA C++ only): its ordinal, what it can run,
 * and the kernel set-up done for it.
 *
 * A backend state owns one gptoss_cuda_device; nothing about a device is process-wide, so two
 * backends on two GPUs (or on one) keep their own capabilities and launch settings. The
 * kernel launchers read what they need from its kernel context (cuda_kernels.h: what the
 * *_prepare calls found, the variant choices, PDL); gptoss_cuda_device_bind makes a device the
 * calling thread's current one (cudaSetDevice) together with that context, and every backend
 * entry point calls it first, as CUDA's own current device is per thread.
 */
#ifndef GPTOSS_CUDA_DEVICE_H
#define GPTOSS_CUDA_DEVICE_H

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/tuning.h"

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "model/config.h"
#include "util/error.h"
}

typedef struct gptoss_cuda_device {
    int32_t ordinal;              /* CUDA device ordinal */
    char name[256];               /* as the driver reports it */
    gptoss_cuda_profile profile;  /* the profile asked for (AUTO: the device's own paths) */
    gptoss_cuda_caps device_caps; /* what the device has */
    /* What the kernels may use: device_caps limited to the profile. Every kernel choice
     * follows from these (copied into kernels.caps), never from the device directly. */
    int sm;                         /* compute capability as 10 * major + minor (80, 90, ...) */
    int32_t n_sms;                  /* multiprocessors (the device's, whatever the profile) */
    size_t smem_per_block;          /* shared memory a block may opt in to, bytes */
    size_t smem_per_sm;             /* shared memory per multiprocessor, bytes */
    bool has_pdl;                   /* programmatic dependent launch (sm_90 or newer) */
    bool fp8;                       /* FP8 conversion / tensor cores (sm_89 or newer) */
    bool tma;                       /* bulk copies (sm_90 or newer) */
    bool wgmma;                     /* warpgroup MMA (9.0 only) */
    bool integrated;                /* shares the host's memory */
    bool pdl;                       /* launches use it: has_pdl and the pdl knob */
    bool attn_decode;               /* the tensor-core decode attention kernel is set up for this
                                     * model's head_dim (and the attn_decode knob is on) */
    gptoss_cuda_kernel_ctx kernels; /* the launchers' context: capabilities found by the
                                     * *_prepare calls, variant choices from the tuning, PDL */
} gptoss_cuda_device;

/* Checks that ordinal exists and is compute capability 8.0 or newer, makes it current, and
 * fills dev from its properties limited to the profile (refused when the profile is above the
 * device; the tuning's device_profile, when given, overrides `profile`) and the tuning (launch
 * settings). Binds nothing: dev may be copied before gptoss_cuda_device_bind. */
gptoss_status gptoss_cuda_device_open(gptoss_cuda_device *dev, int32_t ordinal,
                                      gptoss_cuda_profile profile, const gptoss_cuda_tuning *tuning,
                                      gptoss_error *error);

/* Binds dev, sets the kernels' function attributes (shared-memory limits) for a model of
 * config's shape and records in dev->kernels which kernels can run; before any launch or
 * graph capture. */
gptoss_status gptoss_cuda_device_prepare(gptoss_cuda_device *dev, const gptoss_config *config,
                                         const gptoss_cuda_tuning *tuning, bool fp8_layers,
                                         gptoss_error *error);

/* Logs (INFO) the profile and the kernel paths prepare chose, one line. */
void gptoss_cuda_device_log_paths(const gptoss_cuda_device *dev, const gptoss_config *config,
                                  bool fp8_layers, bool kv_fp8);

/* Makes dev the calling thread's current device, with its kernel context. */
gptoss_status gptoss_cuda_device_bind(gptoss_cuda_device *dev, gptoss_error *error);

/* Unbinds dev's kernel context from the calling thread if it is the current one (before dev
 * is freed). */
void gptoss_cuda_device_unbind(gptoss_cuda_device *dev);

/* Formats a CUDA error into *error. */
gptoss_status gptoss_cuda_error(gptoss_error *error, cudaError_t code, const char *what);

/* cudaMalloc with an error that says how much was asked and how much is free. */
gptoss_status gptoss_cuda_alloc(void **p, size_t bytes, const char *what, gptoss_error *error);

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t cuda_try_code_ = (call);                                                       \
        if (cuda_try_code_ != cudaSuccess) return gptoss_cuda_error(error, cuda_try_code_, what);  \
    } while (0)

#endif
