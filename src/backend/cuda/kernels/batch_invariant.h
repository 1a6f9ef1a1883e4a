/*
 * batch_invariant.h - the kernels of the CUDA backend's batch-invariant mode
 * (gptoss_backend_options.batch_invariant): one dense GEMM and one router-logits kernel whose
 * every output is reduced in an order fixed by the matrix shape alone, never by the number of
 * rows in the step, the tile a row lands in or its position in the batch.
 *
 * Owns nothing: the launchers take device pointers and a stream and only enqueue.
 */
#ifndef GPTOSS_CUDA_BATCH_INVARIANT_H
#define GPTOSS_CUDA_BATCH_INVARIANT_H

#include "backend/cuda/kernels/dense_lowp.h"

/*
 * Y[m, n] f32 = X[m, k] bf16 . W[n, k]^T on the tensor cores (bf16 WMMA, fp32 accumulation),
 * W in bf16 or e4m3 with row scales (dense_lowp.h; the scale multiplies the finished dot
 * product). Every output sums k in chunks of 16 in ascending order, in 4 fixed slices of whole
 * 128-input steps each summed from zero and then added in order, whatever m is: a row's
 * result is bitwise the same in any step. Returns 0, or -1
 * (nothing launched) when k is not a multiple of 8 or a pointer is missing.
 */
int gptoss_cuda_bi_gemm(gptoss_cuda_dense_weight w, const bf16 *x, float *y, int32_t m, int32_t n,
                        int32_t k, cudaStream_t stream);

/* The GEMM's launch shapes, every one with the same results row for row: 64x64 WMMA tiles (the
 * first form), 16 columns and up to 64 rows per block with deep weight streaming (for
 * decode-sized steps; any m works, every 64 rows re-reading the weights), 64 x 128 tiles
 * on a 3-stage pipeline, or the large tiles below (prefill and big batches). */
enum {
    GPTOSS_BI_GEMM_TILE = 0,
    GPTOSS_BI_GEMM_SKINNY = 1,
    GPTOSS_BI_GEMM_WIDE = 2,
    GPTOSS_BI_GEMM_SPLIT = 3, /* up to 8 rows: a warp per input slice (decode); else SKINNY */
    /* many rows, bf16 weights (e4m3 ones take WIDE): ldmatrix-fed tiles of 128 x 128, 64 x 128
     * or 64 x 64 outputs, LARGE choosing by the number of blocks against the GPU's SMs */
    GPTOSS_BI_GEMM_LARGE = 4,
    GPTOSS_BI_GEMM_LARGE_128 = 5,
    GPTOSS_BI_GEMM_LARGE_64 = 6,
    GPTOSS_BI_GEMM_LARGE_64N64 = 7
};

/* gptoss_cuda_bi_gemm with the launch shape chosen: bitwise the same outputs. */
int gptoss_cuda_bi_gemm_variant(gptoss_cuda_dense_weight w, const bf16 *x, float *y, int32_t m,
                                int32_t n, int32_t k, int variant, cudaStream_t stream);

/*
 * The experts of a step (n_tokens * k_top pairs): h and y bitwise what GPTOSS_MOE_WMMA_GEMM
 * writes (gptoss_cuda_moe with that path and this route), in three launch shapes. SMALL streams
 * the weights for steps whose experts hold a few rows each, WIDE takes 64 rows x 128 outputs
 * per block for prefill; both read a route built for the WMMA path (64-row tiles) and leave h
 * in its sorted order. PAIRS is SMALL with one block row per (token, slot) pair straight from
 * topk_idx (no route; route may be NULL), h by pair: for steps of a few tokens, where an expert
 * two pairs share is read twice. Returns 0, or -1 (nothing launched) unless the widths are
 * multiples of 32 (MXFP4 groups) up to 8192 and the route or topk_idx is there.
 */
enum { GPTOSS_BI_MOE_SMALL = 0, GPTOSS_BI_MOE_WIDE = 1, GPTOSS_BI_MOE_PAIRS = 2 };
int gptoss_cuda_bi_moe(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                       int32_t k_top, const int32_t *topk_idx, const gptoss_cuda_route *route,
                       bf16 *h, float *y, int variant, cudaStream_t stream);

/* Raises the kernels' shared-memory limits (once per device, before the first launch, which
 * may sit inside a graph capture; the launchers do it themselves where nobody did). */
cudaError_t gptoss_cuda_bi_prepare(void);

/* logits[t, e] = sum_h x[t, h] * w[e, h] in fp32 (no bias), one warp per output: lane l adds
 * the 4-input chunks l, l + 32, ... in order, then a fixed butterfly over the lanes (steps of
 * 128+ tokens: each warp 32 outputs at once, the same sums). Returns 0,
 * or -1 (nothing launched) unless hidden % 4 == 0 and x, w are 16-byte aligned. */
int gptoss_cuda_bi_router_logits(const float *x, const float *w, int32_t n_tokens,
                                 int32_t n_experts, int32_t hidden, float *logits,
                                 cudaStream_t stream);

#endif
