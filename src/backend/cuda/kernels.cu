/*
 * kernels.cu - the CUDA backend's dense-side kernels: embedding gather, residual + RMSNorm,
 * QKV bias + YaRN RoPE + paged KV write, paged sink attention (GQA, sliding window, split-K;
 * KV pages in bf16 or FP8, the kernels templated on the page type),
 * router top-k, row gather, and the hash RNG fills used by random-weight benchmarks.
 *
 * Every kernel accumulates in fp32. Nothing here allocates memory or synchronizes; launchers
 * only enqueue (see cuda_kernels.h). The MXFP4 expert kernels live in moe_mxfp4.cu.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/kv_fp8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool pdl_on = false; /* see cuda_kernels.h; one setting per process */
void gptoss_cuda_set_pdl(bool on) { pdl_on = on; }
bool gptoss_cuda_pdl_enabled(void) { return pdl_on; }


/* ---- embedding ------------------------------------------------------------------------ */

static __global__ void embed_kernel(const bf16 *embedding, const int32_t *token_ids, int32_t hidden,
                                    float *x) {
    int t = blockIdx.x;
    const bf16 *row = embedding + (size_t)token_ids[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) x[(size_t)t * hidden + i] = __bfloat162float(row[i]);
}

void gptoss_cuda_embed(const bf16 *embedding, const int32_t *token_ids, int32_t n_tokens,
                       int32_t hidden, float *x, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    embed_kernel<<<n_tokens, 256, 0, stream>>>(embedding, token_ids, hidden, x);
}

/* ---- residual + RMSNorm --------------------------------------------------------------- */

/* One block of 1024 threads per row (many loads in flight even for a single decode row). The
 * row is kept in registers between the residual update and the normalization
 * (hidden <= 1024 * 4). Every load of a thread is issued before its first store: with the
 * stores to x in between (which the compiler must assume may alias the other inputs), each
 * of a thread's elements cost its own round trips, 6.3 us per decode row on an H100. */
#define NORM_THREADS 1024
#define NORM_MAX_PER_THREAD 4

static __global__ void residual_rmsnorm_kernel(float *__restrict__ x, const float *__restrict__ add,
                                               const float *__restrict__ add_bias, const float *__restrict__ moe_y,
                                               const float *__restrict__ moe_weight, int32_t k_top,
                                               const float *__restrict__ gain, float eps,
                                               const int32_t *__restrict__ row_map, int32_t hidden,
                                               bf16 *__restrict__ out, float *__restrict__ out_f32) {
    __shared__ float partial[NORM_THREADS / 32];
    pdl_wait(); /* x, the projection or the experts' rows come from earlier kernels */
    int i = blockIdx.x;
    int r = row_map ? row_map[i] : i;
    float *xr = x + (size_t)r * hidden;
    float vals[NORM_MAX_PER_THREAD], g[NORM_MAX_PER_THREAD];
#pragma unroll
    for (int c = 0; c < NORM_MAX_PER_THREAD; c++) {
        int j = threadIdx.x + c * NORM_THREADS;
        vals[c] = g[c] = 0.0f;
        if (j < hidden) {
            vals[c] = xr[j];
            g[c] = gain[j];
            if (add) vals[c] += add[(size_t)r * hidden + j] + (add_bias ? add_bias[j] : 0.0f);
        }
    }
    if (moe_y) {
        const float *wr = moe_weight + (size_t)r * k_top, *yr = moe_y + (size_t)r * k_top * hidden;
        float sum[NORM_MAX_PER_THREAD] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int k = 0; k < k_top; k++) {
            const float wk = wr[k];
#pragma unroll
            for (int c = 0; c < NORM_MAX_PER_THREAD; c++) {
                int j = threadIdx.x + c * NORM_THREADS;
                if (j < hidden) sum[c] += wk * yr[(size_t)k * hidden + j];
            }
        }
#pragma unroll
        for (int c = 0; c < NORM_MAX_PER_THREAD; c++) vals[c] += sum[c];
    }
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NORM_MAX_PER_THREAD; c++) {
        int j = threadIdx.x + c * NORM_THREADS;
        if (j < hidden && (add || moe_y)) xr[j] = vals[c];
        ss += vals[c] * vals[c];
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < NORM_THREADS / 32; w++) total += partial[w];
    float inv = rsqrtf(total / (float)hidden + eps);
#pragma unroll
    for (int c = 0; c < NORM_MAX_PER_THREAD; c++) {
        int j = threadIdx.x + c * NORM_THREADS;
        if (j < hidden) {
            float y = g[c] * (vals[c] * inv);
            out[(size_t)i * hidden + j] = __float2bfloat16(y);
            if (out_f32) out_f32[(size_t)i * hidden + j] = y;
        }
    }
}

void gptoss_cuda_residual_rmsnorm(float *x, const float *add, const float *add_bias,
                                  const float *moe_y, const float *moe_weight, int32_t k_top,
                                  const float *gain, float eps, const int32_t *row_map,
                                  int32_t n_rows, int32_t hidden, bf16 *out, float *out_f32,
                                  cudaStream_t stream) {
    if (n_rows <= 0) return;
    launch_pdl(residual_rmsnorm_kernel, dim3(n_rows), dim3(NORM_THREADS), 0, stream, x, add, add_bias, moe_y,
               moe_weight, k_top, gain, eps, row_map, hidden, out, out_f32);
}

/* ---- KV pages ---------------------------------------------------------------------------- */

/* The page types the KV kernels are templated on: bf16 values, or e4m3 codes (uint8) with an
 * fp32 scale per (token, KV head) beside them (kv_fp8.h). */
template <typename KV> struct kv_page_traits;
template <> struct kv_page_traits<bf16> {
    static constexpr bool e4m3 = false;
};
template <> struct kv_page_traits<uint8_t> {
    static constexpr bool e4m3 = true;
};

/* Two e4m3 codes (the first in the low byte) as a bf16 pair: exact, every e4m3 value is a
 * bf16 value (the scale is applied later, in fp32). */
static __device__ __forceinline__ __nv_bfloat162 e4m3x2_to_bf16x2(uint32_t codes) {
    float2 v = gptoss_e4m3x2_decode((uint16_t)codes);
    return __floats2bfloat162_rn(v.x, v.y);
}

/* ---- QKV bias + RoPE + KV write ------------------------------------------------------- */

/* The RoPE kernel and the fused QKV projection share these three, so both round alike and
 * write the same slots. */
/* The cos and sin of position p's angle for inverse frequency f, times the YaRN concentration. */
static __device__ __forceinline__ void rope_cos_sin(int p, float f, float concentration, float *c, float *s) {
    float sv, cv;
    sincosf((float)p * f, &sv, &cv);
    *c = cv * concentration;
    *s = sv * concentration;
}
/* One RoPE pair (a, b) rotated by the angle whose scaled cos and sin are c and s. */
static __device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float *ra, float *rb) {
    *ra = a * c - b * s;
    *rb = b * c + a * s;
}
/* The page slot (token and KV head; its values start at slot * head_dim) of position p of
 * sequence seq for KV head kvh. */
static __device__ __forceinline__ size_t kv_page_slot(const int32_t *block_tables, int seq, int32_t max_blocks,
                                                      int32_t block_size, int p, int32_t n_kv_heads, int kvh) {
    const int blk = block_tables[(size_t)seq * max_blocks + p / block_size];
    return ((size_t)blk * block_size + p % block_size) * n_kv_heads + kvh;
}

/* Heads per block of the RoPE + KV write kernel. One head per 32-thread block made a
 * 2048-token 20b step 147k tiny blocks: 92 us per layer where its 80 MB need about 27. */
#define ROPE_HEADS 8

/* The largest of one value per thread over the threads of this threadIdx.y (one head; every
 * thread of the block calls it; NaN is skipped as by fmaxf, like kv_fp8.h's host loop). */
static __device__ __forceinline__ float head_max(float v, float *scratch) {
    float *row = scratch + threadIdx.y * blockDim.x;
    row[threadIdx.x] = v;
    __syncthreads();
    float m = 0.0f;
    for (int i = 0; i < (int)blockDim.x; i++) m = fmaxf(m, row[i]);
    __syncthreads(); /* scratch may be reused */
    return m;
}

