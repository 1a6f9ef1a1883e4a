/*
 * wgmma_gemm.cu - GPTOSS_MOE_WGMMA_GEMM (sm_90a): the mma GEMM's dequantization feeding
 * warpgroup MMA, over 128-row route tiles.
 */
#include "backend/cuda/kernels/moe/wgmma.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

/* ---- wgmma path (GPTOSS_MOE_WGMMA_GEMM, sm_90a): the mma GEMM's dequantization feeding warpgroup
 * MMA --- */

/*
 * The same grouped GEMM as the mma GEMM (weights the M side, routed tokens the N side, fp16
 * operands, fp32 accumulators, identical exactness conditions), issued as wgmma.mma_async with A in
 * registers: each warpgroup owns 64 weight rows and multiplies them by the whole BN-token tile (BN
 * = 64 or 128) that sits in shared memory, so a dequantized A fragment feeds 8-16x more
 * multiply-adds than the mma GEMM's m16n8k16 and the tensor cores run while other warpgroups
 * dequantize. Block: 3 warpgroups, 192 weight rows (2880 and 5760 are multiples), one block per SM.
 *
 * K runs in 64-wide atoms, 3 per pipeline stage (2880 = 15 stages). Warp w of a warpgroup holds
 * rows 16w + g and 16w + g + 8 (g = lane / 4) of its 64, as in an m16n8k16 A fragment; thread q =
 * lane % 4 takes bytes 8q..8q+7 of a row's 32 code bytes of the atom (two words, half of group q /
 * 2). Word w' and step s (k16 step j = 2w' + s of the atom) give the registers pair(word, 2s) and
 * pair(word, 2s + 1) of the mma GEMM (mma_fp4_pairs, values i and i + 4), so the MMA's k index kk =
 * 2q + c + 8h reads atom element 16q + 8w' + 2s + h + 4c. The tokens are stored in that order
 * ("wgmma layout", wg_pos): inside every 64-element atom, element e sits at position 16j + kk.
 * gate_up writes h in the same layout for down.
 *
 * Shared memory per stage: the B atoms (BN rows x 128 bytes each, the 128-byte swizzle wgmma
 * descriptors expect: 16-byte chunk c of row r at c ^ (r & 7), 1024-byte aligned), then the A
 * codes (192 rows x 96 bytes, rows in fragment order). cp.async fills two stages ahead; a
 * proxy fence makes the copies visible to the tensor cores' shared-memory reads. Each atom's
 * MMAs are one asynchronous group, so the tensor cores work on atom a while the warps
 * dequantize atom a + 1 (and across stages).
 *
 * Route tiles are 128 rows; a tile multiplies only its rows rounded up to 32 (m64n32..n128),
 * so an expert's weights are read once per 128 of its rows and the padding stays under 32.
 */

/* Position of element e (0..63) of a 64-element k atom in the wgmma layout. */
static __host__ __device__ __forceinline__ int wg_pos(int e) {
    int r = e & 3, c = (e >> 2) & 1, w = (e >> 3) & 1, q = e >> 4;
    return 16 * (2 * w + (r >> 1)) + 2 * q + c + 8 * (r & 1);
}

template <int BN> struct wg_cfg {
    static_assert(BN == 128, "the MMA widths go up to m64n128");
    static constexpr int STAGES = 3;
    static constexpr int B_BYTES = MOE_WGMMA_ATOMS_PER_STAGE * BN * 128;
    static constexpr int A_BYTES = MOE_WGMMA_BLOCK_ROWS * MOE_WGMMA_ATOMS_PER_STAGE * 32;
    static constexpr int STAGE_BYTES = B_BYTES + A_BYTES; /* a multiple of 1024 */
    static size_t smem(int n_groups) {
        return 1024 + (size_t)STAGES * STAGE_BYTES +
               (((size_t)MOE_WGMMA_BLOCK_ROWS * n_groups + 15) & ~(size_t)15) +
               2 * BN * sizeof(int32_t);
    }
};

/* t [n_rows, k] bf16 -> out [n_rows, k] fp16 in the wgmma layout; one 64-value atom per thread. */
static __global__ void wg_convert_kernel(const bf16 *t, int64_t n_atoms, __half *out) {
    pdl_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    __align__(16) __half o[64];
#pragma unroll
    for (int c = 0; c < 8; c++) {
        uint4 v = *(const uint4 *)(t + i * 64 + c * 8);
        const bf16 *x = (const bf16 *)&v;
#pragma unroll
        for (int j = 0; j < 8; j++)
            o[wg_pos(c * 8 + j)] = __float2half_rn(__bfloat162float(x[j]));
    }
#pragma unroll
    for (int c = 0; c < 8; c++)
        *(uint4 *)(out + i * 64 + c * 8) = *(const uint4 *)(o + c * 8);
}

