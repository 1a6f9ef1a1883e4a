/*
 * dense_lowp.h - dense matrices (QKV, O, lm_head) held in FP8 instead of bf16: the weight
 * type the backend passes around, and the launchers of dense_lowp.cu.
 *
 * Format: e4m3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; largest finite 448,
 * smallest subnormal 2^-9; codes 0x7f and 0xff are NaN and never written here) with one
 * fp32 scale per output row, scale[r] = max_j |w[r, j]| / 448, code[r, j] = e4m3(w[r, j] /
 * scale[r]) rounded to nearest even and saturated at +-448. A row of zeros has scale 0 and
 * codes 0. Weight w[r, j] is read back as value(code[r, j]) * scale[r].
 *
 * Products are exact: the kernels decode codes (exactly) to 16-bit floats, multiply by the
 * bf16 activations and accumulate in fp32, and apply the row scale once to the finished dot
 * product, never to single weights. Activations stay bf16 (nothing here quantizes them).
 *
 * Owns nothing: launchers take device pointers and a stream and only enqueue (the GEMM also
 * calls cuBLAS on its handle, whose stream the caller has set). The GPU tests call these
 * directly against host references.
 */
#ifndef GPTOSS_CUDA_DENSE_LOWP_H
#define GPTOSS_CUDA_DENSE_LOWP_H

#include "backend/cuda/cuda_kernels.h"

#include <cublas_v2.h>
#include <stddef.h>

#define GPTOSS_E4M3_MAX 448.0f

/*
 * One dense weight matrix [n, k] (row r produces output feature r), in whichever form the
 * backend chose at load time: bf16 (w_bf16 set, w_e4m3 NULL) or e4m3 (w_e4m3 and row_scale
 * set, w_bf16 NULL). The e4m3 form is one allocation, owned by whoever owns the matrix:
 * codes [n, k] at w_e4m3, then (256-byte aligned) row_scale [n] f32, freed with
 * cudaFree(w_e4m3); gptoss_cuda_e4m3_bytes gives its size.
 */
typedef struct gptoss_cuda_dense_weight {
    bf16 *w_bf16;     /* [n, k] or NULL */
    uint8_t *w_e4m3;  /* [n, k] e4m3 codes or NULL */
    float *row_scale; /* [n] inside the w_e4m3 allocation, or NULL */
} gptoss_cuda_dense_weight;

/* Bytes of the e4m3 form of an [n, k] matrix (codes, alignment, scales); its scales start at
 * byte gptoss_cuda_e4m3_scale_offset(n, k) of the allocation. */
size_t gptoss_cuda_e4m3_scale_offset(size_t n, size_t k);
size_t gptoss_cuda_e4m3_bytes(size_t n, size_t k);

/* Quantizes rows of w [n, k] bf16 as described at the top: codes [n, k] and row_scale [n].
 * Any n >= 0, k >= 1. */
void gptoss_cuda_quantize_e4m3_rows(const bf16 *w, int32_t n, int32_t k, uint8_t *codes,
                                    float *row_scale, cudaStream_t stream);

/*
 * y[m, n] f32 = x[m, k] bf16 . (codes[n, k] * row_scale[n])^T for decode shapes: the same
 * contract as gptoss_cuda_gemv_bf16 (m <= GPTOSS_GEMV_MAX_ROWS), with k % 16 == 0,
 * k <= 4096, codes and x 16-byte aligned. Returns nonzero (enqueuing nothing) for any other
 * shape. Launched with programmatic dependent launch (it waits before reading x).
 */
int gptoss_cuda_gemv_e4m3(const uint8_t *codes, const float *row_scale, const bf16 *x, float *y,
                          int32_t m, int32_t n, int32_t k, int32_t n_sms, cudaStream_t stream);

/* Measures how many GEMV blocks one SM of the current device holds, so each launch is a
 * single wave (call once per process before launching; without it a launch uses one block
 * per SM). */
cudaError_t gptoss_cuda_dense_lowp_prepare(void);

/* Tokens up to which the backend runs an e4m3 matrix as GEMV passes of
 * GPTOSS_GEMV_MAX_ROWS rows: each pass reads half the bytes of a bf16 pass, so up to 16
 * rows the passes move no more than the dequantizing GEMM below (which writes and reads
 * the whole matrix in bf16 besides). */
#define GPTOSS_E4M3_GEMV_MAX_TOKENS 16

/* out[r, j] = value(codes[r, j]) (exact, unscaled) for rows [0, n_rows); k % 16 == 0,
 * 16-byte aligned. */
void gptoss_cuda_dequantize_e4m3_rows(const uint8_t *codes, int32_t n_rows, int32_t k, bf16 *out,
                                      cudaStream_t stream);

/*
 * y[m, n] f32 = x[m, k] bf16 . (codes[n, k] * row_scale[n])^T for any m (prefill): the rows
 * of codes go through scratch in blocks of scratch_elems / k rows, decoded to bf16 (exact,
 * unscaled), each block multiplied by cuBLAS (bf16 in, fp32 accumulation and output), and y's
 * columns scaled by row_scale at the end. The cuBLAS handle must run on `stream`. Needs
 * k % 16 == 0, 16-byte aligned codes and scratch, and scratch for at least one row; returns
 * CUBLAS_STATUS_INVALID_VALUE (enqueuing nothing) otherwise, or cuBLAS's failure.
 */
cublasStatus_t gptoss_cuda_gemm_e4m3(cublasHandle_t cublas, const uint8_t *codes,
                                     const float *row_scale, const bf16 *x, float *y, int32_t m,
                                     int32_t n, int32_t k, bf16 *scratch, size_t scratch_elems,
                                     cudaStream_t stream);

#endif