/* Grid (n_tokens, q_blocks + ceil(n_kv_heads / ROPE_HEADS)), (head_dim / 2, ROPE_HEADS)
 * threads: thread (j, y) takes the rotated pair (j, j + D/2) of one head of the token. Blocks
 * below q_blocks hold query heads; the others hold KV heads, whose threads also copy the
 * matching v head into the cache (with e4m3 pages after the head vector's absmax over its
 * threads, for k and for v, then codes and the two scales, kv_fp8.h), so every thread of a
 * block takes the same branch around the barriers. The token's cos and sin are computed once
 * per block. */
template <typename KV>
static __global__ void rope_kv_kernel(const float *qkv, const float *qkv_bias, const int32_t *positions,
                                      const int32_t *token_seq, const float *inv_freq,
                                      float concentration, int32_t n_heads, int32_t n_kv_heads,
                                      int32_t head_dim, const int32_t *block_tables,
                                      int32_t max_blocks, int32_t block_size, float *q_out,
                                      KV *k_cache, KV *v_cache, float *k_scale, float *v_scale,
                                      int32_t q_blocks) {
    __shared__ float cos_s[64], sin_s[64]; /* head_dim <= 128 */
    const int t = blockIdx.x, j = threadIdx.x, y = threadIdx.y;
    const int half = head_dim / 2;
    const bool kv_block = (int)blockIdx.y >= q_blocks;
    const int head = kv_block ? n_heads + ((int)blockIdx.y - q_blocks) * ROPE_HEADS + y : (int)blockIdx.y * ROPE_HEADS + y;
    const bool valid = head < (kv_block ? n_heads + n_kv_heads : n_heads);
    const int width = (n_heads + 2 * n_kv_heads) * head_dim;
    const float *row = qkv + (size_t)t * width;
    /* Before the wait: the position, the angles, the page slot and the biases (the plan is
     * copied before the step's first kernel, and this grid launches only once its predecessor
     * has passed its own wait), so only the projection's loads follow it. */
    const int p = positions[t];
    if (y == 0) rope_cos_sin(p, inv_freq[j], concentration, &cos_s[j], &sin_s[j]);
    const int base = head * head_dim, vbase = (n_kv_heads + head) * head_dim; /* v: KV blocks only */
    float bias_a = 0.0f, bias_b = 0.0f, bias_va = 0.0f, bias_vb = 0.0f;
    size_t slot = 0;
    if (valid) {
        bias_a = qkv_bias[base + j], bias_b = qkv_bias[base + j + half];
        if (kv_block) {
            bias_va = qkv_bias[vbase + j], bias_vb = qkv_bias[vbase + j + half];
            slot = kv_page_slot(block_tables, token_seq[t], max_blocks, block_size, p, n_kv_heads, head - n_heads);
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
        __shared__ float scratch[ROPE_HEADS * 64];
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
static void rope_kv_launch(const float *qkv, const float *qkv_bias, const int32_t *positions, const int32_t *token_seq,
                           const float *inv_freq, float concentration, int32_t n_tokens, int32_t n_heads,
                           int32_t n_kv_heads, int32_t head_dim, const int32_t *block_tables, int32_t max_blocks,
                           int32_t block_size, float *q_out, KV *k_cache, KV *v_cache, float *k_scale,
                           float *v_scale, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    const int32_t q_blocks = (n_heads + ROPE_HEADS - 1) / ROPE_HEADS;
    dim3 grid(n_tokens, q_blocks + (n_kv_heads + ROPE_HEADS - 1) / ROPE_HEADS);
    launch_pdl(rope_kv_kernel<KV>, grid, dim3(head_dim / 2, ROPE_HEADS), 0, stream, qkv, qkv_bias, positions,
               token_seq, inv_freq, concentration, n_heads, n_kv_heads, head_dim, block_tables, max_blocks,
               block_size, q_out, k_cache, v_cache, k_scale, v_scale, q_blocks);
}

void gptoss_cuda_rope_kv_write(const float *qkv, const float *qkv_bias, const int32_t *positions,
                               const int32_t *token_seq, const float *inv_freq,
                               float concentration, int32_t n_tokens, int32_t n_heads,
                               int32_t n_kv_heads, int32_t head_dim, const int32_t *block_tables,
                               int32_t max_blocks, int32_t block_size, float *q_out,
                               bf16 *k_cache, bf16 *v_cache, cudaStream_t stream) {
    rope_kv_launch<bf16>(qkv, qkv_bias, positions, token_seq, inv_freq, concentration, n_tokens, n_heads, n_kv_heads,
                         head_dim, block_tables, max_blocks, block_size, q_out, k_cache, v_cache, nullptr, nullptr,
                         stream);
}

void gptoss_cuda_rope_kv_write_fp8(const float *qkv, const float *qkv_bias, const int32_t *positions,
                                   const int32_t *token_seq, const float *inv_freq, float concentration,
                                   int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                   const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                                   float *q_out, uint8_t *k_cache, uint8_t *v_cache, float *k_scale,
                                   float *v_scale, cudaStream_t stream) {
    rope_kv_launch<uint8_t>(qkv, qkv_bias, positions, token_seq, inv_freq, concentration, n_tokens, n_heads,
                            n_kv_heads, head_dim, block_tables, max_blocks, block_size, q_out, k_cache, v_cache,
                            k_scale, v_scale, stream);
}

/* ---- attention -------------------------------------------------------------------------- */

/*
 * Grid (n_tokens, n_kv_heads, n_splits); one warp per query head of the KV head's group, so
 * the group's warps share each K/V tile in shared memory (GQA). Keys are walked in tiles of
 * 32: lane i scores key i of the tile against the whole query (K rows padded by one bf16 pair
 * so the 32 lanes hit 32 banks), then the warp does one online-softmax step and lane l
 * accumulates output dims l, l+32, ... from V. The sink is not part of the running max here:
 * it enters when the result is finalized (in-kernel when n_splits == 1, else in the merge).
 * With e4m3 pages the tiles hold the codes' values (exact in bf16) and the tile's scales sit
 * beside them: a score is scale_k * (q . codes), and lane l adds p * scale_v * codes of V.
 */
#define ATT_TILE 32

template <int D, typename KV>
static __global__ void attention_kernel(const float *q, const KV *k_cache, const KV *v_cache,
                                        const float *k_scale, const float *v_scale,
                                        const int32_t *positions, const int32_t *token_seq,
                                        const int32_t *block_tables, int32_t max_blocks,
                                        int32_t block_size, const float *sinks, int32_t n_heads,
                                        int32_t n_kv_heads, int32_t window, int32_t n_splits,
                                        float *partial, bf16 *out) {
    constexpr int DPAD = D + 2;
    constexpr int PER_LANE = (D + 31) / 32;
    extern __shared__ float smem[];
    int group = n_heads / n_kv_heads;
    float *qs = smem;                                      /* [group][D] */
    bf16 *ks = (bf16 *)(qs + group * D);                   /* [ATT_TILE][DPAD] */
    bf16 *vs = ks + ATT_TILE * DPAD;                       /* [ATT_TILE][D] */
    float *ks_scale = (float *)(vs + ATT_TILE * D);       /* e4m3: [ATT_TILE] scales of K */
    float *vs_scale = ks_scale + ATT_TILE;                 /* e4m3: [ATT_TILE] scales of V */
    constexpr bool e4m3 = kv_page_traits<KV>::e4m3;
    int t = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int head = g * group + warp;
    int p = positions[t];
    int seq = token_seq[t];
    int lo = window > 0 ? max(0, p - window + 1) : 0;
    int span = p - lo + 1;
    int chunk = ((span + n_splits - 1) / n_splits + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    int begin = lo + split * chunk;
    int end = min(p + 1, begin + chunk); /* exclusive */

    for (int i = threadIdx.x; i < group * D; i += blockDim.x)
        qs[i] = q[((size_t)t * n_heads + g * group) * D + i];
    const int32_t *table = block_tables + (size_t)seq * max_blocks;

    float m = -INFINITY, l = 0.0f;
    float acc[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) acc[i] = 0.0f;

    for (int k0 = begin; k0 < end; k0 += ATT_TILE) {
        __syncthreads();
        if constexpr (e4m3) {
            /* cooperative load of the codes of K and V rows [k0, k0 + 32), four per load,
             * decoded to bf16 pairs, and their scales */
            for (int e = threadIdx.x; e < ATT_TILE * (D / 4); e += blockDim.x) {
                int r = e / (D / 4), c = e % (D / 4);
                int j = k0 + r;
                uint32_t kq = 0, vq = 0; /* code 0 is +0 */
                if (j < end) {
                    int blk = table[j / block_size];
                    size_t off = (((size_t)blk * block_size + j % block_size) * n_kv_heads + g) * D;
                    kq = ((const uint32_t *)(k_cache + off))[c];
                    vq = ((const uint32_t *)(v_cache + off))[c];
                }
                __nv_bfloat162 *kd = (__nv_bfloat162 *)(ks + r * DPAD) + 2 * c;
                __nv_bfloat162 *vd = (__nv_bfloat162 *)(vs + r * D) + 2 * c;
                kd[0] = e4m3x2_to_bf16x2(kq);
                kd[1] = e4m3x2_to_bf16x2(kq >> 16);
                vd[0] = e4m3x2_to_bf16x2(vq);
                vd[1] = e4m3x2_to_bf16x2(vq >> 16);
            }
            for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x) {
                int j = k0 + r;
                float kscale = 0.0f, vscale = 0.0f;
                if (j < end) {
                    size_t slot = ((size_t)table[j / block_size] * block_size + j % block_size) * n_kv_heads + g;
                    kscale = k_scale[slot];
                    vscale = v_scale[slot];
                }
                ks_scale[r] = kscale;
                vs_scale[r] = vscale;
            }
        } else {
            /* cooperative load of K and V rows [k0, k0 + 32) as bf16 pairs */
            for (int e = threadIdx.x; e < ATT_TILE * (D / 2); e += blockDim.x) {
                int r = e / (D / 2), c = e % (D / 2);
                int j = k0 + r;
                __nv_bfloat162 kv = __float2bfloat162_rn(0.0f), vv = kv;
                if (j < end) {
                    int blk = table[j / block_size];
                    size_t off = (((size_t)blk * block_size + j % block_size) * n_kv_heads + g) * D;
                    kv = ((const __nv_bfloat162 *)(k_cache + off))[c];
                    vv = ((const __nv_bfloat162 *)(v_cache + off))[c];
                }
                ((__nv_bfloat162 *)(ks + r * DPAD))[c] = kv;
                ((__nv_bfloat162 *)(vs + r * D))[c] = vv;
            }
        }
        __syncthreads();
        if (warp >= group) continue;
        const float *qh = qs + warp * D;
        float score = -INFINITY;
        if (k0 + lane < end) {
            const __nv_bfloat162 *kr = (const __nv_bfloat162 *)(ks + lane * DPAD);
            float sdot = 0.0f;
#pragma unroll
            for (int c = 0; c < D / 2; c++) {
                float2 kf = __bfloat1622float2(kr[c]);
                sdot += qh[2 * c] * kf.x + qh[2 * c + 1] * kf.y;
            }
            score = e4m3 ? sdot * ks_scale[lane] : sdot;
        }
        float tile_max = warp_max(score);
        float m_new = fmaxf(m, tile_max);
        float pj = (k0 + lane < end) ? __expf(score - m_new) : 0.0f;
        float corr = (m == -INFINITY) ? 0.0f : __expf(m - m_new);
        l = l * corr + warp_sum(pj);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) acc[i] *= corr;
        int n_valid = min(ATT_TILE, end - k0);
        for (int jj = 0; jj < n_valid; jj++) {
            float pb = __shfl_sync(0xffffffffu, pj, jj);
            if constexpr (e4m3) pb *= vs_scale[jj];
#pragma unroll
            for (int i = 0; i < PER_LANE; i++) {
                int d = lane + 32 * i;
                if (d < D) acc[i] += pb * __bfloat162float(vs[jj * D + d]);
            }
        }
        m = m_new;
    }
    if (warp >= group) return;
    if (n_splits == 1) {
        float sink = sinks[head];
        float mm = fmaxf(m, sink);
        float scale_acc = (m == -INFINITY) ? 0.0f : __expf(m - mm);
        float denom = l * scale_acc + __expf(sink - mm);
        float f = scale_acc / denom;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < D) out[((size_t)t * n_heads + head) * D + d] = __float2bfloat16(acc[i] * f);
        }
    } else {
        float *pp = partial + (((size_t)t * n_heads + head) * n_splits + split) * (D + 2);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < D) pp[d] = acc[i];
        }
        if (lane == 0) {
            pp[D] = m;
            pp[D + 1] = l;
        }
    }
}

