/*
 * embed_norm.cu - the embedding gather and the residual add + RMSNorm (fp32 accumulation).
 * Nothing here allocates or synchronizes; launchers only enqueue (cuda_kernels.h).
 */
#include "backend/cuda/kernels/ptx.cuh"
#include "backend/cuda/kernels/traits.h"

/* ---- embedding ------------------------------------------------------------------------ */

static __global__ void embed_kernel(const bf16 *embedding, const int32_t *token_ids, int32_t hidden,
                                    float *x) {
    int t = blockIdx.x;
    const bf16 *row = embedding + (size_t)token_ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        x[(size_t)t * hidden + i] = __bfloat162float(row[i]);
}

void gptoss_cuda_embed(const bf16 *embedding, const int32_t *token_ids, int32_t n_tokens,
                       int32_t hidden, float *x, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    embed_kernel<<<n_tokens, 256, 0, stream>>>(embedding, token_ids, hidden, x);
}

/* ---- residual + RMSNorm --------------------------------------------------------------- */

/* One block of 1024 threads per row (many loads in flight even for a single decode row). The
 * row is kept in registers between the residual update and the normalization
 * (hidden <= 1024 * 4). Every load of a thread is issued before its first store: with the
 * stores to x in between (which the compiler must assume may alias the other inputs), each
 * of a thread's elements cost its own round trips, 6.3 us per decode row on an H100. */

static __global__ void residual_rmsnorm_kernel(
    float *__restrict__ x, const float *__restrict__ add, const float *__restrict__ add_bias,
    const float *__restrict__ moe_y, const float *__restrict__ moe_weight, int32_t k_top,
    const float *__restrict__ gain, float eps, const int32_t *__restrict__ row_map, int32_t hidden,
    bf16 *__restrict__ out, float *__restrict__ out_f32) {
    __shared__ float partial[RMSNORM_THREADS / 32];
    pdl_wait(); /* x, the projection or the experts' rows come from earlier kernels */
    int i = blockIdx.x;
    int r = row_map ? row_map[i] : i;
    float *xr = x + (size_t)r * hidden;
    float vals[RMSNORM_MAX_PER_THREAD], g[RMSNORM_MAX_PER_THREAD];
#pragma unroll
    for (int c = 0; c < RMSNORM_MAX_PER_THREAD; c++) {
        int j = threadIdx.x + c * RMSNORM_THREADS;
        vals[c] = g[c] = 0.0f;
        if (j < hidden) {
            vals[c] = xr[j];
            g[c] = gain[j];
            if (add) vals[c] += add[(size_t)r * hidden + j] + (add_bias ? add_bias[j] : 0.0f);
        }
    }
    if (moe_y) {
        const float *wr = moe_weight + (size_t)r * k_top, *yr = moe_y + (size_t)r * k_top * hidden;
        float sum[RMSNORM_MAX_PER_THREAD] = {0.0f, 0.0f, 0.0f, 0.0f};
        /* a slot of weight 0 (another GPU's expert) has a row nobody wrote: its value is
         * replaced by 0 after the load, not skipped before it, so that no load waits for the
         * weight's */
#pragma unroll 4
        for (int k = 0; k < k_top; k++) {
            const float wk = wr[k];
#pragma unroll
            for (int c = 0; c < RMSNORM_MAX_PER_THREAD; c++) {
                int j = threadIdx.x + c * RMSNORM_THREADS;
                if (j < hidden) {
                    const float yv = yr[(size_t)k * hidden + j];
                    sum[c] = fmaf(wk, wk != 0.0f ? yv : 0.0f, sum[c]);
                }
            }
        }
#pragma unroll
        for (int c = 0; c < RMSNORM_MAX_PER_THREAD; c++)
            vals[c] += sum[c];
    }
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < RMSNORM_MAX_PER_THREAD; c++) {
        int j = threadIdx.x + c * RMSNORM_THREADS;
        if (j < hidden && (add || moe_y)) xr[j] = vals[c];
        ss += vals[c] * vals[c];
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < RMSNORM_THREADS / 32; w++)
        total += partial[w];
    float inv = rsqrtf(total / (float)hidden + eps);
#pragma unroll
    for (int c = 0; c < RMSNORM_MAX_PER_THREAD; c++) {
        int j = threadIdx.x + c * RMSNORM_THREADS;
        if (j < hidden) {
            float y = g[c] * (vals[c] * inv);
            out[(size_t)i * hidden + j] = __float2bfloat16(y);
            if (out_f32) out_f32[(size_t)i * hidden + j] = y;
        }
    }
}

/* Tensor parallelism: the weighted sum of a rank's expert rows, without residual or norm
 * (the sum over ranks comes next). Grid (rows, ceil(hidden / 256)). Slots of weight 0 are
 * other GPUs' experts, whose rows were not written. */
static __global__ void moe_combine_kernel(const float *__restrict__ moe_y,
                                          const float *__restrict__ moe_weight, int32_t k_top,
                                          int32_t hidden, float *__restrict__ out) {
    pdl_wait(); /* the experts' rows come from the MoE kernels */
    const int32_t r = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= hidden) return;
    const float *wr = moe_weight + (size_t)r * k_top, *yr = moe_y + (size_t)r * k_top * hidden;
    float sum = 0.0f;
    for (int k = 0; k < k_top; k++) {
        const float wk = wr[k];
        if (wk != 0.0f) sum += wk * yr[(size_t)k * hidden + j];
    }
    out[(size_t)r * hidden + j] = sum;
}

void gptoss_cuda_moe_combine(const float *moe_y, const float *moe_weight, int32_t k_top,
                             int32_t n_rows, int32_t hidden, float *out, cudaStream_t stream) {
    if (n_rows <= 0) return;
    launch_pdl(moe_combine_kernel, dim3(n_rows, (hidden + 255) / 256), dim3(256), 0, stream, moe_y,
               moe_weight, k_top, hidden, out);
}

void gptoss_cuda_residual_rmsnorm(float *x, const float *add, const float *add_bias,
                                  const float *moe_y, const float *moe_weight, int32_t k_top,
                                  const float *gain, float eps, const int32_t *row_map,
                                  int32_t n_rows, int32_t hidden, bf16 *out, float *out_f32,
                                  cudaStream_t stream) {
    if (n_rows <= 0) return;
    launch_pdl(residual_rmsnorm_kernel, dim3(n_rows), dim3(RMSNORM_THREADS), 0, stream, x, add,
               add_bias, moe_y, moe_weight, k_top, gain, eps, row_map, hidden, out, out_f32);
}
