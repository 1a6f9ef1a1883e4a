/*
 * batch_invariant.cu - the kernels of the batch-invariant mode (batch_invariant.h): the dense
 * GEMM on bf16 WMMA tiles and the router logits, each output reduced in one fixed order.
 *
 * Why the GEMM is invariant: a block owns a 64x64 output tile and walks all of k itself
 * (no split-K), 128 inputs per step, 16-wide WMMA products in ascending k; the
 * tile a row lands in and the other rows of the tile take no part in that row's sums (a
 * tensor-core product computes each output from its own row and column). Rows past m and
 * inputs past k load as zero. The launch shape depends on m only through the number of row
 * tiles. The e4m3 form decodes codes exactly to bf16 and scales the finished sum. The
 * skinny, wide and split shapes are here, the large ones in batch_invariant_large.cu, the
 * pieces they share in batch_invariant_internal.cuh.
 */
#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/cuda/kernels/batch_invariant_internal.cuh"
#include "backend/cuda/kernels/moe/fp4.cuh"
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

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> tot[2][2];
    bool folded = false; /* tot holds the slices before the current one */
    auto fold = [&]() {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < acc[i][j].num_elements; e++) {
                    tot[i][j].x[e] = folded ? tot[i][j].x[e] + acc[i][j].x[e] : acc[i][j].x[e];
                    acc[i][j].x[e] = 0.0f;
                }
        folded = true;
    };
    const int32_t slice_steps = bi_slice_steps(k);
    uint4 ra[BI_CHUNKS], rb[BI_CHUNKS];
    bi_load<E4M3>(w, codes, x, m, n, k, m0, n0, 0, ra, rb);
    for (int32_t k0 = 0; k0 < k; k0 += BI_BK) {
        if (k0 > 0 && (k0 / BI_BK) % slice_steps == 0) fold();
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
            if (k0 + kk >= k) break; /* exactly ceil(k / 16) chunks, as the skinny kernel */
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
    fold();
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * BI_LDC + wn + 16 * j, tot[i][j], BI_LDC,
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

/* ---- the skinny and wide GEMMs -------------------------------------------------------------- */

/*
 * The same products in other launch shapes. A block of WARPS warps owns BN = 8 * NT * WARPS
 * output columns (each warp NT column tiles of 8) and 16 * MT rows, and streams its columns'
 * weights and its rows' inputs through an S-deep cp.async pipeline of 128-input steps (the
 * first steps' weights issued before the PDL wait, as they depend on no earlier kernel).
 * Skinny (decode-sized steps): up to 16 rows 2 warps, NT = 1, MT = 1, 6 stages, so a one-row
 * step reads the weights at the memory's bandwidth from hundreds of blocks instead of a few
 * dozen 64-column tiles; 17 to 64 rows 4 warps, NT = 2, MT = 2, 4 stages; beyond, MT = 4 and 3
 * stages. Before, 17 to 128 rows ran on 2 warps of NT = 1 (16 columns a block, 2 blocks and so 4
 * warps an SM for their shared memory, every block re-reading its rows' inputs): the wider
 * blocks took 120b batched decode (tg32, random weights, H100) at 32 / 64 / 128 sequences from
 * 1,298 / 1,780 / 2,683 tok/s to 1,339 / 2,060 / 3,384, the dense GEMMs of a 64-row step from
 * 7.3 to 3.8 ms and lm_head from 2.6 to 1.0. Wide (prefill): 8 warps, NT = 2, MT = 4, 64 x 128
 * outputs per block, 3 stages. Each warp multiplies with mma.sync m16n8k16 (the instruction the
 * WMMA 16x16x16 product compiles to) over exactly ceil(k / 16) chunks in ascending order into one
 * fp32 accumulator per output, and applies the same epilogue: bitwise the tile kernel's result for
 * every row (gpu_test_bi_kernels).
 */
#define BIS_BK 128
#define BI_MOE_MAX_WIDTH 8192 /* hidden and intermediate widths the expert kernels take */

/* Per device: prepared, and whether the wide shapes got their shared memory (157 KB for the
 * GEMM, 115 KB for the experts). Where they did not, their launches take the tile GEMM and the
 * streaming experts kernel instead: the same results. */
#define BI_MAX_DEVICES 64
typedef struct bi_device {
    bool done, gemm_wide, gemm_large, moe_wide;
    int n_sms;
    int split_smem; /* the split shape's shared memory granted (bytes) */
} bi_device;
static bi_device bi_dev[BI_MAX_DEVICES];
static const bi_device *bi_prepare_once(void);
#define BIS_LDA (BIS_BK + 8)  /* bf16 per row of the A and bf16 B tiles: 272 bytes */
#define BIS_LDQ (BIS_BK + 16) /* bytes per row of the e4m3 B tile */

template <int MT, int NT, int WARPS, int S, bool E4M3> struct bis_shape {
    static constexpr int BN = 8 * NT * WARPS, ROWS = 16 * MT, THREADS = 32 * WARPS;
    static constexpr int A_BYTES = ROWS * BIS_LDA * 2;
    static constexpr int STAGE = A_BYTES + BN * (E4M3 ? BIS_LDQ : BIS_LDA * 2);
    static constexpr size_t SMEM = (size_t)S * STAGE;
};

/* The weights of k-step `step` into a stage: BN rows of 128 inputs, zeros past n and k. */
template <int BN, int THREADS, bool E4M3>
static __device__ __forceinline__ void bis_load_b(unsigned char *bs, const bf16 *w,
                                                  const uint8_t *codes, int32_t n, int32_t k,
                                                  int32_t n0, int32_t step) {
    const int32_t k0 = step * BIS_BK;
#pragma unroll 4
    for (int i = threadIdx.x; i < BN * (BIS_BK / 8); i += THREADS) {
        const int r = i / (BIS_BK / 8), c = i % (BIS_BK / 8);
        const int32_t kk = k0 + 8 * c;
        const bool ok = n0 + r < n && kk < k;
        if constexpr (E4M3) /* 8-byte copies: a row of codes is only 8-byte aligned */
            bis_cp<8>(bs + r * BIS_LDQ + 8 * c, ok ? codes + (size_t)(n0 + r) * k + kk : codes,
                      ok ? 8 : 0);
        else
            bis_cp<16>(bs + r * BIS_LDA * 2 + 16 * c, ok ? w + (size_t)(n0 + r) * k + kk : w,
                       ok ? 16 : 0);
    }
}

/* Rows [m0, m0 + rows) of x for k-step `step`; rows past them are never read. */
template <int THREADS>
static __device__ __forceinline__ void bis_load_a(bf16 *as, const bf16 *x, int32_t k, int32_t m0,
                                                  int rows, int32_t step) {
    const int32_t k0 = step * BIS_BK;
    for (int i = threadIdx.x; i < rows * (BIS_BK / 8); i += THREADS) {
        const int r = i / (BIS_BK / 8), c = i % (BIS_BK / 8);
        const int32_t kk = k0 + 8 * c;
        const bool ok = kk < k;
        bis_cp<16>(as + r * BIS_LDA + 8 * c, ok ? x + (size_t)(m0 + r) * k + kk : x, ok ? 16 : 0);
    }
}

/* Grid (ceil(m / (16 * MT)), ceil(n / BN)): the row tiles that share a column block's weights
 * run side by side, so all but the first read them from L2. Dynamic shared memory: S stages. */
template <int MT, int NT, int WARPS, int S, bool E4M3>
static __global__ void __launch_bounds__(WARPS * 32)
    bis_gemm_kernel(const bf16 *w, const uint8_t *codes, const float *row_scale, const bf16 *x,
                    float *y, int32_t m, int32_t n, int32_t k) {
    typedef bis_shape<MT, NT, WARPS, S, E4M3> sh;
    constexpr int BN = sh::BN, TH = sh::THREADS, A_BYTES = sh::A_BYTES, STAGE = sh::STAGE;
    extern __shared__ __align__(128) unsigned char bis_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int32_t n0 = blockIdx.y * BN, m0 = blockIdx.x * sh::ROWS;
    const int rows = min(sh::ROWS, m - m0);
    const int32_t steps = (k + BIS_BK - 1) / BIS_BK;
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < steps)
            bis_load_b<BN, TH, E4M3>(bis_smem + s * STAGE + A_BYTES, w, codes, n, k, n0, s);
        cp_async_commit();
    }
    pdl_wait(); /* x comes from an earlier kernel */
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (s < steps) bis_load_a<TH>((bf16 *)(bis_smem + s * STAGE), x, k, m0, rows, s);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float acc[MT][NT][4];
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int u = 0; u < NT; u++)
            acc[t][u][0] = acc[t][u][1] = acc[t][u][2] = acc[t][u][3] = 0.0f;
    float tot[MT][NT][4];
    bool folded = false; /* tot holds the slices before the current one (bi_slice_steps) */
    auto fold = [&]() {
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int u = 0; u < NT; u++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[t][u][e] = folded ? tot[t][u][e] + acc[t][u][e] : acc[t][u][e];
                    acc[t][u][e] = 0.0f;
                }
        folded = true;
    };
    const int32_t slice_steps = bi_slice_steps(k);
    const int wc = warp * 8 * NT; /* the warp's first column in the block */
    for (int32_t i = 0; i < steps; i++) {
        if (i > 0 && i % slice_steps == 0) fold();
        const int32_t next = i + S - 1;
        if (next < steps) {
            unsigned char *st = bis_smem + (next % S) * STAGE;
            bis_load_b<BN, TH, E4M3>(st + A_BYTES, w, codes, n, k, n0, next);
            bis_load_a<TH>((bf16 *)st, x, k, m0, rows, next);
        }
        cp_async_commit();
        const unsigned char *st = bis_smem + (i % S) * STAGE;
        const bf16 *as = (const bf16 *)st;
        const int32_t k0 = i * BIS_BK;
#pragma unroll
        for (int kk = 0; kk < BIS_BK; kk += 16) {
            if (k0 + kk >= k) break;
            uint32_t b[NT][2];
#pragma unroll
            for (int u = 0; u < NT; u++) {
                if constexpr (E4M3) {
                    const unsigned char *bp =
                        st + A_BYTES + (wc + 8 * u + g) * BIS_LDQ + kk + 2 * q;
                    __nv_bfloat162 v0 = e4m3x2_to_bf16x2(*(const uint16_t *)bp),
                                   v1 = e4m3x2_to_bf16x2(*(const uint16_t *)(bp + 8));
                    b[u][0] = *(const uint32_t *)&v0;
                    b[u][1] = *(const uint32_t *)&v1;
                } else {
                    const bf16 *bp =
                        (const bf16 *)(st + A_BYTES) + (wc + 8 * u + g) * BIS_LDA + kk + 2 * q;
                    b[u][0] = *(const uint32_t *)bp;
                    b[u][1] = *(const uint32_t *)(bp + 8);
                }
            }
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (16 * t >= rows) break;
                const bf16 *ap = as + (16 * t + g) * BIS_LDA + kk + 2 * q;
                const bool r0 = 16 * t + g < rows, r1 = 16 * t + g + 8 < rows;
                const uint32_t a0 = r0 ? *(const uint32_t *)ap : 0u,
                               a2 = r0 ? *(const uint32_t *)(ap + 8) : 0u,
                               a1 = r1 ? *(const uint32_t *)(ap + 8 * BIS_LDA) : 0u,
                               a3 = r1 ? *(const uint32_t *)(ap + 8 * BIS_LDA + 8) : 0u;
#pragma unroll
                for (int u = 0; u < NT; u++)
                    bis_mma(acc[t][u], a0, a1, a2, a3, b[u][0], b[u][1]);
            }
        }
        cp_async_wait<S - 2>();
        __syncthreads();
    }
    fold();
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 16 * t + g + 8 * h;
                const int32_t col = n0 + wc + 8 * u + 2 * q;
                if (r >= rows) continue;
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    if (col + j >= n) continue;
                    float v = tot[t][u][2 * h + j];
                    if constexpr (E4M3) v *= row_scale[col + j];
                    y[(size_t)(m0 + r) * n + col + j] = v;
                }
            }
}

