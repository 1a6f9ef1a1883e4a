/*
 * router.cu - the MoE router: logits (fp32 activations), the one-token router and the fused
 * residual norm + router, top-k with softmax weights, and the row gather.
 */
#include "backend/cuda/kernels/ptx.cuh"
#include "backend/cuda/kernels/traits.h"

#include <math.h>

/* ---- router logits (fp32 activations) ---------------------------------------------------- */

/* Routing is a discrete choice, so its logits are computed from the fp32 normalized input
 * (not its bf16 copy): grid (ceil(T / 8), ceil(E / 8)), 8 warps; a block stages 8 token rows
 * in shared memory and each warp produces one expert's logits for them (lanes stride the
 * row in bf16 pairs). */

static __device__ void topk_warp(const volatile float *row, const float *bias, int32_t n_experts,
                                 int32_t k_top, int32_t *topk_idx, float *topk_weight);

/* Whether this block is the last of the grid to get here (atomic ticket on counter, which the
 * last block re-arms); every block's earlier writes are then visible to it. Every thread of
 * the block must call it. The block barrier orders its threads' writes before thread 0's
 * ticket, an acquire-release atomic at GPU scope (release: those writes reach the blocks that
 * take later tickets; acquire: the earlier blocks' writes reach this one), and the second
 * barrier orders the ticket before the block's reads. One atomic in place of a fence in every
 * thread, the atomic, and another fence in every thread of the last block. */
static __device__ __forceinline__ bool last_block(unsigned *counter, unsigned n_blocks) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                     : "=r"(prev)
                     : "l"(counter)
                     : "memory");
        last = prev == n_blocks - 1;
    }
    __syncthreads();
    return last;
}

static __global__ void router_logits_kernel(const float *t, const bf16 *weight, const float *bias,
                                            int32_t n_tokens, int32_t n_experts, int32_t hidden,
                                            float *logits, unsigned *done_counter, int32_t k_top,
                                            int32_t *topk_idx, float *topk_weight) {
    extern __shared__ __align__(
        ROUTER_SMEM_ALIGN) float rows[]; /* [ROUTER_TOKENS_PER_BLOCK][hidden] */
    pdl_wait();
    int t0 = blockIdx.x * ROUTER_TOKENS_PER_BLOCK;
    int nt = min(ROUTER_TOKENS_PER_BLOCK, n_tokens - t0);
    for (int i = threadIdx.x; i < nt * hidden; i += blockDim.x)
        rows[i] = t[(size_t)t0 * hidden + i];
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    for (int e = blockIdx.y * n_warps + warp; e < n_experts; e += gridDim.y * n_warps) {
        const uint4 *w = (const uint4 *)(weight + (size_t)e * hidden);
        float acc[ROUTER_TOKENS_PER_BLOCK] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int j = lane; j < hidden / 8; j += 32) { /* 8 weights per 16-byte load */
            uint4 wq = __ldg(w + j);
            const uint32_t ww[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
            for (int k = 0; k < ROUTER_TOKENS_PER_BLOCK; k++) {
                if (k >= nt) break;
                const float *xr = rows + k * hidden + 8 * j;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[k] += __uint_as_float(ww[i] << 16) * xr[2 * i] +
                              __uint_as_float(ww[i] & 0xffff0000u) * xr[2 * i + 1];
            }
        }
#pragma unroll
        for (int k = 0; k < ROUTER_TOKENS_PER_BLOCK; k++) {
            float v = warp_sum(acc[k]);
            if (lane == 0 && k < nt) logits[(size_t)(t0 + k) * n_experts + e] = v + bias[e];
        }
    }
    if (!done_counter) return;
    /* Fused top-k: the last block to finish (every logit is then written and, after the
     * fences, visible) runs it for all tokens and re-arms the counter for the next launch. */
    if (!last_block(done_counter, gridDim.x * gridDim.y)) return;
    for (int tok = warp; tok < n_tokens; tok += n_warps)
        topk_warp(logits + (size_t)tok * n_experts, nullptr, n_experts, k_top,
                  topk_idx + (size_t)tok * k_top, topk_weight + (size_t)tok * k_top);
    if (threadIdx.x == 0) *done_counter = 0u;
}

