/*
 * attention_split.cu - the scalar paged sink attention (GQA, sliding window, KV pages in bf16
 * or FP8, the kernel templated on the page type), split over the KV span with a merge kernel.
 * Every kernel accumulates in fp32.
 */
#include "backend/cuda/kernels/rope_kv.cuh"
#include "backend/cuda/kernels/traits.h"

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

template <int D, typename KV>
static __global__ void
attention_kernel(const float *q, const KV *k_cache, const KV *v_cache, const float *k_scale,
                 const float *v_scale, const int32_t *positions, const int32_t *token_seq,
                 const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                 const float *sinks, int32_t n_heads, int32_t n_kv_heads, int32_t window,
                 int32_t n_splits, float *partial, bf16 *out) {
    constexpr int DPAD = D + 2;
    constexpr int PER_LANE = (D + 31) / 32;
    extern __shared__ float smem[];
    int group = n_heads / n_kv_heads;
    float *qs = smem;                            /* [group][D] */
    bf16 *ks = (bf16 *)(qs + group * D);         /* [ATTN_SPLIT_TILE_KEYS][DPAD] */
    bf16 *vs = ks + ATTN_SPLIT_TILE_KEYS * DPAD; /* [ATTN_SPLIT_TILE_KEYS][D] */
    float *ks_scale =
        (float *)(vs + ATTN_SPLIT_TILE_KEYS * D); /* e4m3: [ATTN_SPLIT_TILE_KEYS] scales of K */
    float *vs_scale =
        ks_scale + ATTN_SPLIT_TILE_KEYS; /* e4m3: [ATTN_SPLIT_TILE_KEYS] scales of V */
    constexpr bool e4m3 = kv_page_traits<KV>::e4m3;
    int t = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int head = g * group + warp;
    int p = positions[t];
    int seq = token_seq[t];
    int lo = window > 0 ? max(0, p - window + 1) : 0;
    int span = p - lo + 1;
    int chunk = ((span + n_splits - 1) / n_splits + ATTN_SPLIT_TILE_KEYS - 1) /
                ATTN_SPLIT_TILE_KEYS * ATTN_SPLIT_TILE_KEYS;
    int begin = lo + split * chunk;
    int end = min(p + 1, begin + chunk); /* exclusive */

    for (int i = threadIdx.x; i < group * D; i += blockDim.x)
        qs[i] = q[((size_t)t * n_heads + g * group) * D + i];
    const int32_t *table = block_tables + (size_t)seq * max_blocks;

    float m = -INFINITY, l = 0.0f;
    float acc[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; i++)
        acc[i] = 0.0f;

    for (int k0 = begin; k0 < end; k0 += ATTN_SPLIT_TILE_KEYS) {
        __syncthreads();
        if constexpr (e4m3) {
            /* cooperative load of the codes of K and V rows [k0, k0 + 32), four per load,
             * decoded to bf16 pairs, and their scales */
            for (int e = threadIdx.x; e < ATTN_SPLIT_TILE_KEYS * (D / 4); e += blockDim.x) {
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
            for (int r = threadIdx.x; r < ATTN_SPLIT_TILE_KEYS; r += blockDim.x) {
                int j = k0 + r;
                float kscale = 0.0f, vscale = 0.0f;
                if (j < end) {
                    size_t slot =
                        ((size_t)table[j / block_size] * block_size + j % block_size) * n_kv_heads +
                        g;
                    kscale = k_scale[slot];
                    vscale = v_scale[slot];
                }
                ks_scale[r] = kscale;
                vs_scale[r] = vscale;
            }
        } else {
            /* cooperative load of K and V rows [k0, k0 + 32) as bf16 pairs */
            for (int e = threadIdx.x; e < ATTN_SPLIT_TILE_KEYS * (D / 2); e += blockDim.x) {
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
        for (int i = 0; i < PER_LANE; i++)
            acc[i] *= corr;
        int n_valid = min(ATTN_SPLIT_TILE_KEYS, end - k0);
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
 * 128), n_splits <= ATTN_SPLIT_MAX_SPLITS. Three short phases instead of every thread walking every
 * split twice (at 64 splits that serial walk was most of a one-token decode's attention):
 * the splits' maxima (one per thread) and the block max with the sink; each split's weight
 * exp(m_s - max) into shared memory with the denominator; then each thread sums its output
 * dimension over the splits with independent loads. */
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
    for (int w = 1; w < n_warps; w++)
        v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

static __global__ void attention_merge_kernel(const float *partial, const float *sinks,
                                              int32_t n_heads, int32_t head_dim, int32_t n_splits,
                                              bf16 *out) {
    __shared__ float weight[ATTN_SPLIT_MAX_SPLITS];
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
    for (int s = 0; s < n_splits; s++)
        num += pp[s * stride + d] * weight[s];
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
    while (blocks * splits < n_sms && max_span / (splits * 2) >= 128 && splits < 64)
        splits *= 2;
    return splits;
}

/* Launches the attention kernel for either page type (scales NULL for bf16 pages). */
template <typename KV>
static int attention_launch(const float *q, const KV *k_cache, const KV *v_cache,
                            const float *k_scale, const float *v_scale, const int32_t *positions,
                            const int32_t *token_seq, const int32_t *block_tables,
                            int32_t max_blocks, int32_t block_size, const float *sinks,
                            int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                            int32_t window, int32_t n_splits, float *partial, bf16 *out,
                            cudaStream_t stream) {
    if (n_tokens <= 0) return 0;
    int group = n_heads / n_kv_heads;
    if (group < 1 || group > 32 || n_heads % n_kv_heads != 0) return -1;
    if (n_splits < 1) n_splits = 1;
    if (n_splits > ATTN_SPLIT_MAX_SPLITS) return -1;
    dim3 grid(n_tokens, n_kv_heads, n_splits);
    int threads = 32 * group;
    if (threads < 64) threads = 64; /* enough threads for the tile loads */
    const size_t scale_bytes =
        kv_page_traits<KV>::e4m3 ? 2 * ATTN_SPLIT_TILE_KEYS * sizeof(float) : 0;
    size_t smem;
#define LAUNCH_ATT(DIM)                                                                            \
    smem = (size_t)group * DIM * sizeof(float) +                                                   \
           (size_t)ATTN_SPLIT_TILE_KEYS * (2 * DIM + 2) * sizeof(bf16) + scale_bytes;              \
    attention_kernel<DIM, KV><<<grid, threads, smem, stream>>>(                                    \
        q, k_cache, v_cache, k_scale, v_scale, positions, token_seq, block_tables, max_blocks,     \
        block_size, sinks, n_heads, n_kv_heads, window, n_splits, partial, out)
    switch (head_dim) {
    case 16:
        LAUNCH_ATT(16);
        break;
    case 32:
        LAUNCH_ATT(32);
        break;
    case 64:
        LAUNCH_ATT(64);
        break;
    case 128:
        LAUNCH_ATT(128);
        break;
    default:
        return -1;
    }
#undef LAUNCH_ATT
    if (n_splits > 1)
        gptoss_cuda_attention_merge(partial, sinks, n_tokens, n_heads, head_dim, n_splits, out,
                                    stream);
    return 0;
}

void gptoss_cuda_attention_merge(const float *partial, const float *sinks, int32_t n_tokens,
                                 int32_t n_heads, int32_t head_dim, int32_t n_splits, bf16 *out,
                                 cudaStream_t stream) {
    dim3 mgrid(n_tokens, n_heads);
    launch_pdl(attention_merge_kernel, mgrid, dim3(head_dim < 32 ? 32 : head_dim), 0, stream,
               partial, sinks, n_heads, head_dim, n_splits, out);
}

int gptoss_cuda_attention(const float *q, const bf16 *k_cache, const bf16 *v_cache,
                          const int32_t *positions, const int32_t *token_seq,
                          const int32_t *block_tables, int32_t max_blocks, int32_t block_size,
                          const float *sinks, int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                          int32_t head_dim, int32_t window, int32_t n_splits, float *partial,
                          bf16 *out, cudaStream_t stream) {
    return attention_launch(q, k_cache, v_cache, (const float *)nullptr, (const float *)nullptr,
                            positions, token_seq, block_tables, max_blocks, block_size, sinks,
                            n_tokens, n_heads, n_kv_heads, head_dim, window, n_splits, partial, out,
                            stream);
}

int gptoss_cuda_attention_fp8(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                              const float *k_scale, const float *v_scale, const int32_t *positions,
                              const int32_t *token_seq, const int32_t *block_tables,
                              int32_t max_blocks, int32_t block_size, const float *sinks,
                              int32_t n_tokens, int32_t n_heads, int32_t n_kv_heads,
                              int32_t head_dim, int32_t window, int32_t n_splits, float *partial,
                              bf16 *out, cudaStream_t stream) {
    return attention_launch(q, k_cache, v_cache, k_scale, v_scale, positions, token_seq,
                            block_tables, max_blocks, block_size, sinks, n_tokens, n_heads,
                            n_kv_heads, head_dim, window, n_splits, partial, out, stream);
}
