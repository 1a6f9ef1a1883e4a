/*
 * cuda_kernels.h - launchers of the CUDA backend's kernels (in kernels/; the MoE ones in
 * kernels/moe/moe.h).
 *
 * Owns nothing: every launcher takes device pointers and a stream and enqueues work; none
 * allocates, synchronizes or checks results (the caller checks cudaGetLastError once per
 * step). Shapes are in the comments; "bf16" buffers hold __nv_bfloat16, row-major. The GPU
 * tests (tests/cuda) call these directly against host references.
 */
#ifndef GPTOSS_CUDA_KERNELS_H
#define GPTOSS_CUDA_KERNELS_H

#include "backend/cuda/profile.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

/*
 * What the launchers know about the device they launch on and which kernel variants they
 * choose: one context per device (the backend's gptoss_cuda_device owns it), filled by the
 * *_prepare functions and from the tuning (tuning.h). The launchers read the calling thread's
 * current context, which gptoss_cuda_kernel_ctx_bind sets (the backend binds its device's
 * context wherever it makes the device current, as CUDA keeps the current device per thread).
 * A thread that binds none gets its own default context, its knobs read from the tuning
 * variables once (the GPU tests run that way).
 *
 * Return convention of the launchers that return int: 0 = launched; nonzero = the shape or
 * alignment is not taken and nothing was launched (the caller then uses another kernel).
 */
typedef struct gptoss_cuda_kernel_ctx {
    /* what the kernels may use: the device's capabilities limited to the profile (profile.h);
     * every *_prepare decision below follows from these, not from the device itself */
    gptoss_cuda_caps caps;
    bool pdl; /* programmatic dependent launch (sm_90) for launch_pdl's kernels */
    /* bf16 GEMV (kernels/gemv_bf16.cu) */
    int gemv_kernel;            /* tuning: 0 by the rule, 1 ld, 2 tma */
    bool gemv_tma_ok;           /* the bulk-copy kernel runs here (gptoss_cuda_gemv_prepare) */
    int gemv_sms, gemv_sm_smem; /* multiprocessors, shared memory per multiprocessor */
    /* FP8 GEMV (kernels/dense_lowp.cu): blocks of gemv_e4m3_kernel<1, 2, 4> one SM holds */
    int e4_blocks_per_sm[3];
    /* decode attention (kernels/attention_tc.cu), by head_dim */
    bool adc_prepared[129]; /* the shared-memory attribute is set */
    bool adc_wide_ok[129];  /* the 8-warp form fits on this GPU */
    int adc_warps;          /* tuning: 0 by the rule, 4 or 8 */
    /* MoE (kernels/moe/) */
    int32_t moe_prepared_width; /* the mma kernels' shared-memory limits cover widths up to this */
    int32_t moe_mma_max_tile;   /* the tallest mma GEMM route tile whose shared memory fits (8..128;
                                 * 32 with 99 KB per block, as on an RTX 4090) */
    int8_t moe_mma_kps_fit[5];  /* per mma GEMM tile height (8, 16, 32, 64, 128): the most K blocks
                                 * a pipeline stage may hold with its shared memory granted */
    int moe_mma_stage_kb;       /* tuning: K blocks per stage wanted (moe_mma_stage_kb; 0 rule) */
    bool moe_mma_slab;          /* tuning: 8-row tiles on the slab kernel (moe_mma_slab) */
    bool moe_slab_ok;           /* the slab kernel runs here (kernels/moe/slab_gemm.cu) */
    bool moe_wg_ok;             /* the wgmma GEMM runs here (sm_90, its shared memory granted) */
    bool moe_pair_tma_ok;       /* the pair mma's TMA kernel runs here */
    bool moe_pair_group_ok;     /* ... and its grouped form (kernels/moe/moe.h) */
    bool moe_pair_fp8_ok;       /* the pair mma's FP8 kernel runs here */
    int moe_pair_kernel;        /* tuning: enum gptoss_moe_pair_kernel */
    int moe_inflight;           /* tuning: TMA copies in flight per SM (0: no limit) */
    bool moe_inflight_report;   /* tuning: print the waits that gave up at exit */
    int moe_wg_min, moe_pair_tokens, moe_max_tile, moe_tile_pct; /* tuning (tuning.h) */
    int moe_bi_max_tile; /* tuning: the sliced mma GEMM's tallest route tile (bi_moe_tile) */
    int n_sms;           /* multiprocessors (the pair GEMV's grid) */
} gptoss_cuda_kernel_ctx;

