/*
 * eagle3.h - the kernels of an EAGLE3 draft head's forward (eagle3.cu) that the target's
 * kernels do not cover: its two input norms, its plain RoPE with a per-sequence contiguous f32
 * KV cache, its causal attention over that cache, SwiGLU, and small conversions. The head's
 * matrix products, residual + RMSNorm and argmax use the target's launchers
 * (cuda_kernels.h). Launchers only enqueue (the cuda_kernels.h conventions).
 *
 * A batch of n rows; row r is one head position of one sequence:
 *   meta [GPTOSS_E3_META, n] int32 (field-major): token | aux_row | position | write_row | n_ctx
 *   kv   [2, n] device pointers: row r's sequence cache K (kv[r]) and V (kv[n + r]), f32
 *        [cap, n_kv_heads * head_dim]; the row writes its K, V at write_row and attends over
 *        cache rows [0, n_ctx)
 */
#ifndef GPTOSS_CUDA_KERNELS_EAGLE3_H
#define GPTOSS_CUDA_KERNELS_EAGLE3_H

#include "backend/cuda/cuda_kernels.h"

#define GPTOSS_E3_META 5
enum { GPTOSS_E3_TOKEN = 0, GPTOSS_E3_AUX_ROW, GPTOSS_E3_POSITION, GPTOSS_E3_WRITE, GPTOSS_E3_CTX };

/* out[i] = bf16(in[i]). */
void gptoss_cuda_e3_to_bf16(const float *in, size_t n, bf16 *out, cudaStream_t stream);

/* Per row r: e = embedding[token]; h = aux_row >= 0 ? fc_out[aux_row] : chain[r];
 * hidden[r] = h; x2[r] = [bf16(rmsnorm(e) * g_embed), bf16(rmsnorm(h) * g_hidden)] [2H]. */
void gptoss_cuda_e3_inputs(const int32_t *meta, int32_t n, const bf16 *embedding,
                           const float *fc_out, const float *chain, const float *g_embed,
                           const float *g_hidden, float eps, int32_t hidden, float *hidden_out,
                           bf16 *x2, cudaStream_t stream);

/* Rotate-half RoPE at each row's position (angle = position * inv_freq[j]) on q and k of
 * qkv [n, (NH + 2 NKV) * D] in place, then K and V into the row's cache at write_row. */
void gptoss_cuda_e3_rope_kv(float *qkv, const int32_t *meta, float *const *kv, int32_t n,
                            const float *inv_freq, int32_t n_heads, int32_t n_kv_heads,
                            int32_t head_dim, cudaStream_t stream);

/* out[r, h*D..] = bf16(softmax(q . K[0, n_ctx)^T / sqrt(D)) . V) with GQA; head_dim 32, 64 or
 * 128 (nonzero return otherwise, nothing launched). */
int gptoss_cuda_e3_attention(const float *qkv, const int32_t *meta, float *const *kv, int32_t n,
                             int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, bf16 *out,
                             cudaStream_t stream);

/* act[r, i] = bf16(silu(gu[r, i]) * gu[r, I + i]) for gu [n, 2I] (gate | up). */
void gptoss_cuda_e3_swiglu(const float *gu, int32_t n, int32_t inter, bf16 *act,
                           cudaStream_t stream);

/* y[j] = sum over chunks c of parts_c[j] for a GEMV whose K was cut into n_chunks chunks, run in
 * groups of up to `group` chunks as one GEMV each (the group's chunks as its rows, over the
 * group's weights as one matrix): group g (chunks [g * group, ..), cg of them) wrote
 * [cg, cg * n] at parts + g * group * group * n, chunk i of it in row i, columns [i n, i n + n). */
void gptoss_cuda_e3_sum_chunks(const float *parts, int32_t n_chunks, int32_t group, int32_t n,
                               float *y, cudaStream_t stream);

/* out[i] = src[rows[i]], f32 rows of width `width`. */
void gptoss_cuda_e3_gather_f32(const float *src, const int32_t *rows, int32_t n_rows, int32_t width,
                               float *out, cudaStream_t stream);

#endif