template <int MT, int NT, int WARPS, int S, bool E4M3>
static int bis_launch(gptoss_cuda_dense_weight w, const bf16 *x, float *y, int32_t m, int32_t n,
                      int32_t k, cudaStream_t stream) {
    typedef bis_shape<MT, NT, WARPS, S, E4M3> sh;
    if ((n + sh::BN - 1) / sh::BN > 65535) return -1;
    dim3 grid((unsigned)((m + sh::ROWS - 1) / sh::ROWS), (unsigned)((n + sh::BN - 1) / sh::BN));
    launch_pdl(bis_gemm_kernel<MT, NT, WARPS, S, E4M3>, grid, dim3(sh::THREADS), sh::SMEM, stream,
               (const bf16 *)w.w_bf16, (const uint8_t *)w.w_e4m3, (const float *)w.row_scale, x, y,
               m, n, k);
    return 0;
}

/*
 * The split shape, for steps of up to BIP_MAX_ROWS rows (decode): the slices in parallel. A
 * block holds BIP_TILES column tiles of 8 and one warp per (tile, slice); the step's rows sit
 * in shared memory whole, each lane reads its own B fragments (two 4-byte words per chunk:
 * its tile row's 32 bytes, one sector): bf16 weights staged in shared memory by cp.async
 * (BIP_STAGES below), e4m3 codes straight from global memory one 128-input step ahead,
 * and the warp sums its slice's chunks in ascending order into a fresh accumulator. The
 * slices' sums then meet in shared memory and are added in slice order: the same numbers, in
 * the same order, as the shapes above, with BI_K_SLICES times their warps (the skinny shape
 * runs one warp per 8 columns over the whole input: 360 warps for a 2,880-row projection).
 */