/* Merges split-K partials with the sink: grid (n_tokens, n_heads), max(D, 32) threads (up to
 * 128), n_splits <= ATT_MAX_SPLITS. Three short phases instead of every thread walking every
 * split twice (at 64 splits that serial walk was most of a one-token decode's attention):
 * the splits' maxima (one per thread) and the block max with the sink; each split's weight
 * exp(m_s - max) into shared memory with the denominator; then each thread sums its output
 * dimension over the splits with independent loads. */
#define ATT_MAX_SPLITS 256
static __device__ __forceinline__ float block_reduce(float v, bool is_max, float *scratch) {
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    const int warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    __syncthreads(); /* scratch may still be read from a previous reduction */
    if ((threadIdx.x & 31) == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < n_warps; w++) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

static __global__ void attention_merge_kernel(const float *partial, const float *sinks,
                                              int32_t n_heads, int32_t head_dim, int32_t n_splits,
                                              bf16 *out) {
    __shared__ float weight[ATT_MAX_SPLITS];
    __shared__ float scratch[4];
    const int t = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
    const int stride = head_dim + 2;
    pdl_wait(); /* the partials come from the attention kernel */
    const float *pp = partial + ((size_t)t * n_heads + head) * n_splits * stride;
    const float sink = sinks[head];
    float m = -INFINITY;
    for (int s = d; s < n_splits; s += blockDim.x) {
        weight[s] = pp[s * stride + head_dim];
        m = fmaxf(m, weight[s]);
    }
    const float mm = fmaxf(block_reduce(m, true, scratch), sink);
    float den = 0.0f;
    for (int s = d; s < n_splits; s += blockDim.x) { /* weight[s] was written by this thread */
        const float ms = weight[s];
        const float f = ms == -INFINITY ? 0.0f : __expf(ms - mm);
        den += pp[s * stride + head_dim + 1] * f;
        weight[s] = f;
    }
    den = block_reduce(den, false, scratch) + __expf(sink - mm); /* its barriers publish weight[] */
    if (d >= head_dim) return;
    float num = 0.0f;
#pragma unroll 8
    for (int s = 0; s < n_splits; s++) num += pp[s * stride + d] * weight[s];
    out[((size_t)t * n_heads + head) * head_dim + d] = __float2bfloat16(num / den);
}

int32_t gptoss_cuda_attention_splits(int32_t n_tokens, int32_t n_kv_heads, int32_t max_span,
                                     int32_t n_sms) {
    int32_t blocks = n_tokens * n_kv_heads;
    int32_t splits = 1;
    /* split while the grid is under one block per SM and each split keeps >= 128 keys: for one
     * token on the 20b shape the decode kernel took 22.0 us at depth 8192 with 32 splits (this
     * rule) against 28.6 us with 64 (the earlier two-wave rule; the merge grows with the
     * splits), and 17.1 us at depth 2048 with 16 splits under both rules (H100) */
    while (blocks * splits < n_sms && max_span / (splits * 2) >= 128 && splits < 64) splits *= 2;
    return splits;
}

/* Launches the attention kernel for either page type (scales NULL for bf16 pages). */
template <typename KV>
static int attention_launch(const float *q, const KV *k_cache, const KV *v_cache, const float *k_scale,
                            const float *v_scale, const int32_t *positions, const int32_t *token_seq,
                            const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                            const float *sinks, int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                            int32_t head_dim, int32_t window, int32_t n_splits, float *partial, bf16 *out,
                            cudaStream_t stream) {
    if (n_tokens <= 0) return 0;
    int group = n_heads / n_kv_heads;
    if (group < 1 || group > 32 || n_heads % n_kv_heads != 0) return -1;
    if (n_splits < 1) n_splits = 1;
    if (n_splits > ATT_MAX_SPLITS) return -1;
    dim3 grid(n_tokens, n_kv_heads, n_splits);
    int threads = 32 * group;
    if (threads < 64) threads = 64; /* enough threads for the tile loads */
    const size_t scale_bytes = kv_page_traits<KV>::e4m3 ? 2 * ATT_TILE * sizeof(float) : 0;
    size_t smem;
#define LAUNCH_ATT(DIM)                                                                                      \
    smem = (size_t)group * DIM * sizeof(float) + (size_t)ATT_TILE * (2 * DIM + 2) * sizeof(bf16) + scale_bytes; \
    attention_kernel<DIM, KV><<<grid, threads, smem, stream>>>(q, k_cache, v_cache, k_scale, v_scale, positions,   \
                                                               token_seq, block_tables, max_blocks, block_size,  \
                                                               sinks, n_heads, n_kv_heads, window, n_splits,    \
                                                               partial, out)
    switch (head_dim) {
    case 16: LAUNCH_ATT(16); break;
    case 32: LAUNCH_ATT(32); break;
    case 64: LAUNCH_ATT(64); break;
    case 128: LAUNCH_ATT(128); break;
    default: return -1;
    }
#undef LAUNCH_ATT
    if (n_splits > 1) gptoss_cuda_attention_merge(partial, sinks, n_tokens, n_heads, head_dim, n_splits, out, stream);
    return 0;
}

void gptoss_cuda_attention_merge(const float *partial, const float *sinks, int32_t n_tokens, int32_t n_heads,
                                 int32_t head_dim, int32_t n_splits, bf16 *out, cudaStream_t stream) {
    dim3 mgrid(n_tokens, n_heads);
    launch_pdl(attention_merge_kernel, mgrid, dim3(head_dim < 32 ? 32 : head_dim), 0, stream, partial, sinks, n_heads,
               head_dim, n_splits, out);
}

int gptoss_cuda_attention(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                          const int32_t *positions, const int32_t *token_seq,
                          const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                          const float *sinks, int32_t n_tokens, int32_t n_heads,
                          int32_t n_kv_heads, int32_t head_dim, int32_t window, int32_t n_splits,
                          float *partial, bf16 *out, cudaStream_t stream) {
    return attention_launch(q, k_cache, v_cache, (const float *)nullptr, (const float *)nullptr, positions, token_seq,
                            block_tables, max_blocks, block_size, sinks, n_tokens, n_heads, n_kv_heads, head_dim,
                            window, n_splits, partial, out, stream);
}

int gptoss_cuda_attention_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                              const float *k_scale, const float *v_scale, const int32_t *positions,
                              const int32_t *token_seq, const int32_t *block_tables, int32_t max_blocks,
                              int32_t block_size, const float *sinks, int32_t n_tokens, int32_t n_heads,
                              int32_t n_kv_heads, int32_t head_dim, int32_t window, int32_t n_splits,
                              float *partial, bf16 *out, cudaStream_t stream) {
    return attention_launch(q, k_cache, v_cache, k_scale, v_scale, positions, token_seq, block_tables, max_blocks,
                            block_size, sinks, n_tokens, n_heads, n_kv_heads, head_dim, window, n_splits, partial,
                            out, stream);
}

