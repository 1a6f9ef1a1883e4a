/*
 * pair_gemv.cu - GPTOSS_MOE_PAIR_GEMV: one or two decode tokens, one pass per (token, expert)
 * pair on the CUDA cores; no route.
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

/* ---- pair GEMV path (one or two decode tokens) -------------------------------------------- */

/*
 * For a handful of (token, expert) pairs no grouping pays off: every pair reads its expert's
 * weights once anyway, so the pair path skips the route kernel and reads topk_idx directly.
 * Grid (blocks per pair, pair); 8 warps; each warp walks units (two weight rows: gate and up
 * of one intermediate unit, or two output rows of down) grid-stride within its pair, with
 * the next unit's code and scale loads issued before the current unit's arithmetic (two
 * units in registers, so the memory pipe never idles while a warp computes).
 *
 * Cost per weight is what limits this kernel once the loads overlap, so the arithmetic is
 * trimmed:
 *   - the input vector is staged once per block in shared memory as fp32 multiplied by
 *     2^100 (exact), swizzled so that lanes reading the same 16-byte chunk of consecutive
 *     groups hit different banks; one 128-bit shared load feeds 4 weights of both rows;
 *   - a code becomes the float fp4 * 2^-126 by two shifts and masks (sign to bit 31,
 *     e1 e0 m to bits 24..22; e = 0 lands on the subnormal 0.5 * 2^-126 exactly);
 *   - products fp4 * 2^-126 * x * 2^100 = fp4 * x * 2^-26 stay normal for |fp4 x| >= 2^-100,
 *     and the E8M0 scale multiplies each group's sum once: value = sum * 2^(s - 101).
 */

/* 2^(s - 101) as hi * lo (both finite for every byte; lo = 1 up to s = 228). */
static __device__ __forceinline__ void pair_scale(uint32_t s, float *hi, float *lo) {
    uint32_t a = s < 228u ? s : 228u;
    *hi = __uint_as_float((a + 26u) << 23);
    *lo = __uint_as_float(((s > 228u ? s : 228u) - 101u) << 23);
}

/* Code k (bits 4k..4k+3 of w) as fp4 * 2^-126. k is a compile-time constant after unrolling. */
static __device__ __forceinline__ float fp4_code_f(uint32_t w, int k) {
    uint32_t sgn = (w << (28 - 4 * k)) & 0x80000000u;
    uint32_t mag = k <= 5 ? (w << (22 - 4 * k)) & 0x01C00000u : (w >> (4 * k - 22)) & 0x01C00000u;
    return __uint_as_float(sgn | mag);
}

