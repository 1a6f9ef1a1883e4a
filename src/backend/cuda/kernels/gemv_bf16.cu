/*
 * gemv_bf16.cu - the bf16 GEMV for decode rows (register and TMA variants) and the decode
 * token's QKV projection fused with RoPE + KV write.
 */
#include "backend/cuda/kernels/rope_kv.cuh"
#include "backend/cuda/kernels/traits.h"

#include <stdlib.h>
#include <string.h>

/* ---- bf16 GEMV for decode rows ---------------------------------------------------------- */

/*
 * y[i, r] = x[i, :] . w[r, :] for m <= 4 rows of x: the decode shapes of the QKV and O
 * projections, where a GEMM library at M = 1 reaches about half the bandwidth. The block
 * stages x (bf16, m * k * 2 <= 32 KB) in shared memory; each warp takes two weight rows at a
 * time (grid-stride) and keeps 2 x GEMV_BF16_LOADS_IN_FLIGHT 16-byte loads per lane in flight; fp32
 * accumulation, one warp reduction per row. k % 8 == 0, rows 16-byte aligned.
 */

/* acc + w . x over the 8 bf16 of a 16-byte chunk each, in element order, fp32 FMAs. */
static __device__ __forceinline__ float bf16x8_dot(uint4 w, uint4 x, float acc) {
    const uint32_t wa[4] = {w.x, w.y, w.z, w.w}, xw[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc = fmaf(__uint_as_float(wa[j] << 16), __uint_as_float(xw[j] << 16), acc);
        acc = fmaf(__uint_as_float(wa[j] & 0xffff0000u), __uint_as_float(xw[j] & 0xffff0000u), acc);
    }
    return acc;
}

/* One lane's share of two weight rows w0 and w1 (16-byte chunks) dotted with the m staged
 * rows of xs: lanes stride the chunks, GEMV_BF16_LOADS_IN_FLIGHT loads of each row in flight, fp32
 * sums in chunk order (not yet reduced over the warp). */
template <int M>
static __device__ __forceinline__ void dg_two_rows(const uint4 *w0, const uint4 *w1,
                                                   const uint4 *xs, int chunks, int m, int lane,
                                                   float (&acc)[2][M]) {
#pragma unroll
    for (int i = 0; i < M; i++)
        acc[0][i] = acc[1][i] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * GEMV_BF16_LOADS_IN_FLIGHT) {
        uint4 a[GEMV_BF16_LOADS_IN_FLIGHT], b[GEMV_BF16_LOADS_IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < GEMV_BF16_LOADS_IN_FLIGHT; u++) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                a[u] = __ldg(w0 + c);
                b[u] = __ldg(w1 + c);
            } else {
                a[u] = b[u] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_BF16_LOADS_IN_FLIGHT; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks) break;
#pragma unroll
            for (int i = 0; i < M; i++) {
                if (i >= m) break;
                const uint4 xv = xs[i * chunks + c];
                acc[0][i] = bf16x8_dot(a[u], xv, acc[0][i]);
                acc[1][i] = bf16x8_dot(b[u], xv, acc[1][i]);
            }
        }
    }
}

/* Warm L2 with the bytes of rows r0 and r1 (each k bf16) while the previous kernel finishes:
 * each lane a 128-byte line in turn. */
static __device__ __forceinline__ void dg_prefetch_rows(const bf16 *w, int r0, int r1, int k,
                                                        int lane) {
    const size_t bytes = (size_t)k * sizeof(bf16);
    const char *p0 = (const char *)(w + (size_t)r0 * k), *p1 = (const char *)(w + (size_t)r1 * k);
    for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p0 + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p1 + off));
    }
}

