/*
 * slab_gemm.cu - the mma GEMM's 8-row route tiles (batched decode steps, a few rows per expert)
 * with the weights streamed as whole 16-row slabs by bulk copies (sm_90 and up); the moe_mma_slab
 * knob puts path 4's 8-row tiles here.
 *
 * Why: the mma GEMM's pipeline stage takes 64 to 192 code bytes from each of 192 rows 1440 bytes
 * apart, an order the memory serves at 2.05 to about 2.8 TB/s on an H100, where whole 16-row
 * slabs (23 KB contiguous at width 2880) come at about 3.09 (bench/moe-stream.cu). A slab is
 * also exactly what one m16 MMA fragment multiplies over the whole K.
 *
 * Block (SLAB_PER_BLOCK slabs of one projection, one route tile), MOE_PAIR_TMA_K_SLICES warps. The
 * tile's up to 8 tokens are staged once, for the whole K, as fp16 chunks in the mma layout (the
 * mma GEMM's stage layout, rows one after another); thread 0 copies slab i with two bulk copies
 * (codes, then scale bytes: both contiguous in the checkpoint) into buffer i % SLAB_BUFS,
 * completing on that buffer's mbarrier, SLAB_BUFS - 1 slabs ahead of the one computed. Warp w
 * multiplies K slice w of the slab (the TMA pair kernel's slices) with every staged token at
 * once: lane (g, q) supplies token g as its B column, and each window is mma_dense_window, the
 * arithmetic of the dense pair kernel and of the sliced mma GEMM. The slice sums meet in shared
 * memory, and after the one barrier a slab takes, the threads that own an output add them in
 * slice order (from zero, as pair_finish does) and write it while the warps go on to the next
 * slab; the barrier also frees the buffer for the copy of slab i + SLAB_BUFS.
 *
 * So every output is bitwise the dense pair kernel's for its pair alone (the batch-invariant mode
 * may run it as well): the same MMAs on the same operands in the same order per slice (an MMA's
 * column depends on its own B column only), the same slice sums in the same order.
 *
 * Shared memory at width 2880: two slab buffers of 24,480 bytes and 8 token rows of 5,888 (23
 * windows of 256 bytes), 96 KB, so two blocks fit an SM: 12 warps, and at least two slabs in
 * flight per SM while they compute.
 */
#include "backend/cuda/kernels/moe/fp4.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/moe/moe_internal.h"

#define SLAB_ROWS 16      /* weight rows per slab: one m16 fragment */
#define SLAB_TOKENS 8     /* the route tile height this kernel takes: one n8 fragment */
#define SLAB_PER_BLOCK 12 /* slabs a block streams: 192 rows, the mma GEMM's row block */
#define SLAB_BUFS 2       /* slab buffers a block cycles through */
#define SLAB_WARPS MOE_PAIR_TMA_K_SLICES

/* Dynamic shared memory, bytes from its start (16-byte multiples): SLAB_BUFS buffers of one
 * slab's codes (16 rows of k_in / 32 groups of 16 bytes) then its scale bytes (16 rows of
 * k_in / 32), then the SLAB_TOKENS token rows of row_stride bytes (whole windows of 128 inputs). */
struct slab_layout {
    uint32_t scale_off, buf_bytes, token_off, row_stride, bytes;
};
static __host__ __device__ __forceinline__ slab_layout slab_parts(int32_t k_in) {
    const uint32_t n_groups = (uint32_t)k_in / 32, n_win = (n_groups + 3) / 4;
    slab_layout l;
    l.scale_off = SLAB_ROWS * 16 * n_groups;
    l.buf_bytes = l.scale_off + SLAB_ROWS * n_groups;
    l.token_off = SLAB_BUFS * l.buf_bytes;
    l.row_stride = 256 * n_win;
    l.bytes = l.token_off + SLAB_TOKENS * l.row_stride;
    return l;
}

