/*
 * batch_invariant_large.cu - the batch-invariant dense GEMM's large launch shapes (steps past
 * bi_dense_max rows, bf16 weights): the same products as the other shapes
 * (batch_invariant.cu), in tiles fed by ldmatrix.
 */
#include "backend/cuda/kernels/batch_invariant_internal.cuh"

/* ---- the large GEMM (bf16 weights, steps past bi_dense_max rows) -------------------------- */

/*
 * The same products once more, for many rows: a block of WM_N x WN_N warps owns BM x BN
 * outputs, each warp a WM x WN piece of them (MT = WM / 16 row tiles, NT = WN / 8 column tiles),
 * and streams 64-input steps of its rows and columns through an S-deep cp.async pipeline. The
 * fragments come from shared memory by ldmatrix (rows 144 bytes apart: the 8 row addresses of
 * one matrix fall in 8 different 16-byte bank groups), four m16n8k16 fragments or two column
 * tiles' B fragments per instruction, instead of one 4-byte load per register; each warp
 * reuses an A fragment NT times and a B fragment MT times (the wide shape: 2 and 4 of 8).
 * The registers hold exactly the values the other shapes load, the MMAs are the same
 * instruction over the same 16-input chunks in ascending order, and the slices fold at the
 * same inputs (a slice is whole 128-input steps, so whole pairs of these steps): every output
 * is bitwise the skinny shape's. Rows past m and inputs past k are zero-filled.
 */
#define BIL_BK 64
#define BIL_LD (BIL_BK + 8) /* bf16 per shared row */

template <int BM, int BN, int WM, int WN, int S, bool TOT_SMEM> struct bil_shape {
    static constexpr int WARPS = (BM / WM) * (BN / WN), THREADS = 32 * WARPS;
    static constexpr int MT = WM / 16, NT = WN / 8;
    static constexpr int A_ELEMS = BM * BIL_LD, STAGE_ELEMS = (BM + BN) * BIL_LD;
    static constexpr size_t PIPE = (size_t)S * STAGE_ELEMS * sizeof(bf16);
    /* TOT_SMEM: the finished slices' sums wait in shared memory, each thread's own words
     * (where registers would spill) */
    static constexpr size_t SMEM = PIPE + (TOT_SMEM ? (size_t)BM * BN * sizeof(float) : 0);
    static_assert(WM % 16 == 0 && WN % 16 == 0 && BM % WM == 0 && BN % WN == 0, "warp tiles");
};

/* ROWS rows of src (rows r0.. of a matrix of `limit` rows, k inputs each) for the 64 inputs
 * from k0 into a stage: 16-byte copies, zeros past limit and k. A thread copies the same 8
 * inputs of rows THREADS / 8 apart. */
template <int ROWS, int THREADS>
static __device__ __forceinline__ void bil_load(bf16 *dst, const bf16 *src, int32_t r0,
                                                int32_t limit, int32_t k, int32_t k0) {
    static_assert(ROWS * (BIL_BK / 8) % THREADS == 0 && THREADS % 8 == 0, "whole copies");
    constexpr int STEP = THREADS / 8;
    const int r = (int)threadIdx.x / 8, c = (int)threadIdx.x % 8;
    const int32_t kk = k0 + 8 * c;
    const bf16 *p = src + (size_t)(r0 + r) * k + kk;
    bf16 *d = dst + r * BIL_LD + 8 * c;
#pragma unroll
    for (int j = 0; j < ROWS / STEP; j++) {
        const bool ok = r0 + r + j * STEP < limit && kk < k;
        bis_cp<16>(d + j * STEP * BIL_LD, ok ? p + (size_t)j * STEP * k : src, ok ? 16 : 0);
    }
}

/* Grid (ceil(n / BN), ceil(m / BM)): consecutive blocks share a row block's inputs. Within a
 * step the fragments of the next 16 inputs are read while the MMAs of these run. */