template <int M>
static __global__ void __launch_bounds__(GEMV_BF16_WARPS * 32)
    dense_gemv_kernel(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k) {
    extern __shared__ __align__(16) unsigned char dg_smem[];
    uint4 *xs = (uint4 *)dg_smem; /* [m][k / 8] */
    const int chunks = k >> 3;
    { /* warm L2 with this warp's first rows while the previous kernel finishes */
        int r = 2 * (blockIdx.x * GEMV_BF16_WARPS + (threadIdx.x >> 5));
        if (r < n) {
            const char *p0 = (const char *)(w + (size_t)r * k);
            size_t bytes = (size_t)(r + 1 < n ? 2 : 1) * k * sizeof(bf16);
            for (size_t off = (size_t)(threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(p0 + off));
        }
    }
    pdl_wait();
    for (int i = threadIdx.x; i < m * chunks; i += blockDim.x)
        xs[i] = ((const uint4 *)x)[i];
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int row0 = 2 * (blockIdx.x * GEMV_BF16_WARPS + warp); row0 < n;
         row0 += 2 * gridDim.x * GEMV_BF16_WARPS) {
        const bool two = row0 + 1 < n;
        const uint4 *w0 = (const uint4 *)(w + (size_t)row0 * k);
        const uint4 *w1 = two ? w0 + chunks : w0;
        float acc[2][M];
        dg_two_rows<M>(w0, w1, xs, chunks, m, lane, acc);
#pragma unroll
        for (int i = 0; i < M; i++) {
            if (i >= m) break;
            float v0 = warp_sum(acc[0][i]), v1 = warp_sum(acc[1][i]);
            if (lane == 0) {
                y[(size_t)i * n + row0] = v0;
                if (two) y[(size_t)i * n + row0 + 1] = v1;
            }
        }
    }
}

/*
 * The same product on sm_90 with the weights staged by the copy engine: block b takes rows
 * [GEMV_BF16_TMA_ROWS * b, GEMV_BF16_TMA_ROWS * b + GEMV_BF16_TMA_ROWS) (contiguous), and its
 * thread 0 copies them into shared memory with one bulk copy before the PDL wait, since weights
 * depend on no earlier kernel. The copies of every resident block so stream in while the previous
 * kernels run (the attention before O, the norm before QKV), with no registers held, where the
 * kernel above has only its first rows prefetched to L2 and 4 KB in flight per warp. After the wait
 * the block stages x and each warp reduces one row from shared memory, in the order the kernel
 * above uses (so the two give identical results). One wave holds 3-4 blocks per SM:
 * the 20b/120b O projection (2880 rows) fits in one, QKV (5120) needs 1.2 (see
 * gptoss_cuda_gemv_kernel for which runs where).
 */

static size_t gemv_tma_smem(int32_t m, int32_t k) {
    return (size_t)(GEMV_BF16_TMA_ROWS + m) * k * sizeof(bf16);
}

template <int M>
static __global__ void __launch_bounds__(GEMV_BF16_TMA_ROWS * 32)
    dense_gemv_tma_kernel(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char dt_smem[];
    __shared__ __align__(8) uint64_t bar;
    const int chunks = k >> 3, row0 = blockIdx.x * GEMV_BF16_TMA_ROWS,
              rows = min(GEMV_BF16_TMA_ROWS, n - row0);
    uint4 *ws = (uint4 *)dt_smem, *xs = ws + (size_t)GEMV_BF16_TMA_ROWS * chunks;
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        mbar_init(bar_s);
        const uint32_t bytes = (uint32_t)rows * (uint32_t)k * (uint32_t)sizeof(bf16);
        mbar_expect_tx(bar_s, bytes);
        bulk_copy(ws, w + (size_t)row0 * k, bytes, bar_s);
    }
    pdl_wait();
    for (int i = threadIdx.x; i < m * chunks; i += blockDim.x)
        xs[i] = ((const uint4 *)x)[i];
    __syncthreads(); /* x is staged, and every thread sees the initialized barrier */
    mbar_wait(bar_s, 0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= rows) return;
    const uint4 *wr = ws + (size_t)warp * chunks;
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; i++)
        acc[i] = 0.0f;
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
        const uint4 a = wr[c];
#pragma unroll
        for (int i = 0; i < M; i++) {
            if (i >= m) break;
            acc[i] = bf16x8_dot(a, xs[i * chunks + c], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < M; i++) {
        if (i >= m) break;
        float v = warp_sum(acc[i]);
        if (lane == 0) y[(size_t)i * n + row0 + warp] = v;
    }
#else
    __trap(); /* never launched: the host picks this kernel only where it was built for sm_90 or
                 later */
#endif
}

void gptoss_cuda_gemv_set_kernel(int kernel) {
    gptoss_cuda_kernel_ctx_current()->gemv_kernel = kernel;
}

/* The bulk-copy kernel by default only where its blocks fit in one wave: its copies start
 * before the wait only in resident blocks, and a second wave's start after the first wave's
 * end. Measured (H100, tg128, every projection on it): O (2880 rows, one wave) 11.6 -> 9.5 us
 * per layer, QKV (5120 rows, 1.2 waves) 12.2 -> 13.5 us. */