/* ---- bf16 GEMV for decode rows ---------------------------------------------------------- */

/*
 * y[i, r] = x[i, :] . w[r, :] for m <= 4 rows of x: the decode shapes of the QKV and O
 * projections, where a GEMM library at M = 1 reaches about half the bandwidth. The block
 * stages x (bf16, m * k * 2 <= 32 KB) in shared memory; each warp takes two weight rows at a
 * time (grid-stride) and keeps 2 x DG_UNROLL 16-byte loads per lane in flight; fp32
 * accumulation, one warp reduction per row. k % 8 == 0, rows 16-byte aligned.
 */
#define DG_WARPS 8
#define DG_UNROLL 4

/* acc + w . x over the 8 bf16 of a 16-byte chunk each, in element order, fp32 FMAs. */
static __device__ __forceinline__ float bf16x8_dot(uint4 w, uint4 x, float acc) {
    const uint32_t wa[4] = {w.x, w.y, w.z, w.w}, xw[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc = fmaf(__uint_as_float(wa[j] << 16), __uint_as_float(xw[j] << 16), acc);
        acc = fmaf(__uint_as_float(wa[j] & 0xffff0000u), __uint_as_float(xw[j] & 0xffff0000u), acc);
    }
    return acc;
}

/* One lane's share of two weight rows w0 and w1 (16-byte chunks) dotted with the m staged
 * rows of xs: lanes stride the chunks, DG_UNROLL loads of each row in flight, fp32 sums in
 * chunk order (not yet reduced over the warp). */
template <int M>
static __device__ __forceinline__ void dg_two_rows(const uint4 *w0, const uint4 *w1, const uint4 *xs, int chunks,
                                                   int m, int lane, float (&acc)[2][M]) {
#pragma unroll
    for (int i = 0; i < M; i++) acc[0][i] = acc[1][i] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * DG_UNROLL) {
        uint4 a[DG_UNROLL], b[DG_UNROLL];
#pragma unroll
        for (int u = 0; u < DG_UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c < chunks) {
                a[u] = __ldg(w0 + c);
                b[u] = __ldg(w1 + c);
            } else {
                a[u] = b[u] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < DG_UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks) break;
#pragma unroll
            for (int i = 0; i < M; i++) {
                if (i >= m) break;
                const uint4 xv = xs[i * chunks + c];
                acc[0][i] = bf16x8_dot(a[u], xv, acc[0][i]);
                acc[1][i] = bf16x8_dot(b[u], xv, acc[1][i]);
            }
        }
    }
}

/* Warm L2 with the bytes of rows r0 and r1 (each k bf16) while the previous kernel finishes:
 * each lane a 128-byte line in turn. */
static __device__ __forceinline__ void dg_prefetch_rows(const bf16 *w, int r0, int r1, int k, int lane) {
    const size_t bytes = (size_t)k * sizeof(bf16);
    const char *p0 = (const char *)(w + (size_t)r0 * k), *p1 = (const char *)(w + (size_t)r1 * k);
    for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p0 + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p1 + off));
    }
}

template <int M>
static __global__ void __launch_bounds__(DG_WARPS * 32)
dense_gemv_kernel(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k) {
    extern __shared__ __align__(16) unsigned char dg_smem[];
    uint4 *xs = (uint4 *)dg_smem; /* [m][k / 8] */
    const int chunks = k >> 3;
    {   /* warm L2 with this warp's first rows while the previous kernel finishes */
        int r = 2 * (blockIdx.x * DG_WARPS + (threadIdx.x >> 5));
        if (r < n) {
            const char *p0 = (const char *)(w + (size_t)r * k);
            size_t bytes = (size_t)(r + 1 < n ? 2 : 1) * k * sizeof(bf16);
            for (size_t off = (size_t)(threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(p0 + off));
        }
    }
    pdl_wait();
    for (int i = threadIdx.x; i < m * chunks; i += blockDim.x) xs[i] = ((const uint4 *)x)[i];
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int row0 = 2 * (blockIdx.x * DG_WARPS + warp); row0 < n; row0 += 2 * gridDim.x * DG_WARPS) {
        const bool two = row0 + 1 < n;
        const uint4 *w0 = (const uint4 *)(w + (size_t)row0 * k);
        const uint4 *w1 = two ? w0 + chunks : w0;
        float acc[2][M];
        dg_two_rows<M>(w0, w1, xs, chunks, m, lane, acc);
#pragma unroll
        for (int i = 0; i < M; i++) {
            if (i >= m) break;
            float v0 = warp_sum(acc[0][i]), v1 = warp_sum(acc[1][i]);
            if (lane == 0) {
                y[(size_t)i * n + row0] = v0;
                if (two) y[(size_t)i * n + row0 + 1] = v1;
            }
        }
    }
}

