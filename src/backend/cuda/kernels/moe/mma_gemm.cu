/*
 * mma_gemm.cu - GPTOSS_MOE_MMA_GEMM: the grouped GEMM on mma.sync with fp16 operands over
 * route tiles of 8 to 128 rows (prefill and batched decode).
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

/* ---- mma path: grouped tensor-core GEMM with fp16 operands (GPTOSS_MOE_MMA_GEMM) ------------- */

/*
 * One launch per projection; grid (weight-row tiles of 192 rows, route tiles of BN sorted rows).
 * The weight matrix is the M side of mma.sync.m16n8k16 (row-major A, K-major like the
 * checkpoint) and the routed tokens are the N side, so an expert with only a few tokens wastes
 * at most BN - rows columns, not a 64-row tile. 6 warps, each owning 32 weight rows (two
 * m16 fragments) and all BN tokens; fp32 accumulators.
 *
 * K runs in blocks of 128 (4 MXFP4 groups). Thread (g = lane / 4, q = lane % 4) takes group q
 * of each block for its rows g and g + 8 of both fragments: one 16-byte code chunk per row,
 * read from shared memory. The k order inside an mma is permuted (the sum does not care) so
 * that a 32-bit word of codes (8 values, nibble i = value i) dequantizes straight into
 * fragment registers: register i of the word holds the fp16 pair (value i, value i + 4), where
 * both halves need the same shifts:
 *
 *     mag  = (word << (9 - 4i)) & 0x0E000E00    e1 e0 m -> fp16 exponent bits 1..0, mantissa 9
 *     sign = (word << (12 - 4i)) & 0x80008000
 *
 * which is code * 2^-14 exactly (code 1 is the fp16 subnormal 2^-15), and one mul.f16x2 by
 * 2^(s - 113) makes it code * 2^(s - 127), exact for s in [104, 128] (gptoss_cuda_moe_check_mma).
 * Word w of the group feeds two k16 steps: registers 0 and 1 (step 0, k low / k high), 2 and 3
 * (step 1). The activations are stored to match ("mma layout"): inside every 8-value chunk the
 * order is x0 x4 x1 x5 x2 x6 x3 x7, so one 16-byte shared load gives the B registers of both
 * steps. The input t is converted to fp16 in that layout by mma_convert_kernel; gate_up
 * writes h in it directly (rounded to bf16 first, as every other path stores h).
 *
 * Shared memory per stage of KPS K blocks (mma_cfg): A 192 rows x 64 KPS bytes (codes, rows in
 * fragment order, the K blocks of a row side by side), then per K block B BN rows x 256 bytes
 * (chunk (word w, group j) of token row r at chunk (4w + j) ^ (r & 1) * 4, so the eight lanes of
 * a 16-byte load phase cover all 32 banks). cp.async fills STAGES - 1 stages ahead, one barrier
 * a stage; the scale bytes of the block's rows for the whole K range are loaded once up front.
 *
 * gate_up: fragment row g of m-frag f is the gate row of unit u = 96 * bx + 16 * warp + 8 * f + g
 * and row g + 8 its up row, so each thread ends with gate and up of the same (unit, token) and
 * applies bias + clamped SwiGLU in registers. down: 192 consecutive output rows per block.
 *
 * Measured (H100, 20b shapes, 512-token prefill, ncu): with 128-row blocks the kernel was bound
 * by L2 -> SM traffic (75% of L2 throughput, DRAM 20%): every row block re-reads the token
 * tile and every token tile re-reads the weights. 192-row blocks cut the token re-reads by a
 * third, and B is copied through L1 (cp.async.ca) for the co-resident block on the same tokens.
 *
 * SLICED (the batch-invariant mode's experts for steps of many tokens): the K blocks fall into
 * the MOE_PAIR_TMA_K_SLICES slices of the TMA pair kernel (ceil(blocks / slices) each), every
 * slice summed from zero and the slice sums added in order, so that each output is bitwise
 * what the pair kernel's dense form (pair_mma.cu, pair_tma_products_dense) writes for that pair
 * alone. The sum inside a slice is already the same: per output the same chain of MMAs on the
 * same operands, and an MMA's column depends on its own B column only.
 */