int gptoss_cuda_gemv_kernel(int32_t m, int32_t n, int32_t k) {
    const gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    if (kc->gemv_kernel == 1 || !kc->gemv_tma_ok) return 1;
    if (kc->gemv_kernel == 2) return 2;
    const int64_t per_sm =
        kc->gemv_sm_smem / ((int64_t)gemv_tma_smem(m, k) + 1024); /* 1 KB reserved per block */
    return (int64_t)(n + GEMV_BF16_TMA_ROWS - 1) / GEMV_BF16_TMA_ROWS <= per_sm * kc->gemv_sms ? 2
                                                                                               : 1;
}

cudaError_t gptoss_cuda_gemv_prepare(void) {
    gptoss_cuda_kernel_ctx *kc = gptoss_cuda_kernel_ctx_current();
    const int bytes = (int)gemv_tma_smem(GPTOSS_GEMV_MAX_ROWS, 4096);
    int dev = 0;
    /* the bulk-copy kernel only where the context's capabilities have TMA (not under the
     * ampere or ada profile) and the code that runs was built for it */
    bool ok =
        kc->caps.tma && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&kc->gemv_sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
    kc->gemv_sm_smem = (int)kc->caps.smem_per_sm;
#define PREP(M)                                                                                    \
    ok = ok && gptoss_cuda_runs_sm90_code((const void *)dense_gemv_tma_kernel<M>) &&               \
         gptoss_cuda_kernel_smem((const void *)dense_gemv_tma_kernel<M>, bytes) == cudaSuccess;
    PREP(1)
    PREP(2)
    PREP(4)
#undef PREP
    kc->gemv_tma_ok = ok;
    (void)cudaGetLastError(); /* a kernel that does not run here is not an error: the other one runs
                               */
    return cudaSuccess;
}

int gptoss_cuda_gemv_bf16(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k,
                          int32_t n_sms, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    if (m > GPTOSS_GEMV_MAX_ROWS || k % 8 != 0 || k > 4096 ||
        ((uintptr_t)w | (uintptr_t)x) % 16 != 0)
        return 1;
    if (gptoss_cuda_gemv_kernel(m, n, k) == 2) {
        const dim3 grid((n + GEMV_BF16_TMA_ROWS - 1) / GEMV_BF16_TMA_ROWS),
            block(GEMV_BF16_TMA_ROWS * 32);
        const size_t smem = gemv_tma_smem(m, k);
        if (m == 1)
            launch_pdl(dense_gemv_tma_kernel<1>, grid, block, smem, stream, w, x, y, m, n, k);
        else if (m == 2)
            launch_pdl(dense_gemv_tma_kernel<2>, grid, block, smem, stream, w, x, y, m, n, k);
        else
            launch_pdl(dense_gemv_tma_kernel<4>, grid, block, smem, stream, w, x, y, m, n, k);
        return 0;
    }
    size_t smem = (size_t)m * k * sizeof(bf16);
    int want = (n + 2 * GEMV_BF16_WARPS - 1) / (2 * GEMV_BF16_WARPS);
    int grid = want < 4 * n_sms ? want : 4 * n_sms;
    if (m == 1)
        launch_pdl(dense_gemv_kernel<1>, dim3(grid), dim3(GEMV_BF16_WARPS * 32), smem, stream, w, x,
                   y, m, n, k);
    else if (m == 2)
        launch_pdl(dense_gemv_kernel<2>, dim3(grid), dim3(GEMV_BF16_WARPS * 32), smem, stream, w, x,
                   y, m, n, k);
    else
        launch_pdl(dense_gemv_kernel<4>, dim3(grid), dim3(GEMV_BF16_WARPS * 32), smem, stream, w, x,
                   y, m, n, k);
    return 0;
}

/*
 * One decode token: the QKV projection with the bias, RoPE and the bf16 KV write in its
 * epilogue, so the attention kernel waits on the projection itself, not on a RoPE kernel
 * behind it (one grid dependency and one L2 round trip less per layer). Warp w of the grid
 * takes the RoPE pair (j, j + D/2) of head w / (D/2): rows head * D + j and head * D + j +
 * D/2 of the projection (q heads, then k, then v, whose pair is not rotated). The sums are
 * dense_gemv_kernel's (dg_two_rows) and the rotation the RoPE kernel's (rope_rotate), so the
 * q, K and V it writes are bit for bit those of the two kernels. Before the PDL wait, from
 * the plan and the weights only: the L2 prefetch of the warp's rows, the angle, the biases
 * and the page slot.
 */