template <bool GATE_UP, int BN>
static __global__ void __launch_bounds__(MOE_WGMMA_THREADS, 1)
    moe_wg_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                  const __half *act, int32_t k_in, int32_t n_out_rows, gptoss_cuda_route route,
                  float limit, float alpha, __half *h_out, float *y_out) {
#ifdef GPTOSS_WGMMA
    typedef wg_cfg<BN> C;
    extern __shared__ __align__(16) uint8_t wg_smem_raw[];
    uint8_t *smem =
        wg_smem_raw + ((1024u - ((uint32_t)__cvta_generic_to_shared(wg_smem_raw) & 1023u)) & 1023u);
    uint8_t *s_scale = smem + C::STAGES * C::STAGE_BYTES;
    const int n_groups = k_in >> 5, n_atoms = k_in >> 6;
    int32_t *s_src = (int32_t *)(s_scale + (((size_t)MOE_WGMMA_BLOCK_ROWS * n_groups + 15) &
                                            ~(size_t)15)); /* [BN] act row */
    int32_t *s_dst = s_src + BN;                           /* [BN] out row */

    pdl_wait(); /* the route, the input and h come from earlier kernels */
    const int tile = blockIdx.y;
    const int e = route.tile_expert[tile];
    if (e < 0) return;
    const int r0 = route.tile_row[tile];
    const int n_rows = min(BN, route.expert_offsets[e + 1] - r0);
    const int n_mma = (n_rows + 31) & ~31; /* MMA width: the tile's rows rounded up to 32 */
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int frag = tid >> 5; /* warp index in the block: fragment rows 16 frag .. 16 frag + 15 */
    const size_t row_bytes = (size_t)n_groups * 16;
    const uint8_t *eb = blocks + (size_t)e * n_out_rows * row_bytes;
    const uint8_t *es = scales + (size_t)e * n_out_rows * n_groups;
    const int n_units = n_out_rows >> 1;

    /* weight row (relative to the block's first) of fragment row f: gate_up pairs a unit's
     * gate (row g of a 16-row fragment) with its up row (g + 8) */
    auto local_row = [&](int f) -> int {
        if (GATE_UP) return 2 * ((f >> 4) * 8 + (f & 7)) + ((f >> 3) & 1);
        return f;
    };
    const int row0 = blockIdx.x * MOE_WGMMA_BLOCK_ROWS,
              n_valid_rows = min(MOE_WGMMA_BLOCK_ROWS, n_out_rows - row0);

    for (int i = tid; i < BN; i += MOE_WGMMA_THREADS) {
        int r = r0 + min(i, n_rows - 1);
        s_src[i] = GATE_UP ? route.sorted_token[r] : r;
        s_dst[i] = GATE_UP ? r : route.sorted_pair[r];
    }
    {
        const uint8_t *src = es + (size_t)row0 * n_groups;
        int chunks = n_valid_rows * n_groups / 16;
        for (int i = tid; i < chunks; i += MOE_WGMMA_THREADS)
            cp_async16(s_scale + i * 16, src + (size_t)i * 16, true);
    }
    /* A copies per stage: 192 rows x 6 chunks of 16 bytes, 3 per thread */
    const uint8_t *a_src[3];
    int a_dst[3], a_part[3];
#pragma unroll
    for (int i = 0; i < 3; i++) {
        int c = tid + MOE_WGMMA_THREADS * i, f = c / 6;
        a_part[i] = c % 6;
        a_dst[i] = f * (MOE_WGMMA_ATOMS_PER_STAGE * 32) + a_part[i] * 16;
        a_src[i] =
            eb + (size_t)(row0 + min(local_row(f), n_valid_rows - 1)) * row_bytes + a_part[i] * 16;
    }
    const int n_kb = (n_atoms + MOE_WGMMA_ATOMS_PER_STAGE - 1) / MOE_WGMMA_ATOMS_PER_STAGE;
    __syncthreads(); /* s_src before the first B copies */

    auto issue = [&](int kb) {
        uint8_t *sb = smem + (kb % C::STAGES) * C::STAGE_BYTES;
        uint8_t *sa = sb + C::B_BYTES;
#pragma unroll
        for (int i = 0; i < 3; i++) {
            bool ok = kb * 2 * MOE_WGMMA_ATOMS_PER_STAGE + a_part[i] < n_groups;
            cp_async16(sa + a_dst[i],
                       ok ? a_src[i] + (size_t)kb * (MOE_WGMMA_ATOMS_PER_STAGE * 32) : eb, ok);
        }
        for (int c = tid; c < n_mma * MOE_WGMMA_ATOMS_PER_STAGE * 8;
             c += MOE_WGMMA_THREADS) { /* rows past n_mma are never read */
            int r = c / (MOE_WGMMA_ATOMS_PER_STAGE * 8), rem = c % (MOE_WGMMA_ATOMS_PER_STAGE * 8),
                a = rem >> 3, ch = rem & 7, atom = kb * MOE_WGMMA_ATOMS_PER_STAGE + a;
            bool ok = atom < n_atoms && r < n_rows;
            const __half *src = ok ? act + (size_t)s_src[r] * k_in + atom * 64 + ch * 8 : act;
            cp_async16(sb + a * (BN * 128) + r * 128 + ((ch ^ (r & 7)) << 4), src, ok);
        }
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < n_kb) issue(s);
        cp_async_commit();
    }
    const int f0 = frag * 16 + g, f1 = f0 + 8;
    const int srow0 = local_row(f0) * n_groups, srow1 = local_row(f1) * n_groups;

    /* Atom a of stage kb is dequantized into R[a] and its 4 MMAs committed as one group, which
     * runs while atom a + 1 is dequantized. R[a] is rewritten once the group that read it (atom a
     * of the stage before) is done: at most MOE_WGMMA_ATOMS_PER_STAGE - 1 groups pending. The stage
     * before's slot is refilled (stage kb + STAGES - 1) once every warpgroup has finished all its
     * groups. */
    uint32_t R[MOE_WGMMA_ATOMS_PER_STAGE][4][4];
    for (int kb = 0; kb < n_kb; kb++) {
        cp_async_wait<C::STAGES - 2>(); /* stage kb has landed */
        fence_proxy_async();            /* this thread's copies, visible to the tensor cores */
        __syncthreads();
        const uint8_t *sb = smem + (kb % C::STAGES) * C::STAGE_BYTES;
        const uint8_t *sa = sb + C::B_BYTES;
#pragma unroll
        for (int a = 0; a < MOE_WGMMA_ATOMS_PER_STAGE; a++) {
            wgmma_wait<MOE_WGMMA_ATOMS_PER_STAGE - 1>();
            if (a == MOE_WGMMA_ATOMS_PER_STAGE -
                         1) { /* stage kb - 1 is done here; once done everywhere, refill it */
                __syncthreads();
                if (kb + C::STAGES - 1 < n_kb) issue(kb + C::STAGES - 1);
                cp_async_commit();
            }
            const int grp = (kb * MOE_WGMMA_ATOMS_PER_STAGE + a) * 2 + (q >> 1);
            uint2 c0 =
                *(const uint2 *)(sa + f0 * (MOE_WGMMA_ATOMS_PER_STAGE * 32) + a * 32 + q * 8);
            uint2 c1 =
                *(const uint2 *)(sa + f1 * (MOE_WGMMA_ATOMS_PER_STAGE * 32) + a * 32 + q * 8);
            uint32_t s0 = grp < n_groups ? s_scale[srow0 + grp] : 127u;
            uint32_t s1 = grp < n_groups ? s_scale[srow1 + grp] : 127u;
            uint32_t m0 = ((s0 - 98u) << 10) * 0x00010001u, m1 = ((s1 - 98u) << 10) * 0x00010001u;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                uint32_t w0 = w ? c0.y : c0.x, w1 = w ? c1.y : c1.x;
                uint32_t p0[4], p1[4];
                mma_fp4_pairs(w0, p0);
                mma_fp4_pairs(w1, p1);
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    R[a][2 * w + s][0] = hmul2_u32(p0[2 * s], m0);
                    R[a][2 * w + s][1] = hmul2_u32(p1[2 * s], m1);
                    R[a][2 * w + s][2] = hmul2_u32(p0[2 * s + 1], m0);
                    R[a][2 * w + s][3] = hmul2_u32(p1[2 * s + 1], m1);
                }
            }
            wgmma_fence();
            const uint8_t *sba = sb + a * (BN * 128);
            if (n_mma > 96)
                wgmma_atom<128>(acc, R[a], sba); /* uniform in the block */
            else if (n_mma > 64)
                wgmma_atom<96>(acc, R[a], sba);
            else if (n_mma > 32)
                wgmma_atom<64>(acc, R[a], sba);
            else
                wgmma_atom<32>(acc, R[a], sba);
            wgmma_commit();
        }
    }
    wgmma_wait<0>();
    wg_pin(acc);

    /* epilogue: acc[4i + c] = row f0, token 8i + 2q + c; acc[4i + 2 + c] = row f1 */
    const float *ebias = bias + (size_t)e * n_out_rows;
    if (GATE_UP) {
        int u = blockIdx.x * (MOE_WGMMA_BLOCK_ROWS / 2) + frag * 8 + g;
        if (u < n_units) {
            float bg = ebias[2 * u], bu = ebias[2 * u + 1];
            int col = (u & ~63) | wg_pos(u & 63);
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int tok = i * 8 + 2 * q + c;
                    if (tok >= n_rows) continue;
                    float v = swiglu(acc[4 * i + c] + bg, acc[4 * i + 2 + c] + bu, limit, alpha);
                    h_out[(size_t)s_dst[tok] * n_units + col] = h_as_half(v);
                }
        }
    } else {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int rr = row0 + frag * 16 + 8 * hh + g;
            if (rr >= n_out_rows) continue;
            float b = ebias[rr];
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int tok = i * 8 + 2 * q + c;
                    if (tok >= n_rows) continue;
                    y_out[(size_t)s_dst[tok] * n_out_rows + rr] = acc[4 * i + 2 * hh + c] + b;
                }
        }
    }