struct gptoss_cuda_tuning;
/* Capabilities cleared (nothing prepared), knobs from the tuning (NULL: its defaults). */
void gptoss_cuda_kernel_ctx_init(gptoss_cuda_kernel_ctx *kc,
                                 const struct gptoss_cuda_tuning *tuning);
/* The capabilities of device `ordinal` as the driver reports them (no profile applied). */
cudaError_t gptoss_cuda_query_caps(int ordinal, gptoss_cuda_caps *caps, char *name,
                                   size_t name_size);
/* The current context's capabilities. A thread's default context takes the current device's,
 * limited to the tuning's device_profile (the GPTOSS_CUDA_DEVICE_PROFILE variable: the GPU
 * tests run that way; an invalid or too high profile there stops the process with a message). */
const gptoss_cuda_caps *gptoss_cuda_caps_current(void);
/* Sets kernel's dynamic shared-memory limit to bytes, refused (cudaErrorInvalidValue, nothing
 * set) above the current context's smem_per_block, as a device with that limit refuses it.
 * Every kernel that opts in to more than 48 KB goes through here. */
cudaError_t gptoss_cuda_kernel_smem(const void *kernel, size_t bytes);
/* Makes kc the calling thread's current context (NULL: the thread's default one). */
void gptoss_cuda_kernel_ctx_bind(gptoss_cuda_kernel_ctx *kc);
/* Unbinds kc if it is the calling thread's current context (never makes a default one). */
void gptoss_cuda_kernel_ctx_unbind(const gptoss_cuda_kernel_ctx *kc);
/* The calling thread's current context. */
gptoss_cuda_kernel_ctx *gptoss_cuda_kernel_ctx_current(void);

/* Programmatic dependent launch (sm_90) for the kernels launched through launch_pdl
 * (kernels/ptx.cuh says what a kernel must do), in the current context; off until set, and
 * off whatever is asked where the context's capabilities have no PDL. */
void gptoss_cuda_set_pdl(bool on);
bool gptoss_cuda_pdl_enabled(void);

/* x[t, :] = float(embedding[token_ids[t], :]); x [n_tokens, hidden] f32. */
void gptoss_cuda_embed(const bf16 *embedding, const int32_t *token_ids, int32_t n_tokens,
                       int32_t hidden, float *x, cudaStream_t stream);

/* out [n_rows, hidden] = the weighted sum of each row's k_top expert rows (slots of weight 0
 * left out): a tensor-parallel rank's share of the experts, before the sum over ranks. */
void gptoss_cuda_moe_combine(const float *moe_y, const float *moe_weight, int32_t k_top,
                             int32_t n_rows, int32_t hidden, float *out, cudaStream_t stream);

/*
 * Residual update fused with the next RMSNorm, one row per block. For output row i the
 * residual row is r = row_map ? row_map[i] : i:
 *   x[r] += add[r] + add_bias                       (when add != NULL; add_bias may be NULL)
 *   x[r] += sum_k moe_weight[r, k] * moe_y[r*k_top + k]   (when moe_y != NULL)
 *   out[i] = bf16(gain * x[r] / sqrt(mean(x[r]^2) + eps))   (and out_f32[i] unrounded, if given)
 * x [*, hidden] f32, add [*, hidden] f32, moe_y [*, k_top, hidden] f32, out [n_rows, hidden].
 */
void gptoss_cuda_residual_rmsnorm(float *x, const float *add, const float *add_bias,
                                  const float *moe_y, const float *moe_weight, int32_t k_top,
                                  const float *gain, float eps, const int32_t *row_map,
                                  int32_t n_rows, int32_t hidden, bf16 *out, float *out_f32,
                                  cudaStream_t stream);

/*
 * Adds the QKV bias, applies YaRN RoPE (half-split; cos/sin of positions[t]*inv_freq[j], both
 * times `concentration`) to q and k, writes q (f32, pre-scaled by 1/sqrt(head_dim)) and
 * stores k, v (bf16) into the paged cache at the token's slot.
 * qkv [n_tokens, (n_heads + 2*n_kv_heads) * head_dim] f32 (q | k | v), qkv_bias same width;
 * q_out [n_tokens, n_heads, head_dim] f32; caches [n_blocks, block_size, n_kv_heads, head_dim];
 * block_tables [n_seqs, max_blocks]; token_seq [n_tokens] = sequence of each token.
 * head_dim even, at most 128.
 */