/* t [n_rows, k] bf16 -> out [n_rows, k] fp16 in the mma layout; one 8-value chunk per thread. */
static __global__ void mma_convert_kernel(const bf16 *t, int64_t n_chunks, __half *out) {
    pdl_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_chunks) return;
    uint4 v = *(const uint4 *)(t + i * 8);
    const bf16 *x = (const bf16 *)&v;
    __align__(16) __half o[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
        o[mma_pos(j)] = __float2half_rn(__bfloat162float(x[j]));
    *(uint4 *)(out + i * 8) = *(const uint4 *)o;
}

/* KPS: K blocks (of 128 inputs, 64 code bytes a row) per pipeline stage. A stage of one block
 * copies 64 bytes of each of 192 rows 1440 bytes apart, which the memory serves at about 2/3 of
 * its rate (bench/moe-stream.cu: 2.05 TB/s on an H100 against 3.09 for whole 16-row slabs); two
 * or three blocks a stage copy 128 or 192 bytes a row (2.69 and about 2.8 TB/s there). Stages:
 * with one K block 4 (3 from 64-row tiles), else as many (2 or 3) as keep two blocks an SM at the
 * gpt-oss width (2880 inputs: 17 KB of scale bytes; an SM has 228 KB, 1 KB of it per block
 * reserved). */
template <int BN, int KPS> struct mma_cfg {
    static constexpr int A_BYTES = MOE_MMA_BLOCK_ROWS * 64 * KPS;
    static constexpr int B_BYTES = BN * 256 * KPS;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int FIXED_2880 = MOE_MMA_BLOCK_ROWS * 90 + 2 * BN * 4 + 1024;
    static constexpr int STAGES = KPS == 1                                     ? (BN >= 64 ? 3 : 4)
                                  : 3 * STAGE_BYTES + FIXED_2880 <= 114 * 1024 ? 3
                                                                               : 2;
    static constexpr int MIN_BLOCKS = BN >= 128 ? 1 : 2; /* per SM: caps registers at 168 */
    static size_t smem(int n_groups) {
        return (size_t)STAGES * STAGE_BYTES +
               (((size_t)MOE_MMA_BLOCK_ROWS * n_groups + 15) & ~(size_t)15) +
               2 * BN * sizeof(int32_t);
    }
    /* where piece j (0..KPS-1) of fragment row f sits in its stage row of 64 * KPS bytes: rows
     * a multiple of 128 bytes long alternate the order of their pieces, so that the two rows
     * one 8-lane phase of a 16-byte load reads (f and f + 1) fall in different bank halves */
    static __device__ __forceinline__ int piece(int f, int j) {
        return KPS % 2 == 0 ? j ^ (f & 1) : j;
    }
};

/* Two blocks an SM (228 KB of shared memory) at the gpt-oss width for every deeper stage the
 * launcher can pick: a change that breaks this halves the warps that hide the copies' latency. */
template <int BN, int KPS> constexpr bool mma_two_blocks_2880() {
    return 2 * (mma_cfg<BN, KPS>::STAGES * mma_cfg<BN, KPS>::STAGE_BYTES +
                mma_cfg<BN, KPS>::FIXED_2880) <=
           228 * 1024;
}
static_assert(mma_two_blocks_2880<8, 2>() && mma_two_blocks_2880<8, 3>() &&
                  mma_two_blocks_2880<16, 2>() && mma_two_blocks_2880<16, 3>() &&
                  mma_two_blocks_2880<32, 2>(),
              "a deeper mma GEMM stage no longer leaves room for two blocks an SM");

