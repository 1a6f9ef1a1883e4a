/*
 * batch_invariant.cu - the kernels of the batch-invariant mode (batch_invariant.h): the dense
 * GEMM on bf16 WMMA tiles and the router logits, each output reduced in one fixed order.
 *
 * Why the GEMM is invariant: a block owns a 64x64 output tile and walks all of k itself
 * (no split-K), 128 inputs per step, 16-wide WMMA products in ascending k; the
 * tile a row lands in and the other rows of the tile take no part in that row's sums (a
 * tensor-core product computes each output from its own row and column). Rows past m and
 * inputs past k load as zero. The launch shape depends on m only through the number of row
 * tiles. The e4m3 form decodes codes exactly to bf16 and scales the finished sum.
 */
#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/cuda/kernels/rope_kv.cuh"

#include <mma.h>

using namespace nvcuda;

#define BI_BM 64
#define BI_BN 64
#define BI_BK 128          /* inputs per step: 16 KB of weights in flight per block */
#define BI_LDS (BI_BK + 8) /* bf16: rows 272 bytes apart, 16-row steps 32-byte aligned */
#define BI_LDC (BI_BN + 4)
#define BI_ROW_CHUNKS (BI_BK / 8)               /* 16-byte chunks per tile row */
#define BI_CHUNKS (BI_BM * BI_ROW_CHUNKS / 128) /* ... per thread and operand */
#define BI_SMEM (2 * BI_BM * BI_LDS * 2)        /* As and Bs; Cs reuses them at the end */
static_assert(BI_BM == BI_BN, "one chunk index addresses a row of A and a row of B");
static_assert(BI_BM * BI_LDC * 4 <= BI_SMEM, "Cs fits where As and Bs were");

/* The operands' next k-step into registers: chunk idx is row idx / BI_ROW_CHUNKS, inputs
 * 8 * (idx % BI_ROW_CHUNKS). */
template <bool E4M3>
static __device__ __forceinline__ void bi_load(const bf16 *w, const uint8_t *codes, const bf16 *x,
                                               int32_t m, int32_t n, int32_t k, int32_t m0,
                                               int32_t n0, int32_t k0, uint4 *ra, uint4 *rb) {
#pragma unroll
    for (int c = 0; c < BI_CHUNKS; c++) {
        const int idx = threadIdx.x + 128 * c, r = idx / BI_ROW_CHUNKS;
        const int32_t kk = k0 + (idx % BI_ROW_CHUNKS) * 8;
        uint4 a = make_uint4(0, 0, 0, 0), b = a;
        if (m0 + r < m && kk < k) a = *(const uint4 *)(x + (size_t)(m0 + r) * k + kk);
        if (n0 + r < n && kk < k) {
            if constexpr (E4M3) {
                uint2 q = *(const uint2 *)(codes + (size_t)(n0 + r) * k + kk);
                __nv_bfloat162 v[4] = {e4m3x2_to_bf16x2(q.x), e4m3x2_to_bf16x2(q.x >> 16),
                                       e4m3x2_to_bf16x2(q.y), e4m3x2_to_bf16x2(q.y >> 16)};
                b = *(const uint4 *)v;
            } else {
                b = *(const uint4 *)(w + (size_t)(n0 + r) * k + kk);
            }
        }
        ra[c] = a;
        rb[c] = b;
    }
}

/* Grid (column tiles, row tiles), 4 warps each owning a 32x32 quarter of the 64x64 tile as
 * 2x2 WMMA fragments; the next k-step's loads are in flight while this one multiplies. */