template <int BM, int BN, int WM, int WN, int S, bool TOT_SMEM>
static __global__ void __launch_bounds__(bil_shape<BM, BN, WM, WN, S, TOT_SMEM>::THREADS, 1)
    bil_gemm_kernel(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k) {
    typedef bil_shape<BM, BN, WM, WN, S, TOT_SMEM> sh;
    constexpr int MT = sh::MT, NT = sh::NT, TH = sh::THREADS, KS = BIL_BK / 16;
    extern __shared__ __align__(128) unsigned char bil_smem[];
    bf16 *smem = (bf16 *)bil_smem;
    float *tot_smem = (float *)(bil_smem + sh::PIPE); /* [MT * NT * 4][TH] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    const int32_t n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int32_t steps = (k + BIL_BK - 1) / BIL_BK;
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < steps)
            bil_load<BN, TH>(smem + s * sh::STAGE_ELEMS + sh::A_ELEMS, w, n0, n, k, s * BIL_BK);
        cp_async_commit();
    }
    pdl_wait(); /* x comes from an earlier kernel */
    /* a group per stage: step i's inputs are group S - 1 + i, as in the loop, so waiting for
     * all but the newest S - 2 groups before step i finds its weights and inputs there */
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < steps) bil_load<BM, TH>(smem + s * sh::STAGE_ELEMS, x, m0, m, k, s * BIL_BK);
        cp_async_commit();
    }

    float acc[MT][NT][4], tot[TOT_SMEM ? 1 : MT][TOT_SMEM ? 1 : NT][4];
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[t][u][e] = 0.0f;
    bool folded = false;
    /* tot = tot + acc (acc alone the first time), acc = 0: at every slice boundary, and once
     * more (to_regs) into acc itself at the end */
    auto fold = [&](bool to_acc) {
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int u = 0; u < NT; u++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float *tp = TOT_SMEM ? &tot_smem[((t * NT + u) * 4 + e) * TH + threadIdx.x]
                                         : &tot[TOT_SMEM ? 0 : t][TOT_SMEM ? 0 : u][e];
                    const float v = folded ? *tp + acc[t][u][e] : acc[t][u][e];
                    if (to_acc) {
                        acc[t][u][e] = v;
                    } else {
                        *tp = v;
                        acc[t][u][e] = 0.0f;
                    }
                }
        folded = true;
    };
    const int32_t slice_inputs = bi_slice_steps(k) * 128;
    /* ldmatrix lane addresses: A rows lane % 16, inputs 8 * (lane / 16); B rows lane % 8 plus
     * 8 for lanes 16.., inputs 8 * ((lane / 8) % 2) */
    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t a_off = (uint32_t)(((wm0 + (lane & 15)) * BIL_LD + 8 * (lane >> 4)) * 2);
    const uint32_t b_off = (uint32_t)((sh::A_ELEMS + (wn0 + (lane & 7) + 8 * (lane >> 4)) * BIL_LD +
                                       8 * ((lane >> 3) & 1)) *
                                      2);
    uint32_t af[2][MT][4], bfr[2][NT][2];
    auto frags = [&](int buf, uint32_t st, int kk) {
#pragma unroll
        for (int u = 0; u < NT; u += 2) {
            uint32_t r[4];
            ldmatrix_x4(r, st + b_off + (uint32_t)((8 * u * BIL_LD + kk) * 2));
            bfr[buf][u][0] = r[0], bfr[buf][u][1] = r[1];
            bfr[buf][u + 1][0] = r[2], bfr[buf][u + 1][1] = r[3];
        }
#pragma unroll
        for (int t = 0; t < MT; t++)
            ldmatrix_x4(af[buf][t], st + a_off + (uint32_t)((16 * t * BIL_LD + kk) * 2));
    };
    for (int32_t i = 0; i < steps; i++) {
        const int32_t k0 = i * BIL_BK;
        if (i > 0 && k0 % slice_inputs == 0) fold(false);
        cp_async_wait<S - 2>();
        __syncthreads();
        const int32_t next = i + S - 1;
        if (next < steps) {
            bf16 *nst = smem + (next % S) * sh::STAGE_ELEMS;
            bil_load<BN, TH>(nst + sh::A_ELEMS, w, n0, n, k, next * BIL_BK);
            bil_load<BM, TH>(nst, x, m0, m, k, next * BIL_BK);
        }
        cp_async_commit();
        const uint32_t st = smem_base + (uint32_t)((i % S) * sh::STAGE_ELEMS * 2);
        frags(0, st, 0);
#pragma unroll
        for (int c = 0; c < KS; c++) {
            if (k0 + 16 * c >= k) break;
            if (c + 1 < KS && k0 + 16 * (c + 1) < k) frags((c + 1) & 1, st, 16 * (c + 1));
#pragma unroll
            for (int t = 0; t < MT; t++)
#pragma unroll
                for (int u = 0; u < NT; u++)
                    bis_mma(acc[t][u], af[c & 1][t][0], af[c & 1][t][1], af[c & 1][t][2],
                            af[c & 1][t][3], bfr[c & 1][u][0], bfr[c & 1][u][1]);
        }
    }
    cp_async_wait<0>();
    fold(true);
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int32_t row = m0 + wm0 + 16 * t + g + 8 * h;
                const int32_t col = n0 + wn0 + 8 * u + 2 * q;
                if (row >= m) continue;
                const float v0 = acc[t][u][2 * h], v1 = acc[t][u][2 * h + 1];
                float *yp = y + (size_t)row * n + col;
                if (col + 1 < n && ((uintptr_t)yp & 7) == 0) {
                    *(float2 *)yp = make_float2(v0, v1);
                } else {
                    if (col < n) yp[0] = v0;
                    if (col + 1 < n) yp[1] = v1;
                }
            }
}