template <bool GATE_UP>
static __global__ void __launch_bounds__(MOE_PAIR_GEMV_WARPS * 32, 2)
    moe_pair_gemv_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                         const bf16 *act, const int32_t *topk_idx, int32_t k_top, int32_t k_in,
                         int32_t n_out_rows, float limit, float alpha, bf16 *h_out, float *y_out) {
    extern __shared__ __align__(16) float4 pg_xs[]; /* [k_in / 4], swizzled per group */
    const int pair = blockIdx.y;
    pdl_wait(); /* topk_idx comes from the router, the input from the norm or gate_up */
    const int e = topk_idx[pair];
    if (e < 0) return; /* another GPU's expert */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_groups = k_in >> 5, n_units = n_out_rows >> 1;
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    const int stride = gridDim.x * MOE_PAIR_GEMV_WARPS;
    int u = blockIdx.x * MOE_PAIR_GEMV_WARPS + warp;

    uint4 cur[2][MOE_PAIR_GEMV_GROUPS_PER_LANE];
    uint32_t cs[2][MOE_PAIR_GEMV_GROUPS_PER_LANE];
    auto load_unit = [&](int unit, uint4(&c)[2][MOE_PAIR_GEMV_GROUPS_PER_LANE],
                         uint32_t(&sc)[2][MOE_PAIR_GEMV_GROUPS_PER_LANE]) {
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int gi = 0; gi < MOE_PAIR_GEMV_GROUPS_PER_LANE; gi++) {
                int g = lane + 32 * gi;
                if (unit < n_units && g < n_groups) {
                    size_t row = 2 * (size_t)unit + r;
                    c[r][gi] = __ldg((const uint4 *)(eb + row * row_bytes + (size_t)g * 16));
                    sc[r][gi] = __ldg(es + row * n_groups + g);
                } else {
                    c[r][gi] = make_uint4(0, 0, 0, 0);
                    sc[r][gi] = 127;
                }
            }
    };
    load_unit(u, cur, cs); /* in flight while the input is staged */

    const bf16 *src = GATE_UP ? act + (size_t)(pair / k_top) * k_in : act + (size_t)pair * k_in;
    for (int ci = threadIdx.x; ci < (k_in >> 3); ci += blockDim.x) {
        uint4 v = *(const uint4 *)(src + (size_t)ci * 8);
        int g = ci >> 2, q = ci & 3, sw = g & 7;
        const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
        float f[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            f[2 * j] = __uint_as_float(vw[j] << 16) * 0x1p100f;
            f[2 * j + 1] = __uint_as_float(vw[j] & 0xffff0000u) * 0x1p100f;
        }
        pg_xs[g * 8 + ((2 * q) ^ sw)] = make_float4(f[0], f[1], f[2], f[3]);
        pg_xs[g * 8 + ((2 * q + 1) ^ sw)] = make_float4(f[4], f[5], f[6], f[7]);
    }
    __syncthreads();

    const float *ebias = bias + (size_t)e * n_out_rows;
    for (; u < n_units; u += stride) {
        uint4 nxt[2][MOE_PAIR_GEMV_GROUPS_PER_LANE];
        uint32_t ns[2][MOE_PAIR_GEMV_GROUPS_PER_LANE];
        load_unit(u + stride, nxt, ns);
        float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
        for (int gi = 0; gi < MOE_PAIR_GEMV_GROUPS_PER_LANE; gi++) {
            int g = lane + 32 * gi;
            if (g < n_groups) {
                const float4 *xg = pg_xs + g * 8;
                int sw = g & 7;
                const uint32_t w0[4] = {cur[0][gi].x, cur[0][gi].y, cur[0][gi].z, cur[0][gi].w};
                const uint32_t w1[4] = {cur[1][gi].x, cur[1][gi].y, cur[1][gi].z, cur[1][gi].w};
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float4 xa = xg[(2 * q) ^ sw], xb = xg[(2 * q + 1) ^ sw];
                    const float x8[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        s0 = fmaf(fp4_code_f(w0[q], k), x8[k], s0);
                        s1 = fmaf(fp4_code_f(w1[q], k), x8[k], s1);
                    }
                }
                float hi, lo;
                pair_scale(cs[0][gi], &hi, &lo);
                acc0 = fmaf(s0 * hi, lo, acc0);
                pair_scale(cs[1][gi], &hi, &lo);
                acc1 = fmaf(s1 * hi, lo, acc1);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
            acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
        }
        if (lane == 0) {
            if (GATE_UP) {
                float gate = acc0 + ebias[2 * u], up = acc1 + ebias[2 * u + 1];
                h_out[(size_t)pair * n_units + u] =
                    __float2bfloat16(swiglu(gate, up, limit, alpha));
            } else {
                float *yr = y_out + (size_t)pair * n_out_rows;
                yr[2 * u] = acc0 + ebias[2 * u];
                yr[2 * u + 1] = acc1 + ebias[2 * u + 1];
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int gi = 0; gi < MOE_PAIR_GEMV_GROUPS_PER_LANE; gi++) {
                cur[r][gi] = nxt[r][gi];
                cs[r][gi] = ns[r][gi];
            }
    }
}

/* Blocks per pair: enough resident warps to cover every SM twice, spread over the pairs. */
static int pair_blocks(int32_t n_pairs, int32_t n_units) {
    int &n_sms = gptoss_cuda_kernel_ctx_current()->n_sms; /* the current device's, queried once */
    if (n_sms == 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            n_sms <= 0)
            n_sms = 132;
    }
    int b = (2 * n_sms + n_pairs - 1) / n_pairs;
    int most = (n_units + MOE_PAIR_GEMV_WARPS - 1) / MOE_PAIR_GEMV_WARPS;
    return b < most ? b : most;
}

void gptoss_moe_pair_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                          int32_t n_pairs, int32_t k_top, bf16 *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    dim3 g1(pair_blocks(n_pairs, I), n_pairs);
    launch_pdl(moe_pair_gemv_kernel<true>, g1, dim3(MOE_PAIR_GEMV_WARPS * 32),
               (size_t)H * sizeof(float), stream, w->gate_up_blocks, w->gate_up_scales,
               w->gate_up_bias, t, topk_idx, k_top, H, 2 * I, w->swiglu_limit, w->swiglu_alpha, h,
               (float *)nullptr);
    dim3 g2(pair_blocks(n_pairs, H / 2), n_pairs);
    launch_pdl(moe_pair_gemv_kernel<false>, g2, dim3(MOE_PAIR_GEMV_WARPS * 32),
               (size_t)I * sizeof(float), stream, w->down_blocks, w->down_scales, w->down_bias,
               (const bf16 *)h, topk_idx, k_top, I, H, w->swiglu_limit, w->swiglu_alpha,
               (bf16 *)nullptr, y);
}

cudaError_t gptoss_moe_pair_gemv_prepare(int32_t widest) {
    cudaError_t err =
        gptoss_cuda_kernel_smem((const void *)moe_pair_gemv_kernel<true>, widest * sizeof(float));
    if (err == cudaSuccess)
        err = gptoss_cuda_kernel_smem((const void *)moe_pair_gemv_kernel<false>,
                                      widest * sizeof(float));
    return err;
}
