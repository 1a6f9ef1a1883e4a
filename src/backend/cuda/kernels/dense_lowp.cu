/*
 * dense_lowp.cu - dense matrices in FP8 (e4m3 codes, one fp32 scale per output row; the
 * format is described in dense_lowp.h): the load-time quantizer, the decode GEMV that
 * streams the codes, and the prefill GEMM that decodes blocks of rows to bf16 for cuBLAS.
 *
 * Decode is memory-bound: per token every weight byte crosses the bus once, so halving the
 * bytes of QKV, O and lm_head is the point of the format. The GEMV therefore looks like the
 * bf16 one in gemv_bf16.cu (16-byte loads, two rows per warp sharing the activations staged
 * in shared memory, several loads in flight per lane, fp32 accumulation, one warp
 * reduction per row), with 16 weights per load instead of 8.
 *
 * Nothing here allocates or synchronizes; launchers only enqueue.
 */
#include "backend/cuda/kernels/dense_lowp.h"
#include "backend/cuda/kernels/traits.h"
#include "backend/cuda/kernels/ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <string.h>

size_t gptoss_cuda_e4m3_scale_offset(size_t n, size_t k) {
    return (n * k + 255) & ~(size_t)255;
}
size_t gptoss_cuda_e4m3_bytes(size_t n, size_t k) {
    return gptoss_cuda_e4m3_scale_offset(n, k) + n * sizeof(float);
}

/* ---- e4m3 -> fp16, four codes at a time ---------------------------------------------------- */

/*
 * Both ways are exact; they differ by a power of two that the caller folds into the row
 * scale (E4M3_DECODE_FACTOR multiplies a finished fp32 sum, which is exact):
 *   - sm_89 and newer convert in hardware (cvt.rn.f16x2.e4m3x2): fp16 = value(code).
 *   - sm_80/86 have no fp8 conversion, so the bits move: e4m3 S.EEEE.MMM written as fp16
 *     S.0EEEE.MMM0000000 is value(code) * 2^-8 (exponent biases 7 and 15), subnormals
 *     included (exponent field 0 in both: 0.MMM * 2^-6 becomes 0.MMM * 2^-14).
 * Codes 0x7f and 0xff (NaN) would read as 480 * 2^-8 on the second way; the quantizer
 * never writes them for finite weights.
 */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define E4M3_DECODE_FACTOR 256.0f
#else
#define E4M3_DECODE_FACTOR 1.0f
#endif

/* codes: 4 e4m3 bytes, byte 0 first; lo = fp16 pair {code 0, code 1}, hi = {code 2, code 3}
 * (first value in the low half), as raw fp16x2 bits. */
static __device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t codes, uint32_t &lo, uint32_t &hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"((unsigned short)(codes & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"((unsigned short)(codes >> 16)));
#else
    /* each code into the high byte of a 16-bit half (bytes 0, c0, 0, c1), then the sign
     * stays and the other 7 bits move down by one */
    uint32_t t01 = __byte_perm(codes, 0u, 0x1404), t23 = __byte_perm(codes, 0u, 0x3424);
    lo = (t01 & 0x80008000u) | ((t01 >> 1) & 0x3fff3fffu);
    hi = (t23 & 0x80008000u) | ((t23 >> 1) & 0x3fff3fffu);
#endif
}

static __device__ __forceinline__ float2 f16x2_to_float2(uint32_t bits) {
    __half2 h;
    memcpy(&h, &bits, sizeof h);
    return __half22float2(h);
}

/* Eight weights (two code words) as floats, value(code) / E4M3_DECODE_FACTOR each. */
static __device__ __forceinline__ void decode8(uint32_t w0, uint32_t w1, float out[8]) {
    uint32_t h[4];
    e4m3x4_to_f16x2(w0, h[0], h[1]);
    e4m3x4_to_f16x2(w1, h[2], h[3]);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = f16x2_to_float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

/* ---- quantizer (load time) -------------------------------------------------------------- */

/* One warp per row: the row's absmax, then every code (rounded to nearest even, saturated;
 * __nv_cvt_float_to_fp8 is the hardware conversion on sm_89+, software before). */
static __global__ void quantize_e4m3_kernel(const bf16 *w, int32_t n, int32_t k, uint8_t *codes,
                                            float *row_scale) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const bf16 *wr = w + (size_t)row * k;
    float amax = 0.0f;
    for (int j = lane; j < k; j += 32)
        amax = fmaxf(amax, fabsf(__bfloat162float(wr[j])));
    amax = warp_max(amax);
    const float scale = amax / GPTOSS_E4M3_MAX;
    uint8_t *cr = codes + (size_t)row * k;
    for (int j = lane; j < k; j += 32) {
        const float v = __bfloat162float(wr[j]);
        cr[j] = scale > 0.0f ? (uint8_t)__nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3)
                             : (uint8_t)0;
    }
    if (lane == 0) row_scale[row] = scale;
}

