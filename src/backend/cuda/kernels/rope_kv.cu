/*
 * rope_kv.cu - QKV bias + YaRN RoPE + paged KV write, for bf16 and FP8 (e4m3 + scale) pages.
 */
#include "backend/cuda/kernels/rope_kv.cuh"
#include "backend/cuda/kernels/traits.h"

template <typename KV>
static __global__ void
rope_kv_kernel(const float *qkv, const float *qkv_bias, const int32_t *positions,
               const int32_t *token_seq, const float *inv_freq, float concentration,
               int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, const int32_t *block_tables,
               int32_t max_blocks, int32_t block_size, float *q_out, KV *k_cache, KV *v_cache,
               float *k_scale, float *v_scale, int32_t q_blocks) {
    __shared__ float cos_s[64], sin_s[64]; /* head_dim <= 128 */
    const int t = blockIdx.x, j = threadIdx.x, y = threadIdx.y;
    const int half = head_dim / 2;
    const bool kv_block = (int)blockIdx.y >= q_blocks;
    const int head = kv_block ? n_heads + ((int)blockIdx.y - q_blocks) * ROPE_KV_HEADS_PER_BLOCK + y
                              : (int)blockIdx.y * ROPE_KV_HEADS_PER_BLOCK + y;
    const bool valid = head < (kv_block ? n_heads + n_kv_heads : n_heads);
    const int width = (n_heads + 2 * n_kv_heads) * head_dim;
    const float *row = qkv + (size_t)t * width;
    /* Before the wait: the position, the angles, the page slot and the biases (the plan is
     * copied before the step's first kernel, and this grid launches only once its predecessor
     * has passed its own wait), so only the projection's loads follow it. */
    const int p = positions[t];
    if (y == 0) rope_cos_sin(p, inv_freq[j], concentration, &cos_s[j], &sin_s[j]);
    const int base = head * head_dim,
              vbase = (n_kv_heads + head) * head_dim; /* v: KV blocks only */
    float bias_a = 0.0f, bias_b = 0.0f, bias_va = 0.0f, bias_vb = 0.0f;
    size_t slot = 0;
    if (valid) {
        bias_a = qkv_bias[base + j], bias_b = qkv_bias[base + j + half];
        if (kv_block) {
            bias_va = qkv_bias[vbase + j], bias_vb = qkv_bias[vbase + j + half];
            slot = kv_page_slot(block_tables, token_seq[t], max_blocks, block_size, p, n_kv_heads,
                                head - n_heads);
        }
    }
    pdl_wait(); /* qkv comes from the QKV projection */
    __syncthreads();
    const float c = cos_s[j], s = sin_s[j];
    float ra = 0.0f, rb = 0.0f;
    if (valid) {
        const float a = row[base + j] + bias_a;
        const float b = row[base + j + half] + bias_b;
        rope_rotate(a, b, c, s, &ra, &rb);
    }
    if (!kv_block) {
        if (!valid) return;
        const float scale = rsqrtf((float)head_dim);
        float *qo = q_out + ((size_t)t * n_heads + head) * head_dim;
        qo[j] = ra * scale;
        qo[j + half] = rb * scale;
        return;
    }
    float va = 0.0f, vb = 0.0f;
    if (valid) {
        va = row[vbase + j] + bias_va;
        vb = row[vbase + j + half] + bias_vb;
    }
    KV *kd = k_cache + slot * head_dim;
    KV *vd = v_cache + slot * head_dim;
    if constexpr (kv_page_traits<KV>::e4m3) {
        __shared__ float scratch[ROPE_KV_HEADS_PER_BLOCK * 64];
        const float ks = gptoss_kv_fp8_scale(head_max(fmaxf(fabsf(ra), fabsf(rb)), scratch));
        const float vs = gptoss_kv_fp8_scale(head_max(fmaxf(fabsf(va), fabsf(vb)), scratch));
        if (!valid) return;
        kd[j] = gptoss_kv_fp8_quantize(ra, ks);
        kd[j + half] = gptoss_kv_fp8_quantize(rb, ks);
        vd[j] = gptoss_kv_fp8_quantize(va, vs);
        vd[j + half] = gptoss_kv_fp8_quantize(vb, vs);
        if (j == 0) {
            k_scale[slot] = ks;
            v_scale[slot] = vs;
        }
    } else {
        if (!valid) return;
        kd[j] = __float2bfloat16(ra);
        kd[j + half] = __float2bfloat16(rb);
        vd[j] = __float2bfloat16(va);
        vd[j + half] = __float2bfloat16(vb);
    }
}

/* Launches rope_kv_kernel for either page type (scales NULL for bf16 pages). */
template <typename KV>
static void rope_kv_launch(const float *qkv, const float *qkv_bias, const int32_t *positions,
                           const int32_t *token_seq, const float *inv_freq, float concentration,
                           int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                           const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                           float *q_out, KV *k_cache, KV *v_cache, float *k_scale, float *v_scale,
                           cudaStream_t stream) {
    if (n_tokens <= 0) return;
    const int32_t q_blocks = (n_heads + ROPE_KV_HEADS_PER_BLOCK - 1) / ROPE_KV_HEADS_PER_BLOCK;
    dim3 grid(n_tokens,
              q_blocks + (n_kv_heads + ROPE_KV_HEADS_PER_BLOCK - 1) / ROPE_KV_HEADS_PER_BLOCK);
    launch_pdl(rope_kv_kernel<KV>, grid, dim3(head_dim / 2, ROPE_KV_HEADS_PER_BLOCK), 0, stream,
               qkv, qkv_bias, positions, token_seq, inv_freq, concentration, n_heads, n_kv_heads,
               head_dim, block_tables, max_blocks, block_size, q_out, k_cache, v_cache, k_scale,
               v_scale, q_blocks);
}

void gptoss_cuda_rope_kv_write(const float *qkv, const float *qkv_bias, const int32_t *positions,
                               const int32_t *token_seq, const float *inv_freq, float concentration,
                               int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                               int32_t head_dim, const int32_t *block_tables, int32_t max_blocks,
                               int32_t block_size, float *q_out, bf16 *k_cache, bf16 *v_cache,
                               cudaStream_t stream) {
    rope_kv_launch<bf16>(qkv, qkv_bias, positions, token_seq, inv_freq, concentration, n_tokens,
                         n_heads, n_kv_heads, head_dim, block_tables, max_blocks, block_size, q_out,
                         k_cache, v_cache, nullptr, nullptr, stream);
}

void gptoss_cuda_rope_kv_write_fp8(const float *qkv, const float *qkv_bias,
                                   const int32_t *positions, const int32_t *token_seq,
                                   const float *inv_freq, float concentration, int32_t n_tokens,
                                   int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   const int32_t *block_tables, int32_t max_blocks,
                                   int32_t block_size, float *q_out, uint8_t *k_cache,
                                   uint8_t *v_cache, float *k_scale, float *v_scale,
                                   cudaStream_t stream) {
    rope_kv_launch<uint8_t>(qkv, qkv_bias, positions, token_seq, inv_freq, concentration, n_tokens,
                            n_heads, n_kv_heads, head_dim, block_tables, max_blocks, block_size,
                            q_out, k_cache, v_cache, k_scale, v_scale, stream);
}
