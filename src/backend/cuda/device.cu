/*
 * device.cu - opening a GPU for a backend: existence and capability checks, its properties,
 * the kernels' set-up into the device's kernel context, and binding both to the calling
 * thread. Owns no device memory.
 */
#include "backend/cuda/device.h"
#include "backend/cuda/kernels/attention_tc.h"
#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/dense_lowp.h"

#include <stdio.h>

extern "C" {
#include "util/log.h"
}

gptoss_status gptoss_cuda_error(gptoss_error *error, cudaError_t code, const char *what) {
    gptoss_status status =
        (code == cudaErrorMemoryAllocation) ? GPTOSS_ERR_OUT_OF_MEMORY : GPTOSS_ERR_BACKEND;
    return gptoss_set_error(error, status, "CUDA: %s failed: %s (%s)", what,
                            cudaGetErrorString(code), cudaGetErrorName(code));
}

gptoss_status gptoss_cuda_alloc(void **p, size_t bytes, const char *what, gptoss_error *error) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        return gptoss_set_error(
            error, GPTOSS_ERR_OUT_OF_MEMORY,
            "CUDA: cannot allocate %.1f MiB for %s (%.1f MiB free of %.1f MiB); use "
            "fewer KV blocks or a smaller model",
            bytes / 1048576.0, what, free_b / 1048576.0, total_b / 1048576.0);
    }
    return GPTOSS_OK;
}

extern "C" int32_t gptoss_cuda_count_devices(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n_dev;
}

extern "C" gptoss_status gptoss_cuda_check_device(int32_t ordinal, gptoss_error *error) {
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        return gptoss_set_error(error, GPTOSS_ERR_BACKEND, "CUDA: no usable GPU (%s)",
                                ce != cudaSuccess ? cudaGetErrorString(ce) : "device count is 0");
    }
    if (ordinal < 0 || ordinal >= n_dev)
        return gptoss_set_error(error, GPTOSS_ERR_INVALID_ARGUMENT,
                                "CUDA: device %d does not exist (this machine has %d)", ordinal,
                                n_dev);
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    if (prop.major < 8)
        return gptoss_set_error(
            error, GPTOSS_ERR_UNSUPPORTED,
            "CUDA: %s is compute capability %d.%d; gptoss needs 8.0 or newer (bf16 "
            "tensor cores)",
            prop.name, prop.major, prop.minor);
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_device_open(gptoss_cuda_device *dev, int32_t ordinal,
                                      gptoss_cuda_profile profile, const gptoss_cuda_tuning *tuning,
                                      gptoss_error *error) {
    gptoss_status st = gptoss_cuda_check_device(ordinal, error);
    if (st) return st;
    CUDA_TRY(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    dev->ordinal = ordinal;
    snprintf(dev->name, sizeof dev->name, "%s", prop.name);
    CUDA_TRY(gptoss_cuda_query_caps(ordinal, &dev->device_caps, NULL, 0), "device capabilities");
    st = gptoss_cuda_profile_resolve(profile, tuning->device_profile, &dev->profile, error);
    if (st) return st;
    gptoss_cuda_caps caps;
    st = gptoss_cuda_caps_limit(&dev->device_caps, dev->profile, dev->name, &caps, error);
    if (st) return st;
    dev->sm = caps.sm;
    dev->n_sms = prop.multiProcessorCount;
    dev->smem_per_block = caps.smem_per_block;
    dev->smem_per_sm = caps.smem_per_sm;
    dev->has_pdl = caps.pdl;
    dev->fp8 = caps.fp8;
    dev->tma = caps.tma;
    dev->wgmma = caps.wgmma;
    dev->integrated = caps.integrated;
    dev->pdl = dev->has_pdl && tuning->pdl;
    gptoss_cuda_kernel_ctx_init(&dev->kernels, tuning);
    dev->kernels.caps = caps;
    dev->kernels.pdl = dev->pdl;
    return GPTOSS_OK;
}

gptoss_status gptoss_cuda_device_prepare(gptoss_cuda_device *dev, const gptoss_config *config,
                                         const gptoss_cuda_tuning *tuning, bool fp8_layers,
                                         gptoss_error *error) {
    gptoss_status st = gptoss_cuda_device_bind(dev, error);
    if (st) return st;
    CUDA_TRY(gptoss_cuda_moe_prepare(config->hidden_size, config->intermediate_size),
             "MoE kernel setup");
    CUDA_TRY(gptoss_cuda_router_prepare(config->hidden_size), "router kernel setup");
    CUDA_TRY(gptoss_cuda_gemv_prepare(), "GEMV kernel setup");
    /* the decode attention kernel's shared memory, set before any graph capture; a head size
     * it does not take keeps the scalar kernel */
    dev->attn_decode = tuning->attn_decode;
    if (dev->attn_decode && gptoss_cuda_attention_decode_prepare(config->head_dim) != cudaSuccess) {
        cudaGetLastError();
        dev->attn_decode = false;
    }
    if (fp8_layers) CUDA_TRY(gptoss_cuda_dense_lowp_prepare(), "FP8 GEMV setup");
    /* the batch-invariant kernels' shared memory, before any graph capture (their launchers
     * refuse where it was not granted, and the mode's GEMM then reports it) */
    if (gptoss_cuda_bi_prepare() != cudaSuccess) cudaGetLastError();
    return GPTOSS_OK;
}

void gptoss_cuda_device_log_paths(const gptoss_cuda_device *dev, const gptoss_config *config,
                                  bool fp8_layers, bool kv_fp8) {
    const gptoss_cuda_kernel_ctx *kc = &dev->kernels; /* bound by gptoss_cuda_device_prepare */
    char caps[160];
    gptoss_cuda_caps_describe(&kc->caps, caps, sizeof caps);
    const int D = config->head_dim;
    const bool wide = D >= 0 && D <= 128 && kc->adc_wide_ok[D];
    const int pair = gptoss_cuda_moe_pair_kernel();
    GPTOSS_LOG_I("cuda",
                 "%s (sm_%d), profile %s: %s; paths: GEMV %s, decode attention %s, MoE pair "
                 "kernel %s, MoE GEMM %s (tiles up to %d rows), FP8 layers %s, KV pages %s",
                 dev->name, dev->device_caps.sm, gptoss_cuda_profile_name(dev->profile), caps,
                 kc->gemv_tma_ok ? "tma+ld" : "ld",
                 !dev->attn_decode ? "scalar"
                 : wide            ? "tensor cores (4/8 warps)"
                                   : "tensor cores (4 warps)",
                 pair == GPTOSS_MOE_PAIR_FP8     ? "fp8"
                 : pair == GPTOSS_MOE_PAIR_TMA   ? "tma"
                 : pair == GPTOSS_MOE_PAIR_DENSE ? "dense"
                                                 : "wide",
                 kc->moe_wg_ok ? "wgmma+mma" : "mma", (int)kc->moe_mma_max_tile,
                 fp8_layers ? "e4m3" : "off", kv_fp8 ? "e4m3" : "bf16");
}

gptoss_status gptoss_cuda_device_bind(gptoss_cuda_device *dev, gptoss_error *error) {
    CUDA_TRY(cudaSetDevice(dev->ordinal), "cudaSetDevice");
    gptoss_cuda_kernel_ctx_bind(&dev->kernels);
    return GPTOSS_OK;
}

void gptoss_cuda_device_unbind(gptoss_cuda_device *dev) {
    gptoss_cuda_kernel_ctx_unbind(&dev->kernels);
}