/*
 * The same product on sm_90 with the weights staged by the copy engine: block b takes rows
 * [DT_ROWS * b, DT_ROWS * b + DT_ROWS) (contiguous), and its thread 0 copies them into shared
 * memory with one bulk copy before the PDL wait, since weights depend on no earlier kernel.
 * The copies of every resident block so stream in while the previous kernels run (the
 * attention before O, the norm before QKV), with no registers held, where the kernel above
 * has only its first rows prefetched to L2 and 4 KB in flight per warp. After the wait the
 * block stages x and each warp reduces one row from shared memory, in the order the kernel
 * above uses (so the two give identical results). One wave holds 3-4 blocks per SM:
 * the 20b/120b O projection (2880 rows) fits in one, QKV (5120) needs 1.2 (see
 * gptoss_cuda_gemv_kernel for which runs where).
 */
#define DT_ROWS 8 /* rows per block, one warp each */

static size_t gemv_tma_smem(int32_t m, int32_t k) { return (size_t)(DT_ROWS + m) * k * sizeof(bf16); }

template <int M>
static __global__ void __launch_bounds__(DT_ROWS * 32)
dense_gemv_tma_kernel(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char dt_smem[];
    __shared__ __align__(8) uint64_t bar;
    const int chunks = k >> 3, row0 = blockIdx.x * DT_ROWS, rows = min(DT_ROWS, n - row0);
    uint4 *ws = (uint4 *)dt_smem, *xs = ws + (size_t)DT_ROWS * chunks;
    const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        mbar_init(bar_s);
        const uint32_t bytes = (uint32_t)rows * (uint32_t)k * (uint32_t)sizeof(bf16);
        mbar_expect_tx(bar_s, bytes);
        bulk_copy(ws, w + (size_t)row0 * k, bytes, bar_s);
    }
    pdl_wait();
    for (int i = threadIdx.x; i < m * chunks; i += blockDim.x) xs[i] = ((const uint4 *)x)[i];
    __syncthreads(); /* x is staged, and every thread sees the initialized barrier */
    mbar_wait(bar_s, 0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= rows) return;
    const uint4 *wr = ws + (size_t)warp * chunks;
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; i++) acc[i] = 0.0f;
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
        const uint4 a = wr[c];
#pragma unroll
        for (int i = 0; i < M; i++) {
            if (i >= m) break;
            acc[i] = bf16x8_dot(a, xs[i * chunks + c], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < M; i++) {
        if (i >= m) break;
        float v = warp_sum(acc[i]);
        if (lane == 0) y[(size_t)i * n + row0 + warp] = v;
    }
#else
    __trap(); /* never launched: the host picks this kernel only where it was built for sm_90 or later */
#endif
}

static bool gemv_tma_supported = false; /* set by gptoss_cuda_gemv_prepare */
static int gemv_sms = 0, gemv_sm_smem = 0;  /* multiprocessors, shared memory per multiprocessor */
static int gemv_kernel_choice = -1;     /* gptoss_cuda_gemv_set_kernel; -1: not set */

void gptoss_cuda_gemv_set_kernel(int kernel) { gemv_kernel_choice = kernel; }

/* The bulk-copy kernel by default only where its blocks fit in one wave: its copies start
 * before the wait only in resident blocks, and a second wave's start after the first wave's
 * end. Measured (H100, tg128, every projection on it): O (2880 rows, one wave) 11.6 -> 9.5 us
 * per layer, QKV (5120 rows, 1.2 waves) 12.2 -> 13.5 us. */
int gptoss_cuda_gemv_kernel(int32_t m, int32_t n, int32_t k) {
    if (gemv_kernel_choice < 0) {
        const char *v = getenv("GPTOSS_CUDA_GEMV_KERNEL");
        gemv_kernel_choice = v && strcmp(v, "ld") == 0 ? 1 : v && strcmp(v, "tma") == 0 ? 2 : 0;
    }
    if (gemv_kernel_choice == 1 || !gemv_tma_supported) return 1;
    if (gemv_kernel_choice == 2) return 2;
    const int64_t per_sm = gemv_sm_smem / ((int64_t)gemv_tma_smem(m, k) + 1024); /* 1 KB reserved per block */
    return (int64_t)(n + DT_ROWS - 1) / DT_ROWS <= per_sm * gemv_sms ? 2 : 1;
}

