/*
 * fp4.cuh - device helpers shared by the MoE kernels (the .cu files of kernels/moe/): E2M1 / E8M0
 * decode to fp32 and to fp16 pairs, the clamped SwiGLU, h as the fp16 paths store it, the mma.sync
 * m16n8k16 and cp.async wrappers and the "mma layout" permutation. All static inline, so each
 * kernel file compiles its own copy exactly as before.
 */
#ifndef GPTOSS_CUDA_MOE_FP4_CUH
#define GPTOSS_CUDA_MOE_FP4_CUH

#include "backend/cuda/kernels/ptx.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

/*
 * Dequantizes the 8 E2M1 codes of one 32-bit word (code k in bits 4k..4k+3) without a table:
 * the code's sign goes to the fp32 sign bit and its 3 magnitude bits (e1 e0 m) to bits 24..22,
 * i.e. the two low exponent bits and the top mantissa bit. That float equals
 * fp4(code) * 2^-126 exactly (e = 0 lands on the subnormal 0.5 * 2^-126 = m * 2^-127), so one
 * multiply by 2^(s-127) * 2^126 = 2^(s-1) gives the value (no shared-memory lookups, which
 * otherwise limit the decode GEMV).
 */
static __device__ __forceinline__ void fp4x8_to_float(uint32_t word, float scale_x2_126,
                                                      float out[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        uint32_t q = word >> (4 * k);
        uint32_t bits = ((q & 8u) << 28) | ((q & 7u) << 22);
        out[k] = __uint_as_float(bits) * scale_x2_126;
    }
}

/* The E8M0 scale times the 2^126 that fp4x8_to_float leaves out, as a product hi * lo of two
 * finite floats: hi = 2^(min(s,128) - 1), lo = 2^(max(s,128) - 128) (lo is 1 for every scale
 * up to 2^1, i.e. in practice; it keeps scales up to 2^127 exact). */
static __device__ __forceinline__ void e8m0_split(uint8_t s, float *hi, float *lo) {
    int a = s < 128 ? s : 128;
    *hi = __uint_as_float((uint32_t)(a + 126) << 23);
    *lo = __uint_as_float((uint32_t)((s > 128 ? s : 128) - 1) << 23);
}

/* h as the fp16 paths store it: rounded to bf16 first, as every other path stores h (exact in
 * fp16 for the bounded SwiGLU outputs gptoss_cuda_moe_check_mma admits). */
static __device__ __forceinline__ __half h_as_half(float v) {
    return __float2half_rn(__bfloat162float(__float2bfloat16(v)));
}

static __device__ __forceinline__ float swiglu(float gate, float up, float limit, float alpha) {
    float a = fminf(gate, limit);
    float c = fminf(fmaxf(up, -limit), limit);
    return a / (1.0f + expf(-alpha * a)) * (c + 1.0f);
}

/*
 * The four fp16 pairs of a word at once (p[i] = register i above: values i and i + 4, each
 * code * 2^-14). An fp16 value code * 2^-14 has a zero low byte, and its high byte is the code
 * with the magnitude moved up one bit and the sign to bit 7. Both are built for four codes at
 * a time (the even codes 0 2 4 6 and the odd codes 1 3 5 7, one per byte), and each pair then
 * takes two bytes of one of them with a byte permute: 11 operations per word, where building
 * each pair with its own shifts and masks (the mag / sign form above) takes 16.
 * Values i and i + 4 are bytes i / 2 and i / 2 + 2 of the even (i even) or odd (i odd) set.
 */
static __device__ __forceinline__ void mma_fp4_pairs(uint32_t w, uint32_t p[4]) {
    const uint32_t ev = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
    const uint32_t od = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
    p[0] = __byte_perm(ev, 0u, 0x2404); /* bytes: 0, ev.0, 0, ev.2 */
    p[1] = __byte_perm(od, 0u, 0x2404);
    p[2] = __byte_perm(ev, 0u, 0x3414); /* bytes: 0, ev.1, 0, ev.3 */
    p[3] = __byte_perm(od, 0u, 0x3414);
}

static __device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

static __device__ __forceinline__ void mma_f16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/*
 * One window of the dense MoE arithmetic (the mma GEMM's, which the batch-invariant kernels share
 * bit for bit): a lane's group of weight rows a and b (codes wa4 / wb4, scale bytes sa / sb;
 * zero codes and 127 for a group past the row), each code times 2^(s - 113) in fp16 before the
 * MMAs (the fp16 codes are code * 2^-14; exact for scale bytes in [104, 128]), against b[w], the
 * token chunk that word w multiplies. The MMAs chain into acc in the GEMM's order: word, then k
 * half.
 */
static __device__ __forceinline__ void mma_dense_window(uint4 wa4, uint4 wb4, uint32_t sa,
                                                        uint32_t sb, const uint4 (&b)[4],
                                                        float (&acc)[4]) {
    const uint32_t ma2 = ((sa - 98u) << 10) * 0x00010001u, mb2 = ((sb - 98u) << 10) * 0x00010001u;
    const uint32_t wa[4] = {wa4.x, wa4.y, wa4.z, wa4.w}, wb[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint32_t pa[4], pb[4];
        mma_fp4_pairs(wa[w], pa);
        mma_fp4_pairs(wb[w], pb);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            pa[i] = hmul2_u32(pa[i], ma2);
            pb[i] = hmul2_u32(pb[i], mb2);
        }
        mma_f16(acc, pa[0], pb[0], pa[1], pb[1], b[w].x, b[w].y);
        mma_f16(acc, pa[2], pb[2], pa[3], pb[3], b[w].z, b[w].w);
    }
}

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem),
                 "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void cp_async16_ca(void *smem, const void *gmem, bool valid) {
    uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem),
                 "r"(valid ? 16 : 0));
}

/* Position of value j (0..7) of a chunk in the mma layout. */
static __device__ __forceinline__ int mma_pos(int j) {
    return ((j & 3) << 1) | (j >> 2);
}

#endif