#define BIP_TILES 2
#define BIP_MAX_ROWS 8
#define BIP_THREADS (BIP_TILES * BI_K_SLICES * 32)
/* bf16 weights come through shared memory: per warp BIP_STAGES buffers of its 8 rows x one
 * 128-input step, filled by 16-byte cp.async copies (four per lane per step, each row's 256
 * bytes whole) BIP_STAGES - 1 steps ahead; the fragments are then read from there. Rows are
 * BIP_WROW elements apart (256 + 16 bytes: the fragment reads hit 32 different banks). The
 * fragments, and so every product and sum, are the ones the direct loads gave. */
#define BIP_STAGES 3
#define BIP_WROW 136
#define BIP_WSMEM (BIP_TILES * BI_K_SLICES * BIP_STAGES * 8 * BIP_WROW * (int)sizeof(bf16))
static size_t bip_smem(int32_t m, int32_t k, bool e4m3) {
    const size_t xs = ((size_t)m * (size_t)(k + 8) * sizeof(bf16) + 15) & ~(size_t)15;
    return xs + (e4m3 ? 0 : (size_t)BIP_WSMEM);
}

static __device__ __forceinline__ void bip_cp16(void *dst, const void *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void bip_cp_commit(void) {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> static __device__ __forceinline__ void bip_cp_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* One 128-input step (st) of the warp's 8 rows [n0, n0 + 8) into its buffer (one group);
 * rows past n and inputs past k are zero-filled (k % 8 == 0: a 16-byte piece is whole or
 * out). */
static __device__ __forceinline__ void bip_stage_b(const bf16 *w, bf16 *buf, int32_t n0, int32_t n,
                                                   int32_t k, int32_t st, int lane) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int seg = lane + 32 * i, r = seg >> 4, piece = seg & 15;
        const int32_t kk = st * 128 + 8 * piece, col = n0 + r;
        const bool ok = col < n && kk < k;
        bip_cp16(buf + r * BIP_WROW + 8 * piece, ok ? w + (size_t)col * k + kk : w, ok ? 16 : 0);
    }
    bip_cp_commit();
}

template <bool E4M3>
static __device__ __forceinline__ void bip_load_b(const bf16 *w, const uint8_t *codes, int32_t col,
                                                  bool live, int32_t k, int32_t k0, int q,
                                                  uint32_t (&b)[8][2]) {
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const int32_t kc = k0 + 16 * c;
        b[c][0] = b[c][1] = 0u;
        if (!live || kc >= k) continue;
        const bool hi = kc + 8 < k; /* a chunk's upper half past k (k % 8 == 0) is zero */
        if constexpr (E4M3) {
            const uint8_t *bp = codes + (size_t)col * k + kc + 2 * q;
            const __nv_bfloat162 v0 = e4m3x2_to_bf16x2(__ldg((const uint16_t *)bp));
            b[c][0] = *(const uint32_t *)&v0;
            if (hi) {
                const __nv_bfloat162 v1 = e4m3x2_to_bf16x2(__ldg((const uint16_t *)(bp + 8)));
                b[c][1] = *(const uint32_t *)&v1;
            }
        } else {
            const bf16 *bp = w + (size_t)col * k + kc + 2 * q;
            b[c][0] = __ldg((const uint32_t *)bp);
            if (hi) b[c][1] = __ldg((const uint32_t *)(bp + 8));
        }
    }
}