void gptoss_cuda_rope_kv_write(const float *qkv, const float *qkv_bias, const int32_t *positions,
                               const int32_t *token_seq, const float *inv_freq, float concentration,
                               int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, const int32_t *block_tables, int32_t max_blocks,
                               int32_t block_size, float *q_out, bf16 *k_cache, bf16 *v_cache,
                               cudaStream_t stream);

/*
 * The same for an FP8 cache (backend/kv_fp8.h): each (token, KV head) vector of k and v is
 * stored as head_dim e4m3 codes in k_cache / v_cache [n_blocks, block_size, n_kv_heads,
 * head_dim] (uint8) and one fp32 scale in k_scale / v_scale [n_blocks, block_size,
 * n_kv_heads]: scale = absmax / 448, code = e4m3(value / scale), by kv_fp8.h's functions on
 * the fp32 values (never rounded to bf16 first), so the CPU backend's emulation stores the
 * same values.
 */
void gptoss_cuda_rope_kv_write_fp8(const float *qkv, const float *qkv_bias,
                                   const int32_t *positions, const int32_t *token_seq,
                                   const float *inv_freq, float concentration, int32_t n_tokens,
                                   int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   const int32_t *block_tables, int32_t max_blocks,
                                   int32_t block_size, float *q_out, uint8_t *k_cache,
                                   uint8_t *v_cache, float *k_scale, float *v_scale,
                                   cudaStream_t stream);

/* Attention over paged KV with GQA, sinks and an optional sliding window (window <= 0: full).
 * Each token attends to key positions [max(0, p - window + 1), p] of its own sequence, where
 * p = positions[t]. n_splits > 1 splits the keys of each token into chunks (split-K) whose
 * partial results go through `partial` [n_tokens, n_heads, n_splits, head_dim + 2] f32 and are
 * merged by a second kernel (n_splits <= 256; returns nonzero above). out [n_tokens,
 * n_heads * head_dim] bf16. */
int gptoss_cuda_attention(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                          const int32_t *positions, const int32_t *token_seq,
                          const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                          const float *sinks, int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                          int32_t head_dim, int32_t window, int32_t n_splits, float *partial,
                          bf16 *out, cudaStream_t stream);

/* The same over an FP8 cache (layout of gptoss_cuda_rope_kv_write_fp8): keys and values are
 * the codes' values times their scales, applied in fp32 (scores as scale * (q . codes), value
 * rows weighted by probability * scale), so the result is that of the dequantized cache up to
 * fp32 rounding. */
int gptoss_cuda_attention_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                              const float *k_scale, const float *v_scale, const int32_t *positions,
                              const int32_t *token_seq, const int32_t *block_tables,
                              int32_t max_blocks, int32_t block_size, const float *sinks,
                              int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                              int32_t head_dim, int32_t window, int32_t n_splits, float *partial,
                              bf16 *out, cudaStream_t stream);

/* Combines split-K partials [n_tokens, n_heads, n_splits, head_dim + 2] (unnormalized output,
 * max logit, sum of exp relative to it) with the sinks into out [n_tokens, n_heads * head_dim]. */
void gptoss_cuda_attention_merge(const float *partial, const float *sinks, int32_t n_tokens,
                                 int32_t n_heads, int32_t head_dim, int32_t n_splits, bf16 *out,
                                 cudaStream_t stream);

/* Splits worth using for a step whose longest key span is max_span over n_tokens tokens. */
int32_t gptoss_cuda_attention_splits(int32_t n_tokens, int32_t n_kv_heads, int32_t max_span,
                                     int32_t n_sms);

/* Router logits from fp32 activations: logits[t, e] = t[t, :] . weight[e, :] + bias[e].
 * t [n_tokens, hidden] f32, weight [n_experts, hidden] bf16. The prepare call raises the
 * shared-memory limit (once per hidden size). */
void gptoss_cuda_router_logits(const float *t, const bf16 *weight, const float *bias,
                               int32_t n_tokens, int32_t n_experts, int32_t hidden, float *logits,
                               cudaStream_t stream);
cudaError_t gptoss_cuda_router_prepare(int32_t hidden);

/* Router logits and top-k in one launch: as gptoss_cuda_router_logits, then the last block to
 * finish runs gptoss_cuda_router_topk's selection (bias already added). done_counter: one
 * device word, zero before the first launch; the kernel leaves it zero again. */