/* Two blocks an SM (228 KB of shared memory, 1 KB of it reserved per block) at the gpt-oss
 * width: the dynamic part above plus the kernel's static arrays (barriers, slice sums, biases,
 * row indices). A change that breaks this halves the copies in flight. */
constexpr uint32_t slab_static_bytes = SLAB_BUFS * 8 +
                                       2 * SLAB_WARPS * SLAB_ROWS * SLAB_TOKENS * 4 +
                                       SLAB_PER_BLOCK * SLAB_ROWS * 4 + 2 * SLAB_TOKENS * 4;
constexpr uint32_t slab_dynamic_bytes_2880 =
    SLAB_BUFS * (SLAB_ROWS * 17 * 90) + SLAB_TOKENS * 256 * ((90 + 3) / 4);
static_assert(2 * (slab_dynamic_bytes_2880 + slab_static_bytes + 1024) <= 228 * 1024,
              "the slab kernel no longer fits two blocks an SM at width 2880");

template <bool GATE_UP>
static __global__ void __launch_bounds__(SLAB_WARPS * 32, 2)
    moe_slab_kernel(const uint8_t *blocks, const uint8_t *scales, const float *bias,
                    const __half *act, int32_t k_in, int32_t n_out_rows, gptoss_cuda_route route,
                    float limit, float alpha, __half *h_out, float *y_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t sl_smem[];
    __shared__ __align__(8) uint64_t bars[SLAB_BUFS];
    __shared__ float red[2][SLAB_WARPS][SLAB_ROWS][SLAB_TOKENS]; /* slice sums, by slab parity */
    __shared__ float s_bias[SLAB_PER_BLOCK * SLAB_ROWS];
    __shared__ int32_t s_src[SLAB_TOKENS], s_dst[SLAB_TOKENS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int n_groups = k_in >> 5, n_win = (n_groups + 3) >> 2;
    const uint32_t row_bytes = 16u * (uint32_t)n_groups, code_bytes = SLAB_ROWS * row_bytes,
                   scale_bytes = SLAB_ROWS * (uint32_t)n_groups;
    const slab_layout lay = slab_parts(k_in);
    const int n_slabs = n_out_rows / SLAB_ROWS, s0 = blockIdx.x * SLAB_PER_BLOCK,
              n_mine = min(SLAB_PER_BLOCK, n_slabs - s0), tile = blockIdx.y;
    uint8_t *toks = sl_smem + lay.token_off;
    int e = -1;
    /* slab s0 + i of expert e into buffer i % SLAB_BUFS (thread 0) */
    auto issue = [&](int i) {
        const int b = i % SLAB_BUFS;
        const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&bars[b]);
        uint8_t *buf = sl_smem + b * lay.buf_bytes;
        const size_t row0 = (size_t)e * n_out_rows + (size_t)SLAB_ROWS * (s0 + i);
        mbar_expect_tx(bar, code_bytes + scale_bytes);
        bulk_copy(buf, blocks + row0 * row_bytes, code_bytes, bar);
        bulk_copy(buf + lay.scale_off, scales + row0 * n_groups, scale_bytes, bar);
    };
    if (tid == 0)
        for (int b = 0; b < SLAB_BUFS; b++)
            mbar_init((uint32_t)__cvta_generic_to_shared(&bars[b]));
    if (!GATE_UP) {
        /* The route was built before gate_up passed its PDL wait, and this grid starts only once
         * every gate_up block has passed it (pdl_wait triggers after waiting), so the tile's
         * expert is readable here and its slabs stream in while gate_up ends. */
        e = route.tile_expert[tile];
        if (e >= 0 && tid == 0)
            for (int i = 0; i < SLAB_BUFS && i < n_mine; i++)
                issue(i);
    }
    pdl_wait(); /* gate_up: the route and the converted input; down: h */
    if (GATE_UP) {
        e = route.tile_expert[tile];
        if (e >= 0 && tid == 0)
            for (int i = 0; i < SLAB_BUFS && i < n_mine; i++)
                issue(i);
    }
    if (e < 0) return;
    const int r0 = route.tile_row[tile];
    const int n_rows = min(SLAB_TOKENS, route.expert_offsets[e + 1] - r0);
    if (tid < SLAB_TOKENS) {
        const int r = r0 + min(tid, n_rows - 1);
        s_src[tid] = GATE_UP ? route.sorted_token[r] : r;
        s_dst[tid] = GATE_UP ? r : route.sorted_pair[r];
    }
    {
        const float *ebias = bias + (size_t)e * n_out_rows + (size_t)SLAB_ROWS * s0;
        for (int i = tid; i < n_mine * SLAB_ROWS; i += blockDim.x)
            s_bias[i] = ebias[i];
    }
    __syncthreads(); /* s_src, and every thread sees the initialized barriers */
    /* The tokens: natural chunk c = 16 W + 4 j + w of a row (the 8 inputs word w of group 4 W + j
     * multiplies) at chunk (4 w + j) ^ (r & 1) * 4 of window W, as the mma GEMM stages them, so
     * the eight lanes of a 16-byte load phase cover all 32 banks. Rows past the tile's and groups
     * past k_in are zero-filled. */
    {
        const int per_row = n_win * 16;
        for (int c = tid; c < SLAB_TOKENS * per_row; c += blockDim.x) {
            const int r = c / per_row, nc = c - r * per_row, W = nc >> 4, j = (nc >> 2) & 3,
                      w = nc & 3;
            const bool ok = r < n_rows && 4 * W + j < n_groups;
            const __half *src = ok ? act + (size_t)s_src[r] * k_in + (size_t)nc * 8 : act;
            cp_async16(toks + r * lay.row_stride + W * 256 + (((4 * w + j) ^ ((r & 1) * 4)) * 16),
                       src, ok);
        }
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncthreads(); /* the tokens are staged */

    const int per = (n_win + SLAB_WARPS - 1) / SLAB_WARPS;
    const int w0 = min(n_win, warp * per), w1 = min(n_win, w0 + per);
    const int la = GATE_UP ? 2 * g : g, lb = GATE_UP ? la + 1 : la + 8;
    const uint8_t *xrow = toks + g * lay.row_stride;
    const int xsw = (g & 1) * 4;
    const int n_units = n_out_rows >> 1;
    for (int i = 0; i < n_mine; i++) {
        const int b = i % SLAB_BUFS;
        const uint8_t *codes = sl_smem + b * lay.buf_bytes, *sc = codes + lay.scale_off;
        const uint8_t *ca = codes + la * row_bytes + 16 * q, *cb = codes + lb * row_bytes + 16 * q;
        const uint8_t *sa = sc + la * n_groups + q, *sb = sc + lb * n_groups + q;
        mbar_wait((uint32_t)__cvta_generic_to_shared(&bars[b]), (uint32_t)(i / SLAB_BUFS) & 1u);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int W = w0; W < w1; W++) {
            const bool in = 4 * W + q < n_groups;
            const uint4 zero = make_uint4(0, 0, 0, 0);
            uint4 x[4];
#pragma unroll
            for (int w = 0; w < 4; w++)
                x[w] = *(const uint4 *)(xrow + W * 256 + (((4 * w + q) ^ xsw) * 16));
            mma_dense_window(in ? *(const uint4 *)(ca + 64 * W) : zero,
                             in ? *(const uint4 *)(cb + 64 * W) : zero,
                             in ? (uint32_t)sa[4 * W] : 127u, in ? (uint32_t)sb[4 * W] : 127u, x,
                             acc);
        }
        /* acc: rows a (0, 1) and b (2, 3) of the slab x tokens 2q, 2q + 1 */
        float(*rd)[SLAB_TOKENS] = red[i & 1][warp];
        rd[la][2 * q] = acc[0];
        rd[la][2 * q + 1] = acc[1];
        rd[lb][2 * q] = acc[2];
        rd[lb][2 * q + 1] = acc[3];
        __syncthreads(); /* every slice is in red, and buffer b is free */
        if (tid == 0 && i + SLAB_BUFS < n_mine) issue(i + SLAB_BUFS);
        const int slab = s0 + i;
        if (GATE_UP) {
            const int tok = tid >> 3, ul = tid & 7; /* unit 8 slab + ul */
            if (tid < 8 * SLAB_TOKENS && tok < n_rows) {
                float gate = 0.0f, up = 0.0f;
#pragma unroll
                for (int s = 0; s < SLAB_WARPS; s++) {
                    gate += red[i & 1][s][2 * ul][tok];
                    up += red[i & 1][s][2 * ul + 1][tok];
                }
                const int u = 8 * slab + ul;
                const float v = swiglu(gate + s_bias[SLAB_ROWS * i + 2 * ul],
                                       up + s_bias[SLAB_ROWS * i + 2 * ul + 1], limit, alpha);
                h_out[(size_t)s_dst[tok] * n_units + ((u & ~7) | mma_pos(u & 7))] = h_as_half(v);
            }
        } else {
            const int tok = tid >> 4, rr = tid & 15;
            if (tid < SLAB_ROWS * SLAB_TOKENS && tok < n_rows) {
                float v = 0.0f;
#pragma unroll
                for (int s = 0; s < SLAB_WARPS; s++)
                    v += red[i & 1][s][rr][tok];
                y_out[(size_t)s_dst[tok] * n_out_rows + SLAB_ROWS * slab + rr] =
                    v + s_bias[SLAB_ROWS * i + rr];
            }
        }
    }
#else
    __trap(); /* never launched: the host picks this kernel only where it was built for sm_90 or
                 later */
#endif
}