template <bool E4M3>
static __global__ void __launch_bounds__(128)
    bi_gemm_kernel(const bf16 *w, const uint8_t *codes, const float *row_scale, const bf16 *x,
                   float *y, int32_t m, int32_t n, int32_t k) {
    __shared__ __align__(128) unsigned char smem[BI_SMEM];
    bf16 *As = (bf16 *)smem, *Bs = As + BI_BM * BI_LDS;
    float *Cs = (float *)smem; /* after the last k-step's barrier */
    const int tid = threadIdx.x, warp = tid >> 5;
    const int32_t m0 = blockIdx.y * BI_BM, n0 = blockIdx.x * BI_BN;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

    uint4 ra[BI_CHUNKS], rb[BI_CHUNKS];
    bi_load<E4M3>(w, codes, x, m, n, k, m0, n0, 0, ra, rb);
    for (int32_t k0 = 0; k0 < k; k0 += BI_BK) {
#pragma unroll
        for (int c = 0; c < BI_CHUNKS; c++) {
            const int idx = tid + 128 * c, r = idx / BI_ROW_CHUNKS, col = (idx % BI_ROW_CHUNKS) * 8;
            *(uint4 *)(As + r * BI_LDS + col) = ra[c];
            *(uint4 *)(Bs + r * BI_LDS + col) = rb[c];
        }
        __syncthreads();
        if (k0 + BI_BK < k) bi_load<E4M3>(w, codes, x, m, n, k, m0, n0, k0 + BI_BK, ra, rb);
#pragma unroll
        for (int kk = 0; kk < BI_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * BI_LDS + kk, BI_LDS);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], Bs + (wn + 16 * j) * BI_LDS + kk, BI_LDS);
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
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * BI_LDC + wn + 16 * j, acc[i][j], BI_LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < BI_BM * BI_BN; idx += blockDim.x) {
        const int r = idx / BI_BN, c = idx % BI_BN;
        if (m0 + r >= m || n0 + c >= n) continue;
        float v = Cs[r * BI_LDC + c];
        if constexpr (E4M3) v *= row_scale[n0 + c];
        y[(size_t)(m0 + r) * n + n0 + c] = v;
    }
}

int gptoss_cuda_bi_gemm(gptoss_cuda_dense_weight w, const bf16 *x, float *y, int32_t m, int32_t n,
                        int32_t k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0 || k % 8 != 0 || !x || !y || (!w.w_bf16 && !(w.w_e4m3 && w.row_scale))) return -1;
    dim3 grid((unsigned)((n + BI_BN - 1) / BI_BN), (unsigned)((m + BI_BM - 1) / BI_BM));
    if (grid.y > 65535u) return -1;
    if (w.w_bf16)
        bi_gemm_kernel<false><<<grid, 128, 0, stream>>>(w.w_bf16, nullptr, nullptr, x, y, m, n, k);
    else
        bi_gemm_kernel<true>
            <<<grid, 128, 0, stream>>>(nullptr, w.w_e4m3, w.row_scale, x, y, m, n, k);
    return 0;
}

/* Grid (tokens, ceil(experts / 8)), 8 warps: warp i scores expert 8 * blockIdx.y + i. */
static __global__ void __launch_bounds__(256)
    bi_router_logits_kernel(const float *x, const float *w, int32_t n_experts, int32_t hidden,
                            float *logits) {
    const int lane = threadIdx.x & 31;
    const int32_t t = blockIdx.x, e = blockIdx.y * 8 + (threadIdx.x >> 5);
    if (e >= n_experts) return;
    const float *xr = x + (size_t)t * hidden, *wr = w + (size_t)e * hidden;
    float sum = 0.0f;
    for (int32_t h = lane; h < hidden; h += 32)
        sum = fmaf(xr[h], wr[h], sum);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) logits[(size_t)t * n_experts + e] = sum;
}

void gptoss_cuda_bi_router_logits(const float *x, const float *w, int32_t n_tokens,
                                  int32_t n_experts, int32_t hidden, float *logits,
                                  cudaStream_t stream) {
    if (n_tokens <= 0 || n_experts <= 0) return;
    dim3 grid((unsigned)n_tokens, (unsigned)((n_experts + 7) / 8));
    bi_router_logits_kernel<<<grid, 256, 0, stream>>>(x, w, n_experts, hidden, logits);
}