template <bool E4M3>
static __global__ void __launch_bounds__(BIP_THREADS, 3)
    bip_gemm_kernel(const bf16 *w, const uint8_t *codes, const float *row_scale, const bf16 *x,
                    float *y, int32_t m, int32_t n, int32_t k) {
    extern __shared__ __align__(16) bf16 bip_xs[]; /* [m][k + 8], then (bf16) the weights */
    __shared__ float red[BI_K_SLICES][BIP_TILES][32][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int slice = warp % BI_K_SLICES, tile = warp / BI_K_SLICES;
    const int32_t n0 = (blockIdx.x * BIP_TILES + tile) * 8, col = n0 + g;
    const bool live = col < n;
    const int32_t steps = (k + 127) / 128, per = bi_slice_steps(k);
    const int32_t s0 = min(steps, slice * per), s1 = min(steps, s0 + per);
    const int32_t ldx = k + 8;
    uint32_t bc[8][2], bn[8][2];
    bf16 *wbuf = bip_xs + (((size_t)m * ldx * sizeof(bf16) + 15) & ~(size_t)15) / sizeof(bf16) +
                 (size_t)warp * BIP_STAGES * 8 * BIP_WROW;
    if constexpr (!E4M3) { /* the weights depend on no earlier kernel */
#pragma unroll
        for (int i = 0; i < BIP_STAGES - 1; i++)
            if (s0 + i < s1)
                bip_stage_b(w, wbuf + i * 8 * BIP_WROW, n0, n, k, s0 + i, lane);
            else
                bip_cp_commit();
    } else if (s0 < s1) {
        bip_load_b<E4M3>(w, codes, col, live, k, s0 * 128, q, bc);
    }
    pdl_wait(); /* x comes from an earlier kernel */
    for (int32_t i = threadIdx.x; i < m * (k / 8); i += blockDim.x) {
        const int32_t r = i / (k / 8), c = i % (k / 8);
        *(uint4 *)(bip_xs + (size_t)r * ldx + 8 * c) = *(const uint4 *)(x + (size_t)r * k + 8 * c);
    }
    __syncthreads();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const bool row = g < m;
    const bf16 *xr = bip_xs + (size_t)g * ldx + 2 * q;
    for (int32_t st = s0; st < s1; st++) {
        const bf16 *wb = wbuf + ((st - s0) % BIP_STAGES) * 8 * BIP_WROW + g * BIP_WROW + 2 * q;
        if constexpr (!E4M3) {
            bip_cp_wait<BIP_STAGES - 2>(); /* this step's group is in */
            __syncwarp(); /* ... for every lane, and the buffer refilled below is read out */
            const int32_t ahead = st + BIP_STAGES - 1;
            if (ahead < s1)
                bip_stage_b(w, wbuf + ((ahead - s0) % BIP_STAGES) * 8 * BIP_WROW, n0, n, k, ahead,
                            lane);
            else
                bip_cp_commit();
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const bool hi = st * 128 + 16 * c + 8 < k;
                bc[c][0] = *(const uint32_t *)(wb + 16 * c);
                bc[c][1] = hi ? *(const uint32_t *)(wb + 16 * c + 8) : 0u;
            }
        } else if (st + 1 < s1) {
            bip_load_b<E4M3>(w, codes, col, live, k, (st + 1) * 128, q, bn);
        }
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const int32_t kc = st * 128 + 16 * c;
            if (kc >= k) break; /* exactly ceil(k / 16) chunks, as the other shapes */
            const uint32_t a0 = row ? *(const uint32_t *)(xr + kc) : 0u,
                           a2 = row && kc + 8 < k ? *(const uint32_t *)(xr + kc + 8) : 0u;
            bis_mma(acc, a0, 0u, a2, 0u, bc[c][0], bc[c][1]);
        }
        if constexpr (E4M3) {
#pragma unroll
            for (int c = 0; c < 8; c++)
                bc[c][0] = bn[c][0], bc[c][1] = bn[c][1];
        }
    }
    red[slice][tile][lane][0] = acc[0];
    red[slice][tile][lane][1] = acc[1];
    __syncthreads();
    if (slice != 0 || !row) return;
    const int32_t n_slices = (steps + per - 1) / per;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int32_t cj = n0 + 2 * q + j;
        if (cj >= n) continue;
        float v = red[0][tile][lane][j];
        for (int32_t sl = 1; sl < n_slices; sl++)
            v = v + red[sl][tile][lane][j];
        if constexpr (E4M3) v *= row_scale[cj];
        y[(size_t)g * n + cj] = v;
    }
}

template <bool E4M3>
static int bis_gemm(gptoss_cuda_dense_weight w, const bf16 *x, float *y, int32_t m, int32_t n,
                    int32_t k, int variant, cudaStream_t stream) {
    if constexpr (!E4M3)
        if (variant > GPTOSS_BI_GEMM_LARGE && variant <= GPTOSS_BI_GEMM_LARGE_64N64)
            return gptoss_bi_large_gemm(variant, w.w_bf16, x, y, m, n, k, stream);
    if (variant == GPTOSS_BI_GEMM_WIDE || variant >= GPTOSS_BI_GEMM_LARGE)
        return bis_launch<4, 2, 8, 3, E4M3>(w, x, y, m, n, k, stream);
    if (variant == GPTOSS_BI_GEMM_SPLIT && m <= BIP_MAX_ROWS && k % 8 == 0) {
        const unsigned blocks = (unsigned)((n + 8 * BIP_TILES - 1) / (8 * BIP_TILES));
        launch_pdl(bip_gemm_kernel<E4M3>, dim3(blocks), dim3(BIP_THREADS), bip_smem(m, k, E4M3),
                   stream, (const bf16 *)w.w_bf16, (const uint8_t *)w.w_e4m3,
                   (const float *)w.row_scale, x, y, m, n, k);
        return 0;
    }
    if (m <= 16) return bis_launch<1, 1, 2, 6, E4M3>(w, x, y, m, n, k, stream);
    if (m <= 64) return bis_launch<2, 2, 4, 4, E4M3>(w, x, y, m, n, k, stream);
    return bis_launch<4, 2, 4, 3, E4M3>(w, x, y, m, n, k, stream);
}

