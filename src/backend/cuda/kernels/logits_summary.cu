/*
 * logits_summary.cu - per-row top-n and log-sum-exp of the logits, on the GPU.
 *
 * Serving needs, for most rows, only the few largest logits (greedy, top-k) and the row's
 * normalizer (logprobs); copying whole rows of a 201k vocabulary to the host and scanning them
 * there costs more than the rest of a large decode step. At batch 1 this runs once per token,
 * right on the critical path, so it is built to be short rather than general. Three launches:
 *   1. scan, grid (rows, chunks of LOGITS_SUMMARY_CHUNK logits): each block reduces its chunk's
 * (max, sum of exp) and each warp the largest key of its 512 logits (a "group");
 *   2. filter, grid (rows, chunks): L = the n-th largest group maximum of the row. Those n
 *      maxima are n distinct logits >= L, so the row's n largest are all >= L; each block
 *      appends the keys of its chunk that are >= L to the row's candidates (a few hundred for
 *      real logits: a group maximum is a top 1/512 value);
 *   3. select, grid (rows): the row's top-n among its candidates and its log-sum-exp from the
 *      chunks' (max, sum) pairs. Rows whose candidates overflow LOGITS_SUMMARY_CANDIDATES (the
 * largest logits crowded into a few groups, e.g. a sorted row) select over the whole row instead:
 * exact, only slower.
 *
 * Selection is a radix select on 64-bit keys: the high word orders the value (NaN as -inf,
 * -0 as +0), the low word is ~token id, so keys are distinct and larger keys win, ties going to
 * the lower id, exactly as the host summary (gptoss_logits_summarize_row) orders them.
 */
#include "backend/cuda/kernels/ptx.cuh"
#include "backend/cuda/kernels/traits.h"

#include <math.h>

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
    __shared__ float rm[LOGITS_SUMMARY_THREADS / 32], rs[LOGITS_SUMMARY_THREADS / 32];
    __shared__ int ri[LOGITS_SUMMARY_THREADS / 32];
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
        for (int w = 0; w < LOGITS_SUMMARY_THREADS / 32; w++) {
            lse_merge(m, s, rm[w], rs[w]);
            inf |= ri[w];
        }
    }
}

/* Keys for select_top: from shared memory, or made from a row of logits on the fly. */
struct smem_keys {
    const uint64_t *k;
    __device__ uint64_t operator()(int i) const {
        return k[i];
    }
};
struct row_keys {
    const float *row;
    __device__ uint64_t operator()(int i) const {
        return full_key(row[i], i);
    }
};

/*
 * The n_top largest of the distinct keys key_at(0..n) into out[0..n_top) in decreasing order
 * (shared or global). n_top <= n, n_top <= LOGITS_SUMMARY_MAX_TOP. Every thread of the block calls
 * it. Passes of 8 bits from the top; it stops early once the bin that holds the cut is taken whole
 * (distinct values usually settle in the value's 32 bits, often sooner).
 */
template <typename K> static __device__ void select_top(K key_at, int n, int n_top, uint64_t *out) {
    __shared__ uint32_t hist[256];
    __shared__ uint64_t prefix;
    __shared__ uint32_t remaining, n_taken;
    __shared__ int done;
    __shared__ uint64_t picked[LOGITS_SUMMARY_MAX_TOP];
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid == 0) prefix = 0, remaining = (uint32_t)n_top, n_taken = 0, done = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += LOGITS_SUMMARY_THREADS)
            hist[i] = 0;
        __syncthreads();
        if (done) break; /* uniform: read after the barrier */
        const uint64_t want = prefix, high_mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
        for (int base = 0; base < n; base += LOGITS_SUMMARY_THREADS) {
            int i = base + tid;
            uint32_t bin = 256; /* nothing */
            if (i < n) {
                uint64_t key = key_at(i);
                if ((key & high_mask) == want) bin = (uint32_t)(key >> shift) & 0xffu;
            }
            /* lanes with the same bin add once: values crowd into a few bins */
            unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256 && lane == __ffs(peers) - 1)
                atomicAdd(&hist[bin], (uint32_t)__popc(peers));
        }
        __syncthreads();
        if (tid < 32) {
            /* lane l holds bins 8l..8l+7; find the bin (from the top) where the count reaches
             * `remaining` with a suffix sum over lanes */
            uint32_t c[8], sum = 0;
            for (int j = 0; j < 8; j++)
                sum += c[j] = hist[8 * lane + j];
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
                        /* the whole bin is taken: keys >= prefix (lower bits 0) are the n_top */
                        if (above + c[j] == r) done = 1;
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
    for (int i = tid; i < n; i += LOGITS_SUMMARY_THREADS) {
        uint64_t key = key_at(i);
        if (key >= thr) picked[atomicAdd(&n_taken, 1u)] = key;
    }
    __syncthreads();
    if (tid < n_top) {
        uint64_t k = picked[tid];
        int rank = 0;
        for (int j = 0; j < n_top; j++)
            rank += picked[j] > k;
        out[rank] = k;
    }
    __syncthreads();
}

