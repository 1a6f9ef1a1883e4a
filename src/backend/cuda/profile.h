/*
 * profile.h - what the CUDA kernels may use on a device (its capabilities) and the profiles
 * that limit them to an older GPU's (gptoss_cuda_profile, gptoss.h).
 *
 * Plain C with no CUDA calls, so it is tested without a GPU: device.cu fills a
 * gptoss_cuda_caps from the driver, gptoss_cuda_caps_limit narrows it to the profile asked
 * for, and every kernel choice follows from the result (the *_prepare functions read it from
 * the kernel context, cuda_kernels.h). Owns nothing.
 */
#ifndef GPTOSS_CUDA_PROFILE_H
#define GPTOSS_CUDA_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "gptoss.h"
#include "util/error.h"

typedef struct gptoss_cuda_caps {
    int32_t sm;            /* compute capability as 10 * major + minor the kernels choose for */
    size_t smem_per_block; /* shared memory a block may opt in to, bytes */
    size_t smem_per_sm;    /* shared memory per multiprocessor, bytes */
    bool pdl;              /* programmatic dependent launch (sm_90 and newer) */
    bool tma;              /* bulk copies into shared memory, cp.async.bulk (sm_90 and newer) */
    bool wgmma;            /* warpgroup MMA (compute capability 9.0 only) */
    bool fp8;              /* FP8 conversion and tensor cores (sm_89 and newer) */
    bool integrated;       /* the GPU shares the host's memory (DGX Spark, Jetson) */
} gptoss_cuda_caps;

/* The capabilities of a device of compute capability major.minor with these shared-memory
 * limits (what the driver reports). */
gptoss_cuda_caps gptoss_cuda_caps_of(int major, int minor, size_t smem_per_block,
                                     size_t smem_per_sm, bool integrated);

/* The profile's own capabilities (an A100's, an RTX 4090's, an H100's; AUTO: none). */
gptoss_cuda_caps gptoss_cuda_profile_caps(gptoss_cuda_profile profile);

/* "auto", "ampere", "ada", "hopper" (or "?"), and back (false for any other name). */
const char *gptoss_cuda_profile_name(gptoss_cuda_profile profile);
bool gptoss_cuda_profile_parse(const char *name, gptoss_cuda_profile *profile);

/* The profile to use: the tuning's device_profile when given (>= 0: the tuning string or the
 * GPTOSS_CUDA_DEVICE_PROFILE variable), else `option`; an option outside the enum is an error. */
gptoss_status gptoss_cuda_profile_resolve(gptoss_cuda_profile option, int tuning_profile,
                                          gptoss_cuda_profile *out, gptoss_error *error);

/* *out = device limited to profile (AUTO: device unchanged). Fails, naming the device and
 * what it lacks, when the profile asks for more than the device has: a newer compute
 * capability, FP8, wgmma, TMA or PDL. Shared memory is the smaller of the two limits. */
gptoss_status gptoss_cuda_caps_limit(const gptoss_cuda_caps *device, gptoss_cuda_profile profile,
                                     const char *device_name, gptoss_cuda_caps *out,
                                     gptoss_error *error);

/* One line: "sm_80, 163 KB smem/block, no PDL, no TMA, no wgmma, no FP8". */
void gptoss_cuda_caps_describe(const gptoss_cuda_caps *caps, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