int gptoss_cuda_bi_gemm_variant(gptoss_cuda_dense_weight w, const bf16 *x, float *y, int32_t m,
                                int32_t n, int32_t k, int variant, cudaStream_t stream) {
    if (variant != GPTOSS_BI_GEMM_SKINNY && variant != GPTOSS_BI_GEMM_WIDE &&
        variant != GPTOSS_BI_GEMM_SPLIT &&
        (variant < GPTOSS_BI_GEMM_LARGE || variant > GPTOSS_BI_GEMM_LARGE_64N64))
        return gptoss_cuda_bi_gemm(w, x, y, m, n, k, stream);
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0 || k % 8 != 0 || !x || !y || (!w.w_bf16 && !(w.w_e4m3 && w.row_scale))) return -1;
    const bi_device *d = bi_prepare_once();
    if (!d) return -1;
    if (variant == GPTOSS_BI_GEMM_LARGE) variant = gptoss_bi_large_pick(m, n, d->n_sms);
    if (variant >= GPTOSS_BI_GEMM_LARGE && (!w.w_bf16 || !d->gemm_large)) /* the same results */
        variant = m <= 128 ? GPTOSS_BI_GEMM_SKINNY : GPTOSS_BI_GEMM_WIDE;
    if (variant == GPTOSS_BI_GEMM_WIDE && !d->gemm_wide)
        return gptoss_cuda_bi_gemm(w, x, y, m, n, k, stream); /* the same results */
    if (variant == GPTOSS_BI_GEMM_SPLIT &&
        (m > BIP_MAX_ROWS || bip_smem(m, k, !w.w_bf16) > (size_t)d->split_smem))
        variant = GPTOSS_BI_GEMM_SKINNY; /* the same results */
    return w.w_bf16 ? bis_gemm<false>(w, x, y, m, n, k, variant, stream)
                    : bis_gemm<true>(w, x, y, m, n, k, variant, stream);
}

/* Grid (tokens, ceil(experts / BI_ROUTER_WARPS)), BI_ROUTER_WARPS warps: warp i scores expert
 * BI_ROUTER_WARPS * blockIdx.y + i; lane l takes the 4-input chunks l, l + 32, ... (fmaf in
 * input order), then a fixed butterfly. Small blocks spread one token's experts over many SMs;
 * the weights are prefetched to L2 before the PDL wait and the unrolled loop keeps several
 * loads in flight. hidden % 4 == 0 (the launcher checks). */
#define BI_ROUTER_WARPS 2
static __global__ void __launch_bounds__(BI_ROUTER_WARPS * 32)
    bi_router_logits_kernel(const float *x, const float *w, int32_t n_experts, int32_t hidden,
                            float *logits) {
    const int lane = threadIdx.x & 31;
    const int32_t t = blockIdx.x, e = blockIdx.y * BI_ROUTER_WARPS + (threadIdx.x >> 5);
    const bool live = e < n_experts;
    const float4 *wr = (const float4 *)(w + (size_t)(live ? e : 0) * hidden);
    if (live && t == 0) /* the router matrix depends on no earlier kernel */
        for (int32_t off = lane * 32; off < hidden; off += 32 * 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (size_t)e * hidden + off));
    pdl_wait(); /* x comes from the norm */
    if (!live) return;
    const float4 *xr = (const float4 *)(x + (size_t)t * hidden);
    float sum = 0.0f;
#pragma unroll 6
    for (int32_t c = lane; c < hidden / 4; c += 32) {
        const float4 a = xr[c], b = __ldg(wr + c);
        sum = fmaf(a.x, b.x, sum);
        sum = fmaf(a.y, b.y, sum);
        sum = fmaf(a.z, b.z, sum);
        sum = fmaf(a.w, b.w, sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) logits[(size_t)t * n_experts + e] = sum;
}

/* The same sums for many tokens: a block of 8 warps scores 16 tokens x 16 experts, each warp 4
 * tokens x 8 experts at once, so a lane's loads of one 4-input chunk feed 32 sums instead of
 * one (the one-output kernel reads every token's row once per expert). Per output, lane l
 * still adds chunks l, l + 32, ... in input order with the same fmaf chain, and the butterfly
 * is the same: bitwise the one-output kernel's. Rows past n_tokens and experts past n_experts
 * read row 0 and are not written. */
#define BIR_TOKENS 16
#define BIR_EXPERTS 16
#define BIR_MIN_TOKENS 128 /* steps of fewer tokens keep the one-output kernel's wider grid */
static __global__ void __launch_bounds__(256)
    bi_router_tiled_kernel(const float *x, const float *w, int32_t n_tokens, int32_t n_experts,
                           int32_t hidden, float *logits) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t t0 = blockIdx.x * BIR_TOKENS + 4 * (warp >> 1),
                  e0 = blockIdx.y * BIR_EXPERTS + 8 * (warp & 1);
    const float4 *xr[4], *wr[8];
#pragma unroll
    for (int i = 0; i < 4; i++)
        xr[i] = (const float4 *)(x + (size_t)(t0 + i < n_tokens ? t0 + i : 0) * hidden);
#pragma unroll
    for (int j = 0; j < 8; j++)
        wr[j] = (const float4 *)(w + (size_t)(e0 + j < n_experts ? e0 + j : 0) * hidden);
    pdl_wait(); /* x comes from the norm */
    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[i][j] = 0.0f;
    for (int32_t c = lane; c < hidden / 4; c += 32) {
        float4 a[4], b[8];
#pragma unroll
        for (int i = 0; i < 4; i++)
            a[i] = xr[i][c];
#pragma unroll
        for (int j = 0; j < 8; j++)
            b[j] = __ldg(wr[j] + c);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
                acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
                acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
                acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
            }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float sum = warp_sum(acc[i][j]);
            if (lane == 8 * i + j && t0 + i < n_tokens && e0 + j < n_experts)
                logits[(size_t)(t0 + i) * n_experts + e0 + j] = sum;
        }
}

