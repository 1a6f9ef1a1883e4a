/*
 * cpu_math.c - the CPU backend's shared bf16 matmul and RMSNorm (cpu_math.h).
 */
#include "backend/cpu/cpu_math.h"
#include "model/weights.h"

#include <math.h>
#include <stdlib.h>

void gptoss_cpu_matmul_bf16(float *out, const float *x, int32_t n, const gptoss_tensor *w,
                            const float *bias) {
    int32_t rows = (int32_t)w->shape[0], cols = (int32_t)w->shape[1];
    const uint8_t *base = w->data;
#pragma omp parallel
    {
        float *row = malloc((size_t)cols * sizeof *row);
#pragma omp for schedule(static)
        for (int32_t r = 0; r < rows; r++) {
            if (!row) continue;
            gptoss_cpu_widen_bf16_row(row, base + (size_t)r * cols * 2, cols);
            for (int32_t t = 0; t < n; t++) {
                const float d = gptoss_cpu_dot(x + (size_t)t * cols, row, cols);
                out[(size_t)t * rows + r] = bias ? d + bias[r] : d;
            }
        }
        free(row);
    }
}

void gptoss_cpu_rmsnorm(float *y, const float *x, const float *gain, int32_t n, double eps) {
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++)
        sum += x[i] * x[i];
    float inv = 1.0f / sqrtf(sum / (float)n + (float)eps);
    for (int32_t i = 0; i < n; i++)
        y[i] = gain[i] * (x[i] * inv);
}