/* The n_top largest of the n distinct keys[0..n) (shared memory) into out[0..n_top) in
 * decreasing order, each key placed by its rank (the count of larger keys): n^2 /
 * LOGITS_SUMMARY_THREADS broadcast compares per thread, fewer steps than select_top's passes for a
 * few hundred keys. */
static __device__ void rank_top(const uint64_t *keys, int n, int n_top, uint64_t *out) {
    for (int i = threadIdx.x; i < n; i += LOGITS_SUMMARY_THREADS) {
        const uint64_t k = keys[i];
        int rank = 0;
        for (int j = 0; j < n; j++)
            rank += keys[j] > k;
        if (rank < n_top) out[rank] = k;
    }
    __syncthreads();
}

/* Launch 1: the chunk's (max, sum of exp, +inf seen) and each group's largest key (0 for a
 * group past the end of the row: below every real key). Resets the row's candidate count. */
__global__ void __launch_bounds__(LOGITS_SUMMARY_THREADS)
    logits_scan_kernel(const float *__restrict__ logits, int32_t vocab, int32_t n_chunks,
                       uint64_t *__restrict__ gmax, float4 *__restrict__ part,
                       uint32_t *__restrict__ count) {
    const int row = blockIdx.x, chunk = blockIdx.y, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5;
    const int begin = chunk * LOGITS_SUMMARY_CHUNK;
    const int n = min(LOGITS_SUMMARY_CHUNK, vocab - begin);
    const float *src = logits + (size_t)row * vocab + begin;
    float m = -INFINITY, s = 0.0f;
    int inf = 0;
    uint64_t best = 0;
    pdl_wait(); /* launched plainly: lets the filter launch early (it waits for this grid) */
#pragma unroll 4
    for (int j = 0; j < LOGITS_SUMMARY_GROUP / 32; j++) {
        const int i = warp * LOGITS_SUMMARY_GROUP + j * 32 + lane;
        if (i >= n) break;
        const float x = src[i];
        const uint64_t key = full_key(x, begin + i);
        best = key > best ? key : best;
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
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    if (lane == 0) gmax[((size_t)row * n_chunks + chunk) * LOGITS_SUMMARY_WARPS + warp] = best;
    block_lse(m, s, inf);
    if (tid == 0) {
        part[(size_t)row * n_chunks + chunk] = make_float4(m, s, inf ? 1.0f : 0.0f, 0.0f);
        if (chunk == 0) count[row] = 0;
    }
}

/* Launch 2: L = the n_top-th largest group maximum of the row; the chunk's keys >= L join
 * the row's candidates (the first LOGITS_SUMMARY_CANDIDATES are stored; the count goes on, to flag
 * overflow). */
__global__ void __launch_bounds__(LOGITS_SUMMARY_THREADS)
    logits_filter_kernel(const float *__restrict__ logits, int32_t vocab, int32_t n_top,
                         int32_t n_chunks, const uint64_t *__restrict__ gmax,
                         uint64_t *__restrict__ cand, uint32_t *__restrict__ count) {
    __shared__ uint64_t keys[LOGITS_SUMMARY_MAX_CHUNKS * LOGITS_SUMMARY_WARPS];
    __shared__ uint64_t best[LOGITS_SUMMARY_MAX_TOP];
    const int row = blockIdx.x, chunk = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
    const int G = n_chunks * LOGITS_SUMMARY_WARPS;
    const uint64_t *src = gmax + (size_t)row * G;
    pdl_wait();
    /* empty groups (0) are not distinct; make them so, still below every real key (whose high
     * word is at least order_key(-inf) > 0) */
    for (int i = tid; i < G; i += LOGITS_SUMMARY_THREADS)
        keys[i] = src[i] ? src[i] : (uint64_t)i;
    __syncthreads();
    uint64_t L = 0;
    if (G >= n_top) {
        select_top(smem_keys{keys}, G, n_top, best);
        L = best[n_top - 1];
    }
    const int begin = chunk * LOGITS_SUMMARY_CHUNK;
    const int n = min(LOGITS_SUMMARY_CHUNK, vocab - begin);
    const float *x = logits + (size_t)row * vocab + begin;
    uint64_t *out = cand + (size_t)row * LOGITS_SUMMARY_CANDIDATES;
    for (int base = 0; base < n; base += LOGITS_SUMMARY_THREADS) {
        const int i = base + tid;
        uint64_t key = i < n ? full_key(x[i], begin + i) : 0;
        const bool take = i < n && key >= L;
        const unsigned mask = __ballot_sync(0xffffffffu, take);
        if (!mask) continue;
        uint32_t at = 0;
        if (lane == __ffs(mask) - 1) at = atomicAdd(&count[row], (uint32_t)__popc(mask));
        at = __shfl_sync(0xffffffffu, at, __ffs(mask) - 1) + __popc(mask & ((1u << lane) - 1));
        if (take && at < LOGITS_SUMMARY_CANDIDATES) out[at] = key;
    }
}

/* Launch 3: the row's log-sum-exp and its top n_top (from the candidates, or from the whole
 * row when they overflowed). */
__global__ void __launch_bounds__(LOGITS_SUMMARY_THREADS)
    logits_select_kernel(const float *__restrict__ logits, int32_t vocab,
                         const float4 *__restrict__ part, int32_t n_top, int32_t n_chunks,
                         const uint32_t *__restrict__ count, const uint64_t *__restrict__ cand,
                         int32_t *__restrict__ top_ids, float *__restrict__ top_vals,
                         float *__restrict__ lse) {
    __shared__ uint64_t keys[LOGITS_SUMMARY_CANDIDATES];
    __shared__ uint64_t best[LOGITS_SUMMARY_MAX_TOP];
    const int row = blockIdx.x, tid = threadIdx.x;
    float m = -INFINITY, s = 0.0f;
    int inf = 0;
    pdl_wait();
    for (int c = tid; c < n_chunks; c += LOGITS_SUMMARY_THREADS) {
        float4 p = part[(size_t)row * n_chunks + c];
        lse_merge(m, s, p.x, p.y);
        inf |= p.z != 0.0f;
    }
    block_lse(m, s, inf);
    if (tid == 0) lse[row] = inf ? INFINITY : (m == -INFINITY ? -INFINITY : m + logf(s));
    const uint32_t n = count[row];
    if (n <= LOGITS_SUMMARY_CANDIDATES) {
        const uint64_t *src = cand + (size_t)row * LOGITS_SUMMARY_CANDIDATES;
        for (int i = tid; i < (int)n; i += LOGITS_SUMMARY_THREADS)
            keys[i] = src[i];
        __syncthreads();
        if (n <= 2 * LOGITS_SUMMARY_THREADS)
            rank_top(keys, (int)n, n_top, best);
        else
            select_top(smem_keys{keys}, (int)n, n_top, best);
    } else {
        select_top(row_keys{logits + (size_t)row * vocab}, vocab, n_top, best);
    }
    if (tid < n_top) {
        top_ids[(size_t)row * n_top + tid] = key_id(best[tid]);
        top_vals[(size_t)row * n_top + tid] = key_value(best[tid]);
    }
}

size_t gptoss_cuda_logits_summary_scratch(int32_t n_rows, int32_t vocab) {
    size_t chunks = ((size_t)vocab + LOGITS_SUMMARY_CHUNK - 1) / LOGITS_SUMMARY_CHUNK;
    return (size_t)n_rows * (chunks * (LOGITS_SUMMARY_WARPS * sizeof(uint64_t) + sizeof(float4)) +
                             LOGITS_SUMMARY_CANDIDATES * sizeof(uint64_t) + sizeof(uint32_t)) +
           256;
}

int gptoss_cuda_logits_summary(const float *logits, int32_t n_rows, int32_t vocab, int32_t n_top,
                               void *scratch, int32_t *top_ids, float *top_vals, float *lse,
                               cudaStream_t stream) {
    if (n_rows <= 0) return 0;
    const int32_t n_chunks = (vocab + LOGITS_SUMMARY_CHUNK - 1) / LOGITS_SUMMARY_CHUNK;
    if (n_top < 1 || n_top > LOGITS_SUMMARY_MAX_TOP || n_top > vocab ||
        n_chunks > LOGITS_SUMMARY_MAX_CHUNKS)
        return -1;
    /* scratch (16-byte aligned): candidates | group maxima | (max, sum, +inf seen) per chunk |
     * candidate counts; launch 1 writes the maxima, pairs and counts in full, launch 2 the
     * candidates that launch 3 reads */
    if ((uintptr_t)scratch % 16 != 0) return -1;
    uint64_t *cand = (uint64_t *)scratch;
    uint64_t *gmax = cand + (size_t)n_rows * LOGITS_SUMMARY_CANDIDATES;
    float4 *part = (float4 *)(gmax + (size_t)n_rows * n_chunks * LOGITS_SUMMARY_WARPS);
    uint32_t *count = (uint32_t *)(part + (size_t)n_rows * n_chunks);
    const dim3 grid(n_rows, n_chunks);
    logits_scan_kernel<<<grid, LOGITS_SUMMARY_THREADS, 0, stream>>>(logits, vocab, n_chunks, gmax,
                                                                    part, count);
    launch_pdl(logits_filter_kernel, grid, dim3(LOGITS_SUMMARY_THREADS), 0, stream, logits, vocab,
               n_top, n_chunks, (const uint64_t *)gmax, cand, count);
    launch_pdl(logits_select_kernel, dim3(n_rows), dim3(LOGITS_SUMMARY_THREADS), 0, stream, logits,
               vocab, (const float4 *)part, n_top, n_chunks, (const uint32_t *)count,
               (const uint64_t *)cand, top_ids, top_vals, lse);
    return 0;
}