int gptoss_cuda_bi_router_logits(const float *x, const float *w, int32_t n_tokens,
                                 int32_t n_experts, int32_t hidden, float *logits,
                                 cudaStream_t stream) {
    if (n_tokens <= 0 || n_experts <= 0) return 0;
    if (hidden <= 0 || hidden % 4 != 0 || ((uintptr_t)x | (uintptr_t)w) % 16 != 0) return -1;
    if (n_tokens >= BIR_MIN_TOKENS) {
        dim3 grid((unsigned)((n_tokens + BIR_TOKENS - 1) / BIR_TOKENS),
                  (unsigned)((n_experts + BIR_EXPERTS - 1) / BIR_EXPERTS));
        launch_pdl(bi_router_tiled_kernel, grid, dim3(256), 0, stream, x, w, n_tokens, n_experts,
                   hidden, logits);
        return 0;
    }
    dim3 grid((unsigned)n_tokens, (unsigned)((n_experts + BI_ROUTER_WARPS - 1) / BI_ROUTER_WARPS));
    launch_pdl(bi_router_logits_kernel, grid, dim3(BI_ROUTER_WARPS * 32), 0, stream, x, w,
               n_experts, hidden, logits);
    return 0;
}

/* ---- the experts ---------------------------------------------------------------------------- */

/*
 * GPTOSS_MOE_WMMA_GEMM's products (kernels/moe/wmma_gemm.cu) over the same route (64-row
 * tiles), in two launch shapes. A block owns 8 * NT * 4 weight rows of one tile's expert (4
 * warps of NT column tiles of 8) and takes the tile's rows 16 * MT at a time, streaming its
 * weight rows through a cp.async pipeline of 4 MXFP4 groups per step: MT = NT = 1, 6 stages,
 * for steps whose experts hold a few rows each (decode: hundreds of blocks, each keeping 12 KB
 * of weights in flight), and MT = NT = 4, 3 stages, 64 x 128 outputs per block, for prefill.
 * Every weight is dequantized as the WMMA path does it (fp4 * hi, then * lo, rounded to bf16),
 * each output sums its groups in ascending order as two m16n8k16 chunks each into one fp32
 * accumulator, and the epilogue is the WMMA path's (bias, clamped SwiGLU, bf16 h; bias and the
 * scatter to the pair's row for down): h and y bitwise that path's (gpu_test_bi_kernels).
 * Only the route's active tiles (at most one per pair) are launched.
 */
#define BIM_WARPS 4
#define BIM_GROUPS 4 /* MXFP4 groups (32 inputs) per k-step */
#define BIM_BK (32 * BIM_GROUPS)
#define BIM_LDB (16 * BIM_GROUPS + 16) /* bytes per weight row of a stage */

/* PAIRS: one row per block, so the A tile holds 8 rows (fragment rows g + 8 are never read):
 * 31 KB in all for 2880-wide layers, 7 blocks per SM. */
template <int MT, int NT, bool PAIRS = false> struct bim_shape {
    static constexpr int BN = 8 * NT * BIM_WARPS, ROWS = PAIRS ? 1 : 16 * MT;
    static constexpr int STAGES = MT * NT == 1 ? 6 : 3;
    static constexpr int A_BYTES = (PAIRS ? 8 : ROWS) * BIS_LDA * 2;
    static constexpr int STAGE = A_BYTES + BN * BIM_LDB;
    static size_t smem(int32_t k_in) {
        return (size_t)STAGES * STAGE + (size_t)BN * (k_in / 32);
    }
};

/* bf16(fp4 * hi * lo) of the two codes of byte b (low nibble first), as fp4x8_to_float and the
 * WMMA path's rounding compute them. */
static __device__ __forceinline__ uint32_t bim_pair(uint32_t b, float hi, float lo) {
    const float v0 = __uint_as_float(((b & 8u) << 28) | ((b & 7u) << 22)) * hi;
    const float v1 = __uint_as_float((((b >> 4) & 8u) << 28) | (((b >> 4) & 7u) << 22)) * hi;
    __nv_bfloat162 p = __floats2bfloat162_rn(v0 * lo, v1 * lo);
    return *(const uint32_t *)&p;
}

