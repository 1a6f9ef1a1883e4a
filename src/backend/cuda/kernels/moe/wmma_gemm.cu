/*
 * wmma_gemm.cu - GPTOSS_MOE_WMMA_GEMM: the tiled bf16 WMMA GEMM over 64-row route tiles (the
 * fallback prefill path where the fp16 paths are not exact).
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

#include <mma.h>

using namespace nvcuda;

/* ---- tiled tensor-core path (prefill) --------------------------------------------------- */

/*
 * Grid (output-row tiles of 64, expert tiles of 64 sorted rows); 4 warps, each owning a
 * 32x32 quarter of the 64x64 output tile as 2x2 WMMA 16x16x16 bf16 fragments (fp32 acc).
 * The reduction walks one MXFP4 group (32 inputs) at a time:
 *
 *        A tile: 64 sorted rows x 32 inputs (bf16, gathered by token)   -> As
 *        B tile: 64 weight rows x 32 inputs (dequantized from 16 B + scale) -> Bs
 *        C += As * Bs^T
 *
 * Rows past the expert's end and weight rows past the matrix load as zero and are not
 * stored. Epilogue through shared memory: gate_up applies bias and the clamped SwiGLU to
 * (even, odd) column pairs, down adds the bias and scatters rows to their pair index.
 */