void gptoss_cuda_router_logits(const float *t, const bf16 *weight, const float *bias,
                               int32_t n_tokens, int32_t n_experts, int32_t hidden, float *logits,
                               cudaStream_t stream) {
    if (n_tokens <= 0) return;
    size_t smem = (size_t)ROUTER_TOKENS_PER_BLOCK * hidden * sizeof(float);
    dim3 grid((n_tokens + ROUTER_TOKENS_PER_BLOCK - 1) / ROUTER_TOKENS_PER_BLOCK,
              (n_experts + 7) / 8);
    router_logits_kernel<<<grid, 256, smem, stream>>>(t, weight, bias, n_tokens, n_experts, hidden,
                                                      logits, nullptr, 0, nullptr, nullptr);
}

/*
 * One decode token: one warp per expert, 4 per block. The router matrix does not depend on
 * earlier kernels, so each lane loads its 16-byte chunks of the row before pdl_wait (their
 * latency overlaps the norm kernel's tail), then reads the token straight from global memory
 * (just written, in L2) instead of staging it in shared memory. The last block to finish
 * runs the top-k as the general kernel does. Measured on an H100 (20b, ncu, caches flushed):
 * the general kernel took 18.9 us here with 4 blocks of 8 warps.
 */

/* One warp's router row (expert e, clamped to the last) into registers, 16 bytes per chunk. */
static __device__ __forceinline__ void router_row_load(const bf16 *weight, int e, int32_t n_experts,
                                                       int n_chunks, int lane,
                                                       uint4 (&wq)[ROUTER_ONE_MAX_CHUNKS]) {
    const uint4 *w = (const uint4 *)(weight + (size_t)min(e, n_experts - 1) * n_chunks * 8);
#pragma unroll
    for (int i = 0; i < ROUTER_ONE_MAX_CHUNKS; i++)
        if (lane + 32 * i < n_chunks) wq[i] = __ldg(w + lane + 32 * i);
}

/* The warp's row . the fp32 token t4 (every lane gets the sum). */
static __device__ __forceinline__ float router_row_dot(const uint4 (&wq)[ROUTER_ONE_MAX_CHUNKS],
                                                       const float4 *t4, int n_chunks, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTER_ONE_MAX_CHUNKS; i++) {
        int j = lane + 32 * i;
        if (j < n_chunks) {
            float4 a = t4[2 * j], b = t4[2 * j + 1];
            const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            const uint32_t ww[4] = {wq[i].x, wq[i].y, wq[i].z, wq[i].w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc += __uint_as_float(ww[k] << 16) * x[2 * k] +
                       __uint_as_float(ww[k] & 0xffff0000u) * x[2 * k + 1];
        }
    }
    return warp_sum(acc);
}

static __global__ void __launch_bounds__(ROUTER_ONE_WARPS * 32)
    router_one_kernel(const float *t, const bf16 *weight, const float *bias, int32_t n_experts,
                      int32_t hidden, float *logits, unsigned *done_counter, int32_t k_top,
                      int32_t *topk_idx, float *topk_weight) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * ROUTER_ONE_WARPS + warp, n_chunks = hidden >> 3;
    uint4 wq[ROUTER_ONE_MAX_CHUNKS];
    router_row_load(weight, e, n_experts, n_chunks, lane, wq);
    pdl_wait();
    const float acc = router_row_dot(wq, (const float4 *)t, n_chunks, lane);
    if (lane == 0 && e < n_experts) logits[e] = acc + bias[e];
    if (!last_block(done_counter, gridDim.x)) return;
    if (warp == 0) topk_warp(logits, nullptr, n_experts, k_top, topk_idx, topk_weight);
    if (threadIdx.x == 0) *done_counter = 0u;
}

