/*
 * logits_summary.cu - per-row top-n and log-sum-exp of the logits, on the GPU.
 *
 * Serving needs, for most rows, only the few largest logits (greedy, top-k) and the row's
 * normalizer (logprobs); copying whole rows of a 201k vocabulary to the host and scanning them
 * there costs more than the rest of a large decode step. Two launches:
 *   1. grid (rows, chunks of LS_CHUNK logits): each block loads its chunk once into shared
 *      memory, reduces max and sum of exp, and selects the chunk's n largest;
 *   2. grid (rows): merges the chunks' candidates (the row's n largest are among them) and
 *      their (max, sum) pairs into the row's top-n and log-sum-exp.
 * A single block per row would read the row several times from one SM, which at batch 1 is
 * slower than the copy it replaces; chunks spread even one row over dozens of SMs.
 *
 * Selection is a radix select on 64-bit keys: the high word orders the value (NaN as -inf,
 * -0 as +0), the low word is ~token id, so keys are distinct and larger keys win, ties going to
 * the lower id, exactly as the host summary (gptoss_logits_summarize_row) orders them.
 */
#include "backend/cuda/cuda_kernels.h"

#include <math.h>

#define LS_THREADS 256
#define LS_CHUNK 4096
#define LS_MAX_TOP 64
#define LS_MAX_CHUNKS 256 /* vocabularies up to LS_CHUNK * LS_MAX_CHUNKS = 1,048,576 */