template <bool GATE_UP, int BN, bool SLICED = false, int KPS = 1>
static __global__ void __launch_bounds__(MOE_MMA_THREADS, mma_cfg<BN, KPS>::MIN_BLOCKS)
    moe_mma_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                   const __half *act, int32_t k_in, int32_t n_out_rows, gptoss_cuda_route route,
                   float limit, float alpha, __half *h_out, float *y_out) {
    typedef mma_cfg<BN, KPS> C;
    constexpr int NF = BN / 8;
    extern __shared__ __align__(16) uint8_t mma_smem[];
    uint8_t *s_scale = mma_smem + C::STAGES * C::STAGE_BYTES;
    const int n_groups = k_in >> 5;
    int32_t *s_src = (int32_t *)(s_scale + (((size_t)MOE_MMA_BLOCK_ROWS * n_groups + 15) &
                                            ~(size_t)15)); /* [BN] act row */
    int32_t *s_dst = s_src + BN;                           /* [BN] out row */

    pdl_wait(); /* the route, the input and h come from earlier kernels */
    const int tile = blockIdx.y;
    const int e = route.tile_expert[tile];
    if (e < 0) return;
    const int r0 = route.tile_row[tile];
    const int n_rows = min(BN, route.expert_offsets[e + 1] - r0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    const int n_units = n_out_rows >> 1;

    /* weight row (relative to the block's first, MOE_MMA_BLOCK_ROWS * bx) of fragment row f
     * (0..MOE_MMA_BLOCK_ROWS-1) */
    auto local_row = [&](int f) -> int {
        if (GATE_UP) return 2 * ((f >> 5) * 16 + ((f >> 4) & 1) * 8 + (f & 7)) + ((f >> 3) & 1);
        return f;
    };
    const int row0 = blockIdx.x * MOE_MMA_BLOCK_ROWS,
              n_valid_rows = min(MOE_MMA_BLOCK_ROWS, n_out_rows - row0);

    for (int i = tid; i < BN; i += MOE_MMA_THREADS) {
        int r = r0 + min(i, n_rows - 1);
        s_src[i] = GATE_UP ? route.sorted_token[r] : r;
        s_dst[i] = GATE_UP ? r : route.sorted_pair[r];
    }
    /* the scales of the block's rows, one contiguous range (n_out_rows % 32 == 0 keeps it
     * 16-byte aligned and a multiple of 16 long); rows past the matrix stay unset and only
     * feed outputs that are never stored */
    {
        const uint8_t *src = es + (size_t)row0 * n_groups;
        int chunks = n_valid_rows * n_groups / 16;
        for (int i = tid; i < chunks; i += MOE_MMA_THREADS)
            cp_async16(s_scale + i * 16, src + (size_t)i * 16, true);
    }
    /* this thread's cp.async work per stage: 4 A chunks (rows a_f + BM/4 i, group a_j) and the
     * B chunks tid, tid + THREADS, ... of BN rows x 16 chunks */
    const int a_j = tid & 3, a_f = tid >> 2;
    const uint8_t *a_src[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        a_src[i] =
            eb +
            (size_t)(row0 + min(local_row(a_f + (MOE_MMA_BLOCK_ROWS / 4) * i), n_valid_rows - 1)) *
                row_bytes +
            a_j * 16;
    const int n_kb = (n_groups + 3) >> 2, n_st = (n_kb + KPS - 1) / KPS;
    __syncthreads(); /* s_src before the first B copies */

    auto issue = [&](int st) {
        uint8_t *sa = mma_smem + (st % C::STAGES) * C::STAGE_BYTES;
        uint8_t *sb0 = sa + C::A_BYTES;
#pragma unroll
        for (int j = 0; j < KPS; j++) {
            const int kb = st * KPS + j, grp_a = kb * 4 + a_j;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int f = a_f + (MOE_MMA_BLOCK_ROWS / 4) * i;
                cp_async16(sa + f * 64 * KPS + C::piece(f, j) * 64 + a_j * 16,
                           grp_a < n_groups ? a_src[i] + (size_t)kb * 64 : eb, grp_a < n_groups);
            }
            uint8_t *sb = sb0 + j * BN * 256;
#pragma unroll
            for (int c = tid; c < BN * 16; c += MOE_MMA_THREADS) {
                int r = c >> 4, b_j = (c >> 2) & 3, b_w = c & 3, grp_b = kb * 4 + b_j;
                bool ok = grp_b < n_groups && r < n_rows;
                const __half *src = ok ? act + (size_t)s_src[r] * k_in + grp_b * 32 + b_w * 8 : act;
                /* cached in L1: the blocks beside this one on the SM work on the same tokens */
                cp_async16_ca(sb + r * 256 + (((b_w * 4 + b_j) ^ ((r & 1) * 4)) * 16), src, ok);
            }
        }
    };

    float acc[2][NF][4], tot[2][NF][4]; /* tot: SLICED's finished slices */
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int n = 0; n < NF; n++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[f][n][c] = tot[f][n][c] = 0.0f;
    const int slice_kb = (n_kb + MOE_PAIR_TMA_K_SLICES - 1) / MOE_PAIR_TMA_K_SLICES;

#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < n_st) issue(s);
        cp_async_commit();
    }
    /* this thread's fragment rows: r = 2 * mfrag + half, row g (half 0) or g + 8 (half 1) */
    int frow[4], srow[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        frow[r] = warp * 32 + (r >> 1) * 16 + (r & 1) * 8 + g;
        srow[r] = local_row(frow[r]) * n_groups;
    }

    /* one barrier a stage: past it, stage st has landed for every thread and every thread is
     * done with stage st - 1, whose buffer the next copies then refill */
    for (int st = 0; st < n_st; st++) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads();
        if (st + C::STAGES - 1 < n_st) issue(st + C::STAGES - 1);
        cp_async_commit();
        const uint8_t *sa0 = mma_smem + (st % C::STAGES) * C::STAGE_BYTES;
#pragma unroll
        for (int j = 0; j < KPS; j++) {
            const int kb = st * KPS + j;
            if (KPS > 1 && kb >= n_kb) break;
            const uint8_t *sb = sa0 + C::A_BYTES + j * BN * 256;
            const int grp = kb * 4 + q;
            uint4 araw[4];
            uint32_t mult[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                araw[r] =
                    *(const uint4 *)(sa0 + frow[r] * 64 * KPS + C::piece(frow[r], j) * 64 + q * 16);
                uint32_t sc = grp < n_groups ? s_scale[srow[r] + grp] : 127u;
                mult[r] = ((sc - 98u) << 10) * 0x00010001u; /* fp16x2 2^(s - 113) */
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                uint32_t R[4][4];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    uint32_t word = w == 0   ? araw[r].x
                                    : w == 1 ? araw[r].y
                                    : w == 2 ? araw[r].z
                                             : araw[r].w;
                    mma_fp4_pairs(word, R[r]);
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        R[r][i] = hmul2_u32(R[r][i], mult[r]);
                }
#pragma unroll
                for (int n = 0; n < NF; n++) {
                    const int row = n * 8 + g;
                    uint4 b =
                        *(const uint4 *)(sb + row * 256 + (((w * 4 + q) ^ ((g & 1) * 4)) * 16));
#pragma unroll
                    for (int f = 0; f < 2; f++) {
                        mma_f16(acc[f][n], R[2 * f][0], R[2 * f + 1][0], R[2 * f][1],
                                R[2 * f + 1][1], b.x, b.y);
                        mma_f16(acc[f][n], R[2 * f][2], R[2 * f + 1][2], R[2 * f][3],
                                R[2 * f + 1][3], b.z, b.w);
                    }
                }
            }
            if (SLICED && ((kb + 1) % slice_kb == 0 || kb + 1 == n_kb)) {
#pragma unroll
                for (int f = 0; f < 2; f++)
#pragma unroll
                    for (int n = 0; n < NF; n++)
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            tot[f][n][c] += acc[f][n][c];
                            acc[f][n][c] = 0.0f;
                        }
            }
        }
    }
    if (SLICED)
