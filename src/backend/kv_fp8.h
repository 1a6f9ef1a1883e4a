/*
 * kv_fp8.h - the FP8 KV cache format: e4m3 codes with one fp32 scale per (token, KV head).
 *
 * One header for C (the CPU backend, tests) and CUDA (the KV write and attention kernels),
 * so that both sides turn a K or V vector into the same bytes. Owns nothing, allocates
 * nothing; every function is pure.
 *
 * e4m3 (OCP FP8): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. Exponent field 0 is
 * subnormal (m * 2^-9), 0x7f and 0xff are NaN, there is no infinity; the largest finite value
 * is 448 (0x7e). Every code's value is exact in fp16, bf16 and fp32.
 *
 * A vector x of head_dim values (one KV head of one token, after bias and RoPE for K) is
 * stored as
 *     scale = absmax(x) / 448                      (fp32, IEEE division)
 *     code[i] = e4m3(x[i] / scale)                 (fp32 IEEE division, then nearest e4m3
 *                                                   value, ties to even, saturated at +-448)
 * and read back as decode(code[i]) * scale. A zero vector gets scale 0 and codes 0 (reads back
 * as zeros, no 0/0). Rounding costs at most 2^-4 of each value in e4m3's normal range, which
 * holds every value within 2^-14 of the vector's largest: relative to the vector, the error is
 * about 2^-4 / sqrt(3) (RMS of uniform rounding over a step of 2^-3) at worst and typically
 * 2-3%.
 *
 * Encoding works on the float's bits with integer arithmetic (no rounding mode, no flush of
 * subnormals, no fused multiply-add can change it), so a host and a device compute the same
 * code for the same float. Divisions go through kv_fp8_div, IEEE-rounded on both sides even
 * under fast-math device flags.
 */
#ifndef GPTOSS_KV_FP8_H
#define GPTOSS_KV_FP8_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define KV_FP8_FN static __host__ __device__ __forceinline__
#else
#define KV_FP8_FN static inline
#endif

#define GPTOSS_E4M3_MAX 448.0f /* largest finite e4m3 value (code 0x7e) */
#define GPTOSS_E4M3_NAN 0x7f   /* the NaN code (with either sign bit) */

/* Bytes one token's K (or V) takes per KV head in an FP8 page: head_dim codes and a scale. */
#define GPTOSS_KV_FP8_HEAD_BYTES(head_dim) ((size_t)(head_dim) + sizeof(float))

KV_FP8_FN uint32_t kv_fp8_float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

KV_FP8_FN float kv_fp8_bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* a / b rounded to nearest even, as IEEE 754 defines it, on the host and on the device. */
KV_FP8_FN float kv_fp8_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/*
 * The value of an e4m3 code (exact). The magnitude bits shifted into an fp32's exponent and
 * mantissa fields read as 2^(e-127) * (1 + m/8), or m * 2^-129 for e = 0 (an fp32 subnormal);
 * times 2^120 that is 2^(e-7) * (1 + m/8) and m * 2^-9, e4m3's definition. Both products are
 * exact (no rounding), provided subnormal fp32 inputs are not flushed to zero, which neither
 * side does here (no fast-math flags).
 */
KV_FP8_FN float gptoss_e4m3_decode(uint8_t code) {
    uint32_t sign = (uint32_t)(code & 0x80) << 24;
    if ((code & 0x7f) == GPTOSS_E4M3_NAN) return kv_fp8_bits_float(sign | 0x7fc00000u);
    return kv_fp8_bits_float(sign | ((uint32_t)(code & 0x7f) << 20)) * 0x1p120f;
}

/*
 * The e4m3 code of x: the nearest e4m3 value, ties to the code with an even mantissa
 * (bit 0 clear), magnitudes from 448 up (infinity too) saturated to 448, the sign kept
 * (-0 -> 0x80); NaN to 0x7f whatever its sign bit (a NaN made by an operation has a positive
 * sign on the GPU and a negative one on x86, and both sides must store the same byte).
 */
KV_FP8_FN uint8_t gptoss_e4m3_encode(float x) {
    uint32_t u = kv_fp8_float_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return GPTOSS_E4M3_NAN;
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448.0f */
    if (a >= 0x3c800000u) {                              /* >= 2^-6: e4m3 normal */
        /* keep 3 of the 23 mantissa bits, nearest even; a carry into the exponent is the
         * next binade's first value, which is right */
        uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
        return (uint8_t)(sign | ((r >> 20) - (120u << 3))); /* exponent 127-biased -> 7-biased */
    }
    /* below 2^-6: a multiple k of 2^-9, k in 0..8 (8 is 2^-6, code 0x08). x = M * 2^(E-150)
     * with the 24-bit significand M, so k = M / 2^(141 - E), rounded to nearest even. */
    uint32_t exponent = a >> 23, significand = a & 0x7fffffu;
    if (exponent)
        significand |= 0x800000u;
    else
        exponent = 1;                 /* fp32 subnormal: M * 2^-149 */
    uint32_t shift = 141u - exponent; /* >= 21 here */
    if (shift >= 32u) return sign;    /* below 2^-10 (half the smallest subnormal): 0 */
    uint32_t k = significand >> shift, rest = significand & ((1u << shift) - 1u),
             half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (k & 1u))) k++;
    return (uint8_t)(sign | k);
}

/* The scale of a vector whose largest magnitude is absmax (0 for a zero vector). */
KV_FP8_FN float gptoss_kv_fp8_scale(float absmax) {
    return kv_fp8_div(absmax, GPTOSS_E4M3_MAX);
}

/* The code of one value x of a vector with that scale. A zero scale (zero vector) gives code
 * 0 for finite x; x * 0 keeps a NaN or infinite input a NaN code rather than hiding it. */
KV_FP8_FN uint8_t gptoss_kv_fp8_quantize(float x, float scale) {
    return gptoss_e4m3_encode(scale > 0.0f ? kv_fp8_div(x, scale) : x * 0.0f);
}

/* Quantizes n values in place as one vector: codes[i] and the returned scale, then x[i]
 * replaced by what a reader of the page gets back, decode(codes[i]) * scale. codes may be
 * NULL. This is the whole round trip a K or V vector makes through an FP8 page. */
KV_FP8_FN float gptoss_kv_fp8_round_trip(float *x, int32_t n, uint8_t *codes) {
    float absmax = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        float m = x[i] < 0.0f ? -x[i] : x[i];
        if (m > absmax) absmax = m; /* NaN never compares greater: skipped, as fmaxf does */
    }
    float scale = gptoss_kv_fp8_scale(absmax);
    for (int32_t i = 0; i < n; i++) {
        uint8_t c = gptoss_kv_fp8_quantize(x[i], scale);
        if (codes) codes[i] = c;
        x[i] = gptoss_e4m3_decode(c) * scale;
    }
    return scale;
}

#ifdef __CUDACC__
/* Two codes (the first in the low byte) to two floats by the hardware conversion (one
 * instruction on sm_89 and newer, emulated before); the same values as gptoss_e4m3_decode,
 * NaN codes included (tests/cuda check all 65536 pairs). */
static __device__ __forceinline__ float2 gptoss_e4m3x2_decode(uint16_t codes) {
    return __half22float2(
        __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3)));
}
#endif

#undef KV_FP8_FN

#endif
