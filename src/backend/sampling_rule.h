/*
 * sampling_rule.h - the one definition of how a logits row becomes a token, shared bit for bit
 * by the host reference sampler (C) and the CUDA sampling kernels.
 *
 * Every function here is `static inline` and compiles as C11 and as CUDA device code. Each
 * floating-point operation is written out as one IEEE-754 operation rounded to nearest (on
 * the device through __fadd_rn / __fmul_rn / __fdiv_rn, which the compiler never fuses into an
 * FMA; on the host as plain C operators, which -std=c11 never contracts), so both sides compute
 * the same bits from the same row. Sums of weights are integers, so they are exact in any
 * order: a block reduction on the GPU and a loop on the host agree exactly.
 *
 * The rule, for one row of logits l[0..V) and one draw:
 *
 *  1. Processed logits m[j], in this order:
 *       m = l (a NaN counts as -inf);
 *       m += logit_bias[j]                                     (sparse, per request);
 *       m = -inf where the token is masked (stop tokens before min_tokens) or not allowed by
 *         the row's allowed-token bitmask (constraints);
 *       repetition penalty r != 1, once per token seen in prompt or output:
 *         m = m > 0 ? m / r : m * r;
 *       frequency f / presence p, per token generated c > 0 times:
 *         m = m - (f * (float)c + p).
 *  2. Greedy (temperature == 0): the token with the largest m, ties to the lower id.
 *  3. Otherwise, with mx = max m and scale = gptoss_sampling_scale(temperature):
 *       x[j] = (m[j] - mx) * scale            (<= 0; log2 of the weight)
 *       W[j] = gptoss_sampling_weight(x[j])   (integer, 0..2^32; the row's best token has
 *                                             exactly 2^32)
 *     Weights below 2^-32 of the best token's are 0 and never drawn: over a 201,088-token
 *     vocabulary at most 4.7e-5 of the mass (relative to the best token) is dropped.
 *  4. Kept set, in this order (each step sees only what the previous kept):
 *       min_p > 0:  keep W[j] >= min_p * 2^32 (compared in double, exact on both sides);
 *       top_k > 0:  keep the top_k tokens first in the order (m desc, id asc);
 *       top_p < 1:  with Z1 the kept total, walk the kept tokens in the order (m desc,
 *                   id asc) and keep the shortest prefix whose running total S satisfies
 *                   (double)S >= (double)top_p * (double)Z1 (at least one token).
 *     Tokens with W == 0 are never drawn, whatever the steps keep.
 *  5. The draw: Z2 = total W of the kept set, r = the draw's 64 random bits
 *     (gptoss_sampling_random), t = gptoss_sampling_target(r, Z2) in [0, Z2). Walk the kept
 *     tokens in increasing id and pick the first whose running total exceeds t.
 *     (The walk is in id order, not probability order, so that the GPU finds it with a
 *     prefix sum; the distribution drawn from is the same.)
 *
 * Random bits: Philox4x32-10 keyed by the request's 64-bit seed, counter (position of the
 * token being drawn, choice index, 0, 0). A seeded request therefore draws the same numbers
 * whatever else is in the batch, after a preemption, and on either backend.
 *
 * Logprobs are not part of the rule: they are of the raw model distribution, l - logsumexp(l).
 */
#ifndef GPTOSS_BACKEND_SAMPLING_RULE_H
#define GPTOSS_BACKEND_SAMPLING_RULE_H

#include <stdint.h>

#if defined(__CUDACC__)
#define GPTOSS_SR_FN static inline __host__ __device__
#else
#define GPTOSS_SR_FN static inline
#endif

/* One rounded operation each; never fused with a neighbour. */
#if defined(__CUDA_ARCH__)
#define GPTOSS_SR_ADD(a, b) __fadd_rn((a), (b))
#define GPTOSS_SR_SUB(a, b) __fsub_rn((a), (b))
#define GPTOSS_SR_MUL(a, b) __fmul_rn((a), (b))
#define GPTOSS_SR_DIV(a, b) __fdiv_rn((a), (b))
#else
#define GPTOSS_SR_ADD(a, b) ((float)((float)(a) + (float)(b)))
#define GPTOSS_SR_SUB(a, b) ((float)((float)(a) - (float)(b)))
#define GPTOSS_SR_MUL(a, b) ((float)((float)(a) * (float)(b)))
#define GPTOSS_SR_DIV(a, b) ((float)((float)(a) / (float)(b)))
#endif

/* 2^32: the weight of the row's most likely token. */
#define GPTOSS_SAMPLING_WEIGHT_ONE 4294967296ull

/* ---- Philox4x32-10 ------------------------------------------------------------------------ */

typedef struct gptoss_philox_out {
    uint32_t v[4];
} gptoss_philox_out;