void gptoss_cuda_router(const float *t, const bf16 *weight, const float *bias, int32_t n_tokens,
                        int32_t n_experts, int32_t hidden, int32_t k_top, float *logits,
                        unsigned *done_counter, int32_t *topk_idx, float *topk_weight,
                        cudaStream_t stream) {
    if (n_tokens <= 0) return;
    if (n_tokens == 1 && hidden % 8 == 0 && hidden <= 32 * 8 * ROUTER_ONE_MAX_CHUNKS) {
        launch_pdl(router_one_kernel, dim3((n_experts + ROUTER_ONE_WARPS - 1) / ROUTER_ONE_WARPS),
                   dim3(ROUTER_ONE_WARPS * 32), 0, stream, t, weight, bias, n_experts, hidden,
                   logits, done_counter, k_top, topk_idx, topk_weight);
        return;
    }
    size_t smem = (size_t)ROUTER_TOKENS_PER_BLOCK * hidden * sizeof(float);
    dim3 grid((n_tokens + ROUTER_TOKENS_PER_BLOCK - 1) / ROUTER_TOKENS_PER_BLOCK,
              (n_experts + 7) / 8);
    launch_pdl(router_logits_kernel, grid, dim3(256), smem, stream, t, weight, bias, n_tokens,
               n_experts, hidden, logits, done_counter, k_top, topk_idx, topk_weight);
}

/*
 * One decode token: the residual update + RMSNorm after the attention block fused with the router
 * (they were two kernels of 6.3 and 9.2 us on an H100, each mostly one latency chain). Each block
 * of NORM_ROUTER_WARPS warps loads its experts' router rows into registers before the PDL wait,
 * then recomputes the whole residual row and its norm (hidden floats from L2, cheap next to a
 * launch), keeps the normalized row in shared memory in fp32 and scores one expert per warp. The
 * last block to finish (atomic ticket) writes the new residual row and the bf16 normalized row,
 * which no block may write earlier (the others could still be reading x), and runs the top-k. The
 * norm's sum runs in another order than residual_rmsnorm_kernel's, so a row can differ from the
 * two-kernel path's by an ulp.
 */

static __global__ void __launch_bounds__(NORM_ROUTER_WARPS * 32)
    norm_router_one_kernel(float *__restrict__ x, const float *__restrict__ add,
                           const float *__restrict__ add_bias, const float *__restrict__ gain,
                           float eps, int32_t hidden, bf16 *__restrict__ out,
                           const bf16 *__restrict__ weight, const float *__restrict__ bias,
                           int32_t n_experts, float *logits, unsigned *done_counter, int32_t k_top,
                           int32_t *topk_idx, float *topk_weight) {
    extern __shared__ __align__(ROUTER_SMEM_ALIGN) float nr_row[]; /* [hidden] normalized, fp32 */
    __shared__ float partial[NORM_ROUTER_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * NORM_ROUTER_WARPS + warp, n_chunks = hidden >> 3, n4 = hidden >> 2;
    uint4 wq[ROUTER_ONE_MAX_CHUNKS];
    router_row_load(weight, e, n_experts, n_chunks, lane, wq);
    pdl_wait(); /* x and the O projection come from earlier kernels */
    float4 v[NORM_ROUTER_PER_THREAD], g[NORM_ROUTER_PER_THREAD];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NORM_ROUTER_PER_THREAD; c++) {
        const int j = threadIdx.x + c * NORM_ROUTER_WARPS * 32;
        if (j < n4) {
            float4 a = ((const float4 *)x)[j], b = ((const float4 *)add)[j],
                   cb = ((const float4 *)add_bias)[j];
            g[c] = ((const float4 *)gain)[j];
            v[c] = make_float4(a.x + (b.x + cb.x), a.y + (b.y + cb.y), a.z + (b.z + cb.z),
                               a.w + (b.w + cb.w));
            ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
        }
    }
    ss = warp_sum(ss);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_ROUTER_WARPS; i++)
        total += partial[i];
    const float inv = rsqrtf(total / (float)hidden + eps);