cudaError_t gptoss_cuda_gemv_prepare(void) {
    const int bytes = (int)gemv_tma_smem(GPTOSS_GEMV_MAX_ROWS, 4096);
    int dev = 0;
    bool ok = cudaGetDevice(&dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&gemv_sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&gemv_sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess;
#define PREP(M)                                                                                            \
    ok = ok && gptoss_cuda_runs_sm90_code((const void *)dense_gemv_tma_kernel<M>) &&                         \
         cudaFuncSetAttribute(dense_gemv_tma_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == \
             cudaSuccess;
    PREP(1) PREP(2) PREP(4)
#undef PREP
    gemv_tma_supported = ok;
    (void)cudaGetLastError(); /* a kernel that does not run here is not an error: the other one runs */
    return cudaSuccess;
}

int gptoss_cuda_gemv_bf16(const bf16 *w, const bf16 *x, float *y, int32_t m, int32_t n, int32_t k,
                          int32_t n_sms, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return 0;
    if (m > GPTOSS_GEMV_MAX_ROWS || k % 8 != 0 || k > 4096 ||
        ((uintptr_t)w | (uintptr_t)x) % 16 != 0)
        return 1;
    if (gptoss_cuda_gemv_kernel(m, n, k) == 2) {
        const dim3 grid((n + DT_ROWS - 1) / DT_ROWS), block(DT_ROWS * 32);
        const size_t smem = gemv_tma_smem(m, k);
        if (m == 1) launch_pdl(dense_gemv_tma_kernel<1>, grid, block, smem, stream, w, x, y, m, n, k);
        else if (m == 2) launch_pdl(dense_gemv_tma_kernel<2>, grid, block, smem, stream, w, x, y, m, n, k);
        else launch_pdl(dense_gemv_tma_kernel<4>, grid, block, smem, stream, w, x, y, m, n, k);
        return 0;
    }
    size_t smem = (size_t)m * k * sizeof(bf16);
    int want = (n + 2 * DG_WARPS - 1) / (2 * DG_WARPS);
    int grid = want < 4 * n_sms ? want : 4 * n_sms;
    if (m == 1) launch_pdl(dense_gemv_kernel<1>, dim3(grid), dim3(DG_WARPS * 32), smem, stream, w, x, y, m, n, k);
    else if (m == 2) launch_pdl(dense_gemv_kernel<2>, dim3(grid), dim3(DG_WARPS * 32), smem, stream, w, x, y, m, n, k);
    else launch_pdl(dense_gemv_kernel<4>, dim3(grid), dim3(DG_WARPS * 32), smem, stream, w, x, y, m, n, k);
    return 0;
}

/*
 * One decode token: the QKV projection with the bias, RoPE and the bf16 KV write in its
 * epilogue, so the attention kernel waits on the projection itself, not on a RoPE kernel
 * behind it (one grid dependency and one L2 round trip less per layer). Warp w of the grid
 * takes the RoPE pair (j, j + D/2) of head w / (D/2): rows head * D + j and head * D + j +
 * D/2 of the projection (q heads, then k, then v, whose pair is not rotated). The sums are
 * dense_gemv_kernel's (dg_two_rows) and the rotation the RoPE kernel's (rope_rotate), so the
 * q, K and V it writes are bit for bit those of the two kernels. Before the PDL wait, from
 * the plan and the weights only: the L2 prefetch of the warp's rows, the angle, the biases
 * and the page slot.
 */
static __global__ void __launch_bounds__(DG_WARPS * 32)
qkv_rope_one_kernel(const bf16 *w, const bf16 *x, const float *qkv_bias, const int32_t *positions,
                    const int32_t *token_seq, const float *inv_freq, float concentration, int32_t n_heads,
                    int32_t n_kv_heads, int32_t head_dim, int32_t k, const int32_t *block_tables, int32_t max_blocks,
                    int32_t block_size, float *q_out, bf16 *k_cache, bf16 *v_cache) {
    extern __shared__ __align__(16) unsigned char qr_smem[];
    uint4 *xs = (uint4 *)qr_smem; /* [k / 8] */
    const int chunks = k >> 3, half = head_dim >> 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pr = blockIdx.x * DG_WARPS + warp;
    const bool active = pr < (n_heads + 2 * n_kv_heads) * half;
    const int head = active ? pr / half : 0, j = pr % half;
    const int r0 = head * head_dim + j, r1 = r0 + half;
    const bool is_q = head < n_heads, is_k = !is_q && head < n_heads + n_kv_heads;
    float c = 0.0f, sn = 0.0f, b0 = 0.0f, b1 = 0.0f;
    size_t slot = 0;
    if (active) {
        dg_prefetch_rows(w, r0, r1, k, lane);
        if (lane == 0) {
            const int p = positions[0];
            b0 = qkv_bias[r0];
            b1 = qkv_bias[r1];
            if (is_q || is_k) rope_cos_sin(p, inv_freq[j], concentration, &c, &sn);
            if (!is_q)
                slot = kv_page_slot(block_tables, token_seq[0], max_blocks, block_size, p, n_kv_heads,
                                    (head - n_heads) % n_kv_heads);
        }
    }
    pdl_wait(); /* x comes from the residual norm */
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) xs[i] = ((const uint4 *)x)[i];
    __syncthreads();
    if (!active) return;
    float acc[2][1];
    dg_two_rows<1>((const uint4 *)(w + (size_t)r0 * k), (const uint4 *)(w + (size_t)r1 * k), xs, chunks, 1, lane, acc);
    const float v0 = warp_sum(acc[0][0]), v1 = warp_sum(acc[1][0]);
    if (lane != 0) return;
    const float a = v0 + b0, b = v1 + b1;
    if (is_q) {
        float ra, rb;
        rope_rotate(a, b, c, sn, &ra, &rb);
        const float scale = rsqrtf((float)head_dim);
        q_out[head * head_dim + j] = ra * scale;
        q_out[head * head_dim + j + half] = rb * scale;
    } else if (is_k) {
        float ra, rb;
        rope_rotate(a, b, c, sn, &ra, &rb);
        k_cache[slot * head_dim + j] = __float2bfloat16(ra);
        k_cache[slot * head_dim + j + half] = __float2bfloat16(rb);
    } else {
        v_cache[slot * head_dim + j] = __float2bfloat16(a);
        v_cache[slot * head_dim + j + half] = __float2bfloat16(b);
    }
}

int gptoss_cuda_qkv_rope_one(const bf16 *w, const bf16 *x, const float *qkv_bias, const int32_t *positions,
                             const int32_t *token_seq, const float *inv_freq, float concentration, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, int32_t hidden, const int32_t *block_tables,
                             int32_t max_blocks, int32_t block_size, float *q_out, bf16 *k_cache, bf16 *v_cache,
                             cudaStream_t stream) {
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim > 128 || hidden <= 0 ||
        hidden % 8 != 0 || hidden > 4096 || block_size <= 0 || ((uintptr_t)w | (uintptr_t)x) % 16 != 0)
        return 1;
    const int32_t pairs = (n_heads + 2 * n_kv_heads) * (head_dim / 2);
    launch_pdl(qkv_rope_one_kernel, dim3((pairs + DG_WARPS - 1) / DG_WARPS), dim3(DG_WARPS * 32),
               (size_t)hidden * sizeof(bf16), stream, w, x, qkv_bias, positions, token_seq, inv_freq, concentration,
               n_heads, n_kv_heads, head_dim, hidden, block_tables, max_blocks, block_size, q_out, k_cache, v_cache);
    return 0;
}

/* ---- router logits (fp32 activations) ---------------------------------------------------- */

/* Routing is a discrete choice, so its logits are computed from the fp32 normalized input
 * (not its bf16 copy): grid (ceil(T / 8), ceil(E / 8)), 8 warps; a block stages 8 token rows
 * in shared memory and each warp produces one expert's logits for them (lanes stride the
 * row in bf16 pairs). */
#define ROUTER_TOKENS 8

static __device__ void topk_warp(const volatile float *row, const float *bias, int32_t n_experts, int32_t k_top,
                                 int32_t *topk_idx, float *topk_weight);

/* Whether this block is the last of the grid to get here (atomic ticket on counter, which the
 * last block re-arms); every block's earlier writes are then visible to it. Every thread of
 * the block must call it. The block barrier orders its threads' writes before thread 0's
 * ticket, an acquire-release atomic at GPU scope (release: those writes reach the blocks that
 * take later tickets; acquire: the earlier blocks' writes reach this one), and the second
 * barrier orders the ticket before the block's reads. One atomic in place of a fence in every
 * thread, the atomic, and another fence in every thread of the last block. */
static __device__ __forceinline__ bool last_block(unsigned *counter, unsigned n_blocks) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(counter) : "memory");
        last = prev == n_blocks - 1;
    }
    __syncthreads();
    return last;
}

static __global__ void router_logits_kernel(const float *t, const bf16 *weight, const float *bias, int32_t n_tokens,
                                            int32_t n_experts, int32_t hidden, float *logits,
                                            unsigned *done_counter, int32_t k_top, int32_t *topk_idx,
                                            float *topk_weight) {
    extern __shared__ float rows[]; /* [ROUTER_TOKENS][hidden] */
    pdl_wait();
    int t0 = blockIdx.x * ROUTER_TOKENS;
    int nt = min(ROUTER_TOKENS, n_tokens - t0);
    for (int i = threadIdx.x; i < nt * hidden; i += blockDim.x) rows[i] = t[(size_t)t0 * hidden + i];
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    for (int e = blockIdx.y * n_warps + warp; e < n_experts; e += gridDim.y * n_warps) {
        const uint4 *w = (const uint4 *)(weight + (size_t)e * hidden);
        float acc[ROUTER_TOKENS] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int j = lane; j < hidden / 8; j += 32) { /* 8 weights per 16-byte load */
            uint4 wq = __ldg(w + j);
            const uint32_t ww[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
            for (int k = 0; k < ROUTER_TOKENS; k++) {
                if (k >= nt) break;
                const float *xr = rows + k * hidden + 8 * j;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[k] += __uint_as_float(ww[i] << 16) * xr[2 * i] + __uint_as_float(ww[i] & 0xffff0000u) * xr[2 * i + 1];
            }
        }
#pragma unroll
        for (int k = 0; k < ROUTER_TOKENS; k++) {
            float v = warp_sum(acc[k]);
            if (lane == 0 && k < nt) logits[(size_t)(t0 + k) * n_experts + e] = v + bias[e];
        }
    }
    if (!done_counter) return;
    /* Fused top-k: the last block to finish (every logit is then written and, after the
     * fences, visible) runs it for all tokens and re-arms the counter for the next launch. */
    if (!last_block(done_counter, gridDim.x * gridDim.y)) return;
    for (int tok = warp; tok < n_tokens; tok += n_warps)
        topk_warp(logits + (size_t)tok * n_experts, nullptr, n_experts, k_top,
                  topk_idx + (size_t)tok * k_top, topk_weight + (size_t)tok * k_top);
    if (threadIdx.x == 0) *done_counter = 0u;
}

void gptoss_cuda_router_logits(const float *t, const bf16 *weight, const float *bias, int32_t n_tokens,
                               int32_t n_experts, int32_t hidden, float *logits, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    size_t smem = (size_t)ROUTER_TOKENS * hidden * sizeof(float);
    dim3 grid((n_tokens + ROUTER_TOKENS - 1) / ROUTER_TOKENS, (n_experts + 7) / 8);
    router_logits_kernel<<<grid, 256, smem, stream>>>(
        t, weight, bias, n_tokens, n_experts, hidden, logits, nullptr, 0, nullptr, nullptr);
}

