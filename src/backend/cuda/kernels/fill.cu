/*
 * fill.cu - bf16 -> f32 conversion and the hash RNG fills used by random-weight benchmarks
 * (counter-based, so every element is independent of launch shape).
 */
#include "backend/cuda/kernels/ptx.cuh"

#include <math.h>

/* splitmix64: a counter-based hash, so every element is independent of launch shape. */
static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static __device__ __forceinline__ float hash_normal(uint64_t seed, size_t i) {
    uint64_t h = mix64(seed ^ mix64((uint64_t)i));
    float u1 = ((float)(h >> 40) + 1.0f) * (1.0f / 16777217.0f); /* (0, 1] */
    float u2 = (float)((h >> 16) & 0xffffffu) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

static __global__ void bf16_to_f32_kernel(const bf16 *in, size_t n, float *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

void gptoss_cuda_bf16_to_f32(const bf16 *in, size_t n, float *out, cudaStream_t stream) {
    if (n) bf16_to_f32_kernel<<<1024, 256, 0, stream>>>(in, n, out);
}

static __global__ void fill_normal_bf16_kernel(bf16 *out, size_t n, size_t first, uint64_t seed,
                                               float mean, float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(mean + sd * hash_normal(seed, first + i));
}
/* rows x cols elements taken from a longer array at first + r * stride + j */
static __global__ void fill_normal_bf16_rows_kernel(bf16 *out, size_t rows, size_t cols,
                                                    size_t first, size_t stride, uint64_t seed,
                                                    float mean, float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] =
            __float2bfloat16(mean + sd * hash_normal(seed, first + (i / cols) * stride + i % cols));
}
static __global__ void fill_normal_f32_kernel(float *out, size_t n, size_t first, uint64_t seed,
                                              float mean, float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = mean + sd * hash_normal(seed, first + i);
}
static __device__ __forceinline__ uint8_t uniform_u8(uint64_t seed, size_t index, int lo, int hi) {
    uint64_t h = mix64(seed ^ mix64((uint64_t)index));
    return lo == 0 && hi == 255 ? (uint8_t)(h >> 32)
                                : (uint8_t)(lo + (int)((h >> 32) % (uint64_t)(hi - lo + 1)));
}
static __global__ void fill_uniform_u8_kernel(uint8_t *out, size_t n, size_t first, uint64_t seed,
                                              int lo, int hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = uniform_u8(seed, first + i, lo, hi);
}
static __global__ void fill_uniform_u8_rows_kernel(uint8_t *out, size_t rows, size_t cols,
                                                   size_t first, size_t stride, uint64_t seed,
                                                   int lo, int hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = uniform_u8(seed, first + (i / cols) * stride + i % cols, lo, hi);
}
static __global__ void fill_normal_f32_rows_kernel(float *out, size_t rows, size_t cols,
                                                   size_t first, size_t stride, uint64_t seed,
                                                   float mean, float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = mean + sd * hash_normal(seed, first + (i / cols) * stride + i % cols);
}

void gptoss_cuda_fill_normal_bf16(bf16 *out, size_t n, uint64_t seed, float mean, float stddev,
                                  cudaStream_t stream) {
    gptoss_cuda_fill_normal_bf16_at(out, n, 0, seed, mean, stddev, stream);
}
void gptoss_cuda_fill_normal_bf16_at(bf16 *out, size_t n, size_t first, uint64_t seed, float mean,
                                     float stddev, cudaStream_t stream) {
    if (n) fill_normal_bf16_kernel<<<4096, 256, 0, stream>>>(out, n, first, seed, mean, stddev);
}
void gptoss_cuda_fill_normal_bf16_rows(bf16 *out, size_t rows, size_t cols, size_t first,
                                       size_t stride, uint64_t seed, float mean, float stddev,
                                       cudaStream_t stream) {
    if (rows && cols)
        fill_normal_bf16_rows_kernel<<<4096, 256, 0, stream>>>(out, rows, cols, first, stride, seed,
                                                               mean, stddev);
}
void gptoss_cuda_fill_normal_f32(float *out, size_t n, uint64_t seed, float mean, float stddev,
                                 cudaStream_t stream) {
    gptoss_cuda_fill_normal_f32_at(out, n, 0, seed, mean, stddev, stream);
}
void gptoss_cuda_fill_normal_f32_at(float *out, size_t n, size_t first, uint64_t seed, float mean,
                                    float stddev, cudaStream_t stream) {
    if (n) fill_normal_f32_kernel<<<1024, 256, 0, stream>>>(out, n, first, seed, mean, stddev);
}
void gptoss_cuda_fill_uniform_u8(uint8_t *out, size_t n, uint64_t seed, int lo, int hi,
                                 cudaStream_t stream) {
    gptoss_cuda_fill_uniform_u8_at(out, n, 0, seed, lo, hi, stream);
}
void gptoss_cuda_fill_uniform_u8_at(uint8_t *out, size_t n, size_t first, uint64_t seed, int lo,
                                    int hi, cudaStream_t stream) {
    if (n) fill_uniform_u8_kernel<<<4096, 256, 0, stream>>>(out, n, first, seed, lo, hi);
}
void gptoss_cuda_fill_normal_f32_rows(float *out, size_t rows, size_t cols, size_t first,
                                      size_t stride, uint64_t seed, float mean, float stddev,
                                      cudaStream_t stream) {
    if (rows && cols)
        fill_normal_f32_rows_kernel<<<4096, 256, 0, stream>>>(out, rows, cols, first, stride, seed,
                                                              mean, stddev);
}
void gptoss_cuda_fill_uniform_u8_rows(uint8_t *out, size_t rows, size_t cols, size_t first,
                                      size_t stride, uint64_t seed, int lo, int hi,
                                      cudaStream_t stream) {
    if (rows && cols)
        fill_uniform_u8_rows_kernel<<<4096, 256, 0, stream>>>(out, rows, cols, first, stride, seed,
                                                              lo, hi);
}