void gptoss_cuda_quantize_e4m3_rows(const bf16 *w, int32_t n, int32_t k, uint8_t *codes,
                                    float *row_scale, cudaStream_t stream) {
    if (n <= 0 || k <= 0) return;
    const int warps = 8;
    quantize_e4m3_kernel<<<(n + warps - 1) / warps, warps * 32, 0, stream>>>(w, n, k, codes,
                                                                             row_scale);
}

/* ---- decode GEMV ------------------------------------------------------------------------- */

/*
 * Grid-stride over pairs of rows, one pair per warp at a time; x [m, k] bf16 staged in
 * shared memory once per block. Lane l takes 16-byte chunks l, l + 32, ... of both rows
 * (16 codes each; FP8_GEMV_LOADS_IN_FLIGHT chunks per row in flight), decodes each half chunk to 8
 * floats and multiplies them with the matching 8 activations of every token:
 *
 *   codes row r:  | chunk 0 | chunk 1 | ... | chunk k/16 - 1 |    (lane = chunk % 32)
 *   x row i:      | x uint4 0 | x uint4 1 | ...                    (chunk c = x uint4 2c, 2c+1)
 *
 * Products of a bf16 and an e4m3 value are exact in fp32; the sums are fp32; the row scale
 * multiplies the warp's total once.
 */