GPTOSS_SR_FN uint32_t gptoss_sr_mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* Philox4x32 with 10 rounds (Salmon et al., SC'11), key (k0, k1), counter c[4]. */
GPTOSS_SR_FN gptoss_philox_out gptoss_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                    uint32_t c3, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = gptoss_sr_mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = gptoss_sr_mulhilo(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    gptoss_philox_out out = {{c0, c1, c2, c3}};
    return out;
}

/* The 64 random bits of one draw: seed, position of the token being drawn, choice index. */
GPTOSS_SR_FN uint64_t gptoss_sampling_random(uint64_t seed, int64_t position, int32_t choice) {
    gptoss_philox_out o =
        gptoss_philox4x32_10((uint32_t)(uint64_t)position, (uint32_t)((uint64_t)position >> 32),
                             (uint32_t)choice, 0u, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (uint64_t)o.v[0] | ((uint64_t)o.v[1] << 32);
}

/* floor(r * total / 2^64): a uniform integer in [0, total) from 64 random bits (exact). */
GPTOSS_SR_FN uint64_t gptoss_sampling_target(uint64_t r, uint64_t total) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(r, total);
#else
    return (uint64_t)(((unsigned __int128)r * (unsigned __int128)total) >> 64);
#endif
}

/* ---- weights ------------------------------------------------------------------------------ */

/* log2(e) / temperature, rounded to float once (temperature > 0). Computed in double and
 * rounded so both sides get the same float. */
GPTOSS_SR_FN float gptoss_sampling_scale(float temperature) {
    return (float)(1.4426950408889634 / (double)temperature);
}

/* 2^x for x <= 0, as a float (0 below 2^-126, and for NaN / -inf): x rounded to the nearest
 * integer k, a degree-6 polynomial of f = (x - k) ln 2 for e^f, and k put into the exponent
 * bits. Exactly 1 at x = 0; relative error about 1e-7 elsewhere. */
GPTOSS_SR_FN float gptoss_sampling_exp2(float x) {
    if (!(x > -126.0f)) return 0.0f; /* also NaN and -inf */
    if (x > 0.0f) x = 0.0f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float k = GPTOSS_SR_SUB(GPTOSS_SR_ADD(x, round_magic), round_magic);
    float f = GPTOSS_SR_MUL(GPTOSS_SR_SUB(x, k), 0.6931471805599453f);
    float p = 1.0f / 720.0f;
    p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f / 120.0f);
    p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f / 24.0f);
    p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f / 6.0f);
    p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 0.5f);
    p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f);
    p = GPTOSS_SR_ADD(GPTOSS_SR_MUL(p, f), 1.0f);
    int32_t ki = (int32_t)k; /* -126..0 */
    union {
        uint32_t u;
        float f;
    } scale2;
    scale2.u = (uint32_t)(ki + 127) << 23;
    return GPTOSS_SR_MUL(p, scale2.f);
}

/* x[j] = (m[j] - mx) * scale: the log2 weight of a processed logit. -inf for m = -inf. */
GPTOSS_SR_FN float gptoss_sampling_log2_weight(float m, float mx, float scale) {
    return GPTOSS_SR_MUL(GPTOSS_SR_SUB(m, mx), scale);
}

/* The integer weight of a token: floor(2^x * 2^32), in 0..2^32 (exact: a float times a power
 * of two, then truncated). */
GPTOSS_SR_FN uint64_t gptoss_sampling_weight(float x) {
    float w = gptoss_sampling_exp2(x); /* in [0, 1] */
    return (uint64_t)(double)GPTOSS_SR_MUL(w, 4294967296.0f);
}

/* Repetition penalty as in step 1. */
GPTOSS_SR_FN float gptoss_sampling_repetition(float m, float r) {
    return m > 0.0f ? GPTOSS_SR_DIV(m, r) : GPTOSS_SR_MUL(m, r);
}

/* Frequency and presence penalties as in step 1 (count > 0). */
GPTOSS_SR_FN float gptoss_sampling_freq_presence(float m, float f, float p, int32_t count) {
    return GPTOSS_SR_SUB(m, GPTOSS_SR_ADD(GPTOSS_SR_MUL(f, (float)count), p));
}

/* Whether a weight passes min_p (step 4). */
GPTOSS_SR_FN int gptoss_sampling_min_p_keeps(uint64_t w, float min_p) {
    return (double)w >= (double)min_p * 4294967296.0;
}

/* Whether the running total S of the top_p walk reached the target for total Z1 (step 4). */
GPTOSS_SR_FN int gptoss_sampling_top_p_reached(uint64_t running, uint64_t total, float top_p) {
    return (double)running >= (double)top_p * (double)total;
}

/* The order of top_k and top_p: whether token a (processed logit ma) comes before b. */
GPTOSS_SR_FN int gptoss_sampling_before(float ma, int32_t a, float mb, int32_t b) {
    return ma > mb || (ma == mb && a < b);
}

#endif