#pragma unroll
    for (int c = 0; c < NORM_ROUTER_PER_THREAD; c++) {
        const int j = threadIdx.x + c * NORM_ROUTER_WARPS * 32;
        if (j < n4)
            ((float4 *)nr_row)[j] = make_float4(g[c].x * (v[c].x * inv), g[c].y * (v[c].y * inv),
                                                g[c].z * (v[c].z * inv), g[c].w * (v[c].w * inv));
    }
    __syncthreads();
    const float4 *t4 = (const float4 *)nr_row;
    const float acc = router_row_dot(wq, t4, n_chunks, lane);
    if (lane == 0 && e < n_experts) logits[e] = acc + bias[e];
    if (!last_block(done_counter, gridDim.x)) return;
#pragma unroll
    for (int c = 0; c < NORM_ROUTER_PER_THREAD; c++) {
        const int j = threadIdx.x + c * NORM_ROUTER_WARPS * 32;
        if (j < n4) {
            ((float4 *)x)[j] = v[c];
            const float4 y = t4[j];
            __nv_bfloat162 lo = __floats2bfloat162_rn(y.x, y.y),
                           hi = __floats2bfloat162_rn(y.z, y.w);
            ((uint2 *)out)[j] = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
        }
    }
    if (warp == 0) topk_warp(logits, nullptr, n_experts, k_top, topk_idx, topk_weight);
    if (threadIdx.x == 0) *done_counter = 0u;
}

int gptoss_cuda_norm_router_one(float *x, const float *add, const float *add_bias,
                                const float *gain, float eps, int32_t hidden, bf16 *out,
                                const bf16 *weight, const float *bias, int32_t n_experts,
                                int32_t k_top, float *logits, unsigned *done_counter,
                                int32_t *topk_idx, float *topk_weight, cudaStream_t stream) {
    if (hidden % 8 != 0 || hidden > NORM_ROUTER_WARPS * 32 * 4 * NORM_ROUTER_PER_THREAD ||
        hidden > 32 * 8 * ROUTER_ONE_MAX_CHUNKS || add_bias == NULL || n_experts < 1 || k_top < 1 ||
        k_top > 32 || k_top > n_experts ||
        ((uintptr_t)x | (uintptr_t)add | (uintptr_t)add_bias | (uintptr_t)gain | (uintptr_t)out |
         (uintptr_t)weight) %
            16)
        return 1;
    launch_pdl(norm_router_one_kernel,
               dim3((n_experts + NORM_ROUTER_WARPS - 1) / NORM_ROUTER_WARPS),
               dim3(NORM_ROUTER_WARPS * 32), (size_t)hidden * sizeof(float), stream, x, add,
               add_bias, gain, eps, hidden, out, weight, bias, n_experts, logits, done_counter,
               k_top, topk_idx, topk_weight);
    return 0;
}

cudaError_t gptoss_cuda_router_prepare(int32_t hidden) {
    return gptoss_cuda_kernel_smem((const void *)router_logits_kernel,
                                   ROUTER_TOKENS_PER_BLOCK * hidden * sizeof(float));
}

/* ---- router top-k --------------------------------------------------------------------- */

/* One warp, one token: k rounds of warp-wide argmax (ties to the lower expert index), then
 * the softmax over the k chosen logits. The row is read once into registers, R logits per
 * lane (expert lane + 32 i), all loads in flight together: the rounds had re-read it from
 * global memory (just written by other blocks, so volatile, one dependent L2 trip per logit
 * per round: 16 in a row for 128 experts and 4 choices). A NaN logit counts as -inf, so each
 * round picks a live expert whatever the values. Lane k keeps choice k; every lane sums the
 * softmax in choice order, as one lane did before. */
