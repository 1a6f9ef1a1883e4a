/*
 * moe_internal.h - what the MoE files (the .cu files of kernels/moe/) share on the host side: each
 * path's launch and prepare functions, which dispatch.cu calls, and the tile sizes two files need.
 * Not for use outside kernels/moe/.
 */
#ifndef GPTOSS_CUDA_MOE_INTERNAL_H
#define GPTOSS_CUDA_MOE_INTERNAL_H

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/traits.h"

#include <cuda_fp16.h>

/* route.cu needs the mma GEMM's tile height for the route it builds. */
int32_t gptoss_moe_mma_tile_rows(int32_t n_tokens, int32_t k_top, int32_t n_experts);

/* route_gemv.cu */
cudaError_t gptoss_moe_route_gemv_prepare(int32_t widest);
void gptoss_moe_route_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                           int32_t n_pairs, const gptoss_cuda_route *route, bf16 *h, float *y,
                           cudaStream_t stream);
/* wmma_gemm.cu */
void gptoss_moe_wmma_gemm(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_pairs,
                          const gptoss_cuda_route *route, bf16 *h, float *y, cudaStream_t stream);
/* pair_gemv.cu */
cudaError_t gptoss_moe_pair_gemv_prepare(int32_t widest);
void gptoss_moe_pair_gemv(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                          int32_t n_pairs, int32_t k_top, bf16 *h, float *y, cudaStream_t stream);
/* mma_gemm.cu */
cudaError_t gptoss_moe_mma_gemm_prepare(int32_t widest);
void gptoss_moe_mma_gemm(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                         int32_t k_top, const gptoss_cuda_route *route, __half *h, float *y,
                         cudaStream_t stream);
/* slab_gemm.cu: prepare says whether the kernel runs here (sm_90 code, shared memory granted
 * for widths up to widest); wanted: the route's tiles are the kernel's and the moe_mma_slab knob
 * asks for it there; gemm: both projections, t16 the mma GEMM's converted input */
bool gptoss_moe_slab_prepare(int32_t widest);
bool gptoss_moe_slab_wanted(const gptoss_cuda_route *route);
void gptoss_moe_slab_gemm(const gptoss_cuda_moe_weights *w, const __half *t16, int32_t n_pairs,
                          const gptoss_cuda_route *route, __half *h, float *y, cudaStream_t stream);
/* wgmma_gemm.cu: true when the kernels got their shared memory */
bool gptoss_moe_wgmma_gemm_prepare(int32_t widest);
void gptoss_moe_wgmma_gemm(const gptoss_cuda_moe_weights *w, const bf16 *t, int32_t n_tokens,
                           int32_t k_top, const gptoss_cuda_route *route, __half *h, float *y,
                           cudaStream_t stream);
/* pair_mma.cu: ok = the other paths prepared; the kernels follow the context's capabilities */
void gptoss_moe_pair_mma_prepare(bool ok);
void gptoss_moe_pair_mma(const gptoss_cuda_moe_weights *w, const bf16 *t, const int32_t *topk_idx,
                         int32_t n_pairs, int32_t k_top, __half *h, float *y, cudaStream_t stream);

#endif