static __global__ void __launch_bounds__(GEMV_BF16_WARPS * 32)
    qkv_rope_one_kernel(const bf16 *w, const bf16 *x, const float *qkv_bias,
                        const int32_t *positions, const int32_t *token_seq, const float *inv_freq,
                        float concentration, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                        int32_t k, const int32_t *block_tables, int32_t max_blocks,
                        int32_t block_size, float *q_out, bf16 *k_cache, bf16 *v_cache) {
    extern __shared__ __align__(16) unsigned char qr_smem[];
    uint4 *xs = (uint4 *)qr_smem; /* [k / 8] */
    const int chunks = k >> 3, half = head_dim >> 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pr = blockIdx.x * GEMV_BF16_WARPS + warp;
    const bool active = pr < (n_heads + 2 * n_kv_heads) * half;
    const int head = active ? pr / half : 0, j = pr % half;
    const int r0 = head * head_dim + j, r1 = r0 + half;
    const bool is_q = head < n_heads, is_k = !is_q && head < n_heads + n_kv_heads;
    float c = 0.0f, sn = 0.0f, b0 = 0.0f, b1 = 0.0f;
    size_t slot = 0;
    if (active) {
        dg_prefetch_rows(w, r0, r1, k, lane);
        if (lane == 0) {
            const int p = positions[0];
            b0 = qkv_bias[r0];
            b1 = qkv_bias[r1];
            if (is_q || is_k) rope_cos_sin(p, inv_freq[j], concentration, &c, &sn);
            if (!is_q)
                slot = kv_page_slot(block_tables, token_seq[0], max_blocks, block_size, p,
                                    n_kv_heads, (head - n_heads) % n_kv_heads);
        }
    }
    pdl_wait(); /* x comes from the residual norm */
    for (int i = threadIdx.x; i < chunks; i += blockDim.x)
        xs[i] = ((const uint4 *)x)[i];
    __syncthreads();
    if (!active) return;
    float acc[2][1];
    dg_two_rows<1>((const uint4 *)(w + (size_t)r0 * k), (const uint4 *)(w + (size_t)r1 * k), xs,
                   chunks, 1, lane, acc);
    const float v0 = warp_sum(acc[0][0]), v1 = warp_sum(acc[1][0]);
    if (lane != 0) return;
    const float a = v0 + b0, b = v1 + b1;
    if (is_q) {
        float ra, rb;
        rope_rotate(a, b, c, sn, &ra, &rb);
        const float scale = rsqrtf((float)head_dim);
        q_out[head * head_dim + j] = ra * scale;
        q_out[head * head_dim + j + half] = rb * scale;
    } else if (is_k) {
        float ra, rb;
        rope_rotate(a, b, c, sn, &ra, &rb);
        k_cache[slot * head_dim + j] = __float2bfloat16(ra);
        k_cache[slot * head_dim + j + half] = __float2bfloat16(rb);
    } else {
        v_cache[slot * head_dim + j] = __float2bfloat16(a);
        v_cache[slot * head_dim + j + half] = __float2bfloat16(b);
    }
}

int gptoss_cuda_qkv_rope_one(const bf16 *w, const bf16 *x, const float *qkv_bias,
                             const int32_t *positions, const int32_t *token_seq,
                             const float *inv_freq, float concentration, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, int32_t hidden,
                             const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                             float *q_out, bf16 *k_cache, bf16 *v_cache, cudaStream_t stream) {
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > 128 ||
        hidden <= 0 || hidden % 8 != 0 || hidden > 4096 || block_size <= 0 ||
        ((uintptr_t)w | (uintptr_t)x) % 16 != 0)
        return 1;
    const int32_t pairs = (n_heads + 2 * n_kv_heads) * (head_dim / 2);
    launch_pdl(qkv_rope_one_kernel, dim3((pairs + GEMV_BF16_WARPS - 1) / GEMV_BF16_WARPS),
               dim3(GEMV_BF16_WARPS * 32), (size_t)hidden * sizeof(bf16), stream, w, x, qkv_bias,
               positions, token_seq, inv_freq, concentration, n_heads, n_kv_heads, head_dim, hidden,
               block_tables, max_blocks, block_size, q_out, k_cache, v_cache);
    return 0;
}
