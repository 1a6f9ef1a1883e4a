/*
 * dispatch.cu - the MXFP4 mixture-of-experts MLP on the GPU: which path runs a step (the
 * choice rule), the launch, the per-device preparation and the exactness check of the fp16
 * paths. The paths themselves are the other files of kernels/moe/ (moe.h names them).
 *
 * Weights stay MXFP4 in device memory in the checkpoint's layout (spec 3.4): each output row
 * is H/32 groups of 16 code bytes (low nibble = even lane) plus one E8M0 scale byte per group,
 * which is already what both paths want (a group is one aligned 16-byte load). Dequantized
 * values exist only in registers (GEMV) or shared memory (GEMM), never in global memory.
 *
 * Data flow for one layer (n_pairs = n_tokens * k_top):
 *
 *   topk_idx [T, k] --route--> expert_offsets, sorted rows (token, pair), 64-row tiles
 *   (steps of few pairs: the pair paths read topk_idx directly, no route, h by pair)
 *   t [T, H] bf16 --gate_up + bias + clamped SwiGLU--> h [n_pairs, I] bf16 (by sorted row)
 *   h --down + bias--> y [T*k, H] f32 (by pair = token*k + slot; weighting happens in the
 *                                      residual kernel, so no atomics are needed)
 *
 * Must not: allocate, synchronize, or read experts no token was routed to.
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const path_names[] = {"auto",     "route_gemv", "wmma_gemm", "pair_gemv",
                                         "mma_gemm", "pair_mma",   "wgmma_gemm"};

enum gptoss_moe_path gptoss_cuda_moe_path_parse(const char *s) {
    if (!s) return GPTOSS_MOE_AUTO;
    for (int i = 0; i <= GPTOSS_MOE_WGMMA_GEMM; i++)
        if (strcmp(s, path_names[i]) == 0) return (enum gptoss_moe_path)i;
    int n = atoi(s);
    return n >= GPTOSS_MOE_ROUTE_GEMV && n <= GPTOSS_MOE_WGMMA_GEMM ? (enum gptoss_moe_path)n
                                                                    : GPTOSS_MOE_AUTO;
}

const char *gptoss_cuda_moe_path_name(enum gptoss_moe_path path) {
    return path >= GPTOSS_MOE_AUTO && path <= GPTOSS_MOE_WGMMA_GEMM ? path_names[path] : "?";
}

/* min and max of bytes (out[0] = min, out[1] = max; out starts at {255, 0}) */
static __global__ void u8_range_kernel(const uint8_t *p, size_t n, unsigned *out) {
    unsigned lo = 255, hi = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = p[i];
        lo = min(lo, v);
        hi = max(hi, v);
    }
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&out[0], lo);
        atomicMax(&out[1], hi);
    }
}

/* out[2] = max |x| as float bits (non-negative floats order like their bits; NaN -> huge) */
static __global__ void absmax_kernel(const float *x, int32_t n, unsigned *out) {
    unsigned m = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = fabsf(x[i]);
        m = max(m, v == v ? __float_as_uint(v) : 0x7f800000u);
    }
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(&out[2], m);
}

