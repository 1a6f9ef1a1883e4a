/*
 * batch_invariant_internal.cuh - what the batch-invariant GEMM's launch shapes share
 * (batch_invariant.cu, batch_invariant_large.cu): the fixed K slices every output sums in, the
 * m16n8k16 product and the cp.async copies (groups: ptx.cuh); and the large GEMM's entry points.
 */
#ifndef GPTOSS_CUDA_BATCH_INVARIANT_INTERNAL_CUH
#define GPTOSS_CUDA_BATCH_INVARIANT_INTERNAL_CUH

#include "backend/cuda/kernels/batch_invariant.h"
#include "backend/cuda/kernels/ptx.cuh"

/* The input is cut into BI_K_SLICES slices of whole 128-input steps (bi_slice_steps): each
 * output sums every slice's chunks into a fresh accumulator, and the slices' sums are added in
 * slice order (the first taken as it is). Every launch shape keeps these slices, so the
 * decode shape can give each slice its own warp and still add the same numbers in the same
 * order as the shapes that walk the slices one after another. */
#define BI_K_SLICES 4
static __host__ __device__ __forceinline__ int32_t bi_slice_steps(int32_t k) {
    const int32_t steps = (k + 127) / 128;
    return (steps + BI_K_SLICES - 1) / BI_K_SLICES;
}

static __device__ __forceinline__ void bis_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* cp.async of `bytes` (4, 8 or 16; 0 copies nothing and zero-fills) into shared memory. */
template <int SIZE>
static __device__ __forceinline__ void bis_cp(void *dst, const void *src, int bytes) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (SIZE == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
                     "r"(bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(SIZE),
                     "r"(bytes));
}

/* The large GEMM (batch_invariant_large.cu), bf16 weights: variant one of
 * GPTOSS_BI_GEMM_LARGE_128, _64, _64N64 (else -1, nothing launched); gptoss_bi_large_pick
 * chooses one for GPTOSS_BI_GEMM_LARGE; gptoss_bi_large_prepare raises its kernels' shared
 * memory limits on the current device (false where one is refused). */
int gptoss_bi_large_gemm(int variant, const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n,
                         int32_t k, cudaStream_t stream);
int gptoss_bi_large_pick(int32_t m, int32_t n, int n_sms);
bool gptoss_bi_large_prepare(void);

#endif
