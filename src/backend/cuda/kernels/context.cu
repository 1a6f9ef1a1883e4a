/*
 * context.cu - the launchers' per-device context (gptoss_cuda_kernel_ctx, cuda_kernels.h):
 * its initial values from the tuning, and the calling thread's current one, which launch_pdl
 * (ptx.cuh) and the variant choices read. Owns each thread's default context.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/tuning.h"

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
}

static thread_local gptoss_cuda_kernel_ctx *current_ctx;
static thread_local gptoss_cuda_kernel_ctx default_ctx;
static thread_local bool default_ready;

void gptoss_cuda_kernel_ctx_bind(gptoss_cuda_kernel_ctx *kc) {
    current_ctx = kc;
}

gptoss_cuda_kernel_ctx *gptoss_cuda_kernel_ctx_current(void) {
    if (current_ctx) return current_ctx;
    if (!default_ready) { /* no backend here (the GPU tests): the tuning variables, or defaults */
        gptoss_cuda_tuning tuning;
        gptoss_error error;
        if (gptoss_cuda_tuning_init(&tuning, NULL, &error) != GPTOSS_OK)
            gptoss_cuda_tuning_default(&tuning);
        gptoss_cuda_kernel_ctx_init(&default_ctx, &tuning);
        default_ready = true;
    }
    return &default_ctx;
}

void gptoss_cuda_set_pdl(bool on) {
    gptoss_cuda_kernel_ctx_current()->pdl = on;
}
bool gptoss_cuda_pdl_enabled(void) {
    return gptoss_cuda_kernel_ctx_current()->pdl;
}
