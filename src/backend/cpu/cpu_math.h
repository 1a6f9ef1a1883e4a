/*
 * cpu_math.h - the row kernels the CPU backend's files share (the model and the EAGLE3 head):
 * bf16 rows widened to f32, a dot product in a fixed order, the bf16 matmul and the RMSNorm.
 */
#ifndef GPTOSS_BACKEND_CPU_MATH_H
#define GPTOSS_BACKEND_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* Widens n bf16 values (possibly unaligned) to f32; written so the compiler vectorizes it. */
static inline void gptoss_cpu_widen_bf16_row(float *dst, const uint8_t *src, int32_t n) {
    for (int32_t c = 0; c < n; c++) {
        uint16_t h;
        memcpy(&h, src + 2 * (size_t)c, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(&dst[c], &u, 4);
    }
}

/* Dot product with eight independent partial sums (a fixed order, so results are the same for
 * every call with the same inputs). */
static inline float gptoss_cpu_dot(const float *a, const float *b, int32_t n) {
    float acc[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* out[n, rows] = x[n, cols] . W[rows, cols]^T (+ bias when given). W is bf16 [rows, cols].
 * Parallel over rows; each row is widened once and reused for every token. */
struct gptoss_tensor;
void gptoss_cpu_matmul_bf16(float *out, const float *x, int32_t n, const struct gptoss_tensor *w,
                            const float *bias);

/* y = g * x / sqrt(mean(x^2) + eps), all fp32 (spec 2.2). */
void gptoss_cpu_rmsnorm(float *y, const float *x, const float *gain, int32_t n, double eps);

#endif
