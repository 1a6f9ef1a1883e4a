/*
 * rope_kv.cuh - device helpers shared by the kernels that read or write paged KV (rope_kv.cu,
 * attention_split.cu, gemv_bf16.cu): the page-type traits (bf16 or e4m3 + scale), the page
 * slot of a token, and the YaRN RoPE rotation. Static inline: each file compiles its own copy.
 */
#ifndef GPTOSS_CUDA_ROPE_KV_CUH
#define GPTOSS_CUDA_ROPE_KV_CUH

#include "backend/cuda/kernels/ptx.cuh"
#include "backend/cuda/kernels/traits.h"
#include "backend/kv_fp8.h"

#include <math.h>

/* ---- KV pages ---------------------------------------------------------------------------- */

/* The page types the KV kernels are templated on: bf16 values, or e4m3 codes (uint8) with an
 * fp32 scale per (token, KV head) beside them (kv_fp8.h). */
template <typename KV> struct kv_page_traits;
template <> struct kv_page_traits<bf16> { static constexpr bool e4m3 = false; };
template <> struct kv_page_traits<uint8_t> { static constexpr bool e4m3 = true; };

/* Two e4m3 codes (the first in the low byte) as a bf16 pair: exact, every e4m3 value is a
 * bf16 value (the scale is applied later, in fp32). */
static __device__ __forceinline__ __nv_bfloat162 e4m3x2_to_bf16x2(uint32_t codes) {
    float2 v = gptoss_e4m3x2_decode((uint16_t)codes);
    return __floats2bfloat162_rn(v.x, v.y);
}

/* ---- QKV bias + RoPE + KV write ------------------------------------------------------- */

/* The RoPE kernel and the fused QKV projection share these three, so both round alike and
 * write the same slots. */
/* The cos and sin of position p's angle for inverse frequency f, times the YaRN concentration. */
static __device__ __forceinline__ void rope_cos_sin(int p, float f, float concentration, float *c,
                                                    float *s) {
    float sv, cv;
    sincosf((float)p * f, &sv, &cv);
    *c = cv * concentration;
    *s = sv * concentration;
}
/* One RoPE pair (a, b) rotated by the angle whose scaled cos and sin are c and s. */
static __device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float *ra,
                                                   float *rb) {
    *ra = a * c - b * s;
    *rb = b * c + a * s;
}
/* The page slot (token and KV head; its values start at slot * head_dim) of position p of
 * sequence seq for KV head kvh. */
static __device__ __forceinline__ size_t kv_page_slot(const int32_t *block_tables, int seq,
                                                      int32_t max_blocks, int32_t block_size, int p,
                                                      int32_t n_kv_heads, int kvh) {
    const int blk = block_tables[(size_t)seq * max_blocks + p / block_size];
    return ((size_t)blk * block_size + p % block_size) * n_kv_heads + kvh;
}

/* Heads per block of the RoPE + KV write kernel. One head per 32-thread block made a
 * 2048-token 20b step 147k tiny blocks: 92 us per layer where its 80 MB need about 27. */

/* The largest of one value per thread over the threads of this threadIdx.y (one head; every
 * thread of the block calls it; NaN is skipped as by fmaxf, like kv_fp8.h's host loop). */
static __device__ __forceinline__ float head_max(float v, float *scratch) {
    float *row = scratch + threadIdx.y * blockDim.x;
    row[threadIdx.x] = v;
    __syncthreads();
    float m = 0.0f;
    for (int i = 0; i < (int)blockDim.x; i++)
        m = fmaxf(m, row[i]);
    __syncthreads(); /* scratch may be reused */
    return m;
}

/* Grid (n_tokens, q_blocks + ceil(n_kv_heads / ROPE_KV_HEADS_PER_BLOCK)), (head_dim / 2,
 * ROPE_KV_HEADS_PER_BLOCK) threads: thread (j, y) takes the rotated pair (j, j + D/2) of one head
 * of the token. Blocks below q_blocks hold query heads; the others hold KV heads, whose threads
 * also copy the matching v head into the cache (with e4m3 pages after the head vector's absmax over
 * its threads, for k and for v, then codes and the two scales, kv_fp8.h), so every thread of a
 * block takes the same branch around the barriers. The token's cos and sin are computed once
 * per block. */
#endif
