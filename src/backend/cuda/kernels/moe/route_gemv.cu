/*
 * route_gemv.cu - GPTOSS_MOE_ROUTE_GEMV: the decode GEMV over a route, up to 8 tokens per pass.
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

/* ---- GEMV path (decode) ------------------------------------------------------------------ */

/*
 * Grid (row-pair groups, active-expert slot); 8 warps. The block stages the activations of
 * up to MAXT rows routed to its expert in shared memory; each warp then owns one pair of
 * weight rows (gate_up: rows 2u and 2u+1, i.e. the gate and up of unit u; down: rows 2u and
 * 2u+1 of the output). Lane l takes groups l, l+32, l+64, l+96 of both rows and issues all of
 * their 16-byte code loads and scale loads before any arithmetic, so up to 8 loads per lane
 * are in flight (the decode step is bound by how fast expert bytes stream in). The 32 values
 * of a group are dequantized in registers and multiplied into every staged token's
 * accumulator; a warp reduction finishes each row. Weights are read once per expert per pass
 * of MAXT tokens.
 */

template <bool GATE_UP, int MAXT>
static __global__ void __launch_bounds__(MOE_ROUTE_GEMV_WARPS * 32)
    moe_gemv_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                    const bf16 *act, const int32_t *act_rows_sorted_token, int32_t k_in,
                    int32_t n_out_rows, gptoss_cuda_route route, float limit, float alpha,
                    bf16 *h_out, float *y_out) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    bf16 *xs = (bf16 *)gemv_smem; /* [MAXT][k_in] */
    int e = route.active_experts[blockIdx.y];
    if (e < 0) return;
    int row_begin = route.expert_offsets[e], row_end = route.expert_offsets[e + 1];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n_groups = k_in / 32;
    size_t row_bytes = (size_t)n_groups * 16;
    int unit = blockIdx.x * MOE_ROUTE_GEMV_WARPS + warp;
    bool active = 2 * unit < n_out_rows;
    int row0 = 2 * unit;
    const uint8_t *eb = blocks + ((size_t)e * n_out_rows + row0) * row_bytes;
    const uint8_t *es = scales + ((size_t)e * n_out_rows + row0) * n_groups;
    const float *ebias = bias + (size_t)e * n_out_rows;

    /* all loads of this warp's two rows first */
    uint4 codes[2][MOE_ROUTE_GEMV_GROUPS_PER_LANE];
    uint8_t scl[2][MOE_ROUTE_GEMV_GROUPS_PER_LANE];
#pragma unroll
    for (int gi = 0; gi < MOE_ROUTE_GEMV_GROUPS_PER_LANE; gi++) {
        int g = lane + 32 * gi;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (active && g < n_groups) {
                codes[r][gi] = __ldg((const uint4 *)(eb + r * row_bytes + (size_t)g * 16));
                scl[r][gi] = __ldg(es + (size_t)r * n_groups + g);
            } else {
                codes[r][gi] = make_uint4(0, 0, 0, 0);
                scl[r][gi] = 127;
            }
        }
    }

    for (int r0 = row_begin; r0 < row_end; r0 += MAXT) {
        int cnt = min(MAXT, row_end - r0);
        __syncthreads();
        for (int c = 0; c < cnt; c++) {
            /* gate_up reads the token's normalized input; down reads the sorted h row */
            const bf16 *src = GATE_UP ? act + (size_t)act_rows_sorted_token[r0 + c] * k_in
                                      : act + (size_t)(r0 + c) * k_in;
            /* 16-byte chunk q of group g lands at chunk q ^ ((g >> 1) & 3): lanes reading the
             * same chunk of consecutive groups then hit 8 different bank quads */
            for (int ci = threadIdx.x; ci < k_in / 8; ci += blockDim.x) {
                int g = ci >> 2, q = ci & 3;
                *(uint4 *)(xs + (size_t)c * k_in + g * 32 + ((q ^ ((g >> 1) & 3)) * 8)) =
                    *(const uint4 *)(src + ci * 8);
            }
        }
        __syncthreads();
        if (!active) continue;
        float acc[2][MAXT];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int c = 0; c < MAXT; c++)
                acc[r][c] = 0.0f;