/* The large GEMM's tiles (GPTOSS_BI_GEMM_LARGE_*): 128 x 128 outputs on 8 warps of 64 x 32 (4
 * stages, one block an SM), 64 x 128 on 4 warps of 64 x 32 (3 stages: 113 KB, two blocks an SM;
 * with 4 stages only one fitted, and a 2048-row step took 0.45 ms instead of 0.31), 64 x 64 on
 * 4 warps of 32 x 32 (4 stages, three blocks an SM). */
#define BIL_T128 128, 128, 64, 32, 4, true
#define BIL_T64 64, 128, 64, 32, 3, true
#define BIL_T64N64 64, 64, 32, 32, 4, false

template <int BM, int BN, int WM, int WN, int S, bool TOT_SMEM>
static int bil_launch(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k,
                      cudaStream_t stream) {
    typedef bil_shape<BM, BN, WM, WN, S, TOT_SMEM> sh;
    if ((m + BM - 1) / BM > 65535) return -1;
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((m + BM - 1) / BM));
    launch_pdl(bil_gemm_kernel<BM, BN, WM, WN, S, TOT_SMEM>, grid, dim3(sh::THREADS), sh::SMEM,
               stream, w, x, y, m, n, k);
    return 0;
}

/* GPTOSS_BI_GEMM_LARGE: 64-row tiles for up to 64 rows, else 128 x 128 where that makes two
 * blocks for every SM; then 64 x 128 where that does, else 64 x 64 (H100, gpu_test_bi_kernels
 * timing: lm_head at 64 rows 0.49 ms on 64 x 128 against 0.62 on 128 x 128; the 120b QKV at 256
 * rows 0.060-0.065 on any of them; 2048 rows 0.27 on 128 x 128, 0.31 on 64 x 128). */
int gptoss_bi_large_pick(int32_t m, int32_t n, int n_sms) {
    const int64_t t128 = (int64_t)((m + 127) / 128) * ((n + 127) / 128);
    const int64_t t64 = (int64_t)((m + 63) / 64) * ((n + 127) / 128);
    if (m > 64 && t128 >= 2 * (int64_t)n_sms) return GPTOSS_BI_GEMM_LARGE_128;
    if (t64 >= 2 * (int64_t)n_sms) return GPTOSS_BI_GEMM_LARGE_64;
    return GPTOSS_BI_GEMM_LARGE_64N64;
}

int gptoss_bi_large_gemm(int variant, const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n,
                         int32_t k, cudaStream_t stream) {
    switch (variant) {
    case GPTOSS_BI_GEMM_LARGE_128:
        return bil_launch<BIL_T128>(w, x, y, m, n, k, stream);
    case GPTOSS_BI_GEMM_LARGE_64:
        return bil_launch<BIL_T64>(w, x, y, m, n, k, stream);
    case GPTOSS_BI_GEMM_LARGE_64N64:
        return bil_launch<BIL_T64N64>(w, x, y, m, n, k, stream);
    default:
        return -1;
    }
}

bool gptoss_bi_large_prepare(void) {
#define BIL_SET(SHAPE)                                                                             \
    (cudaFuncSetAttribute(bil_gemm_kernel<SHAPE>, cudaFuncAttributeMaxDynamicSharedMemorySize,     \
                          (int)bil_shape<SHAPE>::SMEM) == cudaSuccess)
    const bool ok = BIL_SET(BIL_T128) && BIL_SET(BIL_T64) && BIL_SET(BIL_T64N64);
#undef BIL_SET
    return ok;
}