void gptoss_cuda_router(const float *t, const bf16 *weight, const float *bias, int32_t n_tokens,
                        int32_t n_experts, int32_t hidden, int32_t k_top, float *logits,
                        unsigned *done_counter, int32_t *topk_idx, float *topk_weight,
                        cudaStream_t stream);

/* One decode token: gptoss_cuda_residual_rmsnorm(x, add, add_bias, ..., gain, out) for one row
 * followed by gptoss_cuda_router on the normalized row (bias added), in one kernel; no fp32
 * copy of the row is written. Returns nonzero (enqueues nothing) for a shape it does not take
 * (hidden % 8 != 0 or over 4096, no add_bias, k_top outside 1..min(32, n_experts)). */
int gptoss_cuda_norm_router_one(float *x, const float *add, const float *add_bias,
                                const float *gain, float eps, int32_t hidden, bf16 *out,
                                const bf16 *weight, const float *bias, int32_t n_experts,
                                int32_t k_top, float *logits, unsigned *done_counter,
                                int32_t *topk_idx, float *topk_weight, cudaStream_t stream);

/* y[m, n] f32 = x[m, k] bf16 . w[n, k]^T bf16 for decode shapes (m <= GPTOSS_GEMV_MAX_ROWS,
 * k % 8 == 0, k <= 4096, 16-byte aligned). Returns nonzero (and enqueues nothing) for any
 * other shape, so the caller falls back to a GEMM. */
#define GPTOSS_GEMV_MAX_ROWS 4
int gptoss_cuda_gemv_bf16(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k,
                          int32_t n_sms, cudaStream_t stream);
/* One decode token (positions[0], token_seq[0]): the QKV projection y = x . w^T (w [(n_heads +
 * 2 n_kv_heads) head_dim, hidden] bf16, x [hidden] bf16) with gptoss_cuda_rope_kv_write's bias,
 * RoPE and bf16 KV write in one kernel; q_out, k_cache and v_cache get exactly what
 * gptoss_cuda_gemv_bf16 followed by gptoss_cuda_rope_kv_write would write (no fp32 QKV row is
 * written). Returns nonzero (enqueuing nothing) for a shape it does not take (odd head_dim
 * or over 128, hidden % 8 != 0 or over 4096, w or x not 16-byte aligned). */
int gptoss_cuda_qkv_rope_one(const bf16 *w, const bf16 *x, const float *qkv_bias,
                             const int32_t *positions, const int32_t *token_seq,
                             const float *inv_freq, float concentration, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, int32_t hidden,
                             const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                             float *q_out, bf16 *k_cache, bf16 *v_cache, cudaStream_t stream);
/* Decides whether the GEMV's sm_90 kernel (weights staged by bulk copies) runs here and raises
 * its shared-memory limit, recorded in the current context (once per context; a device it
 * does not run on is not an error). */
cudaError_t gptoss_cuda_gemv_prepare(void);
/* Which GEMV kernel runs (tests and A/B runs): 0 = the default (the bulk-copy kernel where it
 * runs and its blocks fit in one wave), 1 = the load kernel, 2 = the bulk-copy kernel wherever
 * it runs; in the current context, whose initial value is the gemv_kernel knob.
 * gptoss_cuda_gemv_kernel: the kernel (1 load, 2 bulk copy) a product of that shape runs on
 * now. */
void gptoss_cuda_gemv_set_kernel(int kernel);
int gptoss_cuda_gemv_kernel(int32_t m, int32_t n, int32_t k);

/* Router: logits [n_tokens, n_experts] f32 (+ bias, NULL when already added), top-k by value (ties:
 * lower index first), softmax over the k selected. topk_idx/topk_weight [n_tokens, k_top]. Takes 1
 * <= k_top <= 32 and n_experts <= 1024 (the backend refuses other configs at load), as does every
 * fused top-k. */
void gptoss_cuda_router_topk(const float *logits, const float *bias, int32_t n_tokens,
                             int32_t n_experts, int32_t k_top, int32_t *topk_idx,
                             float *topk_weight, cudaStream_t stream);

/* The MXFP4 mixture-of-experts MLP: routing, the paths, their choice (kernels/moe/). */
#include "backend/cuda/kernels/moe/moe.h"