template <bool GATE_UP>
static __global__ void __launch_bounds__(128)
    moe_gemm_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                    const bf16 *act, int32_t k_in, int32_t n_out_rows, gptoss_cuda_route route,
                    float limit, float alpha, bf16 *h_out, float *y_out) {
    constexpr int BM = GPTOSS_MOE_TILE_M;
    __shared__ __align__(128) bf16 As[BM * MOE_WMMA_LDS];
    __shared__ __align__(128) bf16 Bs[MOE_WMMA_TILE_N * MOE_WMMA_LDS];
    __shared__ __align__(128) float Cs[BM * MOE_WMMA_LDC];
    int tile = blockIdx.y;
    int e = route.tile_expert[tile];
    if (e < 0) return;
    int r0 = route.tile_row[tile];
    int r_end = route.expert_offsets[e + 1];
    int n0 = blockIdx.x * MOE_WMMA_TILE_N;
    int tid = threadIdx.x, warp = tid >> 5;
    int n_groups = k_in / 32;
    size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;

    /* each thread loads half a row (16 values) of A and of B per step */
    int lrow = tid >> 1, lhalf = tid & 1;
    bool a_valid = r0 + lrow < r_end;
    const bf16 *a_src = nullptr;
    if (a_valid) {
        size_t src_row = GATE_UP ? (size_t)route.sorted_token[r0 + lrow] : (size_t)(r0 + lrow);
        a_src = act + src_row * k_in + lhalf * 16;
    }
    bool b_valid = n0 + lrow < n_out_rows;
    const uint8_t *b_src = eb + (size_t)(n0 + lrow) * row_bytes + lhalf * 8;
    const uint8_t *s_src = es + (size_t)(n0 + lrow) * n_groups;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    /* software pipeline: the global loads of group g+1 are in flight while group g is
     * multiplied (registers hold the next stage; shared memory the current one) */
    uint4 a0 = make_uint4(0, 0, 0, 0), a1 = a0;
    uint2 codes = make_uint2(0, 0);
    uint8_t sbyte = 127;
    if (a_valid) {
        a0 = *(const uint4 *)(a_src);
        a1 = *(const uint4 *)(a_src + 8);
    }
    if (b_valid) {
        codes = __ldg((const uint2 *)(b_src));
        sbyte = __ldg(s_src);
    }
    for (int g = 0; g < n_groups; g++) {
        *(uint4 *)(As + lrow * MOE_WMMA_LDS + lhalf * 16) = a0;
        *(uint4 *)(As + lrow * MOE_WMMA_LDS + lhalf * 16 + 8) = a1;
        __nv_bfloat162 wv[8];
        {
            float wf[16], hi, lo;
            e8m0_split(sbyte, &hi, &lo);
            fp4x8_to_float(codes.x, hi, wf);
            fp4x8_to_float(codes.y, hi, wf + 8);
#pragma unroll
            for (int b = 0; b < 8; b++)
                wv[b] = __floats2bfloat162_rn(wf[2 * b] * lo, wf[2 * b + 1] * lo);
        }
        *(uint4 *)(Bs + lrow * MOE_WMMA_LDS + lhalf * 16) = *(uint4 *)&wv[0];
        *(uint4 *)(Bs + lrow * MOE_WMMA_LDS + lhalf * 16 + 8) = *(uint4 *)&wv[4];
        __syncthreads();
        if (g + 1 < n_groups) {
            if (a_valid) {
                a0 = *(const uint4 *)(a_src + (g + 1) * 32);
                a1 = *(const uint4 *)(a_src + (g + 1) * 32 + 8);
            }
            if (b_valid) {
                codes = __ldg((const uint2 *)(b_src + (size_t)(g + 1) * 16));
                sbyte = __ldg(s_src + g + 1);
            }
        }
#pragma unroll
        for (int kk = 0; kk < MOE_WMMA_TILE_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * MOE_WMMA_LDS + kk, MOE_WMMA_LDS);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], Bs + (wn + 16 * j) * MOE_WMMA_LDS + kk, MOE_WMMA_LDS);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * MOE_WMMA_LDC + wn + 16 * j, acc[i][j],
                                    MOE_WMMA_LDC, wmma::mem_row_major);
    __syncthreads();
    const float *ebias = bias + (size_t)e * n_out_rows;
    if (GATE_UP) {
        int n_units = n_out_rows / 2;
        for (int idx = tid; idx < BM * (MOE_WMMA_TILE_N / 2); idx += blockDim.x) {
            int m = idx / (MOE_WMMA_TILE_N / 2), u = idx % (MOE_WMMA_TILE_N / 2);
            int n = n0 + 2 * u;
            if (r0 + m >= r_end || n >= n_out_rows) continue;
            float gate = Cs[m * MOE_WMMA_LDC + 2 * u] + ebias[n];
            float up = Cs[m * MOE_WMMA_LDC + 2 * u + 1] + ebias[n + 1];
            h_out[(size_t)(r0 + m) * n_units + n / 2] =
                __float2bfloat16(swiglu(gate, up, limit, alpha));
        }
    } else {
        for (int idx = tid; idx < BM * MOE_WMMA_TILE_N; idx += blockDim.x) {
            int m = idx / MOE_WMMA_TILE_N, n = idx % MOE_WMMA_TILE_N;
            if (r0 + m >= r_end || n0 + n >= n_out_rows) continue;
            y_out[(size_t)route.sorted_pair[r0 + m] * n_out_rows + n0 + n] =
                Cs[m * MOE_WMMA_LDC + n] + ebias[n0 + n];
        }
    }
}

void gptoss_moe_wmma_gemm(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_pairs,
                          const gptoss_cuda_route *route, bf16 *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, GPTOSS_MOE_TILE_M);
    if (tiles > n_pairs) tiles = n_pairs; /* the active tiles come first, each with a pair */
    dim3 g1((2 * I + MOE_WMMA_TILE_N - 1) / MOE_WMMA_TILE_N, tiles);
    moe_gemm_kernel<true><<<g1, 128, 0, stream>>>(w->gate_up_blocks, w->gate_up_scales,
                                                  w->gate_up_bias, t, H, 2 * I, *route,
                                                  w->swiglu_limit, w->swiglu_alpha, h, nullptr);
    dim3 g2((H + MOE_WMMA_TILE_N - 1) / MOE_WMMA_TILE_N, tiles);
    moe_gemm_kernel<false><<<g2, 128, 0, stream>>>(w->down_blocks, w->down_scales, w->down_bias, h,
                                                   I, H, *route, w->swiglu_limit, w->swiglu_alpha,
                                                   nullptr, y);
}