/*
 * One decode token: one warp per expert, 4 per block. The router matrix does not depend on
 * earlier kernels, so each lane loads its 16-byte chunks of the row before pdl_wait (their
 * latency overlaps the norm kernel's tail), then reads the token straight from global memory
 * (just written, in L2) instead of staging it in shared memory. The last block to finish
 * runs the top-k as the general kernel does. Measured on an H100 (20b, ncu, caches flushed):
 * the general kernel took 18.9 us here with 4 blocks of 8 warps.
 */
#define ROUTER1_WARPS 4
#define ROUTER1_MAX_CHUNKS 16 /* hidden <= 32 * 16 * 8 = 4096 */

/* One warp's router row (expert e, clamped to the last) into registers, 16 bytes per chunk. */
static __device__ __forceinline__ void router_row_load(const bf16 *weight, int e, int32_t n_experts, int n_chunks,
                                                       int lane, uint4 (&wq)[ROUTER1_MAX_CHUNKS]) {
    const uint4 *w = (const uint4 *)(weight + (size_t)min(e, n_experts - 1) * n_chunks * 8);
#pragma unroll
    for (int i = 0; i < ROUTER1_MAX_CHUNKS; i++)
        if (lane + 32 * i < n_chunks) wq[i] = __ldg(w + lane + 32 * i);
}

/* The warp's row . the fp32 token t4 (every lane gets the sum). */
static __device__ __forceinline__ float router_row_dot(const uint4 (&wq)[ROUTER1_MAX_CHUNKS], const float4 *t4,
                                                       int n_chunks, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTER1_MAX_CHUNKS; i++) {
        int j = lane + 32 * i;
        if (j < n_chunks) {
            float4 a = t4[2 * j], b = t4[2 * j + 1];
            const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            const uint32_t ww[4] = {wq[i].x, wq[i].y, wq[i].z, wq[i].w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc += __uint_as_float(ww[k] << 16) * x[2 * k] + __uint_as_float(ww[k] & 0xffff0000u) * x[2 * k + 1];
        }
    }
    return warp_sum(acc);
}

static __global__ void __launch_bounds__(ROUTER1_WARPS * 32)
router_one_kernel(const float *t, const bf16 *weight, const float *bias, int32_t n_experts, int32_t hidden,
                  float *logits, unsigned *done_counter, int32_t k_top, int32_t *topk_idx, float *topk_weight) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * ROUTER1_WARPS + warp, n_chunks = hidden >> 3;
    uint4 wq[ROUTER1_MAX_CHUNKS];
    router_row_load(weight, e, n_experts, n_chunks, lane, wq);
    pdl_wait();
    const float acc = router_row_dot(wq, (const float4 *)t, n_chunks, lane);
    if (lane == 0 && e < n_experts) logits[e] = acc + bias[e];
    if (!last_block(done_counter, gridDim.x)) return;
    if (warp == 0) topk_warp(logits, nullptr, n_experts, k_top, topk_idx, topk_weight);
    if (threadIdx.x == 0) *done_counter = 0u;
}

void gptoss_cuda_router(const float *t, const bf16 *weight, const float *bias, int32_t n_tokens,
                        int32_t n_experts, int32_t hidden, int32_t k_top, float *logits, unsigned *done_counter,
                        int32_t *topk_idx, float *topk_weight, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    if (n_tokens == 1 && hidden % 8 == 0 && hidden <= 32 * 8 * ROUTER1_MAX_CHUNKS) {
        launch_pdl(router_one_kernel, dim3((n_experts + ROUTER1_WARPS - 1) / ROUTER1_WARPS), dim3(ROUTER1_WARPS * 32),
                   0, stream, t, weight, bias, n_experts, hidden, logits, done_counter, k_top, topk_idx, topk_weight);
        return;
    }
    size_t smem = (size_t)ROUTER_TOKENS * hidden * sizeof(float);
    dim3 grid((n_tokens + ROUTER_TOKENS - 1) / ROUTER_TOKENS, (n_experts + 7) / 8);
    launch_pdl(router_logits_kernel, grid, dim3(256), smem, stream, t, weight, bias, n_tokens, n_experts, hidden,
               logits, done_counter, k_top, topk_idx, topk_weight);
}

/*
 * One decode token: the residual update + RMSNorm after the attention block fused with the
 * router (they were two kernels of 6.3 and 9.2 us on an H100, each mostly one latency chain).
 * Each block of NR_WARPS warps loads its experts' router rows into registers before the PDL
 * wait, then recomputes the whole residual row and its norm (hidden floats from L2, cheap
 * next to a launch), keeps the normalized row in shared memory in fp32 and scores one expert
 * per warp. The last block to finish (atomic ticket) writes the new residual row and the bf16
 * normalized row, which no block may write earlier (the others could still be reading x),
 * and runs the top-k. The norm's sum runs in another order than residual_rmsnorm_kernel's,
 * so a row can differ from the two-kernel path's by an ulp.
 */
#define NR_WARPS 8
#define NR_PER_THREAD 4 /* float4 per thread per array: hidden <= NR_WARPS * 32 * 4 * 4 = 4096 */

static __global__ void __launch_bounds__(NR_WARPS * 32)
norm_router_one_kernel(float *__restrict__ x, const float *__restrict__ add, const float *__restrict__ add_bias,
                       const float *__restrict__ gain, float eps, int32_t hidden, bf16 *__restrict__ out,
                       const bf16 *__restrict__ weight, const float *__restrict__ bias, int32_t n_experts,
                       float *logits, unsigned *done_counter, int32_t k_top, int32_t *topk_idx,
                       float *topk_weight) {
    extern __shared__ __align__(16) float nr_row[]; /* [hidden] normalized, fp32 */
    __shared__ float partial[NR_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = blockIdx.x * NR_WARPS + warp, n_chunks = hidden >> 3, n4 = hidden >> 2;
    uint4 wq[ROUTER1_MAX_CHUNKS];
    router_row_load(weight, e, n_experts, n_chunks, lane, wq);
    pdl_wait(); /* x and the O projection come from earlier kernels */
    float4 v[NR_PER_THREAD], g[NR_PER_THREAD];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NR_PER_THREAD; c++) {
        const int j = threadIdx.x + c * NR_WARPS * 32;
        if (j < n4) {
            float4 a = ((const float4 *)x)[j], b = ((const float4 *)add)[j], cb = ((const float4 *)add_bias)[j];
            g[c] = ((const float4 *)gain)[j];
            v[c] = make_float4(a.x + (b.x + cb.x), a.y + (b.y + cb.y), a.z + (b.z + cb.z), a.w + (b.w + cb.w));
            ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
        }
    }
    ss = warp_sum(ss);
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < NR_WARPS; i++) total += partial[i];
    const float inv = rsqrtf(total / (float)hidden + eps);
#pragma unroll
    for (int c = 0; c < NR_PER_THREAD; c++) {
        const int j = threadIdx.x + c * NR_WARPS * 32;
        if (j < n4)
            ((float4 *)nr_row)[j] = make_float4(g[c].x * (v[c].x * inv), g[c].y * (v[c].y * inv),
                                                g[c].z * (v[c].z * inv), g[c].w * (v[c].w * inv));
    }
    __syncthreads();
    const float4 *t4 = (const float4 *)nr_row;
    const float acc = router_row_dot(wq, t4, n_chunks, lane);
    if (lane == 0 && e < n_experts) logits[e] = acc + bias[e];
    if (!last_block(done_counter, gridDim.x)) return;
#pragma unroll
    for (int c = 0; c < NR_PER_THREAD; c++) {
        const int j = threadIdx.x + c * NR_WARPS * 32;
        if (j < n4) {
            ((float4 *)x)[j] = v[c];
            const float4 y = t4[j];
            __nv_bfloat162 lo = __floats2bfloat162_rn(y.x, y.y), hi = __floats2bfloat162_rn(y.z, y.w);
            ((uint2 *)out)[j] = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
        }
    }
    if (warp == 0) topk_warp(logits, nullptr, n_experts, k_top, topk_idx, topk_weight);
    if (threadIdx.x == 0) *done_counter = 0u;
}