cudaError_t gptoss_cuda_moe_check_mma(gptoss_cuda_moe_weights *w, const float *input_gain,
                                      unsigned *scratch, cudaStream_t stream) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    w->mma_ok = false;
    w->pair_mma_ok = false;
    w->wg_ok = false;
    size_t E = (size_t)w->n_experts, H = (size_t)w->hidden, I = (size_t)w->intermediate;
    unsigned init[4] = {255u, 0u, 0u, 0u}, got[4];
    cudaError_t err = cudaMemcpyAsync(scratch, init, sizeof init, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return err;
    u8_range_kernel<<<512, 256, 0, stream>>>(w->gate_up_scales, E * 2 * I * (H / 32), scratch);
    u8_range_kernel<<<512, 256, 0, stream>>>(w->down_scales, E * H * (I / 32), scratch);
    if (input_gain) absmax_kernel<<<8, 256, 0, stream>>>(input_gain, (int32_t)H, scratch);
    err = cudaMemcpyAsync(got, scratch, sizeof got, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) return err;
    float gain_f;
    memcpy(&gain_f, &got[2], sizeof gain_f);
    double gain = gain_f;
    double in_bound = sqrt((double)H) * gain,
           h_bound = (double)w->swiglu_limit * ((double)w->swiglu_limit + 1.0);
    bool fp16_ok = in_bound < 32768.0 && isfinite(h_bound) && h_bound < 32768.0 && H % 32 == 0 &&
                   I % 32 == 0 && (int32_t)H <= kc->moe_prepared_width &&
                   (int32_t)I <= kc->moe_prepared_width;
    w->mma_ok = fp16_ok && got[0] >= 104 && got[1] <= 128;
    w->wg_ok = w->mma_ok && kc->moe_wg_ok && H % 64 == 0 && I % 64 == 0;
    w->pair_mma_ok =
        fp16_ok && got[1] <= 240; /* scales applied in fp32: 2^(s - 113) must be finite */
    return cudaSuccess;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

/* The wgmma GEMM where experts average at least GPTOSS_CUDA_MOE_WG_MIN rows (default 24): its
 * MMAs are at least 32 columns wide, the mma GEMM's 8. Measured on an H100 (bench -b, depth 512):
 * at 8 and 12 rows per expert (120b x256, x384) the wgmma GEMM was 16% and 15% slower, at 32 (20b
 * x256) 7.5% faster; 24 sits between. */
static bool wg_worth(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    const int32_t min_avg = gptoss_cuda_kernel_ctx_current()->moe_wg_min;
    int32_t pairs = n_tokens * k_top;
    int32_t active = pairs < n_experts ? pairs : n_experts;
    return active > 0 && pairs >= (int64_t)min_avg * active;
}

/*
 * The pair mma for steps of several tokens while their pairs number at most 7/8 of the experts: one
 * block per (pair, 16 rows), so an expert that several tokens chose is read once per pair, where
 * the mma GEMM reads it once. The mma GEMM's blocks each stream 192 rows through a 4-stage pipeline
 * and spend instructions on 8-row tiles that hold one or two rows here, while the pair mma's many
 * small blocks keep more copies in flight. On an H100 the two cross near 112 pairs for 120b (128
 * experts) and 36 for 20b (32 experts) (see bench/CUDA.md, "MoE dispatch: pair mma against the mma
 * GEMM"). GPTOSS_CUDA_MOE_PAIR_TOKENS=N replaces the rule by "up to N tokens" (1: one token only,
 * as before), for measurements.
 */
static bool pair_path_worth(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    const int32_t max_tokens = gptoss_cuda_kernel_ctx_current()->moe_pair_tokens;
    int64_t pairs = (int64_t)n_tokens * k_top;
    if (pairs > GPTOSS_MOE_PAIR5_MAX) return false;
    return max_tokens > 0 ? n_tokens <= max_tokens : 8 * pairs <= 7 * (int64_t)n_experts;
}

enum gptoss_moe_path gptoss_cuda_moe_choose_path(int forced, int32_t n_tokens, int32_t k_top,
                                                 const gptoss_cuda_moe_weights *w) {
    enum gptoss_moe_path path = GPTOSS_MOE_AUTO;
    if (forced >= GPTOSS_MOE_ROUTE_GEMV && forced <= GPTOSS_MOE_WGMMA_GEMM)
        path = (enum gptoss_moe_path)forced;
    bool few = n_tokens * k_top <= GPTOSS_MOE_PAIR_MAX;
    if (path == GPTOSS_MOE_PAIR_GEMV && !few) path = GPTOSS_MOE_AUTO; /* too many pairs */
    if (path == GPTOSS_MOE_PAIR_MMA && n_tokens * k_top > GPTOSS_MOE_PAIR5_MAX)
        path = GPTOSS_MOE_AUTO;
    if (path == GPTOSS_MOE_AUTO && n_tokens > 1 && w->pair_mma_ok &&
        pair_path_worth(n_tokens, k_top, w->n_experts))
        return GPTOSS_MOE_PAIR_MMA;
    if (path == GPTOSS_MOE_WGMMA_GEMM && !w->wg_ok)
        path = GPTOSS_MOE_MMA_GEMM; /* no sm_90 here, or widths it does not take */
    if (path == GPTOSS_MOE_MMA_GEMM && !w->mma_ok)
        path = GPTOSS_MOE_AUTO; /* not exact for this layer */
    if (path == GPTOSS_MOE_PAIR_MMA && !w->pair_mma_ok)
        path = few ? GPTOSS_MOE_PAIR_GEMV : GPTOSS_MOE_AUTO;
    if (path != GPTOSS_MOE_AUTO) return path;
    if (n_tokens == 1 && few) return w->pair_mma_ok ? GPTOSS_MOE_PAIR_MMA : GPTOSS_MOE_PAIR_GEMV;
    if (w->wg_ok && wg_worth(n_tokens, k_top, w->n_experts)) return GPTOSS_MOE_WGMMA_GEMM;
    if (w->mma_ok) return GPTOSS_MOE_MMA_GEMM;
    /* Measured on an H100 (120b shape, batched decode of ~87 tokens, ~2.7 rows per expert):
     * the GEMV path took 95.6 ms per step against 85.0 for the GEMM, although the GEMM's
     * 64-row tiles are mostly empty there; both are instruction-bound at that size. So the
     * GEMV only for small steps, whatever the expert count. */
    return n_tokens <= 16 ? GPTOSS_MOE_ROUTE_GEMV : GPTOSS_MOE_WMMA_GEMM;
}

void gptoss_cuda_moe(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                     int32_t k_top, const int32_t *topk_idx, const gptoss_cuda_route *route,
                     void *h_mem, float *y, int forced, cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    if (n_pairs <= 0) return;
    bf16 *h = (bf16 *)h_mem;
    switch (gptoss_cuda_moe_choose_path(forced, n_tokens, k_top, w)) {
    case GPTOSS_MOE_WGMMA_GEMM:
        gptoss_moe_wgmma_gemm(w, t, n_tokens, k_top, route, (__half *)h_mem, y, stream);
        break;
    case GPTOSS_MOE_PAIR_MMA:
        gptoss_moe_pair_mma(w, t, topk_idx, n_pairs, k_top, (__half *)h_mem, y, stream);
        break;
    case GPTOSS_MOE_MMA_GEMM:
        gptoss_moe_mma_gemm(w, t, n_tokens, k_top, route, (__half *)h_mem, y, stream);
        break;
    case GPTOSS_MOE_PAIR_GEMV:
        gptoss_moe_pair_gemv(w, t, topk_idx, n_pairs, k_top, h, y, stream);
        break;
    case GPTOSS_MOE_ROUTE_GEMV:
        gptoss_moe_route_gemv(w, t, n_tokens, n_pairs, route, h, y, stream);
        break;
    default:
        gptoss_moe_wmma_gemm(w, t, n_pairs, route, h, y, stream);
        break;
    }
}

cudaError_t gptoss_cuda_moe_prepare(int32_t hidden, int32_t intermediate) {
    int32_t widest = hidden > intermediate ? hidden : intermediate;
    if (widest > 32 * 32 * MOE_ROUTE_GEMV_GROUPS_PER_LANE) return cudaErrorInvalidValue;
    cudaError_t err = gptoss_moe_route_gemv_prepare(widest);
    if (err == cudaSuccess) err = gptoss_moe_pair_gemv_prepare(widest);
    if (err == cudaSuccess) err = gptoss_moe_mma_gemm_prepare(widest);
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    if (err == cudaSuccess)
        kc->moe_prepared_width = widest; /* the mma kernels' shared-memory limits */
    if (err == cudaSuccess) (void)gptoss_moe_slab_prepare(widest);
    /* GPTOSS_MOE_WGMMA_GEMM: where the context's capabilities have wgmma (compute capability
     * 9.0, its kernels are built for sm_90a alone; not under a lower profile), and only where
     * the shared memory is granted; otherwise the other paths run */
    bool wg = err == cudaSuccess && kc->caps.wgmma && hidden % 64 == 0 && intermediate % 64 == 0;
    if (wg) wg = gptoss_moe_wgmma_gemm_prepare(widest);
    if (err == cudaSuccess)
        (void)cudaGetLastError(); /* a refused wgmma attribute is not an error */
    kc->moe_wg_ok = wg; /* the wgmma GEMM runs here: sm_90, widths multiple of 64, smem granted */
    gptoss_moe_pair_mma_prepare(err == cudaSuccess);
    if (err == cudaSuccess) (void)cudaGetLastError();
    return err;
}