#pragma unroll
        for (int f = 0; f < 2; f++)
#pragma unroll
            for (int n = 0; n < NF; n++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[f][n][c] = tot[f][n][c];

    /* epilogue: acc[f][n] = rows (g, g + 8) of m-frag f x tokens (2q, 2q + 1) of n-frag n */
    const float *ebias = bias + (size_t)e * n_out_rows;
#pragma unroll
    for (int f = 0; f < 2; f++) {
        if (GATE_UP) {
            int u = blockIdx.x * (MOE_MMA_BLOCK_ROWS / 2) + warp * 16 + f * 8 + g;
            if (u >= n_units) continue;
            float bg = ebias[2 * u], bu = ebias[2 * u + 1];
            int col = (u & ~7) | mma_pos(u & 7);
#pragma unroll
            for (int n = 0; n < NF; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int tok = n * 8 + 2 * q + c;
                    if (tok >= n_rows) continue;
                    float v = swiglu(acc[f][n][c] + bg, acc[f][n][2 + c] + bu, limit, alpha);
                    h_out[(size_t)s_dst[tok] * n_units + col] = h_as_half(v);
                }
        } else {
            int row = blockIdx.x * MOE_MMA_BLOCK_ROWS + warp * 32 + f * 16 + g;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int rr = row + 8 * hh;
                if (rr >= n_out_rows) continue;
                float b = ebias[rr];
#pragma unroll
                for (int n = 0; n < NF; n++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        int tok = n * 8 + 2 * q + c;
                        if (tok >= n_rows) continue;
                        y_out[(size_t)s_dst[tok] * n_out_rows + rr] = acc[f][n][2 * hh + c] + b;
                    }
            }
        }
    }
}