/* Weights are read once per step: load them past L1 (read-only path, no allocation). */
static __device__ __forceinline__ uint4 load_weights16(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

template <int M>
static __global__ void __launch_bounds__(FP8_GEMV_WARPS * 32)
    gemv_e4m3_kernel(const uint8_t *codes, const float *row_scale, const bf16 *x, float *y,
                     int32_t m, int32_t n, int32_t k) {
    extern __shared__ __align__(16) unsigned char e4_smem[];
    uint4 *xs = (uint4 *)e4_smem; /* [m][k / 8] */
    const int x_chunks = k >> 3, w_chunks = k >> 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int first_row = FP8_GEMV_ROWS_PER_WARP * (blockIdx.x * FP8_GEMV_WARPS + warp);
    const int row_step = FP8_GEMV_ROWS_PER_WARP * FP8_GEMV_WARPS * gridDim.x;
    if (first_row <
        n) { /* warm L2 with this warp's first rows while the previous kernel finishes */
        const char *p = (const char *)(codes + (size_t)first_row * k);
        size_t bytes = (size_t)min(FP8_GEMV_ROWS_PER_WARP, n - first_row) * k;
        for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
    }
    pdl_wait();
    for (int i = threadIdx.x; i < m * x_chunks; i += blockDim.x)
        xs[i] = ((const uint4 *)x)[i];
    __syncthreads();
    for (int row0 = first_row; row0 < n; row0 += row_step) {
        const uint4 *wr[FP8_GEMV_ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < FP8_GEMV_ROWS_PER_WARP;
             r++) /* past the last row: repeat it (read, never stored) */
            wr[r] = (const uint4 *)(codes + (size_t)min(row0 + r, n - 1) * k);
        float acc[FP8_GEMV_ROWS_PER_WARP][M];
#pragma unroll
        for (int r = 0; r < FP8_GEMV_ROWS_PER_WARP; r++)
#pragma unroll
            for (int i = 0; i < M; i++)
                acc[r][i] = 0.0f;
        for (int c0 = lane; c0 < w_chunks; c0 += 32 * FP8_GEMV_LOADS_IN_FLIGHT) {
            uint4 q[FP8_GEMV_LOADS_IN_FLIGHT][FP8_GEMV_ROWS_PER_WARP];
#pragma unroll
            for (int u = 0; u < FP8_GEMV_LOADS_IN_FLIGHT; u++) {
                const int c = c0 + 32 * u;
#pragma unroll
                for (int r = 0; r < FP8_GEMV_ROWS_PER_WARP; r++)
                    q[u][r] = c < w_chunks ? load_weights16(wr[r] + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < FP8_GEMV_LOADS_IN_FLIGHT; u++) {
                const int c = c0 + 32 * u;
                if (c >= w_chunks) break;
#pragma unroll
                for (int half = 0; half < 2; half++) { /* codes 8*half .. 8*half+7 of the chunk */
                    float wf[FP8_GEMV_ROWS_PER_WARP][8];
#pragma unroll
                    for (int r = 0; r < FP8_GEMV_ROWS_PER_WARP; r++)
                        decode8(half ? q[u][r].z : q[u][r].x, half ? q[u][r].w : q[u][r].y, wf[r]);
#pragma unroll
                    for (int i = 0; i < M; i++) {
                        if (i >= m) break;
                        const uint4 xv = xs[i * x_chunks + 2 * c + half];
                        const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const float x0 = __uint_as_float(xw[j] << 16),
                                        x1 = __uint_as_float(xw[j] & 0xffff0000u);
#pragma unroll
                            for (int r = 0; r < FP8_GEMV_ROWS_PER_WARP; r++) {
                                acc[r][i] = fmaf(wf[r][2 * j], x0, acc[r][i]);
                                acc[r][i] = fmaf(wf[r][2 * j + 1], x1, acc[r][i]);
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < FP8_GEMV_ROWS_PER_WARP; r++) {
            const int row = row0 + r;
            const float scale = row < n ? row_scale[row] * E4M3_DECODE_FACTOR : 0.0f;
#pragma unroll
            for (int i = 0; i < M; i++) {
                if (i >= m) break;
                const float v = warp_sum(acc[r][i]);
                if (lane == 0 && row < n) y[(size_t)i * n + row] = v * scale;
            }
        }
    }
}

/* Blocks of gemv_e4m3_kernel<1>, <2>, <4> one SM holds (set here, in the current context; 0:
 * not measured, then one per SM). The grid is one wave of them: blocks past the wave would
 * start only when others finish and leave most SMs idle for their whole turn. */
cudaError_t gptoss_cuda_dense_lowp_prepare(void) {
    int *e4_blocks_per_sm = gptoss_cuda_kernel_ctx_current()->e4_blocks_per_sm;
    const int threads = FP8_GEMV_WARPS * 32;
    const size_t x_row = 4096 * sizeof(bf16); /* the widest rows taken */
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &e4_blocks_per_sm[0], gemv_e4m3_kernel<1>, threads, x_row);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&e4_blocks_per_sm[1], gemv_e4m3_kernel<2>,
                                                          threads, 2 * x_row);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&e4_blocks_per_sm[2], gemv_e4m3_kernel<4>,
                                                          threads, 4 * x_row);
    /* no more blocks than the profile's shared memory per SM holds (1 KB reserved per block) */
    const size_t sm_smem = gptoss_cuda_caps_current()->smem_per_sm;
    for (int v = 0; v < 3 && sm_smem > 0; v++) {
        const int fit = (int)(sm_smem / (((size_t)1 << v) * x_row + 1024));
        if (e4_blocks_per_sm[v] > fit) e4_blocks_per_sm[v] = fit > 0 ? fit : 1;
    }
    return e;
}

int gptoss_cuda_gemv_e4m3(const uint8_t *codes, const float *row_scale, const bf16 *x, float *y,
                          int32_t m, int32_t n, int32_t k, int32_t n_sms, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    if (m > GPTOSS_GEMV_MAX_ROWS || k <= 0 || k % 16 != 0 || k > 4096 ||
        ((uintptr_t)codes | (uintptr_t)x) % 16 != 0)
        return 1;
    const size_t smem = (size_t)m * k * sizeof(bf16);
    const int rows_per_block = FP8_GEMV_ROWS_PER_WARP * FP8_GEMV_WARPS;
    const int want = (n + rows_per_block - 1) / rows_per_block;
    const int variant = m == 1 ? 0 : m == 2 ? 1 : 2;
    const int *e4_blocks_per_sm = gptoss_cuda_kernel_ctx_current()->e4_blocks_per_sm;
    const int cap =
        (e4_blocks_per_sm[variant] > 0 ? e4_blocks_per_sm[variant] : 1) * (n_sms > 0 ? n_sms : 1);
    const int grid = want < cap ? want : cap;
    if (m == 1)
        launch_pdl(gemv_e4m3_kernel<1>, dim3(grid), dim3(FP8_GEMV_WARPS * 32), smem, stream, codes,
                   row_scale, x, y, m, n, k);
    else if (m == 2)
        launch_pdl(gemv_e4m3_kernel<2>, dim3(grid), dim3(FP8_GEMV_WARPS * 32), smem, stream, codes,
                   row_scale, x, y, m, n, k);
    else
        launch_pdl(gemv_e4m3_kernel<4>, dim3(grid), dim3(FP8_GEMV_WARPS * 32), smem, stream, codes,
                   row_scale, x, y, m, n, k);
    return 0;
}

/* ---- prefill: decode to bf16, cuBLAS, scale ---------------------------------------------- */

/* 16 codes per thread and step -> 16 bf16 (exact: every e4m3 value is a bf16 value). */
static __global__ void dequantize_e4m3_kernel(const uint4 *codes, size_t n_chunks, uint4 *out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_chunks;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 q = codes[i];
        uint32_t o[8];
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t h[2];
            e4m3x4_to_f16x2(words[j], h[0], h[1]);
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const float2 f = f16x2_to_float2(h[p]);
                const __nv_bfloat162 b =
                    __floats2bfloat162_rn(f.x * E4M3_DECODE_FACTOR, f.y * E4M3_DECODE_FACTOR);
                memcpy(&o[2 * j + p], &b, sizeof b);
            }
        }
        out[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
        out[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

void gptoss_cuda_dequantize_e4m3_rows(const uint8_t *codes, int32_t n_rows, int32_t k, bf16 *out,
                                      cudaStream_t stream) {
    if (n_rows <= 0 || k <= 0) return;
    const size_t n_chunks = (size_t)n_rows * k / 16;
    const size_t want = (n_chunks + 255) / 256;
    dequantize_e4m3_kernel<<<(unsigned)(want < 4096 ? want : 4096), 256, 0, stream>>>(
        (const uint4 *)codes, n_chunks, (uint4 *)out);
}

/* y[i, j] *= scale[j]: grid (column blocks, rows). */
static __global__ void scale_columns_kernel(float *y, const float *scale, int32_t m, int32_t n) {
    for (int32_t i = blockIdx.y; i < m; i += gridDim.y)
        for (int32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)
            y[(size_t)i * n + j] *= scale[j];
}

cublasStatus_t gptoss_cuda_gemm_e4m3(cublasHandle_t cublas, const uint8_t *codes,
                                     const float *row_scale, const bf16 *x, float *y, int32_t m,
                                     int32_t n, int32_t k, bf16 *scratch, size_t scratch_elems,
                                     cudaStream_t stream) {
    if (m <= 0 || n <= 0) return CUBLAS_STATUS_SUCCESS;
    if (k <= 0 || k % 16 != 0 || ((uintptr_t)codes | (uintptr_t)scratch) % 16 != 0 ||
        scratch_elems < (size_t)k)
        return CUBLAS_STATUS_INVALID_VALUE;
    const size_t fit = scratch_elems / (size_t)k;
    const int32_t block_rows = fit < (size_t)n ? (int32_t)fit : n;
    const float one = 1.0f, zero = 0.0f;
    for (int32_t r0 = 0; r0 < n; r0 += block_rows) {
        const int32_t rows = n - r0 < block_rows ? n - r0 : block_rows;
        gptoss_cuda_dequantize_e4m3_rows(codes + (size_t)r0 * k, rows, k, scratch, stream);
        /* column-major view, as in the bf16 GEMM: y^T[rows, m] (ld n) = scratch^T . x^T */
        cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, m, k, &one,
                                         scratch, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, y + r0,
                                         CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    const int32_t col_blocks = (n + 255) / 256;
    dim3 grid(col_blocks < 1024 ? col_blocks : 1024, m < 65535 ? m : 65535);
    scale_columns_kernel<<<grid, 256, 0, stream>>>(y, row_scale, m, n);
    return CUBLAS_STATUS_SUCCESS;
}