template <int R>
static __device__ __forceinline__ void topk_warp_regs(const volatile float *row, const float *bias,
                                                      int32_t n_experts, int32_t k_top,
                                                      int32_t *topk_idx, float *topk_weight) {
    const int lane = threadIdx.x & 31;
    float v[R];
    unsigned live = 0u; /* bit i: expert lane + 32 i is still a candidate */
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int e = lane + 32 * i;
        v[i] = -INFINITY;
        if (e < n_experts) {
            const float x = row[e] + (bias ? bias[e] : 0.0f);
            v[i] = isnan(x) ? -INFINITY : x;
            live |= 1u << i;
        }
    }
    float my_val = 0.0f;
    int my_idx = 0;
    for (int k = 0; k < k_top; k++) {
        float best = -INFINITY;
        int best_i = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int e = lane + 32 * i;
            if ((live >> i & 1u) && (v[i] > best || (v[i] == best && e < best_i))) {
                best = v[i];
                best_i = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (ov > best || (ov == best && oi < best_i)) {
                best = ov;
                best_i = oi;
            }
        }
        if (lane == k) {
            my_val = best;
            my_idx = best_i;
        }
        if ((best_i & 31) == lane) live &= ~(1u << (best_i >> 5));
    }
    const float mx = __shfl_sync(0xffffffffu, my_val, 0);
    float sum = 0.0f;
    for (int k = 0; k < k_top; k++)
        sum += __expf(__shfl_sync(0xffffffffu, my_val, k) - mx);
    if (lane < k_top) {
        topk_idx[lane] = my_idx;
        topk_weight[lane] = __expf(my_val - mx) / sum;
    }
}

/* k_top <= 32 and n_experts <= 1024 (the launchers' and the backend's limits). */
static __device__ void topk_warp(const volatile float *row, const float *bias, int32_t n_experts,
                                 int32_t k_top, int32_t *topk_idx, float *topk_weight) {
    if (n_experts <= 32)
        topk_warp_regs<1>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else if (n_experts <= 64)
        topk_warp_regs<2>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else if (n_experts <= 128)
        topk_warp_regs<4>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else if (n_experts <= 256)
        topk_warp_regs<8>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else
        topk_warp_regs<32>(row, bias, n_experts, k_top, topk_idx, topk_weight);
}

static __global__ void router_topk_kernel(const float *logits, const float *bias, int32_t n_tokens,
                                          int32_t n_experts, int32_t k_top, int32_t *topk_idx,
                                          float *topk_weight) {
    int t = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (t >= n_tokens) return;
    topk_warp(logits + (size_t)t * n_experts, bias, n_experts, k_top, topk_idx + (size_t)t * k_top,
              topk_weight + (size_t)t * k_top);
}

void gptoss_cuda_router_topk(const float *logits, const float *bias, int32_t n_tokens,
                             int32_t n_experts, int32_t k_top, int32_t *topk_idx,
                             float *topk_weight, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    int warps = 4;
    router_topk_kernel<<<(n_tokens + warps - 1) / warps, 32 * warps, 0, stream>>>(
        logits, bias, n_tokens, n_experts, k_top, topk_idx, topk_weight);
}

/* ---- gathers and fills ------------------------------------------------------------------ */

static __global__ void gather_rows_kernel(const bf16 *src, const int32_t *rows, int32_t width,
                                          bf16 *out) {
    int i = blockIdx.x;
    const bf16 *s = src + (size_t)rows[i] * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x)
        out[(size_t)i * width + j] = s[j];
}

void gptoss_cuda_gather_rows(const bf16 *src, const int32_t *rows, int32_t n_rows, int32_t width,
                             bf16 *out, cudaStream_t stream) {
    if (n_rows <= 0) return;
    gather_rows_kernel<<<n_rows, 256, 0, stream>>>(src, rows, width, out);
}