/* Route tile height for the mma path: a power of two in [8, 128] chosen from the expected
 * rows per active expert (below). */
int32_t gptoss_moe_mma_tile_rows(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    int32_t pairs = n_tokens * k_top;
    int32_t active = pairs < n_experts ? pairs : n_experts;
    int32_t avg = active > 0 ? (pairs + active - 1) / active : 1;
    /* The height is capped by the moe_max_tile knob, 64 by default: measured on an H100 (20b,
     * 2048-token prefill, 256 rows per expert), 128-row tiles took 54 ms of MoE against 41 ms
     * for 64 (255 registers, one block per SM). It grows while it is under moe_tile_pct percent
     * of the average (default 125): an expert with more rows than the tile takes a second tile,
     * which dequantizes its weights again, while a taller tile multiplies more empty rows: at 12
     * rows per expert (120b), 32-row tiles instead of 16 were 5% slower (see bench/CUDA.md, "MoE
     * mma GEMM: route tile height"). */
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    const int32_t pct = kc->moe_tile_pct;
    const int32_t cap = kc->moe_mma_max_tile > 0 && kc->moe_mma_max_tile < kc->moe_max_tile
                            ? kc->moe_mma_max_tile
                            : kc->moe_max_tile;
    int32_t bn = GPTOSS_MOE_MIN_TILE;
    while (bn * 100 < avg * pct && bn < cap)
        bn *= 2;
    return bn;
}

template <int BN, bool SLICED, int KPS>
static void launch_mma_kps(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                           const gptoss_cuda_route *route, __half *h, float *y,
                           cudaStream_t stream) {
    typedef mma_cfg<BN, KPS> C;
    int32_t H = w->hidden, I = w->intermediate;
    int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, BN);
    launch_pdl(moe_mma_kernel<true, BN, SLICED, KPS>,
               dim3((2 * I + MOE_MMA_BLOCK_ROWS - 1) / MOE_MMA_BLOCK_ROWS, tiles),
               dim3(MOE_MMA_THREADS), C::smem(H / 32), stream, w->gate_up_blocks, w->gate_up_scales,
               w->gate_up_bias, t16, H, 2 * I, *route, w->swiglu_limit, w->swiglu_alpha, h,
               (float *)nullptr);
    launch_pdl(moe_mma_kernel<false, BN, SLICED, KPS>,
               dim3((H + MOE_MMA_BLOCK_ROWS - 1) / MOE_MMA_BLOCK_ROWS, tiles),
               dim3(MOE_MMA_THREADS), C::smem(I / 32), stream, w->down_blocks, w->down_scales,
               w->down_bias, (const __half *)h, I, H, *route, w->swiglu_limit, w->swiglu_alpha,
               (__half *)nullptr, y);
}

