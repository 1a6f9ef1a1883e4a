/*
 * context.cu - the launchers' per-device context (gptoss_cuda_kernel_ctx, cuda_kernels.h):
 * its initial values from the tuning, and the calling thread's current one, which launch_pdl
 * (ptx.cuh) and the variant choices read. Owns each thread's default context.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gptoss_cuda_kernel_ctx_init(gptoss_cuda_kernel_ctx *kc, const gptoss_cuda_tuning *tuning) {
    gptoss_cuda_tuning defaults;
    if (!tuning) {
        gptoss_cuda_tuning_default(&defaults);
        tuning = &defaults;
    }
    memset(kc, 0, sizeof *kc);
    kc->gemv_kernel = tuning->gemv_kernel;
    kc->adc_warps = tuning->adc_warps;
    kc->moe_pair_kernel = tuning->moe_pair_kernel;
    kc->moe_inflight = tuning->moe_inflight;
    kc->moe_inflight_report = tuning->moe_inflight_report;
    kc->moe_wg_min = tuning->moe_wg_min;
    kc->moe_pair_tokens = tuning->moe_pair_tokens;
    kc->moe_max_tile = tuning->moe_max_tile;
    kc->moe_tile_pct = tuning->moe_tile_pct;
    kc->moe_bi_max_tile = tuning->bi_moe_tile;
    kc->moe_mma_stage_kb = tuning->moe_mma_stage_kb;
    kc->moe_mma_slab = tuning->moe_mma_slab;
}

cudaError_t gptoss_cuda_query_caps(int ordinal, gptoss_cuda_caps *caps, char *name,
                                   size_t name_size) {
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, ordinal);
    if (e != cudaSuccess) return e;
    /* integrated: the driver says so, or the GPU walks the host's page tables and is no
     * datacenter part with memory of its own (GH200 and GB200 walk them too, but their HBM is
     * several times faster than their host memory; GB10 and Thor have one memory) */
    const bool integrated = prop.integrated != 0 ||
                            (prop.pageableMemoryAccessUsesHostPageTables != 0 && prop.major >= 11);
    *caps = gptoss_cuda_caps_of(prop.major, prop.minor, prop.sharedMemPerBlockOptin,
                                prop.sharedMemPerMultiprocessor, integrated);
    if (name && name_size) snprintf(name, name_size, "%s", prop.name);
    return cudaSuccess;
}

/* The default context's capabilities: the current device's, limited to the variable's
 * profile. Without a GPU they stay cleared (nothing that needs one is chosen). */
static void default_caps(gptoss_cuda_caps *caps, int tuning_profile) {
    int dev = 0;
    char name[256] = "";
    gptoss_cuda_caps device;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        gptoss_cuda_query_caps(dev, &device, name, sizeof name) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    gptoss_cuda_profile profile = GPTOSS_CUDA_PROFILE_AUTO;
    gptoss_error error;
    if (gptoss_cuda_profile_resolve(GPTOSS_CUDA_PROFILE_AUTO, tuning_profile, &profile, &error) !=
            GPTOSS_OK ||
        gptoss_cuda_caps_limit(&device, profile, name, caps, &error) != GPTOSS_OK) {
        fprintf(stderr, "gptoss: %s\n", error.message);
        exit(2);
    }
}

static thread_local gptoss_cuda_kernel_ctx *current_ctx;
static thread_local gptoss_cuda_kernel_ctx default_ctx;
static thread_local bool default_ready;

void gptoss_cuda_kernel_ctx_bind(gptoss_cuda_kernel_ctx *kc) {
    current_ctx = kc;
}

void gptoss_cuda_kernel_ctx_unbind(const gptoss_cuda_kernel_ctx *kc) {
    if (current_ctx == kc) current_ctx = NULL;
}

gptoss_cuda_kernel_ctx *gptoss_cuda_kernel_ctx_current(void) {
    if (current_ctx) return current_ctx;
    if (!default_ready) { /* no backend here (the GPU tests): the tuning variables, or defaults */
        gptoss_cuda_tuning tuning;
        gptoss_error error;
        if (gptoss_cuda_tuning_init(&tuning, NULL, &error) != GPTOSS_OK) {
            fprintf(stderr, "gptoss: %s\n", error.message); /* a forced profile must not pass */
            exit(2);
        }
        gptoss_cuda_kernel_ctx_init(&default_ctx, &tuning);
        default_caps(&default_ctx.caps, tuning.device_profile);
        default_ready = true;
    }
    return &default_ctx;
}

void gptoss_cuda_set_pdl(bool on) {
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    kc->pdl = on && kc->caps.pdl; /* never above the profile */
}
bool gptoss_cuda_pdl_enabled(void) {
    return gptoss_cuda_kernel_ctx_current()->pdl;
}

const gptoss_cuda_caps *gptoss_cuda_caps_current(void) {
    return &gptoss_cuda_kernel_ctx_current()->caps;
}

cudaError_t gptoss_cuda_kernel_smem(const void *kernel, size_t bytes) {
    if (bytes > gptoss_cuda_kernel_ctx_current()->caps.smem_per_block) return cudaErrorInvalidValue;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}