#else
    (void)blocks, (void)scales, (void)bias, (void)act, (void)k_in, (void)n_out_rows, (void)route,
        (void)limit;
    (void)alpha, (void)h_out, (void)y_out;
    __trap(); /* never launched: gptoss_cuda_moe_prepare enables the wgmma GEMM on compute
                 capability 9.0 only */
#endif
}
template <int BN>
static void launch_wg(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                      const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream) {
    int32_t H = w->hidden, I = w->intermediate;
    int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, BN);
    launch_pdl(moe_wg_kernel<true, BN>,
               dim3((2 * I + MOE_WGMMA_BLOCK_ROWS - 1) / MOE_WGMMA_BLOCK_ROWS, tiles),
               dim3(MOE_WGMMA_THREADS), wg_cfg<BN>::smem(H / 32), stream, w->gate_up_blocks,
               w->gate_up_scales, w->gate_up_bias, t16, H, 2 * I, *route, w->swiglu_limit,
               w->swiglu_alpha, h, (float *)nullptr);
    launch_pdl(moe_wg_kernel<false, BN>,
               dim3((H + MOE_WGMMA_BLOCK_ROWS - 1) / MOE_WGMMA_BLOCK_ROWS, tiles),
               dim3(MOE_WGMMA_THREADS), wg_cfg<BN>::smem(I / 32), stream, w->down_blocks,
               w->down_scales, w->down_bias, (const __half *)h, I, H, *route, w->swiglu_limit,
               w->swiglu_alpha, (__half *)nullptr, y);
}

void gptoss_moe_wgmma_gemm(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                           int32_t k_top, const gptoss_cuda_route *route, __half *h, float *y,
                           cudaStream_t stream) {
    int32_t n_pairs = n_tokens * k_top;
    __half *t16 = (__half *)y; /* y is free until the down projection writes it */
    int64_t atoms = (int64_t)n_tokens * w->hidden / 64;
    launch_pdl(wg_convert_kernel, dim3((unsigned)((atoms + 127) / 128)), dim3(128), 0, stream, t,
               atoms, t16);
    launch_wg<MOE_WGMMA_TILE_ROWS>(w, t16, n_pairs, route, h, y, stream);
}

bool gptoss_moe_wgmma_gemm_prepare(int32_t widest) {
    return gptoss_cuda_kernel_smem((const void *)moe_wg_kernel<true, MOE_WGMMA_TILE_ROWS>,
                                   wg_cfg<MOE_WGMMA_TILE_ROWS>::smem(widest / 32)) == cudaSuccess &&
           gptoss_cuda_kernel_smem((const void *)moe_wg_kernel<false, MOE_WGMMA_TILE_ROWS>,
                                   wg_cfg<MOE_WGMMA_TILE_ROWS>::smem(widest / 32)) == cudaSuccess;
}