/* The K blocks per stage a tile height can take (mma_cfg: 1 for the tall tiles, which run
 * prefill near the tensor cores' rate rather than the memory's) and the index of its height in
 * kc->moe_mma_kps_fit. */
static constexpr int mma_kps_max(int bn) {
    return bn <= 16 ? 3 : bn == 32 ? 2 : 1;
}
static int mma_bn_index(int bn) {
    return bn == 8 ? 0 : bn == 16 ? 1 : bn == 32 ? 2 : bn == 64 ? 3 : 4;
}

/* K blocks per stage by tile height when the moe_mma_stage_kb knob leaves it to the rule (0).
 * Measured on an H100 (bench -b, 120b and 20b, depth 512; bench/CUDA.md, "MoE mma GEMM: K blocks
 * per stage"). */
static int mma_kps_rule(int bn) {
    return bn == 8 ? 3 : bn == 32 ? 2 : 1;
}

template <int BN, bool SLICED>
static void launch_mma(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                       const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    const int want = kc->moe_mma_stage_kb > 0 ? kc->moe_mma_stage_kb : mma_kps_rule(BN),
              fit = kc->moe_mma_kps_fit[mma_bn_index(BN)];
    const int kps = want < fit ? want : fit;
    if constexpr (mma_kps_max(BN) >= 3)
        if (kps >= 3) return launch_mma_kps<BN, SLICED, 3>(w, t16, n_pairs, route, h, y, stream);
    if constexpr (mma_kps_max(BN) >= 2)
        if (kps >= 2) return launch_mma_kps<BN, SLICED, 2>(w, t16, n_pairs, route, h, y, stream);
    launch_mma_kps<BN, SLICED, 1>(w, t16, n_pairs, route, h, y, stream);
}

template <bool SLICED>
static void mma_gemm_run(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                         int32_t k_top, const gptoss_cuda_route *route, __half *h, float *y,
                         cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    __half *t16 = (__half *)y; /* y is free until the down projection writes it */
    int64_t chunks = (int64_t)n_tokens * w->hidden / 8;
    launch_pdl(mma_convert_kernel, dim3((unsigned)((chunks + 255) / 256)), dim3(256), 0, stream, t,
               chunks, t16);
    /* 8-row tiles by whole slabs where asked for: bitwise the sliced form's (slab_gemm.cu) */
    if (gptoss_moe_slab_wanted(route))
        return gptoss_moe_slab_gemm(w, t16, n_pairs, route, h, y, stream);
    switch (route->tile_rows) {
    case 8:
        launch_mma<8, SLICED>(w, t16, n_pairs, route, h, y, stream);
        break;
    case 16:
        launch_mma<16, SLICED>(w, t16, n_pairs, route, h, y, stream);
        break;
    case 32:
        launch_mma<32, SLICED>(w, t16, n_pairs, route, h, y, stream);
        break;
    case 64:
        launch_mma<64, SLICED>(w, t16, n_pairs, route, h, y, stream);
        break;
    default:
        launch_mma<128, SLICED>(w, t16, n_pairs, route, h, y, stream);
        break;
    }
}

void gptoss_moe_mma_gemm(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                         int32_t k_top, const gptoss_cuda_route *route, __half *h, float *y,
                         cudaStream_t stream) {
    mma_gemm_run<false>(w, t, n_tokens, k_top, route, h, y, stream);
}