template <bool GATE_UP, int MT, int NT, bool PAIRS>
static __global__ void __launch_bounds__(BIM_WARPS * 32)
    bim_moe_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias, const bf16 *act,
                   int32_t k_in, int32_t n_out_rows, gptoss_cuda_route route,
                   const int32_t *topk_idx, int32_t k_top, float limit, float alpha, bf16 *h_out,
                   float *y_out) {
    typedef bim_shape<MT, NT, PAIRS> sh;
    constexpr int S = sh::STAGES, BN = sh::BN;
    extern __shared__ __align__(128) unsigned char bim_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n_groups = k_in / 32, steps = (n_groups + BIM_GROUPS - 1) / BIM_GROUPS;
    uint8_t *sc = bim_smem + S * sh::STAGE; /* [BN][n_groups] scale bytes */
    pdl_wait(); /* the route (or top-k) and the activations come from earlier kernels */
    int e;
    int32_t r_begin, r_end;
    if constexpr (PAIRS) { /* block y: pair y, row y of h and y */
        r_begin = blockIdx.y;
        r_end = r_begin + 1;
        e = topk_idx[r_begin];
        if (e < 0) return; /* another GPU's expert */
    } else {
        const int tile = blockIdx.y;
        e = route.tile_expert[tile];
        if (e < 0) return;
        r_begin = route.tile_row[tile];
        r_end = min(r_begin + route.tile_rows, route.expert_offsets[e + 1]);
    }
    const int32_t n0 = blockIdx.x * BN;
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    for (int i = threadIdx.x; i < BN * n_groups; i += blockDim.x) {
        const int r = i / n_groups;
        sc[i] = n0 + r < n_out_rows ? es[(size_t)(n0 + r) * n_groups + i % n_groups] : 127;
    }
    const float *ebias = bias + (size_t)e * n_out_rows;
    const int wc = warp * 8 * NT; /* the warp's first weight row in the block */

    for (int32_t p0 = r_begin; p0 < r_end; p0 += sh::ROWS) {
        const int rows = min(sh::ROWS, r_end - p0);
        /* stage `step`: BN weight rows x BIM_GROUPS groups and the pass's rows of input */
        auto load = [&](int step) {
            unsigned char *st = bim_smem + (step % S) * sh::STAGE;
            for (int i = threadIdx.x; i < BN * BIM_GROUPS; i += blockDim.x) {
                const int r = i / BIM_GROUPS, gi = step * BIM_GROUPS + i % BIM_GROUPS;
                const bool ok = n0 + r < n_out_rows && gi < n_groups;
                bis_cp<16>(st + sh::A_BYTES + r * BIM_LDB + 16 * (i % BIM_GROUPS),
                           ok ? eb + (size_t)(n0 + r) * row_bytes + (size_t)gi * 16 : eb,
                           ok ? 16 : 0);
            }
            bf16 *as = (bf16 *)st;
            for (int i = threadIdx.x; i < rows * (BIM_BK / 8); i += blockDim.x) {
                const int r = i / (BIM_BK / 8), c = i % (BIM_BK / 8);
                const int32_t kk = step * BIM_BK + 8 * c;
                const size_t src_row = !GATE_UP ? (size_t)(p0 + r)
                                       : PAIRS  ? (size_t)((p0 + r) / k_top)
                                                : (size_t)route.sorted_token[p0 + r];
                const bool ok = kk < k_in;
                bis_cp<16>(as + r * BIS_LDA + 8 * c, ok ? act + src_row * k_in + kk : act,
                           ok ? 16 : 0);
            }
        };
#pragma unroll 1
        for (int s = 0; s < S - 1; s++) {
            if (s < steps) load(s);
            cp_async_commit();
        }
        float acc[MT][NT][4];
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int u = 0; u < NT; u++)
                acc[t][u][0] = acc[t][u][1] = acc[t][u][2] = acc[t][u][3] = 0.0f;
        for (int i = 0; i < steps; i++) {
            if (i + S - 1 < steps) load(i + S - 1);
            cp_async_commit();
            cp_async_wait<S - 1>(); /* this step's copies have landed */
            __syncthreads();
            const unsigned char *st = bim_smem + (i % S) * sh::STAGE;
            const bf16 *as = (const bf16 *)st;
#pragma unroll
            for (int gl = 0; gl < BIM_GROUPS; gl++) {
                const int gi = i * BIM_GROUPS + gl;
                if (gi >= n_groups) break;
                /* values 2q, 2q+1 | 2q+8, 2q+9 of each 16-input half of the group: byte q of
                 * each of its 4 words, for this lane's weight row of each column tile */
                uint32_t b[NT][4];
#pragma unroll
                for (int u = 0; u < NT; u++) {
                    const int cl = wc + 8 * u + g;
                    const uint4 cw = *(const uint4 *)(st + sh::A_BYTES + cl * BIM_LDB + 16 * gl);
                    float hi, lo;
                    e8m0_split(sc[cl * n_groups + gi], &hi, &lo);
                    const uint32_t sh8 = 8 * q;
                    b[u][0] = bim_pair((cw.x >> sh8) & 0xffu, hi, lo);
                    b[u][1] = bim_pair((cw.y >> sh8) & 0xffu, hi, lo);
                    b[u][2] = bim_pair((cw.z >> sh8) & 0xffu, hi, lo);
                    b[u][3] = bim_pair((cw.w >> sh8) & 0xffu, hi, lo);
                }
#pragma unroll
                for (int half = 0; half < 2; half++)
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        if (16 * t >= rows) break;
                        const bf16 *ap = as + (16 * t + g) * BIS_LDA + 32 * gl + 16 * half + 2 * q;
                        const bool r0 = 16 * t + g < rows, r1 = 16 * t + g + 8 < rows;
                        const uint32_t a0 = r0 ? *(const uint32_t *)ap : 0u,
                                       a2 = r0 ? *(const uint32_t *)(ap + 8) : 0u,
                                       a1 = r1 ? *(const uint32_t *)(ap + 8 * BIS_LDA) : 0u,
                                       a3 = r1 ? *(const uint32_t *)(ap + 8 * BIS_LDA + 8) : 0u;
#pragma unroll
                        for (int u = 0; u < NT; u++)
                            bis_mma(acc[t][u], a0, a1, a2, a3, b[u][2 * half], b[u][2 * half + 1]);
                    }
            }
            __syncthreads(); /* before the next iteration's copies overwrite a stage */
        }
        cp_async_wait<0>();
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int u = 0; u < NT; u++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int r = 16 * t + g + 8 * hh;
                    const int32_t col = n0 + wc + 8 * u + 2 * q;
                    if (r >= rows || col >= n_out_rows) continue;
                    const float c0 = acc[t][u][2 * hh], c1 = acc[t][u][2 * hh + 1];
                    if constexpr (GATE_UP) {
                        const float gate = c0 + ebias[col], up = c1 + ebias[col + 1];
                        h_out[(size_t)(p0 + r) * (n_out_rows / 2) + col / 2] =
                            __float2bfloat16(swiglu(gate, up, limit, alpha));
                    } else {
                        const int32_t pair = PAIRS ? p0 + r : route.sorted_pair[p0 + r];
                        float *yr = y_out + (size_t)pair * n_out_rows;
                        yr[col] = c0 + ebias[col];
                        if (col + 1 < n_out_rows) yr[col + 1] = c1 + ebias[col + 1];
                    }
                }
        __syncthreads(); /* the next pass's first copies overwrite the stages */
    }
}

template <int MT, int NT, bool PAIRS>
static void bim_launch(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t blocks_y,
                       const gptoss_cuda_route *route, const int32_t *topk_idx, int32_t k_top,
                       bf16 *h, float *y, cudaStream_t stream) {
    typedef bim_shape<MT, NT, PAIRS> sh;
    const int32_t H = w->hidden, I = w->intermediate;
    const size_t smem1 = sh::smem(H), smem2 = sh::smem(I);
    gptoss_cuda_route r = {};
    if (route) r = *route;
    launch_pdl(bim_moe_kernel<true, MT, NT, PAIRS>,
               dim3((unsigned)((2 * I + sh::BN - 1) / sh::BN), (unsigned)blocks_y),
               dim3(BIM_WARPS * 32), smem1, stream, (const uint8_t *)w->gate_up_blocks,
               (const uint8_t *)w->gate_up_scales, (const float *)w->gate_up_bias, t, H, 2 * I, r,
               topk_idx, k_top, w->swiglu_limit, w->swiglu_alpha, h, (float *)nullptr);
    launch_pdl(bim_moe_kernel<false, MT, NT, PAIRS>,
               dim3((unsigned)((H + sh::BN - 1) / sh::BN), (unsigned)blocks_y),
               dim3(BIM_WARPS * 32), smem2, stream, (const uint8_t *)w->down_blocks,
               (const uint8_t *)w->down_scales, (const float *)w->down_bias, (const bf16 *)h, I, H,
               r, topk_idx, k_top, w->swiglu_limit, w->swiglu_alpha, (bf16 *)nullptr, y);
}