/* out[i] = src[rows[i], :], bf16 rows of width `width`. */
void gptoss_cuda_gather_rows(const bf16 *src, const int32_t *rows, int32_t n_rows, int32_t width,
                             bf16 *out, cudaStream_t stream);

/* Per row of logits [n_rows, vocab] f32: the n_top (<= 64, <= vocab) largest, larger first,
 * NaN as -inf, ties by lower index, into top_ids / top_vals [n_rows, n_top], and the row's
 * log-sum-exp (NaN skipped) into lse [n_rows] (logits_summary.cu). scratch: 16-byte aligned
 * device memory of gptoss_cuda_logits_summary_scratch bytes (no initial contents needed).
 * Returns nonzero (enqueuing nothing) for n_top or vocab out of range (vocab up to
 * 1,048,576) or a misaligned scratch. */
size_t gptoss_cuda_logits_summary_scratch(int32_t n_rows, int32_t vocab);
int gptoss_cuda_logits_summary(const float *logits, int32_t n_rows, int32_t vocab, int32_t n_top,
                               void *scratch, int32_t *top_ids, float *top_vals, float *lse,
                               cudaStream_t stream);

/* out[i] = float(in[i]) (exact). */
void gptoss_cuda_bf16_to_f32(const bf16 *in, size_t n, float *out, cudaStream_t stream);

/* Fills with deterministic hash-based pseudo-random values (bench --random-weights). */
void gptoss_cuda_fill_normal_bf16(bf16 *out, size_t n, uint64_t seed, float mean, float stddev,
                                  cudaStream_t stream);
/* The same fill for elements [first, first + n) of a longer array (written to out[0, n)), so a
 * matrix can be generated in pieces with the values it gets in one piece. */
void gptoss_cuda_fill_normal_bf16_at(bf16 *out, size_t n, size_t first, uint64_t seed, float mean,
                                     float stddev, cudaStream_t stream);
void gptoss_cuda_fill_normal_f32(float *out, size_t n, uint64_t seed, float mean, float stddev,
                                 cudaStream_t stream);
void gptoss_cuda_fill_uniform_u8(uint8_t *out, size_t n, uint64_t seed, int lo, int hi,
                                 cudaStream_t stream);
/* Pieces of the fills above (tensor parallelism: a rank's slice of a whole model's random
 * weights): f32 and u8 elements [first, first + n); bf16 rows x cols elements at first +
 * r * stride + j, i.e. a block of columns of a longer row-major matrix. */
void gptoss_cuda_fill_normal_f32_at(float *out, size_t n, size_t first, uint64_t seed, float mean,
                                    float stddev, cudaStream_t stream);
void gptoss_cuda_fill_uniform_u8_at(uint8_t *out, size_t n, size_t first, uint64_t seed, int lo,
                                    int hi, cudaStream_t stream);
void gptoss_cuda_fill_normal_bf16_rows(bf16 *out, size_t rows, size_t cols, size_t first,
                                       size_t stride, uint64_t seed, float mean, float stddev,
                                       cudaStream_t stream);
/* The same block-of-columns pieces of the f32 and u8 fills. */
void gptoss_cuda_fill_normal_f32_rows(float *out, size_t rows, size_t cols, size_t first,
                                      size_t stride, uint64_t seed, float mean, float stddev,
                                      cudaStream_t stream);
void gptoss_cuda_fill_uniform_u8_rows(uint8_t *out, size_t rows, size_t cols, size_t first,
                                      size_t stride, uint64_t seed, int lo, int hi,
                                      cudaStream_t stream);

/* MXFP4 expert rows [row0, row0 + n_rows) of a ggml tensor [E, R, G blocks] (src: those rows,
 * 17 bytes a block: the E8M0 scale, then qs[j] = lane j | lane j + 16 << 4) into the Hugging
 * Face blocks [.., G, 16] (byte b = lane 2b | lane 2b + 1 << 4) and scales [.., G]: row r of
 * expert e goes to row e * R * row_step + r * row_step + row_offset (row_step 2 interleaves
 * gate and up). blocks must be 16-byte aligned; returns nonzero (nothing launched) otherwise
 * or for a bad row_step / row_offset. */
int gptoss_cuda_mxfp4_from_ggml(const uint8_t *src, int64_t row0, int64_t n_rows, int64_t R,
                                int64_t G, int64_t row_step, int64_t row_offset, uint8_t *blocks,
                                uint8_t *scales, cudaStream_t stream);

#endif
