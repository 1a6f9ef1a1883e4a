/*
 * attention_tc.h - tensor-core (mma.sync, sm_80+) paged sink attention for prefill-sized steps.
 *
 * Same contract as gptoss_cuda_attention with n_splits = 1 (cuda_kernels.h): it owns nothing,
 * enqueues one kernel on `stream`, never allocates, synchronizes or reads device data on the
 * host. The scalar kernel stays the one for decode steps (few tokens, split-K).
 */
#ifndef GPTOSS_ATTENTION_TC_H
#define GPTOSS_ATTENTION_TC_H

#include "backend/cuda/cuda_kernels.h"

/*
 * out[t, h*head_dim : (h+1)*head_dim] = softmax over key positions j in [max(0, p - window + 1), p]
 * (window <= 0: [0, p]) of sequence token_seq[t], p = positions[t], of q[t, h] . k[j, h / group],
 * with sinks[h] as an extra logit in the denominator, times v[j, h / group]; group =
 * n_heads / n_kv_heads.
 *   q [n_tokens, n_heads, head_dim] f32, already scaled by 1/sqrt(head_dim);
 *   k_cache, v_cache [n_blocks, block_size, n_kv_heads, head_dim] bf16 (the step's keys
 *   already written), block_tables [n_seqs, max_blocks]; positions, token_seq [n_tokens];
 *   sinks [n_heads] f32; out [n_tokens, n_heads * head_dim] bf16.
 * Rounding: q and the softmax probabilities are rounded to bf16 before their tensor-core
 * products (fp32 accumulation, fp32 softmax statistics), so results differ from the scalar
 * kernel's by about 2^-9 relative.
 * Supports head_dim 16, 32, 64, 128 and 1 <= group <= 8, with k_cache/v_cache 16-byte aligned,
 * q 8-byte and out 4-byte aligned. Returns nonzero, enqueuing nothing, for anything else (the
 * caller falls back to gptoss_cuda_attention); 0 otherwise (also for n_tokens <= 0).
 */
int gptoss_cuda_attention_tc(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                             const int32_t *positions, const int32_t *token_seq,
                             const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                             const float *sinks, int32_t n_tokens, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, int32_t window, bf16 *out,
                             cudaStream_t stream);

/* The same over an FP8 cache (the layout of gptoss_cuda_rope_kv_write_fp8: e4m3 codes
 * [n_blocks, block_size, n_kv_heads, head_dim], 16-byte aligned, and fp32 scales
 * [n_blocks, block_size, n_kv_heads]): the attention of the dequantized cache, with the
 * scales applied in fp32 to the scores and the probabilities (attention_tc.cu). */
int gptoss_cuda_attention_tc_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                                 const float *k_scale, const float *v_scale,
                                 const int32_t *positions, const int32_t *token_seq,
                                 const int32_t *block_tables, int32_t max_blocks,
                                 int32_t block_size, const float *sinks, int32_t n_tokens,
                                 int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                 int32_t window, bf16 *out, cudaStream_t stream);

/*
 * The same two with one token per block (the _each forms): a query row's result does not
 * depend on the rows that share its tile, nor on the tile's first key (the softmax steps sit
 * at absolute multiples of 32 keys), so these give every token bitwise what the tiled launch
 * gives it. For decode tokens, where a tile of one-token sequences would walk every
 * sequence's keys in turn; the batch-invariant mode's attention for short runs.
 */
int gptoss_cuda_attention_tc_each(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                                  const int32_t *positions, const int32_t *token_seq,
                                  const int32_t *block_tables, int32_t max_blocks,
                                  int32_t block_size, const float *sinks, int32_t n_tokens,
                                  int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                  int32_t window, bf16 *out, cudaStream_t stream);
int gptoss_cuda_attention_tc_fp8_each(const float *q, const uint8_t *k_cache,
                                      const uint8_t *v_cache, const float *k_scale,
                                      const float *v_scale, const int32_t *positions,
                                      const int32_t *token_seq, const int32_t *block_tables,
                                      int32_t max_blocks, int32_t block_size, const float *sinks,
                                      int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                                      int32_t head_dim, int32_t window, bf16 *out,
                                      cudaStream_t stream);

/*
 * Decode tokens (any number of them, one block per token and KV head): what
 * gptoss_cuda_attention computes, split-K partials and their merge included (1 <= n_splits <= 256,
 * partial [n_tokens, n_heads, n_splits, head_dim + 2] f32 when n_splits > 1), on tensor cores
 * with q and the probabilities carried to 24 bits (three bf16 terms), as exact as the fp32
 * scalar kernel. Supports head_dim 16, 32, 64, 128 and
 * 1 <= group <= 16 with the alignment above; returns nonzero, enqueuing nothing, for anything
 * else (the caller falls back to gptoss_cuda_attention). The _fp8 form reads an FP8 cache as
 * gptoss_cuda_attention_tc_fp8 does.
 */
int gptoss_cuda_attention_decode(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                                 const int32_t *positions, const int32_t *token_seq,
                                 const int32_t *block_tables, int32_t max_blocks,
                                 int32_t block_size, const float *sinks, int32_t n_tokens,
                                 int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                 int32_t window, int32_t n_splits, float *partial, bf16 *out,
                                 cudaStream_t stream);
int gptoss_cuda_attention_decode_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                                     const float *k_scale, const float *v_scale,
                                     const int32_t *positions, const int32_t *token_seq,
                                     const int32_t *block_tables, int32_t max_blocks,
                                     int32_t block_size, const float *sinks, int32_t n_tokens,
                                     int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                     int32_t window, int32_t n_splits, float *partial, bf16 *out,
                                     cudaStream_t stream);
/* Raises the decode kernels' shared-memory limit for head_dim (the launchers do it on first
 * use; call it before capturing a graph). */
cudaError_t gptoss_cuda_attention_decode_prepare(int32_t head_dim);

#endif