int gptoss_cuda_bi_moe(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                       int32_t k_top, const int32_t *topk_idx, const gptoss_cuda_route *route,
                       bf16 *h, float *y, int variant, cudaStream_t stream) {
    const int32_t n_pairs = n_tokens * k_top;
    if (n_pairs <= 0) return 0;
    if (w->hidden % 32 != 0 || w->intermediate % 32 != 0 || w->hidden > BI_MOE_MAX_WIDTH ||
        w->intermediate > BI_MOE_MAX_WIDTH)
        return -1;
    if (variant == GPTOSS_BI_MOE_PAIRS ? !topk_idx
                                       : !route || route->tile_rows != GPTOSS_MOE_TILE_M)
        return -1;
    const bi_device *d = bi_prepare_once();
    if (!d) return -1;
    if (variant == GPTOSS_BI_MOE_PAIRS) {
        bim_launch<1, 1, true>(w, t, n_pairs, nullptr, topk_idx, k_top, h, y, stream);
        return 0;
    }
    int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, route->tile_rows);
    if (tiles > n_pairs) tiles = n_pairs; /* the active tiles come first, each with a pair */
    if (variant == GPTOSS_BI_MOE_WIDE && d->moe_wide)
        bim_launch<4, 4, false>(w, t, tiles, route, nullptr, k_top, h, y, stream);
    else
        bim_launch<1, 1, false>(w, t, tiles, route, nullptr, k_top, h, y, stream);
    return 0;
}

/* ---- shared-memory limits ------------------------------------------------------------------ */

cudaError_t gptoss_cuda_bi_prepare(void) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 0 || dev >= BI_MAX_DEVICES) return cudaErrorInvalidDevice;
#define BI_SET(KERNEL, BYTES)                                                                      \
    (cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(BYTES)) ==    \
     cudaSuccess)
#define BI_SET_GEMM(MT, NT, WARPS, S)                                                              \
    (BI_SET((bis_gemm_kernel<MT, NT, WARPS, S, false>),                                            \
            (bis_shape<MT, NT, WARPS, S, false>::SMEM)) &&                                         \
     BI_SET((bis_gemm_kernel<MT, NT, WARPS, S, true>), (bis_shape<MT, NT, WARPS, S, true>::SMEM)))
    const bool base =
        BI_SET_GEMM(1, 1, 2, 6) && BI_SET_GEMM(2, 2, 4, 4) && BI_SET_GEMM(4, 2, 4, 3) &&
        BI_SET((bim_moe_kernel<true, 1, 1, false>), (bim_shape<1, 1>::smem(BI_MOE_MAX_WIDTH))) &&
        BI_SET((bim_moe_kernel<false, 1, 1, false>), (bim_shape<1, 1>::smem(BI_MOE_MAX_WIDTH))) &&
        BI_SET((bim_moe_kernel<true, 1, 1, true>),
               (bim_shape<1, 1, true>::smem(BI_MOE_MAX_WIDTH))) &&
        BI_SET((bim_moe_kernel<false, 1, 1, true>),
               (bim_shape<1, 1, true>::smem(BI_MOE_MAX_WIDTH)));
    bi_dev[dev].gemm_wide = BI_SET_GEMM(4, 2, 8, 3);
    bi_dev[dev].gemm_large = gptoss_bi_large_prepare();
    if (cudaDeviceGetAttribute(&bi_dev[dev].n_sms, cudaDevAttrMultiProcessorCount, dev) !=
            cudaSuccess ||
        bi_dev[dev].n_sms <= 0)
        bi_dev[dev].n_sms = 1;
    /* the split shape: its rows whole, up to BIP_MAX_ROWS of the widest input the GPU allows */
    bi_dev[dev].split_smem = 0;
    for (int32_t kmax = 8192; kmax >= 1024 && !bi_dev[dev].split_smem; kmax /= 2)
        if (BI_SET(bip_gemm_kernel<false>, bip_smem(BIP_MAX_ROWS, kmax, false)) &&
            BI_SET(bip_gemm_kernel<true>, bip_smem(BIP_MAX_ROWS, kmax, true)))
            bi_dev[dev].split_smem = (int)bip_smem(BIP_MAX_ROWS, kmax, false);
    bi_dev[dev].moe_wide =
        BI_SET((bim_moe_kernel<true, 4, 4, false>), (bim_shape<4, 4>::smem(BI_MOE_MAX_WIDTH))) &&
        BI_SET((bim_moe_kernel<false, 4, 4, false>), (bim_shape<4, 4>::smem(BI_MOE_MAX_WIDTH)));
#undef BI_SET_GEMM
#undef BI_SET
    (void)cudaGetLastError(); /* a refused wide size is not an error */
    bi_dev[dev].done = base;
    return base ? cudaSuccess : cudaErrorInvalidValue;
}

/* For callers that did not prepare (the kernel tests): once per device, before the first
 * launch (a graph capture may be open; the backend prepares when it starts, see device.cu).
 * Returns the device's entry, NULL where it cannot be prepared. */
static const bi_device *bi_prepare_once(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= BI_MAX_DEVICES) return nullptr;
    if (!bi_dev[dev].done) gptoss_cuda_bi_prepare();
    return bi_dev[dev].done ? &bi_dev[dev] : nullptr;
}