#pragma unroll
        for (int gi = 0; gi < MOE_ROUTE_GEMV_GROUPS_PER_LANE; gi++) {
            int g = lane + 32 * gi;
            if (g >= n_groups) break;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                /* dequantize 8 codes at a time and use them at once for every token, so only
                 * 8 weights are live (keeps the kernel out of local memory) */
                float hi, lo;
                e8m0_split(scl[r][gi], &hi, &lo);
                const uint4 cg = codes[r][gi];
                float part[MAXT];
#pragma unroll
                for (int c = 0; c < MAXT; c++)
                    part[c] = 0.0f;
#pragma unroll 1
                for (int q = 0; q < 4; q++) { /* not unrolled: bounds the live registers */
                    float w8[8];
                    uint32_t word = q == 0 ? cg.x : q == 1 ? cg.y : q == 2 ? cg.z : cg.w;
                    fp4x8_to_float(word, hi, w8);
#pragma unroll
                    for (int c = 0; c < MAXT; c++) {
                        if (c >= cnt) break;
                        /* 128-bit shared load of the 8 matching inputs (swizzled, see staging) */
                        uint4 xq =
                            ((const uint4 *)(xs + (size_t)c * k_in + g * 32))[q ^ ((g >> 1) & 3)];
                        const uint32_t xw[4] = {xq.x, xq.y, xq.z, xq.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            float x0 = __uint_as_float(xw[j] << 16),
                                  x1 = __uint_as_float(xw[j] & 0xffff0000u);
                            part[c] += w8[2 * j] * x0 + w8[2 * j + 1] * x1;
                        }
                    }
                }
#pragma unroll
                for (int c = 0; c < MAXT; c++)
                    acc[r][c] += part[c] * lo;
            }
        }
#pragma unroll
        for (int c = 0; c < MAXT; c++) {
            if (c >= cnt) break;
            float v0 = acc[0][c], v1 = acc[1][c];
            for (int o = 16; o > 0; o >>= 1) {
                v0 += __shfl_xor_sync(0xffffffffu, v0, o);
                v1 += __shfl_xor_sync(0xffffffffu, v1, o);
            }
            if (lane == 0) {
                if (GATE_UP) {
                    float gate = v0 + ebias[row0], up = v1 + ebias[row0 + 1];
                    h_out[(size_t)(r0 + c) * (n_out_rows / 2) + unit] =
                        __float2bfloat16(swiglu(gate, up, limit, alpha));
                } else {
                    float *yr = y_out + (size_t)route.sorted_pair[r0 + c] * n_out_rows;
                    yr[row0] = v0 + ebias[row0];
                    yr[row0 + 1] = v1 + ebias[row0 + 1];
                }
            }
        }
    }
}

template <int MAXT>
static void launch_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t,
                        const gptoss_cuda_route *route, int32_t slots, bf16 *h, float *y,
                        cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    size_t smem_gu = (size_t)MAXT * H * sizeof(bf16);
    size_t smem_dn = (size_t)MAXT * I * sizeof(bf16);
    dim3 g1((I + MOE_ROUTE_GEMV_WARPS - 1) / MOE_ROUTE_GEMV_WARPS,
            slots); /* one unit (2 rows) per warp */
    moe_gemv_kernel<true, MAXT><<<g1, MOE_ROUTE_GEMV_WARPS * 32, smem_gu, stream>>>(
        w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias, t, route->sorted_token, H, 2 * I,
        *route, w->swiglu_limit, w->swiglu_alpha, h, nullptr);
    dim3 g2((H / 2 + MOE_ROUTE_GEMV_WARPS - 1) / MOE_ROUTE_GEMV_WARPS, slots);
    moe_gemv_kernel<false, MAXT><<<g2, MOE_ROUTE_GEMV_WARPS * 32, smem_dn, stream>>>(
        w->down_blocks, w->down_scales, w->down_bias, h, nullptr, I, H, *route, w->swiglu_limit,
        w->swiglu_alpha, nullptr, y);
}

void gptoss_moe_route_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                           int32_t n_pairs, const gptoss_cuda_route *route, bf16 *h, float *y,
                           cudaStream_t stream) {
    int32_t slots = n_pairs < w->n_experts ? n_pairs : w->n_experts;
    if (n_tokens <= 1)
        launch_gemv<1>(w, t, route, slots, h, y, stream);
    else if (n_tokens <= 2)
        launch_gemv<2>(w, t, route, slots, h, y, stream);
    else if (n_tokens <= 4)
        launch_gemv<4>(w, t, route, slots, h, y, stream);
    else
        launch_gemv<8>(w, t, route, slots, h, y, stream);
}

/* Raises the kernels' dynamic shared-memory limit (hidden sizes above 3072). */
cudaError_t gptoss_moe_route_gemv_prepare(int32_t widest) {
    int bytes = (int)(MOE_ROUTE_GEMV_MAX_TOKENS * widest * sizeof(bf16));
    cudaError_t err = cudaSuccess;
#define RAISE(GU, T)                                                                               \
    if (err == cudaSuccess)                                                                        \
        err = gptoss_cuda_kernel_smem((const void *)moe_gemv_kernel<GU, T>, bytes);
    RAISE(true, 1)
    RAISE(true, 2)
    RAISE(true, 4)
    RAISE(true, 8)
    RAISE(false, 1)
    RAISE(false, 2)
    RAISE(false, 4)
    RAISE(false, 8)
#undef RAISE
    return err;
}