bool gptoss_moe_slab_prepare(int32_t widest) {
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    const size_t bytes = slab_parts(widest).bytes;
    kc->moe_slab_ok =
        kc->caps.tma && gptoss_cuda_runs_sm90_code((const void *)moe_slab_kernel<true>) &&
        gptoss_cuda_runs_sm90_code((const void *)moe_slab_kernel<false>) &&
        gptoss_cuda_kernel_smem((const void *)moe_slab_kernel<true>, bytes) == cudaSuccess &&
        gptoss_cuda_kernel_smem((const void *)moe_slab_kernel<false>, bytes) == cudaSuccess;
    (void)cudaGetLastError(); /* a refused attribute is not an error: the kernel is not used */
    return kc->moe_slab_ok;
}

bool gptoss_moe_slab_wanted(const gptoss_cuda_route *route) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    return route->tile_rows == SLAB_TOKENS && kc->moe_mma_slab && kc->moe_slab_ok;
}

void gptoss_moe_slab_gemm(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                          const gptoss_cuda_route *route, __half *h, float *y,
                          cudaStream_t stream) {
    const int32_t H = w->hidden, I = w->intermediate;
    const int32_t tiles = gptoss_cuda_route_tiles(n_pairs, w->n_experts, SLAB_TOKENS);
    if (tiles <= 0) return;
    const unsigned gu_blocks =
                       (unsigned)((2 * I / SLAB_ROWS + SLAB_PER_BLOCK - 1) / SLAB_PER_BLOCK),
                   dn_blocks = (unsigned)((H / SLAB_ROWS + SLAB_PER_BLOCK - 1) / SLAB_PER_BLOCK);
    launch_pdl(moe_slab_kernel<true>, dim3(gu_blocks, tiles), dim3(SLAB_WARPS * 32),
               slab_parts(H).bytes, stream, w->gate_up_blocks, w->gate_up_scales, w->gate_up_bias,
               t16, H, 2 * I, *route, w->swiglu_limit, w->swiglu_alpha, h, (float *)nullptr);
    launch_pdl(moe_slab_kernel<false>, dim3(dn_blocks, tiles), dim3(SLAB_WARPS * 32),
               slab_parts(I).bytes, stream, w->down_blocks, w->down_scales, w->down_bias,
               (const __half *)h, I, H, *route, w->swiglu_limit, w->swiglu_alpha, (__half *)nullptr,
               y);
}