static __device__ __forceinline__ uint32_t order_key(float x) {
    if (isnan(x)) x = -INFINITY;
    if (x == 0.0f) x = 0.0f; /* -0 and +0 are equal logits: one key */
    uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float key_value(uint64_t k) {
    uint32_t hi = (uint32_t)(k >> 32);
    uint32_t u = (hi & 0x80000000u) ? (hi & 0x7fffffffu) : ~hi;
    return __uint_as_float(u);
}

static __device__ __forceinline__ uint64_t full_key(float x, int32_t id) {
    return ((uint64_t)order_key(x) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

static __device__ __forceinline__ int32_t key_id(uint64_t k) {
    return (int32_t)(0xffffffffu - (uint32_t)k);
}

/* Online (max, sum of exp(x - max)) merge; m == -inf means empty. */
static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) {
        m = mm;
        s = 0.0f;
        return;
    }
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

/* Block-wide (max, sum) and the +inf flag; the result is valid in thread 0. */
static __device__ void block_lse(float &m, float &s, int &inf) {
    __shared__ float rm[LS_THREADS / 32], rs[LS_THREADS / 32];
    __shared__ int ri[LS_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
        inf |= __shfl_xor_sync(0xffffffffu, inf, o);
    }
    if (lane == 0) rm[warp] = m, rs[warp] = s, ri[warp] = inf;
    __syncthreads();
    if (threadIdx.x == 0) {
        m = -INFINITY, s = 0.0f, inf = 0;
        for (int w = 0; w < LS_THREADS / 32; w++) {
            lse_merge(m, s, rm[w], rs[w]);
            inf |= ri[w];
        }
    }
}

/*
 * The n_top largest of the distinct keys[0..n) (shared memory), into out[0..n_top) in
 * decreasing order (shared or global). n_top <= n, n_top <= LS_MAX_TOP. Every thread of the
 * block calls it.
 */
static __device__ void select_top(const uint64_t *keys, int n, int n_top, uint64_t *out) {
    __shared__ uint32_t hist[256];
    __shared__ uint64_t prefix;
    __shared__ uint32_t remaining, n_taken;
    __shared__ uint64_t picked[LS_MAX_TOP];
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid == 0) prefix = 0, remaining = (uint32_t)n_top, n_taken = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += LS_THREADS) hist[i] = 0;
        __syncthreads();
        const uint64_t want = prefix, high_mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
        for (int base = 0; base < n; base += LS_THREADS) {
            int i = base + tid;
            uint32_t bin = 256; /* nothing */
            if (i < n && (keys[i] & high_mask) == want) bin = (uint32_t)(keys[i] >> shift) & 0xffu;
            /* lanes with the same bin add once: values crowd into a few bins */
            unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
        }
        __syncthreads();
        if (tid < 32) {
            /* lane l holds bins 8l..8l+7; find the bin (from the top) where the count reaches
             * `remaining` with a suffix sum over lanes */
            uint32_t c[8], sum = 0;
            for (int j = 0; j < 8; j++) sum += c[j] = hist[8 * lane + j];
            uint32_t above = sum; /* inclusive suffix over lanes >= lane */
            for (int o = 1; o < 32; o <<= 1) {
                uint32_t v = __shfl_down_sync(0xffffffffu, above, o);
                if (lane + o < 32) above += v;
            }
            above -= sum; /* strictly higher lanes */
            const uint32_t r = remaining;
            bool mine = above < r && above + sum >= r;
            if (mine) {
                for (int j = 7; j >= 0; j--) {
                    if (above + c[j] >= r) {
                        prefix = want | ((uint64_t)(8 * lane + j) << shift);
                        remaining = r - above;
                        break;
                    }
                    above += c[j];
                }
            }
        }
        __syncthreads();
    }
    /* keys are distinct: exactly n_top keys are >= the threshold */
    const uint64_t thr = prefix;
    for (int i = tid; i < n; i += LS_THREADS)
        if (keys[i] >= thr) picked[atomicAdd(&n_taken, 1u)] = keys[i];
    __syncthreads();
    if (tid < n_top) {
        uint64_t k = picked[tid];
        int rank = 0;
        for (int j = 0; j < n_top; j++) rank += picked[j] > k;
        out[rank] = k;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(LS_THREADS) logits_chunk_kernel(const float *__restrict__ logits, int32_t vocab,
                                                                   int32_t n_top, int32_t n_chunks,
                                                                   uint64_t *__restrict__ cand,
                                                                   float4 *__restrict__ part) {
    __shared__ uint64_t keys[LS_CHUNK];
    const int row = blockIdx.x, chunk = blockIdx.y, tid = threadIdx.x;
    const int begin = chunk * LS_CHUNK;
    const int n = min(LS_CHUNK, vocab - begin);
    const float *src = logits + (size_t)row * vocab + begin;
    float m = -INFINITY, s = 0.0f;
    int inf = 0;
    for (int i = tid; i < n; i += LS_THREADS) {
        float x = src[i];
        keys[i] = full_key(x, begin + i);
        if (isnan(x) || x == -INFINITY) continue;
        if (x == INFINITY) {
            inf = 1;
            continue;
        }
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    __syncthreads();
    block_lse(m, s, inf);
    if (tid == 0) part[(size_t)row * n_chunks + chunk] = make_float4(m, s, inf ? 1.0f : 0.0f, 0.0f);
    uint64_t *out = cand + ((size_t)row * n_chunks + chunk) * n_top;
    const int take = min(n_top, n);
    select_top(keys, n, take, out);
    for (int i = take + tid; i < n_top; i += LS_THREADS) out[i] = 0; /* below every real key */
}

__global__ void __launch_bounds__(LS_THREADS) logits_merge_kernel(const uint64_t *__restrict__ cand,
                                                                   const float4 *__restrict__ part, int32_t n_top,
                                                                   int32_t n_chunks, int32_t *__restrict__ top_ids,
                                                                   float *__restrict__ top_vals,
                                                                   float *__restrict__ lse) {
    extern __shared__ uint64_t merged_keys[];
    __shared__ uint64_t best[LS_MAX_TOP];
    const int row = blockIdx.x, tid = threadIdx.x;
    const int n = n_chunks * n_top;
    const uint64_t *src = cand + (size_t)row * n;
    /* padding keys (0) are not distinct; make them so, still below every real key */
    for (int i = tid; i < n; i += LS_THREADS) merged_keys[i] = src[i] ? src[i] : (uint64_t)i;
    float m = -INFINITY, s = 0.0f;
    int inf = 0;
    for (int c = tid; c < n_chunks; c += LS_THREADS) {
        float4 p = part[(size_t)row * n_chunks + c];
        lse_merge(m, s, p.x, p.y);
        inf |= p.z != 0.0f;
    }
    __syncthreads();
    block_lse(m, s, inf);
    if (tid == 0) lse[row] = inf ? INFINITY : (m == -INFINITY ? -INFINITY : m + logf(s));
    select_top(merged_keys, n, n_top, best);
    if (tid < n_top) {
        top_ids[(size_t)row * n_top + tid] = key_id(best[tid]);
        top_vals[(size_t)row * n_top + tid] = key_value(best[tid]);
    }
}

size_t gptoss_cuda_logits_summary_scratch(int32_t n_rows, int32_t vocab) {
    size_t chunks = ((size_t)vocab + LS_CHUNK - 1) / LS_CHUNK;
    return (size_t)n_rows * chunks * (LS_MAX_TOP * sizeof(uint64_t) + sizeof(float4)) + 256;
}

int gptoss_cuda_logits_summary(const float *logits, int32_t n_rows, int32_t vocab, int32_t n_top, void *scratch,
                               int32_t *top_ids, float *top_vals, float *lse, cudaStream_t stream) {
    if (n_rows <= 0) return 0;
    const int32_t n_chunks = (vocab + LS_CHUNK - 1) / LS_CHUNK;
    if (n_top < 1 || n_top > LS_MAX_TOP || n_top > vocab || n_chunks > LS_MAX_CHUNKS) return -1;
    /* scratch (16-byte aligned): candidates | (max, sum, +inf seen) per chunk; both written
     * in full by the first launch before the second reads them */
    if ((uintptr_t)scratch % 16 != 0) return -1;
    uint64_t *cand = (uint64_t *)scratch;
    float4 *part = (float4 *)(cand + (size_t)n_rows * n_chunks * n_top + ((size_t)n_rows * n_chunks * n_top) % 2);
    size_t smem = (size_t)n_chunks * n_top * sizeof(uint64_t);
    static size_t smem_allowed = 48 * 1024;
    if (smem > smem_allowed) {
        if (cudaFuncSetAttribute(logits_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess)
            return -1;
        smem_allowed = smem;
    }
    logits_chunk_kernel<<<dim3(n_rows, n_chunks), LS_THREADS, 0, stream>>>(logits, vocab, n_top, n_chunks, cand, part);
    logits_merge_kernel<<<n_rows, LS_THREADS, smem, stream>>>(cand, part, n_top, n_chunks, top_ids, top_vals, lse);
    return 0;
}