/* SLICED keeps a second set of accumulators: 64- and 128-row tiles spill (ptxas: 264 and 948
 * bytes of stores per thread), yet 64 measured faster than 32 (fewer weight re-reads); its tiles
 * stop at kc->moe_bi_max_tile rows (the bi_moe_tile knob; 32 where nobody set it). */
static int32_t mma_sliced_max_tile(void) {
    const int32_t t = gptoss_cuda_kernel_ctx_current()->moe_bi_max_tile;
    return t >= 8 ? t : 32;
}
int32_t gptoss_moe_mma_sliced_tile_rows(int32_t n_tokens, int32_t k_top, int32_t n_experts) {
    const int32_t bn = gptoss_moe_mma_tile_rows(n_tokens, k_top, n_experts),
                  cap = mma_sliced_max_tile();
    return bn < cap ? bn : cap;
}

void gptoss_moe_mma_gemm_sliced(const gptoss_cuda_moe_weights *w, const bf16 *t,
                                const gptoss_cuda_route *route, int32_t n_tokens, int32_t k_top,
                                __half *h, float *y, cudaStream_t stream) {
    if (route->tile_rows > mma_sliced_max_tile()) return; /* not a route of this kernel's */
    mma_gemm_run<true>(w, t, n_tokens, k_top, route, h, y, stream);
}

/* Raises the kernels' dynamic shared-memory limits for widths up to `widest`, tile by tile
 * while they fit (the tall tiles need 102 KB (64 rows) and 153 KB (128) at width 2880, more
 * than an RTX 4090's 99 KB per block), and records the tallest in the current context; the
 * tile rule stays under it. Fails only when not even the 8-row tile fits. */
template <int BN, int KPS> static cudaError_t mma_raise(int32_t widest) {
    const size_t bytes = mma_cfg<BN, KPS>::smem(widest / 32);
    cudaError_t err =
        gptoss_cuda_kernel_smem((const void *)moe_mma_kernel<true, BN, false, KPS>, bytes);
    if (err == cudaSuccess)
        err = gptoss_cuda_kernel_smem((const void *)moe_mma_kernel<false, BN, false, KPS>, bytes);
    if (err == cudaSuccess)
        err = gptoss_cuda_kernel_smem((const void *)moe_mma_kernel<true, BN, true, KPS>, bytes);
    if (err == cudaSuccess)
        err = gptoss_cuda_kernel_smem((const void *)moe_mma_kernel<false, BN, true, KPS>, bytes);
    return err;
}

/* The K blocks per stage whose shared memory fits for tile height BN (at least 1 when the
 * height itself fits, which err says). */
template <int BN> static int mma_raise_kps(int32_t widest) {
    int fit = 1;
    if constexpr (mma_kps_max(BN) >= 2)
        if (mma_raise<BN, 2>(widest) == cudaSuccess) fit = 2;
    if constexpr (mma_kps_max(BN) >= 3)
        if (fit == 2 && mma_raise<BN, 3>(widest) == cudaSuccess) fit = 3;
    (void)cudaGetLastError(); /* a refused depth is not an error */
    return fit;
}

cudaError_t gptoss_moe_mma_gemm_prepare(int32_t widest) {
    cudaError_t err = cudaSuccess;
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    kc->moe_mma_max_tile = 0;
    for (int i = 0; i < 5; i++)
        kc->moe_mma_kps_fit[i] = 1;
#define RAISE_MMA(BN)                                                                              \
    if (err == cudaSuccess) err = mma_raise<BN, 1>(widest);                                        \
    if (err == cudaSuccess) {                                                                      \
        kc->moe_mma_max_tile = BN;                                                                 \
        kc->moe_mma_kps_fit[mma_bn_index(BN)] = mma_raise_kps<BN>(widest);                         \
    }
    RAISE_MMA(8)
    RAISE_MMA(16)
    RAISE_MMA(32)
    RAISE_MMA(64)
    RAISE_MMA(128)
#undef RAISE_MMA
    (void)cudaGetLastError(); /* a tall tile refused is not an error */
    return kc->moe_mma_max_tile > 0 ? cudaSuccess : err;
}