int gptoss_cuda_norm_router_one(float *x, const float *add, const float *add_bias, const float *gain, float eps,
                                int32_t hidden, bf16 *out, const bf16 *weight, const float *bias,
                                int32_t n_experts, int32_t k_top, float *logits, unsigned *done_counter,
                                int32_t *topk_idx, float *topk_weight, cudaStream_t stream) {
    if (hidden % 8 != 0 || hidden > NR_WARPS * 32 * 4 * NR_PER_THREAD || hidden > 32 * 8 * ROUTER1_MAX_CHUNKS ||
        add_bias == NULL || n_experts < 1 || k_top < 1 || k_top > 32 || k_top > n_experts ||
        ((uintptr_t)x | (uintptr_t)add | (uintptr_t)add_bias | (uintptr_t)gain | (uintptr_t)out | (uintptr_t)weight) % 16)
        return 1;
    launch_pdl(norm_router_one_kernel, dim3((n_experts + NR_WARPS - 1) / NR_WARPS), dim3(NR_WARPS * 32),
               (size_t)hidden * sizeof(float), stream, x, add, add_bias, gain, eps, hidden, out, weight, bias,
               n_experts, logits, done_counter, k_top, topk_idx, topk_weight);
    return 0;
}

cudaError_t gptoss_cuda_router_prepare(int32_t hidden) {
    return cudaFuncSetAttribute(router_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(ROUTER_TOKENS * hidden * sizeof(float)));
}

/* ---- router top-k --------------------------------------------------------------------- */

/* One warp, one token: k rounds of warp-wide argmax (ties to the lower expert index), then
 * the softmax over the k chosen logits. The row is read once into registers, R logits per
 * lane (expert lane + 32 i), all loads in flight together: the rounds had re-read it from
 * global memory (just written by other blocks, so volatile, one dependent L2 trip per logit
 * per round: 16 in a row for 128 experts and 4 choices). A NaN logit counts as -inf, so each
 * round picks a live expert whatever the values. Lane k keeps choice k; every lane sums the
 * softmax in choice order, as one lane did before. */
template <int R>
static __device__ __forceinline__ void topk_warp_regs(const volatile float *row, const float *bias,
                                                      int32_t n_experts, int32_t k_top, int32_t *topk_idx,
                                                      float *topk_weight) {
    const int lane = threadIdx.x & 31;
    float v[R];
    unsigned live = 0u; /* bit i: expert lane + 32 i is still a candidate */
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int e = lane + 32 * i;
        v[i] = -INFINITY;
        if (e < n_experts) {
            const float x = row[e] + (bias ? bias[e] : 0.0f);
            v[i] = isnan(x) ? -INFINITY : x;
            live |= 1u << i;
        }
    }
    float my_val = 0.0f;
    int my_idx = 0;
    for (int k = 0; k < k_top; k++) {
        float best = -INFINITY;
        int best_i = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int e = lane + 32 * i;
            if ((live >> i & 1u) && (v[i] > best || (v[i] == best && e < best_i))) {
                best = v[i];
                best_i = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (ov > best || (ov == best && oi < best_i)) {
                best = ov;
                best_i = oi;
            }
        }
        if (lane == k) {
            my_val = best;
            my_idx = best_i;
        }
        if ((best_i & 31) == lane) live &= ~(1u << (best_i >> 5));
    }
    const float mx = __shfl_sync(0xffffffffu, my_val, 0);
    float sum = 0.0f;
    for (int k = 0; k < k_top; k++) sum += __expf(__shfl_sync(0xffffffffu, my_val, k) - mx);
    if (lane < k_top) {
        topk_idx[lane] = my_idx;
        topk_weight[lane] = __expf(my_val - mx) / sum;
    }
}

/* k_top <= 32 and n_experts <= 1024 (the launchers' and the backend's limits). */
static __device__ void topk_warp(const volatile float *row, const float *bias, int32_t n_experts, int32_t k_top,
                                 int32_t *topk_idx, float *topk_weight) {
    if (n_experts <= 32) topk_warp_regs<1>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else if (n_experts <= 64) topk_warp_regs<2>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else if (n_experts <= 128) topk_warp_regs<4>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else if (n_experts <= 256) topk_warp_regs<8>(row, bias, n_experts, k_top, topk_idx, topk_weight);
    else topk_warp_regs<32>(row, bias, n_experts, k_top, topk_idx, topk_weight);
}

static __global__ void router_topk_kernel(const float *logits, const float *bias, int32_t n_tokens,
                                          int32_t n_experts, int32_t k_top, int32_t *topk_idx,
                                          float *topk_weight) {
    int t = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (t >= n_tokens) return;
    topk_warp(logits + (size_t)t * n_experts, bias, n_experts, k_top, topk_idx + (size_t)t * k_top,
              topk_weight + (size_t)t * k_top);
}

void gptoss_cuda_router_topk(const float *logits, const float *bias, int32_t n_tokens,
                             int32_t n_experts, int32_t k_top, int32_t *topk_idx,
                             float *topk_weight, cudaStream_t stream) {
    if (n_tokens <= 0) return;
    int warps = 4;
    router_topk_kernel<<<(n_tokens + warps - 1) / warps, 32 * warps, 0, stream>>>(
        logits, bias, n_tokens, n_experts, k_top, topk_idx, topk_weight);
}

/* ---- gathers and fills ------------------------------------------------------------------ */

static __global__ void gather_rows_kernel(const bf16 *src, const int32_t *rows, int32_t width, bf16 *out) {
    int i = blockIdx.x;
    const bf16 *s = src + (size_t)rows[i] * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) out[(size_t)i * width + j] = s[j];
}

void gptoss_cuda_gather_rows(const bf16 *src, const int32_t *rows, int32_t n_rows, int32_t width,
                             bf16 *out, cudaStream_t stream) {
    if (n_rows <= 0) return;
    gather_rows_kernel<<<n_rows, 256, 0, stream>>>(src, rows, width, out);
}

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
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

void gptoss_cuda_bf16_to_f32(const bf16 *in, size_t n, float *out, cudaStream_t stream) {
    if (n) bf16_to_f32_kernel<<<1024, 256, 0, stream>>>(in, n, out);
}

static __global__ void fill_normal_bf16_kernel(bf16 *out, size_t n, size_t first, uint64_t seed, float mean,
                                               float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(mean + sd * hash_normal(seed, first + i));
}
static __global__ void fill_normal_f32_kernel(float *out, size_t n, uint64_t seed, float mean, float sd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = mean + sd * hash_normal(seed, i);
}
static __global__ void fill_uniform_u8_kernel(uint8_t *out, size_t n, uint64_t seed, int lo, int hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed ^ mix64((uint64_t)i));
        if (lo == 0 && hi == 255) {
            out[i] = (uint8_t)(h >> 32);
        } else {
            out[i] = (uint8_t)(lo + (int)((h >> 32) % (uint64_t)(hi - lo + 1)));
        }
    }
}

void gptoss_cuda_fill_normal_bf16(bf16 *out, size_t n, uint64_t seed, float mean, float stddev,
                                  cudaStream_t stream) {
    gptoss_cuda_fill_normal_bf16_at(out, n, 0, seed, mean, stddev, stream);
}
void gptoss_cuda_fill_normal_bf16_at(bf16 *out, size_t n, size_t first, uint64_t seed, float mean, float stddev,
                                     cudaStream_t stream) {
    if (n) fill_normal_bf16_kernel<<<4096, 256, 0, stream>>>(out, n, first, seed, mean, stddev);
}
void gptoss_cuda_fill_normal_f32(float *out, size_t n, uint64_t seed, float mean, float stddev,
                                 cudaStream_t stream) {
    if (n) fill_normal_f32_kernel<<<1024, 256, 0, stream>>>(out, n, seed, mean, stddev);
}
void gptoss_cuda_fill_uniform_u8(uint8_t *out, size_t n, uint64_t seed, int lo, int hi,
                                 cudaStream_t stream) {
    if (n) fill_uniform_u8_kernel<<<4096, 256, 0, stream>>>(out, n, seed, lo, hi);
}
